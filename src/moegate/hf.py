"""from_hf_config: the RouterConfig of a transformers MoE model's config (transformers 5.x families).

Every family is a `_Family`: the model types it answers to, its semantics class (docs/models.md, the Class table), a
builder that reads the config keys (with the aliases transformers accepts and the defaults its config class
uses, so a config.json that omits a key routes as the model would) and the rule that says which layers are
MoE. transformers itself is never imported: a plain dict or a config.json path is enough.

The RouterConfig reproduces what the MoE layer computes with the routed weights. Where the MoE block (not
the router) scales the routed output (Beam, MiniMax-M3, Step3p7, Laguna, OpenAI-privacy-filter's k), the
net factor is the RouterConfig's ``routed_scaling_factor``. ``route`` takes the gate projection's raw
output as its logits: logit multipliers and softcaps are RouterConfig fields (pipeline step 1).
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from moegate.config import RouterConfig

LAYER_TYPES = ("dense", "moe", "hash")


# ----------------------------------------------------------------------------------------------------------
# Reading a config: aliases, defaults and per-layer values


def _as_dict(config) -> dict:
    if isinstance(config, dict):
        return config
    if isinstance(config, (str, Path)):
        path = Path(config)
        if path.is_dir():  # a model folder
            path = path / "config.json"
        cfg = json.loads(path.read_text())
        if not isinstance(cfg, dict):
            raise ValueError(f"{path}: a config.json holds a JSON object, this one a {type(cfg).__name__}")
        return cfg
    if hasattr(config, "to_dict"):
        return config.to_dict()
    raise TypeError(
        f"config must be a dict, a path to config.json or a PretrainedConfig, got {type(config).__name__}"
    )


class _View:
    """Key lookup with a family's aliases (alias -> canonical, as transformers' attribute_map) and layer."""

    def __init__(self, cfg: dict, model_type: str, aliases: dict[str, str], layer: int | None):
        self.cfg, self.model_type, self.aliases, self.layer = cfg, model_type, aliases, layer

    def raw(self, key: str, default=None):
        if key in self.cfg:
            return self.cfg[key]
        for alias, canonical in self.aliases.items():
            if canonical == key and alias in self.cfg:
                return self.cfg[alias]
        return default

    def get(self, key: str, default=None):
        """A scalar value; a per-layer list is resolved with ``layer`` (or must be uniform)."""
        value = self.raw(key, default)
        if isinstance(value, (list, tuple)):
            if self.layer is not None:
                if not 0 <= self.layer < len(value):
                    raise ValueError(f"layer must be in [0, {len(value)}) for per-layer {key}, got {self.layer}")
                return value[self.layer]
            if len(set(value)) > 1:
                raise ValueError(
                    f"{self.model_type}: {key} differs between layers ({list(value)}); pass layer= to pick one"
                )
            return value[0] if value else default
        return value

    def need(self, key: str, default=None):
        value = self.get(key, default)
        if value is None:
            raise ValueError(f"{self.model_type}: the config has no value for {key!r}")
        return value


# ----------------------------------------------------------------------------------------------------------
# Builders, one per semantics class (docs/models.md, the Class table). Each reads the keys its family uses.


def _count(v: _View, key: str, value) -> int:
    """A count the config sets (experts, groups): an int (an integral float too); a bool, a string or 1.5 is a
    ValueError naming the key, not a count bool() or int() made of it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ValueError(f"{v.model_type}: {key} must be a whole number, got {value!r}")
    return int(value)


def _flag(v: _View, key: str, default: bool) -> bool:
    """A switch the config sets: true / false, or null (the families' routers test it for truth: off). A string such
    as "false" or a number is a ValueError naming the key (bool("false") is True)."""
    value = v.get(key, default)
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{v.model_type}: {key} must be true, false or null, got {value!r}")
    return bool(value)


def _shared(v: _View, key: str | None, default: int | None = 0) -> int:
    """The shared-expert count. A null one (or none where the family has no default) is a ValueError naming the
    key: the families' blocks multiply the shared MLP's width by it and fail on None."""
    if key is None:
        return default
    return _count(v, key, v.need(key, default))


