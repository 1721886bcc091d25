"""Diagnostics for the rows-on-warps kernel: the kernel as shipped against copies of it with parts removed, timed
side by side on the benchmark's inputs (BENCHMARKS.md). GPU only.

    PYTHONPATH=src python scripts/warp_rows_ab.py [--tokens 1024,4096,65536] [--seeds 3] [--variants shipped,fast-only]
"""

import argparse
import importlib.util
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

import moegate.kernels.router as kr  # noqa: E402
from moegate.bench import SHAPES, _floor_launch, _time  # noqa: E402
from moegate.router import route  # noqa: E402

SRC = os.path.join(os.path.dirname(kr.__file__), "warp_rows_kernel.py")
# name -> (old, new) source edits of warp_rows_kernel.py
VARIANTS = {
    "shipped": [],
    # rows for the exact path routed as the fast keys say (and _repair's failures as its candidates say)
    "no-exact-path": [("    if state > 1:", "    if False:"), ("    if rbits != 0:", "    if False:")],
    "no-repair": [("    if not REPAIR:", "    if True:")],  # close rows to the exact path
    "extra0": [("C: tl.constexpr = K + 1 + EXTRA", "C: tl.constexpr = K + 1")],  # no candidate past the first loser
    # the fast path alone (every flagged row routed as the fast keys say): the bound of this kernel
    "fast-only": [("    if state == 1:", "    if False:"), ("    if state > 1:", "    if False:")],
    # the row's largest |bias| as a float max (five shuffles), as before run 166 (shipped: an integer max, one REDUX)
    "bias-float": [("    bias_mag = _row_max(tl.abs(b).to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)",
                    "    bias_mag = _row_max(tl.abs(b))")],
    # no repair, no candidate past the first loser: the kernel of runs 153-159
    "run-156": [("    if not REPAIR:", "    if True:"), ("C: tl.constexpr = K + 1 + EXTRA", "C: tl.constexpr = K + 1")],
}


def _module(name, edits):
    text = open(SRC).read()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    path = os.path.join(tempfile.mkdtemp(), f"wr_{name.replace('-', '_')}.py")
    open(path, "w").write(text)
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _inputs(config, dtype, T, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(T, config.num_experts, generator=g, device="cuda").to(dtype)
    return x, torch.randn(config.num_experts, generator=g, device="cuda") * 0.1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="deepseek-v3-fp32,deepseek-v4")
    p.add_argument("--tokens", default="1024,4096,65536")
    p.add_argument("--rep", type=float, default=20.0)
    p.add_argument("--seeds", type=int, default=1,
                   help="inputs a T (seeds T, T + 1, ...): each column the mean of their medians (where a program "
                        "falls back varies with the inputs, and so does its cost)")
    p.add_argument("--variants", help="comma-separated names of VARIANTS to time (default: all)")
    p.add_argument("--no-forced-exact", action="store_true", help="skip the forced-exact column")
    a = p.parse_args(argv)
    names = a.variants.split(",") if a.variants else list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    mods = {name: _module(name, VARIANTS[name]) for name in names}
    for name in a.shapes.split(","):
        config, dtype = SHAPES[name]
        for T in [int(t) for t in a.tokens.split(",")]:
            times, counts = {}, [0, 0, 0]
            for seed in range(T, T + a.seeds):
                x, bias = _inputs(config, dtype, T, seed)
                out = (torch.empty(T, config.top_k, device="cuda"),
                       torch.empty(T, config.top_k, dtype=torch.int32, device="cuda"))
                stats = torch.zeros(3, dtype=torch.int32, device="cuda")
                kr.warp_rows_override, kr.count_fallbacks_into = True, stats
                route(x, config, bias=bias, out=out)
                kr.count_fallbacks_into = None
                torch.cuda.synchronize()
                counts = [c + v for c, v in zip(counts, stats.tolist())]
                run = lambda: route(x, config, bias=bias, out=out)  # noqa: E731
                for label, override in (("router", False), ("floor", None)):
                    kr.warp_rows_override = override
                    fn = (lambda: _floor_launch(x, *out, config.top_k, pdl=False)) if label == "floor" else run
                    times.setdefault(label, []).append(_time(fn, a.rep))
                kr.warp_rows_override = True
                for label, mod in mods.items():
                    saved = kr.wrk._warp_rows_kernel
                    kr.wrk._warp_rows_kernel = mod._warp_rows_kernel
                    try:
                        times.setdefault(label, []).append(_time(run, a.rep))
                    finally:
                        kr.wrk._warp_rows_kernel = saved
                if not a.no_forced_exact:
                    kr.force_exact_override = True  # every program on the exact path: its throughput
                    times.setdefault("forced-exact", []).append(_time(run, a.rep))
                    kr.force_exact_override = False
            line = [f"{name:16s} T={T:6d} exact {counts[0]} repaired {counts[1]} of {counts[2]}"]
            line += [f"{label} {sum(v) / len(v):6.2f}" for label, v in times.items()]
            print(" | ".join(line), flush=True)
    kr.warp_rows_override = None


if __name__ == "__main__":
    sys.exit(main())
