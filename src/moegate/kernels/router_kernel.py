"""The fused router kernel: docs/contract.md steps 1-12 for BLOCK_M rows per program, one launch.

Bytes and floor. A batch of T rows reads the logits once (T * W * itemsize) and writes weights and ids
once (T * (K + C) * 8 bytes); bias, expert scale and the placement tables are a few KB that stay in
L2. DeepSeek-V3 at T=65536 (W=256 fp32, K=8): 67.1 MB + 4.2 MB = 71 MB, 16.6 us at the 4.3 TB/s that a
device-to-device copy reaches on an H200. That is the floor the large-T launches aim at; small-T
launches aim at the launch latency of a kernel that only reads and writes (bench.py times both).

Selection. Each key becomes order-preserving int32 bits ``hi`` (negative floats get their magnitude
bits flipped). Groups are scored on ``hi`` with 32-bit reductions. The top-K rounds run on 32-bit
words (the key squeezed into the high bits, the inverted lane in the low bits, so one ``max`` yields
key and id together and ties go to the lower id); rows the squeeze could misorder rerun on exact int64
words (``hi << 32 | inverted lane``). Experts that must never be chosen (dropped groups with
group_fill="exclude") get ``hi`` = INT32_MIN, below every real key including -inf, so the contract's
order "allowed experts by key, then the rest" falls out of the same max. A winner is replaced by
MARK + its round, so after the rounds every lane knows its output column. Rows of at most 8 experts
without groups (THREAD_ROWS, _thread_rows) skip all of that: one row a thread, its columns a tuple of
[BLOCK_M] vectors, each round's winner a tree of pairs inside the thread, no shuffle. Wider rows without
groups (SPLIT_ROWS, _split_rows; by default renormalized softmax of 65-128 experts from T = 4096) lie on Q
threads each, their columns a tuple of [BLOCK_M, Q] tensors: a tree inside the thread, then log2 Q shuffles.

Weights. For narrow rows at small T (TILE_WEIGHTS) the winning lanes store their own scores, already in
registers: no second, dependent gather. Otherwise the K winners' logits are gathered again (L1/L2
hits) and pushed through the very same arithmetic as the tile, so they equal the tile's scores bit for
bit, on K lanes instead of all of them (measured faster for rows wider than a warp). Renormalized softmax
selected on the logits (LOGIT_KEYS) reads the winners' logits out of their selection words instead.

Launch. On sm_90+ small launches use programmatic dependent launch (as SGLang's router does):
``gdc_wait`` before the first read, so the launch overlaps the previous kernel's tail.

Numerics. Everything is fp32 (docs/contract.md). On the GPU, exp/log1p/tanh/pow come from libdevice and
divisions and square roots are IEEE-rounded (div_rn, sqrt_rn): Triton's default exp is ex2.approx
after a multiply by log2(e), whose rounding alone costs up to ~5e-7 relative at |x| ~ 8, half the 1e-6
budget the tests hold the weights to. The interpreter (TRITON_INTERPRET=1, the CPU lane of the tests)
cannot call libdevice, so ACCURATE=False spells the same functions with numpy-backed primitives.
"""

import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

# Codes of the constexpr switches; the launcher maps the config's strings onto these.
SCORINGS = {"softmax": 0, "sigmoid": 1, "sqrtsoftplus": 2}
REPLICA_POLICIES = {"round_robin": 0, "home_rank": 1, "first": 2}
SHARED_SLOTS = {"none": 0, "global": 1, "per_rank": 2}

# Low word of a packed key: LOW_BASE - id, so ties go to the lower id and the word stays >= 0.
LOW_BASE = tl.constexpr(2147483647)
INT32_MIN = tl.constexpr(-2147483648)
INT64_MIN = tl.constexpr(-9223372036854775808)
# A winner removed in round i becomes MARK + i: below every live word (real keys, excluded lanes), above
# padding lanes (INT32_MIN), so after the rounds each lane knows its own output column (TILE_WEIGHTS).
MARK = tl.constexpr(-2147483647)
MARK64 = tl.constexpr(-9223372036854775807)
# Exact words carry inv + LOW_PAD in the low half so that excluded lanes (high half INT32_MIN) stay above
# the marks; truncated fast words floor the key bits at TRUNC_FLOOR for the same reason.
LOW_PAD = tl.constexpr(128)
TRUNC_FLOOR = tl.constexpr(-2147418112)  # INT32_MIN + 65536, a multiple of every BLOCK_W <= 16384


@triton.jit
def _div(a, b):
    """IEEE-rounded a / b (torch's division); div_rn does not broadcast, so b is spread over a's shape."""
    return tl.div_rn(a, tl.zeros_like(a) + b)


@triton.jit
def _div_nonneg(w, d):
    """w / d for weights w >= 0 over a finite d > 0, bit for bit: a zero w gives +0.0 without a division. A zero
    numerator is outside the IEEE division's fast path, and one lane there sends the warp down the slow path: the
    columns past K, all zero, did so on every row (BENCHMARKS.md run 87)."""
    nonzero = w > 0.0
    return tl.where(nonzero, _div(tl.where(nonzero, w, 1.0), d), 0.0)


@triton.jit
def _renorm_denom(norm, renorm_eps, EPS_CLAMP: tl.constexpr):
    """Step 7's denominator: the norm with renorm_eps added, or clamped below at it (renorm_eps_mode)."""
    if EPS_CLAMP:
        return tl.maximum(norm, renorm_eps)
    return norm + renorm_eps


FP32_TINY = tl.constexpr(1.1754943508222875e-38)  # 2**-126, fp32's smallest normal number


@triton.jit
def _exp(x, ACCURATE: tl.constexpr):
    if ACCURATE:
        y = libdevice.exp(x)
    else:
        y = tl.exp(x)
    return y


@triton.jit
def _exp_score(x, ACCURATE: tl.constexpr):
    """exp(x) where it becomes a score or a weight (softmax's exp(x - max), softplus's exp(x)): results below
    2**-126 are 0 (the contract, step 2), a compare and a select. libdevice's exp returns subnormals (H200 run 120),
    and so does numpy's; row sums and sigmoid's 1 + exp(-x), which a subnormal cannot change, take _exp."""
    y = _exp(x, ACCURATE)
    return tl.where(y < FP32_TINY, 0.0, y)


@triton.jit
def _log1p(u, ACCURATE: tl.constexpr):
    if ACCURATE:
        y = libdevice.log1p(u)
    else:
        # log(1 + u) * u / ((1 + u) - 1) cancels the rounding of 1 + u (Goldberg's log1p).
        v = 1.0 + u
        y = tl.where(v == 1.0, u, tl.log(v) * u / (v - 1.0))
    return y


@triton.jit
def _tanh(y, ACCURATE: tl.constexpr):
    if ACCURATE:
        t = libdevice.tanh(y)
    else:
        # Relative accuracy at both ends (the interpreter has no libdevice): (1 - e) / (1 + e) rounded to 1.0
        # from |y| ~ 8.3, where tanh is 1 - 2**-24 up to |y| ~ 9, and a saturated softcap's keys then tied.
        # |y| >= 0.5: 1 - 2 / (exp(2|y|) + 1) (exp overflows to inf: 1). Below: u / (u + 2) with u = expm1(2|y|)
        # by Kahan's (E - 1) * z / log(E), which cancels the rounding of E = exp(z).
        a = tl.abs(y)
        z = 2.0 * tl.minimum(a, 0.5)
        big = 1.0 - 2.0 / (tl.exp(2.0 * a) + 1.0)
        ez = tl.exp(z)
        u = tl.where(ez == 1.0, z, (ez - 1.0) * z / tl.log(tl.where(ez == 1.0, 2.0, ez)))
        t = tl.where(a >= 0.5, big, u / (u + 2.0))
        t = tl.where(y < 0, -t, t)
        t = tl.where((y != y) | (y == 0.0), y, t)  # NaN, and -0.0 keeps its sign
    return t


@triton.jit
def _pow(x, p, ACCURATE: tl.constexpr):
    if ACCURATE:
        y = libdevice.pow(x, tl.zeros_like(x) + p)
    else:
        # Subnormal x too (a p-norm of weights near 1e-20 sums subnormal powers); the where keeps log2 off 0.
        y = tl.where(x > 0, tl.exp2(p * tl.log2(tl.where(x > 0, x, 1.0))), 0.0)
    return y


@triton.jit
def _prologue(x, logit_scale, softcap, HAS_SCALE: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
              ACCURATE: tl.constexpr):
    """Step 1 on fp32 values: scale (x * 1.0 is x, NaN included: skipped), then the optional tanh softcap."""
    if HAS_SCALE:
        x = x * logit_scale
    if HAS_SOFTCAP:
        x = softcap * _tanh(_div(x, softcap), ACCURATE)
    return x


@triton.jit
def _gather_logits(row_ptr, ids, col_stride, mask, logit_scale, softcap, HAS_SCALE: tl.constexpr,
                   HAS_SOFTCAP: tl.constexpr, ACCURATE: tl.constexpr):
    """The logits of experts ``ids`` of one row through step 1, dead ones (NaN, -inf, masked) at -inf."""
    x = tl.load(row_ptr + ids.to(tl.int64) * col_stride, mask=mask, other=float("-inf"))
    x = _prologue(x.to(tl.float32), logit_scale, softcap, HAS_SCALE, HAS_SOFTCAP, ACCURATE)
    return tl.where((x != x) | (x == float("-inf")), float("-inf"), x)


@triton.jit
def _load_tile(row_base, col2, col_stride, row_ok, ok2, logit_scale, softcap, HAS_SCALE: tl.constexpr,
               HAS_SOFTCAP: tl.constexpr, ACCURATE: tl.constexpr):
    """Step 1 on the tile of rows on warps: (x [BM, BW] fp32, dead), dead lanes (NaN, -inf, padding) at -inf.
    Step 3's NaN rule comes after the softcap (tanh(-inf) is finite, tanh(NaN) is not)."""
    x, dead = _load_tile_raw(row_base, col2, col_stride, row_ok, ok2, logit_scale, softcap, HAS_SCALE, HAS_SOFTCAP,
                             ACCURATE)
    return tl.where(dead, float("-inf"), x), dead


@triton.jit
def _load_tile_raw(row_base, col2, col_stride, row_ok, ok2, logit_scale, softcap, HAS_SCALE: tl.constexpr,
                   HAS_SOFTCAP: tl.constexpr, ACCURATE: tl.constexpr):
    """_load_tile before its mask: (x through step 1 with NaN kept, dead). Keys computed elementwise from it are
    garbage on dead lanes, which _key_bits then sets to -inf: one select a lane fewer than keys of the masked x."""
    x = tl.load(row_base[:, None] + col2.to(tl.int64) * col_stride, mask=row_ok[:, None] & ok2,
                other=float("-inf")).to(tl.float32)
    x = _prologue(x, logit_scale, softcap, HAS_SCALE, HAS_SOFTCAP, ACCURATE)
    return x, (x != x) | (x == float("-inf")) | (ok2 == 0)


