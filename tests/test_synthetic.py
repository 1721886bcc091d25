"""moegate.synthetic: the seeded inputs' promises (its module docstring), each pinned on its own.

A mutation review found these unasserted: tests/test_cli.py checks that a seed reproduces its batch and that
chunking changes nothing, which a popularity ignoring the seed, blocks all drawn from one generator (rows repeating
every BLOCK_ROWS), a bias ignoring its seed, an uncentred popularity or a scale drawn from the bias's stream all
passed.
"""

from __future__ import annotations

import torch

from moegate.synthetic import (
    BLOCK_ROWS,
    POPULARITY_SLOPE,
    expert_popularity,
    synthetic_bias,
    synthetic_expert_scale,
    synthetic_logits,
    synthetic_token_ids,
)


def _zipf_profile(num_experts: int) -> torch.Tensor:
    """The docstring's profile by rank (0 = hottest): -POPULARITY_SLOPE * log(1 + r), centred to mean 0."""
    profile = -POPULARITY_SLOPE * torch.log1p(torch.arange(num_experts, dtype=torch.float64))
    return profile - profile.mean()


def test_popularity_is_the_centred_zipf_profile_over_experts():
    """expert_popularity(E, seed): the centred Zipf-like profile, mean 0, its ranks spread over the experts (a mutation
    review: the profile left uncentred passed)."""
    for E in (8, 128, 256):
        pop = expert_popularity(E, seed=3)
        assert pop.shape == (E,) and pop.dtype == torch.float32
        assert abs(float(pop.double().mean())) < 1e-6
        torch.testing.assert_close(pop.double().sort(descending=True).values, _zipf_profile(E), rtol=0, atol=1e-6)
        assert float(pop.max()) > 0 > float(pop.min())  # centred: the hot half above 0, the cold tail below


def test_popularity_is_a_seeded_permutation():
    """Which expert is hot depends on the seed (a seeded permutation of the ranks), and synthetic_logits adds the
    popularity of its own seed: logits at skew 1 minus those at skew 0 (the same noise) are expert_popularity(E, seed)
    (a mutation review: synthetic_logits taking seed 0's popularity for every seed passed)."""
    E = 64
    pops = [expert_popularity(E, seed=s) for s in range(4)]
    assert torch.equal(pops[1], expert_popularity(E, seed=1))  # same seed, same profile
    for i in range(4):
        for j in range(i + 1, 4):
            assert not torch.equal(pops[i], pops[j]), (i, j)
            assert torch.equal(pops[i].sort().values, pops[j].sort().values)  # the same profile, permuted
    for seed in (0, 5, 123456):
        shift = synthetic_logits(16, E, seed=seed, skew=1.0) - synthetic_logits(16, E, seed=seed, skew=0.0)
        torch.testing.assert_close(shift, expert_popularity(E, seed).expand(16, E), rtol=0, atol=1e-5)
        half = synthetic_logits(16, E, seed=seed, skew=0.5) - synthetic_logits(16, E, seed=seed, skew=0.0)
        torch.testing.assert_close(half, 0.5 * expert_popularity(E, seed).expand(16, E), rtol=0, atol=1e-5)
    assert not torch.equal(expert_popularity(E, 5), expert_popularity(E, 0))


def test_each_block_of_rows_has_its_own_generator():
    """Rows come in blocks of BLOCK_ROWS, each from its own generator: no block repeats another (a mutation review:
    every block drawn from one generator, the rows repeating every BLOCK_ROWS, passed), and rows made in chunks that
    cross block boundaries at any offset equal rows made in one call."""
    T = 3 * BLOCK_ROWS
    noise = synthetic_logits(T, 16, seed=2, skew=0.0)
    blocks = noise.view(3, BLOCK_ROWS, 16)
    for i in range(3):
        for j in range(i + 1, 3):
            assert not torch.equal(blocks[i], blocks[j]), (i, j)
            assert not torch.equal(blocks[i][:1], blocks[j][:1]), (i, j)  # not even their first rows
    ids = synthetic_token_ids(T, seed=2).view(3, BLOCK_ROWS)
    assert not torch.equal(ids[0], ids[1]) and not torch.equal(ids[1], ids[2])
    whole = synthetic_logits(T, 16, seed=2, skew=1.0)
    cuts = (0, 100, BLOCK_ROWS - 1, BLOCK_ROWS + 7, 2 * BLOCK_ROWS, 2 * BLOCK_ROWS + 500, T)
    chunked = torch.cat([synthetic_logits(hi - lo, 16, seed=2, skew=1.0, offset=lo) for lo, hi in zip(cuts, cuts[1:])])
    assert torch.equal(chunked, whole)
    id_chunks = torch.cat([synthetic_token_ids(hi - lo, seed=2, offset=lo) for lo, hi in zip(cuts, cuts[1:])])
    assert torch.equal(id_chunks, synthetic_token_ids(T, seed=2))


