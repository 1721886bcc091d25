"""A probe: DeepSeek-V3's routing of one row by counting ranks on a program of several warps, against the router.

    python scripts/rank_probe.py --check               # CPU, TRITON_INTERPRET=1: the probe routes like the reference
    python scripts/rank_probe.py --sass [--warps 8]     # sm_90 SASS counts of the probe, offline
    python scripts/rank_probe.py [--tokens 1,16,64,256] # GPU: the probe, the router and the floor, CUDA graphs

The router runs a DeepSeek-V3 row on one warp: eight lanes an expert a thread, and seven dependent steps, each
ending in a cross-lane reduction (docs/kernel.md, "Where a small launch waits"). Here one row is a program of
`--warps` warps and no step runs rounds: each expert's rank in its group is the count of the group's keys that
beat it ([G, GS, GS] compares), a group's top-two sum and its top K are the keys of rank 0, 1 and < K, a group's
rank among the groups is counted alike, and a candidate's rank in the row is the count of the kept groups'
candidates that beat it ([G K, G K] compares). Its output columns are the candidates of rank 0 .. K - 1, their
weights the unbiased scores renormalised and scaled.

Only what it needs to be timed: sigmoid + bias, top2_sum groups, "exclude", renormalize, rsf on the weights, one
row a program, no NaN rule, no padding, no placement. It is not a router of moegate; it says whether a row
spread over several warps without rounds can reach the issue's 0.3 us over the floor at T <= 64.

H200 run 78 (BENCHMARKS.md): it cannot, in Triton. Every broadcast across an axis and every reduction over warps
goes through shared memory (44 barriers; 1016 SASS instructions a warp on 8 warps), and the probe takes 3.13 us at
T = 1 on 8 warps (3.37 on 4) where the router takes 1.54 and the floor 0.69.
"""

import argparse
import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from moegate.kernels.router_kernel import INT32_MIN, _order_bits, _score


@triton.jit
def _beats(h_a, i_a, h_b, i_b):
    """Whether key a ranks above key b: a larger key, or an equal key and a lower id."""
    return (h_a > h_b) | ((h_a == h_b) & (i_a < i_b))


@triton.jit
def _rank_kernel(logits_ptr, row_stride, bias_ptr, weights_ptr, ids_ptr, rsf, eps,
                 G: tl.constexpr, GS: tl.constexpr, TOPG: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
                 USE_PDL: tl.constexpr, ACCURATE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, G)
    p = tl.arange(0, GS)
    e = g[:, None] * GS + p[None, :]  # [G, GS] expert ids
    b = tl.load(bias_ptr + e)
    if USE_PDL:
        gdc_wait()
    x = tl.load(logits_ptr + row * row_stride + e).to(tl.float32)
    s = _score(x, 0.0, 0.0, 1, ACCURATE)  # [G, GS] sigmoid, IEEE division
    key = s + b
    hi = _order_bits(key)
    # Each expert's rank in its group: the group's keys that beat it.
    lrank = tl.sum(_beats(hi[:, None, :], p[None, None, :], hi[:, :, None], p[None, :, None]).to(tl.int32), axis=2)
    top2 = tl.sum(tl.where(lrank < 2, key, 0.0), axis=1)  # [G]: the group's two best keys (ties counted twice)
    grank = tl.sum(_beats(top2[None, :], g[None, :], top2[:, None], g[:, None]).to(tl.int32), axis=1)
    kept = grank < TOPG
    if USE_PDL:
        gdc_launch_dependents()
    # The r-th key of each group: [G, BK].
    r = tl.arange(0, BK)
    sel = lrank[:, None, :] == r[None, :, None]  # [G, BK, GS]
    c_hi = tl.max(tl.where(sel, hi[:, None, :], INT32_MIN), axis=2)
    c_id = g[:, None] * GS + tl.max(tl.where(sel, p[None, None, :], 0), axis=2)
    c_s = tl.sum(tl.where(sel, s[:, None, :], 0.0), axis=2)
    c_ok = kept[:, None] & (r[None, :] < K)
    C: tl.constexpr = G * BK
    f_hi = tl.reshape(c_hi, [C])
    f_id = tl.reshape(c_id, [C])
    f_s = tl.reshape(c_s, [C])
    f_ok = tl.reshape(c_ok, [C])
    # A candidate's rank in the row: the kept candidates that beat it.
    rank = tl.sum((_beats(f_hi[None, :], f_id[None, :], f_hi[:, None], f_id[:, None]) & f_ok[None, :]).to(tl.int32),
                  axis=1)
    win = f_ok & (rank < K)
    col = tl.arange(0, BK)
    pick = win[None, :] & (rank[None, :] == col[:, None])  # [BK, C]
    o_id = tl.sum(tl.where(pick, f_id[None, :], 0), axis=1)
    o_s = tl.sum(tl.where(pick, f_s[None, :], 0.0), axis=1)
    w = tl.div_rn(o_s, tl.zeros_like(o_s) + (tl.sum(o_s, axis=0) + eps)) * rsf
    tl.store(weights_ptr + row * K + col, w, mask=col < K)
    tl.store(ids_ptr + row * K + col, o_id, mask=col < K)


