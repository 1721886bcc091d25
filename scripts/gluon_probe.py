"""A probe: DeepSeek-V3's routing of one row on 8 warps in Gluon, ranks counted, shared-memory exchanges.

    python scripts/gluon_probe.py --model               # offline (no GPU): sm_90 SASS and the lone-warp cycle model
    python scripts/gluon_probe.py [--tokens 1,16,64]    # GPU: checked against the reference, then timed

Triton's language puts every cross-warp step through shared memory and a barrier of its own choosing
(scripts/rank_probe.py: 44 barriers). Gluon (`triton.experimental.gluon`, in triton 3.6) lets the layouts and the
exchanges be written by hand. Here one row is a program of 8 warps, a group of 32 experts a warp, an expert a
thread:
1. each expert's rank in its group, counted against a shared-memory copy of the group (ties to the lower id);
2. each group's sorted top 8 (key bits, lane, score bits) by 24 warp reductions, and its top-two sum;
3. the groups' sums through shared memory: each warp keeps or drops its group (a dropped group's keys -> INT32_MIN);
4. the groups' lists through shared memory: each candidate's rank in the row counted against all of them;
5. the winners' scores summed over the program, renormalised, scaled; each winner stores its own column.
Five barriers on the path. Only what it needs to be timed: sigmoid + bias, top2_sum groups, "exclude",
renormalize, rsf on the weights, one row a program; no NaN rule, padding or placement. Gluon has no interpreter
(its launch asks for a GPU driver), so there is no CPU check: `--model` compiles it offline, the GPU run checks it.
It is not a router of moegate; it says whether hand-placed exchanges bring a row near the floor at T <= 64.

Results: docs/kernel.md, "Where a small launch waits", and BENCHMARKS.md.
"""

import argparse
import collections
import functools
import os
import re
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.language.extra import libdevice
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from moegate.kernels.router_kernel import _key_of32, _order_bits

# The router's order-preserving key bits, as Gluon functions (Gluon calls a Triton function re-decorated).
_order = gluon.jit(_order_bits.fn)
_unorder = gluon.jit(_key_of32.fn)


