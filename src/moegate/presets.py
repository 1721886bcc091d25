"""Named RouterConfigs of flagship models, built from their published config.json values.

Each preset is the model's config.json as transformers reads it (model_type and the real keys, routing keys
complete; nested ``text_config`` for multimodal wrappers), and ``preset(name)`` is exactly
``from_hf_config(preset_hf_config(name))``: a preset can never disagree with the family mapping that the
model-router tests check.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from moegate.config import RouterConfig
from moegate.hf import from_hf_config


@dataclass(frozen=True)
class Preset:
    """One named model: where its config comes from and the config.json keys moegate reads."""

    name: str
    source: str  # the Hub repository whose config.json these values come from
    _hf_config: dict = field(repr=False, hash=False)

    @property
    def hf_config(self) -> dict:
        """The model's config.json keys, a fresh copy (safe to modify: the preset keeps its own)."""
        return copy.deepcopy(self._hf_config)


def _p(name: str, source: str, **hf_config) -> Preset:
    return Preset(name, source, hf_config)


_DEEPSEEK_V3 = dict(
    model_type="deepseek_v3", hidden_size=7168, num_hidden_layers=61, moe_intermediate_size=2048,
    n_routed_experts=256, num_experts_per_tok=8, n_group=8, topk_group=4, n_shared_experts=1,
    routed_scaling_factor=2.5, norm_topk_prob=True, scoring_func="sigmoid", topk_method="noaux_tc",
    first_k_dense_replace=3, moe_layer_freq=1,
)
_KIMI_K2_TEXT = dict(
    model_type="kimi_k2", hidden_size=7168, num_hidden_layers=61, moe_intermediate_size=2048,
    n_routed_experts=384, num_experts_per_tok=8, n_group=1, topk_group=1, n_shared_experts=1,
    routed_scaling_factor=2.827, norm_topk_prob=True, scoring_func="sigmoid", topk_method="noaux_tc",
    first_k_dense_replace=1, moe_layer_freq=1,
)
_GLM_4_5 = dict(
    model_type="glm4_moe", hidden_size=5120, num_hidden_layers=92, moe_intermediate_size=1536,
    n_routed_experts=160, num_experts_per_tok=8, n_group=1, topk_group=1, n_shared_experts=1,
    routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=3,
)