def test_bias_depends_on_its_seed():
    """synthetic_bias(E, seed): normal with std 0.01, the same for the same seed and another for another seed (a
    mutation review: the bias drawn from seed 0 whatever the seed passed)."""
    E = 4096
    biases = [synthetic_bias(E, seed=s) for s in range(3)]
    assert torch.equal(biases[2], synthetic_bias(E, seed=2))
    assert not torch.equal(biases[0], biases[1]) and not torch.equal(biases[1], biases[2])
    for b in biases:
        assert b.shape == (E,) and b.dtype == torch.float32
        assert 0.009 < float(b.std()) < 0.011 and abs(float(b.mean())) < 0.001


def test_expert_scale_and_bias_are_independent_streams():
    """The bias and the per-expert scale of one seed come from different streams: the scale's noise is no function of
    the bias's (a mutation review: the scale drawn from the bias's stream, 1 + 5 * bias exactly, passed). Over 4096
    experts their correlation is near 0; from one stream it is 1."""
    E = 4096
    for seed in (0, 1, 7):
        bias = synthetic_bias(E, seed=seed).double()
        scale = synthetic_expert_scale(E, seed=seed).double()
        assert 0.045 < float(scale.std()) < 0.055 and abs(float(scale.mean()) - 1.0) < 0.005  # 1 + 0.05 * normal
        assert not torch.allclose(scale - 1.0, 5.0 * bias, atol=1e-4)
        corr = float(torch.corrcoef(torch.stack([bias, scale]))[0, 1])
        assert abs(corr) < 0.1, (seed, corr)


def test_bias_std_suits_the_keys():
    """bias_std: 0.01 beside sigmoid / sqrt-softplus scores (about 0.5) and logits, 2% of the mean score beside
    softmax scores; synthetic_bias draws that std, and refuses a negative one."""
    from moegate import RouterConfig, preset, route
    from moegate.synthetic import BIAS_STD, bias_std, synthetic_inputs

    assert bias_std(preset("deepseek-v3")) == BIAS_STD == 0.01
    longcat = preset("longcat-flash")  # softmax + bias over 512 + 256 zero experts
    assert bias_std(longcat) == 0.02 / 768
    assert bias_std(RouterConfig(64, 4, scoring="softmax", selection="logits", has_correction_bias=True)) == BIAS_STD
    b = synthetic_bias(4096, 3, std=1e-4)
    assert torch.allclose(b, synthetic_bias(4096, 3) * 1e-2, rtol=1e-6, atol=0)  # the same normals, scaled
    assert abs(float(b.std()) - 1e-4) < 1e-5
    try:
        synthetic_bias(8, std=-1.0)
    except ValueError as exc:
        assert "std" in str(exc)
    else:
        raise AssertionError("a negative std was taken")
    # With 0.01 four of LongCat-Flash's experts took every token; with its own std no expert takes them all.
    inputs = synthetic_inputs(longcat, 1024, seed=0)
    _, ids = route(inputs["logits"], longcat, bias=inputs["bias"], backend="reference")
    load = torch.bincount(ids.flatten().long(), minlength=longcat.num_scored)
    assert int(load.max()) < 1024 // 4
    loud = dict(inputs, bias=synthetic_bias(longcat.num_scored, 0))
    _, ids = route(loud["logits"], longcat, bias=loud["bias"], backend="reference")
    assert int(torch.bincount(ids.flatten().long()).max()) == 1024  # the old std: one expert in every row
