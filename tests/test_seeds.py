"""The seeds' bug classes (../shared/seeds), one regression test per property, on the reference router."""

import pytest
import torch

from moegate import ExpertLayout, ExpertPlacement, RouterConfig, RoutingRecorder, check_routing, route
from moegate.check import logical_routed_ids

# The router shapes of the per-rank renormalisation write-up's table.
ROUTERS = {
    "dsv3-grouped": RouterConfig(num_experts=256, top_k=8, scoring="sigmoid", has_correction_bias=True, n_group=8,
                                 topk_group=4, routed_scaling_factor=2.5, num_shared_experts=1),
    "384-in-8-groups": RouterConfig(num_experts=384, top_k=8, scoring="sigmoid", has_correction_bias=True,
                                    n_group=8, topk_group=4, routed_scaling_factor=2.827, num_shared_experts=1),
    "kimi-k2-one-group": RouterConfig(num_experts=384, top_k=8, scoring="sigmoid", has_correction_bias=True,
                                      routed_scaling_factor=2.827, num_shared_experts=1),
    "grouped-softmax-64": RouterConfig(num_experts=64, top_k=6, scoring="softmax", n_group=8, topk_group=3,
                                       routed_scaling_factor=16.0, num_shared_experts=2),
    "dsv4-sqrtsoftplus": RouterConfig(num_experts=256, top_k=6, scoring="sqrtsoftplus", has_correction_bias=True,
                                      routed_scaling_factor=1.5, num_shared_experts=1),
    "softmax-128": RouterConfig(num_experts=128, top_k=8, scoring="softmax", num_shared_experts=1),
}


