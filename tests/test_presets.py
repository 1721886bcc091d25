"""Presets: exact names, published config.json values, and the round trip through a JSON file."""

from __future__ import annotations

import json

import pytest

from moegate import RouterConfig, from_hf_config, preset, preset_names
from moegate.hf import moe_layer_types
from moegate.presets import DEFAULT_PRESET, PRESETS, preset_hf_config, preset_source

FLAGSHIPS = [
    "deepseek-v3", "deepseek-r1", "deepseek-v2", "deepseek-v4", "kimi-k2", "qwen3-moe", "qwen3-next", "qwen3.5-moe",
    "mixtral", "gpt-oss", "llama4", "glm-4.5", "minimax-m2", "ernie-4.5", "longcat-flash", "gemma4",
]


def test_flagship_names_and_default_are_presets():
    names = preset_names()
    assert names == sorted(set(names)) and set(names) == set(PRESETS)
    assert set(FLAGSHIPS) <= set(names)
    assert DEFAULT_PRESET == "deepseek-v3" and DEFAULT_PRESET in names


@pytest.mark.parametrize("name", preset_names())
def test_preset_round_trips_through_a_json_file(name, tmp_path):
    config = preset(name)
    assert isinstance(config, RouterConfig)
    raw = preset_hf_config(name)
    assert raw["model_type"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    assert from_hf_config(path) == config
    assert from_hf_config(str(path)) == config
    assert from_hf_config(tmp_path) == config  # the model folder
    assert preset_source(name).count("/") == 1


@pytest.mark.parametrize("bad", ["deepseek", "DeepSeek-V3", "deepseek-v3 ", "", "mixtral-8x7b"])
def test_unknown_name_lists_the_known_ones(bad):
    with pytest.raises(ValueError, match=r"unknown preset .*known presets: .*deepseek-v3.*mixtral"):
        preset(bad)
    with pytest.raises(ValueError, match="known presets"):
        preset_hf_config(bad)


def test_preset_hf_config_is_a_copy():
    raw = preset_hf_config("kimi-k2.5")
    raw["text_config"]["n_routed_experts"] = 8
    assert preset("kimi-k2.5").num_experts == 384


def test_the_registry_is_read_only_and_preset_builds_from_a_copy():
    """A review (2026-12-04): preset() read the stored dict, so a caller's write to PRESETS[...].hf_config changed
    every later preset(); the registry is read-only now, hf_config is a copy, and a Preset hashes."""
    with pytest.raises(TypeError):
        PRESETS["mixtral"] = PRESETS["qwen3-moe"]
    PRESETS["deepseek-v3"].hf_config["num_experts_per_tok"] = 4
    assert preset("deepseek-v3").top_k == 8
    m = PRESETS["mixtral"]
    twin = type(m)(m.name, m.source, m.hf_config)  # an equal Preset built apart: equal, and hashed alike
    assert twin == m and hash(twin) == hash(m) and len({m, twin, PRESETS["qwen3-moe"]}) == 2


@pytest.mark.parametrize(
    "name,expected",
    [
        ("deepseek-v3", dict(num_experts=256, top_k=8, scoring="sigmoid", has_correction_bias=True, n_group=8,
                             topk_group=4, group_fill="exclude", renormalize=True, routed_scaling_factor=2.5,
                             num_shared_experts=1)),
        ("deepseek-v2", dict(num_experts=160, top_k=6, scoring="softmax", n_group=8, topk_group=3, group_score="max",
                             renormalize=False, routed_scaling_factor=16.0, num_shared_experts=2)),
        ("deepseek-v4", dict(num_experts=256, top_k=6, scoring="sqrtsoftplus", has_correction_bias=True,
                             routed_scaling_factor=1.5, num_shared_experts=1)),
        ("kimi-k2", dict(num_experts=384, top_k=8, n_group=1, routed_scaling_factor=2.827, num_shared_experts=1)),
        ("qwen3-moe", dict(num_experts=128, top_k=8, scoring="softmax", renormalize=True, renorm_eps=0.0)),
        ("qwen3-next", dict(num_experts=512, top_k=10, renormalize=True, num_shared_experts=1)),
        ("mixtral", dict(num_experts=8, top_k=2, renormalize=True, renorm_eps=0.0)),
        ("gpt-oss", dict(num_experts=128, top_k=4, selection="logits", renormalize=True)),
        ("llama4", dict(num_experts=16, top_k=1, scoring="sigmoid", selection="logits", renormalize=False,
                        num_shared_experts=1)),
        ("glm-4.5", dict(num_experts=160, top_k=8, has_correction_bias=True, n_group=1, routed_scaling_factor=2.5)),
        ("minimax-m2", dict(num_experts=256, top_k=8, scoring="sigmoid", has_correction_bias=True, renorm_eps=0.0)),
        ("ernie-4.5", dict(num_experts=64, top_k=8, has_correction_bias=True, renorm_eps_mode="clamp",
                           renorm_eps=1e-12, num_shared_experts=0)),
        ("longcat-flash", dict(num_experts=512, num_zero_experts=256, top_k=12, renormalize=False,
                               routed_scaling_factor=6.0, has_correction_bias=True)),
        ("gemma4", dict(num_experts=128, top_k=8, has_expert_scale=True, renormalize=True)),
        ("dbrx", dict(num_experts=16, top_k=4, renorm_p=1.0, renormalize=True)),
        # The presets a review found pinned nowhere (their values from the models' config.json on the Hub).
        ("deepseek-r1", dict(num_experts=256, top_k=8, scoring="sigmoid", has_correction_bias=True, n_group=8,
                             topk_group=4, renormalize=True, routed_scaling_factor=2.5, num_shared_experts=1)),
        ("deepseek-v3.2", dict(num_experts=256, top_k=8, scoring="sigmoid", has_correction_bias=True, n_group=8,
                               topk_group=4, renormalize=True, routed_scaling_factor=2.5, num_shared_experts=1)),
        ("deepseek-v2-lite", dict(num_experts=64, top_k=6, scoring="softmax", n_group=1, renormalize=False,
                                  routed_scaling_factor=1.0, num_shared_experts=2)),
        ("glm-4.6", dict(num_experts=160, top_k=8, scoring="sigmoid", has_correction_bias=True, n_group=1,
                         renormalize=True, routed_scaling_factor=2.5, num_shared_experts=1)),
        ("gpt-oss-20b", dict(num_experts=32, top_k=4, scoring="softmax", selection="logits", renormalize=True,
                             num_shared_experts=0)),
        ("minimax-text-01", dict(num_experts=32, top_k=2, scoring="softmax", renormalize=True, num_shared_experts=0)),
        ("mixtral-8x22b", dict(num_experts=8, top_k=2, scoring="softmax", renormalize=True, renorm_eps=0.0)),
        ("qwen3-235b-a22b", dict(num_experts=128, top_k=8, scoring="softmax", renormalize=True, renorm_eps=0.0,
                                 num_shared_experts=0)),
        # A mutation review (2026-12-07): these could change unseen.
        ("llama4-maverick", dict(num_experts=128, top_k=1, scoring="sigmoid", selection="logits", renormalize=False,
                                 num_shared_experts=1)),
        ("kimi-k2.5", dict(num_experts=384, top_k=8, n_group=1, routed_scaling_factor=2.827, num_shared_experts=1,
                           renormalize=True)),
        ("deepseek-v2", dict(num_experts=160, top_k=6, scoring="softmax", n_group=8, topk_group=3,
                             routed_scaling_factor=16.0, num_shared_experts=2, renormalize=False)),
    ],
)
def test_preset_routing_facts(name, expected):
    got = preset(name).to_dict()
    assert {k: got[k] for k in expected} == expected


@pytest.mark.parametrize(
    "name,dense,moe,hash_",
    [("deepseek-v3", 3, 58, 0), ("kimi-k2", 1, 60, 0), ("deepseek-v4", 0, 40, 3), ("llama4-maverick", 24, 24, 0),
     ("ernie-4.5", 3, 51, 0), ("qwen3-moe", 0, 48, 0), ("jamba", 16, 16, 0), ("deepseek-v2", 1, 59, 0),
     ("glm-4.5", 3, 89, 0), ("glm-4.6", 3, 89, 0), ("dbrx", 0, 40, 0), ("kimi-k2.5", 1, 60, 0)],
)
def test_preset_layer_types(name, dense, moe, hash_):
    kinds = moe_layer_types(preset_hf_config(name))
    assert (kinds.count("dense"), kinds.count("moe"), kinds.count("hash")) == (dense, moe, hash_)


def test_presets_load_into_the_transformers_config_classes():
    """Every preset's keys build the model's transformers config, which routes the same way."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    aliases = {"kimi_k2": "deepseek_v3"}
    for name in preset_names():
        raw = preset_hf_config(name)
        model_type = raw.pop("model_type")
        cls = transformers.CONFIG_MAPPING[aliases.get(model_type, model_type)]
        assert from_hf_config(cls(**raw)) == preset(name), name


# transformers' config classes default to one published checkpoint (their docstring names it); for these the
# preset written from that checkpoint's config.json must route like the class defaults.
CLASS_DEFAULT_CHECKPOINTS = {
    "deepseek-v3": "deepseek_v3", "deepseek-v4": "deepseek_v4", "glm-5": "glm_moe_dsa", "glm-4.5-air": "glm4_moe",
    "mimo-v2-flash": "mimo_v2_flash", "kimi-linear": "kimi_linear", "qwen3.5-moe": "qwen3_5_moe",
    "qwen3-next": "qwen3_next", "qwen1.5-moe": "qwen2_moe", "longcat-flash": "longcat_flash",
    "ernie-4.5-21b-a3b": "ernie4_5_moe", "olmoe": "olmoe", "jamba": "jamba", "llama4": "llama4", "gpt-oss": "gpt_oss",
    "minimax-m2": "minimax_m2", "mixtral": "mixtral",
}


@pytest.mark.parametrize("name,model_type", sorted(CLASS_DEFAULT_CHECKPOINTS.items()))
def test_preset_matches_the_checkpoint_transformers_defaults_to(name, model_type):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    assert preset(name) == from_hf_config(transformers.CONFIG_MAPPING[model_type]())
