"""Do programs of several warps, one row a warp, start a large launch faster than one-warp programs?

    python scripts/warp_rows_probe.py --model              # offline (no GPU): barriers and SASS counts, sm_90
    python scripts/warp_rows_probe.py [--tokens 1024,4096,16384,65536]

A probe, not a router. One program of R warps routes R rows, one a warp: the row tile is loaded as
[R, H, 128] (R rows, H halves of 128 lanes) and reshaped to [R, 128 H], so that Triton's layout puts the
warps on the rows (a plain [R, 256] tile puts them on the columns, and every reduction of a row crosses
warps through shared memory). Each row: sigmoid keys from ex2 / rcp, + bias, distance words, K + 1 rounds of
one 32-bit max (the router's unsigned step), the winners' scores again with libdevice exp and the IEEE
division, renormalised, K weights and ids stored. No groups, checks or exact path: it says whether the
router's one-warp programs would gain from sharing a program, the question of BENCHMARKS.md runs 68, 86 and 95
(65536 one-warp programs of the floor took 41 us against 20 us in the benchmark's shape). --repeat N runs the
rounds N times a row (the later passes on perturbed words: a longer chain of warp reductions), --keys N the keys N
times (independent MUFU / FMA work): heavier rows.

H200 run 118 (BENCHMARKS.md): the light row (x1, about half the router's instructions) gains from two rows a
program where its one-warp programs sit on the floor's own one-warp cost (T = 65536 41.8 -> 33.8 us, T = 4096 4.28 ->
3.78); heavier rows, as heavy as the router's (43 us at T = 65536) and more, gain nothing: the keys four times 45.9
us in one-warp programs, 46.0 in two-warp ones, six times 59.3 / 60.0, the rounds three times 55.0 / 54.6 (four
rows a program slower at every T). A row that costs more than the launch's start-up is bound by its own work.
"""

import argparse
import os
import re
import sys

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

INT32_MIN = tl.constexpr(-2147483648)


@triton.jit
def _mufu(x, OP: tl.constexpr):
    return tl.inline_asm_elementwise(OP + ".approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def _rows_kernel(x_ptr, b_ptr, w_ptr, id_ptr, num_tokens, stride, R: tl.constexpr, H: tl.constexpr,
                 K: tl.constexpr, KC: tl.constexpr, REPEAT: tl.constexpr = 1, KEYS: tl.constexpr = 1):
    W: tl.constexpr = H * 128
    rows = tl.program_id(0) * R + tl.arange(0, R)
    ok = rows < num_tokens
    rows64 = rows.to(tl.int64)
    col3 = tl.arange(0, H)[None, :, None] * 128 + tl.arange(0, 128)[None, None, :]  # [1, H, 128]
    ok3 = ok[:, None, None] & (col3 >= 0)
    x = tl.reshape(tl.load(x_ptr + rows64[:, None, None] * stride + col3, mask=ok3, other=0.0), (R, W))
    b = tl.reshape(tl.load(b_ptr + rows64[:, None, None] * 0 + col3), (R, W))
    lane = tl.reshape(rows[:, None, None] * 0 + col3, (R, W))
    key = _mufu(1.0 + _mufu(x * -1.4426950408889634, "ex2"), "rcp") + b
    for j in tl.static_range(1, KEYS):  # KEYS > 1: the keys again on perturbed logits (independent work, no chain)
        key = key + _mufu(1.0 + _mufu((x + j * 1e-30) * -1.4426950408889634, "ex2"), "rcp") * 1e-30
    bits = key.to(tl.int32, bitcast=True)
    hi = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    span: tl.constexpr = 2147483648 // W - 1
    hi_max = tl.max(hi, axis=1)
    base = tl.maximum(hi_max.to(tl.int64) - span, INT32_MIN).to(tl.int32)
    fast = ((tl.maximum(hi, base[:, None]) - base[:, None]) << 8) | ((W - 1) - lane)
    kc = tl.reshape(rows[:, None, None] * 0 + tl.arange(0, KC)[None, None, :], (R, KC))  # a column a lane
    acc = tl.zeros_like(fast)
    for r in tl.static_range(REPEAT):  # REPEAT > 1: the rounds again on perturbed words (a row's work, scaled)
        best = tl.max(fast, axis=1)
        wk = tl.where(kc == 0, best[:, None], INT32_MIN)
        for i in tl.static_range(1, K + 1):
            step = tl.max((fast - best[:, None]).to(tl.uint32, bitcast=True), axis=1)
            best = best + step.to(tl.int32, bitcast=True)
            wk = tl.where(kc == i, best[:, None], wk)
        if r + 1 < REPEAT:
            acc = acc ^ fast
            fast = fast ^ ((best[:, None] & acc) & 0xFF)
    amb = tl.max(((wk >> 8) == 0).to(tl.int32), axis=1)  # a stand-in check, reduced
    cur = kc < K
    ids = tl.where(cur, (W - 1) - (wk & (W - 1)), 0)
    xw = tl.load(x_ptr + rows64[:, None] * stride + ids, mask=cur & ok[:, None], other=0.0)
    s = tl.div_rn(tl.zeros_like(xw) + 1.0, 1.0 + libdevice.exp(-xw))
    s = tl.where(cur, s, 0.0)
    denom = tl.sum(s, axis=1) + 1e-20
    wt = tl.div_rn(s, tl.zeros_like(s) + denom[:, None])
    out = rows64[:, None] * K + kc
    m = cur & ok[:, None]
    tl.store(w_ptr + out, wt, mask=m)
    tl.store(id_ptr + out, tl.where(amb[:, None] > 0, -1, ids), mask=m)


