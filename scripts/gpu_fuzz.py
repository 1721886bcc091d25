"""The fused kernel against the fp32 reference on random configs, layouts and inputs, up to T = 65536, on a GPU.

    python scripts/gpu_fuzz.py [--seconds 240] [--seed 0] [--max-tokens 65536] [--cases N] [--force-paths]

The kernel tests run a fixed grid on tie-free logits (multiples of 1/32) and biases in steps of 1/64, at T <= 1024.
The launcher takes other paths at large T (fast keys from T * lanes >= 2^24, the kept-groups rounds, split rows,
two-warp programs, register caps), and real logits are normal draws with ties in bf16 and fp16. Each case here draws:

- a RouterConfig over the contract's knobs at real models' widths (8 to 1024 experts; groups, K up to 32, scorings,
  selection on logits, scale and softcap, renormalization modes, rsf, shared experts, zero experts, hash routing),
  or, one case in three, a real model's (a preset);
- a layout (shared slots none / global / per rank, EP 1-8, EPLB replicas and policies, rsf on the output);
- logits N(0, s^2) with s in {0.3, 1, 4} in fp32 / bf16 / fp16, a few rows with NaN, -inf, +inf or repeated values,
  a quarter of them a view of a wider buffer (rows 8, 24 or 3 elements longer: 16-byte aligned or not);
- a bias like the models' (N(0, 0.1^2), DeepSeek-like offsets of +2, or negative enough to push keys below 0), fp32
  or bf16; T from 1 to --max-tokens; num_valid_tokens absent, an int, or a device scalar.

The kernel writes into poisoned outputs; every element must be written, every row must route to the reference's ids
(a row that differs is run through check_routing, which forgives near-ties within rtol 1e-5 of the keys and nothing
else; a row with a +inf logit, outside the contract's domain, needs only K distinct valid ids), and the weights must
be within 1e-6 relative of the reference's (4e-6 for p-norms, and for softcaps, whose tanh is not torch's).
With --force-paths each case also draws the launcher's overrides (keys, checks, rounds, launch shape: PATH_KNOBS), so
that small launches take the paths the launcher keeps for large T (fast keys, kept-groups rounds, NaN-key dead lanes)
and the ones it has dropped: on the CPU, where T stays small, that is the only way the interpreter sees them. Every
override only forces its path where the launch can take it; the closing summary counts the kernel's constexprs as
launched (APPROX_KEYS, KEPT_ONLY, ...), not what was drawn.

A failing case prints how to rebuild it (its seed); the exit status is the number of failing cases (capped at 100).
A SIGTERM or SIGINT (a `timeout` around the script, a device call's limit) ends the run at once with the summary of
the cases finished, so that a cut run still says what it checked; the case it cut is named and not counted.
"""

import argparse
import collections
import contextlib
import os
import random
import signal
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from moegate import ExpertLayout, ExpertPlacement, RouterConfig, check_routing, preset, preset_names, route  # noqa: E402
from moegate.check import _tie_order_violation  # noqa: E402
from moegate.kernels import router as kr  # noqa: E402
from moegate.reference import outside_domain  # noqa: E402

WIDTHS = (8, 16, 32, 60, 64, 72, 96, 128, 160, 256, 288, 384, 512, 640, 896, 1024)
TOKENS = (1, 2, 7, 33, 64, 200, 1000, 2048, 4096, 5000, 8192, 16384, 32768, 65536)

