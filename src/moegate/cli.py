"""The moegate command: see, check and measure routing from the terminal.

    moegate route                 route a seeded synthetic batch for the default preset, on the CPU
    moegate route --preset qwen3-moe --tokens 100000 --ep-size 8 --plot load.png --record cap.safetensors
    moegate check cap.safetensors validate a RoutingRecorder capture (exit 0 / 1)
    moegate presets               the named configs
    moegate show deepseek-v3      a RouterConfig spelled out in words (or: moegate show path/to/config.json)
    moegate env                   versions, GPU, the backend "auto" picks
    moegate bench ...             moegate.bench.main(argv)

Every command takes ``--json`` for machine-readable output on stdout (``bench``: see its own help).
Bad arguments give one line, ``moegate: error: ...``, and exit code 2; ``check`` and ``route`` exit 1
when the routing breaks an invariant.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from moegate.capture import RoutingRecorder, _capture_row_violations, _Found
from moegate.check import Violation, check_routing, logical_routed_ids
from moegate.config import RouterConfig
from moegate.hf import from_hf_config
from moegate.layout import SCALE_MODES, SHARED_SLOTS, ExpertLayout
from moegate.presets import DEFAULT_PRESET, preset, preset_names
from moegate.router import BACKENDS, resolve_backend, route
from moegate.synthetic import (
    bias_std,
    synthetic_bias,
    synthetic_expert_scale,
    synthetic_hash_table,
    synthetic_logits,
    synthetic_token_ids,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_TOKENS = 4096
DEFAULT_CHUNK_TOKENS = 8192
DEFAULT_VERIFY_ROWS = 4096
MAX_LISTED_VIOLATIONS = 20
SPARK = "▁▂▃▄▅▆▇█"
# Buckets of load / mean load for the expert-load histogram.
LOAD_BUCKETS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, math.inf)


class CliError(ValueError):
    """A bad argument found by the CLI itself (reported like moegate's own ValueErrors)."""


class _UsageError(Exception):
    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line and exit code 2 (no usage block)."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        raise _UsageError(self.prog, message)


# --------------------------------------------------------------------------------------------------
# Configs in words


def _num(value: float) -> str:
    return f"{value:g}"


def _experts(n: int) -> str:
    return f"{n} expert" + ("" if n == 1 else "s")


def describe(config: RouterConfig) -> str:
    """One sentence, in pipeline order: what the routing function computes.

    e.g. ``softmax over 128 experts, top-8 on the scores, renormalised (eps 0), no scaling``.
    """
    parts = []
    if config.logit_scale != 1.0:
        parts.append(f"logits x {_num(config.logit_scale)}")
    if config.softcap is not None:
        parts.append(f"softcap {_num(config.softcap)}")
    over = _experts(config.num_experts)
    if config.num_zero_experts:
        over += f" + {config.num_zero_experts} zero (identity) experts"
    parts.append(f"{config.scoring} over {over}")
    if config.routing == "hash":
        parts.append(f"{config.top_k} experts per token from a hash table of token ids")
    else:
        if config.n_group > 1:
            rule = "sum of top-2" if config.group_score == "top2_sum" else "max"
            rest = "others excluded" if config.group_fill == "exclude" else "others' keys set to 0"
            parts.append(f"{config.n_group} groups of {config.group_size} (group score: {rule}; "
                         f"keep {config.topk_group}, {rest})")
        on = "the scores" if config.selection == "scores" else "the raw logits"
        if config.has_correction_bias:
            on += " + correction bias"
        parts.append(f"top-{config.top_k} on {on}")
    parts.append(_renorm_words(config))
    if config.has_expert_scale:
        parts.append("x per-expert scale")
    rsf = config.routed_scaling_factor
    parts.append("no scaling" if rsf == 1.0 else f"routed scaling {_num(rsf)}")
    if config.num_shared_experts:
        parts.append(f"{config.num_shared_experts} shared expert" + ("" if config.num_shared_experts == 1 else "s")
                     + ("" if config.shared_expert_scale == 1.0 else f" x {_num(config.shared_expert_scale)}"))
    if config.weight_on_input:
        parts.append("weights applied to the experts' inputs")
    return ", ".join(parts)


def _renorm_words(config: RouterConfig) -> str:
    if not config.renormalize:
        return "not renormalised"
    norm = "" if config.renorm_p == 1.0 else f"L{_num(config.renorm_p)} norm, "
    eps = _num(config.renorm_eps)
    eps = f"max(norm, {eps})" if config.renorm_eps_mode == "clamp" else f"eps {eps}"
    return f"renormalised ({norm}{eps})"


def explain(config: RouterConfig) -> list[tuple[str, str]]:
    """The pipeline of the contract (docs/contract.md) for this config, step by step, as (step, what it does) pairs."""
    steps = []
    x = "x = logits"
    if config.logit_scale != 1.0:
        x += f" * {_num(config.logit_scale)}"
    if config.softcap is not None:
        c = _num(config.softcap)
        x += f", then {c} * tanh(x / {c})"
    steps.append(("1 logits", x if x != "x = logits" else "x = logits, unchanged"))
    width = config.num_scored
    zero = f" ({config.num_experts} real + {config.num_zero_experts} zero experts)" if config.num_zero_experts else ""
    scores = {
        "softmax": f"s = softmax(x) over the {width} experts{zero} (max-subtracted)",
        "sigmoid": f"s = sigmoid(x), each of the {width} experts{zero} on its own",
        "sqrtsoftplus": f"s = sqrt(softplus(x)), each of the {width} experts{zero} on its own",
    }[config.scoring]
    steps.append(("2 scores", scores))
    if config.routing == "hash":
        steps.append(("3-5 selection", f"ids = hash_table[token_id]: {config.top_k} experts per token id, "
                                       "the scores only weight them"))
    else:
        key = "the scores s" if config.selection == "scores" else "the raw logits x (top-k first, activation after)"
        if config.has_correction_bias:
            key += " + the correction bias (selection only: weights stay unbiased)"
        steps.append(("3 key", key + "; NaN logits count as -inf"))
        if config.n_group > 1:
            rule = "the sum of its 2 largest keys" if config.group_score == "top2_sum" else "its largest key"
            rest = ("the others' experts are never selected" if config.group_fill == "exclude"
                    else "the others' keys become 0.0 and still compete")
            steps.append(("4 groups", f"{config.n_group} groups of {config.group_size}; group score = {rule}; "
                                      f"the {config.topk_group} best groups are kept, {rest}"))
        else:
            steps.append(("4 groups", "none (one group)"))
        steps.append(("5 selection", f"the {config.top_k} largest keys, ordered by key, ties to the lower id"))
    weights = "w = s[id] (unbiased scores)"
    if config.renormalize:
        norm = "their sum" if config.renorm_p == 1.0 else f"their L{_num(config.renorm_p)} norm"
        if config.renorm_eps_mode == "clamp":
            weights += f", divided by max({norm}, {_num(config.renorm_eps)})"
        else:
            weights += f", divided by {norm} + {_num(config.renorm_eps)}"
    else:
        weights += ", not renormalised"
    if config.has_expert_scale:
        weights += ", times the expert's scale"
    if config.weight_on_input:
        weights += "; the model multiplies each selected expert's input by its weight (expert(h * w)), not its output"
    steps.append(("6-7 weights", weights))
    rsf = config.routed_scaling_factor
    steps.append(("8 scaling", "none (rsf 1)" if rsf == 1.0 else
                  f"x {_num(rsf)} (routed_scaling_factor) exactly once: in the weights (scale='in_weights') "
                  "or on the MoE output (scale='on_output')"))
    S = config.num_shared_experts
    scale = config.shared_expert_scale
    weight = "weight 1 (1/rsf" if scale == 1.0 else f"weight {_num(scale)} (shared_expert_scale; {_num(scale)}/rsf"
    steps.append(("10 shared", "none" if S == 0 else
                  f"{S} shared expert{'' if S == 1 else 's'} always on, {weight} with scale='on_output'); "
                  "columns appear only with shared_slots='global' or 'per_rank'"))
    return steps


# --------------------------------------------------------------------------------------------------
# Inputs: configs, tensors from files, devices


def _config_path(path: str) -> Path:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise FileNotFoundError(f"no config.json at {path}")
    return p


def load_config(preset_name: str | None, hf_config: str | None, layer: int | None = None) -> tuple[RouterConfig, str]:
    """(config, where it came from): a preset name, a config.json (or a folder holding one), or the default.
    ``layer``: the decoder layer of a config.json whose layers route differently (``from_hf_config(layer=)``)."""
    if preset_name is not None and hf_config is not None:
        raise CliError("give --preset or --hf-config, not both")
    if layer is not None and hf_config is None:
        raise CliError("--layer picks a decoder layer of --hf-config (a preset is one layer's routing)")
    if hf_config is not None:
        path = _config_path(hf_config)
        try:
            return from_hf_config(path, layer=layer), str(path) + ("" if layer is None else f", layer {layer}")
        except json.JSONDecodeError as exc:
            raise CliError(f"{path}: not valid JSON ({exc})") from None
        except KeyError as exc:
            raise CliError(f"{path}: the config lacks the field {exc}") from None
        except ValueError as exc:  # the library's hint names its argument; here that is an option
            if "layer=" not in str(exc):
                raise
            raise CliError(str(exc).replace("layer=", "--layer N")) from None
    name = DEFAULT_PRESET if preset_name is None else preset_name
    return preset(name), f"preset {name}"


def load_tensor(path: str, key: str | None = None, prefer: tuple[str, ...] = (),
                option: str = "the key option") -> torch.Tensor:
    """A tensor from a .safetensors, .pt/.pth or .npy file.

    A file holding several tensors needs ``key`` (the command line's ``option``), or one of the names in
    ``prefer``, or exactly one tensor.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    suffix = p.suffix.lower()
    try:
        if suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(p), framework="pt") as f:
                name = _pick_key(path, list(f.keys()), key, prefer, option)
                return f.get_tensor(name)
        if suffix in (".pt", ".pth"):
            obj = torch.load(str(p), map_location="cpu", weights_only=True)
            if isinstance(obj, torch.Tensor):
                if key is not None:
                    raise CliError(f"{path} holds a single tensor; drop the key {key!r}")
                return obj
            if isinstance(obj, dict):
                tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
                return tensors[_pick_key(path, list(tensors), key, prefer, option)]
            raise CliError(f"{path} holds a {type(obj).__name__}, not a tensor or a dict of tensors")
        if suffix == ".npy":
            import numpy as np

            if key is not None:
                raise CliError(f"{path}: a .npy file holds one array; drop the key {key!r}")
            return torch.from_numpy(np.load(str(p), allow_pickle=False).copy())
    except CliError:
        raise
    except Exception as exc:  # each format raises its own error types for a corrupt file
        raise CliError(f"{path}: cannot read the tensor ({type(exc).__name__}: {exc})") from None
    raise CliError(f"{path}: unknown file type {suffix!r}; use .safetensors, .pt or .npy")


def _pick_key(path: str, names: list[str], key: str | None, prefer: tuple[str, ...], option: str) -> str:
    if key is not None:
        if key not in names:
            raise CliError(f"{path} has no tensor {key!r}; it has {sorted(names)}")
        return key
    for name in prefer:
        if name in names:
            return name
    if len(names) == 1:
        return names[0]
    raise CliError(f"{path} holds {len(names)} tensors {sorted(names)}; pick one with {option}")


PLOT_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")
PIPE_CLOSED = 141  # the exit code when stdout's reader closed it early (128 + SIGPIPE)


def _check_writable(path: str, option: str) -> None:
    """An output file's folder exists and can be written, checked before the run rather than after it."""
    if not path or Path(path).is_dir():
        raise CliError(f"{option} {path!r}: give a file name, not a folder")
    folder = Path(path).resolve().parent
    if not folder.is_dir():
        raise CliError(f"{option} {path}: no folder {folder}")
    if not os.access(folder, os.W_OK):
        raise CliError(f"{option} {path}: the folder {folder} is not writable")


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise CliError(f"--device must be cpu, cuda, cuda:N or auto, got {name!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise CliError(f"--device must be cpu, cuda, cuda:N or auto, got {name!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CliError(f"--device {name}: torch {torch.__version__} sees no CUDA device")
    return device


# --------------------------------------------------------------------------------------------------
# moegate route


@dataclass
class _Stats:
    """Running totals over the chunks of one route run (host side, float64)."""

    num_scored: int
    load: torch.Tensor = field(init=False)  # [E + Z] routed assignments per logical expert, live rows
    live_rows: int = 0
    w_count: int = 0
    w_sum: float = 0.0
    w_sumsq: float = 0.0
    w_min: float = math.inf
    w_max: float = -math.inf
    rowsum_sum: float = 0.0
    rowsum_min: float = math.inf
    rowsum_max: float = -math.inf
    top1_sum: float = 0.0
    shared_weights: list[float] | None = None
    violations: list[Violation] = field(default_factory=list)  # the first MAX_LISTED_VIOLATIONS
    num_violations: int = 0
    reference_rows: int = 0

    def __post_init__(self) -> None:
        self.load = torch.zeros(self.num_scored, dtype=torch.int64)

    def update(self, weights: torch.Tensor, ids: torch.Tensor, config: RouterConfig, layout: ExpertLayout,
               num_valid: int) -> None:
        K = config.top_k
        w = weights[:num_valid].double().cpu()  # [V, K + C]
        logical = logical_routed_ids(ids[:num_valid, :K].cpu(), config, layout)  # [V, K]
        self.load += torch.bincount(logical[logical >= 0].flatten(), minlength=self.num_scored)[: self.num_scored]
        self.live_rows += num_valid
        if num_valid == 0:
            return
        routed = w[:, :K]  # [V, K]
        rowsum = routed.sum(dim=1)  # [V]
        self.w_count += routed.numel()
        self.w_sum += float(routed.sum())
        self.w_sumsq += float((routed * routed).sum())
        self.w_min = min(self.w_min, float(routed.min()))
        self.w_max = max(self.w_max, float(routed.max()))
        self.rowsum_sum += float(rowsum.sum())
        self.rowsum_min = min(self.rowsum_min, float(rowsum.min()))
        self.rowsum_max = max(self.rowsum_max, float(rowsum.max()))
        self.top1_sum += float(routed[:, 0].sum())
        if self.shared_weights is None and w.shape[1] > K:
            self.shared_weights = [float(v) for v in w[0, K:]]


def _ratio(a: float, b: float) -> float | None:
    return None if b == 0 else a / b


def _load_summary(stats: _Stats, config: RouterConfig, layout: ExpertLayout) -> dict:
    E = config.num_experts
    load = stats.load[:E].double()  # [E]
    mean = float(load.mean())
    hottest = torch.argsort(load, descending=True, stable=True)[:5].tolist()
    coldest = torch.argsort(load, stable=True)[:5].tolist()
    L = E // layout.ep_size
    per_rank = load.view(layout.ep_size, L).sum(dim=1) if E % layout.ep_size == 0 else load.sum().view(1)
    rank_mean = float(per_rank.mean())
    out = {
        "per_expert": [int(v) for v in stats.load[:E]],
        "mean": mean,
        "expert_max_over_mean": _ratio(float(load.max()), mean),
        "expert_min_over_mean": _ratio(float(load.min()), mean),
        "cold_experts": int((load == 0).sum()),
        "hottest": [[e, int(load[e])] for e in hottest],
        "coldest": [[e, int(load[e])] for e in coldest],
        "per_rank": [int(v) for v in per_rank],
        "rank_max_over_mean": _ratio(float(per_rank.max()), rank_mean),
    }
    if config.num_zero_experts:
        zero = int(stats.load[E:].sum())
        out["per_zero_expert"] = [int(v) for v in stats.load[E:]]
        out["zero_expert_share"] = _ratio(zero, float(stats.load.sum()))
    return out


def _weight_summary(stats: _Stats) -> dict:
    if stats.w_count == 0:
        return {"routed_min": None, "routed_mean": None, "routed_max": None, "routed_std": None,
                "row_sum_min": None, "row_sum_mean": None, "row_sum_max": None, "first_column_mean": None,
                "shared": stats.shared_weights}
    mean = stats.w_sum / stats.w_count
    var = max(stats.w_sumsq / stats.w_count - mean * mean, 0.0)
    return {
        "routed_min": stats.w_min,
        "routed_mean": mean,
        "routed_max": stats.w_max,
        "routed_std": math.sqrt(var),
        "row_sum_min": stats.rowsum_min,
        "row_sum_mean": stats.rowsum_sum / stats.live_rows,
        "row_sum_max": stats.rowsum_max,
        "first_column_mean": stats.top1_sum / stats.live_rows,
        "shared": stats.shared_weights,
    }


def progress_bar(console=None, enabled: bool = True, unit: str = "tokens"):
    """The rich progress bar moegate uses (on stderr, removed when done): ``with progress_bar() as p: ...``.

    For anything that may run longer than a second; benchmarks can reuse it.
    """
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn(unit),
        TimeElapsedColumn(), TimeRemainingColumn(), console=console or _console(stderr=True), transient=True,
        disable=not enabled,
    )


def _route_inputs(args, config: RouterConfig, device: torch.device):
    """(logits source, file logits or None, T, bias, expert_scale, hash_table, token_ids or None, notes)."""
    notes = {}
    file_logits = None
    if args.logits_key is not None and args.logits is None:
        raise CliError("--logits-key names a tensor of --logits; give --logits FILE")
    if args.bias_key is not None and args.bias is None:
        raise CliError("--bias-key names a tensor of --bias; give --bias FILE")
    if args.logits is not None:
        file_logits = load_tensor(args.logits, args.logits_key, prefer=("logits", "router_logits"),
                                  option="--logits-key")
        if file_logits.dim() < 2:
            raise CliError(f"{args.logits}: logits must be [..., {config.num_scored}], got {tuple(file_logits.shape)}")
        file_logits = file_logits.reshape(-1, file_logits.shape[-1])
        if args.dtype is not None:
            file_logits = file_logits.to(DTYPES[args.dtype])
        elif file_logits.dtype == torch.float64:
            file_logits = file_logits.float()
        rows = file_logits.shape[0]
        if rows == 0:
            raise CliError(f"{args.logits}: no rows to route (shape {tuple(file_logits.shape)})")
        if args.tokens is not None and args.tokens > rows:
            raise CliError(f"--tokens {args.tokens}: {args.logits} has only {rows} rows")
        T = rows if args.tokens is None else args.tokens
        file_logits = file_logits[:T]
        source = args.logits
    else:
        T = DEFAULT_TOKENS if args.tokens is None else args.tokens
        source = f"synthetic (seed {args.seed}, skew {_num(args.skew)})"
        synthetic_logits(0, config.num_scored, args.seed, args.skew)  # validates seed and skew up front
    bias = expert_scale = hash_table = token_ids = None
    if config.has_correction_bias:
        if args.bias is not None:
            bias = load_tensor(args.bias, args.bias_key, prefer=("bias", "e_score_correction_bias"),
                               option="--bias-key")
            if not (bias.dim() == 1 or (bias.dim() == 2 and bias.shape[0] == 1)):
                raise CliError(f"--bias {args.bias}: a bias is [{config.num_scored}] (or [1, {config.num_scored}]), "
                               f"got {tuple(bias.shape)}")
            bias = bias.reshape(-1)
            if bias.dtype == torch.float64:
                bias = bias.float()
            notes["bias"] = args.bias
        else:
            std = bias_std(config)
            bias = synthetic_bias(config.num_scored, args.seed, std=std)
            notes["bias"] = f"synthetic (seed {args.seed}, std {std:.3g})"
        bias = bias.to(device)
    elif args.bias is not None:
        raise CliError("--bias: the config has no correction bias (has_correction_bias=False)")
    if config.has_expert_scale:
        expert_scale = synthetic_expert_scale(config.num_experts, args.seed, device=device)
        notes["expert_scale"] = f"synthetic (seed {args.seed}, 1 + 0.05 * normal)"
    if config.routing == "hash":
        hash_table = synthetic_hash_table(config.num_experts, config.top_k, args.seed, device=device)
        token_ids = synthetic_token_ids(T, args.seed, device=device)
        notes["hash_table"] = f"synthetic (seed {args.seed}, vocab {hash_table.shape[0]})"
    return source, file_logits, T, bias, expert_scale, hash_table, token_ids, notes


def run_route(args) -> dict:
    """Route the batch that ``args`` describes, in chunks; returns the summary (what ``--json`` prints)."""
    config, config_source = load_config(args.preset, args.hf_config, args.layer)
    layout = ExpertLayout(shared_slots=args.shared_slots, ep_size=args.ep_size, scale=args.scale)
    device = _device(args.device)
    if args.plot is not None:
        _check_writable(args.plot, "--plot")
        if Path(args.plot).suffix.lower() not in PLOT_SUFFIXES:
            raise CliError(f"--plot {args.plot}: give a file name ending in one of {', '.join(PLOT_SUFFIXES)} (the "
                           "format is taken from it)")
        _require_matplotlib()
    if args.record is not None:
        _check_writable(args.record, "--record")
    dtype = DTYPES[args.dtype or "float32"]
    source, file_logits, T, bias, expert_scale, hash_table, token_ids, notes = _route_inputs(args, config, device)
    num_valid = T if args.valid_tokens is None else args.valid_tokens
    if not 0 <= num_valid <= T:
        raise CliError(f"--valid-tokens must be in [0, tokens={T}], got {num_valid}")
    chunk = args.chunk_tokens
    K = config.top_k
    recorder = full_ids = None
    if args.record is not None:
        recorder = RoutingRecorder(1, min(chunk, T), K, config.num_scored, device=device)
        full_ids = torch.full((T, K), -1, dtype=torch.int32)

    stats = _Stats(config.num_scored)
    started = time.perf_counter()
    with progress_bar(enabled=T > chunk) as progress:
        task = progress.add_task(f"routing {config_source}", total=T)
        for start in range(0, T, chunk):
            stop = min(start + chunk, T)
            n = stop - start
            if file_logits is not None:
                logits = file_logits[start:stop].to(device)
            else:
                logits = synthetic_logits(n, config.num_scored, args.seed, args.skew, offset=start, dtype=dtype,
                                          device=device)
            tids = None if token_ids is None else token_ids[start:stop]
            valid = min(max(num_valid - start, 0), n)
            weights, ids = route(
                logits, config, layout, bias=bias, num_valid_tokens=valid, home_rank=args.home_rank,
                token_ids=tids, hash_table=hash_table, expert_scale=expert_scale, recorder=recorder,
                backend=args.backend,
            )
            if recorder is not None:
                full_ids[start:stop] = recorder.ids[0, :n].cpu()
            stats.update(weights, ids, config, layout, valid)
            # The first --verify-rows rows are also compared with the fp32 reference (about 0.1 ms a row).
            verified = min(max(args.verify_rows - start, 0), n)
            for lo, hi, against_reference in ((0, verified, True), (verified, n, False)):
                if hi == lo:
                    continue
                part_valid = min(max(valid - lo, 0), hi - lo)
                found = check_routing(
                    weights[lo:hi], ids[lo:hi], config, layout, logits=logits[lo:hi] if against_reference else None,
                    bias=bias, num_valid_tokens=part_valid, home_rank=args.home_rank,
                    token_ids=None if tids is None else tids[lo:hi], hash_table=hash_table, expert_scale=expert_scale,
                )
                stats.reference_rows += part_valid if against_reference else 0
                room = MAX_LISTED_VIOLATIONS - len(stats.violations)
                stats.violations += [v._replace(row=v.row + start + lo if v.row >= 0 else v.row) for v in found[:room]]
                stats.num_violations += len(found)
            progress.advance(task, n)
    seconds = time.perf_counter() - started

    if args.record is not None:
        capture = RoutingRecorder(1, T, K, config.num_scored)
        capture.ids[0].copy_(full_ids)
        capture.num_tokens[0] = T
        try:
            capture.save(args.record)
        except Exception as exc:  # safetensors raises its own error type for I/O failures
            raise CliError(f"--record {args.record}: cannot write the capture ({exc})") from None
    summary = {
        "command": "route",
        "config_source": config_source,
        "semantics": describe(config),
        "config": config.to_dict(),
        "layout": {"shared_slots": layout.shared_slots, "ep_size": layout.ep_size, "scale": layout.scale,
                   "home_rank": args.home_rank},
        "run": {
            "tokens": T, "valid_tokens": num_valid, "padded_tokens": T - num_valid,
            "dtype": str(file_logits.dtype if file_logits is not None else dtype).replace("torch.", ""),
            "device": str(device), "backend": resolve_backend(args.backend, device, config, layout), "logits": source,
            "seed": args.seed, "skew": args.skew if file_logits is None else None, "chunk_tokens": chunk,
            "seconds": seconds, **notes,
        },
        "load": _load_summary(stats, config, layout),
        "weights": _weight_summary(stats),
        "check": {
            "ok": stats.num_violations == 0, "violations": stats.num_violations, "rows": T,
            "reference_rows": stats.reference_rows, "first": [str(v) for v in stats.violations],
        },
        "record": args.record,
        "plot": args.plot,
    }
    if args.plot is not None:
        save_load_plot(summary, args.plot)
    return summary


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CliError("--plot needs matplotlib: pip install 'moegate[plot]'") from None


def save_load_plot(summary: dict, path: str) -> None:
    """The expert-load picture: tokens per expert (coloured by EP rank), the mean, and per-rank totals."""
    _require_matplotlib()
    from matplotlib.figure import Figure

    load = summary["load"]
    per_expert = load["per_expert"]
    ep = summary["layout"]["ep_size"]
    E = len(per_expert)
    L = E // ep if E % ep == 0 else E
    fig = Figure(figsize=(12, 6 if ep > 1 else 4), layout="constrained")
    axes = fig.subplots(2, 1, height_ratios=(3, 1)) if ep > 1 else [fig.subplots()]
    ax = axes[0]
    palette = ("tab:blue", "tab:orange")
    colors = [palette[(e // L) % 2] for e in range(E)]
    ax.bar(range(E), per_expert, width=1.0 if E > 64 else 0.8, color=colors)
    ax.axhline(load["mean"], color="black", linestyle="--", linewidth=1, label=f"mean {load['mean']:.1f}")
    ratio = load["expert_max_over_mean"]
    title = f"{summary['config_source']}: {summary['run']['valid_tokens']} tokens, top-{summary['config']['top_k']}"
    ax.set_title(title + (f"  (max/mean {ratio:.2f})" if ratio is not None else ""))
    ax.set_xlabel("expert (logical id)" + (f", colour = EP rank of {ep}" if ep > 1 else ""))
    ax.set_ylabel("tokens routed")
    ax.set_xlim(-0.5, E - 0.5)
    ax.legend(loc="upper right")
    if ep > 1:
        ranks = axes[1]
        ranks.bar(range(ep), load["per_rank"], color=[palette[r % 2] for r in range(ep)])
        ranks.axhline(sum(load["per_rank"]) / ep, color="black", linestyle="--", linewidth=1)
        ranks.set_xlabel("EP rank")
        ranks.set_ylabel("tokens routed")
        ranks.set_xticks(range(ep))
    fig.savefig(path, dpi=100)


def _fmt(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _ratio_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _spark_rows(load: list[int], per_row: int = 64) -> list[tuple[str, str]]:
    top = max(load) if load else 0
    rows = []
    for start in range(0, len(load), per_row):
        chunk = load[start:start + per_row]
        chars = "".join("·" if v == 0 else SPARK[min(int(v / top * len(SPARK)), len(SPARK) - 1)] for v in chunk)
        rows.append((f"{start}-{start + len(chunk) - 1}", chars))
    return rows


def render_route(summary: dict, console) -> None:
    """The human-readable route summary."""
    from rich.table import Table
    from rich.text import Text

    config, layout, run, load = summary["config"], summary["layout"], summary["run"], summary["load"]
    console.print(Text(f"moegate route: {summary['config_source']}", style="bold"))
    console.print(Text(summary["semantics"], style="italic"))

    table = Table(title="Configuration", show_header=False, title_justify="left")
    table.add_column("field", style="cyan")
    table.add_column("value")
    defaults = RouterConfig(num_experts=config["num_experts"], top_k=config["top_k"]).to_dict()
    for name, value in config.items():
        if name in ("num_experts", "top_k") or value != defaults[name]:
            table.add_row(name, Text(_fmt(value, 6)))
    for name, value in layout.items():
        table.add_row(f"layout.{name}", Text(_fmt(value)))
    table.add_row("tokens", Text(f"{run['tokens']} ({run['valid_tokens']} live, {run['padded_tokens']} padded)"))
    for name in ("logits", "bias", "expert_scale", "hash_table", "dtype", "device", "backend"):
        if name in run:
            table.add_row(name, Text(_fmt(run[name])))
    table.add_row("wall time", Text(f"{run['seconds']:.2f} s, routing and checks ({run['chunk_tokens']} tokens "
                                    "per chunk)"))
    console.print(table)

    per_expert = load["per_expert"]
    E = len(per_expert)
    mean = load["mean"]
    if E <= 32:
        bars = Table(title="Per-expert load", title_justify="left")
        for col, justify in (("expert", "right"), ("tokens", "right"), ("/ mean", "right"), ("", "left")):
            bars.add_column(col, justify=justify)
        top = max(per_expert) or 1
        for e, v in enumerate(per_expert):
            bars.add_row(str(e), str(v), _fmt(v / mean if mean else None, 3), "█" * round(40 * v / top))
        console.print(bars)
    else:
        console.print(Text(f"Per-expert load, by expert id (one character per expert, █ = {max(per_expert)} "
                           "tokens, · = none)", style="bold"))
        for label, chars in _spark_rows(per_expert):
            console.print(Text(f"  {label:>9} ", style="cyan") + Text(chars))
        hist = Table(title="Experts by load / mean load", title_justify="left")
        for col, justify in (("load / mean", "left"), ("experts", "right"), ("", "left")):
            hist.add_column(col, justify=justify)
        counts = _bucket_counts(per_expert, mean)
        most = max(counts) or 1
        for (lo, hi), count in zip(_bucket_bounds(), counts, strict=True):
            label = f">= {_num(lo)}" if hi == math.inf else f"{_num(lo)} - {_num(hi)}"
            hist.add_row(label, str(count), "█" * round(30 * count / most))
        console.print(hist)

    imb = Table(title="Load imbalance", title_justify="left")
    imb.add_column("over", style="cyan")
    imb.add_column("max / mean", justify="right")
    imb.add_column("detail")
    hot = ", ".join(f"{e}: {v}" for e, v in load["hottest"])
    cold = ", ".join(f"{e}: {v}" for e, v in load["coldest"])
    imb.add_row("experts", _ratio_text(load["expert_max_over_mean"]),
                Text(f"mean {mean:.1f} tokens; min/mean {_ratio_text(load['expert_min_over_mean'])}; "
                     f"{load['cold_experts']} without tokens"))
    imb.add_row("  hottest", "", Text(hot))
    imb.add_row("  coldest", "", Text(cold))
    ranks = load["per_rank"]
    imb.add_row(f"EP ranks ({len(ranks)})", _ratio_text(load["rank_max_over_mean"]),
                Text(", ".join(f"r{r}: {v}" for r, v in enumerate(ranks)) if len(ranks) <= 16 else
                     f"max {max(ranks)}, min {min(ranks)}"))
    if "zero_expert_share" in load:
        imb.add_row("zero experts", "", Text(f"{_fmt(load['zero_expert_share'], 3)} of the assignments"))
    console.print(imb)

    w = summary["weights"]
    wt = Table(title="Routed weights (live rows)", title_justify="left")
    for col in ("", "min", "mean", "max", "std"):
        wt.add_column(col, justify="right" if col else "left")
    wt.add_row("per weight", _fmt(w["routed_min"]), _fmt(w["routed_mean"]), _fmt(w["routed_max"]),
               _fmt(w["routed_std"]))
    wt.add_row("row sum", _fmt(w["row_sum_min"], 7), _fmt(w["row_sum_mean"], 7), _fmt(w["row_sum_max"], 7), "")
    wt.add_row("first column", "", _fmt(w["first_column_mean"]), "", "")
    if w["shared"]:
        wt.add_row("shared columns", "", Text(", ".join(_fmt(v) for v in w["shared"])), "", "")
    console.print(wt)

    _render_verdict(summary["check"], console, "check_routing",
                    f"{summary['check']['rows']} rows checked, {summary['check']['reference_rows']} of them "
                    "against the fp32 reference")
    if summary["record"]:
        console.print(Text(f"capture written to {summary['record']} (moegate check {summary['record']})"))
    if summary["plot"]:
        console.print(Text(f"expert-load plot written to {summary['plot']}"))


def _bucket_bounds() -> list[tuple[float, float]]:
    return list(zip(LOAD_BUCKETS[:-1], LOAD_BUCKETS[1:], strict=True))


def _bucket_counts(load: list[int], mean: float) -> list[int]:
    counts = [0] * (len(LOAD_BUCKETS) - 1)
    for v in load:
        r = v / mean if mean else 0.0
        for i, (lo, hi) in enumerate(_bucket_bounds()):
            if lo <= r < hi:
                counts[i] += 1
                break
    return counts


def _render_verdict(check: dict, console, label: str, detail: str) -> None:
    from rich.text import Text

    if check["ok"]:
        console.print(Text(f"{label}: OK ({detail})", style="bold green"))
        return
    console.print(Text(f"{label}: FAILED, {check['violations']} violation(s) ({detail})", style="bold red"))
    for line in check["first"]:
        console.print(Text(f"  {line}"))
    if check["violations"] > len(check["first"]):
        console.print(Text(f"  ... and {check['violations'] - len(check['first'])} more"))


def _cmd_route(args) -> int:
    summary = run_route(args)
    if args.json:
        _print_json(summary)
    else:
        render_route(summary, _console())
    return 0 if summary["check"]["ok"] else 1


# --------------------------------------------------------------------------------------------------
# moegate check


def check_capture(path: str, config: RouterConfig | None = None, max_listed: int = MAX_LISTED_VIOLATIONS) -> dict:
    """Validate a RoutingRecorder file: routed-only width, ids in range, distinct ids, padded rows all -1.

    Returns a summary with ``ok``, the number of violations and the first ``max_listed`` of them in words.
    A file that is not a readable capture is one violation, never an exception.
    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"no such file: {path}")
    summary = {"command": "check", "file": str(path), "ok": False, "layers": [], "violations": 0, "first": []}
    try:
        rec = RoutingRecorder.load(path, validate=False)  # every bad row listed below, not only the first
        meta = _capture_metadata(path)
        E = rec.num_experts if config is None else config.num_scored
        real = E if config is None else config.num_experts  # zero-computation experts (ids >= E real) hold no load
        K = int(meta.get("top_k", rec.top_k)) if config is None else config.top_k
    except (ValueError, TypeError, KeyError) as exc:
        reason = f"{path}: the metadata lacks {exc}" if isinstance(exc, KeyError) else str(exc)
        summary.update(violations=1, first=[reason])
        return summary
    summary.update(num_experts=E, top_k=K, source="metadata" if config is None else "config",
                   num_layers=rec.num_layers, max_tokens=rec.max_tokens)
    found = _Found(max_listed)
    if rec.top_k != K:
        found.add(f"all layers: rows are {rec.top_k} ids wide, but the routing has top_k={K}: a capture holds "
                  "the routed experts only (shared experts are never recorded)")
    if rec.num_experts < E:  # route() takes a recorder of at least the routing's ids, never fewer
        found.add(f"all layers: the capture was made for num_experts={rec.num_experts}, but the routing scores {E} "
                  "experts, more than a recorder of it can hold: the file comes from another model")
    total = 0
    for layer in range(rec.num_layers):
        n = int(rec.num_tokens[layer])
        info = {"layer": layer, "tokens": n, "live_rows": 0, "padded_rows": 0, "violations": 0,
                "max_over_mean": None}
        summary["layers"].append(info)
        if n == -1:
            info["tokens"] = None
            continue
        if not 0 <= n <= rec.max_tokens:
            found.add(f"layer {layer}: num_tokens={n} is outside [0, max_tokens={rec.max_tokens}]")
            info["violations"] = 1
            continue
        ids = rec.ids[layer, :n].long()  # [T, K]
        before = found.count
        _capture_row_violations(ids, E, layer, found)
        live = ((ids >= 0) & (ids < E)).all(dim=1)  # [T]
        info.update(live_rows=int((ids >= 0).all(dim=1).sum()), padded_rows=int((ids == -1).all(dim=1).sum()),
                    violations=found.count - before)
        if bool(live.any()):
            load = torch.bincount(ids[live].flatten(), minlength=E).double()[:real]  # [real experts], as in route
            if float(load.sum()) > 0:  # rows of zero-computation experts only leave the real ones without load
                info["max_over_mean"] = float(load.max() / load.mean())
        total += n
    summary.update(ok=found.count == 0, violations=found.count, first=found.messages, tokens=total)
    return summary


def _capture_metadata(path: str) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return f.metadata() or {}


def _cmd_check(args) -> int:
    config = None
    if args.preset is not None or args.hf_config is not None or args.layer is not None:
        config, _ = load_config(args.preset, args.hf_config, args.layer)
    summary = check_capture(args.file, config)
    if args.json:
        _print_json(summary)
        return 0 if summary["ok"] else 1
    from rich.table import Table
    from rich.text import Text

    console = _console()
    console.print(Text(f"moegate check: {args.file}", style="bold"))
    if summary["layers"]:
        console.print(Text(f"{summary['num_layers']} layer(s), top_k={summary['top_k']}, ids in "
                           f"[0, {summary['num_experts']}) (from the {summary['source']})"))
        table = Table(show_header=True)
        for col in ("layer", "tokens", "live rows", "padded rows", "max/mean load", "violations"):
            table.add_column(col, justify="right")
        for info in summary["layers"]:
            table.add_row(str(info["layer"]), "not recorded" if info["tokens"] is None else str(info["tokens"]),
                          str(info["live_rows"]), str(info["padded_rows"]), _fmt(info["max_over_mean"], 3),
                          str(info["violations"]))
        console.print(table)
    detail = f"{summary['tokens']} tokens in {summary['num_layers']} layer(s)" if summary["layers"] else args.file
    _render_verdict(summary, console, "moegate check", detail)
    return 0 if summary["ok"] else 1


# --------------------------------------------------------------------------------------------------
# moegate presets / show / env / bench


def _cmd_presets(args) -> int:
    rows = []
    for name in preset_names():
        c = preset(name)
        rows.append({"name": name, "default": name == DEFAULT_PRESET, "num_experts": c.num_experts,
                     "top_k": c.top_k, "semantics": describe(c)})
    if args.json:
        _print_json({"command": "presets", "default": DEFAULT_PRESET, "presets": rows})
        return 0
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"moegate presets (* = default, {DEFAULT_PRESET})", title_justify="left")
    table.add_column("name", style="cyan", no_wrap=True)
    table.add_column("E", justify="right")
    table.add_column("K", justify="right")
    table.add_column("routing")
    for row in rows:
        table.add_row(row["name"] + (" *" if row["default"] else ""), str(row["num_experts"]), str(row["top_k"]),
                      Text(row["semantics"]))
    _console().print(table)
    return 0


def _show_target(target: str, layer: int | None = None) -> tuple[RouterConfig, str]:
    p = Path(target)
    if p.exists() or target.endswith(".json"):
        return load_config(None, target, layer)
    if layer is not None:
        raise CliError(f"--layer picks a decoder layer of a config.json; {target!r} is a preset name")
    return load_config(target, None)


def _cmd_show(args) -> int:
    config, source = _show_target(args.target, args.layer)
    steps = explain(config)
    if args.json:
        _print_json({"command": "show", "source": source, "semantics": describe(config), "config": config.to_dict(),
                     "steps": [{"step": s, "what": w} for s, w in steps]})
        return 0
    from rich.table import Table
    from rich.text import Text

    console = _console()
    console.print(Text(source, style="bold"))
    console.print(Text(describe(config), style="italic"))
    pipeline = Table(title="The pipeline (docs/contract.md), for this config", title_justify="left", show_header=False)
    pipeline.add_column("step", style="cyan", no_wrap=True)
    pipeline.add_column("what it does")
    for step, what in steps:
        pipeline.add_row(step, Text(what))
    console.print(pipeline)
    fields = Table(title="RouterConfig", title_justify="left", show_header=False)
    fields.add_column("field", style="cyan")
    fields.add_column("value")
    for name, value in config.to_dict().items():
        fields.add_row(name, Text(repr(value)))
    console.print(fields)
    return 0


def environment() -> dict:
    """Versions and devices, and which backend ``backend="auto"`` picks here."""
    import moegate

    def version(module: str) -> str | None:
        try:
            return __import__(module).__version__
        except Exception:
            return None

    cuda = torch.cuda.is_available()
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []
    device = torch.device("cuda" if cuda else "cpu")
    return {
        "command": "env",
        "moegate": moegate.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "triton": version("triton"),
        "rich": _dist_version("rich"),
        "safetensors": version("safetensors"),
        "matplotlib": version("matplotlib"),
        "cuda": torch.version.cuda if cuda else None,
        "gpus": gpus,
        "auto_backend": resolve_backend("auto", device),
        "auto_backend_device": str(device),
    }


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _cmd_env(args) -> int:
    env = environment()
    if args.json:
        _print_json(env)
        return 0
    from rich.table import Table
    from rich.text import Text

    table = Table(title="moegate env", title_justify="left", show_header=False)
    table.add_column("", style="cyan")
    table.add_column("")
    for name in ("moegate", "python", "platform", "torch", "triton", "rich", "safetensors", "matplotlib", "cuda"):
        table.add_row(name, Text(env[name] or "not installed" if name != "cuda" else env[name] or "no CUDA device"))
    table.add_row("gpus", Text(", ".join(env["gpus"]) or "none"))
    table.add_row("backend 'auto'", Text(f"{env['auto_backend']} (for tensors on {env['auto_backend_device']})"))
    _console().print(table)
    return 0


def _cmd_bench(argv: list[str]) -> int:
    import importlib

    try:
        bench = importlib.import_module("moegate.bench")
    except ModuleNotFoundError as exc:
        if exc.name != "moegate.bench":
            raise CliError(f"moegate bench needs {exc.name}, which is not installed") from None
        raise CliError("moegate bench is not available: moegate.bench is missing from this install") from None
    code = bench.main(argv)
    return 0 if code is None else int(code)


# --------------------------------------------------------------------------------------------------
# Arguments and the entry point


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


def _float_at_least_zero(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be finite and >= 0, got {text}")
    return value


def _add_config_args(p: argparse.ArgumentParser, default_note: str) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument("--preset", metavar="NAME", help=f"a named config (moegate presets); {default_note}")
    group.add_argument("--hf-config", metavar="CONFIG_JSON", help="a model's config.json, or a folder holding one")
    _add_layer_arg(p)


def _add_layer_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layer", type=int, metavar="N", help="the decoder layer of a config.json whose layers route "
                   "differently (DeepSeek-V4's hash layers, per-layer expert counts); default: its MoE layers' "
                   "common routing")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="moegate", description="See, check and measure MoE routing.")
    parser.add_argument("--version", action="version", version=f"moegate {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    r = sub.add_parser("route", help="route a batch and summarise it (default: the default preset, CPU)",
                       description="Route a batch for a config and print the load, imbalance, weights and the "
                                   "check_routing verdict. Exit 1 if the routing breaks an invariant.")
    _add_config_args(r, f"default {DEFAULT_PRESET}")
    r.add_argument("--tokens", type=_int_at_least(0), metavar="T",
                   help=f"tokens to route (default {DEFAULT_TOKENS}, or all rows of --logits)")
    r.add_argument("--logits", metavar="FILE", help="route these logits (.safetensors/.pt/.npy, [..., E]) "
                                                    "instead of synthetic ones")
    r.add_argument("--logits-key", metavar="NAME", help="the tensor's name in a file holding several")
    r.add_argument("--bias", metavar="FILE", help="correction bias [E] (default for noaux_tc configs: synthetic)")
    r.add_argument("--bias-key", metavar="NAME", help="the bias tensor's name in a file holding several")
    r.add_argument("--seed", type=_int_at_least(0), default=0, help="seed of the synthetic inputs (default 0)")
    r.add_argument("--skew", type=_float_at_least_zero, default=1.0,
                   help="expert-popularity skew of synthetic logits: 0 uniform, 1 realistic (default)")
    r.add_argument("--dtype", choices=tuple(DTYPES), help="logits dtype (default float32, or the file's)")
    r.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or auto")
    r.add_argument("--backend", choices=BACKENDS, default="auto", help="route()'s backend (default auto)")
    r.add_argument("--ep-size", type=_int_at_least(1), default=1, help="expert-parallel ranks (default 1)")
    r.add_argument("--shared-slots", choices=SHARED_SLOTS, default="none",
                   help="where shared experts get columns (default none)")
    r.add_argument("--scale", choices=SCALE_MODES, default="in_weights",
                   help="routed scaling factor in the weights (default) or on the MoE output")
    r.add_argument("--home-rank", type=_int_at_least(0), default=0, help="the batch's EP rank (default 0)")
    r.add_argument("--valid-tokens", type=_int_at_least(0), metavar="N",
                   help="rows at or past N are padding (default: none)")
    r.add_argument("--chunk-tokens", type=_int_at_least(1), default=DEFAULT_CHUNK_TOKENS, metavar="N",
                   help=f"route in chunks of N tokens, with a progress bar (default {DEFAULT_CHUNK_TOKENS})")
    r.add_argument("--verify-rows", type=_int_at_least(0), default=DEFAULT_VERIFY_ROWS, metavar="N",
                   help="compare the first N rows with the fp32 reference; every row gets the invariant "
                        f"checks (default {DEFAULT_VERIFY_ROWS})")
    r.add_argument("--plot", metavar="FILE.png", help="save the expert-load picture (needs matplotlib)")
    r.add_argument("--record", metavar="FILE.safetensors", help="save the routed ids as a RoutingRecorder capture")
    r.add_argument("--json", action="store_true", help="print machine-readable JSON only")

    c = sub.add_parser("check", help="validate a captured routing file (RoutingRecorder .safetensors)",
                       description="Check a capture: routed-only width (== top_k), ids in range, no repeats within "
                                   "a row, padded rows all -1. Exit 0 when clean, 1 with the violations listed.")
    c.add_argument("file", help="a RoutingRecorder.save file")
    _add_config_args(c, "default: the file's num_experts / top_k metadata")
    c.add_argument("--json", action="store_true", help="print machine-readable JSON only")

    p = sub.add_parser("presets", help="list the named configs")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON only")

    s = sub.add_parser("show", help="a RouterConfig in words: a preset name or a config.json")
    s.add_argument("target", metavar="NAME|config.json", help="preset name, config.json, or a folder holding one")
    s.add_argument("--json", action="store_true", help="print machine-readable JSON only")
    _add_layer_arg(s)

    e = sub.add_parser("env", help="versions, GPU, the backend 'auto' picks")
    e.add_argument("--json", action="store_true", help="print machine-readable JSON only")

    sub.add_parser("bench", help="benchmarks (moegate.bench; moegate bench --help)", add_help=False)
    return parser


def _version() -> str:
    import moegate

    return moegate.__version__


class _BrokenPipe(Exception):
    """stdout's reader went away (``moegate check f | head``): exit 141, as a shell reports SIGPIPE, never 1 (the code
    of a broken invariant or a bad capture)."""


def _console(stderr: bool = False):
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:  # rich's own raises SystemExit(1)
            raise _BrokenPipe()

    return _Console(stderr=stderr, highlight=False)


def _finite(obj):
    """JSON has no NaN or infinity: such floats (weights from +inf logits, say) become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _print_json(obj: dict) -> None:
    sys.stdout.write(json.dumps(_finite(obj), indent=2, allow_nan=False, default=str) + "\n")
    sys.stdout.flush()


def _error(prog: str, message: str) -> int:
    line = " ".join(str(message).split())
    sys.stderr.write(f"{prog}: error: {line}\n")
    return 2


COMMANDS = {"route": _cmd_route, "check": _cmd_check, "presets": _cmd_presets, "show": _cmd_show,
            "env": _cmd_env}


def main(argv: list[str] | None = None) -> int:
    """The ``moegate`` command. Returns the exit code: 0 ok, 1 routing violations, 2 bad arguments."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "bench":
            return _cmd_bench(argv[1:])
        args = build_parser().parse_args(argv)
        if args.command is None:
            build_parser().print_help()
            return 2
        return COMMANDS[args.command](args)
    except _UsageError as exc:
        return _error(exc.prog, str(exc))
    except (_BrokenPipe, BrokenPipeError):
        try:  # Python flushes stdout at exit: point it at /dev/null so that flush cannot fail again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return PIPE_CLOSED
    except (ValueError, TypeError, NotImplementedError, OSError) as exc:
        return _error("moegate", str(exc))
    except SystemExit as exc:  # --help / --version
        return exc.code if isinstance(exc.code, int) else 0
    except KeyboardInterrupt:
        sys.stderr.write("moegate: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
