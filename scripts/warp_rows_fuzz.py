"""Random configs of the rows-on-warps kernel's own family, forced onto it, against the reference.

    TRITON_INTERPRET=1 python scripts/warp_rows_fuzz.py --device cpu --seconds 300 --seed 5000
    python scripts/warp_rows_fuzz.py --max-tokens 65536 --seconds 300          # GPU

scripts/gpu_fuzz.py draws every knob, so few of its cases fall in this kernel's family (sigmoid / sqrt-softplus with a
bias, E a power of 2 and a multiple of a chunk, no extras: kernels/warp_rows_kernel.py). Each case here draws E in
{128, 256, 512}, the scoring, groups (top2_sum or max, any topk_group), K up to 31, renormalisation (eps added or
clamped), the scale in the weights or on the output, fp32 / bf16 / fp16 logits (a third of them rounded to quarters:
ties; a quarter of them a view of a wider buffer: padded rows, 16-byte aligned or not), biases of either sign and
dtype, and NaN, -inf, +inf and extreme logits; it routes with warp_rows_override on
(_repair drawn on or off, with K + 1 or K + 2 candidates, a row on 8, 16 or 32 threads, a bias of another dtype than
the logits' on the kept lanes or the whole row, the fast path's forms of 2026-12-07 each on or off; some rows' best
logit repeated an ulp away: close keys) and checks every row against the reference: ids equal and weights
within 1e-6 relative (+ 1e-7), and on rows with a +inf logit (outside the contract's domain) K distinct valid ids. The
exit status is the number of failing cases (capped at 100).
"""

import argparse
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from gpu_fuzz import ROW_PADS, padded_view  # noqa: E402  (this folder: the same padded rows as the other fuzz)

import moegate.kernels.router as kr  # noqa: E402
from moegate import ExpertLayout, RouterConfig, route  # noqa: E402
from moegate.reference import outside_domain  # noqa: E402


