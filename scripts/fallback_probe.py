"""What the programs that leave the fast path cost a launch (BENCHMARKS.md run 38). GPU only.

    python scripts/fallback_probe.py [qwen3:4096 qwen3:32768 mixtral:8192 ...] [--rep 20] [--set NAME=VALUE]
                                     [--dtype bfloat16] [--ab NAME=VALUE]

For each benchmark shape and T: the launch on standard-normal logits (the benchmark's kind of input: some rows
close, their programs redo them on the exact path) against the same launch on rows of ``randperm(W) / 32``
(every pair of logits 1/32 apart: no row close), CUDA-graph medians (two timings each), the fallback counters
of one more launch, and the launch with every program forced onto the exact path. ``--dtype`` routes the logits in
another dtype than the shape's (bf16 logits tie far more often: a K-th logit repeated by the first loser sends its
row to the exact path, see docs/kernel.md). ``--set`` sets a launcher
override of ``moegate.kernels.router`` first (e.g. ``split_pair_exact_override=True``). ``--ab NAME=VALUE`` times the
launch with those settings against the launch without, in turn (e.g. ``--ab logit_drop_override=False``: bf16 rows
whose K-th logit the first loser repeats redone everywhere, the kernel of run 106).
"""

import argparse
import os
import sys

import torch
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

import moegate.kernels.router as kr  # noqa: E402
from moegate import route  # noqa: E402
from moegate.bench import SHAPES, _parse_settings  # noqa: E402


def _time(fn, rep):
    return triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median") * 1e3  # us


def _counts(x, config):
    stats = torch.zeros(3, dtype=torch.int32, device="cuda")
    kr.count_fallbacks_into = stats
    try:
        route(x, config, backend="triton")
    finally:
        kr.count_fallbacks_into = None
    return stats[0].item(), stats[2].item()


def probe(name, T, rep, dtype=None, ab=None):
    config, shape_dtype = SHAPES[name]
    dtype = dtype or shape_dtype
    W = config.num_scored
    g = torch.Generator().manual_seed(0)
    inputs = {
        "normal": torch.randn(T, W, generator=g).to(dtype),
        "spaced": (torch.rand(T, W, generator=g).argsort(dim=1).float() / 32).to(dtype),
    }
    out = (torch.empty(T, config.top_k, device="cuda"), torch.empty(T, config.top_k, device="cuda", dtype=torch.int32))
    for label, x in inputs.items():
        x = x.cuda()
        fn = lambda x=x: route(x, config, backend="triton", out=out)  # noqa: E731
        if ab:
            # The launch and its variant in turn, twice each, on the same inputs: (default, variant) pairs.
            us, vs = [], []
            for _ in range(2):
                us.append(_time(fn, rep))
                saved = {key: getattr(kr, key) for key in ab}
                for key, value in ab.items():
                    setattr(kr, key, value)
                try:
                    vs.append(_time(fn, rep))
                    v_redo, _ = _counts(x, config)
                finally:
                    for key, value in saved.items():
                        setattr(kr, key, value)
            redo, programs = _counts(x, config)
            print(f"{name:18} {str(dtype)[6:]:8} T={T:>6} {label}: {' '.join(f'{u:.2f}' for u in us)} us, redone "
                  f"{redo} of {programs}; variant {' '.join(f'{v:.2f}' for v in vs)} us, redone {v_redo}", flush=True)
            continue
        us = [_time(fn, rep) for _ in range(2)]
        redo, programs = _counts(x, config)
        kr.force_exact_override = True
        try:
            exact = _time(fn, rep)
        finally:
            kr.force_exact_override = False
        print(f"{name:18} {str(dtype)[6:]:8} T={T:>6} {label}: {' '.join(f'{u:.2f}' for u in us)} us; programs redone "
              f"{redo} of {programs}; every program exact {exact:.2f} us", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("cases", nargs="*", default=["qwen3:4096", "qwen3:8192", "qwen3:32768", "mixtral:8192"],
                   help="SHAPE:T pairs (shapes of moegate.bench.SHAPES)")
    p.add_argument("--rep", type=int, default=20, help="milliseconds of graph replay per timing")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a launcher constant or override of moegate.kernels.router, a Python literal (as bench --set)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="the logits' dtype (default: the shape's)")
    p.add_argument("--ab", action="append", default=[], metavar="NAME=VALUE",
                   help="time a variant (these launcher settings) against the launch in turn, in place of the "
                   "every-program-exact timing")
    args = p.parse_args(argv)
    for key, value in _parse_settings(p, args.set).items():
        setattr(kr, key, value)
    ab = _parse_settings(p, args.ab)
    for case in args.cases:
        name, _, t = case.partition(":")
        if name not in SHAPES or not t.isdigit():
            p.error(f"{case!r}: expected SHAPE:T with SHAPE one of {', '.join(SHAPES)}")
        probe(name, int(t), args.rep, getattr(torch, args.dtype) if args.dtype else None, ab)


if __name__ == "__main__":
    main()