_PRESET_LIST = [
    # DeepSeek: DS3 (sigmoid + noaux_tc bias, 8 groups keep 4), DS2 (softmax, group-limited greedy), V4 (SB).
    _p("deepseek-v3", "deepseek-ai/DeepSeek-V3", **_DEEPSEEK_V3),
    _p("deepseek-r1", "deepseek-ai/DeepSeek-R1", **_DEEPSEEK_V3),
    _p("deepseek-v3.2", "deepseek-ai/DeepSeek-V3.2-Exp", **{**_DEEPSEEK_V3, "model_type": "deepseek_v32"}),
    _p("deepseek-v2", "deepseek-ai/DeepSeek-V2",
       model_type="deepseek_v2", hidden_size=5120, num_hidden_layers=60, moe_intermediate_size=1536,
       n_routed_experts=160, num_experts_per_tok=6, n_group=8, topk_group=3, n_shared_experts=2,
       routed_scaling_factor=16.0, norm_topk_prob=False, scoring_func="softmax", topk_method="group_limited_greedy",
       first_k_dense_replace=1, moe_layer_freq=1),
    _p("deepseek-v2-lite", "deepseek-ai/DeepSeek-V2-Lite",
       model_type="deepseek_v2", hidden_size=2048, num_hidden_layers=27, moe_intermediate_size=1408,
       n_routed_experts=64, num_experts_per_tok=6, n_group=1, topk_group=1, n_shared_experts=2,
       routed_scaling_factor=1.0, norm_topk_prob=False, scoring_func="softmax", topk_method="greedy",
       first_k_dense_replace=1, moe_layer_freq=1),
    _p("deepseek-v4", "deepseek-ai/DeepSeek-V4-Flash-Base",
       model_type="deepseek_v4", num_hidden_layers=43, moe_intermediate_size=2048, n_routed_experts=256,
       num_experts_per_tok=6, n_shared_experts=1, routed_scaling_factor=1.5, scoring_func="sqrtsoftplus",
       norm_topk_prob=True, num_hash_layers=3),
    # Kimi K2 / K2.5: DeepSeek-V3 modeling with 384 experts, no groups.
    _p("kimi-k2", "moonshotai/Kimi-K2-Instruct", **_KIMI_K2_TEXT),
    _p("kimi-k2.5", "moonshotai/Kimi-K2.5",
       model_type="kimi_k25", text_config=dict(_KIMI_K2_TEXT)),
    _p("kimi-linear", "moonshotai/Kimi-Linear-48B-A3B-Instruct",
       model_type="kimi_linear", hidden_size=2304, num_hidden_layers=27, moe_intermediate_size=1024,
       num_experts=256, num_experts_per_token=8, num_expert_group=1, topk_group=1, num_shared_experts=1,
       routed_scaling_factor=2.446, moe_renormalize=True, first_k_dense_replace=1),
    # Qwen: SM-F (renorm by norm_topk_prob), SM-R for Qwen3.5.
    _p("qwen3-moe", "Qwen/Qwen3-30B-A3B",
       model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=48, moe_intermediate_size=768,
       num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[]),
    _p("qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B",
       model_type="qwen3_moe", hidden_size=4096, num_hidden_layers=94, moe_intermediate_size=1536,
       num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[]),
    _p("qwen3-next", "Qwen/Qwen3-Next-80B-A3B-Instruct",
       model_type="qwen3_next", hidden_size=2048, num_hidden_layers=48, moe_intermediate_size=512,
       shared_expert_intermediate_size=512, num_experts=512, num_experts_per_tok=10, norm_topk_prob=True,
       decoder_sparse_step=1, mlp_only_layers=[]),
    _p("qwen3.5-moe", "Qwen/Qwen3.5-35B-A3B",
       model_type="qwen3_5_moe",
       text_config=dict(model_type="qwen3_5_moe_text", hidden_size=2048, num_hidden_layers=40,
                        moe_intermediate_size=512, shared_expert_intermediate_size=512, num_experts=256,
                        num_experts_per_tok=8)),
    _p("qwen1.5-moe", "Qwen/Qwen1.5-MoE-A2.7B",
       model_type="qwen2_moe", hidden_size=2048, num_hidden_layers=24, moe_intermediate_size=1408,
       shared_expert_intermediate_size=5632, num_experts=60, num_experts_per_tok=4, norm_topk_prob=False,
       decoder_sparse_step=1, mlp_only_layers=[]),
    # Mixtral / MiniMax: SM-R.
    _p("mixtral", "mistralai/Mixtral-8x7B-v0.1",
       model_type="mixtral", hidden_size=4096, num_hidden_layers=32, num_local_experts=8, num_experts_per_tok=2),
    _p("mixtral-8x22b", "mistralai/Mixtral-8x22B-v0.1",
       model_type="mixtral", hidden_size=6144, num_hidden_layers=56, num_local_experts=8, num_experts_per_tok=2),
    _p("minimax-text-01", "MiniMaxAI/MiniMax-Text-01-hf",
       model_type="minimax", hidden_size=6144, num_hidden_layers=80, num_local_experts=32, num_experts_per_tok=2),
    _p("minimax-m2", "MiniMaxAI/MiniMax-M2",
       model_type="minimax_m2", hidden_size=3072, num_hidden_layers=62, num_local_experts=256,
       num_experts_per_tok=8, scoring_func="sigmoid", use_routing_bias=True),
    # GPT-OSS: top-k on the logits (the gate has a learned bias), softmax over the k.
    _p("gpt-oss", "openai/gpt-oss-120b",
       model_type="gpt_oss", hidden_size=2880, num_hidden_layers=36, num_local_experts=128,
       num_experts_per_tok=4, experts_per_token=4),
    _p("gpt-oss-20b", "openai/gpt-oss-20b",
       model_type="gpt_oss", hidden_size=2880, num_hidden_layers=24, num_local_experts=32,
       num_experts_per_tok=4, experts_per_token=4),
    # Llama 4: top-1 on the logits, sigmoid, no renorm, one shared expert.
    _p("llama4", "meta-llama/Llama-4-Scout-17B-16E",
       model_type="llama4", text_config=dict(model_type="llama4_text", hidden_size=5120, num_hidden_layers=48,
                                             num_local_experts=16, num_experts_per_tok=1,
                                             interleave_moe_layer_step=1)),
    _p("llama4-maverick", "meta-llama/Llama-4-Maverick-17B-128E",
       model_type="llama4", text_config=dict(model_type="llama4_text", hidden_size=5120, num_hidden_layers=48,
                                             num_local_experts=128, num_experts_per_tok=1,
                                             interleave_moe_layer_step=2)),
    # GLM: DS3 without groups.
    _p("glm-4.5", "zai-org/GLM-4.5", **_GLM_4_5),
    _p("glm-4.6", "zai-org/GLM-4.6", **_GLM_4_5),
    _p("glm-4.5-air", "zai-org/GLM-4.5-Air",
       model_type="glm4_moe", hidden_size=4096, num_hidden_layers=46, moe_intermediate_size=1408,
       n_routed_experts=128, num_experts_per_tok=8, n_group=1, topk_group=1, n_shared_experts=1,
       routed_scaling_factor=1.0, norm_topk_prob=True, first_k_dense_replace=1),
    _p("glm-5", "zai-org/GLM-5",
       model_type="glm_moe_dsa", num_hidden_layers=78, moe_intermediate_size=2048, n_routed_experts=256,
       num_experts_per_tok=8, n_group=1, topk_group=1, n_shared_experts=1, routed_scaling_factor=2.5,
       norm_topk_prob=True, first_k_dense_replace=3),
    _p("mimo-v2-flash", "XiaomiMiMo/MiMo-V2-Flash",
       model_type="mimo_v2_flash", num_hidden_layers=48, moe_intermediate_size=2048, n_routed_experts=256,
       num_experts_per_tok=8, n_group=1, topk_group=1, routed_scaling_factor=None, norm_topk_prob=True),
    # ERNIE 4.5: softmax + bias on the probabilities, renorm clamped at moe_norm_min.
    _p("ernie-4.5", "baidu/ERNIE-4.5-300B-A47B-PT",
       model_type="ernie4_5_moe", hidden_size=8192, num_hidden_layers=54, moe_intermediate_size=3584,
       moe_num_experts=64, moe_k=8, moe_num_shared_experts=0, moe_layer_start_index=3, moe_layer_end_index=53,
       moe_layer_interval=1),
    _p("ernie-4.5-21b-a3b", "baidu/ERNIE-4.5-21B-A3B-PT",
       model_type="ernie4_5_moe", hidden_size=2560, num_hidden_layers=28, moe_intermediate_size=1536,
       moe_num_experts=64, moe_k=6, moe_num_shared_experts=2, moe_layer_start_index=1, moe_layer_end_index=27,
       moe_layer_interval=1),
    # LongCat-Flash: softmax over 512 real + 256 zero (identity) experts, bias, no renorm, x 6.
    _p("longcat-flash", "meituan-longcat/LongCat-Flash-Chat",
       model_type="longcat_flash", hidden_size=6144, num_layers=28, expert_ffn_hidden_size=2048,
       n_routed_experts=512, moe_topk=12, zero_expert_num=256, routed_scaling_factor=6.0),
    # Gemma 4 26B-A4B: softmax top-8 of 128 with per-expert scales, in parallel with a dense MLP.
    _p("gemma4", "google/gemma-4-26B-A4B",
       model_type="gemma4", text_config=dict(model_type="gemma4_text", num_hidden_layers=30,
                                             enable_moe_block=True, num_experts=128, top_k_experts=8)),
    # Older MoE families.
    _p("dbrx", "databricks/dbrx-instruct",
       model_type="dbrx", d_model=6144, n_layers=40,
       ffn_config=dict(moe_num_experts=16, moe_top_k=4, moe_normalize_expert_weights=1.0, ffn_hidden_size=10752)),
    _p("olmoe", "allenai/OLMoE-1B-7B-0924",
       model_type="olmoe", hidden_size=2048, num_hidden_layers=16, num_experts=64, num_experts_per_tok=8,
       norm_topk_prob=False),
    _p("jamba", "ai21labs/Jamba-v0.1",
       model_type="jamba", hidden_size=4096, num_hidden_layers=32, num_experts=16, num_experts_per_tok=2,
       expert_layer_period=2, expert_layer_offset=1),
]

# Read-only: preset() builds from a copy of hf_config, so nothing a caller does to these changes a later preset().
PRESETS: Mapping[str, Preset] = MappingProxyType({p.name: p for p in _PRESET_LIST})

DEFAULT_PRESET = "deepseek-v3"


def preset_names() -> list[str]:
    """The exact names ``preset`` accepts, sorted."""
    return sorted(PRESETS)


def _get(name: str) -> Preset:
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(preset_names())}") from None


def preset_hf_config(name: str) -> dict:
    """The model's config.json keys (a fresh copy, safe to modify). Raises ValueError for an unknown name."""
    return _get(name).hf_config


def preset_source(name: str) -> str:
    """The Hub repository the preset's values come from."""
    return _get(name).source


def preset(name: str) -> RouterConfig:
    """The RouterConfig of a named model: ``from_hf_config(preset_hf_config(name))``.

    Raises ValueError listing the known names when ``name`` is not one of them (exact match only).
    """
    return from_hf_config(preset_hf_config(name))
