"""How much one small launch's time moves between timings in one process, provider by provider.

    PYTHONPATH=src python3 scripts/small_launch_spread.py [--shapes a,b] [--tokens 1,16] [--rounds 10] [--rep 5]

Each round times every provider once (``moegate.bench._time``, the benchmark's timer: median of ten replays of a
CUDA graph; ``*-dobench``: ``triton.testing.do_bench_cudagraph`` itself, whose eager estimate sizes the graph), in turn:
moegate as the launcher makes it, moegate with PDL off, with the PDL trigger at the kernel's start and end, with
narrow rows on warps instead of one a thread, with one row a thread's winners read again rather than taken from
registers, with every kernel argument passed (`fat-params`), moegate's launch in one graph of 200 launches and one
of 5000 (about what do_bench_cudagraph captures at 1 us) captured once for all rounds (`one-graph`,
`one-graph-5k`; `floor-1g`, `floor0-1g` and `sglang-1g` the same for the peers; `one-graph-fresh` a graph of 200
captured anew each round, `one-graph-late` one captured after half the rounds), the read-once floor with and
without PDL, SGLang's router where .peers/ has it, and each of moegate, the floors and SGLang timed like
do_bench_cudagraph but with --warm-ms of untimed replays between the capture and the timed ones (`*-warm`).
Printed: every round's figure, then min / median / max. The benchmark's table takes the median of three such rounds.
BENCHMARKS.md runs 55-62 found moegate's small launches moving 1.5-2x from round to round under do_bench_cudagraph,
where the floor and SGLang moved by 5-10%; runs 65-66 traced it to do_bench_cudagraph's eager estimate (`*-dobench`).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import triton.testing  # noqa: E402

import moegate.kernels.router as kr  # noqa: E402
from moegate import bench  # noqa: E402

VARIANTS = {
    "moegate": {},
    "no-pdl": {"use_pdl_override": False},
    "pdl-start": {"pdl_trigger_override": 0},
    "pdl-end": {"pdl_trigger_override": 2},
    "warp-rows": {"thread_rows_override": False},  # rows of <= 8 experts on warps instead of one a thread
    "reloaded": {"winners_in_regs_override": False},  # one row a thread: the winners' logits read again
    "fat-params": {"lean_params_override": False},  # every kernel argument passed (34 parameters, not ~8)
}


def _time_warm(fn, rep, warm_ms):
    """triton.testing.do_bench_cudagraph's measurement (eager estimate, a graph of rep / estimate launches, the
    median of ten timed replays, device events) with untimed replays of the graph for about warm_ms between the
    capture and the timed replays, us a launch: whether the GPU idling through a long capture (and its clock
    dropping) is what makes a capture's timings slow. Run 62: it is not."""
    import torch

    with torch.cuda.stream(torch.cuda.Stream()):
        fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            fn()
        end.record()
        torch.cuda.synchronize()
        estimate_ms = start.elapsed_time(end) / 5
        n = 1000 if estimate_ms == 0 else max(1, int(rep / estimate_ms))
        graph = bench._capture(fn, n)
        once_ms = bench._replay_ms(graph)
        for _ in range(max(0, int(warm_ms / max(once_ms, 1e-3)))):
            graph.replay()
        return bench._median_us(graph, n)


class _OneGraph:
    """Times one CUDA graph, captured once, of `n` launches of fn: each call replays it ten times (device events)
    and returns the median per launch in us. If the spread between rounds is a property of the capture, this
    one stays steady while the providers that do_bench_cudagraph captures anew each round move."""

    def __init__(self, fn, n=200):
        import torch

        self.n, self.stream = n, torch.cuda.Stream()
        with torch.cuda.stream(self.stream):
            fn()
            self.graph = bench._capture(fn, n)

    def __call__(self):
        import torch

        with torch.cuda.stream(self.stream):
            return bench._median_us(self.graph, self.n)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="mixtral,deepseek-v3-fp32,deepseek-v4")
    p.add_argument("--tokens", default="1,16")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--rep", type=float, default=5)
    p.add_argument("--warm-ms", type=float, default=50, help="untimed replays before the timed ones (*-warm)")
    p.add_argument("--only", default="", help="comma-separated providers to time (default: all)")
    a = p.parse_args(argv)
    sglang = bench._load_sglang()
    for name in a.shapes.split(","):
        config, dtype = bench.SHAPES[name]
        for T in (int(t) for t in a.tokens.split(",")):
            fns = bench._providers(config, dtype, T, sglang, set())
            peers = ["floor", "floor0"] + (["sglang"] if "sglang" in fns else [])
            graphs = {"one-graph": _OneGraph(fns["moegate"], 200), "one-graph-5k": _OneGraph(fns["moegate"], 5000)}
            for peer in peers:
                graphs[f"{peer}-1g"] = _OneGraph(fns[peer], 200)
            warm = {f"{label}-warm": label for label in ["moegate", *peers]}
            # one-graph-fresh: a graph of 200 launches captured anew in every round (as do_bench_cudagraph captures
            # anew, but without its eager estimate); one-graph-late: one graph captured after half the rounds.
            labels = [*VARIANTS, *graphs, "one-graph-fresh", "one-graph-late", *peers, *warm,
                      *(f"{label}-dobench" for label in ["moegate", *peers])]
            if a.only:
                labels = [label for label in labels if label in a.only.split(",")]
            samples = {label: [] for label in labels}
            for r in range(a.rounds):
                if r == a.rounds // 2:
                    graphs["one-graph-late"] = _OneGraph(fns["moegate"], 200)
                for label in labels:
                    if label == "one-graph-fresh":
                        samples[label].append(_OneGraph(fns["moegate"], 200)())
                        continue
                    if label == "one-graph-late" and label not in graphs:
                        continue
                    if label in graphs:
                        samples[label].append(graphs[label]())
                        continue
                    if label in warm:
                        samples[label].append(_time_warm(fns[warm[label]], a.rep, a.warm_ms))
                        continue
                    if label.endswith("-dobench"):
                        samples[label].append(triton.testing.do_bench_cudagraph(
                            fns[label[: -len("-dobench")]], rep=a.rep, return_mode="median") * 1e3)
                        continue
                    overrides = VARIANTS.get(label, {})
                    saved = {k: getattr(kr, k) for k in overrides}
                    for k, v in overrides.items():
                        setattr(kr, k, v)
                    try:
                        samples[label].append(bench._time(fns["moegate" if label in VARIANTS else label], a.rep))
                    finally:
                        for k, v in saved.items():
                            setattr(kr, k, v)
            for label, xs in samples.items():
                s = sorted(xs)
                print(f"spread {name:18} T={T:>5} {label:10} min {s[0]:5.2f} med {s[(len(s) - 1) // 2]:5.2f} "
                      f"max {s[-1]:5.2f} | " + " ".join(f"{x:.2f}" for x in xs), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