def inputs(cfg: RouterConfig, T: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.stack([torch.randperm(cfg.num_experts, generator=g) / 32.0 for _ in range(T)])
    logits = logits - logits.mean()
    bias = torch.randn(cfg.num_experts, generator=g) * 0.05 if cfg.has_correction_bias else None
    return logits, bias


@pytest.mark.parametrize("name", sorted(ROUTERS))
@pytest.mark.parametrize("num_shared", [1, 2])
@pytest.mark.parametrize("scale", ["in_weights", "on_output"])
def test_per_rank_fused_routing_equals_routing_without_fusion(name, num_shared, scale):
    cfg = ROUTERS[name].replace(num_shared_experts=num_shared)
    logits, bias = inputs(cfg)
    plain_w, plain_ids = route(logits, cfg, ExpertLayout(scale=scale), bias=bias, backend="reference")
    layout = ExpertLayout(shared_slots="per_rank", ep_size=8, scale=scale)
    w, ids = route(logits, cfg, layout, bias=bias, home_rank=3, backend="reference")
    K = cfg.top_k
    assert ids.shape == (64, K + num_shared)
    assert torch.equal(logical_routed_ids(ids[:, :K], cfg, layout), plain_ids.long())
    assert torch.equal(w[:, :K], plain_w)
    assert check_routing(w, ids, cfg, layout, logits=logits, bias=bias, home_rank=3) == []


@pytest.mark.parametrize("name", sorted(ROUTERS))
@pytest.mark.parametrize("shared_slots", ["none", "global", "per_rank"])
def test_routed_weights_sum_to_one_or_rsf(name, shared_slots):
    cfg = ROUTERS[name]
    logits, bias = inputs(cfg, seed=1)
    for scale, target in (("in_weights", cfg.routed_scaling_factor), ("on_output", 1.0)):
        layout = ExpertLayout(shared_slots=shared_slots, ep_size=8, scale=scale)
        w, _ = route(logits, cfg, layout, bias=bias, home_rank=5, backend="reference")
        sums = w[:, : cfg.top_k].double().sum(dim=1)
        torch.testing.assert_close(sums, torch.full_like(sums, target), rtol=2e-6, atol=0)


@pytest.mark.parametrize("name", sorted(ROUTERS))
def test_unnormalized_weights_stay_raw_scores(name):
    cfg = ROUTERS[name].replace(renormalize=False)
    logits, bias = inputs(cfg, seed=2)
    layout = ExpertLayout(shared_slots="per_rank", ep_size=8)
    w, ids = route(logits, cfg, layout, bias=bias, home_rank=1, backend="reference")
    from moegate.reference import scores_and_keys

    scores, _ = scores_and_keys(logits, cfg, bias)
    logical = logical_routed_ids(ids[:, : cfg.top_k], cfg, layout)
    expected = torch.gather(scores, 1, logical) * cfg.routed_scaling_factor
    torch.testing.assert_close(w[:, : cfg.top_k], expected, rtol=1e-6, atol=0)
    assert check_routing(w, ids, cfg, layout, logits=logits, bias=bias, home_rank=1) == []


@pytest.mark.parametrize("shared_slots", ["global", "per_rank"])
def test_router_is_never_asked_for_k_plus_s_experts(shared_slots):
    # A top-6 with a fused shared slot stays a top-6: six distinct routed experts, then the shared column.
    cfg = RouterConfig(num_experts=64, top_k=6, scoring="softmax", num_shared_experts=1)
    logits, _ = inputs(cfg, seed=3)
    w, ids = route(logits, cfg, ExpertLayout(shared_slots=shared_slots, ep_size=8), home_rank=2,
                   backend="reference")
    assert ids.shape[1] == 7
    logical = logical_routed_ids(ids[:, :6], cfg, ExpertLayout(shared_slots=shared_slots, ep_size=8))
    assert (logical >= 0).all()
    assert all(len(set(row)) == 6 for row in logical.tolist())
    plain_w, plain_ids = route(logits, cfg, backend="reference")
    assert torch.equal(logical, plain_ids.long())


def test_no_id_reaches_the_end_of_the_per_rank_id_space():
    # EP8, 384 experts, one shared: 8 * (48 + 1) = 392 ids; the last rank's shared slot is 391, never 392.
    cfg = ROUTERS["kimi-k2-one-group"]
    layout = ExpertLayout(shared_slots="per_rank", ep_size=8)
    assert layout.id_space(cfg.num_experts, cfg.num_shared_experts) == 392
    logits, bias = inputs(cfg, T=128, seed=4)
    logits[:, -8:] += 100.0  # push the top experts to the end of the last rank
    for rank in range(8):
        _, ids = route(logits, cfg, layout, bias=bias, home_rank=rank, backend="reference")
        assert int(ids.max()) <= 391
        assert int(ids[:, -1].max()) == rank * 49 + 48
    _, ids = route(logits, cfg, layout, bias=bias, home_rank=7, backend="reference")
    assert int(ids[:, :8].max()) == 390 and int(ids[:, -1].max()) == 391


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("shared_slots", ["global", "per_rank"])
def test_shared_weight_is_one_in_weights_and_inverse_rsf_on_output(renormalize, shared_slots):
    cfg = ROUTERS["dsv3-grouped"].replace(renormalize=renormalize, num_shared_experts=2)
    logits, bias = inputs(cfg, seed=5)
    logits = logits * 0  # zero logits: the routed-score sum would leak into a shared weight computed from it
    w, _ = route(logits, cfg, ExpertLayout(shared_slots=shared_slots, ep_size=8), bias=bias, backend="reference")
    assert (w[:, -2:] == 1.0).all()
    w, _ = route(logits, cfg, ExpertLayout(shared_slots=shared_slots, ep_size=8, scale="on_output"), bias=bias,
                 backend="reference")
    assert torch.allclose(w[:, -2:], torch.full_like(w[:, -2:], 1 / 2.5), rtol=1e-7, atol=0)


@pytest.mark.parametrize("shared_slots", ["none", "global", "per_rank"])
def test_padded_rows_are_all_minus_one_and_zero_including_shared_columns(shared_slots):
    cfg = ROUTERS["dsv4-sqrtsoftplus"].replace(num_shared_experts=2)
    logits, bias = inputs(cfg, T=37, seed=6)
    layout = ExpertLayout(shared_slots=shared_slots, ep_size=8)
    for nvt in (0, 20, torch.tensor([20], dtype=torch.int64), 37):
        w, ids = route(logits, cfg, layout, bias=bias, home_rank=6, num_valid_tokens=nvt, backend="reference")
        n = int(nvt)
        assert (ids[n:] == -1).all() and (w[n:] == 0).all()
        assert (ids[:n] >= 0).all()
        assert check_routing(w, ids, cfg, layout, bias=bias, logits=logits, home_rank=6, num_valid_tokens=nvt) == []


def test_capture_is_routed_only_logical_and_sized_t_by_k():
    cfg = ROUTERS["dsv3-grouped"]
    placement = ExpertPlacement(tuple(range(256)) + tuple(range(0, 256, 8)), num_experts=256)
    layout = ExpertLayout(shared_slots="per_rank", ep_size=8, placement=placement)
    logits, bias = inputs(cfg, T=10, seed=7)
    rec = RoutingRecorder(num_layers=3, max_tokens=16, top_k=8, num_experts=256, dtype=torch.int16)
    _, ids = route(logits, cfg, layout, bias=bias, recorder=rec, layer=2, num_valid_tokens=8, home_rank=4,
                   backend="reference")
    _, plain_ids = route(logits, cfg, bias=bias, backend="reference")
    captured = rec.layer_ids(2)
    assert captured.shape == (10, 8) and captured.dtype == torch.int16
    assert torch.equal(captured[:8].int(), plain_ids[:8])
    assert (captured[8:] == -1).all()
    assert torch.equal(logical_routed_ids(ids[:8, :8], cfg, layout), plain_ids[:8].long())


def test_batch_larger_than_recorder_raises_before_routing():
    cfg = ROUTERS["softmax-128"]
    rec = RoutingRecorder(num_layers=1, max_tokens=4, top_k=8, num_experts=128)
    with pytest.raises(ValueError, match="max_tokens=4"):
        route(torch.randn(5, 128), cfg, recorder=rec, backend="reference")
    assert (rec.ids == -1).all()


@pytest.mark.parametrize("shared_slots", ["none", "global", "per_rank"])
def test_placement_remaps_every_routed_column_and_never_the_shared_ones(shared_slots):
    cfg = RouterConfig(num_experts=16, top_k=16, scoring="softmax", num_shared_experts=1)  # K = E: every column
    # Each logical e lives at slot 15 - e, plus a replica of every even expert.
    table = tuple(range(15, -1, -1)) + tuple(range(0, 16, 2))
    placement = ExpertPlacement(table, num_experts=16)
    layout = ExpertLayout(shared_slots=shared_slots, ep_size=4, placement=placement, replica_policy="first")
    logits, _ = inputs(cfg, T=9, seed=8)
    w, ids = route(logits, cfg, layout, home_rank=2, backend="reference")
    _, plain = route(logits, cfg, backend="reference")
    L, S = 6, 1
    physical = (15 - plain.long())
    if shared_slots == "per_rank":
        physical = physical + (physical // L) * S
    assert torch.equal(ids[:, :16].long(), physical)
    if shared_slots == "global":
        assert (ids[:, 16] == 24).all()
    if shared_slots == "per_rank":
        assert (ids[:, 16] == 2 * (L + S) + L).all()
    assert check_routing(w, ids, cfg, layout, logits=logits, home_rank=2) == []


def test_checker_catches_the_seed_bugs():
    """The checker flags each silent bug when we inject it into correct output."""
    cfg = ROUTERS["dsv3-grouped"]
    layout = ExpertLayout(shared_slots="per_rank", ep_size=8)
    logits, bias = inputs(cfg, T=8, seed=9)
    w, ids = route(logits, cfg, layout, bias=bias, home_rank=7, num_valid_tokens=6, backend="reference")
    kw = dict(logits=logits, bias=bias, home_rank=7, num_valid_tokens=6)
    assert check_routing(w, ids, cfg, layout, **kw) == []

    def what(w2, ids2):
        return {v.what for v in check_routing(w2, ids2, cfg, layout, **kw)}

    shrunk = w.clone()
    shrunk[:6, :8] *= 0.87  # weights summing to 0.87 * rsf
    assert "renormalize" in what(shrunk, ids)
    top5 = ids.clone()
    top5[0, 7] = top5[0, 8]  # a top-8 that runs top-7 plus a shared marker
    assert {"routed slot"} <= what(w, top5)
    past_end = ids.clone()
    past_end[1, 8] = layout.id_space(256, 1)  # 264 = 8 ranks x (32 + 1): one past the per-rank id space
    assert {"id range", "shared id"} <= what(w, past_end)
    twice = w.clone()
    twice[:6, :8] *= 2.5  # rsf applied twice
    assert "renormalize" in what(twice, ids)
    live_pad = ids.clone()
    live_pad[7, 8] = 7 * 33 + 32  # a padded row with a live shared slot (rank 7's)
    assert "padding" in what(w, live_pad)
    wrong_shared = w.clone()
    wrong_shared[2, 8] = 0.4
    assert "shared weight" in what(wrong_shared, ids)
    swapped = ids.clone()
    swapped[3, 0] = (int(swapped[3, 0]) + 1) % 33 if int(swapped[3, 0]) % 33 < 31 else int(swapped[3, 0]) - 1
    assert what(w, swapped) & {"selection", "distinct", "group"}  # an expert of a dropped group: "group"
    # Columns out of key order (ids and weights permuted together, so every weight still matches its expert).
    reordered_w, reordered_ids = w.clone(), ids.clone()
    reordered_w[4, :8], reordered_ids[4, :8] = w[4, :8].flip(0), ids[4, :8].flip(0)
    assert what(reordered_w, reordered_ids) == {"column order"}


def test_checker_forgives_near_tied_columns_and_needs_both_hash_tensors():
    """Two exactly tied keys in either order pass (the checker's tolerance), and a hash routing check given only
    one of token_ids / hash_table says which one is missing."""
    cfg = RouterConfig(8, 4, scoring="sigmoid")
    logits = torch.tensor([[3.0, 1.0, 2.0, 2.0, -1.0, 0.5, -2.0, 0.0]])
    w, ids = route(logits, cfg, backend="reference")
    assert ids[0].tolist() == [0, 2, 3, 1]
    swapped_w, swapped_ids = w[:, [0, 2, 1, 3]], ids[:, [0, 2, 1, 3]]
    assert check_routing(swapped_w, swapped_ids, cfg, logits=logits) == []
    hashed = RouterConfig(8, 2, routing="hash", scoring="sigmoid")
    table = torch.tensor([[0, 1], [5, 2]])
    tids = torch.tensor([1])
    w, ids = route(logits, hashed, token_ids=tids, hash_table=table, backend="reference")
    assert check_routing(w, ids, hashed, logits=logits, token_ids=tids, hash_table=table) == []
    with pytest.raises(ValueError, match="token_ids is missing"):
        check_routing(w, ids, hashed, logits=logits, hash_table=table)
    with pytest.raises(ValueError, match="hash_table is missing"):
        check_routing(w, ids, hashed, token_ids=tids)


def test_checker_near_ties_are_relative_to_the_keys():
    """Keys of 2e-7 and 2e-10 (softmax scores far below the winners) are no near-tie: an absolute tolerance of 1e-6
    forgave a wrong third expert here. Keys within rtol of their size still pass either way, a bias counted in."""
    cfg = RouterConfig(8, 3)
    x = torch.tensor([[10.0, 9.0, -5.0, -12.0, -12.0, -12.0, -12.0, -12.0]])
    w, ids = route(x, cfg, backend="reference")
    assert ids[0].tolist() == [0, 1, 2]
    wrong_ids, wrong_w = ids.clone(), w.clone()
    wrong_ids[0, 2] = 7
    s = torch.softmax(x, dim=1)[0]
    wrong_w[0, 2] = s[7] / (s[0] + s[1] + s[7])
    assert {v.what for v in check_routing(wrong_w, wrong_ids, cfg, logits=x)} == {"selection"}
    biased = RouterConfig(4, 1, scoring="sigmoid", has_correction_bias=True, renormalize=False)
    x = torch.tensor([[0.0, 0.0, -4.0, -4.0]])
    bias = torch.tensor([100.0, 100.0 + 1e-4, 0.0, 0.0])  # keys 100.5 and 100.5001: within 1e-5 of 100.5
    w, ids = route(x, biased, bias=bias, backend="reference")
    assert ids.tolist() == [[1]]
    assert check_routing(w, torch.zeros_like(ids), biased, logits=x, bias=bias) == []


def test_checker_near_ties_neither_forgive_dead_experts_nor_skip_weights():
    """A review (2026-12-04) found three holes in the near-tie test against the reference: a dead expert's key (-inf,
    of size inf) counted as near any key, so a router that took NaN / -inf experts over live ones passed; a set
    of near-tied experts other than the reference's skipped the weight check, so any weights passed; and with
    group_fill="zero" the checker compared the raw keys, not the 0.0 that every dropped expert ties at."""
    nan, inf = float("nan"), float("inf")
    logits = torch.tensor([[nan, 1.0, 2.0, 3.0, 0.5, 0.1, -1.0, -inf]])
    for cfg, bias in ((RouterConfig(8, 2, scoring="sigmoid", has_correction_bias=True, renormalize=False),
                       torch.zeros(8)), (RouterConfig(8, 2, renormalize=False), None)):
        dead = torch.tensor([[0, 7]], dtype=torch.int32)  # NaN and -inf: weights 0
        assert {v.what for v in check_routing(torch.zeros(1, 2), dead, cfg, logits=logits, bias=bias)} == {"selection"}
        one_dead = torch.tensor([[3, 0]], dtype=torch.int32)
        w = route(logits, cfg, bias=bias, backend="reference").weights[:, :1]
        got = check_routing(torch.cat([w, torch.zeros(1, 1)], dim=1), one_dead, cfg, logits=logits, bias=bias)
        assert {v.what for v in got} == {"selection"}
    # Experts 1 and 2 tie: [0, 2] is as good as the reference's [0, 1], with its own weights only.
    cfg = RouterConfig(8, 2, scoring="sigmoid", renormalize=False, routed_scaling_factor=2.5)
    logits = torch.tensor([[3.0, 1.0, 1.0, 0.0, -1.0, -2.0, -3.0, -4.0]])
    other = torch.tensor([[0, 2]], dtype=torch.int32)
    right = torch.sigmoid(logits)[:, [0, 2]] * 2.5
    assert check_routing(right, other, cfg, logits=logits) == []
    bad = check_routing(torch.tensor([[123.0, 0.0]]), other, cfg, logits=logits)
    assert [(v.what, v.column) for v in bad] == [("weight value", 0), ("weight value", 1)]
    renormed = RouterConfig(8, 2, scoring="sigmoid", routed_scaling_factor=2.5)
    s = torch.sigmoid(logits)[:, [0, 2]]
    assert check_routing(s / s.sum() * 2.5, other, renormed, logits=logits) == []
    assert "weight value" in {v.what for v in check_routing(s * 2.5, other, renormed, logits=logits)}
    flipped = check_routing(right.flip(1), other.flip(1), cfg, logits=logits)  # [2, 0]: columns out of key order
    assert [(v.what, v.column) for v in flipped] == [("column order", 1)]
    # Zero fill: groups 0 and 1 kept, so experts 4-7 all key 0.0, above the kept ones' negative logits.
    zero = RouterConfig(8, 3, scoring="sigmoid", selection="logits", n_group=4, topk_group=2, group_score="max",
                        group_fill="zero", renormalize=False)
    logits = torch.tensor([[-1.0, -2.0, -1.5, -2.5, -3.0, -4.0, -5.0, -6.0]])
    assert route(logits, zero, backend="reference").ids.tolist() == [[4, 5, 6]]
    for ids in ([4, 5, 7], [7, 6, 4]):
        assert check_routing(torch.sigmoid(logits)[:, ids], torch.tensor([ids], dtype=torch.int32), zero,
                             logits=logits) == []
    assert {v.what for v in check_routing(torch.sigmoid(logits)[:, [4, 5, 0]], torch.tensor([[4, 5, 0]],
            dtype=torch.int32), zero, logits=logits)} == {"selection"}


def test_checker_refuses_arguments_that_do_not_fit():
    """Arguments route() refuses are refused here too (not reported as violations of correct output)."""
    cfg = RouterConfig(8, 2, scoring="sigmoid", has_expert_scale=True)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))
    scale = torch.rand(8, generator=torch.Generator().manual_seed(4)) + 0.5
    w, ids = route(x, cfg, expert_scale=scale, backend="reference")
    assert check_routing(w, ids, cfg, logits=x, expert_scale=scale) == []
    assert check_routing(w, ids, cfg) == []  # without logits: the scale multiplies after the norm, sum unchecked
    with pytest.raises(ValueError, match="expert_scale"):
        check_routing(w, ids, cfg, logits=x)
    two = ExpertLayout(shared_slots="per_rank", ep_size=2)
    with pytest.raises(ValueError, match="home_rank"):
        check_routing(w, ids, cfg.replace(num_shared_experts=1), two, home_rank=5)
    other = ExpertLayout(placement=ExpertPlacement(tuple(range(6)), 6))
    with pytest.raises(ValueError, match="placement covers num_experts=6"):
        check_routing(w, ids, cfg, other)


