"""from_hf_config against the models' own routers (transformers 5.24.0, CPU, fp32).

Each case builds the family's router module from a tiny config, randomizes every parameter and buffer (many
start at zeros, which would make top-k all ties), runs it, and compares with
``route(logits, from_hf_config(cfg), bias=..., backend="reference")``: the same expert set per token (compared
sorted by id) and weights within 1e-6. The logits are the gate projection applied to the hidden states, as
the router computes them. Where the MoE block, not the router, scales the routed output, the model's weights
are multiplied by that factor: routing must reproduce what the layer computes.
"""

from __future__ import annotations

import importlib
import json
import math
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from moegate import from_hf_config, route
from moegate.hf import FAMILIES, SYNONYMS, UNSUPPORTED, moe_layer_types
from moegate.reference import scores_and_keys

transformers = pytest.importorskip("transformers", reason="transformers is not installed: no model routers to compare")

H, E, K, N = 32, 16, 4, 67
ATOL = 1e-6
GROUPS = dict(n_group=4, topk_group=2)


@dataclass
class Case:
    id: str
    module: str  # transformers.models.<module>.modeling_<module>
    config_cls: str
    router_cls: str
    kwargs: dict
    variants: list = field(default_factory=lambda: [{}])  # config overrides: flags on and off
    call: str = "std"  # how the router is built and called, see _run_model
    gate: str = "weight"  # attribute holding the gate projection's weight
    gate_bias: str | None = None  # attribute holding the gate projection's bias (part of the logits)
    bias: str | None = None  # "arg" (passed to forward) or the attribute path of the correction bias
    bias_std: float = 0.1
    bias_mean: float = 0.0  # a negative mean makes biased sigmoid keys negative: the group fill value then matters
    factor: object = None  # the block's factor on the routed output: a float, a config key, or a callable
    model_type: str | None = None  # the model_type of a dict with the same keys, if not config_cls.model_type
    layer: int | None = None  # the decoder layer (per-layer values, hash layers)
    layer_kwargs: dict = field(default_factory=dict)  # extra config keys a whole decoder layer needs


def _c(id, module, config_cls, router_cls, kwargs, variants=None, **kw):
    return Case(id, module, config_cls, router_cls, kwargs, variants or [{}], **kw)


EK = dict(num_experts=E, num_experts_per_tok=K)
EK_LOCAL = dict(num_local_experts=E, num_experts_per_tok=K)
EK_ROUTED = dict(n_routed_experts=E, num_experts_per_tok=K)
NORM = [{"norm_topk_prob": True}, {"norm_topk_prob": False}]
DS3_VARIANTS = [
    {},
    {"norm_topk_prob": True, "routed_scaling_factor": 2.5, **GROUPS},
    {"norm_topk_prob": False, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1},
    {"norm_topk_prob": True, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1},
    {"norm_topk_prob": False, "routed_scaling_factor": 1.7, **GROUPS},
]
HEADS = dict(hidden_size=H, num_attention_heads=4, num_key_value_heads=4)
BIAS = "e_score_correction_bias"


def _ds3(id, module, config_cls, router_cls, ek=EK_ROUTED, variants=DS3_VARIANTS, **kw):
    kw = {"bias_mean": -0.6, "bias_std": 0.2, **kw}
    return _c(id, module, config_cls, router_cls, {**HEADS, **ek}, variants, bias=BIAS, **kw)


