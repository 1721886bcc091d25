"""A probe, compiled offline for sm_90 (no GPU): DeepSeek-V3's first stage on the rows-on-warps kernel with a group a
thread, against the kernel's own layout.

    python scripts/group_thread_probe.py [--dump FILE]

The kernel (kernels/warp_rows_kernel.py) spreads a row's 256 lanes over 8 threads in 16-byte chunks: a group of 32
lanes lies on 4 threads, its top-two sum takes shuffles, and the rounds then run on the kept groups' 128 lanes
read again from the logits with their keys computed again (KEPT), a third of its MUFU work and ~100 instructions a
warp of four rows. Here each of a row's 8 threads holds one whole group ([R, G, C, V, 2] tiles: the rows and the
groups on the threads, a group's 32 lanes in registers), so a group's top two are in-thread, the groups are ranked
across the 8 threads, and the kept groups' key bits move to the rounds' tile (thread j: half j % 2 of the group
ranked j // 2) by two shuffles and a select a key, where their distance words are built: no second read and no
second key. It stores the rounds' first max (the row's best word, which takes every compacted word) and the stage's
flags, so that nothing is dropped; its SASS count, set against the kernel's instructions up to the same point
(sass_count.py --path), says whether the layout is worth building. Not a kernel of the library: it checks nothing
and routes nothing.
"""

import argparse
import os
import sys

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from moegate.kernels.router_kernel import INF_BITS, INT32_MIN, _top2_combine  # noqa: E402
from moegate.kernels.warp_rows_kernel import _fast_keys, _widen  # noqa: E402


