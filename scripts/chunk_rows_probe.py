"""Can plain Triton keep a program's warps on its rows through a whole grouped route? A probe, not a router.

    python scripts/chunk_rows_probe.py --model                 # offline (no GPU): barriers, layouts, SASS, sm_90
    python scripts/chunk_rows_probe.py [--tokens 4096,65536]   # GPU: checked against route(), then timed

Triton's default layout fills a warp's threads along a tile's last dimension and then puts the warps on the
dimensions from the last one inward, as far as each dimension has room. A [R, 256] tile on R warps has room for 8
warps along its 256 columns, so the warps go there, and every reduction of a row crosses warps through shared
memory (docs/kernel.md, Speed: 65-76 barriers a row in the router's rows-on-warps attempts). Here a row of
NC * 128 lanes is a [R, NC, 128] tile instead. A load's layout comes from Triton's coalescing, which orders the
dimensions by contiguity, ties from the lowest: four adjacent lanes a thread (16 bytes), 32 threads on the 128
lanes, then the warps on the rows (dimension 0, before the chunks), and every value computed from the tile keeps
that layout, the group views (reshaped to [R, G, GS]) included. A reduction over a row is in-thread steps over a
thread's 8 lanes and five shuffles. The epilogue runs on [32, R] tensors (a winner a thread): a gather has no
contiguity, so its layout fills the lowest dimension first. (A first form, [NC, R, 32] with a contiguity hint of 1
on the column offsets, kept the load unvectorised and, ties from the lowest, put the threads on the chunks: scrapped.)

Each row: fast keys (the router's APPROX_KEYS) or FMA keys + bias (RAW: their own bits, else order bits); for groups
the top2_sum group scores on 32-bit words, groups kept by counting, the dropped groups' lanes at INT32_MIN (KEPT: the
kept groups' 128 lanes read again instead, their bias through the logits' pointers moved by b_minus_x); distance
words below the row's best key (the inverted lane in the low 8 bits), K + 1 rounds of one unsigned max; weights from
the winners' logits (the router's exact scores), renormalised, scaled; K weights and ids stored. Rows the router
would send to its exact path (a NaN or +-inf logit, a logit below the FMA keys' band, raw bits that may misorder, a
dropped group within the keys' error of a kept one, two adjacent winners closer than two keys' errors, the K-th on
the distance clamp) get ids -1 here and are counted: the probe has no exact path. Sigmoid and sqrt-softplus, 256
lanes, fp32 logits, T a multiple of R. kernels/warp_rows_kernel.py is the router kernel that grew from this.

The question (BENCHMARKS.md runs 118 and 148-149): one row a one-warp program starts 65536 programs in ~41 us on
either Hopper GPU, about what the router takes; programs of R rows start R times fewer.
"""

import argparse
import os
import re
import sys

import torch
import triton
import triton.language as tl

from moegate.kernels.router_kernel import (
    INF_BITS,
    _exp,
    _key_err,
    _key_of32,
    _log1p,
    _nan_unless_finite,
    _order_bits,
    _recip_ge1,
    _score,
    _sigmoid_fast,
    _sqrt_fma,
    _sqrtsoftplus_fast,
)

INT32_MIN = tl.constexpr(-2147483648)


@triton.jit
def _top2(a1, a2, b1, b2):
    return tl.maximum(a1, b1), tl.maximum(tl.minimum(a1, b1), tl.maximum(a2, b2))


@triton.jit
def _row_max(v):
    """[R, NC, 128] -> [R]: in-thread over the chunks (and a thread's four lanes), then the warp."""
    return tl.max(tl.max(v, axis=1), axis=1)