CASES = [
    # SM-R / SM-F: softmax -> top-k -> [renorm]
    _c("mixtral", "mixtral", "MixtralConfig", "MixtralTopKRouter", {**HEADS, **EK_LOCAL}),
    _c("minimax", "minimax", "MiniMaxConfig", "MiniMaxTopKRouter", {**HEADS, **EK_LOCAL}),
    _c("qwen2_moe", "qwen2_moe", "Qwen2MoeConfig", "Qwen2MoeTopKRouter", {**HEADS, **EK}, [{}, *NORM]),
    _c("qwen3_moe", "qwen3_moe", "Qwen3MoeConfig", "Qwen3MoeTopKRouter", {**HEADS, **EK}, [{}, *NORM]),
    _c("qwen3_next", "qwen3_next", "Qwen3NextConfig", "Qwen3NextTopKRouter", {**HEADS, **EK}, [{}, *NORM]),
    _c("qwen4_exp", "qwen4_exp", "Qwen4ExpTextConfig", "Qwen4ExpTextTopKRouter", {**HEADS, **EK}, [{}, *NORM]),
    _c("qwen3_5_moe", "qwen3_5_moe", "Qwen3_5MoeTextConfig", "Qwen3_5MoeTopKRouter", {**HEADS, **EK}),
    _c("qwen3_vl_moe", "qwen3_vl_moe", "Qwen3VLMoeTextConfig", "Qwen3VLMoeTextTopKRouter", {**HEADS, **EK}),
    _c("qwen3_omni_thinker", "qwen3_omni_moe", "Qwen3OmniMoeTextConfig", "Qwen3OmniMoeThinkerTextTopKRouter",
       {**HEADS, **EK}, [{}, *NORM]),
    _c("qwen3_omni_talker", "qwen3_omni_moe", "Qwen3OmniMoeTalkerTextConfig", "Qwen3OmniMoeTalkerTextTopKRouter",
       {**HEADS, **EK}, [{}, *NORM]),
    _c("olmoe", "olmoe", "OlmoeConfig", "OlmoeTopKRouter", {**HEADS, **EK}, [{}, *NORM]),
    _c("flex_olmo", "flex_olmo", "FlexOlmoConfig", "FlexOlmoTopKRouter", {**HEADS, **EK}, [{}, *NORM]),
    _c("mellum", "mellum", "MellumConfig", "MellumTopKRouter", {**HEADS, **EK_LOCAL}, [{}, *NORM]),
    _c("lara_mini", "lara_mini", "LaraMiniConfig", "LaraMiniTopKRouter", {**HEADS, **EK}, [{}, *NORM]),
    _c("jamba", "jamba", "JambaConfig", "JambaTopKRouter", {**HEADS, **EK}),
    _c("hunyuan_v1_moe", "hunyuan_v1_moe", "HunYuanMoEV1Config", "HunYuanMoEV1Gate",
       {**HEADS, "num_experts": E, "moe_topk": K}, call="layer", layer=0, gate="wg.weight",
       layer_kwargs={"head_dim": 8}),
    _c("hunyuan_v1_moe_per_layer", "hunyuan_v1_moe", "HunYuanMoEV1Config", "HunYuanMoEV1Gate",
       {**HEADS, "num_experts": E, "moe_topk": [K, 2, 3], "num_hidden_layers": 3}, call="layer",
       layer=1, gate="wg.weight", layer_kwargs={"head_dim": 8}),
    _c("dbrx", "dbrx", "DbrxConfig", "DbrxFFN",
       {"d_model": H, "n_heads": 4, "ffn_config": {"moe_num_experts": E, "moe_top_k": K, "ffn_hidden_size": 8}},
       [{}, {"ffn_config": {"moe_num_experts": E, "moe_top_k": K, "ffn_hidden_size": 8,
                            "moe_normalize_expert_weights": 2.0}},
        {"ffn_config": {"moe_num_experts": E, "moe_top_k": K, "ffn_hidden_size": 8,
                        "moe_normalize_expert_weights": None}}],
       call="dbrx"),
    _c("gemma4", "gemma4", "Gemma4TextConfig", "Gemma4TextRouter",
       {**HEADS, "enable_moe_block": True, "num_experts": E, "top_k_experts": K, "moe_intermediate_size": 8},
       call="gemma4"),
    _c("diffusion_gemma", "diffusion_gemma", "DiffusionGemmaTextConfig", "DiffusionGemmaTextRouter",
       {**HEADS, "enable_moe_block": True, "num_experts": E, "top_k_experts": K, "moe_intermediate_size": 8},
       call="gemma4"),
    # TK-SM: top-k on the logits -> softmax over the k
    _c("aria", "aria", "AriaTextConfig", "AriaTextTopKRouter", {**HEADS, "moe_num_experts": E, "moe_topk": K}),
    _c("granitemoe", "granitemoe", "GraniteMoeConfig", "GraniteMoeTopKRouter", {**HEADS, **EK_LOCAL}),
    _c("granitemoeshared", "granitemoeshared", "GraniteMoeSharedConfig", "GraniteMoeSharedTopKRouter",
       {**HEADS, **EK_LOCAL}, [{}, {"shared_intermediate_size": 16}]),
    _c("granitemoe_swa", "granitemoe_swa", "GraniteMoeSWAConfig", "GraniteMoeSWATopKRouter", {**HEADS, **EK_LOCAL}),
    _c("granitemoehybrid", "granitemoehybrid", "GraniteMoeHybridConfig", "GraniteMoeHybridTopKRouter",
       {**HEADS, **EK_LOCAL, "mamba_n_heads": 8, "mamba_d_head": 8}),
    _c("jetmoe", "jetmoe", "JetMoeConfig", "JetMoeTopKGating", {**HEADS, **EK_LOCAL}, call="jetmoe",
       gate="layer.weight"),
    _c("gpt_oss", "gpt_oss", "GptOssConfig", "GptOssTopKRouter", {**HEADS, **EK_LOCAL}, gate_bias="bias"),
    _c("openai_privacy_filter", "openai_privacy_filter", "OpenAIPrivacyFilterConfig", "OpenAIPrivacyFilterTopKRouter",
       {**HEADS, **EK_LOCAL}, gate_bias="bias", factor="num_experts_per_tok"),
    _c("cohere2_moe", "cohere2_moe", "Cohere2MoeConfig", "Cohere2MoeTopKRouter", {**HEADS, **EK},
       [{}, {"expert_selection_fn": "sigmoid", "norm_topk_prob": True},
        {"expert_selection_fn": "sigmoid", "norm_topk_prob": False},
        {"num_shared_experts": 1, "shared_expert_combination_strategy": "average"}],
       factor=lambda c: 0.5 if c.num_shared_experts > 0 and c.shared_expert_combination_strategy == "average" else 1),
    # SG: sigmoid, no bias
    _c("llama4", "llama4", "Llama4TextConfig", "Llama4Router", {**HEADS, **EK_LOCAL}, [{}, {"num_experts_per_tok": 1}],
       call="llama4"),
    _c("flint", "flint", "FlintConfig", "FlintTopKRouter", {**HEADS, **EK}, [{}, *NORM]),
    # DS2: softmax -> [max-score groups, filled with 0] -> top-k -> x rsf
    *[_c(name, module, cfg, router, {**HEADS, "n_routed_experts": E, "num_experts_per_tok": K},
         [{}, {"topk_method": "greedy", "routed_scaling_factor": 1.0},
          {"topk_method": "greedy", "routed_scaling_factor": 16.0, "norm_topk_prob": True},
          {"topk_method": "group_limited_greedy", "routed_scaling_factor": 2.5, **GROUPS}])
      for name, module, cfg, router in [
          ("deepseek_v2", "deepseek_v2", "DeepseekV2Config", "DeepseekV2TopkRouter"),
          ("deepseek_ocr2", "deepseek_ocr2", "DeepseekOcr2TextConfig", "DeepseekOcr2TextTopkRouter"),
          ("unlimited_ocr", "unlimited_ocr", "UnlimitedOcrTextConfig", "UnlimitedOcrTextTopkRouter")]],
    # DS3: sigmoid + bias -> top2_sum groups (-inf fill) -> top-k -> gather -> [renorm + 1e-20] -> x rsf
    _ds3("deepseek_v3", "deepseek_v3", "DeepseekV3Config", "DeepseekV3TopkRouter"),
    _ds3("sarvam_mla", "deepseek_v3", "SarvamMLAConfig", "DeepseekV3TopkRouter", model_type="sarvam_mla"),
    _ds3("deepseek_v32", "deepseek_v32", "DeepseekV32Config", "DeepseekV32TopkRouter"),
    _ds3("glm4_moe", "glm4_moe", "Glm4MoeConfig", "Glm4MoeTopkRouter"),
    _ds3("sarvam_moe", "glm4_moe", "SarvamMoEConfig", "Glm4MoeTopkRouter", model_type="sarvam_moe"),
    _ds3("glm4_moe_lite", "glm4_moe_lite", "Glm4MoeLiteConfig", "Glm4MoeLiteTopkRouter"),
    _ds3("glm4v_moe", "glm4v_moe", "Glm4vMoeTextConfig", "Glm4vMoeTextTopkRouter"),
    _ds3("glm_moe_dsa", "glm_moe_dsa", "GlmMoeDsaConfig", "GlmMoeDsaTopkRouter"),
    _ds3("glm5_next", "glm5_next", "Glm5NextTextConfig", "Glm5NextTextTopkRouter"),
    _ds3("dots1", "dots1", "Dots1Config", "Dots1TopkRouter", ek={**EK_ROUTED, "n_shared_experts": 2}),
    _ds3("dots3_note", "dots3_note", "Dots3NoteTextConfig", "Dots3NoteTextTopkRouter"),
    *[_c(f"dots3_note_vision-block{layer}", "dots3_note", "Dots3NoteVisionConfig", "Dots3NoteVisionTopKRouter",
         {"hidden_size": H, "num_attention_heads": 4, "adapter_in_dim": H, "num_hidden_layers": 3,
          "pyramid_num_routed": [-1, E, 8], "num_experts_per_tok": K},
         [{}, {"router_scaling_factor": 2.0}], call="per_layer_config", layer=layer, bias="arg")
      for layer in (1, 2)],
    _ds3("solar_open", "solar_open", "SolarOpenConfig", "SolarOpenTopkRouter"),
    _ds3("mimo_v2_flash", "mimo_v2_flash", "MiMoV2FlashConfig", "MiMoV2FlashTopkRouter"),
    _ds3("nemotron_h", "nemotron_h", "NemotronHConfig", "NemotronHTopkRouter"),
    _ds3("axk1", "axk1", "AXK1Config", "AXK1TopkRouter"),
    _ds3("hy_v4", "hy_v4", "HYV4Config", "HYV4TopkRouter"),
    _ds3("hy_v4_vl", "hy_v4_vl", "HYV4VLTextConfig", "HYV4VLTopkRouter"),
    _ds3("exaone_moe", "exaone_moe", "ExaoneMoeConfig", "ExaoneMoeTopkRouter", ek=EK),
    _ds3("kimi_linear", "kimi_linear", "KimiLinearConfig", "KimiLinearTopkRouter",
         ek=dict(num_experts=E, num_experts_per_token=K),
         variants=[{"moe_renormalize": True, "routed_scaling_factor": 2.5, "num_expert_group": 4, "topk_group": 2},
                   {"moe_renormalize": False, "routed_scaling_factor": 1.0}]),
    _ds3("bailing_hybrid", "bailing_hybrid", "BailingHybridConfig", "BailingHybridTopkRouter",
         ek=dict(num_experts=E, num_experts_per_token=K),
         variants=[{"moe_renormalize": True, "routed_scaling_factor": 2.5, "num_expert_group": 4, "topk_group": 2},
                   {"moe_renormalize": False, "routed_scaling_factor": 1.0, "num_expert_group": 1, "topk_group": 1}]),
    _ds3("beam", "beam", "BeamConfig", "BeamTopKRouter", ek=EK, factor="routed_scaling_factor"),
    _ds3("axk2", "axk2", "AXK2Config", "AXK2TopkRouter",
         variants=[*DS3_VARIANTS, {"n_group": None, "topk_group": None}]),
    # M4: softmax, no bias, top2_sum groups filled with 0
    _c("mistral4", "mistral4", "Mistral4Config", "Mistral4TopkRouter", {**HEADS, **EK_ROUTED},
       [{}, {**GROUPS, "norm_topk_prob": True, "routed_scaling_factor": 2.0},
        {"norm_topk_prob": False, "n_group": 1, "topk_group": 1}]),
    _c("mistral_large4", "mistral_large4", "MistralLarge4TextConfig", "MistralLarge4TextTopkRouter",
       {**HEADS, **EK_ROUTED}, [{}, {**GROUPS, "routed_scaling_factor": 2.0}, {"n_group": 1, "topk_group": 1}]),
    # SB: score -> + bias -> top-k -> gather -> renorm -> x scale
    _c("deepseek_v4", "deepseek_v4", "DeepseekV4Config", "DeepseekV4TopKRouter", {**HEADS, **EK_ROUTED},
       [{}, {"scoring_func": "sigmoid", "routed_scaling_factor": 1.0}], bias=BIAS),
    _c("deepseek_v4_hash", "deepseek_v4", "DeepseekV4Config", "DeepseekV4HashRouter",
       {**HEADS, **EK_ROUTED, "vocab_size": 50}, [{}, {"scoring_func": "sigmoid"}], call="hash", layer=0),
    _c("inkling2", "inkling2", "Inkling2TextConfig", "Inkling2TopKRouter", {**HEADS, **EK_ROUTED},
       [{}, {"route_scale": 1.0}], bias=BIAS),
    _c("inkling2_loop", "inkling2_loop", "Inkling2LoopTextConfig", "Inkling2LoopTopKRouter", {**HEADS, **EK_ROUTED},
       [{}, {"scoring_func": "sigmoid", "route_scale": 2.0}], bias=BIAS),
    _c("muse_spark", "muse_spark", "MuseSparkTextConfig", "MuseSparkTopkRouter", {**HEADS, **EK_LOCAL},
       [{}, {"routed_scaling_factor": 2.0, "output_multiplier": 0.5}], bias=BIAS),
    _c("minimax_m2", "minimax_m2", "MiniMaxM2Config", "MiniMaxM2TopKRouter", {**HEADS, **EK_LOCAL}, bias="arg"),
    _c("minimax_m3_vl", "minimax_m3_vl", "MiniMaxM3VLTextConfig", "MiniMaxM3VLTopKRouter", {**HEADS, **EK_LOCAL},
       [{}, {"routed_scaling_factor": 1.0}], bias=BIAS, factor="routed_scaling_factor"),
    _c("step3p7", "step3p7", "Step3p7TextConfig", "Step3p7TopKRouter", {**HEADS, **EK_ROUTED},
       [{}, {"moe_router_scaling_factor": 3.0}], bias=BIAS, factor="moe_router_scaling_factor"),
    _c("hy_v3", "hy_v3", "HYV3Config", "HYV3TopKRouter", {**HEADS, **EK}, [{}, {"router_scaling_factor": 1.0}],
       bias="arg"),
    _c("afmoe", "afmoe", "AfmoeConfig", "AfmoeTokenChoiceRouter", {**HEADS, **EK}, [{}, {"route_scale": 2.5}],
       bias="arg", call="3d", gate="gate.weight"),
    _c("lfm2_moe", "lfm2_moe", "Lfm2MoeConfig", "Lfm2MoeTopKRouter", {**HEADS, **EK},
       [{}, {"norm_topk_prob": False, "routed_scaling_factor": 2.0}, {"use_expert_bias": False}], bias="arg",
       layer_kwargs={"layer_types": ["conv", "full_attention"] * 3}),
    _c("laguna", "laguna", "LagunaConfig", "LagunaTopKRouter", {**HEADS, **EK},
       [{}, {"moe_router_logit_softcapping": 1.5, "moe_routed_scaling_factor": 2.5}], bias=BIAS,
       factor="moe_routed_scaling_factor"),
    _c("kolibri1", "kolibri1", "Kolibri1Config", "Kolibri1TopKRouter", {**HEADS, **EK_LOCAL}, [{}, *NORM],
       bias=BIAS, bias_std=0.5),
    # SMB: softmax -> + bias -> top-k -> gather -> ERNIE clamp renorm / LongCat zero experts
    _c("ernie4_5_moe", "ernie4_5_moe", "Ernie4_5_MoeConfig", "Ernie4_5_MoeTopKRouter",
       {**HEADS, "moe_num_experts": E, "moe_k": K}, bias="moe_statics.e_score_correction_bias", bias_std=0.05),
    _c("ernie4_5_vl_moe", "ernie4_5_vl_moe", "Ernie4_5_VLMoeTextConfig", "Ernie4_5_VLMoeMoeTopKRouter",
       {**HEADS, "moe_num_experts": E, "moe_k": K}, bias="moe_statics.e_score_correction_bias", bias_std=0.05),
    _c("longcat_flash", "longcat_flash", "LongcatFlashConfig", "LongcatFlashTopkRouter",
       {**HEADS, "n_routed_experts": E, "moe_topk": K, "zero_expert_num": 8},
       [{}, {"routed_scaling_factor": 1.0, "zero_expert_num": 0}], bias=BIAS, bias_std=0.05, gate="classifier.weight"),
]

