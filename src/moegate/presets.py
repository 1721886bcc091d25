"""Named RouterConfigs of flagship models, built from their published config values."""

from __future__ import annotations

from moegate.config import RouterConfig

PRESETS: dict[str, RouterConfig] = {
    # DeepSeek-V3 / R1 config.json: n_routed_experts=256, num_experts_per_tok=8, n_group=8, topk_group=4,
    # sigmoid + noaux_tc bias, norm_topk_prob=true, routed_scaling_factor=2.5, n_shared_experts=1.
    "deepseek-v3": RouterConfig(
        num_experts=256, top_k=8, scoring="sigmoid", has_correction_bias=True, n_group=8, topk_group=4,
        renormalize=True, routed_scaling_factor=2.5, num_shared_experts=1,
    ),
    # Qwen3-30B-A3B config.json: num_experts=128, num_experts_per_tok=8, norm_topk_prob=true.
    "qwen3-moe": RouterConfig(num_experts=128, top_k=8, scoring="softmax", renormalize=True, renorm_eps=0.0),
    # Mixtral-8x7B config.json: num_local_experts=8, num_experts_per_tok=2.
    "mixtral": RouterConfig(num_experts=8, top_k=2, scoring="softmax", renormalize=True, renorm_eps=0.0),
}

DEFAULT_PRESET = "deepseek-v3"


def preset_names() -> list[str]:
    return sorted(PRESETS)


def preset(name: str) -> RouterConfig:
    """The RouterConfig of a named model. Raises ValueError listing the known names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(preset_names())}") from None
