"""Is a launch of one-warp programs, one row each, bound by how fast the GPU starts programs?

    python scripts/cta_probe.py [--tokens 4096,8192,65536] [--rep 20]

Times (the benchmark's CUDA-graph timer, us a launch) the read-once floor kernel over 256 fp32 logits a row in
several program shapes: the benchmark's own (16 rows on 4 warps), one row a one-warp program (the router's shape
for 256-512 experts), 2 and 4 rows a one-warp program, and a persistent form (one-warp programs, as many as fit on
the GPU at once, each looping over rows). Then the router itself (DeepSeek-V3 fp32, DeepSeek-V4) as launched, and
with the rows-a-program overrides. A one-row-a-program floor far above the benchmark's floor says that starting
programs, not reading or routing rows, sets those launches' pace.

H200 run 68 (BENCHMARKS.md): it does for the floor (T=65536: 41.1 us one row a one-warp program, 20.1 in the
benchmark's shape, 19.6 persistent), not for the router. Run 69 timed the router in a persistent grid (one-warp
programs, 32 or 16 an SM, looping over rows): slower at every T >= 8192 (DeepSeek-V3 fp32 T=65536 59.9 us against
54.8), level at 4096; its rows are bound by their own instructions, which overlap the programs' start.
"""

import argparse
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from moegate import route  # noqa: E402
from moegate.bench import SHAPES, _time  # noqa: E402
from moegate.kernels import router as kr  # noqa: E402
from moegate.kernels.router_kernel import _floor_kernel  # noqa: E402


@triton.jit
def _floor_loop_kernel(logits_ptr, logits_row_stride, weights_ptr, ids_ptr, num_tokens, W: tl.constexpr,
                       K: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr):
    """_floor_kernel's work, one row at a time, over rows pid, pid + programs, ... (a persistent grid)."""
    c = tl.arange(0, BLOCK_W)
    k = tl.arange(0, BLOCK_K)
    for row in range(tl.program_id(0), num_tokens, tl.num_programs(0)):
        r = row.to(tl.int64)
        x = tl.load(logits_ptr + r * logits_row_stride + c, mask=c < W, other=float("-inf")).to(tl.float32)
        m = tl.max(x, axis=0)
        tl.store(weights_ptr + r * K + k, m + k.to(tl.float32), mask=k < K)
        tl.store(ids_ptr + r * K + k, (m > 0).to(tl.int32) + k, mask=k < K)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", default="4096,8192,65536")
    p.add_argument("--rep", type=float, default=20.0)
    args = p.parse_args(argv)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    W, K = 256, 8
    for T in [int(t) for t in args.tokens.split(",")]:
        logits = torch.randn(T, W, device="cuda")
        w = torch.empty(T, K, device="cuda")
        i = torch.empty(T, K, dtype=torch.int32, device="cuda")

        def floor(bm, warps):
            return lambda: _floor_kernel[(triton.cdiv(T, bm),)](logits, W, w, i, T, W=W, K=K, BLOCK_M=bm,
                                                                  BLOCK_W=W, BLOCK_K=K, num_warps=warps)

        def loop(per_sm):
            return lambda: _floor_loop_kernel[(min(T, sms * per_sm),)](logits, W, w, i, T, W=W, K=K, BLOCK_W=W,
                                                                       BLOCK_K=K, num_warps=1)

        probes = {"floor 16 rows 4 warps": floor(16, 4), "floor 1 row 1 warp": floor(1, 1),
                  "floor 2 rows 1 warp": floor(2, 1), "floor 4 rows 1 warp": floor(4, 1),
                  "floor 2 rows 2 warps": floor(2, 2), "floor 4 rows 4 warps": floor(4, 4),
                  "floor loop 32/SM": loop(32), "floor loop 16/SM": loop(16)}
        for name in ("deepseek-v3-fp32", "deepseek-v4"):
            config, dtype = SHAPES[name]
            x = torch.randn(T, config.num_experts, device="cuda", dtype=dtype)
            bias = torch.randn(config.num_experts, device="cuda") * 0.1 if config.has_correction_bias else None
            out = (torch.empty(T, config.top_k, device="cuda"),
                   torch.empty(T, config.top_k, dtype=torch.int32, device="cuda"))

            def run(override, x=x, config=config, bias=bias, out=out):
                def fn():
                    kr.launch_override = override
                    try:
                        route(x, config, bias=bias, backend="triton", out=out)
                    finally:
                        kr.launch_override = None
                return fn

            probes[f"{name} as launched"] = run(None)
            for ov in ((2, 1), (2, 2), (4, 4)):
                probes[f"{name} {ov[0]} rows {ov[1]} warps"] = run(ov)
        for name, fn in probes.items():
            try:
                print(f"T={T:6d} {name:34s} {_time(fn, args.rep):8.2f} us", flush=True)
            except Exception as e:  # a launch shape the launcher refuses
                print(f"T={T:6d} {name:34s} failed: {type(e).__name__}: {str(e)[:100]}", flush=True)


if __name__ == "__main__":
    main()
