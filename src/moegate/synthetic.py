"""Seeded synthetic router inputs: logits with a realistic, skewed expert popularity, and the extra
tensors some configs need (correction bias, per-expert scale, hash table and token ids).

The CLI, the benchmarks and the tests share these so that "seed 0, skew 1" means the same batch everywhere.

Model of the logits, row t, expert e (before the cast to ``dtype``)::

    x[t, e] = noise[t, e] + skew * popularity[e]

- ``noise`` is standard normal, drawn block by block (``BLOCK_ROWS`` rows per block, each block from its own
  generator), so rows ``[offset, offset + T)`` are the same numbers whether they are made in one call or in
  chunks: ``synthetic_logits(T, E, offset=o)`` equals ``synthetic_logits(o + T, E)[o:]``.
- ``popularity`` is a Zipf-like profile over a seeded permutation of the experts: the expert of rank r
  (0 = hottest) gets ``-POPULARITY_SLOPE * log(1 + r)``, centred to mean 0. With ``skew=1`` a DeepSeek-V3-sized
  router (E=256, K=8) sees its hottest expert at about 4x the mean load (Qwen3-MoE, E=128: about 2.7x)
  and a long tail of cold experts, the shape of trained routers without load balancing; ``skew=0`` is
  uniform noise (every expert equally likely).
"""

from __future__ import annotations

import torch

from moegate._checks import FLOAT_DTYPES, _check_int, _check_nonnegative_float
from moegate.config import RouterConfig

BLOCK_ROWS = 1024
POPULARITY_SLOPE = 0.15
HASH_VOCAB = 4096

# Independent streams: one generator per (seed, stream, block).
_STREAM_POPULARITY, _STREAM_NOISE, _STREAM_BIAS, _STREAM_SCALE, _STREAM_HASH, _STREAM_TOKENS = range(6)


def _generator(seed: int, stream: int, block: int = 0) -> torch.Generator:
    mixed = (seed * 0x9E3779B97F4A7C15 + stream * 0xBF58476D1CE4E5B9 + block * 0x94D049BB133111EB) % (2**63)
    return torch.Generator().manual_seed(mixed)


SEED_MAX = 2**32 - 1  # torch's CPU generator keeps 32 bits of a seed: larger seeds would repeat smaller ones


def _check_seed_skew(seed, skew) -> None:
    _check_int("seed", seed, 0, SEED_MAX)
    _check_nonnegative_float("skew", skew)


def expert_popularity(num_experts: int, seed: int = 0) -> torch.Tensor:
    """The popularity profile [E] float32 (mean 0) that ``skew`` multiplies; larger is hotter."""
    _check_int("num_experts", num_experts, 1)
    _check_int("seed", seed, 0, SEED_MAX)
    rank = torch.randperm(num_experts, generator=_generator(seed, _STREAM_POPULARITY))  # [E] rank of expert e
    profile = -POPULARITY_SLOPE * torch.log1p(rank.double())  # [E]
    return (profile - profile.mean()).float()


def _rows(num_rows: int, offset: int, seed: int, stream: int, make) -> torch.Tensor:
    """Rows [offset, offset + num_rows) of a block-seeded stream; ``make(generator, n)`` draws n rows."""
    parts = []
    first, last = offset // BLOCK_ROWS, (offset + num_rows - 1) // BLOCK_ROWS
    for block in range(first, last + 1) if num_rows else ():
        rows = make(_generator(seed, stream, block), BLOCK_ROWS)
        lo = max(offset - block * BLOCK_ROWS, 0)
        hi = min(offset + num_rows - block * BLOCK_ROWS, BLOCK_ROWS)
        parts.append(rows[lo:hi])
    if not parts:
        return make(_generator(seed, stream), 0)
    return torch.cat(parts)