@triton.jit
def _prefetch_row_l2(logits_ptr, row, num_tokens, row_stride, LINES: tl.constexpr):
    """Ask the L2 for the first LINES 128-byte lines of logits row ``row`` (nothing if row >= num_tokens), one line a
    thread of one warp; nothing waits on it. PTX prefetch.global.L2 (sm_90 SASS: CCTL.E.PF2)."""
    STEP: tl.constexpr = 1024 // logits_ptr.dtype.element_ty.primitive_bitwidth  # elements in 128 bytes
    line = tl.arange(0, 32)
    ptrs = logits_ptr + row.to(tl.int64) * row_stride + line * STEP
    ok = (line < LINES) & (row < num_tokens)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.b32 $0, 0; }",
        "=r,l,r", [ptrs, ok.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _load_bias(bias_ptr, col2, bias_stride, ok2):
    """The correction bias of the tile's lanes in fp32 (0.0 on padding lanes)."""
    return tl.load(bias_ptr + col2.to(tl.int64) * bias_stride, mask=ok2, other=0.0).to(tl.float32)


@triton.jit
def _score(x, row_max, row_sum, SCORING: tl.constexpr, ACCURATE: tl.constexpr):
    """Step 2 on fp32 logits whose dead entries (NaN, -inf) are already -inf: they all score 0."""
    if SCORING == 0:
        e = _exp_score(x - row_max, ACCURATE)
        s = tl.where(row_sum > 0, _div(e, row_sum), 0.0)
    elif SCORING == 1:
        s = _div(tl.full(x.shape, 1.0, tl.float32), 1.0 + _exp(-x, ACCURATE))
    else:
        softplus = tl.where(x > 20.0, x, _log1p(_exp_score(tl.minimum(x, 20.0), ACCURATE), ACCURATE))
        s = tl.sqrt_rn(softplus)
    return s


@triton.jit
def _order_bits(key):
    """fp32 -> int32 with the same order (no NaN reaches here; -0.0 was made +0.0)."""
    bits = key.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def _key_of32(hi):
    """The fp32 key of order-preserving bits (inverse of _order_bits)."""
    return tl.where(hi >= 0, hi, hi ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)


@triton.jit
def _unshift_key(v, KEY_SHIFT: tl.constexpr):
    """Order-preserving bits of a bf16 / fp16 logit from the same bits shifted right by KEY_SHIFT (the words of one row
    a program on logit keys, and TRUNC_LOGIT_WORDS): their low KEY_SHIFT bits are all 0 for a key >= +0.0 and all 1
    below it."""
    if KEY_SHIFT == 0:
        return v
    return tl.where(v >= 0, v << KEY_SHIFT, (v << KEY_SHIFT) | ((1 << KEY_SHIFT) - 1))


# Approximate sigmoid keys (APPROX_KEYS) differ from the exact ones by at most KEY_ERR_ABS + |key| *
# KEY_ERR_REL. Error budget of 1 / (1 + ex2.approx(-x log2 e)) with div.full: the product x log2 e rounds
# (relative 2**-24, i.e. |x| 6e-8 in the exponent), ex2.approx errs by 2**-22.5 relative, 1 + e rounds,
# and div.full errs by 2 ulp; through s = 1 / (1 + e), |ds| <= s (1 - s) (|x| 6e-8 + 1.8e-7) + s 3e-7
# <= 4e-7, and the exact score itself is within an ulp of the true sigmoid. Adding the bias rounds once
# more (an ulp of the key). The constants carry about a factor 2 over that.
KEY_ERR_ABS = tl.constexpr(1e-6)
KEY_ERR_REL = tl.constexpr(4.8e-7)  # ~2**-21


@triton.jit
def _approx(x, OP: tl.constexpr, ACCURATE: tl.constexpr):
    """One MUFU op, OP.approx.ftz.f32 through inline PTX (OP: "ex2", "lg2", "rcp" or "sqrt"); the
    interpreter has no PTX and takes tl.exp2, tl.log2, 1 / x or tl.sqrt."""
    if ACCURATE:
        y = tl.inline_asm_elementwise(OP + ".approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                      pack=1)
    elif OP == "ex2":
        y = tl.exp2(x)
        y = tl.where(y < FP32_TINY, 0.0, y)  # .ftz
    elif OP == "lg2":
        y = tl.log2(x)
    elif OP == "rcp":
        y = 1.0 / x
    else:
        y = tl.sqrt(x)
    return y


@triton.jit
def _sigmoid_fast(x, ACCURATE: tl.constexpr):
    """Selection keys only (never weights): see KEY_ERR_ABS. On the GPU one FMUL, two MUFU ops and an
    FADD an element (ex2.approx, rcp.approx: within 2**-22 relative and 1 ulp): tl.exp2 and a non-IEEE
    tl.fdiv spent 8 SASS instructions an element on denormal and range fix-ups that these keys never
    need (1 + e >= 1)."""
    return _approx(1.0 + _approx(x * -1.4426950408889634, "ex2", ACCURATE), "rcp", ACCURATE)


# Approximate sqrt-softplus keys differ from the exact ones by at most SSP_KEY_ERR_ABS + s * SSP_KEY_ERR_REL,
# s the score (s <= |key| + max |bias|). Error budget of _sqrtsoftplus_fast, e = ex2.approx(x log2 e):
# e errs by |x| 2**-24 relative (the product's rounding) + 2**-22.5; softplus = ln(1 + e) then errs by
# that times e / (1 + e) (<= 1.2e-6 absolute for x <= 20, <= |x| 6e-8 relative below 0). The lg2 branch
# (e >= 2**-5, softplus >= 0.0308): lg2.approx errs by 2**-22 absolute on [0.5, 2] and 2 ulp beyond,
# 1 + e rounds (2**-24), the product by ln 2 rounds: |d softplus| <= 3.2e-7 + 3e-7 softplus. The series
# branch (e < 2**-5): e - e**2 / 2 + e**3 / 3 drops e**4 / 4 < 7.7e-6 e, and three FMAs round: relative
# 8e-6 + |x| 6e-8, on scores s = sqrt(softplus) < 0.18 whose |x| s < 0.74, so below 7.5e-7 absolute once
# halved by the square root. The square root (sqrt.approx, 2**-22 relative here) halves the relative error
# and divides the absolute one by 2 s (s >= 0.175 on the lg2 branch): |ds| <= 0.92e-6 + 4e-7 s. The
# constants carry about a factor 4 over that.
SSP_KEY_ERR_ABS = tl.constexpr(4e-6)
SSP_KEY_ERR_REL = tl.constexpr(1.6e-6)


@triton.jit
def _sqrtsoftplus_fast(x, ACCURATE: tl.constexpr, PROPAGATE_NAN: tl.constexpr = False):
    """Selection keys only (never weights): sqrt(softplus(x)) within SSP_KEY_ERR_ABS + s * SSP_KEY_ERR_REL
    from three MUFU ops (ex2, lg2, sqrt approx) and a three-term series where ln(1 + e) would cancel, in place
    of libdevice's exp, log1p and the IEEE square root (~85 SASS instructions an element, DeepSeek-V4).
    PROPAGATE_NAN: a NaN x gives a NaN key (the min and the max propagate it; the same instruction count)."""
    NAN: tl.constexpr = tl.PropagateNan.ALL if PROPAGATE_NAN else tl.PropagateNan.NONE
    e = _approx(tl.minimum(x, 20.0, propagate_nan=NAN) * 1.4426950408889634, "ex2", ACCURATE)
    lg = _approx(1.0 + e, "lg2", ACCURATE)
    series = e * (1.0 + e * (-0.5 + e * 0.3333333432674408))
    softplus = tl.where(e < 0.03125, series, lg * 0.6931471805599453)
    # softplus(x) > x: the max is x past 20 (the reference's cut: ln(1 + e) of the clamped x is 20 there) and
    # otherwise the approximation or, where that errs below x, a value closer to the true one.
    return _approx(tl.maximum(softplus, x, propagate_nan=NAN), "sqrt", ACCURATE)


@triton.jit
def _nan_unless_finite(x, ACCURATE: tl.constexpr):
    """x where finite, NaN where x is NaN or +-inf: x * 0 + x, one FMA (0 * inf is NaN). The GPU's NaN results
    are its canonical NaN 0x7FFFFFFF, above every other float's bits as an int32; the interpreter's numpy may make
    a negative NaN, so there it is made the positive one (bits 0x7FC00000, also above +inf's)."""
    if ACCURATE:
        y = tl.fma(x, 0.0, x)
    else:
        y = x * 0.0 + x
        y = tl.where(y == y, y, float("nan"))
    return y


@triton.jit
def _key_err(mag, SCORING: tl.constexpr, bias_mag):
    """The largest error of one approximate key of magnitude mag (bias_mag: the largest |bias| of the row,
    which bounds a sqrt-softplus score by its key). Increasing in mag more slowly than mag itself, so a key k
    plus _key_err(|k|) grows with k: a bound at the largest key bounds every smaller one."""
    if SCORING == 2:
        err = SSP_KEY_ERR_ABS + (mag + bias_mag) * SSP_KEY_ERR_REL
    else:
        err = KEY_ERR_ABS + mag * KEY_ERR_REL
    return err


@triton.jit
def _separated(hi_key, lo_key, SUMMANDS: tl.constexpr, SCORING: tl.constexpr, bias_mag):
    """1 where hi_key beats lo_key whatever the approximate keys' errors (SUMMANDS keys in each); 0 also for
    NaN (-inf - -inf)."""
    mag = tl.maximum(tl.abs(hi_key), tl.abs(lo_key))
    return (hi_key - lo_key > 2.0 * SUMMANDS * _key_err(mag, SCORING, bias_mag)).to(tl.int32)


@triton.jit
def _approx_repair(wk, d, f_col, base, bias_mag, row_ptr, col_stride, row_live, bias_ptr, bias_stride, logit_scale,
                   softcap, K: tl.constexpr, BLOCK_W: tl.constexpr, DIST_SHIFT: tl.constexpr, SCORING: tl.constexpr,
                   HAS_SCALE: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_BIAS: tl.constexpr,
                   ACCURATE: tl.constexpr):
    """A row of one row a program (no groups) whose fast-key winners are closer than the keys' error: reorder
    the K + 2 best fast words (wk, one a thread) on their exact keys, read back from the logits, instead of
    redoing the whole row. Every other lane's fast word is at most the (K + 2)-th, so its exact key is at most
    that word's largest key plus _key_err; where the K-th exact key among the candidates beats that bound, the
    candidates' exact top K is the row's. Returns (lanes of the K winners, whether the bound held)."""
    cand = f_col < K + 2
    lane = tl.where(cand, (BLOCK_W - 1) - (wk & (BLOCK_W - 1)), 0)
    x = _gather_logits(row_ptr, lane, col_stride, cand & row_live, logit_scale, softcap, HAS_SCALE, HAS_SOFTCAP,
                       ACCURATE)
    if HAS_BIAS:
        b = tl.load(bias_ptr + lane.to(tl.int64) * bias_stride, mask=cand, other=0.0).to(tl.float32)
    else:
        b = 0.0
    key, _s, hi = _key_bits(x, x == float("-inf"), cand, 0.0, 1.0, b, SCORING, False, HAS_BIAS, False, ACCURATE)
    # Exact words as _exact_rounds builds them (key bits, then the lower lane); each candidate's rank is the
    # number of candidates above it, and output column r takes the candidate of rank r.
    word = tl.where(cand, (hi.to(tl.int64) << 32) | ((BLOCK_W - 1 - lane) + LOW_PAD).to(tl.int64), INT64_MIN)
    rank = tl.sum((word[None, :] > word[:, None]).to(tl.int32), axis=1)
    pick = (rank[None, :] == f_col[:, None]) & cand[None, :]
    lanes = tl.where(f_col < K, tl.sum(tl.where(pick, lane[None, :], 0), axis=1), 0)
    kth = tl.max(tl.where(cand & (rank == K - 1), key, float("-inf")), axis=0)
    d_last = tl.sum(tl.where(f_col == K + 1, d, 0), axis=0)
    top = _key_of32(base + (d_last << DIST_SHIFT) + ((1 << DIST_SHIFT) - 1))  # NaN where base is not a key
    ok = kth - top > _key_err(tl.abs(top), SCORING, bias_mag)
    return lanes, ok


# FMA_KEYS: exact sigmoid and sqrt-softplus keys without the range checks and branches of div_rn and sqrt_rn.
# A sigmoid key's 1 / (1 + e) takes div_rn's bits from rcp.approx and two FMA steps (_recip_ge1) while 1 + e is below
# 2**126, that is for every logit x >= -87 (e = exp(-x) <= 6.1e37); a sqrt-softplus key's square root takes sqrt_rn's
# bits from rsqrt.approx, two products and an FMA step (_sqrt_fma) for softplus values in [2**-101, FLT_MAX], that is
# for every finite logit x >= -69 (softplus >= 1.08e-30). Rows holding a finite logit below the bound (FMA_X_OFF,
# _fma_band) redo their keys with div_rn / sqrt_rn, and so do sqrt-softplus rows whose best key is NaN (a +inf logit,
# whose square root the FMA form makes NaN). As int32 bits, the finite floats below the bound b (-87.0 = 0xc2ae0000,
# -69.0 = 0xc28a0000) are those whose bits + (2**32 - bits(b) - 1), read as uint32, lie below 0xff800000 - bits(b) -
# 1: b itself wraps to 2**32 - 1, -inf (0xff800000) lands on the span itself, the negative floats above b at 2**31 or
# more and the positive ones (+inf included) in [OFF, OFF + 0x7f800000], above the span (OFF = span + 2**23).
FMA_X_OFF = tl.constexpr(1028784127)  # sigmoid: 2**32 - 0xc2ae0001
FMA_X_SPAN = tl.constexpr(1020395519)  # 0xff800000 - 0xc2ae0001
FMA_X_OFF_SSP = tl.constexpr(1031143423)  # sqrt-softplus: 2**32 - 0xc28a0001
FMA_X_SPAN_SSP = tl.constexpr(1022754815)  # 0xff800000 - 0xc28a0001
INF_BITS = tl.constexpr(2139095040)  # 0x7f800000: order bits above it are NaN


@triton.jit
def _recip_ge1(y, ACCURATE: tl.constexpr):
    """1 / y, IEEE-rounded (tl.div_rn's bits: checked on the GPU for every float y in [1, 2**126)): rcp.approx
    and the two FMA steps of the division's fast path, without its range check (FCHK), branch and call. Past
    2**126 it flushes to 0 (the exact quotient is subnormal) and y = inf gives NaN: callers keep those rows off
    this path. The interpreter divides and flushes alike."""
    if ACCURATE:
        r = _approx(y, "rcp", ACCURATE)
        r = tl.fma(r, tl.fma(-y, r, 1.0), r)
        q = tl.fma(r, tl.fma(-y, r, 1.0), r)
    else:
        q = tl.div_rn(tl.full(y.shape, 1.0, tl.float32), y)
        q = tl.where(y == float("inf"), float("nan"), tl.where(q < FP32_TINY, 0.0, q))
    return q


@triton.jit
def _sqrt_fma(a, ACCURATE: tl.constexpr):
    """sqrt(a), IEEE-rounded (tl.sqrt_rn's bits: checked on the GPU for every float a in [2**-101, FLT_MAX]):
    rsqrt.approx, a * r and r / 2, and one FMA step, sqrt_rn's fast path without its range check and branch.
    Outside that range (0, subnormals, inf) the result may be NaN or wrong: callers keep those rows off this path.
    The interpreter takes sqrt_rn there and NaN outside."""
    if ACCURATE:
        r = tl.inline_asm_elementwise("rsqrt.approx.ftz.f32 $0, $1;", "=f,f", [a], dtype=tl.float32, is_pure=True,
                                      pack=1)
        s = a * r
        q = tl.fma(tl.fma(-s, s, a), r * 0.5, s)
    else:
        q = tl.where((a >= 3.944304526105059e-31) & (a < float("inf")), tl.sqrt_rn(a), float("nan"))
    return q


@triton.jit
def _fma_band(x, SCORING: tl.constexpr, AXIS: tl.constexpr):
    """Along AXIS: 1 where some logit is finite and below the FMA keys' bound (-87 for sigmoid, -69 for
    sqrt-softplus; see FMA_X_OFF). One add and one unsigned min a lane."""
    OFF: tl.constexpr = FMA_X_OFF_SSP if SCORING == 2 else FMA_X_OFF
    SPAN: tl.constexpr = FMA_X_SPAN_SSP if SCORING == 2 else FMA_X_SPAN
    u = (x.to(tl.int32, bitcast=True) + OFF).to(tl.uint32, bitcast=True)
    return tl.min(u, axis=AXIS) < SPAN


@triton.jit
def _key_bits(x, dead, ok2, row_max, row_sum, b, SCORING: tl.constexpr, SELECT_LOGITS: tl.constexpr,
              HAS_BIAS: tl.constexpr, FAST: tl.constexpr, ACCURATE: tl.constexpr, FMA_KEYS: tl.constexpr = False,
              RAW_BITS: tl.constexpr = False, NAN_KEYS: tl.constexpr = False):
    """Step 3: (key, unbiased score, order-preserving key bits with padding lanes at INT32_MIN). FMA_KEYS:
    sigmoid / sqrt-softplus keys by _recip_ge1 / _sqrt_fma, exact on rows that _fma_band does not flag.
    RAW_BITS: the key's own bits, which order the keys >= +0.0 alike (see RAW_BITS in _route_kernel).
    NAN_KEYS (fast or FMA keys): a logit that is NaN or +-inf gives a NaN key, whose bits lie above every float's."""
    if NAN_KEYS:
        tl.static_assert((FAST or FMA_KEYS) and not SELECT_LOGITS)
        x = _nan_unless_finite(x, ACCURATE)
    if SELECT_LOGITS:
        key = x
    elif FAST and SCORING == 2:
        key = _sqrtsoftplus_fast(x, ACCURATE, NAN_KEYS)
    elif FAST:
        key = _sigmoid_fast(x, ACCURATE)
    elif FMA_KEYS and SCORING == 1:
        key = _recip_ge1(1.0 + _exp(-x, ACCURATE), ACCURATE)
    elif FMA_KEYS and SCORING == 2:
        # (NAN_KEYS: libdevice's exp and log1p, rsqrt.approx and the FMA keys' reciprocal all return NaN for NaN.)
        NAN: tl.constexpr = tl.PropagateNan.ALL if NAN_KEYS else tl.PropagateNan.NONE
        key = _sqrt_fma(tl.where(x > 20.0, x, _log1p(_exp(tl.minimum(x, 20.0, propagate_nan=NAN), ACCURATE), ACCURATE)),
                        ACCURATE)
    else:
        key = _score(x, row_max, row_sum, SCORING, ACCURATE)
    s = key
    if HAS_BIAS:
        key = key + b
    key = tl.where(dead, float("-inf"), key)
    if SELECT_LOGITS:
        # -0.0 ties with +0.0, as in torch.sort. Scores are never -0.0 (each scoring yields +0.0 at
        # the bottom) and +0.0 + -0.0 rounds to +0.0, so only logit keys need the fix: + 0.0 (IEEE: -0.0 +
        # +0.0 = +0.0, every other key unchanged; one FADD where a compare and a select took two).
        key = key + 0.0
    if RAW_BITS:
        hi = tl.where(ok2, key.to(tl.int32, bitcast=True), INT32_MIN)
    else:
        hi = tl.where(ok2, _order_bits(key), INT32_MIN)
    return key, s, hi


@triton.jit
def _word_key(bits, RAW_BITS: tl.constexpr):
    """The fp32 key of a fast word's key bits: raw bits (RAW_BITS, on rows whose base is >= 0) or order bits."""
    if RAW_BITS:
        return bits.to(tl.float32, bitcast=True)
    return _key_of32(bits)


@triton.jit
def _row_flags(flags, hi_max, span, fma_band, row_dead, raw_bad, kept_min, dropped_max, bias_mag,
               SCORING: tl.constexpr, N_GROUP: tl.constexpr, FMA_KEYS: tl.constexpr, DEAD_BY_ROW: tl.constexpr,
               RAW_BITS: tl.constexpr, KEEP_IN_WORDS: tl.constexpr, APPROX_KEYS: tl.constexpr,
               NAN_DEAD: tl.constexpr = False):
    """One row a program: `flags` (a scalar) or what makes the row ambiguous whatever its round words: a logit below
    the FMA keys' band, a dead lane (DEAD_BY_ROW; also a +inf logit, whose FMA square root is NaN; NAN_DEAD: found by
    the NaN key such a logit leaves at the top of the best key's bits), a row whose raw key bits may misorder
    (RAW_BITS), groups closer than the fast keys' error."""
    if FMA_KEYS:
        flags = flags | (tl.max(fma_band.to(tl.int32), axis=0) > 0)
    if NAN_DEAD:
        flags = flags | (hi_max > 0x7F800000)  # a NaN key: +inf's bits are 0x7F800000
    elif DEAD_BY_ROW:
        flags = flags | (tl.max(row_dead.to(tl.int32), axis=0) > 0)
    if RAW_BITS:
        flags = flags | (hi_max < span)
        if KEEP_IN_WORDS:
            flags = flags | (tl.max(raw_bad.to(tl.int32), axis=0) > 0)
    if APPROX_KEYS and N_GROUP > 1:
        g_sep = _separated(tl.sum(kept_min, axis=0), tl.sum(dropped_max, axis=0), 2, SCORING, bias_mag)
        flags = flags | (g_sep == 0)
    return flags


@triton.jit
def _column_checks(w, wn, c, base, bias_mag, m_row, K: tl.constexpr, LANE_BITS: tl.constexpr,
                   DIST_SHIFT: tl.constexpr, SCORING: tl.constexpr, APPROX_KEYS: tl.constexpr,
                   LOGIT_KEYS: tl.constexpr, RAW_BITS: tl.constexpr, MARGIN: tl.constexpr = True,
                   LOGIT_DROP: tl.constexpr = 0, KEY_SHIFT: tl.constexpr = 0):
    """Whether output column c (< K) of one row a program makes the row ambiguous, from its round word w and the next
    round's word wn (INT32_MIN past the rounds). Both forms of step 5's checks call it: the vector form on every
    column at once after the rounds (w, wn, c the columns' vectors), SCALAR_CHECKS on the rounds' scalars as they
    come (c a constant). MARGIN: with the fast keys' margin between adjacent winners (_approx_repair takes it apart).
    Winners are allowed lanes in strictly decreasing words; a next word that is not below means the rounds ran out of
    allowed lanes, which the configs route() accepts cannot do before column K - 1 (a guard). KEY_SHIFT: the words
    hold the logit keys' bits shifted right by it (bf16 / fp16 logits, see _unshift_key)."""
    d = w >> LANE_BITS
    dn = wn >> LANE_BITS
    has_next = (wn >= 0) & (wn < w)
    amb = (w < 0) | ((c < K - 1) & (has_next == 0))
    if APPROX_KEYS:
        # Winner c's key bits lie in [base + (d << S), base + (d << S) + 2**S - 1]. The order of the approximate keys
        # is the exact order where each winner clears the next one by the keys' error on both sides; a clamped
        # distance (d = 0) says nothing.
        amb = amb | (d == 0)
        if MARGIN:
            k_lo = _word_key(base + (d << DIST_SHIFT), RAW_BITS)
            k_next = _word_key(base + (dn << DIST_SHIFT) + ((1 << DIST_SHIFT) - 1), RAW_BITS)
            amb = amb | (has_next & (_separated(k_lo, k_next, 1, SCORING, bias_mag) == 0))
    elif LOGIT_KEYS:
        # The winners' logits from their words: exact at DIST_SHIFT 0 (equal words, equal logits), else the winner's
        # lowest and the next word's highest (never equal then); a clamped d says nothing.
        k_lo = _key_of32(_unshift_key(base + (d << DIST_SHIFT), KEY_SHIFT))
        k_next = _key_of32(_unshift_key(base + (dn << DIST_SHIFT) + ((1 << DIST_SHIFT) - 1), KEY_SHIFT))
        amb = amb | (d == 0) | (k_lo < m_row - 75.0) | (has_next & _logit_keys_close(k_lo, k_next, m_row))
        # The K-th winner's logit repeated by the first loser: a run of equal logits may go on past the words seen,
        # to a lower-id logit a little below whose score rounds to theirs (a tie the lower id wins).
        amb = amb | _equal_run((c == K - 1) & has_next & (k_lo == k_next), k_lo, m_row, LOGIT_DROP)
    elif DIST_SHIFT > 0:
        amb = amb | (has_next & (d == dn))  # two adjacent winners with equal distance bits
    else:
        amb = amb | ((c == K - 1) & (d == 0))  # the K-th winner's distance clamped to 0
    return amb


@triton.jit
def _cache_next(f3, c):
    """Each lane group's next word below c ([G, 32, V] words, c [32]; INT32_MIN past the group's last): the rounds'
    unsigned step (see the rounds of one row a program) inside each group, no reduction across threads."""
    step = tl.max(tl.max((f3 - c[None, :, None]).to(tl.uint32, bitcast=True), axis=2), axis=0)
    nxt = c + step.to(tl.int32, bitcast=True)
    return tl.where(nxt < c, nxt, INT32_MIN)  # wrapped (past the padding) or back at the top: none left


def _cache_rounds_asm(depth: int, rounds: int) -> str:
    """PTX for _cache_rounds_smem: the rounds on cached words with each group's cache in shared memory (one row a
    one-warp program, a group a lane). Operands: $0 the word of round idx (INT32_MIN from idx = rounds), $1 the
    group's head after the last round, $2..$9 the group's cached words c0..c7 (decreasing; the first depth are
    read), $10 the group's index idx (0-31). The lane's slots hold c1.. then INT32_MIN to the last pop a row can
    make (rounds - 1), so a popped-out group reads INT32_MIN as the register shift did. A round: the head that
    equals the round's max pops (a predicated load and add), then one REDUX; the round's word goes to a slot of its
    own, which every lane stores alike, so a lane reading back round idx's word reads a store of its own."""
    n = -(-max(depth, rounds - 1) // 4) * 4  # slots a lane
    slot = [f"${3 + j}" for j in range(depth - 1)] + ["z"] * (n - depth + 1)  # c1.., then INT32_MIN (z)
    idx = "$10"
    lines = ["{", ".reg .pred q;", ".reg .b32 a, h, m, w, z;", f".shared .align 16 .b32 mgc[{32 * n}];",
             f".shared .align 16 .b32 mgr[{-(-rounds // 4) * 4}];", "mov.u32 a, mgc;",
             f"mad.lo.u32 a, {idx}, {4 * n}, a;", "mov.b32 z, 0x80000000;"]
    for j in range(0, n, 4):
        lines.append(f"st.shared.v4.b32 [a+{4 * j}], {{{','.join(slot[j:j + 4])}}};")
    lines += ["mov.u32 w, mgr;", "mov.b32 h, $2;", "redux.sync.max.s32 m, h, -1;", "st.shared.b32 [w], m;"]
    for i in range(1, rounds):
        lines += ["setp.eq.s32 q, h, m;", "@q ld.shared.b32 h, [a];", "@q add.u32 a, a, 4;",
                  "redux.sync.max.s32 m, h, -1;", f"st.shared.b32 [w+{4 * i}], m;"]
    lines += [f"setp.lt.u32 q, {idx}, {rounds};", f"mad.lo.u32 w, {idx}, 4, w;", "mov.b32 $0, z;",
              "@q ld.shared.b32 $0, [w];", "mov.b32 $1, h;", "}"]
    return " ".join(lines)


_cache_rounds_ptx = triton.constexpr_function(_cache_rounds_asm)


@triton.jit
def _cache_rounds_smem(c0, c1, c2, c3, c4, c5, c6, c7, DEPTH: tl.constexpr, ROUNDS: tl.constexpr):
    """The rounds on cached words (CACHE_SMEM) in one inline-PTX call a lane: c0..c(DEPTH - 1) [32] the 32 groups'
    cached words, a group a lane (test_sass checks the layout) -> (wk [32]: round i's word at i, INT32_MIN from
    ROUNDS; the groups' heads after the last round). The same words as the register form, whose pop shifts every
    lane's cache by DEPTH - 1 selects a round: here a predicated shared-memory load and add."""
    ASM: tl.constexpr = _cache_rounds_ptx(DEPTH, ROUNDS)
    idx = tl.arange(0, 32) + c0 * 0
    # Not pure: a warp collective writing shared memory, which the compiler must neither duplicate nor move.
    return tl.inline_asm_elementwise(ASM, "=r,=r,r,r,r,r,r,r,r,r,r", [c0, c1, c2, c3, c4, c5, c6, c7, idx],
                                     dtype=(tl.int32, tl.int32), is_pure=False, pack=1)


@triton.jit
def _top2_combine(a1, a2, b1, b2):
    """The two largest of two (largest, second) pairs, a repeated largest counted twice."""
    return tl.maximum(a1, b1), tl.maximum(tl.minimum(a1, b1), tl.maximum(a2, b2))


@triton.jit
def _group_keep(hi, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_GS: tl.constexpr, N_GROUP: tl.constexpr,
                TOPK_GROUP: tl.constexpr, GROUP_MAX: tl.constexpr, GROUP_BY_COUNT: tl.constexpr,
                RAW_BITS: tl.constexpr = False, SLOTS: tl.constexpr = False, NEAR_WORDS: tl.constexpr = False):
    """Step 4's choice of groups from the exact 32-bit key bits (padding lanes at INT32_MIN).

    The group's top key, and for top2_sum its second key, which is the top key again when that appears
    twice (the reference counts a repeated key twice). 32-bit integer reductions: 64-bit (key, lane) words here
    cost ~650 SASS instructions a DeepSeek-V3 row, 43% of it; fp32 min / max on the keys themselves, which
    spare the bits' conversion back, cost 12 more ALU instructions a row than the integer ones (no 3-input
    FMNMX on sm_90, where VIMNMX3 takes three). Returns kept [BM, BG], per row the lowest kept and the highest
    dropped group score (the margin that APPROX_KEYS checks), each group's top key bits [BM, BG], and per row
    whether a group score may be wrong under RAW_BITS (raw key bits, _key_bits): a group whose top or, for
    top2_sum, second key is below +0.0, where raw bits do not order the keys. SLOTS (GROUP_BY_COUNT, BLOCK_G <= 16):
    also, per row, the kept groups by rank in one word, the 4-bit field r holding the group ranked r (0 the best).
    NEAR_WORDS (where the caller checks the kept / dropped margin, kept_min against dropped_max, as the fast keys
    do): the groups are ranked on 32-bit words, the score's order bits with the inverted group in their low
    log2(BLOCK_G) bits, not on 64-bit ones. Two groups ranked out of order there have scores within 2**log2(BLOCK_G)
    ulps; if one is kept and the other dropped, the margin fails (it is far wider), so the kept set is the exact
    one wherever the row stays on the fast path; the order among the kept groups does not matter there.
    """
    hi3 = tl.reshape(hi, [BLOCK_M, BLOCK_G, BLOCK_GS])
    if GROUP_MAX:
        top1 = tl.max(hi3, axis=2)  # [BM, BG]
        low = top1
        group_score = top1.to(tl.float32, bitcast=True) if RAW_BITS else _key_of32(top1)
    else:
        # One reduction over (largest, second) pairs. H200 run 14: DeepSeek-V3 T=65536 60.7 us against 63.8
        # for the top, a compare of every lane against it, and a second max (SASS 703 vs 737 a row).
        top1, second = tl.reduce((hi3, tl.full(hi3.shape, INT32_MIN, tl.int32)), 2, _top2_combine)
        low = second
        if RAW_BITS:
            group_score = top1.to(tl.float32, bitcast=True) + second.to(tl.float32, bitcast=True)
        else:
            group_score = _key_of32(top1) + _key_of32(second)
    g = tl.arange(0, BLOCK_G)
    g_ok = (g < N_GROUP)[None, :]  # [1, BG]
    if RAW_BITS:
        raw_bad = tl.min(tl.where(g_ok, low, 0), axis=1) < 0  # [BM]: a group key below +0.0 (its bits negative)
    else:
        raw_bad = tl.zeros([BLOCK_M], dtype=tl.int1)
    if NEAR_WORDS:
        tl.static_assert(BLOCK_G <= 16)
        group_word = tl.where(g_ok, (_order_bits(group_score) & (-BLOCK_G)) | ((BLOCK_G - 1) - g), INT32_MIN)
    else:
        # 64-bit (score, inverted group) words: equal scores go to the lower group.
        group_word = tl.where(
            g_ok, (_order_bits(group_score).to(tl.int64) << 32) | ((-g) + LOW_BASE).to(tl.int64), INT64_MIN
        )  # [BM, BG]
    if GROUP_BY_COUNT:
        # A group is kept when fewer than TOPK_GROUP groups beat it: no chain of reductions.
        above = tl.sum((group_word[:, None, :] > group_word[:, :, None]).to(tl.int32), axis=2)
        kept = (above < TOPK_GROUP) & g_ok
        if SLOTS:
            # Distinct words: the kept groups' counts are their ranks 0 .. TOPK_GROUP - 1.
            slots = tl.sum(tl.where(kept, g[None, :] << (4 * above), 0), axis=1)  # [BM]
        else:
            slots = tl.zeros([BLOCK_M], dtype=tl.int32)
    else:
        kept = tl.zeros([BLOCK_M, BLOCK_G], dtype=tl.int1)
        for _ in tl.static_range(TOPK_GROUP):
            best_group = tl.max(group_word, axis=1)
            hit = group_word == best_group[:, None]
            kept = kept | hit
            group_word = tl.where(hit, INT64_MIN, group_word)
        kept = kept & g_ok
        tl.static_assert(not SLOTS, "the slot word comes from the counts")
        slots = tl.zeros([BLOCK_M], dtype=tl.int32)
    kept_min = tl.min(tl.where(kept, group_score, float("inf")), axis=1)  # [BM]
    dropped_max = tl.max(tl.where(g_ok & (kept == 0), group_score, float("-inf")), axis=1)
    return kept, kept_min, dropped_max, top1, raw_bad, slots


@triton.jit
def _group_mask(hi, key, dead, ok2, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_GS: tl.constexpr,
                BLOCK_W: tl.constexpr, N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr, GROUP_MAX: tl.constexpr,
                GROUP_ZERO: tl.constexpr, GROUP_BY_COUNT: tl.constexpr):
    """Step 4: _group_keep, then the key bits with the dropped groups' lanes at
    INT32_MIN, or for zero fill at the bits of 0.0. Returns those bits, the lowest kept and the highest
    dropped group score."""
    kept, kept_min, dropped_max, _top1, _bad, _slots = _group_keep(hi, BLOCK_M, BLOCK_G, BLOCK_GS, N_GROUP, TOPK_GROUP,
                                                                   GROUP_MAX, GROUP_BY_COUNT)
    kept_lanes = _kept_lanes(kept, BLOCK_M, BLOCK_G, BLOCK_GS, BLOCK_W)
    if GROUP_ZERO:
        # Dead experts (NaN / -inf logits) keep key -inf: below every other key, zeroed ones too.
        hi = tl.where(ok2, _order_bits(tl.where(kept_lanes | dead, key, 0.0)), INT32_MIN)
    else:
        hi = tl.where(kept_lanes, hi, INT32_MIN)  # below every kept key, -inf included
    return hi, kept_min, dropped_max


@triton.jit
def _kept_lanes(kept, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_GS: tl.constexpr, BLOCK_W: tl.constexpr):
    """[BM, BG] kept groups -> [BM, BW] lanes of kept groups."""
    return tl.reshape(tl.broadcast_to(kept[:, :, None], [BLOCK_M, BLOCK_G, BLOCK_GS]), [BLOCK_M, BLOCK_W])


@triton.jit
def _reload_tile(row_base, col2, col_stride, row_ok, ok2, logit_scale, softcap, bias_ptr, bias_stride,
                 HAS_SCALE: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_BIAS: tl.constexpr, ACCURATE: tl.constexpr):
    """The tile and its bias read again for the exact path (L1 / L2 hits), so that the fast path keeps neither
    live: (x, dead, b)."""
    x, dead = _load_tile(row_base, col2, col_stride, row_ok, ok2, logit_scale, softcap, HAS_SCALE, HAS_SOFTCAP,
                         ACCURATE)
    if HAS_BIAS:
        b = _load_bias(bias_ptr, col2, bias_stride, ok2)
    else:
        b = 0.0
    return x, dead, b


@triton.jit
def _exact_hi(x, dead, ok2, row_max, row_sum, b, SCORING: tl.constexpr, SELECT_LOGITS: tl.constexpr,
              HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_GS: tl.constexpr,
              BLOCK_W: tl.constexpr, N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr, GROUP_MAX: tl.constexpr,
              GROUP_ZERO: tl.constexpr, GROUP_BY_COUNT: tl.constexpr, ACCURATE: tl.constexpr):
    """Steps 3-4 on the exact keys (libdevice, div_rn, sqrt_rn): the group-masked key bits of the exact path."""
    key, _s, hi = _key_bits(x, dead, ok2, row_max, row_sum, b, SCORING, SELECT_LOGITS, HAS_BIAS, False, ACCURATE)
    if N_GROUP > 1:
        hi, _a, _b = _group_mask(hi, key, dead, ok2, BLOCK_M, BLOCK_G, BLOCK_GS, BLOCK_W, N_GROUP, TOPK_GROUP,
                                 GROUP_MAX, GROUP_ZERO, GROUP_BY_COUNT)
    return hi


@triton.jit
def _exact_rounds(hi, ok2, inv, kc, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_KC: tl.constexpr,
                  BLOCK_W: tl.constexpr, EXACT32: tl.constexpr = False):
    """Step 5 on exact 64-bit (key bits, inverted lane) words, one max per round: (lanes [BM, BKC], each
    lane's output column or -1). EXACT32: the same on 32-bit values (_exact_rounds32)."""
    if EXACT32:
        return _exact_rounds32(hi, ok2, inv, kc, K, BLOCK_M, BLOCK_KC, BLOCK_W)
    ids_k = tl.zeros([BLOCK_M, BLOCK_KC], dtype=tl.int32)
    word = (hi.to(tl.int64) << 32) | (inv[None, :] + LOW_PAD).to(tl.int64)
    word = tl.where(ok2, word, INT64_MIN)
    for i in tl.static_range(K):
        best64 = tl.max(word, axis=1)  # [BM]
        pick = (-best64.to(tl.int32)) + (BLOCK_W - 1 + LOW_PAD)  # the low word is the inverted lane
        ids_k = tl.where(kc[None, :] == i, pick[:, None], ids_k)
        word = tl.where(word == best64[:, None], MARK64 + i, word)
    rank_lane = tl.where((word > INT64_MIN) & (word < MARK64 + K), (word - MARK64).to(tl.int32), -1)
    return ids_k, rank_lane


@triton.jit
def _exact_rounds32(hi, ok2, inv, kc, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_KC: tl.constexpr,
                    BLOCK_W: tl.constexpr):
    """_exact_rounds on 32-bit values, two maxes a round: the best key bits among the lanes not yet taken, then the
    lowest of those lanes (the largest inverted lane). The same winners, ranks and ties by lower lane. For one warp on
    a row of 1024 lanes and more (EXACT32): there the 64-bit rounds returned a lane past the tile on the H200 (runs
    7-8, 32 lanes a thread; their cause not found), so that launch was refused."""
    ids_k = tl.zeros([BLOCK_M, BLOCK_KC], dtype=tl.int32)
    rank_lane = tl.full(hi.shape, -1, tl.int32)
    avail = ok2
    for i in tl.static_range(K):
        best = tl.max(tl.where(avail, hi, INT32_MIN), axis=1)  # [BM]
        low = tl.max(tl.where(avail & (hi == best[:, None]), inv[None, :], -1), axis=1)  # [BM] its inverted lane
        ids_k = tl.where(kc[None, :] == i, ((-low) + (BLOCK_W - 1))[:, None], ids_k)
        taken = inv[None, :] == low[:, None]
        rank_lane = tl.where(taken, i, rank_lane)
        avail = avail & (taken == 0)
    return ids_k, rank_lane


@triton.jit
def _logit_keys_close(k_hi, k_lo, m):
    """1 where logits k_hi >= k_lo (and m, the row max) may not keep their order as the reference's softmax
    scores. Scores e / S with e = exp(x - m) (expf within 2 ulp) keep two logits' strict order when
    x_i - x_j > 2**-20 + 2**-24 (|x_i| + |x_j| + 2 |m|): then e_i / e_j > 1 + 2**-21 and two floats lie
    between the quotients; the tolerance below is four and two times those terms. Equal logits are equal
    scores (ties by id, as the rounds order them): not close. The argument needs normal scores: a logit 75
    or more below the row max may score a subnormal or 0 (exp(-75) / W > FLT_MIN for W <= 16384), where the
    reference's scores tie and go by id: close. A k_lo whose score underflows is below a normal k_hi anyway.
    """
    tol = 3.82e-6 + 1.2e-7 * (tl.abs(k_hi) + tl.abs(k_lo) + 2.0 * tl.abs(m))
    return (((k_hi - k_lo > tol) == 0) & (k_hi != k_lo)) | (k_hi < m - 75.0)


@triton.jit
def _equal_run(run, x, m, LOGIT_DROP: tl.constexpr):
    """The equal-run check: ``run`` (the K-th winner's logit x repeated by the first loser, so a run of equal logits
    may go on past the words seen) where a logit below x may still score like x, a tie the lower id wins. Logits
    from bf16 / fp16 inputs with no scale or softcap are fp32 values whose low LOGIT_DROP mantissa bits are 0 (16,
    13; the set holds every bf16 / fp16 value): one below x is at most the next such value down, so the scores keep
    their order unless that value is close to x (_logit_keys_close), which happens only near 0. With fp32 or scaled
    logits (LOGIT_DROP 0) any value may lie just below: every run counts."""
    if LOGIT_DROP > 0:
        bits = x.to(tl.int32, bitcast=True)
        up = ((bits & 0x7FFFFFFF) + (1 << LOGIT_DROP)).to(tl.float32, bitcast=True)  # |x| one step up (for x <= 0)
        down = tl.where(bits > 0, (bits - (1 << LOGIT_DROP)).to(tl.float32, bitcast=True), -up)
        run = run & _logit_keys_close(x, down, m)
    return run


@triton.jit
def _pair_level(hs, ids, vs, N: tl.constexpr):
    """One level of _thread_best's tree: N runs in id order -> ceil(N / 2)."""
    nh = ()
    ni = ()
    nv = ()
    for p in tl.static_range(N // 2):
        gt = hs[2 * p + 1] > hs[2 * p]  # the right run (higher ids) wins only when strictly larger
        nh = nh + (tl.where(gt, hs[2 * p + 1], hs[2 * p]),)
        ni = ni + (tl.where(gt, ids[2 * p + 1], ids[2 * p]),)
        nv = nv + (tl.where(gt, vs[2 * p + 1], vs[2 * p]),)
    if N % 2 == 1:
        nh = nh + (hs[N - 1],)
        ni = ni + (ids[N - 1],)
        nv = nv + (vs[N - 1],)
    return nh, ni, nv


@triton.jit
def _thread_best(his, xs, E: tl.constexpr, BLOCK_M: tl.constexpr):
    """The largest of E <= 32 key-bit vectors, the first (lowest id) of equal ones, with its id and logit: a
    tree of pairs of adjacent id runs, log2(E) compares deep rather than a chain of E - 1."""
    tl.static_assert(E <= 32, "one row a thread takes rows of at most 32 experts")
    ids = ()
    for j in tl.static_range(E):
        ids = ids + (tl.full([BLOCK_M], j, tl.int32),)
    hs, ids, vs = _pair_level(his, ids, xs, E)
    hs, ids, vs = _pair_level(hs, ids, vs, (E + 1) // 2)
    hs, ids, vs = _pair_level(hs, ids, vs, (E + 3) // 4)
    hs, ids, vs = _pair_level(hs, ids, vs, (E + 7) // 8)
    hs, ids, vs = _pair_level(hs, ids, vs, (E + 15) // 16)
    return hs[0], ids[0], vs[0]


@triton.jit
def _thread_rounds(his, xs, kc, E: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_KC: tl.constexpr):
    """Step 5 on one row a thread: K winners of the E key-bit vectors by _thread_best (the first of equal keys:
    the lower id), each then marked below every other key (-inf keys included). Returns the winners' ids and
    logits as [BM, BKC]."""
    ids_k = tl.zeros([BLOCK_M, BLOCK_KC], dtype=tl.int32)
    xk = tl.full([BLOCK_M, BLOCK_KC], float("-inf"), tl.float32)
    for i in tl.static_range(K):
        best, best_id, best_x = _thread_best(his, xs, E, BLOCK_M)
        ids_k = tl.where(kc[None, :] == i, best_id[:, None], ids_k)
        xk = tl.where(kc[None, :] == i, best_x[:, None], xk)
        if i < K - 1:
            marked = ()
            for j in tl.static_range(E):
                marked = marked + (tl.where(best_id == j, INT32_MIN, his[j]),)
            his = marked
    return ids_k, xk


@triton.jit
def _thread_exact(xs, row_max, bias_ptr, bias_stride, kc, E: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_KC: tl.constexpr, SCORING: tl.constexpr, SELECT_LOGITS: tl.constexpr,
                  HAS_BIAS: tl.constexpr, ACCURATE: tl.constexpr):
    """Steps 2-5 of one row a thread on the exact keys: (ids [BM, BKC], their logits, the softmax row sum)."""
    row_sum = tl.full([BLOCK_M], 1.0, tl.float32)
    if SCORING == 0:
        row_sum = _exp(xs[0] - row_max, ACCURATE)
        for j in tl.static_range(1, E):
            row_sum = row_sum + _exp(xs[j] - row_max, ACCURATE)
    his = ()
    for j in tl.static_range(E):
        if HAS_BIAS:
            b = tl.load(bias_ptr + j * bias_stride).to(tl.float32)
        else:
            b = 0.0
        _key, _s, hi = _key_bits(xs[j], xs[j] == float("-inf"), True, row_max, row_sum, b, SCORING, SELECT_LOGITS,
                                 HAS_BIAS, False, ACCURATE)
        his = his + (hi,)
    ids_k, xk = _thread_rounds(his, xs, kc, E, K, BLOCK_M, BLOCK_KC)
    return ids_k, xk, row_sum


@triton.jit
def _signed(bits):
    """fp32 bits <-> int32 with the same order: x >= 0 keeps its bits, x < 0 gets minus its magnitude's bits
    (-0.0 and +0.0 both 0). Its own inverse. Finite values and infinities map into [-0x7F800000, 0x7F800000]."""
    return tl.where(bits >= 0, bits, (-bits) + INT32_MIN)


@triton.jit
def _pick_level(vs, idx, N: tl.constexpr, BIT: tl.constexpr):
    """One level of _pick: N tensors -> ceil(N / 2), the odd one of each pair where idx has BIT set."""
    take_odd = (idx & BIT) != 0
    out = ()
    for p in tl.static_range(N // 2):
        out = out + (tl.where(take_odd, vs[2 * p + 1], vs[2 * p]),)
    if N % 2 == 1:
        out = out + (vs[N - 1],)  # no partner: idx reaches it only with BIT clear
    return out


@triton.jit
def _pick(xs, idx, N: tl.constexpr):
    """xs[idx] of a tuple of N <= 32 same-shape tensors, idx in [0, N): a tree of selects on idx's bits (N - 1
    selects, log2 N deep, where a chain of compares is N - 1 deep)."""
    tl.static_assert(N <= 32, "one row a thread holds at most 32 columns")
    vs = _pick_level(xs, idx, N, 1)
    vs = _pick_level(vs, idx, (N + 1) // 2, 2)
    vs = _pick_level(vs, idx, (N + 3) // 4, 4)
    vs = _pick_level(vs, idx, (N + 7) // 8, 8)
    vs = _pick_level(vs, idx, (N + 15) // 16, 16)
    return vs[0]


@triton.jit
def _thread_logit_rounds(xs, row_base, col_stride, row_ok, kc, logit_scale, softcap, E: tl.constexpr,
                         K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_KC: tl.constexpr, HAS_SCALE: tl.constexpr,
                         HAS_SOFTCAP: tl.constexpr, WINNERS_IN_REGS: tl.constexpr, LOGIT_DROP: tl.constexpr,
                         ACCURATE: tl.constexpr):
    """Step 5 of one row a thread for renormalized softmax, selected on the logits (LOGIT_KEYS), with no score
    for any lane: (ids [BM, BKC], the winners' exp(x - m) [BM, BKC], ambiguous rows [BM]).

    Word of column j: the logit's signed bits rounded up to a bucket of 2 * B ulps (B = 2**LB >= E), shifted
    into the high bits, with B - 1 - j in the low LB bits, so that one integer max yields the best bucket and,
    in it, the lowest id. Every word lies in [-2**30, 2**30), NaN and infinities included, so the next word
    down is best + step with step the unsigned maximum of word - best (the warp path's rounds: one add and one
    max a column, no marking, no id carried through a tree). K + 1 rounds; the K winners' logits
    are picked from the thread's own columns by their ids (WINNERS_IN_REGS: E - 1 selects a winner) or read
    again (L1 hits), the same bits either way. The order is checked, not trusted:
    - winner i against winner i + 1 on exact logits (_logit_keys_close: a pair in the wrong order, a
      near-tie, NaN, a -inf winner are all ambiguous; equal logits are ties by id, which the words keep);
    - the K-th winner against the top of the (K + 1)-th word's bucket, the largest logit any unselected lane
      can hold. Bucket tops are multiples of 2 * B in signed bits, as bf16 and fp16 logits are: their exact
      ties at the boundary are not ambiguous.
    Rows where every check passes have winner 1 at the row max: its exp(x - m) is 1, and m is its logit. NaN
    and -inf lanes need no masking here: one among the winners fails a check, elsewhere it is not chosen.
    """
    LB: tl.constexpr = 1 if E <= 2 else (2 if E <= 4 else (3 if E <= 8 else (4 if E <= 16 else 5)))
    tl.static_assert(E <= 32, "one row a thread takes rows of at most 32 experts")
    B: tl.constexpr = 1 << LB
    words = ()
    for j in tl.static_range(E):
        # Wraps for NaN payloads near 0x7FFFFFFF only: such a word is the lowest, still in the range.
        bucket = (_signed(xs[j].to(tl.int32, bitcast=True)) + (2 * B - 1)) >> (LB + 1)
        words = words + ((bucket << LB) + (B - 1 - j),)
    best = _fold(words, E, 0)
    ROUNDS: tl.constexpr = K + 1 if E > K else K
    ids_k = tl.zeros([BLOCK_M, BLOCK_KC], dtype=tl.int32)
    w_k = tl.zeros([BLOCK_M, BLOCK_KC], dtype=tl.float32)
    amb = tl.zeros([BLOCK_M], dtype=tl.int1)
    m = tl.zeros([BLOCK_M], dtype=tl.float32)
    prev_x = m
    for i in tl.static_range(ROUNDS):
        if i > 0:
            steps = ()
            for j in tl.static_range(E):
                steps = steps + ((words[j] - best).to(tl.uint32, bitcast=True),)
            best = best + _fold(steps, E, 0).to(tl.int32, bitcast=True)
        if i < K:
            best_id = (B - 1) - (best & (B - 1))
            if WINNERS_IN_REGS:
                # The winner's column is in this thread already: no load that waits on the selection.
                x = _pick(xs, best_id, E)
            else:
                # Rows past T read 0.0 (see _thread_rows); the prologue as in the first read, bit for bit.
                x = tl.load(row_base + best_id * col_stride, mask=row_ok, other=0.0).to(tl.float32)
                x = _prologue(x, logit_scale, softcap, HAS_SCALE, HAS_SOFTCAP, ACCURATE)
            ids_k = tl.where(kc[None, :] == i, best_id[:, None], ids_k)
            if i == 0:
                m = x
                amb = (tl.abs(m) < float("inf")) == 0  # NaN, +-inf (rows of nothing but -inf among them)
                w_k = tl.where(kc[None, :] == 0, 1.0, w_k)
            else:
                amb = amb | _logit_keys_close(prev_x, x, m)
                w_k = tl.where(kc[None, :] == i, _exp(x - m, ACCURATE)[:, None], w_k)
            prev_x = x
        else:
            top = _signed((best >> LB) << (LB + 1)).to(tl.float32, bitcast=True)  # the bucket's top
            # Equal to the K-th winner's logit: the first loser may repeat it, and a run of equal logits may go on
            # to a lower-id logit a little below whose score rounds to theirs (see _column_checks).
            run = _equal_run(prev_x == top, prev_x, m, LOGIT_DROP)
            amb = amb | _logit_keys_close(prev_x, top, m) | run
    if ROUNDS == K:  # no (K + 1)-th expert: the last winner's own depth still counts
        amb = amb | (prev_x < m - 75.0)
    return ids_k, w_k, amb & row_ok


@triton.jit
def _thread_rows(row_base, col_stride, row_ok, bias_ptr, bias_stride, logit_scale, softcap, kc,
                 E: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_KC: tl.constexpr,
                 SCORING: tl.constexpr, SELECT_LOGITS: tl.constexpr, HAS_SCALE: tl.constexpr,
                 HAS_SOFTCAP: tl.constexpr, HAS_BIAS: tl.constexpr, LOGIT_KEYS: tl.constexpr,
                 FORCE_EXACT: tl.constexpr, WINNERS_IN_REGS: tl.constexpr, LOGIT_DROP: tl.constexpr,
                 ACCURATE: tl.constexpr):
    """Steps 1-5 for narrow rows (no groups), one row a thread: the E columns are E vectors of [BM], so
    every reduction along a row stays inside its thread (the max and sum a chain, each round's winner a
    tree), with no shuffle.

    Exact 32-bit keys, or with LOGIT_KEYS (renormalized softmax) the logits themselves (_thread_logit_rounds:
    no row max, no row sum, no division for the E - K losers); a program with an ambiguous row reselects on
    the exact scores. Returns the winners (ids [BM, BKC], their logits through step 1, dead ones -inf), the
    softmax row max and sum (0 and 1 for the other scorings), the LOGIT_KEYS weights before step 7 (exp(x - m)
    of the winners) and whether the program took the exact path.
    """
    xs = ()
    for j in tl.static_range(E):
        # Rows past T read 0.0, not -inf: an all--inf row's 0 / 0 scores take the IEEE division's slow path,
        # and the one live row of a T=1 launch waited for its 31 idle neighbours there (H200: 3.1 us).
        x = tl.load(row_base + j * col_stride, mask=row_ok, other=0.0).to(tl.float32)
        xs = xs + (_prologue(x, logit_scale, softcap, HAS_SCALE, HAS_SOFTCAP, ACCURATE),)
    row_max = tl.zeros([BLOCK_M], dtype=tl.float32)
    row_sum = tl.full([BLOCK_M], 1.0, tl.float32)
    xk = tl.full([BLOCK_M, BLOCK_KC], float("-inf"), tl.float32)
    if LOGIT_KEYS:
        ids_k, w_k, amb = _thread_logit_rounds(xs, row_base, col_stride, row_ok, kc, logit_scale, softcap, E, K,
                                               BLOCK_M, BLOCK_KC, HAS_SCALE, HAS_SOFTCAP, WINNERS_IN_REGS, LOGIT_DROP,
                                               ACCURATE)
        if FORCE_EXACT:
            amb = amb | row_ok
        redo = tl.max(amb.to(tl.int32), axis=0)
        if redo > 0:
            xs, row_max = _thread_dead(xs, E, SCORING)
            ids_k, xk, row_sum = _thread_exact(xs, row_max, bias_ptr, bias_stride, kc, E, K, BLOCK_M, BLOCK_KC,
                                               SCORING, SELECT_LOGITS, HAS_BIAS, ACCURATE)
            w_k = _exp_score(xk - row_max[:, None], ACCURATE)
    else:
        redo = tl.max(row_ok.to(tl.int32), axis=0) * 0  # the exact keys are the only path: nothing redone
        xs, row_max = _thread_dead(xs, E, SCORING)
        ids_k, xk, row_sum = _thread_exact(xs, row_max, bias_ptr, bias_stride, kc, E, K, BLOCK_M, BLOCK_KC,
                                           SCORING, SELECT_LOGITS, HAS_BIAS, ACCURATE)
        w_k = xk
    return ids_k, xk, row_max, row_sum, w_k, redo


@triton.jit
def _thread_dead(xs, E: tl.constexpr, SCORING: tl.constexpr):
    """Step 3's NaN rule on the E column vectors (NaN -> -inf) and, for softmax, the row max (0 for a row of
    nothing but -inf)."""
    dxs = ()
    for j in tl.static_range(E):
        dxs = dxs + (tl.where(xs[j] != xs[j], float("-inf"), xs[j]),)
    row_max = tl.zeros_like(dxs[0])
    if SCORING == 0:
        mx = dxs[0]
        for j in tl.static_range(1, E):
            mx = tl.maximum(mx, dxs[j])
        row_max = tl.where(mx > float("-inf"), mx, 0.0)
    return dxs, row_max


@triton.jit
def _fold_level(vs, N: tl.constexpr, OP: tl.constexpr):
    """One level of _fold: N tensors -> ceil(N / 2), neighbours combined (0: max, 1: min, 2: sum)."""
    out = ()
    for p in tl.static_range(N // 2):
        if OP == 0:
            c = tl.maximum(vs[2 * p], vs[2 * p + 1])
        elif OP == 1:
            c = tl.minimum(vs[2 * p], vs[2 * p + 1])
        else:
            c = vs[2 * p] + vs[2 * p + 1]
        out = out + (c,)
    if N % 2 == 1:
        out = out + (vs[N - 1],)
    return out


@triton.jit
def _fold(vs, N: tl.constexpr, OP: tl.constexpr):
    """The elementwise max / min / sum (OP 0 / 1 / 2) of a tuple of N <= 32 same-shape tensors, as a tree:
    inside each thread, since every tensor of the tuple has the same layout."""
    tl.static_assert(N <= 32, "split rows hold at most 32 columns a thread")
    vs = _fold_level(vs, N, OP)
    vs = _fold_level(vs, (N + 1) // 2, OP)
    vs = _fold_level(vs, (N + 3) // 4, OP)
    vs = _fold_level(vs, (N + 7) // 8, OP)
    vs = _fold_level(vs, (N + 15) // 16, OP)
    return vs[0]


@triton.jit
def _split_exact(his, kc, E: tl.constexpr, K: tl.constexpr, Q: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_KC: tl.constexpr, BLOCK_W: tl.constexpr):
    """Step 5 of split rows on exact 64-bit (key bits, inverted id) words: K rounds of one max (a tree inside
    the thread, then across the row's Q threads), each winner then removed. Returns ids [BM, BKC]."""
    N: tl.constexpr = (E + Q - 1) // Q
    q = tl.arange(0, Q)[None, :]
    words = ()
    for j in tl.static_range(N):
        col = j * Q + q
        word = (his[j].to(tl.int64) << 32) | ((-col) + (BLOCK_W - 1 + LOW_PAD)).to(tl.int64)
        words = words + (tl.where(col < E, word, INT64_MIN),)
    ids_k = tl.zeros([BLOCK_M, BLOCK_KC], dtype=tl.int32)
    for i in tl.static_range(K):
        best = tl.max(_fold(words, N, 0), axis=1)  # [BM]
        ids_k = tl.where(kc[None, :] == i, ((-best.to(tl.int32)) + (BLOCK_W - 1 + LOW_PAD))[:, None], ids_k)
        if i < K - 1:
            marked = ()
            for j in tl.static_range(N):
                marked = marked + (tl.where(words[j] == best[:, None], INT64_MIN, words[j]),)
            words = marked
    return ids_k


@triton.jit
def _split_load(row_base, col_stride, row_ok, logit_scale, softcap, E: tl.constexpr, Q: tl.constexpr,
                HAS_SCALE: tl.constexpr, HAS_SOFTCAP: tl.constexpr, ACCURATE: tl.constexpr):
    """Step 1 of split rows: the tuple of N = ceil(E / Q) logit tensors [BM, Q] (column j * Q + q at entry j,
    thread q), dead ones (NaN, -inf, columns past E) -inf. Rows past T read 0.0 (see _thread_rows). Where Q
    divides E there are no padding columns, and no masks or selects for them."""
    N: tl.constexpr = (E + Q - 1) // Q
    q = tl.arange(0, Q)[None, :]  # [1, Q]
    xs = ()
    for j in tl.static_range(N):
        col = j * Q + q
        if E % Q == 0:  # no padding columns
            x = tl.load(row_base[:, None] + col.to(tl.int64) * col_stride, mask=row_ok[:, None], other=0.0)
        else:
            x = tl.load(row_base[:, None] + col.to(tl.int64) * col_stride, mask=row_ok[:, None] & (col < E),
                        other=0.0)
        x = _prologue(x.to(tl.float32), logit_scale, softcap, HAS_SCALE, HAS_SOFTCAP, ACCURATE)
        dead = (x != x) | (x == float("-inf"))
        if E % Q != 0:
            dead = dead | (col >= E)
        xs = xs + (tl.where(dead, float("-inf"), x),)
    return xs


@triton.jit
def _split_keys(xs, row_max, row_sum, bias_ptr, bias_stride, E: tl.constexpr, Q: tl.constexpr,
                SCORING: tl.constexpr, SELECT_LOGITS: tl.constexpr, HAS_BIAS: tl.constexpr, ACCURATE: tl.constexpr):
    """Steps 2-3 of split rows: the keys' order-preserving bits, columns past E at INT32_MIN."""
    N: tl.constexpr = (E + Q - 1) // Q
    q = tl.arange(0, Q)[None, :]
    his = ()
    for j in tl.static_range(N):
        col = j * Q + q
        if HAS_BIAS:
            b = tl.load(bias_ptr + col.to(tl.int64) * bias_stride, mask=col < E, other=0.0).to(tl.float32)
        else:
            b = 0.0
        _key, _s, hi = _key_bits(xs[j], xs[j] == float("-inf"), col < E, row_max[:, None], row_sum[:, None], b,
                                 SCORING, SELECT_LOGITS, HAS_BIAS, False, ACCURATE)
        his = his + (hi,)
    return his


@triton.jit
def _split_row_sum(xs, row_max, N: tl.constexpr, ACCURATE: tl.constexpr):
    """The softmax row sum of split rows: a tree inside each thread, then across the row's threads."""
    es = ()
    for j in tl.static_range(N):
        es = es + (_exp(xs[j] - row_max[:, None], ACCURATE),)
    return tl.sum(_fold(es, N, 2), axis=1)


@triton.jit
def _split_settle_pairs(ids_k, k_lo, k_next, cur, has_next, hard, row_max, row_sum, kc, K: tl.constexpr,
                        ACCURATE: tl.constexpr):
    """The exact order of split rows' K winners where the logits' words left only near-ties (PAIR_EXACT).

    Softmax scores are non-decreasing in the logit (exp and a division by the row sum round monotonically), so
    the exact order is the logits' order with some neighbours' scores rounded equal, and those go by id. The
    K winners' exact scores (as the exact path computes them) are ranked by (score, lower id); the K-th
    against the (K + 1)-th word's score: equal there (a tie that may reach past the words seen) or a hard
    row (clamped, dead, underflowing) is left to the 64-bit rounds. Returns (ids, their logits, the rows
    still to decide [BM])."""
    p = tl.where(cur, _score(k_lo, row_max[:, None], row_sum[:, None], 0, ACCURATE), -1.0)  # [BM, BKC]
    p_next = _score(k_next, row_max[:, None], row_sum[:, None], 0, ACCURATE)
    hard = hard | ((kc[None, :] == K - 1) & has_next & (p == p_next))
    # Column i's rank: the winners j with a higher score, or the same score and a lower id.
    pi = p[:, :, None]
    pj = p[:, None, :]
    beats = (pj > pi) | ((pj == pi) & (ids_k[:, None, :] < ids_k[:, :, None]))
    rank = tl.sum((beats & cur[:, None, :]).to(tl.int32), axis=2)  # [BM, BKC]
    # Output column r takes the winner of rank r (exact sums: one term is not zero).
    hit = (rank[:, None, :] == kc[None, :, None]) & cur[:, None, :]  # [BM, r, i]
    ids_s = tl.sum(tl.where(hit, ids_k[:, None, :], 0), axis=2)
    x_s = tl.sum(tl.where(hit, k_lo[:, None, :], 0.0), axis=2)
    return (tl.where(cur, ids_s, 0), tl.where(cur, x_s, float("-inf")),
            tl.max(hard.to(tl.int32), axis=1) > 0)


@triton.jit
def _split_rows(row_base, col_stride, row_ok, bias_ptr, bias_stride, logit_scale, softcap, kc,
                E: tl.constexpr, K: tl.constexpr, Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_KC: tl.constexpr,
                BLOCK_W: tl.constexpr, LANE_BITS: tl.constexpr, SCORING: tl.constexpr,
                SELECT_LOGITS: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                HAS_BIAS: tl.constexpr, LOGIT_KEYS: tl.constexpr, FORCE_EXACT: tl.constexpr,
                PAIR_EXACT: tl.constexpr, LOGIT_DROP: tl.constexpr, ACCURATE: tl.constexpr):
    """Steps 1-5 for rows without groups on Q threads each (SPLIT_ROWS): column j * Q + q of a row lives in
    its thread q as entry j of a tuple of N = ceil(E / Q) tensors [BM, Q], so each reduction is a tree
    inside the thread (_fold) and then one across the Q threads (log2(Q) shuffles), where one row a warp
    pays five shuffles on every reduction for one row.

    Selection as one row a program: 32-bit words (distance below the row's best key bits << LANE_BITS |
    inverted id), the next round's word by the unsigned step below the last one (no marking), the same
    margin checks on the words, and a program with a row the words cannot decide reloads its rows and
    takes _split_exact (so that only the words stay live through the rounds).
    Returns (ids [BM, BKC], the winners' logits through step 1 with LOGIT_KEYS (else unused), row max, row
    sum), the inputs of step 6.
    """
    N: tl.constexpr = (E + Q - 1) // Q
    q = tl.arange(0, Q)[None, :]  # [1, Q]
    xs = _split_load(row_base, col_stride, row_ok, logit_scale, softcap, E, Q, HAS_SCALE, HAS_SOFTCAP, ACCURATE)
    row_max = tl.zeros([BLOCK_M], dtype=tl.float32)
    row_sum = tl.full([BLOCK_M], 1.0, tl.float32)
    if SCORING == 0:
        m = tl.max(_fold(xs, N, 0), axis=1)
        row_max = tl.where(m > float("-inf"), m, 0.0)
        if not LOGIT_KEYS:
            row_sum = _split_row_sum(xs, row_max, N, ACCURATE)
    his = _split_keys(xs, row_max, row_sum, bias_ptr, bias_stride, E, Q, SCORING, SELECT_LOGITS or LOGIT_KEYS,
                      HAS_BIAS, ACCURATE)
    # Words: the key's distance below the row's best, exact up to 2**31 / BLOCK_W - 1 ulps, clamped to 0
    # beyond (a winner on the clamp is ambiguous); padding columns INT32_MIN.
    span = (2147483648 // BLOCK_W) - 1
    hi_max = tl.max(_fold(his, N, 0), axis=1)  # [BM]
    base = tl.maximum(hi_max.to(tl.int64) - span, INT32_MIN).to(tl.int32)  # [BM]
    words = ()
    for j in tl.static_range(N):
        col = j * Q + q
        word = ((tl.maximum(his[j], base[:, None]) - base[:, None]) << LANE_BITS) | ((-col) + (BLOCK_W - 1))
        if E % Q != 0:  # padding columns
            word = tl.where(his[j] > INT32_MIN, word, INT32_MIN)
        words = words + (word,)
    ROUNDS: tl.constexpr = K + 1 if LOGIT_KEYS else K
    best = tl.max(_fold(words, N, 0), axis=1)  # [BM]
    # Round i's word at column i of wk, round i + 1's at column i of wn: the checks then run on [BM, BKC]
    # tensors, whose columns spread over the threads (on the [BM] vectors, which every thread of a row holds,
    # each thread would check all K winners: SASS 798 against 722 a warp, Qwen3 at 4 rows a warp).
    wk = tl.where(kc[None, :] == 0, best[:, None], INT32_MIN)
    wn = tl.full([BLOCK_M, BLOCK_KC], INT32_MIN, tl.int32)
    for i in tl.static_range(1, ROUNDS):
        # The next word down without marking (as one row a program): word - best, as unsigned, is above 2**31
        # for the words under best and at most 2**31 for best, the words above it and INT32_MIN.
        steps = ()
        for j in tl.static_range(N):
            steps = steps + ((words[j] - best[:, None]).to(tl.uint32, bitcast=True),)
        step = tl.max(_fold(steps, N, 0), axis=1)
        best = best + step.to(tl.int32, bitcast=True)
        wk = tl.where(kc[None, :] == i, best[:, None], wk)
        wn = tl.where(kc[None, :] == i - 1, best[:, None], wn)
    cur = kc[None, :] < K
    d = wk >> LANE_BITS
    dn = wn >> LANE_BITS
    has_next = (wn >= 0) & (wn < wk)
    # A padding column among the winners (fewer than K allowed columns), or the rounds ran out early.
    amb = cur & ((wk < 0) | ((kc[None, :] < K - 1) & (has_next == 0)))
    k_lo = _key_of32(base[:, None] + d)  # the winners' logits (LOGIT_KEYS, d > 0)
    k_next = _key_of32(base[:, None] + dn)  # column i: the logit of round i + 1's word
    hard = amb
    if LOGIT_KEYS:
        close = _logit_keys_close(k_lo, k_next, row_max[:, None])
        # The K-th winner's logit repeated by the first loser: the run may go on past the words seen (see
        # _column_checks), which no pair settles.
        run = _equal_run((kc[None, :] == K - 1) & has_next & (k_lo == k_next), k_lo, row_max[:, None], LOGIT_DROP)
        amb = amb | (cur & ((d == 0) | (k_lo < row_max[:, None] - 75.0) | (has_next & close) | run))
        if PAIR_EXACT:
            # What only the exact keys decide: a clamped distance, an underflowing or dead winner (not a
            # near-tie between neighbours, which _split_settle_pairs settles).
            hard = hard | (cur & ((d == 0) | (k_lo < row_max[:, None] - 75.0) | run))
    else:
        amb = amb | ((kc[None, :] == K - 1) & (d == 0))  # the K-th winner's distance clamped to 0
    amb = tl.max(amb.to(tl.int32), axis=1) > 0
    amb = amb & row_ok
    if FORCE_EXACT:
        amb = amb | row_ok
    ids_k = tl.where(cur, (-(wk & (BLOCK_W - 1))) + (BLOCK_W - 1), 0)
    xk = tl.where(cur, k_lo, float("-inf"))
    redo = tl.max(amb.to(tl.int32), axis=0)
    if redo > 0:
        # Steps 1-5 again on the exact keys, from a second read of the rows (L1 / L2 hits).
        xs2 = _split_load(row_base, col_stride, row_ok, logit_scale, softcap, E, Q, HAS_SCALE, HAS_SOFTCAP,
                          ACCURATE)
        if LOGIT_KEYS:
            row_sum = _split_row_sum(xs2, row_max, N, ACCURATE)
        if PAIR_EXACT:
            ids_k, xk, hard_row = _split_settle_pairs(ids_k, k_lo, k_next, cur, has_next, hard, row_max, row_sum,
                                                      kc, K, ACCURATE)
            exact = tl.max((hard_row & row_ok).to(tl.int32), axis=0) > 0
        else:
            exact = redo > 0
        if exact:
            if PAIR_EXACT:  # a third read: the settling above then keeps no row live (registers)
                xs2 = _split_load(row_base, col_stride, row_ok, logit_scale, softcap, E, Q, HAS_SCALE, HAS_SOFTCAP,
                                  ACCURATE)
            his2 = _split_keys(xs2, row_max, row_sum, bias_ptr, bias_stride, E, Q, SCORING, SELECT_LOGITS,
                               HAS_BIAS, ACCURATE)
            ids_k = _split_exact(his2, kc, E, K, Q, BLOCK_M, BLOCK_KC, BLOCK_W)
            xk = _gather_logits(row_base[:, None], ids_k, col_stride, row_ok[:, None] & cur, logit_scale, softcap,
                                HAS_SCALE, HAS_SOFTCAP, ACCURATE)
    return ids_k, xk, row_max, row_sum, redo


@triton.jit(do_not_specialize=["num_valid", "num_tokens", "home_rank", "hash_vocab"])
def _route_kernel(
    # What every launch reads first, in one 64-byte line of the parameter bank (0x210-0x23f on sm_90): each
    # further line is a constant-cache miss on the row's path (Nsight Compute, H200: the lines of num_tokens,
    # num_valid and rsf cost ~4% of a T=64 launch when they lay apart).
    logits_ptr, weights_ptr, ids_ptr, bias_ptr,
    logits_row_stride, num_tokens, renorm_eps, rsf,
    num_valid, shared_weight, home_rank, logit_scale, softcap, renorm_p, inv_renorm_p,
    logits_col_stride, bias_stride,
    expert_scale_ptr, expert_scale_stride,
    num_valid_ptr,
    token_ids_ptr, token_ids_stride,
    hash_table_ptr, hash_row_stride, hash_col_stride, hash_vocab,
    l2p_ptr, replica_count_ptr,
    packed_ptr,
    rec_ids_ptr, rec_row_stride, rec_count_ptr,
    stats_ptr,  # COUNT_FALLBACKS: int32 [3], programs that redid their rows, repaired a row, ran
    K: tl.constexpr,  # routed columns
    C: tl.constexpr,  # shared columns (0 or S)
    N_GROUP: tl.constexpr,
    GROUP_SIZE: tl.constexpr,  # W // N_GROUP (W itself when N_GROUP == 1)
    TOPK_GROUP: tl.constexpr,
    GROUP_MAX: tl.constexpr,  # group score: max (else top2_sum)
    GROUP_ZERO: tl.constexpr,  # dropped groups' keys -> 0.0 (else excluded)
    GROUP_BY_COUNT: tl.constexpr,  # kept groups by counting the groups above (small G) or by max rounds
    SCORING: tl.constexpr,
    SELECT_LOGITS: tl.constexpr,
    HAS_SCALE: tl.constexpr,  # logit_scale != 1.0
    HAS_SOFTCAP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    RENORM_P_ONE: tl.constexpr,
    EPS_CLAMP: tl.constexpr,
    HAS_EXPERT_SCALE: tl.constexpr,
    APPLY_RSF: tl.constexpr,
    HASH: tl.constexpr,
    HAS_PLACEMENT: tl.constexpr,
    MAX_REPLICAS: tl.constexpr,
    REPLICA_POLICY: tl.constexpr,
    SHARED_MODE: tl.constexpr,
    NUM_SHARED: tl.constexpr,
    SLOTS_PER_RANK: tl.constexpr,  # L
    NUM_PHYSICAL: tl.constexpr,  # P
    VALID_FROM_PTR: tl.constexpr,
    HAS_PADDING: tl.constexpr,  # num_valid < num_tokens (an int); without it and VALID_FROM_PTR every row is live
    HAS_RECORDER: tl.constexpr,
    HAS_PACKED: tl.constexpr,
    BLOCK_M: tl.constexpr,  # rows per program
    BLOCK_W: tl.constexpr,  # BLOCK_G * BLOCK_GS lanes per row
    LANE_BITS: tl.constexpr,  # log2(BLOCK_W)
    TRUNCATE_WORDS: tl.constexpr,  # fast-path words: truncated keys (softmax) or distances below the best
    BLOCK_G: tl.constexpr,  # >= N_GROUP, power of 2
    BLOCK_GS: tl.constexpr,  # >= GROUP_SIZE, power of 2
    BLOCK_KC: tl.constexpr,  # >= K + C, power of 2
    DIST_SHIFT: tl.constexpr,  # distance words drop this many low ulp bits (wide tiles); K + 1 rounds then
    TILE_WEIGHTS: tl.constexpr,  # weights from the tile's scores, stored by the winning lanes
    APPROX_KEYS: tl.constexpr,  # sigmoid / sqrt-softplus keys from fast math, margins checked (one row a program)
    APPROX_REPAIR: tl.constexpr,  # with APPROX_KEYS and no groups: close winners reordered on exact keys
    LOGIT_KEYS: tl.constexpr,  # renormalized softmax selected on the logits, margins checked (one row a program)
    LOGIT_DROP: tl.constexpr,  # LOGIT_KEYS: low mantissa bits the logits' format leaves 0 (bf16 16, fp16 13, else 0)
    THREAD_ROWS: tl.constexpr,  # narrow rows without groups, one a thread (_thread_rows)
    SPLIT_ROWS: tl.constexpr,  # 0, or rows without groups on this many threads each (_split_rows)
    PAIR_EXACT: tl.constexpr,  # split rows with LOGIT_KEYS: close rows settled on exact scores first (off: A/B)
    FORCE_EXACT: tl.constexpr,  # every row takes the exact path (tests)
    COUNT_FALLBACKS: tl.constexpr,  # count the programs that leave the fast path into stats_ptr (diagnostics)
    FMA_KEYS: tl.constexpr,  # sigmoid / sqrt-softplus keys in their FMA forms (flagged rows redo them exactly)
    BIAS_EARLY: tl.constexpr,  # rows on warps with a bias: its load pinned before the scoring (small launches)
    WINNERS_IN_REGS: tl.constexpr,  # one row a thread, logit keys: the winners' logits from registers, not a reload
    SCALAR_CHECKS: tl.constexpr,  # one row a program: the rounds' checks on their scalars as they come (small T)
    KEPT_ONLY: tl.constexpr,  # one row a program, groups kept in the words: the rounds run on the kept groups' lanes
    NAN_DEAD_OK: tl.constexpr,  # fast / FMA keys: dead lanes by their NaN keys, not the row's logit sum (NAN_DEAD)
    ROWS_IN_RANGE: tl.constexpr,  # every program's rows are < T (the launcher: one row a program, T >= 1)
    EXACT32: tl.constexpr,  # the exact path's rounds on 32-bit values (_exact_rounds32: one warp, 1024+ lanes)
    PREFETCH_ROWS: tl.constexpr,  # one row a one-warp program: the row this far ahead asked of the L2 (0: off)
    PREFETCH_LINES: tl.constexpr,  # ... its first this many 128-byte lines (<= 32: the whole row)
    TRUNC_LOGIT_WORDS: tl.constexpr,  # truncated softmax words of bf16 / fp16 logits: the logits' own bits instead
    CACHE_DEPTH: tl.constexpr,  # one row a program: rounds on the top CACHE_DEPTH words of 32 lane groups (0: off)
    CACHE_VEC: tl.constexpr,  # ... a group: lanes r * 32 * CACHE_VEC + g * CACHE_VEC + v (a thread's own lanes)
    SHIFT_WORDS: tl.constexpr,  # one row a program: the rounds' words shifted a column a round, not selected
    CACHE_SMEM: tl.constexpr,  # CACHE_DEPTH, one warp: the cached rounds with the caches in shared memory (GPU only)
    ROWS_16B: tl.constexpr,  # contiguous rows, each 16-byte aligned (the launcher checks): said to the compiler
    USE_PDL: tl.constexpr,  # launched with programmatic dependent launch: wait for the previous grid
    PDL_TRIGGER: tl.constexpr,  # with USE_PDL, let the next grid launch: 0 at the start, 1 after selection, 2 never
    ACCURATE: tl.constexpr,
):
    # FMA keys' flagged rows are redone on the selection's exact path: the tile's weights (from the same scores) and
    # the truncated softmax words have no such path for them.
    tl.static_assert(not (FMA_KEYS and (TILE_WEIGHTS or TRUNCATE_WORDS or THREAD_ROWS or SPLIT_ROWS > 0 or HASH)))
    tl.static_assert(not (APPROX_KEYS and (TILE_WEIGHTS or TRUNCATE_WORDS or SELECT_LOGITS or LOGIT_KEYS or HASH)))
    tl.static_assert(not (BIAS_EARLY and (not HAS_BIAS or HASH or THREAD_ROWS or SPLIT_ROWS > 0)))
    tl.static_assert(not (SCALAR_CHECKS and (BLOCK_M != 1 or TRUNCATE_WORDS or APPROX_REPAIR or THREAD_ROWS
                                             or SPLIT_ROWS > 0 or HASH)))
    if USE_PDL:
        # Nothing is read before the previous kernel's writes are visible. The next kernel may start its launch
        # now (PDL_TRIGGER 0) or after the selection (1); it waits for this one to finish in its own gdc_wait.
        gdc_wait()
        if PDL_TRIGGER == 0:
            gdc_launch_dependents()
    if COUNT_FALLBACKS:
        tl.atomic_add(stats_ptr + 2, 1)
    # LOGIT_KEYS with unshifted distance words: the winners' logits come out of their words.
    WORD_LOGITS: tl.constexpr = LOGIT_KEYS and (DIST_SHIFT == 0) and (BLOCK_M == 1)
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    if ROWS_IN_RANGE:
        # Every row of the launch is < T (one row a program, T >= 1): no mask, so the loads need no predicate and
        # their registers no -inf defaults (SASS: 20 instructions a DeepSeek-V3 row at T = 65536).
        row_ok = tl.full([BLOCK_M], 1, tl.int1)
    else:
        row_ok = rows < num_tokens
    rows64 = rows.to(tl.int64)  # row offsets in int64: T * W passes 2**31 at T=8M, W=256
    if VALID_FROM_PTR:
        n_valid = tl.load(num_valid_ptr).to(tl.int64)  # read on the device: no host sync under graphs
        live = row_ok & (rows64 < n_valid)  # [BM] step 11
    elif HAS_PADDING:
        live = row_ok & (rows64 < num_valid.to(tl.int64))
    else:
        live = row_ok
    row_base = logits_ptr + rows64 * logits_row_stride  # [BM]
    if ROWS_16B:
        # Triton proves it only where the row stride is a multiple of 16 elements: rows a view of a wider buffer (260
        # elements apart, say) would otherwise take narrower loads, in a layout CACHE_SMEM's PTX does not assume.
        row_base = tl.multiple_of(row_base, 16)

    kc = tl.arange(0, BLOCK_KC)  # [BKC] output columns
    routed = kc < K
    gmask = row_ok[:, None] & routed[None, :]  # [BM, BKC]

    row_max = tl.zeros([BLOCK_M], dtype=tl.float32)
    row_sum = tl.full([BLOCK_M], 1.0, tl.float32)
    if ((not HASH) or (SCORING == 0)) and not THREAD_ROWS and SPLIT_ROWS == 0:
        # The tile is [rows, lanes]; lane = group * BLOCK_GS + position in the group, so a tl.reshape to
        # [rows, groups, BLOCK_GS] lines the groups up. Lane order is expert order (ties by lane are ties
        # by id). Reductions along the lanes stay mostly inside a thread: a 3-D tile put the 32 threads
        # of a warp across each group and cost ~800 shuffles a row (SASS count, DeepSeek-V3 shape).
        lane = tl.arange(0, BLOCK_W)
        if (GROUP_SIZE == BLOCK_GS) or (N_GROUP == 1):
            col = lane  # contiguous: the loads vectorise
            col_ok = lane < N_GROUP * GROUP_SIZE
        else:
            col = (lane // BLOCK_GS) * GROUP_SIZE + lane % BLOCK_GS
            col_ok = ((lane // BLOCK_GS) < N_GROUP) & ((lane % BLOCK_GS) < GROUP_SIZE)
        col2 = col[None, :]
        ok2 = col_ok[None, :]  # [1, BW]
        x_raw, dead = _load_tile_raw(row_base, col2, logits_col_stride, row_ok, ok2, logit_scale, softcap, HAS_SCALE,
                                     HAS_SOFTCAP, ACCURATE)  # [BM, BW]
        if PREFETCH_ROWS > 0 and ACCURATE:
            # A later program's row asked of the L2 now, so that its own read waits an L2 round trip, not HBM's
            # (never under the interpreter, which has no inline PTX: ACCURATE is off there).
            tl.static_assert(BLOCK_M == 1 and PREFETCH_LINES <= 32)
            _prefetch_row_l2(logits_ptr, pid + PREFETCH_ROWS, num_tokens, logits_row_stride, PREFETCH_LINES)
        if BIAS_EARLY:
            # ptxas issues the bias load of sqrt-softplus rows after the scoring (to spare its registers), so a
            # small launch waits a second L2 round trip there. A select on a condition it cannot fold
            # (num_tokens >= 0 always) makes the scoring depend on the loaded bias: both loads go out together.
            b_early = _load_bias(bias_ptr, col2, bias_stride, ok2)
            x_raw = tl.where(num_tokens < 0, b_early, x_raw)
        x = tl.where(dead, float("-inf"), x_raw)
        if SCORING == 0:
            row_max = tl.max(x, axis=1)  # [BM]
            row_max = tl.where(row_max > float("-inf"), row_max, 0.0)
            if not LOGIT_KEYS:
                row_sum = tl.sum(_exp(x - row_max[:, None], ACCURATE), axis=1)  # [BM]

    if HASH:
        token = tl.load(token_ids_ptr + rows64 * token_ids_stride, mask=live, other=0).to(tl.int64)
        # A token id outside the table (checked on the host only for CPU tensors: on a GPU that check would
        # synchronise) makes its row padding, as in the reference: never an out-of-bounds read.
        token_ok = (token >= 0) & (token < hash_vocab)
        live = live & token_ok
        token = tl.where(token_ok, token, 0)
        ids_k = tl.load(
            hash_table_ptr + token[:, None] * hash_row_stride + kc[None, :].to(tl.int64) * hash_col_stride,
            mask=gmask,
            other=0,
        ).to(tl.int32)  # [BM, BKC]
    elif THREAD_ROWS:
        ids_k, thread_x, row_max, row_sum, thread_w, redo = _thread_rows(
            row_base, logits_col_stride, row_ok, bias_ptr, bias_stride, logit_scale, softcap, kc, N_GROUP * GROUP_SIZE,
            K, BLOCK_M, BLOCK_KC, SCORING, SELECT_LOGITS, HAS_SCALE, HAS_SOFTCAP, HAS_BIAS, LOGIT_KEYS, FORCE_EXACT,
            WINNERS_IN_REGS, LOGIT_DROP, ACCURATE)
        if COUNT_FALLBACKS:
            tl.atomic_add(stats_ptr, (redo > 0).to(tl.int32))
    elif SPLIT_ROWS > 0:
        ids_k, thread_x, row_max, row_sum, redo = _split_rows(
            row_base, logits_col_stride, row_ok, bias_ptr, bias_stride, logit_scale, softcap, kc, N_GROUP * GROUP_SIZE,
            K, SPLIT_ROWS, BLOCK_M, BLOCK_KC, BLOCK_W, LANE_BITS, SCORING, SELECT_LOGITS, HAS_SCALE, HAS_SOFTCAP,
            HAS_BIAS, LOGIT_KEYS, FORCE_EXACT, PAIR_EXACT, LOGIT_DROP, ACCURATE)
        if COUNT_FALLBACKS:
            tl.atomic_add(stats_ptr, (redo > 0).to(tl.int32))
    else:
        bias_mag = 0.0
        if BIAS_EARLY:
            b = b_early
        elif HAS_BIAS:
            b = _load_bias(bias_ptr, col2, bias_stride, ok2)
        else:
            b = 0.0
        if HAS_BIAS:
            if APPROX_KEYS and (SCORING == 2):
                # The largest |bias| bounds a score by its key: a max of the magnitudes' bits, one REDUX across the
                # warp where a float max took five shuffles and maxes (SASS: 26 -> 14 instructions, DeepSeek-V4). A NaN
                # bias makes it NaN, and every margin check then fails: the exact path takes those rows.
                b_bits = b.to(tl.int32, bitcast=True) & 0x7FFFFFFF
                bias_mag = tl.max(tl.max(b_bits, axis=1), axis=0).to(tl.float32, bitcast=True)
        if TILE_WEIGHTS and HAS_EXPERT_SCALE:
            scale_lane = tl.load(expert_scale_ptr + col2.to(tl.int64) * expert_scale_stride, mask=ok2,
                                 other=1.0).to(tl.float32)
        # Keys, then step 4 on their order-preserving bits. APPROX_KEYS: sigmoid keys from ex2.approx and an
        # approximate division (within KEY_ERR of the exact ones), sqrt-softplus keys from ex2, lg2 and sqrt
        # approx (within SSP_KEY_ERR); the selection checks its margins and rows it cannot decide redo
        # steps 2-5 with the exact scores below.
        # LOGIT_KEYS: softmax is monotone in the logit, so the logits order the scores; ties stay ties (equal
        # logits, equal scores) and near-ties, where rounding could make two scores equal, are checked below.
        # The keys and the FMA band from the unmasked logits: dead lanes' keys are set to -inf from `dead`, and the
        # band skips NaN and -inf (its unsigned window holds the finite logits below its bound only). The tile's
        # weights take the scores (s_lane), which must be 0 on dead lanes: those keep the masked logits.
        x_key = x if TILE_WEIGHTS else x_raw
        # One row a program on fast or FMA keys (whose exact path reads the row again): a row with a dead lane is
        # sent to that path whole, found by the sum of its logits (NaN or +-inf once one is NaN or +-inf: FMA-pipe
        # adds and one compare, where marking the dead lanes took a compare and a select a lane). The fast path's
        # keys then skip `dead`; padding lanes (ok2, folded at compile time) keep their -inf key.
        # (FMA and fast keys are sigmoid / sqrt-softplus keys of scores, never with the tile's weights.)
        DEAD_BY_ROW: tl.constexpr = (BLOCK_M == 1) and (FMA_KEYS or APPROX_KEYS)
        # ... and with their exact path's keys of its own, the fast path's words take the keys' raw bits, which order
        # the keys >= +0.0 as the order-preserving ones do (a compare and a select a lane fewer). Every negative key's
        # bits are negative, so below a base >= 0 both clamp them to the same distance 0; rows whose base would be
        # negative (best key below 2**23 ulps: a row of keys <= ~1e-38) or whose group scores may take a negative key
        # in the wrong order (_group_keep's raw_bad) are sent to the exact path.
        KEEP_IN_WORDS: tl.constexpr = (BLOCK_M == 1) and (not TRUNCATE_WORDS) and (N_GROUP > 1) and (not GROUP_ZERO)
        RAW_BITS: tl.constexpr = DEAD_BY_ROW and (not APPROX_REPAIR) and ((N_GROUP == 1) or KEEP_IN_WORDS)
        # ... and on those keys a dead lane needs no row sum: a logit that is NaN or +-inf gives a NaN key (one FMA a
        # lane, _nan_unless_finite), whose bits top every key's, so the row's best key bits (or a kept group's top:
        # a NaN group score ranks first) say it (SASS: 20 -> 9 instructions a row; the sum's shuffles gone).
        NAN_DEAD: tl.constexpr = RAW_BITS and (APPROX_KEYS or FMA_KEYS) and NAN_DEAD_OK
        dead_keys = dead
        # The row flags' defaults where their paths are off (_row_flags reads only those that are on).
        row_dead = tl.zeros([BLOCK_M], dtype=tl.int1)
        fma_band = row_dead
        raw_bad = row_dead
        kept_min = tl.zeros([BLOCK_M], dtype=tl.float32)
        dropped_max = kept_min
        if DEAD_BY_ROW:
            dead_keys = ok2 == 0
            if not NAN_DEAD:
                x_sum = tl.sum(tl.where(ok2, x_raw, 0.0), axis=1)  # [BM]
                row_dead = (x_sum - x_sum) != 0.0  # NaN, not 0, where the sum is not finite
        key, s_lane, hi = _key_bits(x_key, dead_keys, ok2, row_max[:, None], row_sum[:, None], b, SCORING,
                                    SELECT_LOGITS or LOGIT_KEYS, HAS_BIAS, APPROX_KEYS, ACCURATE, FMA_KEYS, RAW_BITS,
                                    NAN_DEAD)
        if FMA_KEYS:
            fma_band = _fma_band(x_raw, SCORING, 1)  # [BM]: those rows redo their keys with div_rn / sqrt_rn
        inv = (-lane) + (BLOCK_W - 1)  # [BW] larger for lower lanes: ties go to the lower id
        # One row a program, groups dropped by exclusion: the dropped lanes leave the fast words through the
        # words' own select (the kept lanes), and the row's best kept key is the best of the kept groups' tops,
        # where masking the bits first cost a select a lane and a reduction (SASS: 16 ALU instructions a
        # DeepSeek-V3 row). `hi` keeps the dropped lanes' bits then; the exact paths build their own.
        allowed = ok2  # [1, BW] lanes that may win on the fast path
        inv_w = inv[None, :]  # the fast words' inverted lanes
        if KEEP_IN_WORDS:
            tl.static_assert(not KEPT_ONLY or (DEAD_BY_ROW and GROUP_BY_COUNT and GROUP_SIZE == BLOCK_GS
                                               and BLOCK_G <= 16 and TOPK_GROUP <= 8))
            kept, kept_min, dropped_max, top1, raw_bad, slots = _group_keep(
                hi, BLOCK_M, BLOCK_G, BLOCK_GS, N_GROUP, TOPK_GROUP, GROUP_MAX, GROUP_BY_COUNT, RAW_BITS, KEPT_ONLY,
                APPROX_KEYS and GROUP_BY_COUNT and BLOCK_G <= 16)
            if KEPT_ONLY:
                # The rounds on the kept groups' lanes only (TOPK_GROUP of N_GROUP: half the lanes for DeepSeek-V3),
                # packed by the groups' rank: their logits and bias read again (L1 hits) and their keys computed
                # again, the same instructions on the same inputs, so the same bits. Each round then takes half the
                # adds and maxes a thread, and the dropped lanes need no select. The words keep the expert's own
                # lane, so ties and ids are as before; the exact path reads the whole row again itself.
                BLOCK_C: tl.constexpr = BLOCK_GS * (1 if TOPK_GROUP == 1 else 2 if TOPK_GROUP == 2 else
                                                    4 if TOPK_GROUP <= 4 else 8)
                c = tl.arange(0, BLOCK_C)
                slot = c // BLOCK_GS
                lane_c = ((tl.sum(slots, axis=0) >> (4 * slot)) & 15) * BLOCK_GS + c % BLOCK_GS  # [BC]
                if BLOCK_C == TOPK_GROUP * BLOCK_GS:
                    ok_c = tl.full([1, BLOCK_C], 1, tl.int1)  # [1, BC] (folded: no mask)
                else:
                    ok_c = (slot < TOPK_GROUP)[None, :]
                x_c, _dead_c = _load_tile_raw(row_base, lane_c[None, :], logits_col_stride, row_ok, ok_c,
                                              logit_scale, softcap, HAS_SCALE, HAS_SOFTCAP, ACCURATE)
                b_c = _load_bias(bias_ptr, lane_c[None, :], bias_stride, ok_c) if HAS_BIAS else 0.0
                _key_c, _s_c, hi = _key_bits(x_c, ok_c == 0, ok_c, row_max[:, None], row_sum[:, None], b_c, SCORING,
                                             False, HAS_BIAS, APPROX_KEYS, ACCURATE, FMA_KEYS, RAW_BITS, NAN_DEAD)
                allowed = ok_c
                inv_w = ((BLOCK_W - 1) - lane_c)[None, :]
                hi_max = tl.max(tl.max(hi, axis=1), axis=0)
            else:
                allowed = ok2 & _kept_lanes(kept, BLOCK_M, BLOCK_G, BLOCK_GS, BLOCK_W)
                hi_max = tl.max(tl.max(tl.where(kept, top1, INT32_MIN), axis=1), axis=0)
        elif N_GROUP > 1:
            hi, kept_min, dropped_max = _group_mask(
                hi, key, dead_keys, ok2, BLOCK_M, BLOCK_G, BLOCK_GS, BLOCK_W, N_GROUP, TOPK_GROUP, GROUP_MAX,
                GROUP_ZERO, GROUP_BY_COUNT)
            allowed = ok2 & (hi > INT32_MIN)

        # Step 5, fast path: 32-bit words, one 32-bit max per round (the exact 64-bit word costs ~2x the
        # instructions per round: SASS count). The low log2(BLOCK_W) bits hold the inverted lane (ties to
        # the lower id); the high bits hold the key, squeezed one of two ways. Rows where the squeeze
        # could misorder take the exact 64-bit path below.
        if BLOCK_M == 1 and not TRUNCATE_WORDS:
            # One row a program: each round's best is a scalar, the words of the K (+ 1) rounds land in a
            # flat vector (one a thread), and the checks run on that vector once, after the rounds.
            span = ((2147483648 // BLOCK_W) << DIST_SHIFT) - 1
            # Logit keys of bf16 / fp16 logits (no scale or softcap: LOGIT_DROP > 0) leave their low LOGIT_DROP bits
            # all 0 (keys >= +0.0, -0.0 made +0.0) or all 1 (below): shifted out, the words keep every such key
            # exactly and their distances span the whole format (no clamp, where 256-512 lanes of N(0, 1) logits had
            # the K-th winner past the span in ~40% of rows: the exact path). Padding lanes stay lowest.
            KEY_SHIFT: tl.constexpr = LOGIT_DROP if (LOGIT_KEYS and DIST_SHIFT == 0) else 0
            if KEY_SHIFT > 0:
                hi = hi >> KEY_SHIFT
            if not KEEP_IN_WORDS:
                hi_max = tl.max(tl.max(hi, axis=1), axis=0)
            base = tl.maximum(hi_max.to(tl.int64) - span, INT32_MIN).to(tl.int32)
            # Allowed lanes hold (distance, inverted lane) words in [0, 2**31); excluded and padding lanes
            # INT32_MIN (a row that needs them, with fewer than K allowed lanes, takes the exact path).
            if DIST_SHIFT > 0:
                dist = (tl.maximum(hi, base) - base) >> DIST_SHIFT
                word = (dist << LANE_BITS) | inv_w
            else:
                # (max(hi, base) - base) * 2**LANE_BITS + inv as max(hi, base) * 2**LANE_BITS + (inv - base *
                # 2**LANE_BITS): the same bits (int32 arithmetic wraps), a max and an IMAD a lane with the lane's
                # constant once a row, where the subtraction, the shift and the OR took three (SASS: 3-8 instructions
                # a row, DeepSeek-V4 / Kimi-K2).
                word = tl.maximum(hi, base) * (1 << LANE_BITS) + (inv_w - base * (1 << LANE_BITS))
            fast = tl.where(allowed, word, INT32_MIN)  # [1, BW] (KEPT_ONLY: [1, BC])
            f_col = tl.arange(0, BLOCK_KC)
            m_row = tl.sum(row_max, axis=0)
            best = tl.max(tl.max(fast, axis=1), axis=0)
            if SCALAR_CHECKS:
                # The row's flags go into its first word (a negative first word is ambiguous): they are then
                # reduced while the words are built, not after the rounds.
                row_flags = _row_flags(hi_max != hi_max, hi_max, span, fma_band, row_dead, raw_bad, kept_min,
                                       dropped_max, bias_mag, SCORING, N_GROUP, FMA_KEYS, DEAD_BY_ROW, RAW_BITS,
                                       KEEP_IN_WORDS, APPROX_KEYS, NAN_DEAD)
                best = tl.where(row_flags, INT32_MIN, best)
            wk = tl.where(f_col == 0, best, INT32_MIN)  # round i's word at i
            ROUNDS: tl.constexpr = K + 2 if APPROX_REPAIR else (K + 1 if (DIST_SHIFT > 0 or APPROX_KEYS or LOGIT_KEYS)
                                                                 else K)
            amb_s = hi_max != hi_max  # False; column 0 is checked with round 1 (or after the loop)
            prev = best
            if CACHE_DEPTH > 0:
                # Wide rows: the lanes fall into 32 groups (a thread's own lanes where the layout gives each thread
                # CACHE_VEC adjacent lanes a block of 32 * CACHE_VEC), and each group's top CACHE_DEPTH words are
                # found first by the rounds' unsigned step inside the group (no reduction across threads). A round
                # is then one max over the 32 groups' heads, the winning group's head popped: CACHE_DEPTH selects a
                # group, where the plain round took one add-max a lane. A group whose cache ran empty while it may
                # hold more (its last cached word real) before a later round makes the row ambiguous: the exact
                # path routes it (P(Poisson(K / 32) >= CACHE_DEPTH) a group on random rows: ~0.02-0.3% of rows at the
                # launcher's depths).
                tl.static_assert((CACHE_DEPTH >= 2) and (CACHE_DEPTH <= 8) and (BLOCK_W % (32 * CACHE_VEC) == 0)
                                 and not KEPT_ONLY)
                f3 = tl.reshape(fast, [BLOCK_W // (32 * CACHE_VEC), 32, CACHE_VEC])
                c0 = tl.max(tl.max(f3, axis=2), axis=0)  # [32]
                none = tl.zeros_like(c0) + INT32_MIN
                c1 = _cache_next(f3, c0)
                c2 = _cache_next(f3, c1) if CACHE_DEPTH > 2 else none
                c3 = _cache_next(f3, c2) if CACHE_DEPTH > 3 else none
                c4 = _cache_next(f3, c3) if CACHE_DEPTH > 4 else none
                c5 = _cache_next(f3, c4) if CACHE_DEPTH > 5 else none
                c6 = _cache_next(f3, c5) if CACHE_DEPTH > 6 else none
                c7 = _cache_next(f3, c6) if CACHE_DEPTH > 7 else none
                c_last = (c1, c2, c3, c4, c5, c6, c7)[CACHE_DEPTH - 2]  # the deepest cached word
                full = c_last > INT32_MIN  # the group may hold more than its cache
            # Each group's cache in shared memory (_cache_rounds_smem; PTX, so the interpreter keeps the registers'
            # form): a pop is a predicated load, where the register shift took CACHE_DEPTH - 1 selects a round on every
            # lane. Round i's word at column i.
            SMEM_ROUNDS: tl.constexpr = CACHE_SMEM and ACCURATE
            if SMEM_ROUNDS:
                tl.static_assert((CACHE_DEPTH > 0) and (BLOCK_KC == 32) and not SCALAR_CHECKS)
                wk, c0 = _cache_rounds_smem(c0, c1, c2, c3, c4, c5, c6, c7, CACHE_DEPTH, ROUNDS)
            for i in tl.static_range(1, 1 if SMEM_ROUNDS else ROUNDS):
                # The next word down without marking the winners: word - best, as unsigned, is above 2**31
                # for the allowed words under best (larger for larger words), and at most 2**31 for best
                # itself, the words above it and INT32_MIN lanes. One add and one max a lane, where marking
                # took a compare, a select and a max. (The complement of best - 1 - word's unsigned min, which
                # took a further add a round: SASS.) Out of allowed words, the next is INT32_MIN where the row
                # has such lanes, else the top word again: both fail the checks below.
                if CACHE_DEPTH > 0:
                    win = c0 == best  # the group of round i - 1's word (words are distinct: one group)
                    c0 = tl.where(win, c1, c0)
                    c1 = tl.where(win, c2, c1)
                    c2 = tl.where(win, c3, c2)
                    c3 = tl.where(win, c4, c3)
                    c4 = tl.where(win, c5, c4)
                    c5 = tl.where(win, c6, c5)
                    c6 = tl.where(win, c7, c6)
                    c7 = tl.where(win, INT32_MIN, c7)
                    best = tl.max(c0, axis=0)
                else:
                    step = tl.max(tl.max((fast - best).to(tl.uint32, bitcast=True), axis=1), axis=0)
                    best = best + step.to(tl.int32, bitcast=True)
                if SHIFT_WORDS:
                    # Every word one column on (a shuffle) and the new one at column 0: a select on a predicate
                    # held across the rounds, where the column's own compare took an ALU instruction a round.
                    wk = tl.where(f_col == 0, best, tl.gather(wk, tl.maximum(f_col - 1, 0), 0))
                else:
                    wk = tl.where(f_col == i, best, wk)
                if SCALAR_CHECKS:
                    # Column i - 1 against its next word, as soon as that is known (the rounds' scalars).
                    amb_s = amb_s | _column_checks(prev, best, i - 1, base, bias_mag, m_row, K, LANE_BITS,
                                                   DIST_SHIFT, SCORING, APPROX_KEYS, LOGIT_KEYS, RAW_BITS,
                                                   LOGIT_DROP=LOGIT_DROP, KEY_SHIFT=KEY_SHIFT)
                    prev = best
            if SCALAR_CHECKS and ROUNDS == K:
                amb_s = amb_s | _column_checks(prev, INT32_MIN, K - 1, base, bias_mag, m_row, K, LANE_BITS, DIST_SHIFT,
                                               SCORING, APPROX_KEYS, LOGIT_KEYS, RAW_BITS, LOGIT_DROP=LOGIT_DROP,
                                               KEY_SHIFT=KEY_SHIFT)
            # Round i + 1's word at i: wk one column on (a shuffle; the launcher gives one row a program a column
            # for each round), INT32_MIN past the rounds.
            tl.static_assert(ROUNDS <= BLOCK_KC, "one row a program keeps every round's word in wk")
            if SHIFT_WORDS and not SMEM_ROUNDS:  # round ROUNDS - 1 - j's word at j: reversed (one shuffle)
                wk = tl.where(f_col < ROUNDS, tl.gather(wk, tl.maximum(ROUNDS - 1 - f_col, 0), 0), INT32_MIN)
            wn = tl.gather(wk, tl.minimum(f_col + 1, BLOCK_KC - 1), 0)
            wn = tl.where(f_col + 1 < ROUNDS, wn, INT32_MIN)
            cur = f_col < K
            amb = cur & _column_checks(wk, wn, f_col, base, bias_mag, m_row, K, LANE_BITS, DIST_SHIFT, SCORING,
                                       APPROX_KEYS, LOGIT_KEYS, RAW_BITS, not APPROX_REPAIR, LOGIT_DROP, KEY_SHIFT)
            close_any = f_col < 0  # close winners for _approx_repair (none without it)
            if APPROX_REPAIR:
                tl.static_assert((N_GROUP == 1) and (BLOCK_KC >= K + 2), "the repair takes K + 2 words, no groups")
                # Close winners (under the keys' margin) are reordered on exact keys (_approx_repair), which needs
                # K + 2 words in strictly decreasing order; otherwise, as without the repair, the whole row is redone.
                d = wk >> LANE_BITS
                has_next = (wn >= 0) & (wn < wk)
                k_lo = _word_key(base + (d << DIST_SHIFT), RAW_BITS)
                k_next = _word_key(base + ((wn >> LANE_BITS) << DIST_SHIFT) + ((1 << DIST_SHIFT) - 1), RAW_BITS)
                close = cur & has_next & (_separated(k_lo, k_next, 1, SCORING, bias_mag) == 0)
                k2 = f_col < K + 2
                c_bad = k2 & ((wk < 0) | ((f_col < K + 1) & ((wn < 0) | (wn >= wk))))
                close_any = close
                amb = amb | (close & (tl.max(c_bad.to(tl.int32), axis=0) > 0))
            if SCALAR_CHECKS:
                ambiguous = amb_s
            else:  # (the row's flags after the rounds here: reduced before them, they took a register more)
                ambiguous = _row_flags(tl.max(amb.to(tl.int32), axis=0) > 0, hi_max, span, fma_band, row_dead,
                                       raw_bad, kept_min, dropped_max, bias_mag, SCORING, N_GROUP, FMA_KEYS,
                                       DEAD_BY_ROW, RAW_BITS, KEEP_IN_WORDS, APPROX_KEYS, NAN_DEAD)
            if CACHE_DEPTH > 0:
                # A full group popped CACHE_DEPTH times has an empty head from then on (and no group's head comes
                # back): its state after the last pop says whether any round ran without its next word.
                ambiguous = ambiguous | (tl.max((full & (c0 == INT32_MIN)).to(tl.int32), axis=0) > 0)
            e_ids = tl.where(cur, (BLOCK_W - 1) - (wk & (BLOCK_W - 1)), 0)  # lanes
            if APPROX_REPAIR:
                repair = (tl.max(close_any.to(tl.int32), axis=0) > 0) & (ambiguous == 0)
                if COUNT_FALLBACKS:
                    tl.atomic_add(stats_ptr + 1, repair.to(tl.int32))
                if repair:
                    r_ids, r_ok = _approx_repair(
                        wk, d, f_col, base, bias_mag, logits_ptr + tl.sum(rows64, axis=0) * logits_row_stride,
                        logits_col_stride, tl.sum(row_ok.to(tl.int32), axis=0) > 0, bias_ptr, bias_stride,
                        logit_scale, softcap, K, BLOCK_W, DIST_SHIFT, SCORING, HAS_SCALE, HAS_SOFTCAP, HAS_BIAS,
                        ACCURATE)
                    e_ids = tl.where(r_ok, r_ids, e_ids)
                    ambiguous = ambiguous | (r_ok == 0)
            if FORCE_EXACT:
                ambiguous = ambiguous | (hi_max == hi_max)
            if COUNT_FALLBACKS:
                tl.atomic_add(stats_ptr, ambiguous.to(tl.int32))
            if WORD_LOGITS:
                # A winner's word holds its logit's bits exactly (distance below the best, no shift) unless
                # the distance was clamped, and then the row is ambiguous: no second, dependent read.
                e_x = tl.where(cur, _key_of32(_unshift_key(base + (wk >> LANE_BITS), KEY_SHIFT)), float("-inf"))
            if ambiguous:
                hi_x = hi
                if KEEP_IN_WORDS:  # the exact keys of the fast path (no fast or FMA keys): drop the groups here
                    hi_x = tl.where(allowed, hi, INT32_MIN)
                if LOGIT_KEYS:  # the exact scores
                    row_sum = tl.sum(_exp(x - row_max[:, None], ACCURATE), axis=1)
                    key_x, _s, hi_x = _key_bits(x, dead, ok2, row_max[:, None], row_sum[:, None], b, SCORING,
                                                False, HAS_BIAS, False, ACCURATE)
                if FMA_KEYS or APPROX_KEYS:
                    # Read the row again (L1 / L2 hits): the fast path then keeps no logits live (registers).
                    x, dead, b = _reload_tile(row_base, col2, logits_col_stride, row_ok, ok2, logit_scale, softcap,
                                              bias_ptr, bias_stride, HAS_SCALE, HAS_SOFTCAP, HAS_BIAS, ACCURATE)
                if APPROX_KEYS or FMA_KEYS:
                    hi_x = _exact_hi(x, dead, ok2, row_max[:, None], row_sum[:, None], b, SCORING, SELECT_LOGITS,
                                     HAS_BIAS, BLOCK_M, BLOCK_G, BLOCK_GS, BLOCK_W, N_GROUP, TOPK_GROUP, GROUP_MAX,
                                     GROUP_ZERO, GROUP_BY_COUNT, ACCURATE)
                ids_x, _r = _exact_rounds(hi_x, ok2, inv, kc, K, BLOCK_M, BLOCK_KC, BLOCK_W, EXACT32)
                e_ids = tl.reshape(ids_x, [BLOCK_KC])
                if DEAD_BY_ROW:
                    # Into the fast path's layout (f_col's): otherwise the branch's result takes the reshape's
                    # layout and the compiler keeps a second copy of the fast path's round words in it (SASS:
                    # 19-37 ALU instructions a row). Not elsewhere: 512 lanes top-22 on div_rn keys took 80
                    # registers with it against 70.
                    e_ids = tl.gather(e_ids, f_col, 0)
                if WORD_LOGITS:  # the exact path's winners: read their logits (N_GROUP == 1: lane = id)
                    e_x = _gather_logits(logits_ptr + tl.sum(rows64, axis=0) * logits_row_stride, e_ids,
                                         logits_col_stride, cur & (tl.sum(row_ok.to(tl.int32), axis=0) > 0),
                                         logit_scale, softcap, HAS_SCALE, HAS_SOFTCAP, ACCURATE)
            if (GROUP_SIZE != BLOCK_GS) and (N_GROUP > 1):
                e_ids = (e_ids // BLOCK_GS) * GROUP_SIZE + e_ids % BLOCK_GS  # lane -> expert id
        else:
            ids_k = tl.zeros([BLOCK_M, BLOCK_KC], dtype=tl.int32)
            if TRUNCATE_WORDS:
                # Softmax probabilities span many binades but sit far apart relative to their size: drop the
                # key's low bits. Run K + 1 rounds; two adjacent winners with equal high bits are ambiguous.
                # TRUNC_LOGIT_WORDS (bf16 / fp16 logits, no scale or softcap: LOGIT_DROP > 0): the words hold the
                # logits' own order bits shifted right by LOGIT_DROP instead (exact: equal words, equal logits, whose
                # scores tie and go by id as the lanes order them), and adjacent winners are checked as the logit
                # keys' are (_logit_keys_close: scores that may round equal; _equal_run at the K-th), where the
                # truncated scores flagged every exact tie (9-22% of bf16 programs, CPU survey of 2026-12-05).
                if TRUNC_LOGIT_WORDS:
                    tl.static_assert(LOGIT_DROP > 0 and not LOGIT_KEYS and not GROUP_ZERO)
                    hi_l = _order_bits(x + 0.0) >> LOGIT_DROP  # dead lanes' -inf lowest; -0.0 as +0.0
                    fast = tl.where(hi > INT32_MIN, (hi_l << LANE_BITS) | inv[None, :], TRUNC_FLOOR | inv[None, :])
                    fast = tl.where(ok2, fast, INT32_MIN)
                else:
                    fast = tl.where(ok2, (tl.maximum(hi, TRUNC_FLOOR) & (-BLOCK_W)) | inv[None, :], INT32_MIN)
                ambiguous = tl.zeros([BLOCK_M], dtype=tl.int1)
                prev = tl.zeros([BLOCK_M], dtype=tl.int32)
                for i in tl.static_range(K + 1):
                    best = tl.max(fast, axis=1)  # [BM]
                    if i > 0 and TRUNC_LOGIT_WORDS:
                        k_prev = _key_of32(_unshift_key(prev >> LANE_BITS, LOGIT_DROP))
                        k_best = _key_of32(_unshift_key(best >> LANE_BITS, LOGIT_DROP))
                        ambiguous = ambiguous | _logit_keys_close(k_prev, k_best, row_max)
                        if i == K:
                            ambiguous = ambiguous | _equal_run(k_prev == k_best, k_prev, row_max, LOGIT_DROP)
                    elif i > 0:
                        ambiguous = ambiguous | ((best & (-BLOCK_W)) == (prev & (-BLOCK_W)))
                    if i < K:
                        ids_k = tl.where(kc[None, :] == i, ((-(best & (BLOCK_W - 1))) + (BLOCK_W - 1))[:, None],
                                         ids_k)
                        fast = tl.where(fast == best[:, None], MARK + i, fast)
                    prev = best
            else:
                # Sigmoid-like keys (+ bias) crowd near the top: keep every bit of the distance below the
                # row's best key (difference of order-preserving bits, in ulps), exact up to
                # 2**31 / BLOCK_W - 1 ulps (a binade for 256 lanes), clamped to 0 beyond. A K-th winner on
                # the clamp is ambiguous. Wide tiles (DIST_SHIFT > 0) drop the distance's low DIST_SHIFT
                # bits so that the word still spans 2**23 ulps (sigmoid + bias keys of 512-1024 experts
                # span more than 2**21 ulps: with the full distance most such rows fell back); then two
                # adjacent winners among K + 1 rounds with equal distance bits (near-ties, the clamp, -inf)
                # mark the row ambiguous.
                span = ((2147483648 // BLOCK_W) << DIST_SHIFT) - 1
                hi_max = tl.max(hi, axis=1)  # [BM]
                base = tl.maximum(hi_max.to(tl.int64) - span, INT32_MIN).to(tl.int32)  # [BM]
                dist = tl.maximum(hi, base[:, None]) - base[:, None]
                if DIST_SHIFT > 0:
                    dist = dist >> DIST_SHIFT
                dist_word = (dist << LANE_BITS) | inv[None, :]
                # Excluded lanes sit below every allowed one (negative, still by lane); padding lanes lowest.
                fast = tl.where(hi > INT32_MIN, dist_word, inv[None, :] - BLOCK_W)
                fast = tl.where(ok2, fast, INT32_MIN)  # [BM, BW]
                if DIST_SHIFT > 0:
                    ambiguous = tl.zeros([BLOCK_M], dtype=tl.int1)
                    prev = tl.zeros([BLOCK_M], dtype=tl.int32)
                    for i in tl.static_range(K + 1):
                        best = tl.max(fast, axis=1)  # [BM]
                        if i > 0:
                            ambiguous = ambiguous | ((best >> LANE_BITS) == (prev >> LANE_BITS))
                        if i < K:
                            ids_k = tl.where(kc[None, :] == i,
                                             ((-(best & (BLOCK_W - 1))) + (BLOCK_W - 1))[:, None], ids_k)
                            fast = tl.where(fast == best[:, None], MARK + i, fast)
                        prev = best
                else:
                    for i in tl.static_range(K):
                        best = tl.max(fast, axis=1)  # [BM]
                        ids_k = tl.where(kc[None, :] == i, ((-(best & (BLOCK_W - 1))) + (BLOCK_W - 1))[:, None],
                                         ids_k)
                        fast = tl.where(fast == best[:, None], MARK + i, fast)
                    ambiguous = best < BLOCK_W  # the K-th winner's distance clamped to 0
            if FORCE_EXACT:
                ambiguous = ambiguous | row_ok
            if FMA_KEYS:
                ambiguous = ambiguous | fma_band
                if SCORING == 2:
                    ambiguous = ambiguous | (hi_max > INF_BITS)
            rank_lane = tl.where((fast > INT32_MIN) & (fast < MARK + K), fast - MARK, -1)  # column or -1
            redo = tl.max(ambiguous.to(tl.int32), axis=0)
            if COUNT_FALLBACKS:
                tl.atomic_add(stats_ptr, (redo > 0).to(tl.int32))
            if redo > 0:
                # Exact path (wide key range, -inf among the winners): one 64-bit max per round.
                hi_x = hi
                if FMA_KEYS:
                    x, dead, b = _reload_tile(row_base, col2, logits_col_stride, row_ok, ok2, logit_scale, softcap,
                                              bias_ptr, bias_stride, HAS_SCALE, HAS_SOFTCAP, HAS_BIAS, ACCURATE)
                    hi_x = _exact_hi(x, dead, ok2, row_max[:, None], row_sum[:, None], b, SCORING, SELECT_LOGITS,
                                     HAS_BIAS, BLOCK_M, BLOCK_G, BLOCK_GS, BLOCK_W, N_GROUP, TOPK_GROUP, GROUP_MAX,
                                     GROUP_ZERO, GROUP_BY_COUNT, ACCURATE)
                ids_k, rank_lane = _exact_rounds(hi_x, ok2, inv, kc, K, BLOCK_M, BLOCK_KC, BLOCK_W, EXACT32)
            if (GROUP_SIZE != BLOCK_GS) and (N_GROUP > 1):
                ids_k = (ids_k // BLOCK_GS) * GROUP_SIZE + ids_k % BLOCK_GS  # lane -> expert id

    # The epilogue works on K + C columns a row. With one row a program they are a flat [BKC] vector, one
    # column a thread, and the row's values (validity, softmax max and sum, renorm sum) are scalars. On
    # [BM, BKC] tensors the compiler keeps the layout of the row tile, which puts all BKC columns of a row
    # in every thread of its warp: K-fold the work (SASS count: DeepSeek-V3 ~1030 -> ~770 a row).
    if BLOCK_M == 1:
        RAXIS: tl.constexpr = 0
        e_col = tl.arange(0, BLOCK_KC)  # [BKC]
        if HASH or TRUNCATE_WORDS:
            e_ids = tl.reshape(ids_k, [BLOCK_KC])
        e_row = tl.sum(rows64, axis=0)  # scalars from here on
        e_row32 = tl.sum(rows, axis=0)
        e_row_ok = tl.sum(row_ok.to(tl.int32), axis=0) > 0
        e_live = tl.sum(live.to(tl.int32), axis=0) > 0
        e_max = tl.sum(row_max, axis=0)
        e_sum = tl.sum(row_sum, axis=0)
    else:
        RAXIS: tl.constexpr = 1
        e_col = kc[None, :]  # [1, BKC]
        e_ids = ids_k  # [BM, BKC]
        e_row = rows64[:, None]  # [BM, 1]
        e_row32 = rows[:, None]
        e_row_ok = row_ok[:, None]
        e_live = live[:, None]
        e_max = row_max[:, None]
        e_sum = row_sum[:, None]
    if USE_PDL and PDL_TRIGGER == 1:
        gdc_launch_dependents()  # after the selection, before the epilogue (where SGLang's router signals)
    e_routed = e_col < K
    e_mask = e_row_ok & e_routed  # routed columns of real rows
    e_base = logits_ptr + e_row * logits_row_stride

    if TILE_WEIGHTS:
        # Steps 6-8 in the tile: the winners' scores are already in registers (s_lane), and each winning
        # lane knows its column (rank_lane), so no second, dependent gather of the logits and no second
        # scoring sit between the selection and the stores. Same arithmetic, in the same order, as the
        # gather path below (only the row sum adds in another order).
        sel = rank_lane >= 0
        w_lane = tl.where(sel, s_lane, 0.0)
        if RENORMALIZE:  # step 7, p = 1 only (the launcher sends p-norms down the gather path)
            norm = tl.sum(w_lane, axis=1)
            denom = _renorm_denom(norm, renorm_eps, EPS_CLAMP)
            # renorm_eps may be 0: a row whose selected scores are all 0 (all-NaN logits) keeps weights 0.
            w_lane = tl.where(denom[:, None] > 0, _div_nonneg(w_lane, denom.to(tl.float32)[:, None]), 0.0)
        if HAS_EXPERT_SCALE:
            w_lane = w_lane * scale_lane
        if APPLY_RSF:  # step 8, scale="in_weights"
            w_lane = w_lane * rsf
        w_lane = tl.where(live[:, None], w_lane, 0.0)
        tl.store(weights_ptr + rows64[:, None] * (K + C) + rank_lane, w_lane, mask=row_ok[:, None] & sel)
        w = tl.zeros(e_ids.shape, dtype=tl.float32)  # routed columns are written already
    else:
        # Step 6: the weights from the unbiased scores, recomputed from a gather of the winners' logits.
        if WORD_LOGITS:
            xk = e_x
        elif THREAD_ROWS or (SPLIT_ROWS > 0 and LOGIT_KEYS):
            xk = thread_x
        else:
            xk = _gather_logits(e_base, e_ids, logits_col_stride, e_mask, logit_scale, softcap, HAS_SCALE,
                                HAS_SOFTCAP, ACCURATE)
        if THREAD_ROWS and LOGIT_KEYS:
            w = thread_w  # exp(x - m) of the winners, 1 for the first (_thread_logit_rounds)
        elif LOGIT_KEYS:
            # exp(x - m) / S renormalized is exp(x - m) renormalized: S cancels up to rounding (a few ulp),
            # and the launcher takes this path only where renorm_eps is below an ulp of the sum.
            w = _exp_score(xk - e_max, ACCURATE)  # winners of redone rows may lie 87 or more below the max
        else:
            # Columns past K (and padded rows) score a logit of 0 before the mask below: their -inf made the IEEE
            # division's operands special (1 / inf), which sends the whole warp down its slow path on every row
            # (Nsight Compute source counters, BENCHMARKS.md run 87). The live columns' scores are unchanged.
            w = _score(tl.where(e_mask, xk, 0.0), e_max, e_sum, SCORING, ACCURATE)
        w = tl.where(e_mask, w, 0.0)
        if RENORMALIZE:  # step 7; shared columns are not in w yet
            if RENORM_P_ONE:
                norm = tl.sum(w, axis=RAXIS, keep_dims=True)
            else:
                # m times the norm of w / m, m the row's largest weight (the reference's order): w ** p itself
                # is subnormal for weights near 1e-20, and the GPU flushes it (H200 run 107: norms of 0).
                m = tl.max(w, axis=RAXIS, keep_dims=True)
                m = tl.where((m > 0.0) & (m < float("inf")), m, 1.0)
                norm = m * _pow(tl.sum(_pow(_div_nonneg(w, m), renorm_p, ACCURATE), axis=RAXIS, keep_dims=True),
                                inv_renorm_p, ACCURATE)
            denom = _renorm_denom(norm, renorm_eps, EPS_CLAMP)
            if THREAD_ROWS and LOGIT_KEYS:
                # One division a row, not K: the norm is >= 1 (the first winner's exp(0)) unless every winner
                # is dead and w is 0, so the reciprocal is finite and w * (1 / denom) is within an ulp of the
                # quotient.
                w = tl.where(denom > 0, w * _div(tl.full(denom.shape, 1.0, tl.float32), tl.maximum(denom, 1.0)), 0.0)
            else:
                w = tl.where(denom > 0, _div_nonneg(w, denom.to(tl.float32)), 0.0)
        if HAS_EXPERT_SCALE:
            scale = tl.load(expert_scale_ptr + e_ids.to(tl.int64) * expert_scale_stride, mask=e_mask, other=1.0)
            w = w * scale.to(tl.float32)
        if APPLY_RSF:  # step 8, scale="in_weights"
            w = w * rsf

    if HAS_RECORDER:  # step 12: logical ids, before placement
        rec = tl.where(e_live, e_ids, -1)
        tl.store(rec_ids_ptr + e_row * rec_row_stride + e_col, rec, mask=e_mask)
        if pid == 0:
            tl.store(rec_count_ptr, num_tokens.to(tl.int64))

    physical = e_ids
    if HAS_PLACEMENT:  # step 9
        count = tl.load(replica_count_ptr + e_ids, mask=e_mask, other=1)
        if REPLICA_POLICY == 2:
            choice = tl.zeros(e_ids.shape, dtype=tl.int32)
        else:
            choice = e_row32 % count
            if REPLICA_POLICY == 1:
                first_home = tl.full(e_ids.shape, MAX_REPLICAS, tl.int32)
                for r in tl.static_range(MAX_REPLICAS):
                    slot = tl.load(l2p_ptr + e_ids * MAX_REPLICAS + r, mask=e_mask, other=-1)
                    home = (slot >= 0) & (slot // SLOTS_PER_RANK == home_rank) & (first_home == MAX_REPLICAS)
                    first_home = tl.where(home, r, first_home)
                choice = tl.where(first_home < MAX_REPLICAS, first_home, choice)
        physical = tl.load(l2p_ptr + e_ids * MAX_REPLICAS + choice, mask=e_mask, other=0)
    if SHARED_MODE == 2:
        physical = physical + (physical // SLOTS_PER_RANK) * NUM_SHARED

    out_ids = physical
    out_w = w
    if C > 0:  # step 10
        shared = e_col - K
        if SHARED_MODE == 1:
            shared_id = NUM_PHYSICAL + shared
        else:
            shared_id = home_rank * (SLOTS_PER_RANK + NUM_SHARED) + SLOTS_PER_RANK + shared
        out_ids = tl.where(e_routed, physical, shared_id)
        out_w = tl.where(e_routed, w, shared_weight)
    out_ids = tl.where(e_live, out_ids, -1)
    out_w = tl.where(e_live, out_w, 0.0)
    out_mask = e_row_ok & (e_col < K + C)
    offset = e_row * (K + C) + e_col
    if TILE_WEIGHTS:
        if C > 0:
            tl.store(weights_ptr + offset, out_w, mask=out_mask & (e_col >= K))
    else:
        tl.store(weights_ptr + offset, out_w, mask=out_mask)
    tl.store(ids_ptr + offset, out_ids, mask=out_mask)
    if HAS_PACKED:  # (id << 16) | bf16 bits of the weight, the FlashInfer routed-MoE word
        # fp32 -> bf16 round-to-nearest-even by integer arithmetic (weights are finite and >= 0): the
        # interpreter's bf16 cast truncates, this spelling is the same on both.
        bits = out_w.to(tl.int32, bitcast=True)
        w_bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
        tl.store(packed_ptr + offset, (out_ids << 16) | w_bits, mask=out_mask)


@triton.jit
def _floor_kernel(
    logits_ptr, logits_row_stride, weights_ptr, ids_ptr, num_tokens,
    W: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    """The benchmark's floor: read each logit once, write K weights and K ids per row, nothing else.

    The row max feeds the stores so that the compiler cannot drop the loads. USE_PDL: launched like the
    routers (programmatic dependent launch), so that the floor hides its launch the same way.
    """
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_ok = rows < num_tokens
    c = tl.arange(0, BLOCK_W)
    x = tl.load(
        logits_ptr + rows[:, None] * logits_row_stride + c[None, :],
        mask=row_ok[:, None] & (c[None, :] < W),
        other=float("-inf"),
    ).to(tl.float32)
    m = tl.max(x, axis=1)  # [BM]
    k = tl.arange(0, BLOCK_K)
    mask = row_ok[:, None] & (k[None, :] < K)
    offset = rows[:, None] * K + k[None, :]
    tl.store(weights_ptr + offset, m[:, None] + k[None, :].to(tl.float32), mask=mask)
    tl.store(ids_ptr + offset, (m[:, None] > 0).to(tl.int32) + k[None, :], mask=mask)