@gluon.jit
def probe_kernel(logits_ptr, row_stride, bias_ptr, w_ptr, id_ptr, rsf, eps,
                 G: gl.constexpr, GS: gl.constexpr, TOPG: gl.constexpr, K: gl.constexpr, USE_PDL: gl.constexpr):
    E: gl.constexpr = G * GS
    INT_MIN: gl.constexpr = -2147483648
    L3: gl.constexpr = gl.BlockedLayout([1, 1, GS], [1, 32, 1], [G, 1, 1], [2, 1, 0])  # [g, p, j]
    E2: gl.constexpr = gl.SliceLayout(2, L3)  # [g, p]: an expert a thread
    A2: gl.constexpr = gl.SliceLayout(1, L3)  # [g, j]: the group in every thread of its warp
    LK: gl.constexpr = gl.BlockedLayout([1, 1, K], [1, 32, 1], [G, 1, 1], [2, 1, 0])  # [g, p, r]
    EK: gl.constexpr = gl.SliceLayout(2, LK)
    TK: gl.constexpr = gl.SliceLayout(1, LK)  # [g, r]
    FL: gl.constexpr = gl.BlockedLayout([1, 1, 1, G, 2], [1, 4, 8, 1, 1], [G, 1, 1, 1, 1], [4, 3, 2, 1, 0])
    CAND: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(3, gl.SliceLayout(4, FL)))  # [h, r]
    OTH: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, FL))  # [q, h2, r2]
    SH2: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    SH1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])

    row = gl.program_id(0).to(gl.int64)
    g = gl.arange(0, G, layout=gl.SliceLayout(1, E2))
    p = gl.arange(0, GS, layout=gl.SliceLayout(0, E2))
    e = g[:, None] * GS + p[None, :]
    b = gl.load(bias_ptr + e)
    if USE_PDL:
        gdc_wait()
    x = gl.load(logits_ptr + row * row_stride + e).to(gl.float32)
    s = gl.div_rn(gl.full(x.shape, 1.0, gl.float32, E2), 1.0 + libdevice.exp(-x))
    hi = _order(s + b)

    # 1. each expert's rank in its group: the group's keys that beat it (64-bit words, ties to the lower id)
    sh_hi = gl.allocate_shared_memory(gl.int32, [G, GS], SH2)
    sh_hi.store(hi)
    gl.thread_barrier()
    hall = sh_hi.load(A2)
    j = gl.arange(0, GS, layout=gl.SliceLayout(0, A2))
    wj = (gl.expand_dims(hall, 1).to(gl.int64) << 32) | (GS - 1 - gl.expand_dims(gl.expand_dims(j, 0), 1)).to(gl.int64)
    wp = (gl.expand_dims(hi, 2).to(gl.int64) << 32) | (GS - 1 - gl.expand_dims(gl.expand_dims(p, 0), 2)).to(gl.int64)
    r_in = gl.sum((wj > wp).to(gl.int32), axis=2)  # [g, p]

    # 2. each group's sorted top K, by warp reductions; the group's top-two sum
    rk = gl.convert_layout(r_in, EK)
    hk = gl.convert_layout(hi, EK)
    pk = gl.convert_layout(gl.zeros_like(r_in) + p[None, :], EK)
    sk = gl.convert_layout(s.to(gl.int32, bitcast=True), EK)
    rr = gl.arange(0, K, layout=gl.SliceLayout(0, TK))
    sel = gl.expand_dims(rk, 2) == gl.expand_dims(gl.expand_dims(rr, 0), 1)  # [g, p, r]
    t_hi = gl.max(gl.where(sel, gl.expand_dims(hk, 2), INT_MIN), axis=1)  # [g, r]
    t_p = gl.max(gl.where(sel, gl.expand_dims(pk, 2), -1), axis=1)
    t_s = gl.max(gl.where(sel, gl.expand_dims(sk, 2), -1), axis=1)
    top2 = gl.sum(gl.where(gl.expand_dims(rr, 0) < 2, _unorder(t_hi), 0.0), axis=1)  # [g] (in-thread)

    # 3. the groups' sums to every warp; each warp keeps or drops its group
    sh_gs = gl.allocate_shared_memory(gl.float32, [G], SH1)
    sh_gs.store(top2)
    gl.thread_barrier()
    GA: gl.constexpr = gl.BlockedLayout([1, G], [32, 1], [G, 1], [1, 0])  # [g, h2]: all sums in every thread
    gs_all = sh_gs.load(gl.SliceLayout(0, GA))  # [h2]
    g_own = gl.convert_layout(top2, gl.SliceLayout(1, GA))  # [g]
    h2 = gl.arange(0, G, layout=gl.SliceLayout(0, GA))
    g_ids = gl.arange(0, G, layout=gl.SliceLayout(1, GA))
    tie = (gs_all[None, :] == g_own[:, None]) & (h2[None, :] < g_ids[:, None])
    beats_g = (gs_all[None, :] > g_own[:, None]) | tie
    grank = gl.sum(beats_g.to(gl.int32), axis=1)  # [g]
    kept = gl.convert_layout(grank < TOPG, gl.SliceLayout(1, TK))
    t_hi = gl.where(kept[:, None], t_hi, INT_MIN)

    # 4. the kept groups' lists to every warp; each candidate's rank in the row by counting
    sh_t = gl.allocate_shared_memory(gl.int32, [G, K], SH2)
    sh_p = gl.allocate_shared_memory(gl.int32, [G, K], SH2)
    sh_s = gl.allocate_shared_memory(gl.int32, [G, K], SH2)
    sh_t.store(t_hi)
    sh_p.store(t_p)
    sh_s.store(t_s)
    gl.thread_barrier()
    c_hi = sh_t.load(CAND)
    c_p = sh_p.load(CAND)
    c_s = sh_s.load(CAND).to(gl.float32, bitcast=True)
    o_hi = sh_t.reshape([G, 4, 2]).permute([1, 0, 2]).load(OTH)  # [q, h2, r2]
    o_p = sh_p.reshape([G, 4, 2]).permute([1, 0, 2]).load(OTH)
    ch = gl.arange(0, G, layout=gl.SliceLayout(1, CAND))
    c_id = ch[:, None] * GS + c_p
    oh = gl.arange(0, G, layout=gl.SliceLayout(0, gl.SliceLayout(2, OTH)))
    o_id = oh[None, :, None] * GS + o_p
    wc = (c_hi.to(gl.int64) << 32) | (E - 1 - c_id).to(gl.int64)  # [h, r]
    wo = (o_hi.to(gl.int64) << 32) | (E - 1 - o_id).to(gl.int64)  # [q, h2, r2]
    wc5 = gl.expand_dims(gl.expand_dims(gl.expand_dims(wc, 1), 3), 4)  # [h, 1, r, 1, 1]
    wo5 = gl.expand_dims(gl.expand_dims(wo, 0), 2)  # [1, q, 1, h2, r2]
    cnt = gl.sum(gl.sum(gl.sum((wo5 > wc5).to(gl.int32), axis=4), axis=3), axis=1)  # [h, r]
    win = (c_hi != INT_MIN) & (cnt < K)

    # 5. weights: the winners' scores renormalised, rsf; each winner stores its own column
    total = gl.sum(gl.sum(gl.where(win, c_s, 0.0), axis=1), axis=0)
    w = gl.div_rn(c_s, gl.zeros_like(c_s) + (total + eps)) * rsf
    if USE_PDL:
        gdc_launch_dependents()
    gl.store(w_ptr + row * K + cnt, w, mask=win)
    gl.store(id_ptr + row * K + cnt, c_id, mask=win)