def test_checker_flags_each_kind_without_logits():
    """Every invariant check_routing holds without logits, each on one corruption of correct output (and the
    selection and hash checks with them): a checker that lets one of these through lets a real bug through."""
    cfg = RouterConfig(8, 2, scoring="sigmoid", num_shared_experts=1)
    x = torch.tensor([[0.0, 3.0, 1.0, 2.0, -1.0, 0.5, -2.0, 2.5]] * 4)

    def what(w, ids, layout, config=cfg, **kw):
        return {v.what for v in check_routing(w, ids, config, layout, **kw)}

    per_rank = ExpertLayout(shared_slots="per_rank", ep_size=2)  # L = 4: rank 0 owns slots 0-3 and shared 4
    w, ids = route(x, cfg, per_rank, num_valid_tokens=3, backend="reference")
    assert what(w, ids, per_rank, num_valid_tokens=3) == set()
    bad = ids.clone()
    bad[0, 1] = 4  # rank 0's shared slot in a routed column
    assert "routed slot" in what(w, bad, per_rank, num_valid_tokens=3)
    bad = ids.clone()
    bad[0, 0] = per_rank.id_space(8, 1)  # one past the id space (10)
    assert "id range" in what(w, bad, per_rank, num_valid_tokens=3)
    bad_w = w.clone()
    bad_w[3, 2] = 0.5  # a padded row (ids all -1) with a weight
    assert what(bad_w, ids, per_rank, num_valid_tokens=3) == {"padding"}
    glob = ExpertLayout(shared_slots="global")  # P = 8: the shared column is id 8
    w, ids = route(x, cfg, glob, backend="reference")
    bad = ids.clone()
    bad[1, 0] = 8
    assert "routed slot" in what(w, bad, glob)
    assert "routed slot" in what(w, bad, glob, logits=x)
    bad = ids.clone()
    bad[1, 1] = bad[1, 0]  # an expert twice
    assert "distinct" in what(w, bad, glob)
    zero = ids.clone()
    zero[2, :2] = 0  # expert 0 twice
    assert "distinct" in what(w, zero, glob)
    signed = w.clone()
    signed[2, 0], signed[2, 1] = 1.5, -0.5  # sums to 1, one weight negative
    assert "weight" in what(signed, ids, glob)
    twice = w.clone()
    twice[:, :2] *= 2.0  # a scale applied twice: the routed sum is 2
    assert "renormalize" in what(twice, ids, glob)
    last = ids.clone()
    last[0, 1] = 6  # only the last routed expert wrong (the reference's second is 7, key 2.5; 6 has -2)
    assert "selection" in what(w, last, glob, logits=x)

    hashed = RouterConfig(8, 2, scoring="sigmoid", routing="hash")
    table = torch.tensor([[3, 0], [1, 2], [5, 6]])
    tids = torch.tensor([2, 0, 1, 2])
    w, ids = route(x, hashed, token_ids=tids, hash_table=table, backend="reference")
    kw = dict(config=hashed, hash_table=table)
    assert what(w, ids, ExpertLayout(), token_ids=tids, **kw) == set()
    flipped = ids.flip(1).contiguous(), w.flip(1).contiguous()
    assert "hash ids" in what(flipped[1], flipped[0], ExpertLayout(), token_ids=tids, **kw)
    assert "hash ids" in what(flipped[1], flipped[0], ExpertLayout(), token_ids=tids, logits=x, **kw)
    outside = torch.tensor([2, 0, 3, 2])  # token id 3: the table has 3 rows
    assert "hash ids" in what(w, ids, ExpertLayout(), token_ids=outside, **kw)
