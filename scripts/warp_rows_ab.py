"""Diagnostics for the rows-on-warps kernel: the kernel as shipped against copies of it with parts removed, timed
side by side on the benchmark's inputs (BENCHMARKS.md). GPU only.

    PYTHONPATH=src python scripts/warp_rows_ab.py [--tokens 1024,4096,65536]
"""

import argparse
import importlib.util
import os
import sys
import tempfile

import torch

import moegate.kernels.router as kr
from moegate.bench import SHAPES, _floor_launch, _time
from moegate.router import route

SRC = os.path.join(os.path.dirname(kr.__file__), "warp_rows_kernel.py")
# name -> (old, new) source edits of warp_rows_kernel.py
VARIANTS = {
    "shipped": [],
    "no-exact-path": [("    if state > 1:", "    if False:")],  # rows for the exact path routed as the fast keys say
    "no-repair": [("    if not REPAIR:", "    if True:")],  # close rows to the exact path (the kernel of runs 153-159)
    "extra0": [("C: tl.constexpr = K + 1 + EXTRA", "C: tl.constexpr = K + 1")],  # no candidate past the first loser
    # the fast path alone (every flagged row routed as the fast keys say): the bound of this kernel
    "fast-only": [("    if state == 1:", "    if False:"), ("    if state > 1:", "    if False:")],
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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="deepseek-v3-fp32,deepseek-v4")
    p.add_argument("--tokens", default="1024,4096,65536")
    p.add_argument("--rep", type=float, default=20.0)
    a = p.parse_args(argv)
    mods = {name: _module(name, edits) for name, edits in VARIANTS.items()}
    for name in a.shapes.split(","):
        config, dtype = SHAPES[name]
        for T in [int(t) for t in a.tokens.split(",")]:
            g = torch.Generator(device="cuda").manual_seed(T)
            x = torch.randn(T, config.num_experts, generator=g, device="cuda").to(dtype)
            bias = torch.randn(config.num_experts, generator=g, device="cuda") * 0.1
            out = (torch.empty(T, config.top_k, device="cuda"),
                   torch.empty(T, config.top_k, dtype=torch.int32, device="cuda"))
            stats = torch.zeros(3, dtype=torch.int32, device="cuda")
            kr.warp_rows_override, kr.count_fallbacks_into = True, stats
            route(x, config, bias=bias, out=out)
            kr.count_fallbacks_into = None
            torch.cuda.synchronize()
            line = [f"{name:16s} T={T:6d} exact {stats[0].item()} repaired {stats[1].item()} of {stats[2].item()}"]
            for label, override in (("router", False), ("floor", None)):
                kr.warp_rows_override = override
                fn = (lambda: _floor_launch(x, *out, config.top_k, pdl=False)) if label == "floor" else (
                    lambda: route(x, config, bias=bias, out=out))
                line.append(f"{label} {_time(fn, a.rep):6.2f}")
            kr.warp_rows_override = True
            for label, mod in mods.items():
                saved = kr.wrk._warp_rows_kernel
                kr.wrk._warp_rows_kernel = mod._warp_rows_kernel
                try:
                    line.append(f"{label} {_time(lambda: route(x, config, bias=bias, out=out), a.rep):6.2f}")
                finally:
                    kr.wrk._warp_rows_kernel = saved
            kr.force_exact_override = True  # every program on the exact path: its throughput
            line.append(f"forced-exact {_time(lambda: route(x, config, bias=bias, out=out), a.rep):6.2f}")
            kr.force_exact_override = False
            print(" | ".join(line), flush=True)
    kr.warp_rows_override = None


if __name__ == "__main__":
    sys.exit(main())