def _number(v: _View, key: str, value) -> float:
    """A real number the config sets: an int or a float (numpy's too). A bool or a string is a ValueError naming the
    key, not what float() makes of it (true as 1.0, "2.5" as 2.5)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{v.model_type}: {key} must be a number, got {value!r}")
    return float(value)


def _factor(v: _View, key: str, default: float) -> float:
    """A scaling factor or eps the config sets: a null one is a ValueError naming the key (float(None) would be a
    bare TypeError; the families' transformers code fails on it too), so is anything but a number (_number)."""
    value = v.get(key, default)
    if value is None:
        raise ValueError(f"{v.model_type}: {key} is null; the model needs a number there")
    return _number(v, key, value)


def _softmax_renorm(
    v: _View, *, E: str, K: str, E_default=None, K_default=None, norm: str | bool = True, norm_default=True,
    shared: int = 0, selection: str = "scores", rsf: float = 1.0, expert_scale: bool = False,
) -> RouterConfig:
    """SM-R / SM-F / TK-SM: softmax, top-k, divide by the sum of the k (no eps) when renormalising."""
    renorm = norm if isinstance(norm, bool) else _flag(v, norm, norm_default)
    return RouterConfig(
        num_experts=v.need(E, E_default), top_k=v.need(K, K_default), scoring="softmax", selection=selection,
        renormalize=renorm, renorm_eps=0.0, routed_scaling_factor=rsf, num_shared_experts=shared,
        has_expert_scale=expert_scale,
    )


def _biased(
    v: _View, *, E: str, K: str, E_default=None, K_default=None, scoring: str = "sigmoid",
    groups: tuple[str, str] | None = None, group_defaults=(1, 1), group_fill: str = "exclude",
    norm: str | bool = True, norm_default=True, eps: float = 1e-20, rsf: float = 1.0, shared: int = 0,
    logit_scale: float = 1.0, softcap: float | None = None, bias: bool = True, selection: str = "scores",
    null_groups_ungrouped: bool = False,
) -> RouterConfig:
    """DS3 / AXK2 / SB / Kolibri1: score (+ bias) -> [groups] -> top-k -> gather -> [renorm] -> x rsf.
    Null group counts are no groups where the family's router says so (``null_groups_ungrouped``: AXK2 skips the
    group step when n_group is None, and its config refuses one count null without the other); elsewhere a null
    count is a ValueError naming the key (DeepSeek-V3's router views the scores as [T, n_group, E / n_group] and
    fails on None)."""
    n_group, topk_group = 1, 1
    if groups is not None:
        n_group = v.get(groups[0], group_defaults[0])
        topk_group = v.get(groups[1], group_defaults[1])
        if null_groups_ungrouped and n_group is None and topk_group is None:
            n_group, topk_group = 1, 1
        elif null_groups_ungrouped and (n_group is None or topk_group is None):
            raise ValueError(f"{v.model_type}: {groups[0]} and {groups[1]} must be set together (both null for "
                             f"ungrouped routing), got {n_group!r} and {topk_group!r}")
        else:
            n_group = _count(v, groups[0], v.need(groups[0], group_defaults[0]))
            topk_group = _count(v, groups[1], v.need(groups[1], group_defaults[1]))
    renorm = norm if isinstance(norm, bool) else _flag(v, norm, norm_default)
    return RouterConfig(
        num_experts=v.need(E, E_default), top_k=v.need(K, K_default), scoring=scoring, selection=selection,
        logit_scale=float(logit_scale), softcap=softcap, has_correction_bias=bias, n_group=n_group,
        topk_group=topk_group, group_fill=group_fill, renormalize=renorm, renorm_eps=eps,
        routed_scaling_factor=float(rsf), num_shared_experts=shared,
    )


def _score_fn(v: _View, key: str, default: str) -> str:
    name = v.get(key, default)
    if name not in ("sigmoid", "sqrtsoftplus"):
        raise NotImplementedError(
            f"{v.model_type}: {key}={name!r}; moegate supports 'sigmoid' and 'sqrtsoftplus' here "
            "(another activation would need a new RouterConfig.scoring value)"
        )
    return name


# -- families -----------------------------------------------------------------------------------------------


def _mixtral(v):  # mixtral, minimax: SM-R
    return _softmax_renorm(v, E="num_local_experts", K="num_experts_per_tok", E_default=8, K_default=2)


def _qwen_smf(E_default, K_default, norm_default, shared, E="num_experts"):
    def build(v):
        return _softmax_renorm(
            v, E=E, K="num_experts_per_tok", E_default=E_default, K_default=K_default, norm="norm_topk_prob",
            norm_default=norm_default, shared=shared,
        )
    return build


def _smr(E, K, E_default, K_default, shared=0):
    def build(v):
        return _softmax_renorm(v, E=E, K=K, E_default=E_default, K_default=K_default, shared=shared)
    return build


def _jamba(v):
    return _softmax_renorm(v, E="num_experts", K="num_experts_per_tok", E_default=16, K_default=2, norm=False)


def _hunyuan(v):
    return _softmax_renorm(v, E="num_experts", K="moe_topk", E_default=1, K_default=1, shared=1)


def _dbrx(v):
    ffn = v.raw("ffn_config") or {}
    if not isinstance(ffn, dict):
        ffn = _as_dict(ffn)
    sub = _View(ffn, "dbrx.ffn_config", {}, v.layer)
    p = sub.get("moe_normalize_expert_weights", 1.0)
    return RouterConfig(
        num_experts=sub.need("moe_num_experts", 4), top_k=sub.need("moe_top_k", 1), scoring="softmax",
        renormalize=p is not None, renorm_eps=0.0,
        renorm_p=1.0 if p is None else _number(sub, "moe_normalize_expert_weights", p),
    )


def _topk_softmax(E, K, E_default, K_default, shared=None, shared_default=0, rsf=1.0):
    """TK-SM: top-k on the logits, softmax over the k (equal to a renormalised softmax)."""
    def build(v):
        S = shared(v) if callable(shared) else _shared(v, shared, shared_default)
        return _softmax_renorm(v, E=E, K=K, E_default=E_default, K_default=K_default, shared=S,
                               selection="logits", rsf=rsf)
    return build


def _dots3_shared(v):
    S = _shared(v, "n_shared_experts", 1)
    if S < 1:  # Dots3NoteTextConfig refuses it
        raise ValueError(f"{v.model_type}: n_shared_experts must be at least 1, got {S}")
    return S


def _granite_shared(v):
    return 1 if (v.get("shared_intermediate_size", 0) or 0) > 0 else 0


def _cohere2(v):
    fn = v.get("expert_selection_fn", "softmax")
    S = _shared(v, "num_shared_experts")
    strategy = v.get("shared_expert_combination_strategy", "average")  # Cohere2MoeConfig's default
    if S > 0 and strategy not in ("sum", "average"):  # the model's forward reads it (and raises) only with S > 0
        raise ValueError(f"{v.model_type}: shared_expert_combination_strategy must be 'sum' or 'average', "
                         f"got {strategy!r}")
    # "average": the block returns (routed + shared) / 2: routed weights and shared experts carry a net 1/2.
    rsf = 0.5 if (S > 0 and strategy == "average") else 1.0
    E, K = v.need("num_experts", 8), v.need("num_experts_per_tok", 2)
    if fn == "softmax":
        return RouterConfig(num_experts=E, top_k=K, scoring="softmax", selection="logits", renorm_eps=0.0,
                            routed_scaling_factor=rsf, num_shared_experts=S, shared_expert_scale=rsf)
    if fn == "sigmoid":
        return RouterConfig(num_experts=E, top_k=K, scoring="sigmoid", selection="logits",
                            renormalize=_flag(v, "norm_topk_prob", True), renorm_eps=0.0,
                            routed_scaling_factor=rsf, num_shared_experts=S, shared_expert_scale=rsf)
    raise ValueError(f"cohere2_moe: expert_selection_fn must be 'softmax' or 'sigmoid', got {fn!r}")


def _llama4(v):
    return RouterConfig(
        num_experts=v.need("num_local_experts", 16), top_k=v.need("num_experts_per_tok", 1), scoring="sigmoid",
        selection="logits", renormalize=False, num_shared_experts=1,
        weight_on_input=True,  # Llama4TextMoe: routed_in = hidden_states * router_scores, then the experts
    )


def _flint(v):
    return RouterConfig(
        num_experts=v.need("num_experts", 256), top_k=v.need("num_experts_per_tok", 6), scoring="sigmoid",
        renormalize=_flag(v, "norm_topk_prob", True), renorm_eps=0.0, num_shared_experts=1,
    )


def _deepseek_v2(defaults: dict):
    def build(v):
        method = v.get("topk_method", defaults.get("topk_method", "greedy"))
        E = v.need("n_routed_experts", defaults["E"])
        K = v.need("num_experts_per_tok", defaults.get("K"))
        common = dict(num_experts=E, top_k=K, scoring="softmax", renormalize=False,
                      routed_scaling_factor=_factor(v, "routed_scaling_factor", 1.0),
                      num_shared_experts=_shared(v, "n_shared_experts", defaults.get("S", 0)))
        if method == "greedy":
            return RouterConfig(**common)
        if method == "group_limited_greedy":
            return RouterConfig(**common, n_group=v.need("n_group", defaults.get("n_group")),
                                topk_group=v.need("topk_group", defaults.get("topk_group")),
                                group_score="max", group_fill="zero")
        raise NotImplementedError(
            f"{v.model_type}: topk_method={method!r}; the transformers router handles only 'greedy' and "
            "'group_limited_greedy' (with 'noaux_tc' it raises UnboundLocalError), so there is nothing to match"
        )
    return build


def _ds3(E="n_routed_experts", K="num_experts_per_tok", E_default=256, K_default=8, groups=("n_group", "topk_group"),
         group_defaults=(8, 4), norm="norm_topk_prob", norm_default=True, rsf_default=2.5,
         shared="n_shared_experts", shared_default=1, group_fill="exclude", null_groups_ungrouped=False):
    """DS3: sigmoid + correction bias, top2_sum groups, renorm if flag (+1e-20), x rsf."""
    def build(v):
        S = shared(v) if callable(shared) else _shared(v, shared, shared_default)
        return _biased(
            v, E=E, K=K, E_default=E_default, K_default=K_default, groups=groups, group_defaults=group_defaults,
            group_fill=group_fill, norm=norm, norm_default=norm_default,
            rsf=_rsf_or_one(v, v.get("routed_scaling_factor", rsf_default)), shared=S,
            null_groups_ungrouped=null_groups_ungrouped,
        )
    return build


def _rsf_or_one(v: _View, rsf):
    """A null routed_scaling_factor is no scaling for MiMo-V2-Flash only: its config.json on the Hub stores null
    there, which its transformers config turns into 1.0; DeepSeek-V3's and GLM-4-MoE's configs refuse a null."""
    if rsf is None:
        if v.model_type != "mimo_v2_flash":
            raise ValueError(f"{v.model_type}: routed_scaling_factor is null (transformers refuses it for this model)")
        return 1.0
    return _number(v, "routed_scaling_factor", rsf)


def _mistral4(norm: str | bool):
    """M4: softmax without bias, top2_sum groups filled with 0.0, renorm (+1e-20), x rsf."""
    def build(v):
        renorm = norm if isinstance(norm, bool) else _flag(v, norm, True)
        return RouterConfig(
            num_experts=v.need("n_routed_experts", 128), top_k=v.need("num_experts_per_tok", 4), scoring="softmax",
            n_group=_count(v, "n_group", v.need("n_group", 1)),
            topk_group=_count(v, "topk_group", v.need("topk_group", 1)),
            group_fill="zero", renormalize=renorm, renorm_eps=1e-20,
            routed_scaling_factor=_factor(v, "routed_scaling_factor", 1.0),
            num_shared_experts=_shared(v, "n_shared_experts", 1),
        )
    return build


def _deepseek_v4(v):
    return _biased(
        v, E="n_routed_experts", K="num_experts_per_tok", E_default=256, K_default=6,
        scoring=_score_fn(v, "scoring_func", "sqrtsoftplus"), rsf=_factor(v, "routed_scaling_factor", 1.5),
        shared=1,  # the block builds one shared MLP whatever n_shared_experts says (modeling_deepseek_v4)
    )


def _inkling2(E_default, K_default):
    def build(v):
        return _biased(v, E="n_routed_experts", K="num_experts_per_tok", E_default=E_default,
                       K_default=K_default, scoring=_score_fn(v, "scoring_func", "sigmoid"),
                       rsf=_factor(v, "route_scale", 8.0))
    return build


def _muse_spark(v):
    return _biased(v, E="num_local_experts", K="num_experts_per_tok", E_default=256, K_default=8, eps=1e-15,
                   rsf=_factor(v, "routed_scaling_factor", 1.0),
                   logit_scale=_factor(v, "output_multiplier", 32 ** -0.5))


def _minimax_m2(v):
    return _biased(v, E="num_local_experts", K="num_experts_per_tok", E_default=256, K_default=8, eps=0.0)


def _minimax_m3(v):  # the block multiplies the routed output by routed_scaling_factor
    return _biased(v, E="num_local_experts", K="num_experts_per_tok", E_default=128, K_default=4, eps=0.0,
                   rsf=_factor(v, "routed_scaling_factor", 2.0), shared=1)


def _step3p7(v):  # the block multiplies the routed output by moe_router_scaling_factor
    return _biased(v, E="n_routed_experts", K="num_experts_per_tok", E_default=288, K_default=8, eps=0.0,
                   rsf=_factor(v, "moe_router_scaling_factor", 1.0), shared=1)


def _hy_v3(v):
    return _biased(v, E="num_experts", K="num_experts_per_tok", E_default=192, K_default=8,
                   rsf=_factor(v, "router_scaling_factor", 2.826), shared=_shared(v, "num_shared_experts", 1))


def _afmoe(v):
    return _biased(v, E="num_experts", K="num_experts_per_tok", E_default=64, K_default=6,
                   rsf=_factor(v, "route_scale", 1.0), shared=_shared(v, "num_shared_experts", 2))


def _lfm2_moe(v):
    return _biased(v, E="num_experts", K="num_experts_per_tok", E_default=32, K_default=4, norm="norm_topk_prob",
                   eps=1e-6, rsf=_factor(v, "routed_scaling_factor", 1.0), bias=_flag(v, "use_expert_bias", True))


def _laguna(v):  # the block multiplies the routed output by moe_routed_scaling_factor
    if v.get("moe_apply_router_weight_on_input", False):
        raise NotImplementedError("laguna: moe_apply_router_weight_on_input=True is rejected by transformers too")
    cap = v.get("moe_router_logit_softcapping", 0.0)
    cap = 0.0 if cap is None else _number(v, "moe_router_logit_softcapping", cap)
    return _biased(v, E="num_experts", K="num_experts_per_tok", E_default=256, K_default=8, eps=0.0,
                   softcap=cap if cap > 0 else None, rsf=_factor(v, "moe_routed_scaling_factor", 1.0), shared=1)


def _kolibri1(v):
    return _biased(v, E="num_local_experts", K="num_experts_per_tok", E_default=384, K_default=6,
                   selection="logits", norm="norm_topk_prob", norm_default=False, eps=0.0, shared=1)


def _ernie(v):
    return RouterConfig(
        num_experts=v.need("moe_num_experts", 64), top_k=v.need("moe_k", 6), scoring="softmax",
        has_correction_bias=True, renormalize=True, renorm_eps=_factor(v, "moe_norm_min", 1e-12),
        renorm_eps_mode="clamp", num_shared_experts=_shared(v, "moe_num_shared_experts", 2),
    )


def _longcat(v):
    return RouterConfig(
        num_experts=v.need("n_routed_experts", 512), top_k=v.need("moe_topk", 12), scoring="softmax",
        has_correction_bias=True, renormalize=False, routed_scaling_factor=_factor(v, "routed_scaling_factor", 6.0),
        num_zero_experts=_count(v, "zero_expert_num", v.need("zero_expert_num", 256)),
    )


_DOTS3_VISION_PYRAMID = [-1] * 25 + list(range(4, 65, 4)) + [64]


def _dots3_vision_experts(v: _View) -> list[int]:
    """Routed experts per vision block (<= 0: a dense block), as Dots3NoteVisionConfig derives them."""
    pyramid = v.raw("pyramid_num_routed")
    kinds = v.raw("mlp_layer_types")
    if pyramid is None and kinds is None:
        pyramid = _DOTS3_VISION_PYRAMID
    if pyramid is not None:
        return list(pyramid)
    # A saved config keeps per_layer_config only where a block differs from the top-level num_local_experts.
    by_layer = {int(k): cfg for k, cfg in (v.raw("per_layer_config") or {}).items()}
    default = v.raw("num_local_experts", 64)
    return [int(by_layer.get(i, {}).get("num_local_experts", default)) if kind == "sparse" else -1
            for i, kind in enumerate(kinds)]


def _dots3_vision(v):
    """SB per vision block: the expert count (and top-k) change from block to block, so ``layer`` is needed."""
    experts = _dots3_vision_experts(v)
    if v.layer is None:
        raise ValueError(f"{v.model_type}: the expert count differs between blocks ({experts}); pass layer=")
    if not 0 <= v.layer < len(experts) or experts[v.layer] <= 0:
        raise ValueError(f"{v.model_type}: block {v.layer} has no routed experts (per block: {experts})")
    E = experts[v.layer]
    per_layer = {int(k): cfg for k, cfg in (v.raw("per_layer_config") or {}).items()}
    K = v.raw("num_experts_per_tok") or v.raw("capacity_factor", 2)
    K = per_layer.get(v.layer, {}).get("num_experts_per_tok") or min(K, E)
    key = "router_scaling_factor" if v.raw("router_scaling_factor") else "router_scale"
    rsf = _number(v, key, v.raw(key, 1.0))
    return RouterConfig(num_experts=E, top_k=K, scoring="sigmoid", has_correction_bias=True, renorm_eps=1e-20,
                        routed_scaling_factor=rsf)


def _dots3_vision_layers(v: _View, n: int) -> list[str]:
    return ["moe" if count > 0 else "dense" for count in _dots3_vision_experts(v)]


def _gemma4(v):
    if not v.get("enable_moe_block", False):
        raise ValueError(f"{v.model_type}: enable_moe_block is false, the model has no MoE layers")
    return _softmax_renorm(v, E="num_experts", K="top_k_experts", expert_scale=True)


# ----------------------------------------------------------------------------------------------------------
# Which layers are MoE


def _all_moe(v: _View, n: int) -> list[str]:
    return ["moe"] * n


def _granite_hybrid_layers(v: _View, n: int) -> list[str]:
    """A layer has experts where num_local_experts > 0 (transformers' has_experts); else its shared MLP only."""
    experts = v.raw("num_local_experts", 8)
    return ["moe" if (experts or 0) > 0 else "dense"] * n


def _first_k_dense(default_k: int, freq_key: str | None = None):
    def rule(v: _View, n: int) -> list[str]:
        k = v.raw("first_k_dense_replace", default_k)
        k = default_k if k is None else k
        freq = v.raw(freq_key, 1) if freq_key else 1
        if isinstance(freq, (list, tuple)):
            return ["moe" if i >= k and freq[i] else "dense" for i in range(n)]
        return ["moe" if i >= k and i % (freq or 1) == 0 else "dense" for i in range(n)]
    return rule


def _fixed_dense_prefix(k: int):
    def rule(v: _View, n: int) -> list[str]:
        return ["dense" if i < k else "moe" for i in range(n)]
    return rule


def _num_dense_layers(default: int):
    def rule(v: _View, n: int) -> list[str]:
        k = v.raw("num_dense_layers", default)
        k = default if k is None else k
        return ["dense" if i < k else "moe" for i in range(n)]
    return rule


def _sparse_step(mlp_only_default: tuple[int, ...] = ()):
    def rule(v: _View, n: int) -> list[str]:
        step = v.raw("decoder_sparse_step", 1) or 1
        dense = set(v.raw("mlp_only_layers", list(mlp_only_default)) or [])
        return ["moe" if i not in dense and (i + 1) % step == 0 else "dense" for i in range(n)]
    return rule


_qwen_sparse_step = _sparse_step()


def _longcat_layers(v: _View, n: int) -> list[str]:
    # One MoE per decoder layer; num_hidden_layers counts its two attention sublayers (2 * num_layers).
    layers = v.raw("num_layers")
    if layers is None:
        layers = n // 2
    return ["moe"] * layers


def _period(v: _View, key: str, default: int) -> int:
    """A layer period or interval: a whole number >= 1 (0 would divide by zero), a ValueError naming the key."""
    value = _count(v, key, v.raw(key, default))
    if value < 1:
        raise ValueError(f"{v.model_type}: {key} must be at least 1, got {value}")
    return value


def _jamba_layers(v: _View, n: int) -> list[str]:
    period, offset = _period(v, "expert_layer_period", 2), v.raw("expert_layer_offset", 1)
    return ["moe" if i % period == offset else "dense" for i in range(n)]


def _ernie_layers(v: _View, n: int) -> list[str]:
    start, end = v.raw("moe_layer_start_index", 1), v.raw("moe_layer_end_index", n - 1)
    interval = _period(v, "moe_layer_interval", 1)
    end = n - 1 if end is None or end < 0 else end
    return ["moe" if (i + 1) % interval == 0 and start <= i <= end else "dense" for i in range(n)]


def _llama4_layers(v: _View, n: int) -> list[str]:
    layers = v.raw("moe_layers")
    if layers is None:
        step = v.raw("interleave_moe_layer_step", 1)
        layers = range(step - 1, n, step)
    layers = set(layers)
    return ["moe" if i in layers else "dense" for i in range(n)]


def _deepseek_v4_layers(v: _View, n: int) -> list[str]:
    n_hash = v.raw("num_hash_layers", 3)
    return ["hash" if i < n_hash else "moe" for i in range(n)]


def _gemma4_layers(v: _View, n: int) -> list[str]:
    return ["moe" if v.raw("enable_moe_block", False) else "dense"] * n


def _moe_layer_freq(v: _View, n: int) -> list[str]:
    freq = v.raw("moe_layer_freq")
    if isinstance(freq, (list, tuple)):
        return ["moe" if f else "dense" for f in freq]
    return ["moe"] * n


def _step3p7_layers(v: _View, n: int) -> list[str]:
    enum = v.raw("moe_layers_enum")
    if enum is None:
        return ["dense" if i < 3 else "moe" for i in range(n)]
    items = enum.split(",") if isinstance(enum, str) else enum
    moe = {int(i) for i in items if str(i).strip()}
    return ["moe" if i in moe else "dense" for i in range(n)]


_NEMOTRON_PATTERN = {"M": "mamba", "*": "attention", "E": "moe", "-": "mlp"}


def _nemotron_layers(v: _View, n: int) -> list[str]:
    blocks = v.raw("layers_block_type") or v.raw("layer_types")
    if blocks is None and v.raw("hybrid_override_pattern"):
        blocks = [_NEMOTRON_PATTERN.get(c, c) for c in v.raw("hybrid_override_pattern")]
    if blocks is None:
        blocks = ["linear_attention", "moe", "full_attention", "mlp"]
    return ["moe" if b == "moe" else "dense" for b in blocks]


_MLP_LAYER_TYPE = {"dense": "dense", "sparse": "moe", "moe": "moe", "hash_moe": "hash"}


# ----------------------------------------------------------------------------------------------------------
# The family table


@dataclass(frozen=True)
class _Family:
    semantics: str
    build: Callable[[_View], RouterConfig]
    aliases: dict[str, str] = field(default_factory=dict)
    layers: Callable[[_View, int], list[str]] = _all_moe
    layers_default: int | None = None  # num_hidden_layers when the config omits it
    note: str = ""


_LOCAL = {"num_experts": "num_local_experts"}
_ROUTED = {"num_local_experts": "n_routed_experts"}
_ROUTED_NE = {"num_experts": "n_routed_experts"}
_NUM_EXPERTS = {"num_local_experts": "num_experts"}

FAMILIES: dict[str, _Family] = {
    "mixtral": _Family("SM-R", _mixtral, _LOCAL, layers_default=32),
    "minimax": _Family("SM-R", _mixtral, _LOCAL, layers_default=32),
    "qwen2_moe": _Family("SM-F", _qwen_smf(60, 4, False, 1), {}, _qwen_sparse_step, 24,
                         "shared expert gated by sigmoid(Linear(H, 1)) inside the shared expert"),
    "qwen3_moe": _Family("SM-F", _qwen_smf(128, 8, False, 0, E="num_local_experts"), _LOCAL, _qwen_sparse_step, 24),
    "qwen3_next": _Family("SM-F", _qwen_smf(512, 10, True, 1), {}, _qwen_sparse_step, 48,
                          "shared expert gated by sigmoid(Linear(H, 1)) inside the shared expert"),
    "qwen4_exp_text": _Family("SM-F", _qwen_smf(512, 10, True, 1), {}, _all_moe, 40,
                              "shared expert gated by sigmoid(Linear(H, 1)) inside the shared expert"),
    "qwen3_5_moe_text": _Family("SM-R", _smr("num_experts", "num_experts_per_tok", 256, 8, shared=1), {},
                                _all_moe, 40, "shared expert gated by sigmoid(Linear(H, 1)) inside the shared expert"),
    "qwen3_vl_moe_text": _Family("SM-R", _smr("num_local_experts", "num_experts_per_tok", 60, 4), _LOCAL,
                                 _qwen_sparse_step, 24),
    "qwen3_omni_moe_text": _Family("SM-F", _qwen_smf(128, 8, True, 0), {}, _qwen_sparse_step, 28,
                                   "the thinker's text model"),
    # The talker's decoder layer replaces its MLP with the MoE block whatever decoder_sparse_step says.
    "qwen3_omni_moe_talker_text": _Family("SM-F", _qwen_smf(128, 8, False, 1, E="num_local_experts"), _LOCAL,
                                          _all_moe, 20,
                                          "shared expert gated by sigmoid(Linear(H, 1)) inside the shared expert"),
    "olmoe": _Family("SM-F", _qwen_smf(64, 8, False, 0), _NUM_EXPERTS, layers_default=16),
    "flex_olmo": _Family("SM-F", _qwen_smf(7, 5, False, 0), _NUM_EXPERTS, layers_default=32),
    "mellum": _Family("SM-F", _qwen_smf(64, 8, True, 0, E="num_local_experts"), _LOCAL, layers_default=28),
    "lara_mini": _Family("SM-F", _qwen_smf(128, 4, True, 1), {}, layers_default=34),
    "jamba": _Family("SM-F", _jamba, _NUM_EXPERTS, _jamba_layers, 32, "never renormalises"),
    "hunyuan_v1_moe": _Family("SM-R", _hunyuan, {"num_experts_per_tok": "moe_topk", "num_local_experts": "num_experts"},
                              layers_default=32, note="moe_topk may be a per-layer list (pass layer=)"),
    "dbrx": _Family("SM-R (p-norm)", _dbrx, {"n_layers": "num_hidden_layers"}, layers_default=24,
                    note="weights divided by their L-p norm, p = ffn_config.moe_normalize_expert_weights"),
    "aria_text": _Family("TK-SM", _topk_softmax("moe_num_experts", "moe_topk", 8, 2, "moe_num_shared_experts", 2),
                         layers_default=32),
    "granitemoe": _Family("TK-SM", _topk_softmax("num_local_experts", "num_experts_per_tok", 8, 2), layers_default=32),
    "granitemoeshared": _Family("TK-SM", _topk_softmax("num_local_experts", "num_experts_per_tok", 8, 2,
                                                       _granite_shared), layers_default=32),
    "granitemoe_swa": _Family("TK-SM", _topk_softmax("num_local_experts", "num_experts_per_tok", 8, 2,
                                                     _granite_shared), layers_default=32),
    "granitemoehybrid": _Family("TK-SM", _topk_softmax("num_local_experts", "num_experts_per_tok", 8, 2,
                                                       lambda v: 1), layers=_granite_hybrid_layers,
                                layers_default=32, note="num_local_experts = 0 (dense Granite-4.0-H): no MoE layers"),
    "jetmoe": _Family("TK-SM", _topk_softmax("num_local_experts", "num_experts_per_tok", 8, 2), layers_default=12,
                      note="the same gating also routes the mixture-of-attention heads"),
    "gpt_oss": _Family("TK-SM", _topk_softmax("num_local_experts", "num_experts_per_tok", 128, 4), _LOCAL,
                       layers_default=36, note="the gate's learned bias is part of the logits"),
    "openai_privacy_filter": _Family(
        "TK-SM", _topk_softmax("num_local_experts", "num_experts_per_tok", 128, 4), _LOCAL, layers_default=8,
        note="router divides by k, block multiplies by k: net factor 1; the gate's bias is part of the logits"),
    "cohere2_moe": _Family("TK-SM / SG", _cohere2, {}, _first_k_dense(0), 40,
                           note="'average' shared combination: rsf 1/2 and shared_expert_scale 1/2"),
    "llama4_text": _Family("SG (top-k on logits, no renorm)", _llama4, {}, _llama4_layers, 48),
    "flint": _Family("SG", _flint, {}, _sparse_step((0, 1)), 49),
    "deepseek_v2": _Family("DS2", _deepseek_v2({"E": 64, "S": 2}), _ROUTED_NE, _first_k_dense(0), 32,
                           "norm_topk_prob is ignored by the model"),
    "deepseek_ocr2_text": _Family("DS2", _deepseek_v2({"E": 64, "S": 2}), _ROUTED_NE, _first_k_dense(0), 32),
    "unlimited_ocr_text": _Family("DS2", _deepseek_v2({"E": 64, "K": 6, "S": 2, "n_group": 1, "topk_group": 1}),
                                  _ROUTED_NE, _first_k_dense(1), 12),
    "deepseek_v3": _Family("DS3", _ds3(), _ROUTED, _first_k_dense(3), 61,
                           "scoring_func / topk_method are ignored by the model (always sigmoid + noaux_tc)"),
    "sarvam_mla": _Family("DS3", _ds3(E_default=128, group_defaults=(1, 1)),
                          {**_ROUTED, **_ROUTED_NE, "num_shared_experts": "n_shared_experts"}, _first_k_dense(1), 32),
    "deepseek_v32": _Family("DS3", _ds3(), {**_ROUTED, "num_experts": "n_routed_experts"}, _first_k_dense(3), 61),
    "glm4_moe": _Family("DS3", _ds3(E_default=128, group_defaults=(1, 1), rsf_default=1.0), _ROUTED,
                        _first_k_dense(1), 46),
    "sarvam_moe": _Family("DS3", _ds3(E_default=128, K_default=6, group_defaults=(1, 1)),
                          {**_ROUTED, **_ROUTED_NE, "num_shared_experts": "n_shared_experts"}, _first_k_dense(1), 19),
    "glm4_moe_lite": _Family("DS3", _ds3(E_default=64, K_default=4, group_defaults=(1, 1), rsf_default=1.8),
                             _ROUTED, _fixed_dense_prefix(1), 47),
    "glm4v_moe_text": _Family("DS3", _ds3(E_default=128, group_defaults=(1, 1), rsf_default=1.0), _ROUTED,
                              _first_k_dense(1), 46),
    "glm_moe_dsa": _Family("DS3", _ds3(group_defaults=(1, 1)), {**_ROUTED, "num_experts": "n_routed_experts"},
                           _first_k_dense(3), 78),
    "glm5_next_text": _Family("DS3", _ds3(E_default=288, group_defaults=(1, 1)), _ROUTED, _fixed_dense_prefix(3), 45),
    "dots1": _Family("DS3", _ds3(E_default=None, K_default=None, group_defaults=(1, 1), norm_default=False,
                                 rsf_default=1.0, shared_default=None), _ROUTED, _first_k_dense(0), 62),
    "dots3_note_text": _Family("DS3", _ds3(group_defaults=(1, 1), rsf_default=1.0, shared=_dots3_shared), _ROUTED,
                               _first_k_dense(1, "moe_layer_freq"), 46),
    "solar_open": _Family("DS3", _ds3(E_default=128, group_defaults=(1, 1), rsf_default=1.0), _ROUTED,
                          _all_moe, 48, "every layer is MoE (first_k_dense_replace is not read)"),
    "mimo_v2_flash": _Family("DS3", _ds3(group_defaults=(1, 1), rsf_default=1.0, shared=None, shared_default=0),
                             _ROUTED, _fixed_dense_prefix(1), 48, "no shared experts"),
    "nemotron_h": _Family("DS3", _ds3(E_default=8, K_default=2, group_defaults=(1, 1), rsf_default=1.0,
                                      shared=lambda v: 1), _ROUTED, _nemotron_layers, None,
                          "one shared MLP of moe_shared_expert_intermediate_size"),
    "kimi_linear": _Family("DS3", _ds3(E="num_experts", K="num_experts_per_token",
                                       groups=("num_expert_group", "topk_group"), group_defaults=(1, 1),
                                       norm="moe_renormalize", rsf_default=2.446, shared="num_shared_experts"),
                           {"norm_topk_prob": "moe_renormalize", "n_group": "num_expert_group",
                            "num_local_experts": "num_experts", "num_experts_per_tok": "num_experts_per_token",
                            "n_shared_experts": "num_shared_experts"}, _first_k_dense(1), 27),
    "bailing_hybrid": _Family("DS3", _ds3(E="num_experts", K="num_experts_per_token", E_default=512,
                                          groups=("num_expert_group", "topk_group"), norm="moe_renormalize",
                                          shared="num_shared_experts"),
                              {"norm_topk_prob": "moe_renormalize", "n_group": "num_expert_group",
                               "num_local_experts": "num_experts", "num_experts_per_tok": "num_experts_per_token",
                               "n_shared_experts": "num_shared_experts"}, _first_k_dense(2), 42),
    "axk1": _Family("DS3", _ds3(E_default=192), _ROUTED, _first_k_dense(1, "moe_layer_freq"), 61),
    "hy_v4": _Family("DS3", _ds3(group_defaults=(1, 1), rsf_default=2.827), _ROUTED, _fixed_dense_prefix(1), 34),
    "hy_v4_vl_text": _Family("DS3", _ds3(group_defaults=(1, 1), rsf_default=2.827), _ROUTED,
                             _fixed_dense_prefix(1), 78),
    "exaone_moe": _Family("DS3", _ds3(E="num_experts", E_default=64, group_defaults=(1, 1),
                                      shared="num_shared_experts"), {}, _first_k_dense(1), 32),
    "beam": _Family("DS3", _ds3(E="num_experts", shared=None, shared_default=0), {}, _fixed_dense_prefix(3), 52,
                    "the block, not the router, multiplies by routed_scaling_factor"),
    "axk2": _Family("AXK2 (DS3, groups filled with 0.0)",
                    _ds3(E_default=128, group_defaults=(None, None), group_fill="zero",
                         null_groups_ungrouped=True), _ROUTED,
                    _first_k_dense(1, "moe_layer_freq"), 48),
    "mistral4": _Family("M4", _mistral4("norm_topk_prob"), _ROUTED, _first_k_dense(0), 36),
    "mistral_large4_text": _Family("M4", _mistral4(True), {**_ROUTED, "num_experts": "n_routed_experts"},
                                   _first_k_dense(1), 72),
    "deepseek_v4": _Family("SB", _deepseek_v4, {"num_local_experts": "n_routed_experts"}, _deepseek_v4_layers, 43,
                           "hash layers: ids = tid2eid[input_ids]; norm_topk_prob is ignored"),
    "inkling2_text": _Family("SB", _inkling2(384, 8), {**_ROUTED, "routed_scaling_factor": "route_scale"},
                             layers_default=48),
    "inkling2_loop_text": _Family("SB", _inkling2(128, 8), {**_ROUTED, "routed_scaling_factor": "route_scale"},
                                  layers_default=24),
    "muse_spark_text": _Family("SB", _muse_spark, {}, layers_default=62, note="logits x output_multiplier"),
    "minimax_m2": _Family("SB", _minimax_m2, _LOCAL, layers_default=62, note="bias lives on the block"),
    "minimax_m3_vl_text": _Family("SB", _minimax_m3, _LOCAL, _moe_layer_freq, 60,
                                  "the block multiplies by routed_scaling_factor"),
    # Step3p7TextConfig lists num_local_experts as an alias, yet n_routed_experts keeps its default with it.
    "step3p5": _Family("SB", _step3p7, {"moe_num_experts": "n_routed_experts", "moe_top_k": "num_experts_per_tok"},
                       _step3p7_layers, 45, "Step3p7's text model; the block multiplies by moe_router_scaling_factor"),
    "hy_v3": _Family("SB", _hy_v3, _NUM_EXPERTS, _fixed_dense_prefix(1), 80, "bias lives on the block"),
    "afmoe": _Family("SB", _afmoe, {}, _num_dense_layers(1), 32, "bias lives on the block (expert_bias)"),
    "lfm2_moe": _Family("SB", _lfm2_moe, {}, _num_dense_layers(2), 32, "bias only with use_expert_bias"),
    "laguna": _Family("SB + softcap", _laguna, {}, _fixed_dense_prefix(1), 40,
                      "the block multiplies by moe_routed_scaling_factor"),
    "kolibri1": _Family("Kolibri1 (top-k on logits + bias)", _kolibri1, _LOCAL, layers_default=50),
    "ernie4_5_moe": _Family("SMB (clamp)", _ernie, {"num_experts": "moe_num_experts", "num_experts_per_tok": "moe_k"},
                            _ernie_layers, 28),
    "ernie4_5_vl_moe_text": _Family("SMB (clamp)", _ernie,
                                    {"num_experts": "moe_num_experts", "num_experts_per_tok": "moe_k"},
                                    _fixed_dense_prefix(1), 28, "text and vision experts share E and K"),
    "longcat_flash": _Family("SMB (zero experts)", _longcat, {"num_local_experts": "n_routed_experts",
                                                              "num_experts_per_tok": "moe_topk"},
                              _longcat_layers, 56),
    "dots3_note_vision_encoder": _Family("SB (per-block E and K)", _dots3_vision, {}, _dots3_vision_layers, 42,
                                         "dots3-note's vision encoder: pass its vision_config and layer="),
    "gemma4_text": _Family("SM-R + per-expert scale", _gemma4, {}, _gemma4_layers, 30,
                           note="runs in parallel with the dense MLP; gate input is RMSNorm(h) * scale / sqrt(H)"),
    "diffusion_gemma_text": _Family("SM-R + per-expert scale", _gemma4, {}, _gemma4_layers, 30),
}

# Model types that are another family's config, or a wrapper around a text config.
SYNONYMS: dict[str, str] = {
    "qwen4_exp": "qwen4_exp_text", "qwen3_5_moe": "qwen3_5_moe_text", "qwen3_vl_moe": "qwen3_vl_moe_text",
    "aria": "aria_text", "llama4": "llama4_text", "glm4v_moe": "glm4v_moe_text", "glm5_next": "glm5_next_text",
    "hy_v4_vl": "hy_v4_vl_text", "mistral_large4": "mistral_large4_text", "minimax_m3_vl": "minimax_m3_vl_text",
    "step3p7": "step3p5", "step3p7_text": "step3p5", "inkling2": "inkling2_text",
    "inkling2_loop": "inkling2_loop_text", "muse_spark": "muse_spark_text", "dots3_note": "dots3_note_text",
    "deepseek_ocr2": "deepseek_ocr2_text", "unlimited_ocr": "unlimited_ocr_text", "gemma4": "gemma4_text",
    "diffusion_gemma": "diffusion_gemma_text", "ernie4_5_vl_moe": "ernie4_5_vl_moe_text",
    "qwen3_omni_moe": "qwen3_omni_moe_text", "qwen3_omni_moe_thinker": "qwen3_omni_moe_text",
    "kimi_k2": "deepseek_v3", "kimi_k25": "deepseek_v3",
}

# Where a wrapper keeps the config of its MoE text model.
_SUBCONFIG_PATH: dict[str, tuple[str, ...]] = {
    "qwen3_omni_moe": ("thinker_config", "text_config"),
    "qwen3_omni_moe_thinker": ("text_config",),
}

# Wrappers whose released config.json keeps the text model's config under another key, which their transformers
# config class renames to text_config on load.
_LEGACY_TEXT_KEY: dict[str, str] = {"unlimited_ocr": "language_config", "nemotron_h_omni": "llm_config"}

UNSUPPORTED: dict[str, str] = {
    "phimoe": "Phi-MoE's sparsemixer: two argmax stages that mask experts within 2*eps of the max "
              "(eps = router_jitter_noise, active at inference); would need a 'sparsemixer' selection with eps",
    "switch_transformers": "Switch: top-1 with per-sequence expert capacity (overflowing tokens dropped); "
                           "would need a capacity (token-dropping) step over a [B, S] batch",
    "nllb-moe": "NLLB-MoE: top-2 with eval capacity, second-expert policy and batch-prioritised routing; "
                "would need a capacity (token-dropping) step",
    "inkling_mm_model": "Inkling v1: routed weights normalised jointly with router-gated shared experts and x a "
                        "learned global_scale; would need shared-expert scores in the renorm sum",
    "inkling_text": "Inkling v1: routed weights normalised jointly with router-gated shared experts and x a learned "
                    "global_scale; would need shared-expert scores in the renorm sum",
    "zaya": "ZAYA: an MLP router with state carried across layers and an (E+1)-th skip class masked after "
            "selection; would need a skip-class field (the router MLP itself is the caller's gate projection)",
    "doge": "Doge: product-key routing (two half-key top-k's, Cartesian sums, then top-k); would need a "
            "product-key selection step",
}


# ----------------------------------------------------------------------------------------------------------
# Public API


def _resolve(cfg: dict) -> tuple[str, dict]:
    """(family model type, the dict holding its keys): unwrap multimodal / omni wrappers."""
    model_type = cfg.get("model_type") or ""
    if model_type in UNSUPPORTED:
        raise NotImplementedError(f"from_hf_config: {model_type} is not a per-token top-k router: "
                                  f"{UNSUPPORTED[model_type]}")
    path = _SUBCONFIG_PATH.get(model_type)
    if path is not None and isinstance(cfg.get(path[0]), dict):
        sub = cfg
        for key in path:
            sub = sub.get(key) or {}
        return _resolve({"model_type": "qwen3_omni_moe_text", **sub})
    family = SYNONYMS.get(model_type, model_type)
    text = cfg.get("text_config")
    if not (isinstance(text, dict) and text) and model_type in _LEGACY_TEXT_KEY:
        text = cfg.get(_LEGACY_TEXT_KEY[model_type])
    if isinstance(text, dict) and text:
        return _resolve({**text, "model_type": text.get("model_type") or family})
    if family in FAMILIES:
        return family, cfg
    known = ", ".join(sorted(set(FAMILIES) | set(SYNONYMS)))
    raise ValueError(f"from_hf_config: model_type {model_type!r} is not a MoE family moegate knows; "
                     f"known model types: {known}")


def _view(config, layer: int | None) -> tuple[_Family, _View]:
    cfg = _as_dict(config)
    family, sub = _resolve(cfg)
    fam = FAMILIES[family]
    return fam, _View(sub, family, fam.aliases, layer)


def from_hf_config(config, *, layer: int | None = None) -> RouterConfig:
    """The RouterConfig of the MoE layers of a transformers model config.

    Parameters
    ----------
    config : dict, str / Path to a config.json (or to the model folder holding it), or a ``PretrainedConfig``
        The model's config. Multimodal wrappers are unwrapped to their ``text_config`` (Qwen3-Omni: the
        thinker's text model; Unlimited-OCR's ``language_config`` and Nemotron-H-Omni's ``llm_config`` as
        their config classes read them). Keys the config omits take the defaults of the model's transformers config
        class; only the aliases transformers accepts are read (a wrong alias keeps the default, as it does
        in transformers).
    layer : int, optional
        The decoder layer to describe. Per-layer lists (HunYuan-MoE-V1's num_experts / moe_topk) are read at
        it (without it they must be uniform); a hash layer (DeepSeek-V4) gives ``routing="hash"``; a dense
        layer is a ValueError.

    Returns
    -------
    RouterConfig
        Reproduces the routed weights the model's MoE layer applies: where the block scales the routed output
        (Beam, MiniMax-M3, Step3p7, Laguna; OpenAI-privacy-filter's 1/k x k) the net factor is in
        ``routed_scaling_factor``. ``route`` takes the gate projection's raw output as logits.

    Raises
    ------
    NotImplementedError
        For families whose routing is not a per-token top-k (Switch, NLLB, Phi-MoE, Inkling v1, ZAYA, Doge),
        naming what moegate would need.
    ValueError
        For an unknown model type, a config without MoE layers, a missing required key, or a value of the wrong kind
        (a count that is not a whole number, a switch that is not true / false / null, a factor that is not a
        number), naming the key.
    TypeError
        For a ``layer`` that is not an int.
    """
    if layer is not None:
        if isinstance(layer, bool) or not isinstance(layer, numbers.Integral):
            raise TypeError(f"from_hf_config: layer must be an int or None, got {layer!r}")
        layer = int(layer)
    fam, v = _view(config, layer)
    if layer is None:
        try:
            types = _layer_types(fam, v)
        except _NoLayerCount:  # no layer count to derive them from: the router of the MoE layers, as configured
            types = None
        if types is not None and not any(t in ("moe", "hash") for t in types):
            raise ValueError(f"{v.model_type}: the config has no MoE layers (every one of its {len(types)} decoder "
                             "layers is dense)")
    router = fam.build(v)
    if layer is not None:
        kind = _layer_types(fam, v)[layer] if 0 <= layer < len(_layer_types(fam, v)) else None
        if kind is None:
            raise ValueError(f"layer must be in [0, {len(_layer_types(fam, v))}), got {layer}")
        if kind == "dense":
            raise ValueError(f"{v.model_type}: layer {layer} is dense (no routed experts)")
        if kind == "hash":
            router = router.replace(routing="hash", has_correction_bias=False)
    return router


def moe_layer_types(config) -> list[str]:
    """One entry per decoder layer: "dense" (no routed experts), "moe" (top-k routing) or "hash".

    Read from ``mlp_layer_types`` where the config has it, else derived the way the model's config class does
    (``first_k_dense_replace``, ``decoder_sparse_step`` + ``mlp_only_layers``, ``moe_layers``,
    ``expert_layer_period/offset``, ``moe_layer_start_index``, hash layers of DeepSeek-V4, ...).
    """
    fam, v = _view(config, None)
    return _layer_types(fam, v)


class _NoLayerCount(ValueError):
    """The config has no num_hidden_layers (from_hf_config without a layer then reads the MoE layers' router)."""


def _layer_types(fam: _Family, v: _View) -> list[str]:
    explicit = v.raw("mlp_layer_types")
    if explicit:
        unknown = sorted(set(explicit) - set(_MLP_LAYER_TYPE))
        if unknown:
            raise ValueError(f"{v.model_type}: unknown mlp_layer_types entries {unknown}")
        n = v.raw("num_hidden_layers")
        # Older Hub configs pad the list with the next-token-prediction layers' entries; transformers keeps the
        # first num_hidden_layers (Step3p7, DeepSeek-V4).
        return [_MLP_LAYER_TYPE[t] for t in (explicit if n is None else explicit[:n])]
    n = v.raw("num_hidden_layers", fam.layers_default)
    if n is None and fam.layers is not _nemotron_layers:
        raise _NoLayerCount(f"{v.model_type}: the config has no num_hidden_layers")
    return fam.layers(v, n if n is None else _count(v, "num_hidden_layers", n))


def family_of(config) -> str:
    """The family (model type of the MoE text model) that ``from_hf_config`` reads the config as."""
    return _resolve(_as_dict(config))[0]


def semantics_of(model_type: str) -> str:
    """The semantics class (docs/models.md, the Class table) of a model type, or why it is not supported."""
    if model_type in UNSUPPORTED:
        return "not supported: " + UNSUPPORTED[model_type]
    return FAMILIES[SYNONYMS.get(model_type, model_type)].semantics
