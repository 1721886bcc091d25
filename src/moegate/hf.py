"""from_hf_config: the RouterConfig of a transformers MoE model's config."""

from __future__ import annotations

import json
from pathlib import Path

from moegate.config import RouterConfig


def _as_dict(config) -> dict:
    if isinstance(config, dict):
        return config
    if isinstance(config, (str, Path)):
        return json.loads(Path(config).read_text())
    if hasattr(config, "to_dict"):
        return config.to_dict()
    raise TypeError(f"config must be a dict, a path to config.json or a PretrainedConfig, got {type(config).__name__}")


def from_hf_config(config) -> RouterConfig:
    """The RouterConfig of the MoE layers of a model config (dict, config.json path or PretrainedConfig)."""
    cfg = _as_dict(config)
    model_type = cfg.get("model_type")
    if model_type in ("deepseek_v3", "kimi_k2"):
        return RouterConfig(
            num_experts=cfg["n_routed_experts"], top_k=cfg["num_experts_per_tok"], scoring="sigmoid",
            has_correction_bias=True, n_group=cfg.get("n_group", 1), topk_group=cfg.get("topk_group", 1),
            renormalize=cfg.get("norm_topk_prob", True), routed_scaling_factor=cfg.get("routed_scaling_factor", 1.0),
            num_shared_experts=cfg.get("n_shared_experts", 0),
        )
    if model_type == "mixtral":
        return RouterConfig(num_experts=cfg["num_local_experts"], top_k=cfg["num_experts_per_tok"], renorm_eps=0.0)
    raise NotImplementedError(f"from_hf_config: model_type {model_type!r} is not supported yet")