def synthetic_logits(
    num_tokens: int,
    num_experts: int,
    seed: int = 0,
    skew: float = 1.0,
    *,
    offset: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Router logits [T, E] with a skewed expert popularity (see the module docstring).

    Parameters
    ----------
    num_tokens : int >= 0
        T, rows.
    num_experts : int >= 1
        E, the width of the logits (pass ``config.num_scored`` for configs with zero experts).
    seed : int in [0, 2**32)
        Same seed, same numbers, on every device and for every chunking.
    skew : float >= 0
        How strongly expert popularity shows: 0 is uniform noise, 1 is a realistic unbalanced router. A skew whose
        logits overflow ``dtype`` is a ValueError.
    offset : int >= 0
        First row of the seeded stream: ``synthetic_logits(T, E, offset=o) == synthetic_logits(o + T, E)[o:]``.
    dtype, device : the returned tensor's (generated in fp32 on the CPU, then cast and moved).
    """
    _check_int("num_tokens", num_tokens, 0)
    _check_int("num_experts", num_experts, 1)
    _check_int("offset", offset, 0)
    _check_seed_skew(seed, skew)
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be float32, float16 or bfloat16, got {dtype}")
    noise = _rows(num_tokens, offset, seed, _STREAM_NOISE,
                  lambda g, n: torch.randn(n, num_experts, generator=g))  # [T, E]
    logits = (noise + skew * expert_popularity(num_experts, seed)).to(dtype)  # [T, E], on the CPU
    if not bool(torch.isfinite(logits).all()):
        raise ValueError(f"skew={skew!r} makes logits that overflow {dtype}: take a smaller skew")
    return logits.to(device=device)


BIAS_STD = 0.01


def synthetic_bias(
    num_experts: int, seed: int = 0, *, std: float = BIAS_STD, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """A small correction bias [E] float32 (normal, std ``std``), as noaux_tc configs need; ``bias_std(config)``
    is the std that suits a config's keys."""
    _check_int("num_experts", num_experts, 1)
    _check_int("seed", seed, 0, SEED_MAX)
    _check_nonnegative_float("std", std)
    return (float(std) * torch.randn(num_experts, generator=_generator(seed, _STREAM_BIAS))).to(device)


def bias_std(config: RouterConfig) -> float:
    """The synthetic bias's std for a config: BIAS_STD (0.01) where the keys are sigmoid or sqrt-softplus scores
    (about 0.5: a 2% bias) or logits, and 2% of the mean score, 0.02 / (E + Z), where they are softmax scores.
    A bias of 0.01 against LongCat-Flash's softmax scores (about 1 / 768) decided the selection alone: four experts
    took every token."""
    if config.scoring == "softmax" and config.selection == "scores":
        return 2 * BIAS_STD / config.num_scored
    return BIAS_STD


def synthetic_expert_scale(num_experts: int, seed: int = 0, *, device: torch.device | str = "cpu") -> torch.Tensor:
    """A per-expert scale [E] float32 near 1 (1 + 0.05 * normal, kept > 0), as has_expert_scale configs need."""
    _check_int("num_experts", num_experts, 1)
    _check_int("seed", seed, 0, SEED_MAX)
    scale = 1.0 + 0.05 * torch.randn(num_experts, generator=_generator(seed, _STREAM_SCALE))
    return scale.clamp(min=0.5).to(device)


def synthetic_hash_table(
    num_experts: int, top_k: int, seed: int = 0, *, vocab: int = HASH_VOCAB, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """A hash-routing table [vocab, K] int32: each row K distinct experts in [0, E), uniformly at random."""
    _check_int("num_experts", num_experts, 1)
    _check_int("top_k", top_k, 1, num_experts)
    _check_int("vocab", vocab, 1)
    _check_int("seed", seed, 0, SEED_MAX)
    keys = torch.rand(vocab, num_experts, generator=_generator(seed, _STREAM_HASH))  # [vocab, E]
    return keys.argsort(dim=1)[:, :top_k].to(device=device, dtype=torch.int32)  # [vocab, K]


def synthetic_token_ids(
    num_tokens: int, seed: int = 0, *, vocab: int = HASH_VOCAB, offset: int = 0, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Token ids [T] int64 in [0, vocab), block-seeded like the logits (``offset`` picks the first row)."""
    _check_int("num_tokens", num_tokens, 0)
    _check_int("vocab", vocab, 1)
    _check_int("offset", offset, 0)
    _check_int("seed", seed, 0, SEED_MAX)
    ids = _rows(num_tokens, offset, seed, _STREAM_TOKENS,
                lambda g, n: torch.randint(0, vocab, (n,), generator=g))  # [T]
    return ids.to(device)


def synthetic_inputs(
    config: RouterConfig,
    num_tokens: int,
    seed: int = 0,
    skew: float = 1.0,
    *,
    offset: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> dict:
    """Everything ``route(**inputs, config=config)`` needs for a seeded synthetic batch.

    Returns a dict with ``logits`` [T, E + Z] and, only where the config asks for them, ``bias`` [E + Z],
    ``expert_scale`` [E], ``token_ids`` [T] and ``hash_table`` [vocab, K].
    """
    if not isinstance(config, RouterConfig):
        raise TypeError(f"config must be a RouterConfig, got {type(config).__name__}")
    inputs = {"logits": synthetic_logits(num_tokens, config.num_scored, seed, skew, offset=offset, dtype=dtype,
                                         device=device)}
    if config.has_correction_bias:
        inputs["bias"] = synthetic_bias(config.num_scored, seed, std=bias_std(config), device=device)
    if config.has_expert_scale:
        inputs["expert_scale"] = synthetic_expert_scale(config.num_experts, seed, device=device)
    if config.routing == "hash":
        inputs["hash_table"] = synthetic_hash_table(config.num_experts, config.top_k, seed, device=device)
        inputs["token_ids"] = synthetic_token_ids(num_tokens, seed, offset=offset, device=device)
    return inputs