VARIANTS = [pytest.param(case, i, id=f"{case.id}-{i}") for case in CASES for i in range(len(case.variants))]


def _modeling(case: Case):
    return importlib.import_module(f"transformers.models.{case.module}.modeling_{case.module}")


def _config(case: Case, variant: int):
    cls = getattr(transformers, case.config_cls)
    return cls(**{**case.kwargs, **case.variants[variant]})


def _attr(obj, path: str):
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


def _randomize(module: torch.nn.Module, case: Case, gen: torch.Generator) -> None:
    with torch.no_grad():
        for name, p in list(module.named_parameters()) + list(module.named_buffers()):
            if not p.is_floating_point():
                continue
            if "correction_bias" in name or name.endswith("expert_bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * case.bias_std + case.bias_mean)
            elif "per_expert_scale" in name:
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1] if p.dim() > 1 else 1))


def _factor(case: Case, cfg) -> float:
    if case.factor is None:
        return 1.0
    if callable(case.factor):
        return float(case.factor(cfg))
    return float(getattr(cfg, case.factor))


def _run_model(case: Case, cfg, h: torch.Tensor, gen: torch.Generator):
    """The model's own router: (logits the gate computes [N, W], ids [N, K], weights [N, K], route kwargs)."""
    mod = _modeling(case)
    cls = getattr(mod, case.router_cls)
    extra = {}
    if case.call == "jetmoe":
        r = cls(cfg.hidden_size, cfg.num_local_experts, cfg.num_experts_per_tok)
    elif case.call == "layer":
        r = cls(cfg, layer_idx=case.layer)
    elif case.call == "per_layer_config":
        r = cls(cfg.per_layer_config[case.layer])
    else:
        r = cls(cfg)
    r = r.eval()
    _randomize(r, case, gen)
    bias = None
    if case.bias == "arg":
        bias = torch.randn(r.num_experts if hasattr(r, "num_experts") else cfg.num_experts, generator=gen)
        bias = bias * case.bias_std
    elif case.bias is not None:
        bias = _attr(r, case.bias).detach().reshape(-1)
    with torch.no_grad():
        if case.call == "gemma4":
            x = r.norm(h) * r.scale * r.scalar_root_size
            logits = r.proj(x)
            _, w, ids = r(h)
            extra["expert_scale"] = r.per_expert_scale.detach()
        elif case.call == "dbrx":
            logits = r.router(h)
            w, ids = r.route_tokens_to_experts(logits)
        elif case.call == "llama4":
            logits = F.linear(h, r.weight)
            scores, _ = r(h)
            ids = torch.topk(scores, cfg.num_experts_per_tok, dim=1).indices
            w = scores.gather(1, ids)
        elif case.call == "jetmoe":
            logits = F.linear(h, r.layer.weight)
            index_sorted, _, batch_gates, expert_size, _ = r(h)
            k = cfg.num_experts_per_tok
            flat_w = torch.zeros(h.shape[0] * k)
            flat_ids = torch.zeros(h.shape[0] * k, dtype=torch.long)
            flat_w[index_sorted] = batch_gates
            flat_ids[index_sorted] = torch.repeat_interleave(torch.arange(len(expert_size)), torch.tensor(expert_size))
            w, ids = flat_w.view(-1, k), flat_ids.view(-1, k)
        elif case.call == "hash":
            vocab = cfg.vocab_size
            table = torch.stack([torch.randperm(cfg.n_routed_experts, generator=gen)[: cfg.num_experts_per_tok]
                                 for _ in range(vocab)])
            r.tid2eid.copy_(table)
            token_ids = torch.randint(0, vocab, (h.shape[0],), generator=gen)
            logits = F.linear(h, r.weight)
            _, w, ids = r(h, token_ids)
            extra.update(token_ids=token_ids, hash_table=table)
        else:
            weight = _attr(r, case.gate)
            logits = F.linear(h, weight, _attr(r, case.gate_bias) if case.gate_bias else None)
            if case.call == "3d":
                _, w, ids = r(h[None], bias)
            elif case.bias == "arg":
                _, w, ids = r(h, bias)
            else:
                _, w, ids = r(h)
    if case.bias == "arg" and cfg.to_dict().get("use_expert_bias") is False:
        bias = None
    return logits, ids, w.float() * _factor(case, cfg), bias, extra


