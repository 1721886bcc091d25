"""Would more rows resident on an SM speed up the router's large launches? Cap the resident programs and time them.

    python scripts/occupancy_probe.py [--shapes deepseek-v3-fp32,kimi-k2,512-top22] [--tokens 65536]
                                      [--caps 32,28,24,20,16,8] [--rep 20]

One row a one-warp program, the router's launch from 256 lanes, holds at most 32 programs (32 warps) on an SM: the
hardware's limit on resident programs, below the 64 warps an SM can hold. Nsight Compute saw 27 resident on
DeepSeek-V3 at T = 65536 (BENCHMARKS.md run 94). Programs of several warps, a row a warp, would hold more rows at
once, as many as the registers allow (52 registers a thread: 36 warps an SM); whether that can pay depends on
whether the rows wait on their own latency (more rows in flight hide it) or on issue and the pipes (they do not).
This probe asks the launches themselves: each launch as route() makes it is launched again with extra dynamic
shared memory, sized so that at most CAP programs fit on an SM (the driver's occupancy calculator,
cuOccupancyMaxActiveBlocksPerMultiprocessor, says how many each size allows, and that figure is printed), and timed
with the benchmark's CUDA-graph timer. The read-once floor in the router's program shape (one row a one-warp
program) is timed the same way. A time that falls steeply as CAP rises to 32 says the rows are latency-bound there
(more rows resident would pay); a time flat from 24 to 32 says they are not.

H100 runs 148-149 (BENCHMARKS.md): the floor in the router's shape takes 41.0 us at T = 65536 with 32 or 16 programs
an SM (the SMs' rate of starting programs); DeepSeek-V4 and DeepSeek-V3 bf16 sit on it (42.7-42.9 us at 32, 2-6%
slower at 24), DeepSeek-V3 fp32 and Kimi-K2 lose 5-14% at 24; 512 top-22 and 896 top-16 are flat (their rows' own
work). Fitted to the caps of 24 and fewer, the rows' own pace at 36 resident warps is 35.7-39.5 us on those four
shapes: the H200's 2x target needs programs of several rows, a row a warp, not faster rows alone.
"""

import argparse
import ctypes
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from moegate import route  # noqa: E402
from moegate.bench import SHAPES, _time  # noqa: E402
from moegate.kernels import router as kr  # noqa: E402
from moegate.kernels import router_kernel as rk  # noqa: E402

_cuda = None


def _occupancy(function: int, threads: int, dynamic_smem: int) -> int:
    """Resident programs an SM for this kernel handle, block size and dynamic shared memory (the driver's figure)."""
    global _cuda
    if _cuda is None:
        _cuda = ctypes.CDLL("libcuda.so.1")
    n = ctypes.c_int(0)
    rc = _cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), ctypes.c_void_p(function),
                                                           ctypes.c_int(threads), ctypes.c_size_t(dynamic_smem))
    if rc != 0:
        raise RuntimeError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor returned {rc}")
    return n.value


def _compiled(jit_fn) -> list:
    """Every loaded kernel of a Triton JIT function (launched at least once since its caches were cleared)."""
    kernels = []
    for cache in jit_fn.device_caches.values():
        kernels.extend(k for k in cache[0].values() if getattr(k, "function", None) is not None)
    return kernels


def _with_programs_per_sm(kernel, cap: int):
    """The extra dynamic shared memory (bytes, <= 48 KB) that leaves at most ``cap`` programs of ``kernel`` on an SM,
    and the driver's resident figure with it; (0, figure) where the kernel holds no more than ``cap`` already."""
    num_warps, _num_ctas, shared = kernel.packed_metadata
    threads = 32 * num_warps
    for extra in range(0, 48 * 1024 + 1, 128):
        occ = _occupancy(kernel.function, threads, shared + extra)
        if occ <= cap:
            return extra, occ
    raise ValueError(f"no shared-memory size under 48 KB holds {kernel.name} to {cap} programs an SM")


def _patched(kernels, extra: dict):
    """Set each kernel's launch shared memory to its own plus extra[kernel]; returns the originals to restore."""
    saved = {}
    for k in kernels:
        saved[k] = k.packed_metadata
        num_warps, num_ctas, shared = k.packed_metadata
        k.packed_metadata = (num_warps, num_ctas, shared + extra.get(k, 0))
    return saved


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="deepseek-v3-fp32,kimi-k2,512-top22")
    p.add_argument("--tokens", default="65536")
    p.add_argument("--caps", default="32,28,24,20,16,8")
    p.add_argument("--rep", type=float, default=20.0)
    a = p.parse_args(argv)
    caps = [int(c) for c in a.caps.split(",")]
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__}")
    print(f"{'launch':28s} {'T':>6s} " + " ".join(f"{'cap ' + str(c):>14s}" for c in caps)
          + "   (us; resident programs an SM in brackets)")
    for T in [int(t) for t in a.tokens.split(",")]:
        probes = {}
        x256 = torch.randn(T, 256, device="cuda")
        w8, i8 = torch.empty(T, 8, device="cuda"), torch.empty(T, 8, dtype=torch.int32, device="cuda")
        probes["floor, a row a 1-warp prog"] = (
            rk._floor_kernel, lambda: rk._floor_kernel[(T,)](x256, 256, w8, i8, T, W=256, K=8, BLOCK_M=1, BLOCK_W=256,
                                                            BLOCK_K=8, num_warps=1))
        kr.warp_rows_override = False  # the router kernel's launches (one row a one-warp program)
        for name in a.shapes.split(","):
            config, dtype = SHAPES[name]
            x = torch.randn(T, config.num_scored, device="cuda", dtype=dtype)
            bias = torch.randn(config.num_experts, device="cuda") * 0.1 if config.has_correction_bias else None
            out = (torch.empty(T, config.top_k, device="cuda"),
                   torch.empty(T, config.top_k, dtype=torch.int32, device="cuda"))
            probes[name] = (rk._route_kernel, lambda x=x, c=config, b=bias, o=out: route(x, c, bias=b,
                                                                                       backend="triton", out=o))
        for name, (jit_fn, fn) in probes.items():
            jit_fn.device_caches.clear()  # so that the one kernel loaded next is this launch's (from the disk cache)
            fn()
            torch.cuda.synchronize()
            kernels = _compiled(jit_fn)
            if len(kernels) != 1:
                raise RuntimeError(f"{name}: {len(kernels)} kernels loaded for one launch")
            cells = []
            for cap in caps:
                (kernel,) = kernels
                extra, occ = _with_programs_per_sm(kernel, cap)
                saved = _patched(kernels, {kernel: extra})
                try:
                    us = _time(fn, a.rep)
                finally:
                    for k, packed in saved.items():
                        k.packed_metadata = packed
                cells.append(f"{us:8.2f} [{occ:>2d}]")
            print(f"{name:28s} {T:6d} " + " ".join(f"{c:>14s}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