CONFIG = dict(G=8, GS=32, TOPG=4, K=8, BK=8)
RSF, EPS = 2.5, 1e-20


def launch(logits, bias, weights, ids, warps, pdl=False):
    T = logits.shape[0]
    _rank_kernel[(T,)](logits, logits.stride(0), bias, weights, ids, RSF, EPS, **CONFIG, USE_PDL=pdl,
                       ACCURATE=logits.is_cuda, num_warps=warps, **({"launch_pdl": True} if pdl else {}))


def _config():
    from moegate.bench import SHAPES

    return SHAPES["deepseek-v3-fp32"][0]


def check(device, probe, name, tokens=37, seed=0):
    """``probe(logits, bias, weights, ids)`` routes like the fp32 reference: ids equal, weights within 1e-6
    relative, on fresh random rows; outputs poisoned first. (scripts/gluon_probe.py checks its probe here too.)"""
    from moegate.reference import route_reference

    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, 256, generator=gen).to(device)
    bias = (torch.randn(256, generator=gen) * 0.1).to(device)
    weights = torch.full((tokens, 8), float("nan"), device=device)
    ids = torch.full((tokens, 8), -7, dtype=torch.int32, device=device)
    probe(logits, bias, weights, ids)
    ref_w, ref_i = route_reference(logits.cpu(), _config(), bias=bias.cpu())
    assert torch.equal(ids.cpu(), ref_i.to(torch.int32)), (ids.cpu(), ref_i)
    torch.testing.assert_close(weights.cpu(), ref_w, rtol=1e-6, atol=0)
    print(f"{name} on {device}, T={tokens}: ids equal, weights within 1e-6")


def sass(warps):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    kernel, target = _rank_kernel, GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    x, b = torch.empty(64, 256), torch.empty(256)
    w, i = torch.empty(64, 8), torch.empty(64, 8, dtype=torch.int32)
    kwargs = {**CONFIG, "USE_PDL": True, "ACCURATE": True, "num_warps": warps}
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(x, 256, b, w, i, RSF, EPS, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target,
                              options=options.__dict__)
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import sass_count

    counts = sass_count.sass_counts(compiled)
    print(f"{warps} warps: {sum(counts.values())} SASS instructions, BAR {counts['BAR']}, SHFL {counts['SHFL']}, "
          f"LDS {counts['LDS']}, STS {counts['STS']}, registers {sass_count.registers(compiled)}, "
          f"shared {compiled.metadata.shared} B")
    print(" ".join(f"{k}:{v}" for k, v in counts.most_common(24)))
    return compiled


def bench(tokens, probes, rep):
    """Each of ``probes`` ({name: probe(logits, bias, weights, ids)}, PDL launches) timed beside the floor and the
    router on the same rows, and checked against the router's output."""
    from moegate import route
    from moegate.bench import _floor_launch, _time

    config = _config()
    for T in tokens:
        logits = torch.randn(T, 256, device="cuda")
        bias = torch.randn(256, device="cuda") * 0.1
        out = (torch.empty(T, 8, device="cuda"), torch.empty(T, 8, dtype=torch.int32, device="cuda"))
        fl = (torch.empty(T, 8, device="cuda"), torch.empty(T, 8, dtype=torch.int32, device="cuda"))
        times = {"floor": _time(lambda: _floor_launch(logits, *fl, 8), rep),
                 "moegate": _time(lambda: route(logits, config, bias=bias, out=out, backend="triton"), rep)}
        for name, probe in probes.items():
            w = torch.empty(T, 8, device="cuda")
            i = torch.empty(T, 8, dtype=torch.int32, device="cuda")
            t = _time(lambda: probe(logits, bias, w, i), rep)
            ok = torch.equal(i.long(), out[1].long()) and torch.allclose(w, out[0], rtol=1e-6, atol=0)
            times[name] = f"{t:.2f}" + ("" if ok else " (routes otherwise)")
        cells = (f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in times.items())
        print(f"T={T:6d} " + "  ".join(cells), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--sass", action="store_true")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--tokens", default="1,16,64,256,1024")
    ap.add_argument("--rep", type=float, default=20.0)
    args = ap.parse_args(argv)
    warps = [int(w) for w in args.warps.split(",")]
    if args.check:
        for w in warps:
            device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
            check(device, functools.partial(launch, warps=w), f"rank probe, {w} warps")
    elif args.sass:
        for w in warps:
            sass(w)
    else:
        for w in warps:
            check("cuda", functools.partial(launch, warps=w), f"rank probe, {w} warps", tokens=1000)
        probes = {f"rank-{w}w": functools.partial(launch, warps=w, pdl=True) for w in warps}
        bench([int(t) for t in args.tokens.split(",")], probes, args.rep)


if __name__ == "__main__":
    main()