def _selection_keys(logits: torch.Tensor, rc, bias) -> torch.Tensor:
    """The keys the K experts are chosen on, after the group step ([T, W]); only used to find exact ties."""
    _, key = scores_and_keys(logits, rc, bias)
    if rc.n_group > 1:
        T = key.shape[0]
        grouped = key.view(T, rc.n_group, -1)
        gscore = grouped.topk(2, dim=2).values.sum(2) if rc.group_score == "top2_sum" else grouped.amax(2)
        kept = torch.zeros_like(gscore, dtype=torch.bool).scatter_(1, gscore.topk(rc.topk_group, dim=1).indices, True)
        kept = kept.repeat_interleave(rc.group_size, dim=1)
        fill = torch.zeros_like(key) if rc.group_fill == "zero" else torch.full_like(key, -math.inf)
        key = torch.where(kept, key, fill)
    return key


def _sorted_by_id(ids: torch.Tensor, w: torch.Tensor):
    order = ids.long().argsort(dim=1)
    return ids.long().gather(1, order), w.gather(1, order)


@pytest.mark.parametrize("case,variant", VARIANTS)
def test_routing_matches_model_router(case: Case, variant: int):
    gen = torch.Generator().manual_seed(1234 + variant)
    cfg = _config(case, variant)
    h = torch.randn(N, cfg.to_dict().get("hidden_size") or cfg.to_dict().get("d_model"), generator=gen)
    logits, model_ids, model_w, bias, extra = _run_model(case, cfg, h, gen)
    rc = from_hf_config(cfg, layer=case.layer)
    w, ids = route(logits, rc, bias=bias, backend="reference", **extra)
    ours_ids, ours_w = _sorted_by_id(ids, w)
    theirs_ids, theirs_w = _sorted_by_id(model_ids, model_w)
    live = torch.ones(N, dtype=torch.bool)
    if rc.routing == "topk":
        # Exact ties at the K-th key (groups filled with 0.0) are the one place where the model's topk is free
        # to pick any of the tied experts: there both must pick keys of the same values; elsewhere, the same ids.
        key = _selection_keys(logits, rc, bias)
        top = key.topk(rc.top_k + 1, dim=1).values
        live = top[:, rc.top_k - 1] != top[:, rc.top_k]
        assert live.float().mean() > 0.25, f"{case.id}: too many tied rows for a meaningful comparison"
        tied = key[~live]
        torch.testing.assert_close(tied.gather(1, ours_ids[~live]).sort(1).values,
                                   tied.gather(1, theirs_ids[~live]).sort(1).values, atol=0, rtol=0)
    assert torch.equal(ours_ids[live], theirs_ids[live]), f"{case.id}: expert sets differ ({rc})"
    torch.testing.assert_close(ours_w[live], theirs_w[live], atol=ATOL, rtol=0)


@pytest.mark.parametrize("case,variant", VARIANTS)
def test_dict_and_json_read_like_the_config_class(case: Case, variant: int, tmp_path):
    """A plain dict (config.json) with the same keys gives what transformers' config class gives:
    the defaults of the keys the dict omits and the aliases it accepts."""
    cfg = _config(case, variant)
    model_type = case.model_type or type(cfg).model_type
    raw = {"model_type": model_type, **case.kwargs, **case.variants[variant]}
    expected = from_hf_config(cfg, layer=case.layer)
    assert from_hf_config(raw, layer=case.layer) == expected
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg.to_dict(), default=str))
    assert from_hf_config(str(path), layer=case.layer) == expected


def test_every_family_has_a_router_case():
    tested = {_family_of_case(c) for c in CASES}
    assert set(FAMILIES) - tested == set()


def _family_of_case(case: Case) -> str:
    from moegate.hf import family_of

    return family_of({"model_type": case.model_type or getattr(transformers, case.config_cls).model_type})


WRAPPERS = [
    ("Llama4Config", "llama4", {**HEADS, **EK_LOCAL}),
    ("Qwen3_5MoeConfig", "qwen3_5_moe", {**HEADS, **EK}),
    ("Qwen3VLMoeConfig", "qwen3_vl_moe", {**HEADS, **EK}),
    ("Glm4vMoeConfig", "glm4v_moe", {**HEADS, **EK_ROUTED}),
    ("Kimi_K25Config", "kimi_k25", {**HEADS, **EK_ROUTED, "model_type": "deepseek_v3"}),
    ("Gemma4Config", "gemma4", {**HEADS, "enable_moe_block": True, "num_experts": E, "top_k_experts": K,
                                "moe_intermediate_size": 8}),
    ("Ernie4_5_VLMoeConfig", "ernie4_5_vl_moe", {**HEADS, "moe_num_experts": E, "moe_k": K}),
    ("Step3p7Config", "step3p7", {**HEADS, **EK_ROUTED}),
    ("AriaConfig", "aria", {**HEADS, "moe_num_experts": E, "moe_topk": K}),
    ("MistralLarge4Config", "mistral_large4", {**HEADS, **EK_ROUTED}),
    ("MiniMaxM3VLConfig", "minimax_m3_vl", {**HEADS, **EK_LOCAL}),
    ("Dots3NoteConfig", "dots3_note", EK_ROUTED),  # the vision adapter fixes the hidden size
    ("Inkling2Config", "inkling2", EK_ROUTED),
    ("HYV4VLConfig", "hy_v4_vl", {**HEADS, **EK_ROUTED}),
    ("Qwen4ExpConfig", "qwen4_exp", {**HEADS, **EK}),
    ("DeepseekOcr2Config", "deepseek_ocr2", {**HEADS, **EK_ROUTED}),
    ("UnlimitedOcrConfig", "unlimited_ocr", {**HEADS, **EK_ROUTED}),
]


@pytest.mark.parametrize("cls,model_type,text", WRAPPERS, ids=[w[1] for w in WRAPPERS])
def test_wrappers_read_their_text_config(cls, model_type, text):
    cfg = getattr(transformers, cls)(text_config=dict(text))
    inner = cfg.to_dict()["text_config"]
    expected = from_hf_config({k: v for k, v in inner.items()})
    assert from_hf_config(cfg) == expected
    assert from_hf_config({"model_type": model_type, "text_config": dict(text)}) == expected
    assert expected.num_experts == E


def test_qwen3_omni_reads_the_thinker_text_model():
    cfg = transformers.Qwen3OmniMoeConfig(thinker_config={"text_config": {**HEADS, **EK}})
    rc = from_hf_config(cfg)
    assert (rc.num_experts, rc.top_k, rc.renormalize) == (E, K, True)


@pytest.mark.parametrize("model_type", sorted(set(UNSUPPORTED) - {"nllb-moe"}))
def test_unsupported_families_raise_not_implemented(model_type):
    with pytest.raises(NotImplementedError, match=model_type.split("_")[0][:4]):
        from_hf_config({"model_type": model_type, "num_experts": 8, "num_experts_per_tok": 2})


