"""Launch each provider of the benchmark once inside a cudaProfilerStart/Stop region, for Nsight Compute.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight ... \
        python3 scripts/ncu_profile.py deepseek-v3-fp32:65536 qwen3:65536 [--set kept_only_override=False]

Every provider (moegate, SGLang's router when .peers/ has it, the floor) is compiled and run once
outside the region first, so ncu sees exactly one launch of each, on the benchmark's inputs.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from moegate import bench  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("cases", nargs="+", help="SHAPE:T, e.g. deepseek-v3-fp32:65536")
    p.add_argument("--providers", default="moegate,sglang,floor")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="set a launcher constant or override of moegate.kernels.router first (as moegate bench "
                        "--set), e.g. kept_only_override=False")
    args = p.parse_args()
    import moegate.kernels.router as kr

    for name, value in bench._parse_settings(p, args.set).items():
        setattr(kr, name, value)
    sglang = bench._load_sglang()
    want = args.providers.split(",")
    for case in args.cases:
        name, tokens = case.split(":")
        config, dtype = bench.SHAPES[name]
        fns = bench._providers(config, dtype, int(tokens), sglang, set())
        for prov in want:
            if prov not in fns:
                continue
            fns[prov]()  # compile and warm up outside the profiled region
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            fns[prov]()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            print(f"profiled {name} T={tokens} {prov}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