@triton.jit
def _chunk_rows_kernel(x_ptr, b_ptr, w_ptr, id_ptr, stride, rsf, b_minus_x, R: tl.constexpr, NC: tl.constexpr,
                       K: tl.constexpr, SCORING: tl.constexpr, N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr,
                       FAST: tl.constexpr, ACCURATE: tl.constexpr, RAW: tl.constexpr = False,
                       KEPT: tl.constexpr = False):
    W: tl.constexpr = NC * 128
    LANE_BITS: tl.constexpr = 8  # the words' low bits: the inverted lane
    tl.static_assert(W <= 256)
    rows = tl.program_id(0) * R + tl.arange(0, R)
    rows64 = rows.to(tl.int64)
    lane = tl.arange(0, NC)[None, :, None] * 128 + tl.arange(0, 128)[None, None, :]  # [1, NC, 128]
    lane3 = lane + (rows * 0)[:, None, None]  # [R, NC, 128]: every per-lane operand has the tile's shape
    x = tl.load(x_ptr + rows64[:, None, None] * stride + lane3)
    b = tl.load(b_ptr + lane3)
    # Dead lanes (NaN, +-inf logits) by their NaN keys (the router's NAN_DEAD): the row's best bits say so.
    xn = _nan_unless_finite(x, ACCURATE)
    if FAST:
        if SCORING == 1:
            key = _sigmoid_fast(xn, ACCURATE)
        else:
            key = _sqrtsoftplus_fast(xn, ACCURATE, True)
        flag = rows < 0
    else:
        if SCORING == 1:
            key = _recip_ge1(1.0 + _exp(-xn, ACCURATE), ACCURATE)
            off: tl.constexpr = 1028784127
            span_x: tl.constexpr = 1020395519
        else:
            key = _sqrt_fma(tl.where(xn > 20.0, xn, _log1p(_exp(tl.minimum(xn, 20.0), ACCURATE), ACCURATE)),
                            ACCURATE)
            off: tl.constexpr = 1031143423
            span_x: tl.constexpr = 1022754815
        # A finite logit below -87 (sigmoid) / -69 (sqrt-softplus) is outside the FMA keys' exact range.
        u = (x.to(tl.int32, bitcast=True) + off).to(tl.uint32, bitcast=True)
        flag = tl.min(tl.min(u, axis=1), axis=1) < span_x  # [R]
    bias_mag = _row_max(tl.abs(b))  # bounds a sqrt-softplus score by its key
    # [R, NC, 128]; a NaN key's bits (0x7FFFFFFF) top every other. RAW (the router's RAW_BITS): the key's own bits,
    # which order keys >= +0.0 as the order bits do; rows where that could misorder a group's top two or the rounds'
    # clamp are flagged below.
    hi = (key + b).to(tl.int32, bitcast=True) if RAW else _order_bits(key + b)
    if N_GROUP > 1:
        GS: tl.constexpr = W // N_GROUP
        hig = tl.reshape(hi, [R, N_GROUP, GS])
        t1, t2 = tl.reduce((hig, tl.full(hig.shape, INT32_MIN, tl.int32)), 2, _top2)  # [R, G]
        g = tl.arange(0, N_GROUP)[None, :] + (rows * 0)[:, None]  # [R, G]
        if RAW:
            gscore = t1.to(tl.float32, bitcast=True) + t2.to(tl.float32, bitcast=True)
            flag = flag | (tl.min(t2, axis=1) < 0)  # a group's second key below +0.0
            gword = (gscore.to(tl.int32, bitcast=True) & (-N_GROUP)) | ((N_GROUP - 1) - g)
        else:
            gscore = _key_of32(t1) + _key_of32(t2)
            gword = (_order_bits(gscore) & (-N_GROUP)) | ((N_GROUP - 1) - g)
        above = tl.sum((gword[:, None, :] > gword[:, :, None]).to(tl.int32), axis=2)  # [R, G]
        kept = above < TOPK_GROUP
        kept_min = tl.min(tl.where(kept, gscore, float("inf")), axis=1)
        dropped_max = tl.max(tl.where(kept, float("-inf"), gscore), axis=1)
        # Two group scores within their keys' rounding (two keys each): a dropped group may be a kept one.
        err = 2.0 * _key_err(tl.abs(kept_min), SCORING, bias_mag) if FAST else 4e-6 + 1e-6 * tl.abs(kept_min)
        flag = flag | (kept_min - dropped_max <= 2.0 * err)
        if KEPT:
            # The rounds on the kept groups' lanes only (the router's KEPT_ONLY): their logits read again (L1) into
            # a [R, 1, TOPK_GROUP * GS] tile, slot s holding the group ranked s, and their keys computed again.
            KW: tl.constexpr = TOPK_GROUP * GS
            tl.static_assert(KW == 128 and GS % 4 == 0 and N_GROUP <= 16)
            # [R]: the 4-bit field s holds the group ranked s. The words' low bits are the compact lane (an arange:
            # no layout conversion), which orders equal keys by the groups' rank, not by id: only the fast keys take
            # this path, and their margins flag every row with two keys that close.
            tl.static_assert(FAST)
            slots = tl.sum(tl.where(kept, g << (4 * above), 0), axis=1)
            c = tl.arange(0, KW)[None, None, :] + (rows * 0)[:, None, None]  # [R, 1, KW]
            lane3 = ((slots[:, None, None] >> (4 * (c // GS))) & 15) * GS + (c % GS)
            lane3 = tl.max_contiguous(tl.multiple_of(lane3, [1, 1, 4]), [1, 1, 4])  # four lanes of a group a thread
            pk = x_ptr + rows64[:, None, None] * stride + lane3
            xk = _nan_unless_finite(tl.load(pk), ACCURATE)
            # The bias by the same pointers moved by b_ptr - x_ptr - row * stride: built on their own, Triton's
            # layout pass had rebuilt them in the group views' layout and converted them (a barrier, 83 instructions).
            boff = tl.multiple_of(b_minus_x - rows64 * stride, 4)
            bk = tl.load(pk + boff[:, None, None])
            kk = (_sigmoid_fast(xk, ACCURATE) if SCORING == 1 else _sqrtsoftplus_fast(xk, ACCURATE, True)) + bk
            hi = kk.to(tl.int32, bitcast=True) if RAW else _order_bits(kk)
        else:
            hi = tl.reshape(tl.where(kept[:, :, None], hig, INT32_MIN), [R, NC, 128])
    best = _row_max(hi)  # [R]
    flag = flag | (best > INF_BITS)  # a NaN key: a dead lane
    dspan: tl.constexpr = (1 << (31 - LANE_BITS)) - 1
    base = tl.maximum(best.to(tl.int64) - dspan, INT32_MIN).to(tl.int32)
    if RAW:
        flag = flag | (base < 0)  # below a base < 0, negative keys' raw bits would not clamp to distance 0
    if KEPT:
        inv = (KW - 1) - c  # the compact lane; the epilogue maps it back to the expert
    else:
        inv = ((1 << LANE_BITS) - 1) - lane3
    word = ((tl.maximum(hi, base[:, None, None]) - base[:, None, None]) << LANE_BITS) | inv
    top = _row_max(word)
    # The epilogue on [32, R] tensors, a winner a thread: a gather's layout (no contiguity anywhere) follows the
    # lower dimension first, so the threads go on the winners and the warps stay on the rows.
    kc = tl.arange(0, 32)[:, None] + (rows * 0)[None, :]
    wk = tl.where(kc == 0, top[None, :], 0)
    cur = top
    kth = top
    widest = tl.full(top.shape, INT32_MIN, tl.int32)  # the largest step: minus the closest two adjacent words
    for i in tl.static_range(1, K + 1):
        step = _row_max((word - cur[:, None, None]).to(tl.uint32, bitcast=True)).to(tl.int32, bitcast=True)
        cur = cur + step
        widest = tl.maximum(widest, step)
        if i < K:
            wk = tl.where(kc == i, cur[None, :], wk)
            kth = cur
    # The K-th winner on the distance clamp (distance 0) may tie with lanes far below: the exact path (here:
    # flagged). On fast keys every two adjacent words (the K winners and the first loser) must also lie further
    # apart than two keys' errors, else they may be out of order. Their order bits differ by at least
    # gap = -widest >> LANE_BITS, and two positive floats that many order bits apart by at least gap ulps of the
    # lower one, the first loser's smallest; the error is largest at the best key.
    flag = flag | ((kth >> LANE_BITS) == 0)
    if FAST:
        gap = ((-widest) >> LANE_BITS).to(tl.float32)
        n_bits = base + (cur >> LANE_BITS)
        ulp = (n_bits & 0x7F800000).to(tl.float32, bitcast=True) * 1.1920928955078125e-07
        err = _key_err(tl.abs(best.to(tl.float32, bitcast=True) if RAW else _key_of32(best)), SCORING, bias_mag)
        flag = flag | (n_bits < 0x00800000) | (gap * ulp <= 2.0 * err)
    live = kc < K
    if KEPT:
        cw = (KW - 1) - (wk & ((1 << LANE_BITS) - 1))
        tl.static_assert(GS & (GS - 1) == 0)
        GS_BITS: tl.constexpr = GS.bit_length() - 1
        ids = tl.where(live, ((slots[None, :] >> ((cw >> GS_BITS) << 2)) & 15) * GS + (cw & (GS - 1)), 0)
    else:
        ids = tl.where(live, ((1 << LANE_BITS) - 1) - (wk & ((1 << LANE_BITS) - 1)), 0)
    xw = tl.load(x_ptr + rows64[None, :] * stride + ids, mask=live, other=0.0)
    s = tl.where(live, _score(xw, 0.0, 0.0, SCORING, ACCURATE), 0.0)  # the router's weights (libdevice, IEEE)
    denom = tl.sum(s, axis=0) + 1e-20
    w = tl.div_rn(s, tl.zeros_like(s) + denom[None, :]) * rsf
    out = rows64[None, :] * K + kc
    tl.store(w_ptr + out, w, mask=live)
    tl.store(id_ptr + out, tl.where(flag[None, :], -1, ids), mask=live)


@triton.jit
def _chunk_floor_kernel(x_ptr, w_ptr, id_ptr, stride, R: tl.constexpr, NC: tl.constexpr, K: tl.constexpr):
    """The read-once floor in the same program shape: the row read, one reduction, K weights and ids written."""
    rows = tl.program_id(0) * R + tl.arange(0, R)
    rows64 = rows.to(tl.int64)
    lane3 = tl.arange(0, NC)[None, :, None] * 128 + tl.arange(0, 128)[None, None, :] + (rows * 0)[:, None, None]
    x = tl.load(x_ptr + rows64[:, None, None] * stride + lane3)
    mx = _row_max(x)
    kc = tl.arange(0, 32)[:, None] + (rows * 0)[None, :]
    out = rows64[None, :] * K + kc
    live = kc < K
    tl.store(w_ptr + out, mx[None, :] + kc.to(tl.float32), mask=live)
    tl.store(id_ptr + out, (mx[None, :] > 0).to(tl.int32) + kc, mask=live)


SHAPES = {  # name -> (SCORING, K, N_GROUP, TOPK_GROUP, rsf): the benchmark's configs of 256 fp32 lanes
    "deepseek-v3-fp32": (1, 8, 8, 4, 2.5),
    "deepseek-v4": (2, 6, 1, 1, 1.5),
}


def _compile_offline(kernel, consts, floor=False):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if floor:
        sig = {"x_ptr": "*fp32", "w_ptr": "*fp32", "id_ptr": "*i32", "stride": "i32"}
    else:
        sig = {"x_ptr": "*fp32", "b_ptr": "*fp32", "w_ptr": "*fp32", "id_ptr": "*i32", "stride": "i32", "rsf": "fp32",
               "b_minus_x": "i64"}
    n_args = len(sig)
    sig.update({k: "constexpr" for k in consts})
    # x_ptr (argument 0) unspecialised: the launch passes it so (do_not_specialize), see the module docstring
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(n_args - (0 if floor else 2))}
    src = ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": consts["R"]})


def _consts(name, R, fast=True, raw=False, kept=False, accurate=True):
    scoring, K, n_group, topk_group, _rsf = SHAPES[name]
    return {"R": R, "NC": 2, "K": K, "SCORING": scoring, "N_GROUP": n_group, "TOPK_GROUP": topk_group,
            "FAST": fast, "ACCURATE": accurate, "RAW": raw, "KEPT": kept and n_group > 1}


def model(names, rows):
    """sm_90, offline: per variant and R, the registers, barriers, layout conversions and SASS instructions (each
    warp runs them all, for its row; the fast path: up to EXIT, without the IEEE divisions' slow paths)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import sass_count

    for name in names:
        for R in rows:
            for variant in _variants(name) + ["floor"]:
                if variant == "floor":
                    consts = {k: _consts(name, R)[k] for k in ("R", "NC", "K")}
                    c = _compile_offline(_chunk_floor_kernel, consts, floor=True)
                else:
                    c = _compile_offline(_chunk_rows_kernel, _consts(name, R, *VARIANTS[variant]))
                bars = len(re.findall(r"bar\.sync|barrier\.sync", c.asm["ptx"]))
                print(f"{name:17s} R={R} {variant:9s} regs {sass_count.registers(c):3d} bar.sync {bars:2d} "
                      f"converts {c.asm['ttgir'].count('convert_layout'):2d} "
                      f"sass {sum(sass_count.sass_counts(c).values()):5d} fast path {_path_count(c):4d}", flush=True)


def _path_count(compiled):
    import sass_count

    seq, labels = sass_count._disassemble(compiled)
    end = next((i for i, x in enumerate(seq) if x[2].startswith("EXIT")), len(seq))
    drop = set()
    for i, (_f, _line, text) in enumerate(seq[:end]):
        m = re.match(r"@!?U?P\w+\s+BRA\s+(?:!?U?P\w+,\s*)?`?\(?([.\w]+)", text)
        if not m or labels.get(m.group(1), -1) <= i:
            continue
        j = min(labels[m.group(1)], end)
        if j - i < 12 and any(seq[k][2].startswith("CALL") for k in range(i, j)):
            drop.update(range(i + 1, j))
    return sum(1 for i in range(min(end + 1, len(seq))) if i not in drop)


def _launch(name, x, bias, w, ids, R, fast, raw=False, kept=False):
    T = x.shape[0]
    accurate = x.is_cuda  # the interpreter has no PTX (the router's ACCURATE)
    b_minus_x = (bias.data_ptr() - x.data_ptr()) // 4  # elements (both fp32)
    _chunk_rows_kernel[(T // R,)](x, bias, w, ids, x.stride(0), SHAPES[name][4], b_minus_x, num_warps=R,
                                  **_consts(name, R, fast, raw, kept, accurate))


# name -> (fast keys, RAW, KEPT): the kernel variants checked and timed
VARIANTS = {"fma": (False, False, False), "fast": (True, False, False), "raw": (True, True, False),
            "raw+kept": (True, True, True)}


def _variants(name):
    return [v for v in VARIANTS if not (VARIANTS[v][2] and SHAPES[name][2] == 1)]


def check(name, T, R, variant, device):
    """Ids equal to route()'s, weights within 1e-6 relative, on rows the probe did not flag: (flagged, wrong)."""
    from moegate.bench import SHAPES as BENCH
    from moegate.router import route

    config, _dtype = BENCH[name]
    g = torch.Generator(device="cpu").manual_seed(T * 7 + R)
    x = (torch.randn(T, 256, generator=g) * 2).to(device)
    bias = (torch.rand(256, generator=g) * 0.2).to(device)
    w = torch.full((T, config.top_k), float("nan"), device=device)
    ids = torch.full((T, config.top_k), -7, dtype=torch.int32, device=device)
    _launch(name, x, bias, w, ids, R, *VARIANTS[variant])
    ref_w, ref_ids = route(x, config, bias=bias, backend="reference")[:2]
    flagged = (ids == -1).any(dim=1)
    good = ~flagged
    wrong = (ids[good] != ref_ids[good].to(torch.int32)).any(dim=1) | \
        ((w[good] - ref_w[good]).abs() > 1e-6 * ref_w[good].abs().clamp_min(1e-30)).any(dim=1)
    return int(flagged.sum()), int(wrong.sum())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--rows", default="1,2,4", help="rows (= warps) a program")
    p.add_argument("--tokens", default="4096,8192,16384,32768,65536")
    p.add_argument("--rep", type=float, default=20.0)
    p.add_argument("--model", action="store_true", help="compile for sm_90 here and count, no GPU")
    p.add_argument("--check-only", action="store_true", help="the check against route() only (CPU: interpreter)")
    a = p.parse_args(argv)
    names = a.shapes.split(",")
    rows = [int(r) for r in a.rows.split(",")]
    if a.model:
        return model(names, rows)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for name in names:
        for R in rows:
            for T in ([8 * R, 37 * R] if device == "cpu" else [R, 4096, 65536]):
                for variant in _variants(name):
                    flagged, wrong = check(name, T, R, variant, device)
                    print(f"check {name} R={R} T={T} {variant}: {flagged} rows flagged, {wrong} wrong", flush=True)
                    if wrong:
                        raise SystemExit(f"{name} R={R} T={T}: {wrong} rows routed unlike route()")
    if a.check_only:
        return 0
    from moegate.bench import SHAPES as BENCH
    from moegate.bench import _floor_launch, _time
    from moegate.router import route

    for name in names:
        config, _dtype = BENCH[name]
        K = config.top_k
        for T in [int(t) for t in a.tokens.split(",")]:
            copies = max(1, min(8, (256 << 20) // (T * 256 * 4)))
            xs = [torch.randn(T, 256, device="cuda") * 2 for _ in range(copies)]
            bias = torch.rand(256, device="cuda") * 0.2
            w = torch.empty(T, K, device="cuda")
            ids = torch.empty(T, K, dtype=torch.int32, device="cuda")
            state = {"i": 0}

            def nxt():
                state["i"] = (state["i"] + 1) % copies  # a graph of launches cycles through the copies
                return xs[state["i"]]

            def router():
                route(nxt(), config, bias=bias, out=(w, ids))

            def bench_floor():
                _floor_launch(nxt(), w, ids, K)

            line = [f"{name:16s} T={T:6d} router {_time(router, a.rep):6.2f} floor {_time(bench_floor, a.rep):6.2f}"]
            for R in rows:
                def probe(R=R, variant="fast"):
                    _launch(name, nxt(), bias, w, ids, R, *VARIANTS[variant])

                def floor(R=R):
                    _chunk_floor_kernel[(T // R,)](nxt(), w, ids, 256, R=R, NC=2, K=K, num_warps=R)

                times = " ".join(f"{v} {_time(lambda v=v: probe(variant=v), a.rep):6.2f}" for v in _variants(name))
                line.append(f"R={R} {times} floor {_time(floor, a.rep):6.2f}")
            print(" | ".join(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