def draw(rng: random.Random, max_tokens: int, device: str):
    """(config, layout, logits, bias) of one case, or None where RouterConfig refuses the draw."""
    E = rng.choice((128, 256, 256, 512))
    n_group = rng.choice((1, 1, 2, 4, 8, 16))
    kw = dict(scoring=rng.choice(("sigmoid", "sqrtsoftplus")), has_correction_bias=True,
              renormalize=rng.random() < 0.7, renorm_eps_mode=rng.choice(("add", "clamp")),
              routed_scaling_factor=rng.choice((1.0, 2.5)))
    if n_group > 1:
        kw.update(n_group=n_group, topk_group=rng.randint(1, n_group), group_score=rng.choice(("top2_sum", "max")))
    K = rng.randint(1, min(31, kw.get("topk_group", 1) * (E // n_group)))
    try:
        config = RouterConfig(E, K, **kw)
    except ValueError:
        return None
    layout = ExpertLayout(scale=rng.choice(("in_weights", "on_output")))
    dtype = rng.choice((torch.float32, torch.float32, torch.bfloat16, torch.float16))
    T = rng.randint(1, max_tokens)
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    x = torch.randn(T, E, generator=g) * rng.choice((0.5, 2.0, 8.0))
    if rng.random() < 1 / 3:
        x = (x * 4).round() / 4  # ties
    for _ in range(rng.randint(0, 3)):
        x[rng.randrange(T), rng.randrange(E)] = rng.choice((float("nan"), float("-inf"), float("inf"), -100.0, 30.0))
    for _ in range(rng.choice((0, 0, 1, 4))):  # a row's best logit repeated an ulp away elsewhere: close keys
        r = rng.randrange(T)
        best = x[r].nan_to_num(nan=-1e30, posinf=-1e30).argmax()
        x[r, rng.randrange(E)] = torch.nextafter(x[r, best], torch.tensor(rng.choice((-1e30, 1e30))))
    bias = torch.randn(E, generator=g) * rng.choice((0.01, 0.1, 1.0)) + rng.choice((0.0, 0.5, -0.5))
    bias = bias.to(rng.choice((torch.float32, dtype)))
    x = padded_view(x.to(dtype).to(device), rng.choice(ROW_PADS))
    return config, layout, x, bias.to(device)


def run_case(seed: int, max_tokens: int, device: str, stats: torch.Tensor) -> str:
    """'' when the case routes like the reference (or draws no config), else what went wrong. The kernel's
    fallback counts add into stats (programs on the exact path, repaired, run)."""
    rng = random.Random(seed)
    case = draw(rng, max_tokens, device)
    if case is None:
        return ""
    config, layout, x, bias = case
    # _repair on or off, with or without a word past the first loser, a row on 8, 16 or 32 threads, a bias of another
    # dtype on the kept lanes or not, the epilogue on the winners' tile or the words', the kept groups by rounds or
    # by counting, the words past the loser found lazily or not, the lean forms or not, the kept lanes' keys through
    # shared memory or not (the launcher's constants)
    saved = (kr.WARP_ROWS_REPAIR, kr.WARP_ROWS_EXTRA, kr.WARP_ROWS_THREADS, kr.WARP_ROWS_MIXED_KEPT,
             kr.WARP_ROWS_NARROW, kr.WARP_ROWS_GROUP_ROUNDS, kr.WARP_ROWS_LAZY_EXTRA, kr.WARP_ROWS_LEAN,
             kr.WARP_ROWS_SMEM_KEPT)
    kr.WARP_ROWS_REPAIR, kr.WARP_ROWS_EXTRA = rng.random() < 0.9, rng.choice((0, 1, 1))
    kr.WARP_ROWS_THREADS = rng.choice((8, 8, 16, 32))
    kr.WARP_ROWS_MIXED_KEPT, kr.WARP_ROWS_NARROW = rng.random() < 0.8, rng.random() < 0.8
    kr.WARP_ROWS_GROUP_ROUNDS, kr.WARP_ROWS_LAZY_EXTRA = rng.random() < 0.8, rng.random() < 0.8
    kr.WARP_ROWS_LEAN = rng.random() < 0.5  # its PTX forms on the GPU only (the interpreter runs the plain ones)
    kr.WARP_ROWS_SMEM_KEPT = rng.random() < 0.5  # PTX too: where it applies (DeepSeek-V3's kept lanes, 16-bit logits)
    kr.warp_rows_override, kr.count_fallbacks_into = True, stats
    try:
        with kr.recorded_launches() as seen:
            got = route(x, config, layout, bias=bias, backend="triton")
    finally:
        kr.warp_rows_override, kr.count_fallbacks_into = None, None
        (kr.WARP_ROWS_REPAIR, kr.WARP_ROWS_EXTRA, kr.WARP_ROWS_THREADS, kr.WARP_ROWS_MIXED_KEPT,
         kr.WARP_ROWS_NARROW, kr.WARP_ROWS_GROUP_ROUNDS, kr.WARP_ROWS_LAZY_EXTRA, kr.WARP_ROWS_LEAN,
         kr.WARP_ROWS_SMEM_KEPT) = saved
    want = route(x, config, layout, bias=bias, backend="reference")
    inside = ~outside_domain(x, config)
    wrong = []
    if not torch.equal(got.ids[inside], want.ids[inside]):
        wrong.append("ids")
    if not torch.allclose(got.weights[inside], want.weights[inside], rtol=1e-6, atol=1e-7):
        wrong.append("weights")
    for row in got.ids[~inside].tolist():
        if len(set(row)) != config.top_k or min(row) < 0 or max(row) >= config.num_experts:
            wrong.append("a +inf row's ids")
    kernel = f"rows-on-warps, R={seen[0]['R']} LT={seen[0]['LT']}" if "R" in seen[0] else "router kernel"
    return f"{', '.join(wrong)} ({kernel}; {config}, {x.dtype}, T={x.shape[0]}, row stride {x.stride(0)})" if wrong \
        else ""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=240.0)
    p.add_argument("--seed", type=int, default=0, help="case i has seed SEED + i")
    p.add_argument("--max-tokens", type=int, default=9)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args(argv)
    start, n, failed = time.time(), 0, 0
    stats = torch.zeros(3, dtype=torch.int32, device=a.device)
    while time.time() - start < a.seconds:
        what = run_case(a.seed + n, a.max_tokens, a.device, stats)
        if what:
            failed += 1
            print(f"FAIL seed {a.seed + n}: {what}", flush=True)
        n += 1
    exact, repaired, programs = stats.tolist()
    print(f"{n} cases in {time.time() - start:.0f} s (seeds {a.seed}..{a.seed + n - 1}): {failed} failed; "
          f"programs of the rows-on-warps kernel {programs}, repaired {repaired}, on the exact path {exact}")
    return min(failed, 100)


if __name__ == "__main__":
    sys.exit(main())