# --force-paths: the launcher's overrides (moegate.kernels.router) and the values a case draws for each; None is the
# launcher's own choice. Each is a path the kernel keeps, forced where the launch can take it and ignored elsewhere;
# launch_override and split_rows_override are refused (ValueError) where they cannot apply, and are then dropped.
PATH_KNOBS = {
    "approx_keys_override": (None, True, False),
    "approx_repair_override": (None, None, True),
    "fma_keys_override": (None, True, False),
    "logit_keys_override": (None, None, False),
    "force_exact_override": (False,) * 7 + (True,),
    "thread_rows_override": (None, None, False),
    "split_rows_override": (None, None, 0, 2, 4, 8, 16),
    "split_pair_exact_override": (None, True, False),
    "tile_weights_override": (None, True, False),
    "bias_early_override": (None, True, False),
    "winners_in_regs_override": (None, True, False),
    "scalar_checks_override": (None, True, False),
    "kept_only_override": (None, True, False),
    "nan_dead_override": (None, None, False),
    "lean_params_override": (None, None, False),
    "exact32_override": (None, None, None, True),
    "launch_override": (None, None, (1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (4, 1), (64, 2)),
    "cache_rounds_override": (None, None, 0, 2, 3, 4, 5, 6, 7, 8),
    "warp_rows_override": (None, True, True, False),  # the rows-on-warps kernel, where the config allows it
    "trunc_logit_words_override": (None, True, False),
    "logit_span_override": (None, None, 0, 2),
    "shift_words_override": (None, True, False),
    "cache_smem_override": (None, True, False),  # last: the draws above keep their seeds' values
}
# The kernel's constexprs that name a path (--force-paths counts each launch's).
PATH_FLAGS = ("APPROX_KEYS", "APPROX_REPAIR", "FMA_KEYS", "LOGIT_KEYS", "FORCE_EXACT", "TILE_WEIGHTS", "BIAS_EARLY",
              "WINNERS_IN_REGS", "SCALAR_CHECKS", "KEPT_ONLY", "PAIR_EXACT", "EXACT32", "CACHE_DEPTH",
              "TRUNC_LOGIT_WORDS", "SHIFT_WORDS", "CACHE_SMEM")


def draw_paths(seed: int) -> dict:
    """A case's overrides (its own stream: the case's config, layout and inputs are those of the same seed without)."""
    rng = random.Random(f"paths/{seed}")
    return {name: rng.choice(values) for name, values in PATH_KNOBS.items()}


@contextlib.contextmanager
def forced(paths: dict):
    """The launcher's overrides set to ``paths`` inside, restored after."""
    saved = {name: getattr(kr, name) for name in paths}
    try:
        for name, value in paths.items():
            setattr(kr, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(kr, name, value)


def launch_tags(kwargs: dict) -> list[str]:
    """A launch's path from its constexprs: the row layout, then each path flag that is on."""
    if "LT" in kwargs:  # the rows-on-warps kernel (kernels/warp_rows_kernel.py)
        return [f"a-row-a-warp-{kwargs['R']}x{kwargs['NC']}x{kwargs['LT']}"] + ["KEPT"] * bool(kwargs["KEPT"]) + [
            "FORCE_EXACT"] * bool(kwargs["FORCE_EXACT"])
    if kwargs["THREAD_ROWS"]:
        layout = "thread-rows"
    elif kwargs["SPLIT_ROWS"]:
        layout = f"split-rows-{kwargs['SPLIT_ROWS']}"
    else:
        layout = f"rows-on-warps-{kwargs['BLOCK_M']}x{kwargs['num_warps']}"
    tags = [layout] + [flag for flag in PATH_FLAGS if kwargs[flag]]
    return tags + ["ROW_SUM_DEAD"] * (not kwargs["NAN_DEAD_OK"])


def draw_config(rng: random.Random, max_width: int) -> RouterConfig:
    """A valid config (draws again where RouterConfig refuses a combination); a third of them a real model's
    (moegate's presets: the launcher's paths for Qwen3, Mixtral, DeepSeek, LongCat ... at their own widths)."""
    models = [c for c in map(preset, preset_names()) if c.num_scored <= max_width]
    if models and rng.random() < 1 / 3:
        return rng.choice(models)
    while True:
        try:
            return _draw_config(rng, max_width)
        except ValueError:
            continue


def _draw_config(rng: random.Random, max_width: int) -> RouterConfig:
    W = rng.choice([w for w in WIDTHS if w <= max_width])
    zero = rng.choice((0,) * 9 + (min(W // 4, 64),)) if W >= 16 else 0
    groups = [g for g in (1, 2, 4, 8, 16, 32) if W % g == 0 and W // g >= 2] if not zero else [1]
    n_group = rng.choice(groups + [1] * len(groups))
    topk_group = rng.randint(1, n_group)
    E = W - zero
    routing = "hash" if (not zero and rng.random() < 0.05) else "topk"
    max_k = topk_group * (W // n_group) if n_group > 1 else W
    K = rng.randint(1, min(32, max_k, E if routing == "hash" else max_k))
    scoring = rng.choice(("softmax", "sigmoid", "sigmoid", "sqrtsoftplus"))
    p = rng.choice((1.0,) * 9 + (2.0,))
    return RouterConfig(
        E, K, scoring=scoring,
        selection=rng.choice(("scores",) * 9 + ("logits",)),
        logit_scale=rng.choice((1.0,) * 9 + (0.5,)),
        softcap=rng.choice((None,) * 9 + (30.0,)),
        has_correction_bias=rng.random() < (0.3 if scoring == "softmax" else 0.8),
        n_group=n_group, topk_group=topk_group,
        group_score=rng.choice(("top2_sum", "top2_sum", "max")),
        group_fill=rng.choice(("exclude",) * 4 + ("zero",)),
        renormalize=rng.random() < 0.7,
        renorm_eps=rng.choice((1e-20, 1e-20, 0.0, 1e-6)),
        renorm_eps_mode=rng.choice(("add",) * 4 + ("clamp",)),
        renorm_p=p,
        routed_scaling_factor=rng.choice((1.0, 2.5, 2.827, 0.5)),
        num_shared_experts=rng.choice((0, 0, 1, 2)),
        routing=routing,
        has_expert_scale=not zero and rng.random() < 0.1,
        num_zero_experts=zero,
    )


def draw_layout(rng: random.Random, config: RouterConfig) -> tuple[ExpertLayout, int]:
    E = config.num_experts
    shared = rng.choice(("none", "global", "per_rank")) if config.num_shared_experts else "none"
    if config.num_zero_experts:  # zero experts take the default layout
        return ExpertLayout(), 0
    placement = None
    if rng.random() < 0.3:
        extra = [rng.randrange(E) for _ in range(rng.choice((1, 8, E // 4 or 1)))]
        table = list(range(E)) + extra
        rng.shuffle(table)
        placement = ExpertPlacement(tuple(table), E)
    P = E if placement is None else placement.num_physical
    ep = rng.choice([d for d in (1, 2, 4, 8) if P % d == 0])
    layout = ExpertLayout(shared_slots=shared, ep_size=ep, placement=placement,
                          replica_policy=rng.choice(("round_robin", "home_rank", "first")),
                          scale=rng.choice(("in_weights",) * 3 + ("on_output",)))
    return layout, rng.randrange(ep)


def draw_inputs(rng: random.Random, config: RouterConfig, T: int, device: str) -> dict:
    g = torch.Generator(device=device).manual_seed(rng.randrange(2**31))
    W = config.num_scored
    dtype = rng.choice((torch.float32, torch.float32, torch.bfloat16, torch.float16))
    x = torch.randn(T, W, generator=g, device=device) * rng.choice((0.3, 1.0, 4.0))
    if T >= 4 and rng.random() < 0.3:  # a few special rows
        rows = torch.randint(0, T, (max(1, T // 500),), generator=g, device=device)
        kind = rng.choice(("nan", "-inf", "+inf", "repeat"))
        cols = torch.randint(0, W, (rows.numel(), max(1, W // 8)), generator=g, device=device)
        value = {"nan": float("nan"), "-inf": float("-inf"), "+inf": float("inf"), "repeat": 0.75}[kind]
        x[rows[:, None], cols] = value
    kw = {"logits": x.to(dtype)}
    if config.has_correction_bias:
        b = torch.randn(W, generator=g, device=device) * 0.1
        b = b + rng.choice((0.0, 0.0, 2.0, -1.5))
        kw["bias"] = b.to(rng.choice((torch.float32, torch.float32, torch.bfloat16)))
    if config.has_expert_scale:
        kw["expert_scale"] = 0.5 + torch.rand(config.num_experts, generator=g, device=device)
    if config.routing == "hash":
        vocab = 97
        kw["hash_table"] = torch.rand(vocab, config.num_experts, generator=g, device=device).argsort(dim=1)[
            :, : config.top_k].to(torch.int32)
        kw["token_ids"] = torch.randint(0, vocab, (T,), generator=g, device=device)
    nv = rng.choice((None, None, "int", "tensor"))
    if nv is not None:
        n = rng.randint(0, T)
        kw["num_valid_tokens"] = n if nv == "int" else torch.tensor([n], device=device)
    kw["logits"] = padded_view(kw["logits"], rng.choice(ROW_PADS))
    return kw


# A quarter of the cases route a view of a wider buffer: rows 8 or 24 elements longer (16-byte aligned in every dtype)
# or 3 longer (not aligned). scripts/warp_rows_fuzz.py draws the same.
ROW_PADS = (0, 0, 0, 8, 24, 3)


def padded_view(x: torch.Tensor, pad: int) -> torch.Tensor:
    """x [T, W] as a view of rows pad elements wider (the padding NaN, never read); x itself where pad is 0."""
    if not pad:
        return x
    wide = torch.full((x.shape[0], x.shape[1] + pad), float("nan"), dtype=x.dtype, device=x.device)
    wide[:, : x.shape[1]] = x
    return wide[:, : x.shape[1]]


def case_tags(seed: int, max_tokens: int, max_width: int = max(WIDTHS), min_tokens: int = 1) -> list[str]:
    """What a case covers (the run's closing summary counts these with its launch's launch_tags): the case is drawn
    again from its seed, as run_case draws it."""
    rng = random.Random(seed)
    config = draw_config(rng, max_width)
    draw_layout(rng, config)
    T = rng.choice([t for t in TOKENS if min_tokens <= t <= max_tokens])
    bg, bgs = kr._tile_shape(config)
    tags = [config.scoring, "grouped" if config.n_group > 1 else "ungrouped",
            "preset" if config in {preset(n) for n in preset_names()} else "drawn"]
    tags += ["T>=4096"] * (T >= 4096) + ["T*lanes>=2^24"] * (T * bg * bgs >= kr.APPROX_KEYS_MIN_LANE_ROWS)
    tags += ["hash"] * (config.routing == "hash") + ["logits-selection"] * (config.selection == "logits")
    return tags


def run_case(seed: int, max_tokens: int, device: str, max_width: int = max(WIDTHS), min_tokens: int = 1,
             paths: dict | None = None, seen: list | None = None) -> tuple[str, str | None]:
    """(description, None) when the kernel routes like the reference, else (description, what differs). ``paths``:
    the launcher's overrides for the kernel's launch (an override the launcher refuses for this case is dropped);
    ``seen`` gets the launch's constexprs."""
    rng = random.Random(seed)
    config = draw_config(rng, max_width)
    layout, home_rank = draw_layout(rng, config)
    T = rng.choice([t for t in TOKENS if min_tokens <= t <= max_tokens])
    kw = draw_inputs(rng, config, T, device)
    logits = kw.pop("logits")
    nv = kw.get("num_valid_tokens")
    desc = (f"seed={seed} T={T} {str(logits.dtype)[6:]} row stride {logits.stride(0)} {config} {layout} "
            f"home_rank={home_rank} "
            f"bias={None if 'bias' not in kw else str(kw['bias'].dtype)[6:]} num_valid={nv if nv is None else int(nv)}")
    width = config.top_k + layout.num_shared_columns(config.num_shared_experts)
    out = (torch.full((T, width), float("nan"), device=device), torch.full((T, width), -7, dtype=torch.int32,
                                                                          device=device))
    paths = dict(paths or {})
    while True:
        try:
            with forced(paths), kr.recorded_launches() as launched:
                got = route(logits, config, layout, backend="triton", out=out, home_rank=home_rank, **kw)
            break
        except ValueError as exc:  # an override this launch cannot take: the case runs without it
            refused = [name for name in paths if paths[name] is not None and f"{name}=" in str(exc)]
            if not refused:
                raise
            for name in refused:
                paths[name] = None
    if seen is not None:
        seen.extend(launched)
    forced_now = {name: value for name, value in paths.items()
                  if value is not None and not (name == "force_exact_override" and value is False)}
    if forced_now:
        desc += " forced " + " ".join(f"{name.removesuffix('_override')}={value}" for name, value in
                                     sorted(forced_now.items()))
    want = route(logits, config, layout, backend="reference", home_rank=home_rank, **kw)
    gw, gi, ww, wi = got.weights, got.ids, want.weights.float(), want.ids
    if (gi == -7).any():
        return desc, "an output id was never written"
    padded = torch.arange(T, device=device) >= (T if nv is None else int(nv))
    if not ((gi[padded] == -1).all() and (gw[padded] == 0).all()):
        return desc, f"padded rows not -1 / 0 exactly: {padded.nonzero().flatten()[:4].tolist()}"
    # Rows with a +inf logit are outside the domain: K distinct valid ids, weights unspecified (NaN allowed).
    undefined = outside_domain(logits, config) & ~padded
    if torch.isnan(gw[~undefined]).any():
        return desc, "an output weight was never written"
    differ = ~(gi == wi).all(dim=1) & ~padded & ~undefined
    if int(differ.sum()) > max(16, T // 50):  # near-ties are rare on these draws: more is a wrong routing
        r = int(differ.nonzero()[0])
        return desc, (f"{int(differ.sum())} of {T} rows differ from the reference (row {r}: kernel {gi[r].tolist()} "
                      f"reference {wi[r].tolist()})")
    tie = _tie_order_violation(gi, logits, config, layout, kw.get("bias"), differ.nonzero().flatten())
    if tie is not None:
        return desc, tie
    rows = (differ | undefined).nonzero().flatten()
    # check_routing numbers the rows it is given as tokens 0, 1, ...; round robin gives token t replica t % count, so
    # with a placement (and a policy other than "first") the rows go in as the launch's prefix up to the last of them,
    # not gathered (seed 60587 on the CPU: a +inf row 15 gathered as row 0 took "the wrong replica").
    by_token = layout.placement is not None and layout.replica_policy != "first"
    parts = ([torch.arange(int(rows.max()) + 1, device=rows.device)] if by_token and len(rows)
             else [rows[lo:lo + 4096] for lo in range(0, len(rows), 4096)])
    for part in parts:  # every such row through check_routing: near-ties forgiven, nothing else
        sub = {k: (v[part] if k == "token_ids" else v).cpu() for k, v in kw.items() if k != "num_valid_tokens"}
        if by_token and nv is not None:
            sub["num_valid_tokens"] = min(int(nv), len(part))
        found = check_routing(gw[part].cpu(), gi[part].cpu(), config, layout, logits=logits[part].cpu(),
                              home_rank=home_rank, **sub)
        if found:
            where = ""
            if found[0].row >= 0:
                r = int(part[found[0].row])
                where = f" (row {r}: kernel {gi[r].tolist()} reference {wi[r].tolist()})"
            return desc, f"{len(rows)} rows differ from the reference; check_routing on them: {found[0]}{where}"
    same = ~(differ | undefined) & ~padded
    # p-norms: 4e-6, as the kernel tests. Softcaps: the kernel's tanh (numpy's in the interpreter, libdevice's on a
    # GPU) is an ulp or two off torch's at times, and c and the softmax's exp amplify that to ~2e-6 (CPU seed 20044:
    # 1.8e-6, without the softcap 2.3e-7; H200 run 108, seed 6004, c = 30: 1.6e-6).
    rtol = 4e-6 if config.renorm_p != 1.0 or config.softcap is not None else 1e-6
    err = (gw[same] - ww[same]).abs() - (1e-7 + rtol * ww[same].abs())
    if err.numel() and float(err.max()) > 0:
        r, c = divmod(int(err.argmax()), width)
        row = int(same.nonzero().flatten()[r])
        return desc, (f"weights off by more than rtol {rtol}: row {row} column {c}: {float(gw[row, c]):.9g} against "
                      f"{float(ww[row, c]):.9g}")
    return desc, None


class _Cut(BaseException):
    """Raised by the SIGTERM / SIGINT handler; a BaseException, so that a case's `except Exception` lets it by."""


def _cut(signum, frame):
    raise _Cut(signal.Signals(signum).name)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=240.0, help="stop drawing new cases after this long")
    p.add_argument("--cases", type=int, default=None, help="at most this many cases")
    p.add_argument("--seed", type=int, default=0, help="case i has seed SEED + i")
    p.add_argument("--max-tokens", type=int, default=65536)
    p.add_argument("--min-tokens", type=int, default=1, help="e.g. 16384: only the launches of the fast keys' range")
    p.add_argument("--max-width", type=int, default=max(WIDTHS),
                   help="widest logits row drawn (experts + zero experts)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cpu: the kernel under TRITON_INTERPRET=1 (set it before starting; keep --max-tokens small)")
    p.add_argument("--force-paths", action="store_true",
                   help="each case also draws the launcher's overrides (PATH_KNOBS): keys, checks, launch shape")
    a = p.parse_args(argv)
    start, failures, n, covered, cut = time.time(), [], 0, collections.Counter(), ""
    handlers = {sig: signal.signal(sig, _cut) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while time.time() - start < a.seconds and (a.cases is None or n < a.cases):
            seed = a.seed + n
            seen = []
            try:
                desc, problem = run_case(seed, a.max_tokens, a.device, a.max_width, a.min_tokens,
                                         draw_paths(seed) if a.force_paths else None, seen)
            except Exception as exc:  # a refused config is a result too: say which
                desc, problem = f"seed={seed}" + " (forced paths)" * a.force_paths, f"{type(exc).__name__}: {exc}"
            if problem is not None:
                failures.append((desc, problem))
                print(f"FAIL {desc}\n     {problem}", flush=True)
            covered.update(case_tags(seed, a.max_tokens, a.max_width, a.min_tokens))
            covered.update(tag for kwargs in seen for tag in launch_tags(kwargs))
            n += 1
    except _Cut as sig:
        cut = f"; cut by {sig} in seed {a.seed + n}, not counted"
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    print(f"{n} cases in {time.time() - start:.0f} s (seeds {a.seed}..{a.seed + n - 1}, "
          f"T {a.min_tokens}..{a.max_tokens}): {len(failures)} failed{cut}", flush=True)
    print("covered: " + ", ".join(f"{tag} {count}" for tag, count in sorted(covered.items())))
    return min(len(failures), 100)


if __name__ == "__main__":
    sys.exit(main())