def test_deepseek_v2_noaux_tc_is_not_implemented():
    with pytest.raises(NotImplementedError, match="noaux_tc"):
        from_hf_config({"model_type": "deepseek_v2", "topk_method": "noaux_tc", "num_experts_per_tok": 6})


def test_unknown_model_type_lists_known_ones():
    with pytest.raises(ValueError, match="known model types: .*deepseek_v3"):
        from_hf_config({"model_type": "llama"})


def test_per_layer_values_need_a_layer():
    cfg = {"model_type": "hunyuan_v1_moe", "num_experts": 16, "moe_topk": [4, 2], "num_hidden_layers": 2}
    with pytest.raises(ValueError, match="pass layer="):
        from_hf_config(cfg)
    assert from_hf_config(cfg, layer=1).top_k == 2


def test_wrong_alias_keeps_the_default_like_transformers():
    """Qwen2Moe accepts only num_experts: num_local_experts is ignored (the default 60 stays)."""
    cfg = transformers.Qwen2MoeConfig(num_local_experts=16)
    assert from_hf_config({"model_type": "qwen2_moe", "num_local_experts": 16}) == from_hf_config(cfg)
    assert from_hf_config(cfg).num_experts == cfg.num_experts


# -- which layers are MoE ------------------------------------------------------------------------------------

LAYER_CASES = [
    ("deepseek_v32", dict(num_hidden_layers=6, first_k_dense_replace=2)),
    ("glm_moe_dsa", dict(num_hidden_layers=6, first_k_dense_replace=2)),
    ("axk1", dict(num_hidden_layers=6, first_k_dense_replace=2, moe_layer_freq=2)),
    ("exaone_moe", dict(num_hidden_layers=6, first_k_dense_replace=2)),
    ("kimi_linear", dict(num_hidden_layers=6, first_k_dense_replace=2)),
    ("bailing_hybrid", dict(num_hidden_layers=6)),
    ("beam", dict(num_hidden_layers=6)),
    ("deepseek_v4", dict(num_hidden_layers=6)),
    ("mimo_v2_flash", dict(num_hidden_layers=6)),
    ("laguna", dict(num_hidden_layers=6)),
    ("mellum", dict(num_hidden_layers=6)),
    ("hy_v3", dict(num_hidden_layers=6)),
    ("unlimited_ocr_text", dict(num_hidden_layers=6, first_k_dense_replace=3)),
    ("mistral_large4_text", dict(num_hidden_layers=6, first_k_dense_replace=2)),
    ("dots3_note_text", dict(num_hidden_layers=6, first_k_dense_replace=1, moe_layer_freq=2)),
    ("ernie4_5_vl_moe_text", dict(num_hidden_layers=6)),
    ("minimax_m3_vl_text", dict(num_hidden_layers=4, moe_layer_freq=[0, 1, 1, 0])),
    ("step3p5", dict(num_hidden_layers=6)),
    ("step3p5", dict(num_hidden_layers=4, moe_layers_enum="1,2")),
    ("cohere2_moe", dict(num_hidden_layers=6)),
]


@pytest.mark.parametrize("model_type,kwargs", LAYER_CASES)
def test_layer_types_derive_like_the_config_class(model_type, kwargs):
    """Configs that store mlp_layer_types derive it from legacy keys; a dict without it must agree."""
    cfg = transformers.CONFIG_MAPPING[model_type](**kwargs)
    assert moe_layer_types({"model_type": model_type, **kwargs}) == moe_layer_types(cfg)
    stored = cfg.to_dict().get("mlp_layer_types")
    assert stored is not None and len(stored) == len(moe_layer_types(cfg))


def _layer_count(config):
    try:
        return len(moe_layer_types(config))
    except (ValueError, NotImplementedError) as exc:
        return type(exc).__name__


@pytest.mark.parametrize("model_type", sorted(t for t in set(FAMILIES) | set(SYNONYMS)
                                              if t in transformers.CONFIG_MAPPING))
def test_omitted_layer_count_is_the_config_class_default(model_type):
    """A config.json that omits num_hidden_layers has the config class's default number of decoder layers
    (Qwen3-Omni's thinker took 48 where Qwen3OmniMoeTextConfig says 28)."""
    assert _layer_count({"model_type": model_type}) == _layer_count(transformers.CONFIG_MAPPING[model_type]())


@pytest.mark.parametrize(
    "cfg,expected",
    [
        ({"model_type": "deepseek_v3", "num_hidden_layers": 5, "first_k_dense_replace": 3},
         ["dense"] * 3 + ["moe"] * 2),
        ({"model_type": "qwen3_moe", "num_hidden_layers": 4, "decoder_sparse_step": 2}, ["dense", "moe"] * 2),
        ({"model_type": "qwen2_moe", "num_hidden_layers": 3, "mlp_only_layers": [1]}, ["moe", "dense", "moe"]),
        ({"model_type": "llama4", "text_config": {"num_hidden_layers": 4, "interleave_moe_layer_step": 2}},
         ["dense", "moe"] * 2),
        ({"model_type": "jamba", "num_hidden_layers": 4}, ["dense", "moe"] * 2),
        ({"model_type": "ernie4_5_moe", "num_hidden_layers": 4, "moe_layer_start_index": 1,
          "moe_layer_end_index": 2}, ["dense", "moe", "moe", "dense"]),
        ({"model_type": "deepseek_v4", "num_hidden_layers": 5}, ["hash"] * 3 + ["moe"] * 2),
        ({"model_type": "nemotron_h", "hybrid_override_pattern": "M*E-E"}, ["dense", "dense", "moe", "dense", "moe"]),
        ({"model_type": "gemma4_text", "num_hidden_layers": 2}, ["dense", "dense"]),
        ({"model_type": "afmoe", "num_hidden_layers": 3}, ["dense", "moe", "moe"]),
        ({"model_type": "lfm2_moe", "num_hidden_layers": 4, "num_dense_layers": 1}, ["dense", "moe", "moe", "moe"]),
        ({"model_type": "lfm2_moe", "num_hidden_layers": 3}, ["dense", "dense", "moe"]),
        # ERNIE's interval counts from 1: (layer + 1) % moe_layer_interval == 0 (modeling_ernie4_5_moe).
        ({"model_type": "ernie4_5_moe", "num_hidden_layers": 6, "moe_layer_interval": 2, "moe_layer_start_index": 0,
          "moe_layer_end_index": 5}, ["dense", "moe"] * 3),
    ],
)
def test_layer_types_from_legacy_keys(cfg, expected):
    assert moe_layer_types(cfg) == expected


def test_hash_layer_of_deepseek_v4_routes_by_hash():
    cfg = {"model_type": "deepseek_v4", "num_hidden_layers": 5}
    assert from_hf_config(cfg, layer=0).routing == "hash"
    assert from_hf_config(cfg, layer=4).routing == "topk"


# -- aliases: every spelling of E and K, as transformers' config class reads it -----------------------------

E_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
K_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_k", "moe_top_k", "top_k_experts")


def _outcome(config, layer):
    try:
        return from_hf_config(config, layer=layer)
    except (ValueError, NotImplementedError) as e:
        return type(e), str(e)


ALIAS_CASES = [
    pytest.param(case, keys, spelling, id=f"{case.id}-{spelling}")
    for case in CASES if case.call not in ("dbrx", "jetmoe")
    for keys in (E_KEYS, K_KEYS)
    for spelling in keys
    if any(k in case.kwargs for k in keys)
]


@pytest.mark.parametrize("case,keys,spelling", ALIAS_CASES)
def test_every_spelling_reads_like_transformers(case, keys, spelling):
    """Rename the case's E (or K) key to each spelling in use across families: transformers either takes it
    (an alias) or silently keeps its default (a trap); a dict must give what the config class gives. (With two
    spellings at once transformers differs by family; moegate then reads the canonical key.)"""
    (key,) = [k for k in keys if k in case.kwargs]
    value = case.kwargs[key]
    value = [v - 1 for v in value] if isinstance(value, list) else value - 1
    kw = {**{k: v for k, v in case.kwargs.items() if k != key}, spelling: value}
    cls = getattr(transformers, case.config_cls)
    model_type = case.model_type or cls.model_type
    cfg = cls(**kw)
    assert _outcome({"model_type": model_type, **kw}, case.layer) == _outcome(cfg, case.layer), kw