@triton.jit
def _shfl_pick(lo, hi, src, odd):
    """Each element: lo or hi (odd) of the same register on thread src of the warp."""
    return tl.inline_asm_elementwise(
        "{ .reg .b32 a, b; .reg .pred p; shfl.sync.idx.b32 a, $1, $3, 0x1f, 0xffffffff; "
        "shfl.sync.idx.b32 b, $2, $3, 0x1f, 0xffffffff; setp.ne.b32 p, $4, 0; selp.b32 $0, b, a, p; }",
        "=r,r,r,r,r", [lo, hi, src, odd], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _group_thread_stage(logits_ptr, bias_ptr, words_ptr, flags_ptr, stride, num_tokens, R: tl.constexpr,
                        G: tl.constexpr, C: tl.constexpr, V: tl.constexpr, TOPK_GROUP: tl.constexpr):
    GS: tl.constexpr = C * V  # a group's lanes, all on one thread
    pid = tl.program_id(0)
    rows = pid * R + tl.arange(0, R)
    rows64 = tl.minimum(rows, num_tokens - 1).to(tl.int64)
    row_ptr = logits_ptr + rows64 * stride
    H: tl.constexpr = GS // 2
    # [R, G, H // V, V, 2]: lane g * GS + h * H + c * V + v at [., g, c, v, h]: the rows and the groups on the threads
    # (the loads' contiguous axis is v; Triton puts the threads on the lowest other axes), a group's two halves split
    # in registers
    lane = (tl.arange(0, G)[None, :, None, None, None] * GS + tl.arange(0, 2)[None, None, None, None, :] * H
            + tl.arange(0, H // V)[None, None, :, None, None] * V + tl.arange(0, V)[None, None, None, :, None]
            + (rows * 0)[:, None, None, None, None])
    x = _widen(tl.load(row_ptr[:, None, None, None, None] + lane), True)
    b = tl.load(bias_ptr + lane).to(tl.float32)
    hi = _fast_keys(x, b, 1, True).to(tl.int32, bitcast=True)
    hig = tl.reshape(hi, [R, G, GS])
    t1, t2 = tl.reduce((hig, tl.full(hig.shape, INT32_MIN, tl.int32)), 2, _top2_combine)  # in-thread
    gscore = t1.to(tl.float32, bitcast=True) + t2.to(tl.float32, bitcast=True)
    g = tl.arange(0, G)[None, :] + (rows * 0)[:, None]
    gword = (gscore.to(tl.int32, bitcast=True) & (-G)) | ((G - 1) - g)
    gw = gword
    slots = tl.zeros(rows.shape, tl.int32)
    for s in tl.static_range(TOPK_GROUP):
        m = tl.max(gw, axis=1)
        slots = slots | (((G - 1) - (m & (G - 1))) << (4 * s))
        gw = tl.where(gw == m[:, None], INT32_MIN, gw)
    kept = gword >= m[:, None]
    kept_min = tl.min(tl.where(kept, gscore, float("inf")), axis=1)
    dropped_max = tl.max(tl.where(kept, float("-inf"), gscore), axis=1)
    flag = (tl.min(t2, axis=1) < 0) | (kept_min - dropped_max <= 1e-5) | (tl.max(gword, axis=1) > INF_BITS)
    best = tl.max(tl.where(kept, t1, INT32_MIN), axis=1)  # the kept lanes' best key: their groups' tops
    DSPAN: tl.constexpr = (1 << 23) - 1
    base = tl.maximum(best.to(tl.int64) - DSPAN, INT32_MIN).to(tl.int32)
    flag = flag | (base < 0)
    lo, hi_half = tl.split(hi)  # [R, G, H // V, V]: a thread's two halves of its group's key bits, in its registers
    lo = tl.reshape(lo, [R, G, H])
    hi_half = tl.reshape(hi_half, [R, G, H])
    # The rounds' tile: thread j of a row (the G axis) takes half j % 2 of the group ranked j // 2, from the
    # thread that holds it. Triton puts the rows on the warp's lowest lane bits here ([R, G] threads: lane r + R * g,
    # the TTGIR's threadsPerWarp [4, 8, 1, 1]); a kernel would have to hold that layout fixed.
    j = tl.arange(0, G)[None, :, None] + (rows * 0)[:, None, None]
    src_group = (slots[:, None, None] >> ((j >> 1) << 2)) & 15  # [R, G, 1]
    src = tl.arange(0, R)[:, None, None] + R * src_group + tl.zeros(lo.shape, tl.int32)
    kh = _shfl_pick(lo, hi_half, src, (j & 1) + tl.zeros(lo.shape, tl.int32))  # the kept lanes' key bits
    inv = (TOPK_GROUP * GS - 1) - (j * H + tl.arange(0, H)[None, None, :])  # the compact lane s * GS + h * H + u
    kw = ((tl.maximum(kh, base[:, None, None]) - base[:, None, None]) << 8) | inv
    # The rounds' first step, the row's best word, stands in for the rounds (the same in both layouts).
    top = tl.max(tl.max(kw, axis=2), axis=1)
    tl.store(words_ptr + rows64, top)
    tl.store(flags_ptr + rows64, flag.to(tl.int32))


def compile_probe():
    sig = {"logits_ptr": "*bf16", "bias_ptr": "*fp32", "words_ptr": "*i32", "flags_ptr": "*i32", "stride": "i32",
           "num_tokens": "i32"}
    consts = {"R": 4, "G": 8, "C": 4, "V": 8, "TOPK_GROUP": 4}
    sig.update({k: "constexpr" for k in consts})
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(5)}
    src = ASTSource(fn=_group_thread_stage, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1, "maxnreg": 64})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dump", help="write the SASS to this file (and the TTGIR to FILE.ttgir)")
    args = p.parse_args()
    import sass_count

    compiled = compile_probe()
    seq, _ = sass_count._disassemble(compiled)
    counts = sass_count.sass_counts(compiled)
    print(f"group a thread, DeepSeek-V3 bf16 (a warp of four rows): {len(seq)} SASS instructions, registers "
          f"{sass_count.registers(compiled)}, MUFU {counts.get('MUFU', 0)}, SHFL {counts.get('SHFL', 0)}, "
          f"LDG {counts.get('LDG', 0)}")
    if args.dump:
        with open(args.dump, "w") as f:
            f.write(compiled.asm["sass"])
        with open(args.dump + ".ttgir", "w") as f:
            f.write(compiled.asm["ttgir"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
