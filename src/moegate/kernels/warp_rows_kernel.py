"""Large launches of sigmoid / sqrt-softplus routers with a correction bias: a program of R rows, 32 // TH a warp.

The router kernel (router_kernel.py) runs such rows one a one-warp program: 65536 of them take ~41 us to start on
a Hopper GPU whatever they do (BENCHMARKS.md runs 148-149), about what the whole launch takes. Here a program routes
R rows, a row on TH threads of a warp (TH = LT / VEC: 32, or 8 for four rows a warp). Triton puts warps on the
columns of a [R, lanes] tile (every row reduction then crosses warps through shared memory), so the row is a
[R, NC, LT] tile instead: LT = TH * VEC lanes (VEC adjacent lanes a thread, one 16-byte load), NC = lanes / LT chunks
in registers. Triton's coalescing orders a load's dimensions by contiguity, ties from the lowest, so the tile's
threads go on the LT lanes (TH of them), the warp's other 32 / TH threads and the warps on the rows, and every value
computed from the tile keeps that layout: a row's reductions are in-thread steps and shuffles within its TH threads,
no barrier (sm_90 SASS: none on the fast path but the flags' reduction over the warps and, where the words outnumber
the threads, one exchange of the winners). The epilogue runs on [KC, R] tensors (a word a thread: the winners, the
first loser, EXTRA more) for the same reason: a gather has no contiguity, so its layout fills the lower dimension
first, KC threads on the words and the rest on the rows. Fewer threads a row cost nothing in the elementwise work (a
warp's instruction still takes 32 lanes, of four rows) and divide what a row spends on shuffles, on scalars (its
checks, each round's word) and on the epilogue's idle lanes (K of KC busy) by four: sm_90 SASS of the fast path, a
row, DeepSeek-V4 483 -> 323 instructions, DeepSeek-V3 bf16 527 -> 375 (counted offline, 2026-12-06).

One row, on the fast path (docs/kernel.md, "Rows on warps"):
1. the fast keys of the router's APPROX_KEYS (sigmoid: ex2 / rcp approx; sqrt-softplus: ex2 / lg2 / sqrt approx)
   + bias, their raw bits (RAW_BITS); a logit that is NaN or +-inf makes its key NaN (x * 0 + x), whose bits top
   every other key's, and sends the row to the exact path;
2. groups: each group's top (GROUP_MAX) or top-two sum from its keys' bits, the groups kept on 32-bit words (score
   bits, inverted group) by TOPK_GROUP rounds of a max where they are at most half the groups (GROUP_ROUNDS), else by
   counting the groups above each; KEPT: the kept groups' logits read again into a
   [R, 1, 128] tile (slot s holding the group ranked s) and their keys computed again, so the rounds run on 128
   lanes; otherwise the dropped groups' lanes go to INT32_MIN;
3. distance words below the row's best key, (distance << 8) | inverted lane, and K + 1 rounds of one unsigned max
   (the router's rounds): the K winners and the first loser; the EXTRA more words that _repair also takes as
   candidates are found in its branch (LAZY_EXTRA; else here, K + 1 + EXTRA rounds);
4. checks that send the row to the exact path: a NaN key; a group's second (or, for GROUP_MAX, top) key below +0.0
   or the words' base below 0 (raw bits order only keys >= +0.0); a dropped group's score within two keys' errors
   of a kept one (four for top-two sums); a first loser below the normal floats. And close rows: two adjacent
   words of the K winners and the first loser closer than two keys' errors (their gap in order bits, the largest
   round step, times an ulp of the lower key), which also catches the K-th winner on the distance clamp.
Every program then stores its rows (the epilogue, on a [KE, R] tile of the K winners where KE, the power of 2 >= K,
is below KC (NARROW), else on the words' tile: the winners' logits gathered again, scored exactly, renormalised
(p = 1), eps added or clamped, scaled by rsf), and reduces its rows' flags across its warps once. A program with close
rows and no flag (REPAIR) reorders the K + 1 + EXTRA candidates on their exact keys (_repair) and stores the close rows
again where the bound on the other lanes holds. The rows left (flagged ones, close ones in a program with a flag, close
ones whose bound failed; every row under FORCE_EXACT) go to the exact path one at a time, each spread over all the
program's threads (_exact_rows): exact keys (libdevice, IEEE division and square root: the reference's bits), dead
lanes (NaN, -inf) at -inf, groups ranked by counting (ties to the lower group), K rounds of one 64-bit max (order
bits, inverted lane), in a function not inlined (its registers do not set the fast path's). The fallbacks cost a
launch their latency, not their throughput (docs/kernel.md).

What it does not do (the launcher sends such calls to the router kernel): logit scale or softcap, logits
selection, no bias, softmax, hash routing, placement, shared slots, padding, capture, packed words, expert scales,
p-norms, zero-filled groups, K > 31, and rows whose width (E = W) is not a power of two and a multiple of a chunk
(a row's TH threads' 16-byte loads: 32 fp32 or 64 bf16 / fp16 lanes on 8): E = 384 takes the router kernel.
"""

import triton
import triton.language as tl

from moegate.kernels.router_kernel import (
    INF_BITS,
    INT32_MIN,
    _div_nonneg,
    _gather_logits,
    _key_err,
    _key_of32,
    _nan_unless_finite,
    _order_bits,
    _renorm_denom,
    _score,
    _sigmoid_fast,
    _sqrtsoftplus_fast,
    _top2_combine,
)