@pytest.mark.parametrize("cls", ["Glm46VConfig", "Lfm2VlConfig"])
def test_wrapper_of_a_dense_text_model_is_a_value_error(cls):
    with pytest.raises(ValueError, match="not a MoE family"):
        from_hf_config(getattr(transformers, cls)())


# Families whose decoder layers cannot be built alone from the tiny router config (they need keys the router
# does not, or have no `*DecoderLayer` class); their layer rules are covered by the tests above.
NO_DECODER_LAYER = {"qwen4_exp", "dbrx", "diffusion_gemma", "openai_privacy_filter", "deepseek_ocr2", "nemotron_h",
                    "qwen3_omni_talker",  # reads shared_expert_intermediate_size, which its text config lacks
                    "deepseek_v4_hash",  # the same model as deepseek_v4, whose case checks the hash layers
                    "dots3_note_vision-block1", "dots3_note_vision-block2"}  # vision blocks, not decoder layers
LAYER_MODEL_CASES = [pytest.param(c, id=c.id) for c in CASES if c.id not in NO_DECODER_LAYER]


# Every legacy layer key at once, each off its default: a family reads the ones it knows and ignores the rest.
LEGACY_LAYER_KEYS = dict(
    first_k_dense_replace=2, moe_layer_freq=2, decoder_sparse_step=2, mlp_only_layers=[3],
    interleave_moe_layer_step=2, expert_layer_period=3, expert_layer_offset=2, num_dense_layers=1,
    moe_layer_start_index=2, moe_layer_end_index=4, moe_layer_interval=1, num_hash_layers=2,
)


@pytest.mark.parametrize("legacy", [False, True], ids=["defaults", "legacy_keys"])
@pytest.mark.parametrize("case", LAYER_MODEL_CASES)
def test_layer_types_match_the_models_decoder_layers(case, legacy):
    """Build every decoder layer of a 6-layer model (on the meta device): a layer holds the family's router
    exactly where moe_layer_types says "moe" (a DeepSeek-V4 hash layer holds the hash router)."""
    mod = _modeling(case)
    router = getattr(mod, case.router_cls)
    hash_router = getattr(mod, "DeepseekV4HashRouter", None)
    legacy_keys = dict(LEGACY_LAYER_KEYS) if legacy else {}
    if legacy and case.id == "minimax_m3_vl":  # its moe_layer_freq is a per-layer list (an int is a TypeError)
        legacy_keys["moe_layer_freq"] = [0, 1, 1, 0, 1, 1]
    kwargs = {"num_hidden_layers": 6, **legacy_keys, **case.kwargs, **case.layer_kwargs}
    config_cls = getattr(transformers, case.config_cls)
    cfg = config_cls(**kwargs)
    expected = moe_layer_types(cfg)
    layer_classes = [c for name, c in vars(mod).items()
                     if isinstance(c, type) and name.endswith("DecoderLayer") and c.__module__ == mod.__name__]
    found = []
    with torch.device("meta"):
        for cls in layer_classes:
            try:
                layers = [cls(cfg, i) for i in range(len(expected))]
            except (TypeError, AttributeError, ValueError, KeyError):  # another sub-model's layer class
                continue
            kinds = []
            for layer in layers:
                mods = list(layer.modules())
                if hash_router is not None and any(isinstance(m, hash_router) for m in mods):
                    kinds.append("hash")
                else:
                    kinds.append("moe" if any(isinstance(m, router) for m in mods) else "dense")
            found.append(kinds)
    assert found, f"{case.id}: no decoder layer class could be built"
    assert expected in found, f"{case.id}: moe_layer_types {expected}, the model's layers {found}"
    assert moe_layer_types({"model_type": case.model_type or config_cls.model_type, **kwargs}) == expected


def test_dots3_vision_blocks_need_a_layer():
    cfg = transformers.Dots3NoteVisionConfig()  # the published pyramid: 25 dense blocks, then 4, 8, ... 64 experts
    kinds = moe_layer_types(cfg)
    assert kinds == ["dense"] * 25 + ["moe"] * 17
    with pytest.raises(ValueError, match="pass layer="):
        from_hf_config(cfg)
    with pytest.raises(ValueError, match="no routed experts"):
        from_hf_config(cfg, layer=0)
    assert [from_hf_config(cfg, layer=i).num_experts for i in (25, 26, 41)] == [4, 8, 64]
    saved = json.loads(json.dumps(cfg.to_dict()))  # per_layer_config keeps only the blocks that differ
    assert [from_hf_config(saved, layer=i) for i in range(25, 42)] == [from_hf_config(cfg, layer=i)
                                                                      for i in range(25, 42)]
    assert from_hf_config({"model_type": "dots3_note_vision_encoder"}, layer=41) == from_hf_config(cfg, layer=41)
    # A block's K is min(num_experts_per_tok, its experts), as Dots3NoteVisionConfig's per_layer_config has it.
    wide = {"model_type": "dots3_note_vision_encoder", "num_experts_per_tok": 8}
    assert [from_hf_config(wide, layer=i).top_k for i in (25, 26, 41)] == [4, 8, 8]
    assert from_hf_config(wide, layer=25) == from_hf_config(transformers.Dots3NoteVisionConfig(num_experts_per_tok=8),
                                                            layer=25)


def test_cohere2_average_scales_routed_and_shared_experts_by_half():
    base = {"model_type": "cohere2_moe", "num_experts": 8, "num_experts_per_tok": 2, "num_shared_experts": 1}
    avg = from_hf_config({**base, "shared_expert_combination_strategy": "average"})
    assert (avg.routed_scaling_factor, avg.shared_expert_scale) == (0.5, 0.5)
    summed = from_hf_config({**base, "shared_expert_combination_strategy": "sum"})
    assert (summed.routed_scaling_factor, summed.shared_expert_scale) == (1.0, 1.0)


def test_null_routed_scaling_factor_is_no_scaling():
    """MiMo-V2-Flash's config.json on the Hub has routed_scaling_factor: null, which its config class turns into
    1.0; the dict and the file read alike (a float(None) before)."""
    raw = {"model_type": "mimo_v2_flash", "routed_scaling_factor": None}
    assert from_hf_config(raw).routed_scaling_factor == 1.0
    assert from_hf_config(raw) == from_hf_config(transformers.MiMoV2FlashConfig(routed_scaling_factor=None))


@pytest.mark.parametrize("cfg", [
    transformers.NemotronHConfig(hybrid_override_pattern="M-M*-M-", num_hidden_layers=7),  # dense Nemotron-H
    {"model_type": "qwen3_moe", "num_hidden_layers": 2, "mlp_only_layers": [0, 1]},
    {"model_type": "deepseek_v3", "num_hidden_layers": 3, "first_k_dense_replace": 3},
    transformers.GraniteMoeHybridConfig(num_local_experts=0, num_hidden_layers=3),  # dense Granite-4.0-H
    {"model_type": "granitemoehybrid", "num_local_experts": 0, "num_hidden_layers": 3},
], ids=["nemotron-h-dense", "qwen3-mlp-only", "deepseek-v3-all-dense", "granite-4-h-dense", "granite-4-h-dict"])
def test_a_config_without_moe_layers_is_a_value_error(cfg):
    """A MoE model type whose every layer is dense has no router to describe (it once got its class defaults')."""
    assert set(moe_layer_types(cfg)) == {"dense"}
    with pytest.raises(ValueError, match="no MoE layers"):
        from_hf_config(cfg)


def test_padded_mlp_layer_types_keep_the_decoder_layers():
    """Older Step3p7 configs pad mlp_layer_types with their next-token-prediction layer: transformers keeps the first
    num_hidden_layers entries, and so does moe_layer_types (layer 4 does not exist)."""
    kw = dict(num_hidden_layers=4, num_nextn_predict_layers=1, layer_types=["full_attention"] * 5,
              mlp_layer_types=["dense", "sparse", "sparse", "sparse", "sparse"])
    assert moe_layer_types({"model_type": "step3p5", **kw}) == ["dense", "moe", "moe", "moe"]
    assert moe_layer_types({"model_type": "step3p5", **kw}) == moe_layer_types(transformers.Step3p7TextConfig(**kw))
    with pytest.raises(ValueError, match="layer must be in"):
        from_hf_config({"model_type": "step3p5", **kw}, layer=4)