@triton.jit
def _floor_rows_kernel(x_ptr, w_ptr, id_ptr, num_tokens, stride, R: tl.constexpr, H: tl.constexpr, K: tl.constexpr,
                       KC: tl.constexpr):
    """The read-once floor in the same shape (R rows, one a warp)."""
    W: tl.constexpr = H * 128
    rows = tl.program_id(0) * R + tl.arange(0, R)
    ok = rows < num_tokens
    rows64 = rows.to(tl.int64)
    col3 = tl.arange(0, H)[None, :, None] * 128 + tl.arange(0, 128)[None, None, :]
    x = tl.reshape(tl.load(x_ptr + rows64[:, None, None] * stride + col3, mask=ok[:, None, None] & (col3 >= 0),
                           other=0.0), (R, W))
    mx = tl.max(x, axis=1)
    kc = tl.reshape(rows[:, None, None] * 0 + tl.arange(0, KC)[None, None, :], (R, KC))
    out = rows64[:, None] * K + kc
    m = (kc < K) & ok[:, None]
    tl.store(w_ptr + out, mx[:, None] + kc.to(tl.float32), mask=m)
    tl.store(id_ptr + out, (mx[:, None] > 0).to(tl.int32) + kc, mask=m)


def _compile_offline(kernel, R, H, K=8, KC=16, floor=False, repeat=1, keys=1):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {"x_ptr": "*fp32", "w_ptr": "*fp32", "id_ptr": "*i32", "num_tokens": "i32", "stride": "i32"}
    if not floor:
        sig = {"x_ptr": "*fp32", "b_ptr": "*fp32", "w_ptr": "*fp32", "id_ptr": "*i32", "num_tokens": "i32",
               "stride": "i32"}
    consts = {"R": R, "H": H, "K": K, "KC": KC}
    if not floor:
        consts["REPEAT"] = repeat
        consts["KEYS"] = keys
    sig.update({k: "constexpr" for k in consts})
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(sig) - len(consts))}
    src = ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": R})


def model(repeats, keys):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import sass_count

    for floor, kernel in [(False, _rows_kernel)] * len(repeats) + [(True, _floor_rows_kernel)]:
        repeat = repeats.pop(0) if repeats else 1
        for R in (1, 2, 4):
            c = _compile_offline(kernel, R, 2, floor=floor, repeat=repeat, keys=keys)
            ptx = c.asm["ptx"]
            n = sum(sass_count.sass_counts(c).values())
            bars = len(re.findall("bar.sync|barrier.sync", ptx))
            print(f"{'floor' if floor else 'rows '} x{repeat} k{keys} R={R}: regs {sass_count.registers(c)} "
                  f"bar.sync {bars} shfl {ptx.count('shfl.sync')} redux {ptx.count('redux.sync')} sass {n}"
                  f" converts {c.asm['ttgir'].count('convert_layout')}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", default="1024,4096,16384,32768,65536")
    p.add_argument("--rows", default="1,2,4", help="rows (= warps) a program")
    p.add_argument("--rep", type=float, default=20.0)
    p.add_argument("--model", action="store_true")
    p.add_argument("--repeat", default="1", help="the rounds this many times a row (a heavier row), comma-separated")
    p.add_argument("--keys", type=int, default=1, help="the keys this many times a row (heavier, without a chain)")
    a = p.parse_args(argv)
    repeats = [int(r) for r in a.repeat.split(",")]
    if a.model:
        return model(repeats, a.keys)
    from moegate.bench import _time

    W, K = 256, 8
    for T in [int(t) for t in a.tokens.split(",")]:
        copies = max(1, min(8, (256 << 20) // (T * W * 4)))
        xs = [torch.randn(T, W, device="cuda") for _ in range(copies)]
        bias = torch.rand(W, device="cuda") * 0.1
        w = torch.empty(T, K, device="cuda")
        ids = torch.empty(T, K, dtype=torch.int32, device="cuda")
        ref = torch.topk(torch.sigmoid(xs[0]) + bias, K, dim=1).indices.to(torch.int32)
        for repeat in repeats:
            line = [f"T={T:6d} cp={copies} x{repeat} k{a.keys}"]
            for R in [int(r) for r in a.rows.split(",")]:
                grid = (triton.cdiv(T, R),)
                _rows_kernel[grid](xs[0], bias, w, ids, T, W, R=R, H=2, K=K, KC=16, REPEAT=repeat, KEYS=a.keys,
                                   num_warps=R)
                # Only the plain row routes: with REPEAT > 1 the last rounds ran on perturbed words, and KEYS > 1
                # adds a little to every key.
                plain = repeat == 1 and a.keys == 1
                agree = f" agree {(ids == ref).all(dim=1).float().mean().item():.4f}" if plain else ""
                state = {"i": 0}

                def run(R=R, grid=grid, repeat=repeat):
                    state["i"] = (state["i"] + 1) % copies  # a graph of launches cycles through the copies
                    _rows_kernel[grid](xs[state["i"]], bias, w, ids, T, W, R=R, H=2, K=K, KC=16, REPEAT=repeat,
                                       KEYS=a.keys, num_warps=R)

                def floor(R=R, grid=grid):
                    state["i"] = (state["i"] + 1) % copies
                    _floor_rows_kernel[grid](xs[state["i"]], w, ids, T, W, R=R, H=2, K=K, KC=16, num_warps=R)

                line.append(f"R={R}: rows {_time(run, a.rep):7.2f} floor {_time(floor, a.rep):7.2f}{agree}")
            print(" | ".join(line), flush=True)

if __name__ == "__main__":
    main()