def _smem_kept_asm(R: int, W: int, GS: int, TOPK_GROUP: int) -> str:
    """PTX for _smem_kept (bf16 / fp16 logits: 8 lanes a thread a chunk, W / 64 chunks, 8 threads a row, R rows a
    program, R / 4 warps): operands $0-$31 out (slot s's kept lanes 4t..4t+3 at registers 8s..8s+3, the rest 0),
    $32-$63 the thread's first-pass key bits (register 8c + v: lane 64c + 8t + v), $64-$95 the row's slots. Thread
    %tid.x holds row %tid.x / 8 (rows on the warps' lanes, then on the warps), t = %tid.x % 8: a row's 8 threads
    share a warp, so a warp barrier orders its stores before its loads."""
    n_out = 8 * (W // 64)
    lines = ["{", f".shared .align 16 .b32 mgk[{R * W}];", ".reg .u32 ln, sb, rb, g;", "mov.u32 ln, %tid.x;",
             "mov.u32 sb, mgk;", "shr.u32 rb, ln, 3;", f"mad.lo.u32 rb, rb, {4 * W}, sb;",  # the row's 4W bytes
             "and.b32 ln, ln, 7;", "shl.b32 ln, ln, 5;", "add.u32 sb, rb, ln;"]  # + 32 t: the thread's 8 lanes
    for c in range(W // 64):
        for h in range(2):
            regs = ",".join(f"${n_out + 8 * c + 4 * h + e}" for e in range(4))
            lines.append(f"st.shared.v4.b32 [sb+{256 * c + 16 * h}], {{{regs}}};")
    lines += ["bar.warp.sync -1;", "shr.u32 ln, ln, 1;", "add.u32 rb, rb, ln;"]  # + 16 t: lanes 4t..4t+3
    for s in range(TOPK_GROUP):
        regs = ",".join(f"${8 * s + e}" for e in range(4))
        lines += [f"bfe.u32 g, ${2 * n_out}, {4 * s}, 4;", f"mad.lo.u32 g, g, {4 * GS}, rb;",
                  f"ld.shared.v4.b32 {{{regs}}}, [g];"]
    lines += [f"mov.u32 ${8 * s + e}, 0;" for s in range(TOPK_GROUP) for e in range(4, 8)]
    lines += [f"mov.u32 ${8 * s + e}, 0;" for s in range(TOPK_GROUP, W // 64) for e in range(8)]
    lines.append("}")
    return " ".join(lines)


_smem_kept_ptx = triton.constexpr_function(_smem_kept_asm)
SMEM_KEPT_CONSTRAINTS = tl.constexpr(",".join(["=r"] * 32 + ["r"] * 64))


@triton.jit
def _smem_kept(key, slots, R: tl.constexpr, NC: tl.constexpr, LT: tl.constexpr):
    """[R, NC, LT] first-pass key bits (int32), [R] slots -> [R, 4, 32] the kept groups' key bits (slot s, lane
    4t + e: the kept tile's), through 1 KB of shared memory a row (_smem_kept_asm): the second read and keys saved."""
    ASM_R: tl.constexpr = _smem_kept_ptx(R, NC * LT, 32, 4)
    out = tl.inline_asm_elementwise(ASM_R, SMEM_KEPT_CONSTRAINTS,
                                    [key, tl.broadcast_to(slots[:, None, None], key.shape)], dtype=tl.int32,
                                    is_pure=True, pack=32)
    o5 = tl.permute(tl.reshape(out, [R, NC, LT // 8, 2, 4]), [0, 1, 2, 4, 3])
    real, _dummy = tl.split(o5)
    return tl.reshape(real, [R, NC, LT // 2])


@triton.jit
def _row_max(v):
    """[R, NC, LT] -> [R]: in-thread over the chunks and a thread's own lanes, then the warp's shuffles."""
    return tl.max(tl.max(v, axis=1), axis=1)


@triton.jit
def _step_below(word, cur, ASM: tl.constexpr = False):
    """[R, NC, LT] words, [R] current words -> [R]: the distance (negative) to each row's next word down, the unsigned
    max of word - cur (words at or above cur give small values, the closest one below the largest). ASM (on the GPU):
    each thread's four adjacent words by one sub and three sub-maxes in PTX (ptxas: an IADD and three VIADDMNMX), the
    other three of the four zero, which the where below (a word's lane & 3: the first of its four, as the words'
    layout puts four or eight adjacent lanes on a thread: test_sass checks it) lets the compiler drop; the compiler's
    own form takes 4-6 more instructions a round (separate IADDs feeding 3-input maxes)."""
    if ASM:
        c = tl.broadcast_to(cur[:, None, None], word.shape)
        d = tl.inline_asm_elementwise(
            "{ .reg .u32 a, t; sub.u32 a, $4, $8; sub.u32 t, $5, $9; max.u32 a, a, t; sub.u32 t, $6, $10; "
            "max.u32 a, a, t; sub.u32 t, $7, $11; max.u32 $0, a, t; mov.u32 $1, 0; mov.u32 $2, 0; mov.u32 $3, 0; }",
            "=r,=r,=r,=r,r,r,r,r,r,r,r,r", [word, c], dtype=tl.int32, is_pure=True, pack=4)
        d = tl.where((tl.arange(0, word.shape[2]) & 3)[None, None, :] == 0, d, 0)
        return _row_max(d.to(tl.uint32, bitcast=True)).to(tl.int32, bitcast=True)
    return _row_max((word - cur[:, None, None]).to(tl.uint32, bitcast=True)).to(tl.int32, bitcast=True)


@triton.jit
def _widen(x, ASM: tl.constexpr):
    """Logits -> fp32. ASM (on the GPU, bf16): a 32-bit pair's two lanes by a shift and an and (the lower lane in the
    low half), where the compiler spends a PRMT and an IMAD on the upper one."""
    if ASM and x.dtype == tl.bfloat16:
        return tl.inline_asm_elementwise("{ shl.b32 $0, $2, 16; and.b32 $1, $2, 0xFFFF0000; }", "=r,=r,r", [x],
                                         dtype=tl.int32, is_pure=True, pack=2).to(tl.float32, bitcast=True)
    return x.to(tl.float32)


@triton.jit
def _distance_words(hi, base, inv, LANE_BITS: tl.constexpr, ASM: tl.constexpr):
    """[R, NC, LT] key bits, [R] bases, inverted lanes -> (max(hi, base) - base) << LANE_BITS | inv. ASM (on the GPU):
    max(hi, base) * 2**LANE_BITS - base * 2**LANE_BITS by one mad.lo a lane, where the compiler subtracts first: the
    same bits modulo 2**32 (the distance is below 2**(31 - LANE_BITS))."""
    m = tl.maximum(hi, base[:, None, None])
    if ASM:
        nb = -(base << LANE_BITS)
        d = tl.inline_asm_elementwise("mad.lo.s32 $0, $1, $3, $2;", "=r,r,r,r",
                                      [m, nb[:, None, None], tl.full(hi.shape, 1 << LANE_BITS, tl.int32)],
                                      dtype=tl.int32, is_pure=True, pack=1)
    else:
        d = (m - base[:, None, None]) << LANE_BITS
    return d | inv


@triton.jit
def _fast_keys(x, b, SCORING: tl.constexpr, ACCURATE: tl.constexpr, FINITE: tl.constexpr = False):
    """Step 3 on fast keys: NaN where x is NaN or +-inf (see the module docstring); FINITE (the caller knows the row
    to be finite or flagged already): NaN only where x is NaN."""
    xn = x if FINITE else _nan_unless_finite(x, ACCURATE)
    if SCORING == 1:
        key = _sigmoid_fast(xn, ACCURATE)
    else:
        key = _sqrtsoftplus_fast(xn, ACCURATE, True)
    return key + b


@triton.jit
def _warp_rows_kernel(
    logits_ptr, weights_ptr, ids_ptr, bias_ptr,
    logits_row_stride, num_tokens, renorm_eps, rsf,
    bias_offset,  # KEPT: (bias_ptr - logits_ptr) in elements of the logits (the same dtype), a multiple of 4
    stats_ptr,  # COUNT_FALLBACKS: int32 [3]: programs on the exact path, programs that ran _repair, programs
    K: tl.constexpr,
    N_GROUP: tl.constexpr,
    GROUP_SIZE: tl.constexpr,  # W // N_GROUP (W when N_GROUP == 1)
    TOPK_GROUP: tl.constexpr,
    GROUP_MAX: tl.constexpr,  # group score: the top key (else the top two's sum)
    SCORING: tl.constexpr,  # 1 sigmoid, 2 sqrt-softplus
    RENORMALIZE: tl.constexpr,
    EPS_CLAMP: tl.constexpr,
    APPLY_RSF: tl.constexpr,
    R: tl.constexpr,  # rows a program, 32 * VEC // LT a warp
    KC: tl.constexpr,  # words a row ([KC, R] tiles, a word a thread): at least K + 1 + EXTRA and LT // VEC
    NC: tl.constexpr,  # chunks of LT lanes a row
    LT: tl.constexpr,  # TH * VEC lanes a chunk: a 16-byte load on each of the row's TH threads
    KEPT: tl.constexpr,  # rounds on the kept groups' lanes (TOPK_GROUP * GROUP_SIZE == 128)
    BIAS_BY_OFFSET: tl.constexpr,  # KEPT: the bias read through the logits' pointers (the same dtype)
    REPAIR: tl.constexpr,  # close rows to _repair (else to the exact path)
    EXTRA: tl.constexpr,  # _repair's candidates past the first loser
    FORCE_EXACT: tl.constexpr,  # every program takes the exact path (tests)
    NARROW: tl.constexpr,  # the epilogue on [KE, R] tiles of the K winners where KE < KC (else on the [KC, R] words)
    GROUP_ROUNDS: tl.constexpr,  # the kept groups by TOPK_GROUP rounds of a max where 2 * TOPK_GROUP <= N_GROUP
    LAZY_EXTRA: tl.constexpr,  # the EXTRA words past the first loser found only where _repair runs
    LEAN: tl.constexpr,  # forms the compiler does not find: bf16 widening, the kept lanes' words, steps, bias, keys
    SMEM_KEPT: tl.constexpr,  # KEPT, GPU, bf16 / fp16: the kept lanes' keys from the first pass's through shared memory
    COUNT_FALLBACKS: tl.constexpr,
    ACCURATE: tl.constexpr,
):
    W: tl.constexpr = NC * LT
    LANE_BITS: tl.constexpr = W.bit_length() - 1  # the words' low bits: the inverted (compact) lane
    tl.static_assert(W == 1 << LANE_BITS and LT % 32 == 0 and K < 32 and (SCORING == 1 or SCORING == 2))
    pid = tl.program_id(0)
    rows = pid * R + tl.arange(0, R)
    row_ok = rows < num_tokens
    # The last program's rows past T read row T - 1 again (no masks on the loads); nothing of theirs is stored.
    rows64 = tl.minimum(rows, num_tokens - 1).to(tl.int64)
    # The launcher takes 16-byte aligned rows only. Said here, it gives the loads one layout at any such row stride,
    # the one the layout-bound PTX forms assume (_step_below, _smem_kept). Triton proves it itself only where the
    # stride is a multiple of 16 elements, and gave rows 260 or 264 elements apart a lane a thread with the rows on
    # its registers (where a packed step took the max across four rows, and the fast path spilled).
    row_ptr = tl.multiple_of(logits_ptr + rows64 * logits_row_stride, 16)  # [R]
    lane3 = tl.arange(0, NC)[None, :, None] * LT + tl.arange(0, LT)[None, None, :] + (rows * 0)[:, None, None]
    # LEAN: forms that the compiler does not find on its own, three in PTX (GPU only): bf16 widened a pair at a time
    # (_widen), the kept lanes' distance words by one mad.lo (_distance_words: on the whole row, DeepSeek-V4 1215 ->
    # 1186, ptxas spills a register at the 64-register cap) and their rounds' steps four words at a time (_step_below:
    # on the whole row, DeepSeek-V4 1215 -> 1150 instructions but 2-3% slower, H200 run 186), both KEPT only; the kept
    # lanes' bias of a wider dtype addressed from the logits' pointers, and their keys without the finite check (the
    # first pass flags the row). sm_90 SASS of the fast path, a warp of four rows: DeepSeek-V3 bf16 1152 -> 1025, fp32
    # 1160 -> 1098.
    ASM: tl.constexpr = LEAN and ACCURATE
    ESZ: tl.constexpr = logits_ptr.dtype.element_ty.primitive_bitwidth // 8
    BSZ: tl.constexpr = bias_ptr.dtype.element_ty.primitive_bitwidth // 8
    x = _widen(tl.load(row_ptr[:, None, None] + lane3), ASM)  # [R, NC, LT]
    b = tl.load(bias_ptr + lane3).to(tl.float32)
    key = _fast_keys(x, b, SCORING, ACCURATE)
    # The largest |bias| bounds a sqrt-softplus score by its key (_key_err): a max of the bits (|b| >= +0.0 orders as
    # its bits do), one REDUX where a float max takes five shuffles (H100 run 166: DeepSeek-V4 T = 65536 39.46
    # against 40.14 us).
    bias_mag = _row_max(tl.abs(b).to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)
    hi = key.to(tl.int32, bitcast=True)  # raw bits: order keys >= +0.0 as the order bits do
    flag = rows < 0  # [R] False
    if N_GROUP > 1:
        GS: tl.constexpr = GROUP_SIZE
        hig = tl.reshape(hi, [R, N_GROUP, GS])
        if GROUP_MAX:
            t1 = tl.max(hig, axis=2)  # [R, G]
            low = t1
            gscore = t1.to(tl.float32, bitcast=True)
            n_keys: tl.constexpr = 1
        else:
            t1, t2 = tl.reduce((hig, tl.full(hig.shape, INT32_MIN, tl.int32)), 2, _top2_combine)
            low = t2
            gscore = t1.to(tl.float32, bitcast=True) + t2.to(tl.float32, bitcast=True)
            n_keys: tl.constexpr = 2
        flag = flag | (tl.min(low, axis=1) < 0)  # a group key below +0.0: raw bits may misorder it
        g = tl.arange(0, N_GROUP)[None, :] + (rows * 0)[:, None]  # [R, G]
        gword = (gscore.to(tl.int32, bitcast=True) & (-N_GROUP)) | ((N_GROUP - 1) - g)  # distinct in a row
        if GROUP_ROUNDS and 2 * TOPK_GROUP <= N_GROUP:
            # TOPK_GROUP rounds of a max over the row's group words, each round's group into the 4-bit field s of
            # slots: where the counting below compares every pair of groups (DeepSeek-V3: 64 compares and
            # conditional adds a row, ~100 sm_90 instructions a warp of four rows), four maxes of 8 words.
            gw = gword
            slots = tl.zeros(rows.shape, tl.int32)
            for s in tl.static_range(TOPK_GROUP):
                m = tl.max(gw, axis=1)  # [R]: the group ranked s
                if KEPT:
                    slots = slots | (((N_GROUP - 1) - (m & (N_GROUP - 1))) << (4 * s))
                gw = tl.where(gw == m[:, None], INT32_MIN, gw)
            kept = gword >= m[:, None]  # the TOPK_GROUP words at or above the last one taken (distinct words)
        else:
            above = tl.sum((gword[:, None, :] > gword[:, :, None]).to(tl.int32), axis=2)  # groups ranked above each
            kept = above < TOPK_GROUP
            if KEPT:
                slots = tl.sum(tl.where(kept, g << (4 * above), 0), axis=1)  # [R]: 4-bit field s, the group ranked s
        kept_min = tl.min(tl.where(kept, gscore, float("inf")), axis=1)
        dropped_max = tl.max(tl.where(kept, float("-inf"), gscore), axis=1)
        # Each group score is within n_keys keys' errors of its exact value (a key's error grows with its magnitude,
        # bounded at the kept score's): a dropped group this close may be a kept one. The 32-bit words' dropped low
        # bits order scores within 2**log2(G) ulps, far inside that margin.
        err = n_keys * _key_err(tl.abs(kept_min), SCORING, bias_mag)
        flag = flag | (kept_min - dropped_max <= 2.0 * err) | (kept_min != kept_min)
        if LEAN and KEPT:
            # A NaN or +-inf logit made its key NaN here and its group's score NaN, whose word tops every finite
            # one's (the group ranked first): the row is flagged now, and the kept lanes' keys below need not make
            # their infinities NaN again (one FMA a lane fewer). The max is the group rounds' first (the same one).
            flag = flag | (tl.max(gword, axis=1) > INF_BITS)
        if KEPT:
            KW: tl.constexpr = TOPK_GROUP * GS
            tl.static_assert(KW == 128 and GS % 4 == 0 and N_GROUP <= 16 and TOPK_GROUP <= 8)
            # slots' 4-bit field s: the group ranked s. The words' low bits are the compact lane (an arange, so no
            # layout conversion), which orders equal fast keys by the groups' rank: the margins flag every such row.
            # [R, KW // LK, LK]: four lanes of a group a thread, on the row's LT // VEC threads
            VEC: tl.constexpr = 128 // logits_ptr.dtype.element_ty.primitive_bitwidth
            LK: tl.constexpr = (LT // VEC) * 4
            c = (tl.arange(0, KW // LK)[None, :, None] * LK + tl.arange(0, LK)[None, None, :]
                 + (rows * 0)[:, None, None])
            GS_BITS: tl.constexpr = GS.bit_length() - 1
            lane_k = ((slots[:, None, None] >> ((c >> GS_BITS) << 2)) & 15) * GS + (c & (GS - 1))
            lane_k = tl.max_contiguous(tl.multiple_of(lane_k, [1, 1, 4]), [1, 1, 4])  # four lanes of a group a thread
            if SMEM_KEPT and ACCURATE:
                tl.static_assert((R == 4 or R == 8) and NC == 4 and LT == 64 and KW == 128 and GS == 32
                                 and TOPK_GROUP == 4)
                hi = _smem_kept(key.to(tl.int32, bitcast=True), slots, R, NC, LT)
            else:
                pk = row_ptr[:, None, None] + lane_k
                xk = _widen(tl.load(pk), ASM)
                # The bias by the logits' pointers moved by bias_ptr - row_ptr (elements of the logits' dtype, which the
                # bias shares then; a multiple of 4): from bias_ptr + lane_k, Triton rebuilt those pointers in the group
                # views' layout and converted them on 32 threads a row (a barrier and ~80 instructions a row).
                if BIAS_BY_OFFSET:
                    boff = tl.multiple_of(bias_offset - rows64 * logits_row_stride, 4)
                    bk = tl.load(pk + boff[:, None, None]).to(tl.float32)
                else:
                    # A bias of another dtype (an fp32 bias beside 16-bit logits), 8 threads a row (on 32 Triton
                    # converts these pointers through shared memory, +100 instructions a row): from bias_ptr + lane_k
                    # Triton builds them in the first pass's layout and converts them by shuffles (8 SHFL.IDX, 43
                    # instructions a warp of four rows). LEAN, a bias at least as wide as the logits: its addresses
                    # from the logits' (pk), whose lanes Triton already holds in the loads' layout (8 instructions a
                    # warp, no shuffle).
                    if LEAN and BSZ % ESZ == 0:
                        q = ((pk.to(tl.int64) - row_ptr.to(tl.int64)[:, None, None]) * (BSZ // ESZ)
                             + bias_ptr.to(tl.int64)).to(bias_ptr.dtype)
                        bk = tl.load(tl.max_contiguous(tl.multiple_of(q, [1, 1, 16]), [1, 1, 4])).to(tl.float32)
                    else:
                        bk = tl.load(bias_ptr + lane_k).to(tl.float32)
                hi = _fast_keys(xk, bk, SCORING, ACCURATE, LEAN).to(tl.int32, bitcast=True)
            inv = (KW - 1) - c
        else:
            hi = tl.reshape(tl.where(kept[:, :, None], hig, INT32_MIN), [R, NC, LT])
            inv = (W - 1) - lane3
    else:
        inv = (W - 1) - lane3
    best = _row_max(hi)  # [R]
    flag = flag | (best > INF_BITS)  # a NaN key: a NaN or +-inf logit
    DSPAN: tl.constexpr = (1 << (31 - LANE_BITS)) - 1
    base = tl.maximum(best.to(tl.int64) - DSPAN, INT32_MIN).to(tl.int32)
    flag = flag | (base < 0)  # below a negative base, negative keys' raw bits would not clamp to distance 0
    word = _distance_words(hi, base, inv, LANE_BITS, ASM and KEPT)
    top = _row_max(word)
    kc = tl.arange(0, KC)[:, None] + (rows * 0)[None, :]  # [KC, R]: a word a thread
    wk = tl.where(kc == 0, top[None, :], 0)
    # NARROW: the K winners also in a [KE, R] tile for the epilogue where KE < KC (DeepSeek-V3: K = 8, KC = 16), so
    # that a thread gathers, scores and stores one winner, not two slots of which half are dead (sm_90 SASS of the
    # fast path at T = 65536, DeepSeek-V3 fp32 1341 -> 1276 instructions a warp of four rows, bf16 1328 -> 1256).
    KE: tl.constexpr = 1 << (K - 1).bit_length() if NARROW else KC
    if KE < KC:
        ke = tl.arange(0, KE)[:, None] + (rows * 0)[None, :]
        we = tl.where(ke == 0, top[None, :], 0)
    cur = top
    widest = tl.full(top.shape, INT32_MIN, tl.int32)  # the largest step: minus the closest two adjacent words
    C: tl.constexpr = K + 1 + EXTRA  # words found: the K winners, the first loser, EXTRA more (_repair's candidates)
    tl.static_assert(C <= KC)
    # LAZY_EXTRA: the EXTRA words past the first loser (only _repair's candidates) found in _repair's branch, which
    # few programs take, not on the fast path (sm_90 SASS of the fast path, a warp of four rows: DeepSeek-V3 fp32
    # 1181 -> 1160, bf16 1175 -> 1152, DeepSeek-V4 1267 -> 1215; no local memory).
    C_FAST: tl.constexpr = K + 1 if LAZY_EXTRA else C
    for i in tl.static_range(1, C_FAST):
        step = _step_below(word, cur, ASM and KEPT)
        cur = cur + step
        wk = tl.where(kc == i, cur[None, :], wk)
        if KE < KC and i < K:
            we = tl.where(ke == i, cur[None, :], we)
        if i <= K:
            widest = tl.maximum(widest, step)
        if i == K:
            loser = cur
    # Two keys gap order bits apart (both >= +0.0) differ by at least gap ulps of the lower one, and the first
    # loser is the lowest; a key's error is largest at the best key.
    gap = ((-widest) >> LANE_BITS).to(tl.float32)
    n_bits = base + (loser >> LANE_BITS)
    ulp = (n_bits & 0x7F800000).to(tl.float32, bitcast=True) * 1.1920928955078125e-07
    err = _key_err(tl.abs(best.to(tl.float32, bitcast=True)), SCORING, bias_mag)
    flag = flag | (n_bits < 0x00800000)
    close = gap * ulp <= 2.0 * err  # [R]: rows _repair reorders on exact keys
    if not KEPT:
        slots = rows  # _ids_of reads slots only for KEPT
    if KE < KC:
        ids_e = _ids_of(we, slots, LANE_BITS, KEPT, GROUP_SIZE)
    else:
        ke = kc
        ids_e = _ids_of(wk, slots, LANE_BITS, KEPT, GROUP_SIZE)
    if COUNT_FALLBACKS:
        tl.atomic_add(stats_ptr + 2, 1)
    # The epilogue first, then the flags: deciding on a repair or the exact path takes the R rows' flags across the
    # warps (shared memory and barriers). Where a warp would wait there for the other before its epilogue, the launch
    # took ~15% longer (H100: DeepSeek-V3 fp32 T = 65536 39.3 against 33.4 us without the exact path); after the
    # stores a warp has nothing left to do, and the program holds its slot until its last warp ends either way. The
    # barrier also orders the two writes of an output.
    _epilogue(ids_e, ke, row_ptr, rows64, row_ok, weights_ptr, ids_ptr, renorm_eps, rsf, K, SCORING, RENORMALIZE,
              EPS_CLAMP, APPLY_RSF, ACCURATE)
    # One reduction across the warps: 2 or more, a row for the exact path; 1, close rows only (_repair).
    state = tl.max(flag.to(tl.int32) * 2 + close.to(tl.int32), axis=0)
    if FORCE_EXACT:
        state = state + 2
    if not REPAIR:
        state = state * 2
    if state == 1:
        if COUNT_FALLBACKS:
            tl.atomic_add(stats_ptr + 1, 1)
        for i in tl.static_range(C_FAST, C):  # LAZY_EXTRA: the EXTRA words past the first loser
            cur = cur + _step_below(word, cur)
            wk = tl.where(kc == i, cur[None, :], wk)
        bound = _repair_bound(base, cur, bias_mag, LANE_BITS, SCORING, N_GROUP > 1 and not KEPT)
        ids = _ids_of(wk, slots, LANE_BITS, KEPT, GROUP_SIZE)  # [KC, R]: the C candidates
        r_ids, r_ok = _repair(ids, kc, bound, row_ptr, bias_ptr, K, C, SCORING, ACCURATE)
        # The close rows whose bound held stored again, the others redone on the exact path.
        _epilogue(r_ids, kc, row_ptr, rows64, row_ok & close & r_ok, weights_ptr, ids_ptr, renorm_eps, rsf, K,
                  SCORING, RENORMALIZE, EPS_CLAMP, APPLY_RSF, ACCURATE)
        _redo_rows(close & (r_ok.to(tl.int32) == 0) & row_ok, stats_ptr, logits_ptr, weights_ptr, ids_ptr,
                   bias_ptr, logits_row_stride, num_tokens, renorm_eps, rsf, K, N_GROUP, GROUP_SIZE, TOPK_GROUP,
                   GROUP_MAX, SCORING, RENORMALIZE, EPS_CLAMP, APPLY_RSF, R, W, KC, COUNT_FALLBACKS, ACCURATE)
    if state > 1:
        # The flagged rows and the close ones (no _repair in a program with a flagged row).
        redo = row_ok if FORCE_EXACT else (flag | close) & row_ok
        _redo_rows(redo, stats_ptr, logits_ptr, weights_ptr, ids_ptr, bias_ptr, logits_row_stride, num_tokens,
                   renorm_eps, rsf, K, N_GROUP, GROUP_SIZE, TOPK_GROUP, GROUP_MAX, SCORING, RENORMALIZE, EPS_CLAMP,
                   APPLY_RSF, R, W, KC, COUNT_FALLBACKS, ACCURATE)


@triton.jit
def _ids_of(w, slots, LANE_BITS: tl.constexpr, KEPT: tl.constexpr, GROUP_SIZE: tl.constexpr):
    """Words ([N, R]) -> their experts: the inverted lane in the low bits; on the kept groups' lanes (KEPT) the
    compact lane, its group the 4-bit field of slots ([R]) at the group's rank."""
    cw = (1 << LANE_BITS) - 1 - (w & ((1 << LANE_BITS) - 1))
    if KEPT:
        GSB: tl.constexpr = GROUP_SIZE.bit_length() - 1
        cw = cw - ((1 << LANE_BITS) - 128)  # the compact lane
        cw = ((slots[None, :] >> ((cw >> GSB) << 2)) & 15) * GROUP_SIZE + (cw & (GROUP_SIZE - 1))
    return cw


@triton.jit
def _redo_rows(redo, stats_ptr, logits_ptr, weights_ptr, ids_ptr, bias_ptr, logits_row_stride, num_tokens,
               renorm_eps, rsf, K: tl.constexpr, N_GROUP: tl.constexpr, GROUP_SIZE: tl.constexpr,
               TOPK_GROUP: tl.constexpr, GROUP_MAX: tl.constexpr, SCORING: tl.constexpr, RENORMALIZE: tl.constexpr,
               EPS_CLAMP: tl.constexpr, APPLY_RSF: tl.constexpr, R: tl.constexpr, W: tl.constexpr, KC: tl.constexpr,
               COUNT_FALLBACKS: tl.constexpr, ACCURATE: tl.constexpr):
    """The rows of redo ([R] bool) on the exact path (_exact_rows), counted: their bits gathered by one reduction
    across the warps (after the stores before it)."""
    rbits = tl.sum(tl.where(redo, 1 << tl.arange(0, R), 0), axis=0)  # bit r: row pid * R + r
    if rbits != 0:
        if COUNT_FALLBACKS:
            tl.atomic_add(stats_ptr, 1)
        _exact_rows(rbits, logits_ptr, weights_ptr, ids_ptr, bias_ptr, logits_row_stride, num_tokens, renorm_eps,
                    rsf, K, N_GROUP, GROUP_SIZE, TOPK_GROUP, GROUP_MAX, SCORING, RENORMALIZE, EPS_CLAMP, APPLY_RSF, R,
                    W, KC, ACCURATE)


@triton.jit
def _repair_bound(base, cur, bias_mag, LANE_BITS: tl.constexpr, SCORING: tl.constexpr, GROUPED: tl.constexpr):
    """[R]: the bound on the exact keys of the lanes past the C-th word (cur): its fast key (raw bits, >= +0.0) plus
    the keys' error. GROUPED (dropped groups' lanes in the words, at distance 0 as the clamped lanes): that word must
    lie above them, else no bound (+inf)."""
    bound = (base + (cur >> LANE_BITS)).to(tl.float32, bitcast=True)
    bound = bound + _key_err(bound, SCORING, bias_mag)
    if GROUPED:
        bound = tl.where((cur >> LANE_BITS) > 0, bound, float("inf"))
    return bound


@triton.jit
def _before(h_a, id_a, h_b, id_b):
    """1 where candidate a comes before b in the reference's order: the higher key (order bits), then the lower id."""
    return (h_a > h_b) | ((h_a == h_b) & (id_a < id_b))


@triton.jit
def _repair(ids, kc, bound, row_ptr, bias_ptr, K: tl.constexpr, C: tl.constexpr, SCORING: tl.constexpr,
            ACCURATE: tl.constexpr):
    """Rows whose fast-key winners are closer than the keys' error, reordered on exact keys instead of the exact
    path: the lanes of the C best fast words (ids: one a thread of [KC, R]) read back from the logits and the bias,
    scored exactly, ranked by counting (the higher key, then the lower id: the reference's order). Every other lane's
    exact key is at most bound ([R]: the C-th word's fast key plus _key_err): where the K-th exact key among the
    candidates beats it, the candidates' exact top K is the row's. Returns ([KC, R] ids of the K winners, [R] whether
    the bound held). The program's rows have no NaN or infinite logit here (those take the exact path)."""
    cand = kc < C
    x = tl.load(row_ptr[None, :] + ids, mask=cand, other=0.0).to(tl.float32)
    b = tl.load(bias_ptr + ids, mask=cand, other=0.0).to(tl.float32)
    hi = _order_bits(_score(x, 0.0, 0.0, SCORING, ACCURATE) + b)  # the candidates' exact keys
    rank = tl.zeros(kc.shape, tl.int32)
    for j in tl.static_range(C):  # candidate j against each: above it by key, or by id on equal keys
        rank += _before(tl.gather(hi, kc * 0 + j, 0), tl.gather(ids, kc * 0 + j, 0), hi, ids).to(tl.int32)
    rank = tl.where(cand, rank, 32)
    r_ids = tl.zeros(kc.shape, tl.int32)
    for j in tl.static_range(C):  # output column r takes the candidate of rank r
        r_ids = tl.where(tl.gather(rank, kc * 0 + j, 0) == kc, tl.gather(ids, kc * 0 + j, 0), r_ids)
    kth = _key_of32(tl.max(tl.where(rank == K - 1, hi, INT32_MIN), axis=0))  # [R]
    return r_ids, kth > bound


@triton.jit
def _epilogue(ids, kc, row_ptr, rows64, row_ok, weights_ptr, ids_ptr, renorm_eps, rsf, K: tl.constexpr,
              SCORING: tl.constexpr, RENORMALIZE: tl.constexpr, EPS_CLAMP: tl.constexpr, APPLY_RSF: tl.constexpr,
              ACCURATE: tl.constexpr):
    """Steps 6-8 on [KC, R] winners (column K and beyond ignored): the winners' logits gathered again and scored
    exactly, renormalised, scaled; weights and ids stored for the rows < T."""
    live = kc < K
    xw = _gather_logits(row_ptr[None, :], ids, 1, live, 1.0, 1.0, False, False, ACCURATE)
    w = tl.where(live, _score(tl.where(live, xw, 0.0), 0.0, 0.0, SCORING, ACCURATE), 0.0)
    if RENORMALIZE:
        denom = _renorm_denom(tl.sum(w, axis=0), renorm_eps, EPS_CLAMP)  # [R]
        w = tl.where(denom[None, :] > 0, _div_nonneg(w, denom[None, :]), 0.0)
    if APPLY_RSF:
        w = w * rsf
    out = rows64[None, :] * K + kc
    mask = live & row_ok[None, :]
    tl.store(weights_ptr + out, w, mask=mask)
    tl.store(ids_ptr + out, ids, mask=mask)


@triton.jit(noinline=True)
def _exact_rows(rbits, logits_ptr, weights_ptr, ids_ptr, bias_ptr, logits_row_stride, num_tokens, renorm_eps, rsf,
                K: tl.constexpr, N_GROUP: tl.constexpr, GROUP_SIZE: tl.constexpr, TOPK_GROUP: tl.constexpr,
                GROUP_MAX: tl.constexpr, SCORING: tl.constexpr, RENORMALIZE: tl.constexpr, EPS_CLAMP: tl.constexpr,
                APPLY_RSF: tl.constexpr, R: tl.constexpr, W: tl.constexpr, KC: tl.constexpr, ACCURATE: tl.constexpr):
    """The program's rows whose bit is set in rbits (bit r: row pid * R + r) on the exact path, one after another,
    each spread over all the program's threads (W / (32 * warps) lanes a thread; until 2026-12-07 a flagged program
    redid all its R rows at once on the fast path's tiles, 32 lanes a thread, spilled, and a launch waits for its
    slowest program: docs/kernel.md). The reference's selection: exact keys, dead lanes at -inf, groups ranked
    by counting (ties to the lower group), K rounds of one 64-bit max each (order bits, inverted lane: the higher key,
    then the lower id)."""
    lane = tl.arange(0, W)[None, None, :]  # [1, 1, W]: one row as the fast path's [R, NC, LT] tiles
    kc = tl.arange(0, KC)[:, None]  # [KC, 1]: the epilogue's tiles for one row
    for r in range(R):
        if (rbits >> r) & 1:
            rows = tl.program_id(0) * R + r + tl.arange(0, 1)  # [1]
            rows64 = rows.to(tl.int64)
            row_ptr = logits_ptr + rows64 * logits_row_stride
            x = tl.load(row_ptr[:, None, None] + lane).to(tl.float32)  # [1, 1, W]
            b = tl.load(bias_ptr + lane).to(tl.float32)
            hi = _exact_bits(x, b, rows, N_GROUP, GROUP_SIZE, TOPK_GROUP, GROUP_MAX, SCORING, ACCURATE)
            # Dead lanes (-inf) stay above the dropped groups' (INT32_MIN), as the reference's exclude has them; a
            # taken lane goes below both.
            word = (hi.to(tl.int64) << 32) | ((W - 1) - lane).to(tl.int64)
            ids = tl.zeros([KC, 1], tl.int32)
            for i in range(K):
                top = _row_max(word)  # [1]
                ids = tl.where(kc == i, ((W - 1) - (top & (W - 1)).to(tl.int32))[None, :], ids)
                word = tl.where(word == top[:, None, None], tl.full(word.shape, -(1 << 63), tl.int64), word)
            _epilogue(ids, kc, row_ptr, rows64, rows < num_tokens, weights_ptr, ids_ptr, renorm_eps, rsf, K, SCORING,
                      RENORMALIZE, EPS_CLAMP, APPLY_RSF, ACCURATE)


@triton.jit
def _exact_bits(x, b, rows, N_GROUP: tl.constexpr, GROUP_SIZE: tl.constexpr, TOPK_GROUP: tl.constexpr,
                GROUP_MAX: tl.constexpr, SCORING: tl.constexpr, ACCURATE: tl.constexpr):
    """[R, NC, LT] logits and bias ([R] rows for the layout) -> the exact keys' order bits: dead lanes (NaN, -inf) at
    -inf's, the dropped groups' lanes at INT32_MIN (groups ranked by counting, ties to the lower group)."""
    dead = (x != x) | (x == float("-inf"))
    key = tl.where(dead, float("-inf"), _score(tl.where(dead, 0.0, x), 0.0, 0.0, SCORING, ACCURATE) + b)
    hi = _order_bits(key)
    if N_GROUP > 1:
        R: tl.constexpr = x.shape[0]
        hig = tl.reshape(hi, [R, N_GROUP, GROUP_SIZE])
        if GROUP_MAX:
            gscore = _key_of32(tl.max(hig, axis=2))
        else:
            t1, t2 = tl.reduce((hig, tl.full(hig.shape, INT32_MIN, tl.int32)), 2, _top2_combine)
            gscore = _key_of32(t1) + _key_of32(t2)  # the reference's fp32 sum of the top two
        gbits = _order_bits(gscore)
        g = tl.arange(0, N_GROUP)[None, :] + (rows * 0)[:, None]  # [R, G]
        # Groups ranked above each: a higher score, or the same score and a lower group.
        ahead = ((gbits[:, None, :] > gbits[:, :, None])
                 | ((gbits[:, None, :] == gbits[:, :, None]) & (g[:, None, :] < g[:, :, None])))
        hi = tl.reshape(tl.where((tl.sum(ahead.to(tl.int32), axis=2) < TOPK_GROUP)[:, :, None], hig, INT32_MIN),
                        x.shape)
    return hi