def test_inkling_v1_wrapper_is_not_implemented():
    """Inkling v1's top-level model_type is inkling_mm_model; a wrapper whose text_config names no model_type is
    still Inkling v1 (not "not a MoE family")."""
    with pytest.raises(NotImplementedError, match="Inkling v1"):
        from_hf_config({"model_type": "inkling_mm_model", "text_config": {"num_experts": 8}})


def test_keys_that_the_model_reads_otherwise_or_refuses():
    """A review against transformers 5.24 (2026-12-04): DBRX keeps its depth in n_layers (the MoE layer list had the
    default 24 layers for DBRX's 40); DeepSeek-V4 builds one shared MLP whatever n_shared_experts says; a null
    routed_scaling_factor is 1.0 for MiMo-V2-Flash only (DeepSeek-V3's and GLM-4-MoE's configs refuse it); Cohere2
    knows two combination strategies; a null group count is an error that names its key, not "no groups" or a bare
    TypeError."""
    dbrx = {"model_type": "dbrx", "n_layers": 40, "ffn_config": {"moe_num_experts": 16, "moe_top_k": 4}}
    assert len(moe_layer_types(dbrx)) == 40 and from_hf_config(dbrx, layer=30).num_experts == 16
    assert from_hf_config({"model_type": "deepseek_v4", "n_shared_experts": 2}).num_shared_experts == 1
    assert from_hf_config({"model_type": "mimo_v2_flash", "routed_scaling_factor": None}).routed_scaling_factor == 1.0
    for bad, match in (({"model_type": "deepseek_v3", "routed_scaling_factor": None}, "routed_scaling_factor is null"),
                       ({"model_type": "glm4_moe", "routed_scaling_factor": None}, "routed_scaling_factor is null"),
                       ({"model_type": "cohere2_moe", "num_shared_experts": 1,
                         "shared_expert_combination_strategy": "mean"}, "shared_expert_combination_strategy"),
                       ({"model_type": "mistral4", "n_group": None}, "no value for 'n_group'"),
                       ({"model_type": "deepseek_v3", "n_group": 8, "topk_group": None}, "no value for 'topk_group'"),
                       ({"model_type": "deepseek_v3", "n_group": None}, "no value for 'n_group'"),
                       ({"model_type": "glm4_moe", "n_group": None, "topk_group": None}, "no value for 'n_group'"),
                       ({"model_type": "kimi_linear", "num_expert_group": None}, "no value for 'num_expert_group'")):
        with pytest.raises(ValueError, match=match):
            from_hf_config(bad)
    # AXK2's router skips the group step when n_group is None; its config refuses one count null without the other.
    for groups in ({"n_group": None, "topk_group": None}, {}):
        cfg = from_hf_config({"model_type": "axk2", **groups})
        assert (cfg.n_group, cfg.topk_group) == (1, 1)
    for groups in ({"n_group": 8, "topk_group": None}, {"n_group": 8}, {"n_group": None, "topk_group": 2}):
        with pytest.raises(ValueError, match="must be set together"):
            from_hf_config({"model_type": "axk2", **groups})
    assert from_hf_config({"model_type": "axk2", "n_group": 8, "topk_group": 4}).n_group == 8


def test_review_config_values_are_not_coerced():
    """A review against transformers 5.24 (2026-12-06): switches were read with bool() ("false" turned renormalising
    on), counts with int() (1.5 shared experts became 1) and a null shared count became 0 shared experts, where the
    families' config classes refuse such values and their blocks fail on them; Cohere2-MoE's combination strategy
    was checked without shared experts, where its block never reads it."""
    for bad, match in (({"model_type": "qwen3_moe", "norm_topk_prob": "false"}, "norm_topk_prob must be true"),
                       ({"model_type": "deepseek_v3", "norm_topk_prob": 0}, "norm_topk_prob must be true"),
                       ({"model_type": "mistral4", "norm_topk_prob": "no"}, "norm_topk_prob must be true"),
                       ({"model_type": "deepseek_v3", "n_shared_experts": 1.5}, "n_shared_experts must be a whole"),
                       ({"model_type": "deepseek_v3", "n_shared_experts": True}, "n_shared_experts must be a whole"),
                       ({"model_type": "deepseek_v3", "n_group": "8"}, "n_group must be a whole"),
                       ({"model_type": "deepseek_v3", "n_shared_experts": None}, "no value for 'n_shared_experts'"),
                       ({"model_type": "dots1", "n_routed_experts": 16, "num_experts_per_tok": 4},
                        "no value for 'n_shared_experts'"),
                       ({"model_type": "dots3_note_text", "n_shared_experts": 0}, "at least 1"),
                       ({"model_type": "longcat_flash", "zero_expert_num": None}, "no value for 'zero_expert_num'")):
        with pytest.raises(ValueError, match=match):
            from_hf_config(bad)
    # A null switch is off, as the routers' truth tests have it, also where the family's default is on
    # (DeepSeek-V3's router: `if self.norm_topk_prob:`); whole floats are counts.
    assert from_hf_config({"model_type": "qwen3_moe", "norm_topk_prob": None}).renormalize is False
    assert from_hf_config({"model_type": "deepseek_v3", "norm_topk_prob": None}).renormalize is False
    assert from_hf_config({"model_type": "deepseek_v3"}).renormalize is True
    assert from_hf_config({"model_type": "deepseek_v3", "n_shared_experts": 2.0}).num_shared_experts == 2
    assert from_hf_config({"model_type": "dots1", "n_routed_experts": 16, "num_experts_per_tok": 4,
                           "n_shared_experts": 1}).num_shared_experts == 1
    cfg = from_hf_config({"model_type": "cohere2_moe", "num_shared_experts": 0,
                          "shared_expert_combination_strategy": "concat"})
    assert (cfg.num_shared_experts, cfg.routed_scaling_factor) == (0, 1.0)


def test_review_defaults_of_cohere2_ocr_wrappers_and_null_factors():
    """A review against transformers (2026-12-04, the second): Cohere2-MoE's combination strategy defaults to
    "average" (moegate took "sum": routed and shared weights twice the model's where a config.json leaves the key
    out); Unlimited-OCR's and Nemotron-H-Omni's released configs keep the text model under language_config /
    llm_config, which their config classes rename to text_config (moegate read the top level and routed with every
    default, or refused Nemotron-H-Omni); Unlimited-OCR's group_limited_greedy takes its class's groups of 1 when
    the keys are left out; a null scaling factor is a ValueError that names the key, not float(None)'s TypeError."""
    base = {"model_type": "cohere2_moe", "num_experts": 8, "num_experts_per_tok": 2, "num_shared_experts": 1}
    rc = from_hf_config(base)
    assert (rc.routed_scaling_factor, rc.shared_expert_scale) == (0.5, 0.5)
    assert rc == from_hf_config(transformers.Cohere2MoeConfig(num_experts=8, num_experts_per_tok=2,
                                                              num_shared_experts=1))
    text = {**HEADS, "n_routed_experts": 16, "num_experts_per_tok": 4, "n_shared_experts": 1,
            "routed_scaling_factor": 2.0}
    rc = from_hf_config({"model_type": "unlimited_ocr", "language_config": dict(text)})
    assert (rc.num_experts, rc.top_k, rc.routed_scaling_factor, rc.num_shared_experts) == (16, 4, 2.0, 1)
    assert rc == from_hf_config(transformers.UnlimitedOcrConfig(language_config=dict(text)))
    grouped = {**text, "topk_method": "group_limited_greedy", "n_group": 4}
    rc = from_hf_config({"model_type": "unlimited_ocr", "text_config": grouped})
    assert (rc.n_group, rc.topk_group) == (4, 1)
    assert rc == from_hf_config(transformers.UnlimitedOcrConfig(text_config=dict(grouped)))
    nemo = transformers.NemotronH_Omni_Reasoning_V3_Config(
        text_config={"model_type": "nemotron_h", "n_routed_experts": 16, "num_experts_per_tok": 4})
    inner = nemo.to_dict()["text_config"]
    assert from_hf_config({"model_type": "nemotron_h_omni", "llm_config": inner}) == from_hf_config(nemo)
    assert from_hf_config(nemo).num_experts == 16
    for bad, key in (({"model_type": "afmoe", "route_scale": None}, "route_scale"),
                     ({"model_type": "deepseek_v2", "num_experts_per_tok": 6, "routed_scaling_factor": None},
                      "routed_scaling_factor")):
        with pytest.raises(ValueError, match=f"{key} is null"):
            from_hf_config(bad)


