"""RouterConfig: the model's routing function (docs/contract.md, "Two configurations, never mixed").

A RouterConfig says what the model computes. It never says how a deployment lays the result out:
that is ExpertLayout's job (layout.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from moegate._checks import (
    FP32_MAX,
    FP32_TINY,
    _check_choice,
    _check_int,
    _check_nonnegative_float,
    _check_positive_float,
)

SCORINGS = ("softmax", "sigmoid", "sqrtsoftplus")
SELECTIONS = ("scores", "logits")
GROUP_SCORES = ("top2_sum", "max")
GROUP_FILLS = ("exclude", "zero")
ROUTINGS = ("topk", "hash")
RENORM_EPS_MODES = ("add", "clamp")


@dataclass(frozen=True)
class RouterConfig:
    """The routing function of one model's MoE layers.

    Parameters
    ----------
    num_experts : int
        E, routed experts (>= 1). Shared experts are not counted here.
    top_k : int
        K, routed experts selected per token, 1 <= K <= E (+ num_zero_experts). Never counts shared experts.
    scoring : {"softmax", "sigmoid", "sqrtsoftplus"}
        Step 2: how logits become scores.
    selection : {"scores", "logits"}
        Step 3: rank on the scores (default) or on the raw logits (top-k first, activation after).
    logit_scale : float
        Step 1: multiplier on the logits (> 0), e.g. Muse Spark's output multiplier.
    softcap : float or None
        Step 1: ``c * tanh(x / c)`` when set (c > 0).
    has_correction_bias : bool
        The model has an ``e_score_correction_bias`` added to the selection key only; route() needs ``bias``.
    n_group, topk_group : int
        Step 4: E is split into n_group equal groups; the topk_group best groups are kept.
    group_score : {"top2_sum", "max"}
        Group score: sum of the two largest keys of the group, or the largest.
    group_fill : {"exclude", "zero"}
        Dropped groups are never selected ("exclude") or their keys become 0.0 and still compete ("zero").
    renormalize : bool
        Step 7: divide the routed weights by their sum (their L-p norm with ``renorm_p``) plus eps.
    renorm_eps : float
        eps of step 7 (>= 0).
    renorm_eps_mode : {"add", "clamp"}
        ``w / (norm + eps)`` ("add", the default) or ``w / max(norm, eps)`` ("clamp", ERNIE).
    renorm_p : float
        p of the norm in step 7 (DBRX's ``moe_normalize_expert_weights``); 1.0 is the plain sum.
    routed_scaling_factor : float
        rsf (> 0), applied exactly once (step 8).
    num_shared_experts : int
        S, the model's always-on experts (>= 0). Where their columns go is ExpertLayout's business.
    routing : {"topk", "hash"}
        "hash": ids come from ``hash_table[token_ids]`` (DeepSeek-V4 hash layers); scores still weight them.
    has_expert_scale : bool
        Each routed weight is multiplied by a per-expert scale after step 7 (Gemma4's ``per_expert_scale``);
        route() needs ``expert_scale=[E]``.
    shared_expert_scale : float
        The net factor (> 0) on the shared experts' output, 1.0 for almost every model; Cohere2-MoE's
        "average" combination gives 0.5. A shared column's weight is this factor (divided by rsf with
        scale="on_output", where the caller multiplies the whole output by rsf).
    num_zero_experts : int
        Z identity ("zero") experts scored and selected together with the E real ones (LongCat-Flash):
        logits are [T, E + Z] and ids E .. E+Z-1 name the zero experts. They need a layout without placement, on one
        rank and without shared columns (``scale`` is free).
    weight_on_input : bool
        Where the model applies a routed weight: to the selected expert's input (Llama4: ``expert(h * w)``)
        rather than to its output (``w * expert(h)``, every other family). The weights route() returns are the
        same either way; the expert MLP is not linear, so the consumer must apply them where this says.
    """

    num_experts: int
    top_k: int
    scoring: str = "softmax"
    selection: str = "scores"
    logit_scale: float = 1.0
    softcap: float | None = None
    has_correction_bias: bool = False
    n_group: int = 1
    topk_group: int = 1
    group_score: str = "top2_sum"
    group_fill: str = "exclude"
    renormalize: bool = True
    renorm_eps: float = 1e-20
    renorm_eps_mode: str = "add"
    renorm_p: float = 1.0
    routed_scaling_factor: float = 1.0
    num_shared_experts: int = 0
    routing: str = "topk"
    has_expert_scale: bool = False
    num_zero_experts: int = 0
    shared_expert_scale: float = 1.0
    weight_on_input: bool = False

    def __post_init__(self) -> None:
        _check_router_config(self)

    @property
    def num_scored(self) -> int:
        """Width of the logits: real experts plus zero experts."""
        return self.num_experts + self.num_zero_experts

    @property
    def group_size(self) -> int:
        return self.num_scored // self.n_group

    def replace(self, **changes) -> RouterConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _check_router_config(c: RouterConfig) -> None:
    _check_int("num_experts", c.num_experts, 1)
    _check_int("num_zero_experts", c.num_zero_experts, 0)
    _check_int("top_k", c.top_k, 1)
    _check_choice("scoring", c.scoring, SCORINGS)
    _check_choice("selection", c.selection, SELECTIONS)
    _check_choice("group_score", c.group_score, GROUP_SCORES)
    _check_choice("group_fill", c.group_fill, GROUP_FILLS)
    _check_choice("routing", c.routing, ROUTINGS)
    _check_choice("renorm_eps_mode", c.renorm_eps_mode, RENORM_EPS_MODES)
    for name in ("has_correction_bias", "renormalize", "has_expert_scale", "weight_on_input"):
        if not isinstance(getattr(c, name), bool):
            raise TypeError(f"{name} must be a bool, got {getattr(c, name)!r}")
    _check_positive_float("logit_scale", c.logit_scale)
    if c.softcap is not None:
        _check_positive_float("softcap", c.softcap)
    _check_nonnegative_float("renorm_eps", c.renorm_eps)
    _check_positive_float("renorm_p", c.renorm_p)
    _check_positive_float("routed_scaling_factor", c.routed_scaling_factor)
    _check_int("num_shared_experts", c.num_shared_experts, 0)
    _check_positive_float("shared_expert_scale", c.shared_expert_scale)
    if not FP32_TINY <= c.shared_expert_scale / c.routed_scaling_factor <= FP32_MAX:
        raise ValueError(
            f"shared_expert_scale / routed_scaling_factor (the shared weight with scale='on_output') must be a "
            f"normal fp32 number (in [{FP32_TINY:.4g}, {FP32_MAX:.4g}]), got {c.shared_expert_scale} / "
            f"{c.routed_scaling_factor}"
        )

    width = c.num_scored
    # E + Z, spelled out where there are zero experts
    name, total = "num_experts", f"{width}"
    if c.num_zero_experts:
        name, total = "num_experts + num_zero_experts", f"{c.num_experts} + {c.num_zero_experts} = {width}"
    what = f"{name} ({total})"
    if c.top_k > width:
        raise ValueError(f"top_k must be <= {what}, got top_k={c.top_k}")
    _check_int("n_group", c.n_group, 1)
    _check_int("topk_group", c.topk_group, 1, c.n_group)
    if width % c.n_group != 0:
        raise ValueError(f"{what} must be divisible by n_group, got n_group={c.n_group}")
    if c.n_group > 1:
        group_size = width // c.n_group
        if c.group_score == "top2_sum" and group_size < 2:
            raise ValueError(
                f"group_score='top2_sum' needs at least 2 experts per group, got {what} "
                f"in n_group={c.n_group} groups of {group_size}"
            )
        if c.top_k > c.topk_group * group_size:
            raise ValueError(
                f"top_k must be <= topk_group * {name} / n_group = {c.topk_group * group_size}, "
                f"got top_k={c.top_k}"
            )
    if c.has_expert_scale and c.num_zero_experts:
        raise ValueError(
            f"has_expert_scale needs num_zero_experts=0 (expert_scale has no entries for zero experts), got "
            f"num_zero_experts={c.num_zero_experts}"
        )
    if c.routing == "hash" and c.num_zero_experts:
        raise ValueError("num_zero_experts must be 0 with routing='hash', got " f"{c.num_zero_experts}")