CONFIG = dict(G=8, GS=32, TOPG=4, K=8)
RSF, EPS = 2.5, 1e-20


def launch(logits, bias, weights, ids, pdl=False):
    T = logits.shape[0]
    probe_kernel[(T,)](logits, logits.stride(0), bias, weights, ids, RSF, EPS, **CONFIG, USE_PDL=pdl, num_warps=8,
                       **({"launch_pdl": True} if pdl else {}))


def compile_offline(pdl=True):
    """The probe compiled for sm_90 without a GPU."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import create_function_from_signature

    kernel, target = probe_kernel, GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    kwargs = {**CONFIG, "USE_PDL": pdl, "num_warps": 8}
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    args = (torch.empty(64, 256), 256, torch.empty(256), torch.empty(64, 8), torch.empty(64, 8, dtype=torch.int32),
            RSF, EPS)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    return triton.compile(GluonASTSource(kernel, signature, constexprs, attrs), target=target,
                          options=options.__dict__)


def model():
    """SASS counts and scripts/sass_count.py's lone-warp issue model over the path to EXIT (the IEEE divisions'
    slow paths left out); eight warps share four schedulers, which the model does not see."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import sass_count as sc

    compiled = compile_offline()
    counts = sc.sass_counts(compiled)
    print(f"{sum(counts.values())} SASS instructions, BAR {counts['BAR']}, REDUX {counts['REDUX']}, SHFL "
          f"{counts['SHFL']}, LDS {counts['LDS']}, STS {counts['STS']}, registers {sc.registers(compiled)}, shared "
          f"{compiled.metadata.shared} B")
    seq, labels, control = sc._disassemble(compiled, with_control=True)
    end = next((i for i, x in enumerate(seq) if x[2].startswith("EXIT")), len(seq))
    drop = set()
    for i, (_f, _ln, text) in enumerate(seq[:end]):
        m = re.match(r"@!?U?P\w+\s+BRA\s+(?:!?U?P\w+,\s*)?`?\(?([.\w]+)", text)
        if m and labels.get(m.group(1), -1) > i:
            j = min(labels[m.group(1)], end)
            if j - i < 12 and any(seq[k][2].startswith("CALL") for k in range(i, j)):
                drop.update(range(i + 1, j))
    board, t, spent, prev = [0.0] * 6, 0.0, collections.Counter(), 0.0
    path = [i for i in range(end + 1) if i not in drop]
    for i in path:
        wait, read, write, stall = control[i]
        op = sc._opcode(seq[i][2])
        if wait:
            t = max([t] + [board[b] for b in range(6) if wait >> b & 1])
        if write != 7:
            board[write] = t + sc.SCOREBOARD_LATENCY.get(op, 20)
        if read != 7:
            board[read] = max(board[read], t + 4)
        spent[(seq[i][0], seq[i][1])] += t - prev
        prev = t
        t += stall
    print(f"path: {len(path)} instructions, {prev:.0f} cycles modelled from the start ({prev / 1980:.2f} us at "
          f"1.98 GHz), the row's read included")
    for (fname, line), n in spent.most_common(int(os.environ.get("SASS_LINES", 12))):
        print(f"    {n:6.0f} {fname}:{line}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="store_true")
    ap.add_argument("--tokens", default="1,16,64,256,1024")
    ap.add_argument("--rep", type=float, default=20.0)
    args = ap.parse_args(argv)
    if args.model:
        model()
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import rank_probe  # its reference check and its timing beside the floor and the router

        rank_probe.check("cuda", launch, "gluon probe", tokens=1000)
        rank_probe.bench([int(t) for t in args.tokens.split(",")],
                         {"gluon-8w": functools.partial(launch, pdl=True)}, args.rep)


if __name__ == "__main__":
    main()