def test_llama4_weights_the_experts_inputs():
    """Llama4TextMoe multiplies the hidden states by each selected expert's score before the (non-linear) experts;
    every other family weights their outputs. RouterConfig.weight_on_input carries it to the consumer."""
    import inspect

    from moegate.cli import describe

    src = inspect.getsource(importlib.import_module("transformers.models.llama4.modeling_llama4").Llama4TextMoe)
    assert "routed_in = routed_in * router_scores" in src  # the scores scale the experts' input rows
    rc = from_hf_config(transformers.Llama4TextConfig(**HEADS, **EK_LOCAL))
    assert rc.weight_on_input is True and "inputs" in describe(rc)
    assert from_hf_config({"model_type": "llama4", "text_config": {**HEADS, **EK_LOCAL}}).weight_on_input is True
    for model_type in ("deepseek_v3", "qwen3_moe", "mixtral", "gpt_oss", "glm4_moe"):
        assert from_hf_config({"model_type": model_type}).weight_on_input is False, model_type


@pytest.mark.parametrize("cfg,key", [
    ({"model_type": "deepseek_v3", "routed_scaling_factor": True}, "routed_scaling_factor"),
    ({"model_type": "deepseek_v3", "routed_scaling_factor": "2.5"}, "routed_scaling_factor"),
    ({"model_type": "deepseek_v4", "routed_scaling_factor": "1.5"}, "routed_scaling_factor"),
    ({"model_type": "afmoe", "route_scale": False}, "route_scale"),
    ({"model_type": "ernie4_5_moe", "moe_norm_min": True}, "moe_norm_min"),
    ({"model_type": "ernie4_5_moe", "moe_norm_min": "1e-3"}, "moe_norm_min"),
    ({"model_type": "laguna", "moe_router_logit_softcapping": "30"}, "moe_router_logit_softcapping"),
    ({"model_type": "dbrx", "ffn_config": {"moe_normalize_expert_weights": "1"}}, "moe_normalize_expert_weights"),
], ids=["ds3-true", "ds3-str", "ds4-str", "afmoe-false", "ernie-true", "ernie-str", "laguna-cap-str", "dbrx-p-str"])
def test_a_factor_that_is_not_a_number_is_a_value_error(cfg, key):
    """A review of 2026-12-07: float() made true a scaling factor of 1.0, "2.5" one of 2.5, true an ERNIE eps of
    1.0 (the weights then divided by max(sum, 1)); a number in a config.json is an int or a float, anything else is
    a ValueError naming the key, like the counts' and the switches'."""
    with pytest.raises(ValueError, match=f"{key} must be a number, got"):
        from_hf_config(cfg)


def test_factors_of_any_real_type_are_taken():
    """An int, a float and numpy's scalars are numbers (a config built in Python may hold any of them)."""
    base = {"model_type": "deepseek_v3", "num_hidden_layers": 2, "first_k_dense_replace": 1}
    for rsf in (2, 2.5, np.float32(2.5), np.int64(2)):
        assert from_hf_config({**base, "routed_scaling_factor": rsf}).routed_scaling_factor == float(rsf)
    assert from_hf_config({"model_type": "ernie4_5_moe", "moe_norm_min": 1e-6}).renorm_eps == 1e-6


@pytest.mark.parametrize("layer", ["1", True, 1.0, [1]])
def test_a_layer_that_is_not_an_int_is_a_type_error(layer):
    """from_hf_config(layer=True) routed as layer 1 and "1" failed inside a comparison: layer is an int or None."""
    cfg = {"model_type": "deepseek_v3", "num_hidden_layers": 4, "first_k_dense_replace": 1}
    with pytest.raises(TypeError, match="layer must be an int or None"):
        from_hf_config(cfg, layer=layer)
    assert from_hf_config(cfg, layer=np.int64(2)) == from_hf_config(cfg, layer=2)


def _read(fn):
    try:
        return fn()
    except (ValueError, NotImplementedError) as exc:
        return type(exc).__name__


@pytest.mark.parametrize("model_type", sorted(t for t in set(FAMILIES) | set(SYNONYMS)
                                              if t in transformers.CONFIG_MAPPING))
def test_a_bare_config_routes_like_the_config_class_defaults(model_type):
    """A config.json that names only its model type is read with the config class's defaults, the router and every
    layer's kind (a mutation review: LongCat's zero_expert_num default and Nemotron-H's default layer pattern were
    pinned nowhere, the layer test above comparing counts only)."""
    cls = transformers.CONFIG_MAPPING[model_type]()
    assert _read(lambda: from_hf_config({"model_type": model_type})) == _read(lambda: from_hf_config(cls))
    assert _read(lambda: moe_layer_types({"model_type": model_type})) == _read(lambda: moe_layer_types(cls))


@pytest.mark.parametrize("model_type,eps,mode", [
    # ../shared/MODELS.md, "eps values": none for SM-R/F, MiniMax-M2/M3, Step3p7, Laguna, Kolibri1, Flint; 1e-20 for
    # the DS3 family, DSv4, Inkling2, HY-V3, AFMoE; 1e-15 Muse Spark; 1e-6 LFM2; ERNIE clamps at 1e-12.
    ("mixtral", 0.0, "add"), ("minimax_m2", 0.0, "add"), ("minimax_m3_vl_text", 0.0, "add"), ("step3p7", 0.0, "add"),
    ("laguna", 0.0, "add"), ("kolibri1", 0.0, "add"), ("flint", 0.0, "add"),
    ("deepseek_v3", 1e-20, "add"), ("glm4_moe", 1e-20, "add"), ("deepseek_v4", 1e-20, "add"),
    ("inkling2_text", 1e-20, "add"), ("hy_v3", 1e-20, "add"), ("afmoe", 1e-20, "add"),
    ("muse_spark_text", 1e-15, "add"), ("lfm2_moe", 1e-6, "add"), ("ernie4_5_moe", 1e-12, "clamp"),
])
def test_renorm_eps_of_each_family(model_type, eps, mode):
    """The eps a family renormalises with, as its router adds it: a sum near 1 hides 1e-6 against 1e-20 from the
    router comparisons (within 1e-6), so each is pinned here (a mutation review: LFM2's 1e-6 went to 1e-20 unseen)."""
    config = from_hf_config({"model_type": model_type})
    assert (config.renorm_eps, config.renorm_eps_mode) == (eps, mode)


@pytest.mark.parametrize("cfg,shared", [
    ({"model_type": "hunyuan_v1_moe"}, 1),  # HunYuanMoEV1Moe always builds shared_mlp
    ({"model_type": "qwen3_omni_moe_talker_text"}, 1),  # the talker's block always builds shared_expert
    ({"model_type": "granitemoeshared", "shared_intermediate_size": 0}, 0),  # shared_mlp is None at size 0
    ({"model_type": "granitemoeshared", "shared_intermediate_size": 64}, 1),
])
def test_shared_expert_counts_of_blocks_that_build_one(cfg, shared):
    """Shared experts the router comparisons cannot see (their default layout has no shared columns): pinned to
    the blocks transformers builds (a mutation review: each could go to 0 unseen)."""
    assert from_hf_config(cfg).num_shared_experts == shared
