"""Hand-computed cases for every step of docs/contract.md's pipeline, on the reference router."""

import math

import pytest
import torch

from moegate import ExpertLayout, ExpertPlacement, RouterConfig, RoutingRecorder, check_routing, route

NAN, INF = float("nan"), float("inf")


def r(logits, config, layout=None, **kw):
    return route(torch.tensor(logits, dtype=torch.float32), config, layout, backend="reference", **kw)


def test_softmax_topk_renormalize_by_hand():
    cfg = RouterConfig(num_experts=4, top_k=2, scoring="softmax", renormalize=True, renorm_eps=0.0)
    w, ids = r([[0.0, 1.0, 2.0, 3.0]], cfg)
    assert ids.tolist() == [[3, 2]]
    e3, e2 = math.exp(3.0), math.exp(2.0)
    assert w[0].tolist() == pytest.approx([e3 / (e3 + e2), e2 / (e3 + e2)], rel=1e-6)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32


def test_softmax_without_renormalize_keeps_full_softmax_weights():
    cfg = RouterConfig(num_experts=3, top_k=1, scoring="softmax", renormalize=False)
    w, ids = r([[1.0, 0.0, 0.0]], cfg)
    assert ids.tolist() == [[0]]
    assert float(w[0, 0]) == pytest.approx(math.e / (math.e + 2), rel=1e-6)


def test_sigmoid_weights_are_raw_scores_times_rsf():
    cfg = RouterConfig(num_experts=3, top_k=2, scoring="sigmoid", renormalize=False, routed_scaling_factor=2.5)
    w, ids = r([[0.5, -1.0, 2.0]], cfg)
    assert ids.tolist() == [[2, 0]]
    sig = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731
    assert w[0].tolist() == pytest.approx([2.5 * sig(2.0), 2.5 * sig(0.5)], rel=1e-6)


def test_sqrtsoftplus_both_branches():
    cfg = RouterConfig(num_experts=2, top_k=2, scoring="sqrtsoftplus", renormalize=False)
    w, ids = r([[30.0, 0.0]], cfg)
    assert ids.tolist() == [[0, 1]]
    assert w[0].tolist() == pytest.approx([math.sqrt(30.0), math.sqrt(math.log(2.0))], rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_exponentials_below_the_normal_range_are_zero(dtype):
    """Step 2: exp results below 2**-126 are 0 (what the GPU's flush-to-zero math computes). Softmax experts more
    than ~87.34 below the row max and sqrt-softplus logits below ~-87.34 score 0 and tie (lower ids first); just
    above the bound they score; sigmoid's tiny scores come from a division, not a small exp, and stay subnormal."""
    from moegate.reference import scores_and_keys

    x = torch.tensor([[-100.0, -90.0, -87.5, -87.2, -80.0, 0.0]])
    s, _ = scores_and_keys(x, RouterConfig(6, 2), None, dtype)
    assert s[0, :3].tolist() == [0.0, 0.0, 0.0] and (s[0, 3:] > 0).all()
    s, _ = scores_and_keys(x, RouterConfig(6, 2, scoring="sqrtsoftplus"), None, dtype)
    assert s[0, :3].tolist() == [0.0, 0.0, 0.0] and float(s[0, 3]) == pytest.approx(math.exp(-87.2 / 2), rel=1e-6)
    s, _ = scores_and_keys(torch.tensor([[-88.5, -88.0, -87.5]]), RouterConfig(3, 2, scoring="sigmoid"), None, dtype)
    assert 0.0 < float(s[0, 0]) < float(s[0, 1]) < float(s[0, 2]) < 2.0**-126  # subnormal, ordered
    # K beyond the scoring experts: the flushed ones tie and go by id, not by their subnormal values.
    cfg = RouterConfig(6, 5, scoring="sqrtsoftplus", renormalize=False)
    w, ids = r([[-90.0, -100.0, -87.5, -87.2, -80.0, -88.0]], cfg)
    assert ids.tolist() == [[4, 3, 0, 1, 2]] and w[0, 2:].tolist() == [0.0, 0.0, 0.0]


def test_logit_scale_then_softcap():
    cfg = RouterConfig(num_experts=2, top_k=2, scoring="sigmoid", renormalize=False, logit_scale=2.0, softcap=1.5)
    w, _ = r([[1.0, -3.0]], cfg)
    x = [1.5 * math.tanh(2.0 / 1.5), 1.5 * math.tanh(-6.0 / 1.5)]
    assert w[0].tolist() == pytest.approx([1 / (1 + math.exp(-v)) for v in x], rel=1e-6)


def test_bias_changes_selection_but_not_weights():
    cfg = RouterConfig(num_experts=4, top_k=2, scoring="sigmoid", has_correction_bias=True, renormalize=False)
    bias = torch.tensor([0.0, 0.0, 0.0, 10.0])
    w, ids = r([[3.0, 2.0, 1.0, -1.0]], cfg, bias=bias)
    assert ids.tolist() == [[3, 0]]
    assert w[0].tolist() == pytest.approx([1 / (1 + math.exp(1.0)), 1 / (1 + math.exp(-3.0))], rel=1e-6)


def test_selection_on_logits_with_bias_then_sigmoid():
    # Kolibri-style: key = logits + bias, weight = sigmoid(logit).
    cfg = RouterConfig(num_experts=3, top_k=1, scoring="sigmoid", selection="logits", has_correction_bias=True,
                       renormalize=False)
    w, ids = r([[1.0, 0.5, 0.0]], cfg, bias=torch.tensor([0.0, 0.6, 0.0]))
    assert ids.tolist() == [[1]]
    assert float(w[0, 0]) == pytest.approx(1 / (1 + math.exp(-0.5)), rel=1e-6)


def test_ties_go_to_lower_id_and_columns_descend():
    cfg = RouterConfig(num_experts=6, top_k=3, scoring="sigmoid", renormalize=False)
    _, ids = r([[1.0, 2.0, 2.0, 0.0, 2.0, 1.0]], cfg)
    assert ids.tolist() == [[1, 2, 4]]
    _, ids = r([[5.0, 1.0, 2.0, 1.0, 0.0, 1.0]], cfg)
    assert ids.tolist() == [[0, 2, 1]]


def test_all_equal_logits_pick_lowest_ids():
    cfg = RouterConfig(num_experts=8, top_k=3, scoring="softmax", renorm_eps=0.0)
    w, ids = r([[0.25] * 8], cfg)
    assert ids.tolist() == [[0, 1, 2]]
    assert w[0].tolist() == pytest.approx([1 / 3] * 3, rel=1e-6)


def test_nan_logit_is_minus_inf_and_does_not_disturb_softmax():
    cfg = RouterConfig(num_experts=4, top_k=2, scoring="softmax", renormalize=False)
    w, ids = r([[NAN, 1.0, 0.0, NAN]], cfg)
    assert ids.tolist() == [[1, 2]]
    assert w[0].tolist() == pytest.approx([math.e / (math.e + 1), 1 / (math.e + 1)], rel=1e-6)
    # K reaches into the NaN experts: they come last, lower id first, with weight 0.
    cfg4 = RouterConfig(num_experts=4, top_k=4, scoring="sigmoid", renormalize=False)
    w, ids = r([[NAN, 1.0, -INF, NAN]], cfg4)
    assert ids.tolist() == [[1, 0, 2, 3]]
    assert w[0, 1:].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid", "sqrtsoftplus"])
def test_checker_checks_only_the_ids_of_rows_outside_the_domain(scoring):
    """+inf logits (after step 1) are outside the domain: ids stay K distinct valid experts, weights and the choice
    among experts are unspecified. check_routing checks such a row's ids only (the reference's own NaN weights
    there, or another router's other choice, are no violation); a softcap brings +inf inside (to c)."""
    cfg = RouterConfig(8, 2, scoring=scoring, num_shared_experts=1)
    layout = ExpertLayout(shared_slots="global")
    logits = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    logits[1, 3] = logits[1, 5] = INF
    w, ids = route(logits, cfg, layout, backend="reference")
    assert check_routing(w, ids, cfg, layout, logits=logits) == []
    other_w, other_ids = w.clone(), ids.clone()
    other_ids[1, :2] = torch.tensor([0, 1])  # another choice, with NaN routed weights
    other_w[1, :2] = NAN
    assert check_routing(other_w, other_ids, cfg, layout, logits=logits) == []
    for col, value, what in ((1, 0, "distinct"), (0, 99, "id range"), (2, 0, "shared id")):
        bad = other_ids.clone()
        bad[1, col] = value
        assert {v.what for v in check_routing(other_w, bad, cfg, layout, logits=logits) if v.row == 1} == {what}
    for value, whats in ((0.5, {"shared weight"}), (NAN, {"weight"})):  # shared weights do not depend on logits
        bad_w = other_w.clone()
        bad_w[1, 2] = value
        assert {v.what for v in check_routing(bad_w, other_ids, cfg, layout, logits=logits) if v.row == 1} == whats
    wrong = w.clone()
    wrong[2, 0] += 0.25  # a row inside the domain is checked as ever
    assert any(v.row == 2 for v in check_routing(wrong, ids, cfg, layout, logits=logits))
    capped = cfg.replace(softcap=5.0)  # +inf -> 5.0: inside the domain, the reference's choice is checked
    cw, cids = route(logits, capped, layout, backend="reference")
    assert check_routing(cw, cids, capped, layout, logits=logits) == []
    swapped = cids.clone()
    swapped[1, :2] = torch.tensor([0, 1])
    assert any(v.row == 1 for v in check_routing(cw, swapped, capped, layout, logits=logits))
    with pytest.raises(ValueError, match="logits has 3 rows"):
        check_routing(w, ids, cfg, layout, logits=logits[:3])
    hashed = RouterConfig(8, 2, routing="hash")
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    hw, hids = route(logits, hashed, token_ids=torch.tensor([0, 1, 0, 1]), hash_table=table, backend="reference")
    with pytest.raises(ValueError, match="token_ids has 3 rows"):
        check_routing(hw, hids, hashed, token_ids=torch.tensor([0, 1, 0]), hash_table=table)


def test_nan_key_loses_even_with_a_large_bias():
    cfg = RouterConfig(num_experts=3, top_k=1, scoring="sigmoid", has_correction_bias=True, renormalize=False)
    _, ids = r([[NAN, -5.0, -6.0]], cfg, bias=torch.tensor([100.0, 0.0, 0.0]))
    assert ids.tolist() == [[1]]


def test_all_nan_row_gives_distinct_ids_and_zero_weights():
    cfg = RouterConfig(num_experts=5, top_k=3, scoring="softmax", renormalize=True)
    w, ids = r([[NAN] * 5], cfg)
    assert ids.tolist() == [[0, 1, 2]]
    assert w.tolist() == [[0.0, 0.0, 0.0]]


def test_k_equals_e_returns_every_expert_sorted():
    cfg = RouterConfig(num_experts=5, top_k=5, scoring="softmax", renorm_eps=0.0)
    w, ids = r([[0.1, 0.5, -0.2, 0.3, 0.0]], cfg)
    assert ids.tolist() == [[1, 3, 0, 4, 2]]
    assert float(w.sum()) == pytest.approx(1.0, abs=1e-6)


def test_groups_top2_sum_exclude():
    # 8 experts in 4 groups of 2; group scores (top2 sums): g0=0.3, g1=1.1, g2=0.2, g3=1.0; keep 2 -> g1, g3.
    cfg = RouterConfig(num_experts=8, top_k=3, scoring="sigmoid", selection="logits", n_group=4, topk_group=2,
                       renormalize=False)
    logits = [[0.2, 0.1, 0.6, 0.5, 0.15, 0.05, 0.9, 0.1]]
    _, ids = r(logits, cfg)
    assert ids.tolist() == [[6, 2, 3]]


def test_groups_max_score():
    cfg = RouterConfig(num_experts=8, top_k=2, scoring="sigmoid", selection="logits", n_group=4, topk_group=1,
                       group_score="max", renormalize=False)
    _, ids = r([[0.2, 0.1, 0.6, 0.5, 0.7, -5.0, 0.3, 0.1]], cfg)
    assert ids.tolist() == [[4, 5]]  # one group kept: group 2 (max 0.7), both its experts


def test_one_group_kept_restricts_selection_to_it():
    cfg = RouterConfig(num_experts=6, top_k=2, scoring="softmax", n_group=3, topk_group=1, renorm_eps=0.0)
    _, ids = r([[0.0, 0.0, 3.0, -9.0, 2.5, 2.4]], cfg)
    # top2 sums: g0=0, g1=-6, g2=4.9 -> only group 2
    assert ids.tolist() == [[4, 5]]


def test_group_ties_go_to_lower_group():
    cfg = RouterConfig(num_experts=4, top_k=2, scoring="sigmoid", selection="logits", n_group=2, topk_group=1,
                       renormalize=False)
    _, ids = r([[1.0, 0.0, 0.0, 1.0]], cfg)
    assert ids.tolist() == [[0, 1]]


def test_group_fill_zero_lets_dropped_experts_compete_with_negative_keys():
    # Sigmoid + a negative bias: kept experts have negative keys, so dropped ones (key 0.0) win.
    cfg = RouterConfig(num_experts=4, top_k=2, scoring="sigmoid", has_correction_bias=True, n_group=2,
                       topk_group=1, group_fill="zero", renormalize=False)
    bias = torch.tensor([-2.0, -2.0, -3.0, -3.0])
    w, ids = r([[0.0, 0.0, 0.0, 0.0]], cfg, bias=bias)
    # keys: -1.5, -1.5 (kept group 0), dropped group 1 -> 0.0, 0.0
    assert ids.tolist() == [[2, 3]]
    assert w[0].tolist() == pytest.approx([0.5, 0.5])
    cfg_ex = cfg.replace(group_fill="exclude")
    _, ids = r([[0.0, 0.0, 0.0, 0.0]], cfg_ex, bias=bias)
    assert ids.tolist() == [[0, 1]]


def test_zero_fill_keeps_dead_experts_below_every_key():
    # Group 0 kept (max -1); group 1 dropped: its live experts' keys become 0.0 and win, its NaN stays -inf.
    cfg = RouterConfig(num_experts=8, top_k=3, scoring="sigmoid", selection="logits", n_group=2, topk_group=1,
                       group_score="max", group_fill="zero", renormalize=False)
    _, ids = r([[-1.0, -2.0, -3.0, -4.0, NAN, -9.0, -9.0, -9.0]], cfg)
    assert ids.tolist() == [[5, 6, 7]]


def test_exclude_never_selects_dropped_groups_even_below_minus_inf():
    cfg = RouterConfig(num_experts=6, top_k=3, scoring="sigmoid", n_group=2, topk_group=1, renormalize=False)
    # Group 1 wins on its top-2 sum; its third expert is NaN (key -inf), yet it beats the dropped group 0.
    _, ids = r([[-9.0, -9.0, -9.0, 5.0, 4.0, NAN]], cfg)
    assert ids.tolist() == [[3, 4, 5]]
    _, ids = r([[NAN] * 6], cfg)
    assert ids.tolist() == [[0, 1, 2]]


def test_renorm_eps_add_and_clamp_and_p_norm():
    base = RouterConfig(num_experts=3, top_k=2, scoring="sigmoid", renormalize=True, renorm_eps=0.5)
    w, _ = r([[0.0, 0.0, -9.0]], base)
    assert w[0].tolist() == pytest.approx([0.5 / 1.5, 0.5 / 1.5], rel=1e-6)
    w, _ = r([[0.0, 0.0, -9.0]], base.replace(renorm_eps_mode="clamp", renorm_eps=2.0))
    assert w[0].tolist() == pytest.approx([0.25, 0.25], rel=1e-6)
    w, _ = r([[0.0, 0.0, -9.0]], base.replace(renorm_eps=0.0, renorm_p=2.0))
    assert w[0].tolist() == pytest.approx([1 / math.sqrt(2)] * 2, rel=1e-6)


def test_expert_scale_after_renormalize_before_rsf():
    cfg = RouterConfig(num_experts=3, top_k=2, scoring="softmax", renorm_eps=0.0, has_expert_scale=True,
                       routed_scaling_factor=2.0)
    w, ids = r([[0.0, 0.0, -50.0]], cfg, expert_scale=torch.tensor([3.0, 5.0, 7.0]))
    assert ids.tolist() == [[0, 1]]
    assert w[0].tolist() == pytest.approx([0.5 * 3 * 2, 0.5 * 5 * 2], rel=1e-6)


def test_zero_experts_compete_and_keep_their_ids():
    cfg = RouterConfig(num_experts=2, top_k=2, num_zero_experts=2, scoring="softmax", renormalize=False)
    w, ids = r([[0.0, 1.0, 3.0, -1.0]], cfg)
    assert ids.tolist() == [[2, 1]]
    # The softmax runs over all E + zero experts (LongCat-Flash scores them together): weights by hand, which
    # check_routing (the reference's own scores) could not tell from a softmax over the E alone (a mutation review).
    e = [math.exp(v - 3.0) for v in (0.0, 1.0, 3.0, -1.0)]
    assert w[0].tolist() == pytest.approx([e[2] / sum(e), e[1] / sum(e)], rel=1e-6)
    assert check_routing(w, ids, cfg) == []


def test_rsf_applied_once_in_weights_or_not_at_all_on_output():
    cfg = RouterConfig(num_experts=4, top_k=2, scoring="sigmoid", renormalize=True, renorm_eps=0.0,
                       routed_scaling_factor=2.5, num_shared_experts=1)
    logits = [[1.0, 2.0, 3.0, 0.0]]
    w_in, _ = r(logits, cfg, ExpertLayout(shared_slots="global"))
    w_out, _ = r(logits, cfg, ExpertLayout(shared_slots="global", scale="on_output"))
    assert float(w_in[0, :2].sum()) == pytest.approx(2.5, rel=1e-6)
    assert float(w_out[0, :2].sum()) == pytest.approx(1.0, rel=1e-6)
    assert float(w_in[0, 2]) == 1.0
    assert float(w_out[0, 2]) == pytest.approx(1 / 2.5, rel=1e-7)


def test_shared_expert_scale_is_the_shared_columns_net_factor():
    # Cohere2-MoE "average": (routed + shared) / 2, i.e. rsf = 1/2 and shared_expert_scale = 1/2.
    cfg = RouterConfig(num_experts=4, top_k=2, renorm_eps=0.0, routed_scaling_factor=0.5, shared_expert_scale=0.5,
                       num_shared_experts=1)
    w, _ = r([[1.0, 2.0, 3.0, 0.0]], cfg, ExpertLayout(shared_slots="global"))
    assert float(w[0, :2].sum()) == pytest.approx(0.5, rel=1e-6) and float(w[0, 2]) == 0.5
    w, _ = r([[1.0, 2.0, 3.0, 0.0]], cfg, ExpertLayout(shared_slots="per_rank", scale="on_output"))
    assert float(w[0, :2].sum()) == pytest.approx(1.0, rel=1e-6) and float(w[0, 2]) == 1.0
    with pytest.raises(ValueError, match="shared_expert_scale"):
        cfg.replace(shared_expert_scale=0.0)


def test_global_shared_ids_follow_physical_slots():
    cfg = RouterConfig(num_experts=4, top_k=2, num_shared_experts=2)
    w, ids = r([[0.0, 1.0, 2.0, 3.0]], cfg, ExpertLayout(shared_slots="global"))
    assert ids.tolist() == [[3, 2, 4, 5]]
    placement = ExpertPlacement((0, 1, 2, 3, 3, 2), num_experts=4)
    _, ids = r([[0.0, 1.0, 2.0, 3.0]], cfg, ExpertLayout(shared_slots="global", placement=placement,
                                                        replica_policy="first"))
    assert ids.tolist() == [[3, 2, 6, 7]]


def test_per_rank_ids_by_hand():
    # E=8, EP=2 -> L=4, S=1: rank r owns [5r, 5r+5): 4 routed slots then 1 shared.
    cfg = RouterConfig(num_experts=8, top_k=2, num_shared_experts=1)
    layout = ExpertLayout(shared_slots="per_rank", ep_size=2)
    _, ids = r([[0, 0, 0, 9.0, 0, 0, 0, 8.0]], cfg, layout, home_rank=1)
    assert ids.tolist() == [[3, 8, 9]]  # 3 -> 3, 7 -> 7 + 1, shared of rank 1 -> 1*5 + 4


def test_replica_policies():
    # E=2, P=4 on 2 ranks: slots [0, 1 | 0, 1]; expert 0 lives at slots 0 and 2.
    placement = ExpertPlacement((0, 1, 0, 1), num_experts=2)
    cfg = RouterConfig(num_experts=2, top_k=1)
    logits = [[1.0, 0.0]] * 3
    _, ids = r(logits, cfg, ExpertLayout(ep_size=2, placement=placement))
    assert ids.flatten().tolist() == [0, 2, 0]  # round robin over the token index
    _, ids = r(logits, cfg, ExpertLayout(ep_size=2, placement=placement, replica_policy="home_rank"), home_rank=1)
    assert ids.flatten().tolist() == [2, 2, 2]
    _, ids = r(logits, cfg, ExpertLayout(ep_size=2, placement=placement, replica_policy="first"))
    assert ids.flatten().tolist() == [0, 0, 0]


def test_home_rank_policy_takes_the_first_home_replica_else_round_robin():
    # E=2, P=6 on 3 ranks: slots [0, 1 | 0, 0 | 1, 1]; expert 0 at slots 0, 2, 3 (two on rank 1), expert 1 at 1, 4, 5.
    placement = ExpertPlacement((0, 1, 0, 0, 1, 1), num_experts=2)
    cfg = RouterConfig(num_experts=2, top_k=1)
    layout = ExpertLayout(ep_size=3, placement=placement, replica_policy="home_rank")
    _, ids = r([[1.0, 0.0]] * 4, cfg, layout, home_rank=1)
    assert ids.flatten().tolist() == [2, 2, 2, 2]  # the lower of rank 1's two replicas
    _, ids = r([[0.0, 1.0]] * 4, cfg, layout, home_rank=1)  # rank 1 holds no replica of expert 1
    assert ids.flatten().tolist() == [1, 4, 5, 1]  # round robin over its replicas by token, as without the policy


def test_padding_int_and_device_tensor():
    cfg = RouterConfig(num_experts=4, top_k=2, num_shared_experts=1)
    layout = ExpertLayout(shared_slots="global")
    logits = torch.randn(5, 4)
    for nvt in (3, torch.tensor([3], dtype=torch.int32), torch.tensor(3)):
        w, ids = route(logits, cfg, layout, num_valid_tokens=nvt, backend="reference")
        assert (ids[3:] == -1).all() and (w[3:] == 0).all()
        assert (ids[:3] >= 0).all()


def test_hash_routing_keeps_table_order_and_weights_from_scores():
    cfg = RouterConfig(num_experts=4, top_k=2, scoring="sigmoid", routing="hash", renormalize=False)
    table = torch.tensor([[3, 0], [1, 2]])
    w, ids = r([[0.0, 1.0, 2.0, 3.0], [0.0, 1.0, 2.0, 3.0]], cfg, token_ids=torch.tensor([1, 0]), hash_table=table)
    assert ids.tolist() == [[1, 2], [3, 0]]
    sig = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731
    assert w[1].tolist() == pytest.approx([sig(3.0), sig(0.0)], rel=1e-6)


def test_hash_rows_outside_the_table_are_padding_in_the_reference():
    """What a GPU router does with token ids route() cannot check without a sync (the reference called directly, as
    the kernel tests call it): ids -1 and weights 0 for a token id of -1 or vocab and past, never an index error."""
    from moegate.reference import route_reference

    cfg = RouterConfig(num_experts=4, top_k=2, scoring="sigmoid", routing="hash")
    table = torch.tensor([[3, 0], [1, 2]])
    w, ids = route_reference(torch.zeros(4, 4), cfg, ExpertLayout(), token_ids=torch.tensor([1, 2, -1, 0]),
                             hash_table=table)
    assert ids.tolist() == [[1, 2], [-1, -1], [-1, -1], [3, 0]]
    assert (w[1:3] == 0).all() and (w[[0, 3]] > 0).all()


def test_capture_records_logical_routed_ids_only():
    cfg = RouterConfig(num_experts=8, top_k=2, num_shared_experts=1)
    placement = ExpertPlacement(tuple(range(8))[::-1], num_experts=8)
    layout = ExpertLayout(shared_slots="per_rank", ep_size=2, placement=placement)
    rec = RoutingRecorder(num_layers=2, max_tokens=4, top_k=2, num_experts=8)
    logits = torch.tensor([[0, 0, 0, 9.0, 0, 0, 0, 8.0], [9.0, 8.0, 0, 0, 0, 0, 0, 0], [0.0] * 8])
    _, ids = route(logits, cfg, layout, recorder=rec, layer=1, num_valid_tokens=2, backend="reference")
    assert rec.layer_ids(1).tolist() == [[3, 7], [0, 1], [-1, -1]]
    assert int(rec.num_tokens[0]) == -1
    assert ids[0, :2].tolist() != [3, 7]  # what the layout sees is physical; the capture is logical


def test_reference_float64_mode_matches_fp32():
    cfg = RouterConfig(num_experts=64, top_k=6, scoring="sigmoid", has_correction_bias=True, n_group=8,
                       topk_group=3, routed_scaling_factor=2.5)
    g = torch.Generator().manual_seed(0)
    logits = torch.stack([torch.randperm(64, generator=g) / 32.0 for _ in range(17)])
    bias = torch.randn(64, generator=g) * 0.01
    from moegate.reference import route_reference

    w32, ids32 = route_reference(logits, cfg, bias=bias)
    w64, ids64 = route_reference(logits, cfg, bias=bias, dtype=torch.float64)
    assert torch.equal(ids32, ids64)
    assert w64.dtype == torch.float64
    torch.testing.assert_close(w32.double(), w64, rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs_are_computed_in_fp32(dtype):
    cfg = RouterConfig(num_experts=32, top_k=4, scoring="softmax")
    logits = (torch.randperm(32) / 32.0).unsqueeze(0).to(dtype)
    w, ids = route(logits, cfg, backend="reference")
    w32, ids32 = route(logits.float(), cfg, backend="reference")
    assert torch.equal(ids, ids32) and torch.equal(w, w32)


def test_strided_logits():
    cfg = RouterConfig(num_experts=16, top_k=4, scoring="sigmoid")
    big = torch.randn(10, 40)
    view = big[::2, 3:19]
    assert not view.is_contiguous()
    w, ids = route(view, cfg, backend="reference")
    w2, ids2 = route(view.contiguous(), cfg, backend="reference")
    assert torch.equal(ids, ids2) and torch.equal(w, w2)


def test_out_buffers_are_written_in_place():
    cfg = RouterConfig(num_experts=8, top_k=2, num_shared_experts=1)
    layout = ExpertLayout(shared_slots="global")
    out = (torch.full((3, 3), float("nan")), torch.full((3, 3), -7, dtype=torch.int32))
    w, ids = route(torch.randn(3, 8), cfg, layout, out=out, backend="reference")
    assert w.data_ptr() == out[0].data_ptr() and ids.data_ptr() == out[1].data_ptr()
    assert not torch.isnan(w).any() and (ids >= 0).all()


def test_empty_batch():
    cfg = RouterConfig(num_experts=8, top_k=2, num_shared_experts=2)
    w, ids = route(torch.randn(0, 8), cfg, ExpertLayout(shared_slots="per_rank", ep_size=2), backend="reference")
    assert w.shape == (0, 4) and ids.shape == (0, 4)


def test_checker_review_groups_replicas_zero_fill_and_arguments():
    """A review of check_routing (2026-12-04): an expert of a dropped group passed where its key tied a kept expert's
    (a dead one too); a router that kept a group tied with the reference's last one was reported; a zero-filled
    expert's tolerance came from its own logit's size; the replica of the right expert on the wrong rank passed;
    float ids and token ids were truncated; bad arguments crashed without naming themselves."""
    nan = float("nan")
    cfg = RouterConfig(8, 3, scoring="sigmoid", n_group=2, topk_group=1, group_score="max", renormalize=False)
    x = torch.tensor([[3.0, nan, nan, nan, 0.5, nan, -1.0, -2.0]])
    w, ids = route(x, cfg, backend="reference")
    assert ids.tolist() == [[0, 1, 2]] and check_routing(w, ids, cfg, logits=x) == []
    bad = torch.tensor([[0, 1, 5]], dtype=torch.int32)  # 5: a dead expert of the dropped group
    assert [v.what for v in check_routing(w, bad, cfg, logits=x)] == ["group"]
    cfg2 = RouterConfig(8, 1, scoring="sigmoid", n_group=4, topk_group=1, renormalize=False)
    x2 = torch.tensor([[2.0, 2.0, 2.0, -3.0, -5, -5, -5, -5]])
    w2, _ = route(x2, cfg2, backend="reference")
    assert [v.what for v in check_routing(w2, torch.tensor([[2]], dtype=torch.int32), cfg2, logits=x2)] == ["group"]
    # A group tied with the reference's kept one (1 ulp, and exactly) may be kept instead.
    for second in (0.9999999, 1.0):
        x3 = torch.tensor([[1.0, -3, -3, -3, second, 0.5, -3, -3]])
        other = torch.tensor([[4, 5]], dtype=torch.int32)
        assert check_routing(torch.sigmoid(x3)[:, [4, 5]], other, cfg.replace(top_k=2), logits=x3) == []
        wrong_w = torch.sigmoid(x3)[:, [4, 5]] * 1.01  # its weights still checked
        assert {v.what for v in check_routing(wrong_w, other, cfg.replace(top_k=2), logits=x3)} == {"weight value"}
    # Zero fill: a dropped expert's key is 0.0 exactly, whatever its logit.
    zcfg = RouterConfig(4, 2, scoring="sigmoid", selection="logits", n_group=2, topk_group=1, group_score="max",
                        group_fill="zero", renormalize=False)
    xz = torch.tensor([[0.005, -1000.0, -1000.0, -2000.0]])
    assert route(xz, zcfg, backend="reference").ids.tolist() == [[0, 2]]
    zw = torch.sigmoid(xz)[:, [2, 3]]
    assert "selection" in {v.what for v in check_routing(zw, torch.tensor([[2, 3]], dtype=torch.int32), zcfg,
                                                         logits=xz)}
    # The replica policy decides the slot.
    pl = ExpertPlacement((0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3), 8)
    xr = torch.tensor([[5.0, 4.0, 0, 0, 0, 0, 0, 0]])
    for policy in ("first", "home_rank"):
        lay = ExpertLayout(ep_size=2, placement=pl, replica_policy=policy)
        rw, rids = route(xr, RouterConfig(8, 2, scoring="sigmoid"), lay, home_rank=0, backend="reference")
        assert rids.tolist() == [[0, 1]]
        wrong = torch.tensor([[8, 1]], dtype=torch.int32)  # expert 0's replica on rank 1
        for kw in ({}, {"logits": xr}):
            got = check_routing(rw, wrong, RouterConfig(8, 2, scoring="sigmoid"), lay, home_rank=0, **kw)
            assert [v.what for v in got] == ["replica"], (policy, kw)
    # Arguments.
    with pytest.raises(TypeError, match="ids must be an integer"):
        check_routing(w, ids.float() + 0.9, cfg, logits=x)
    with pytest.raises(TypeError, match="weights must be a floating"):
        check_routing(ids, ids, cfg)
    with pytest.raises(TypeError, match="config must be a RouterConfig"):
        check_routing(w, ids, None)
    with pytest.raises(TypeError, match="weights must be a tensor"):
        check_routing(w.numpy(), ids, cfg)
    with pytest.raises(ValueError, match="rtol"):
        check_routing(w, ids, cfg, rtol=float("nan"))
    h = RouterConfig(8, 2, routing="hash")
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    tid = torch.tensor([0, 1])
    hw, hids = route(torch.randn(2, 8), h, token_ids=tid, hash_table=table, backend="reference")
    assert check_routing(hw, hids, h, token_ids=tid, hash_table=table) == []
    with pytest.raises(TypeError, match="token_ids"):
        check_routing(hw, hids, h, token_ids=tid.float() + 0.9, hash_table=table)
    with pytest.raises(ValueError, match="hash_table"):
        check_routing(hw, hids, h, token_ids=tid, hash_table=table[:, :1])


# A mutation review (2026-12-04): each test below fails under a bug that every test above let through (softmax not
# max-subtracted, logits selection on raw logits, the p-norm's rescaling, the zero-denominator guards; the checker's
# live -1 ids, a shared weight too large, the sum rule without logits, a near-tie tolerance 1000x too loose, weights
# exchanged between columns, more tied groups than topk_group, near-tied sets with scale="on_output").


def test_softmax_is_max_subtracted():
    cfg = RouterConfig(num_experts=3, top_k=2, renorm_eps=0.0)
    w, ids = r([[100.0, 99.0, 0.0]], cfg)
    assert ids.tolist() == [[0, 1]]
    assert w[0].tolist() == pytest.approx([1 / (1 + math.exp(-1)), 1 / (1 + math.e)], rel=1e-6)
    w, _ = r([[100.0, 99.0, 0.0]], cfg.replace(renormalize=False))
    assert torch.isfinite(w).all() and float(w.sum()) == pytest.approx(1.0, rel=1e-6)


def test_selection_on_logits_uses_step1_logits_with_bias():
    cfg = RouterConfig(num_experts=2, top_k=1, scoring="sigmoid", selection="logits", has_correction_bias=True,
                       renormalize=False, logit_scale=2.0)
    bias = torch.tensor([0.0, 1.5])
    _, ids = r([[1.0, 0.0]], cfg, bias=bias)  # keys 2.0 + 0 vs 0 + 1.5 (raw logits would give 1.0 vs 1.5)
    assert ids.tolist() == [[0]]
    capped = RouterConfig(num_experts=2, top_k=1, scoring="sigmoid", selection="logits", has_correction_bias=True,
                          renormalize=False, softcap=1.0)
    _, ids = r([[3.0, 0.0]], capped, bias=torch.tensor([0.0, 1.5]))  # tanh(3) = 0.995 < 1.5 (raw: 3.0 > 1.5)
    assert ids.tolist() == [[1]]


def test_p_norm_of_tiny_weights_does_not_underflow():
    cfg = RouterConfig(num_experts=3, top_k=2, scoring="sigmoid", renorm_eps=0.0, renorm_p=3.0)
    w, _ = r([[-46.0, -46.0, -60.0]], cfg)  # sigmoid ~1e-20: w**3 ~1e-60 underflows fp32
    assert w[0].tolist() == pytest.approx([2 ** (-1 / 3)] * 2, rel=1e-5)
    w, _ = r([[20.0, -69.0, -80.0]], cfg.replace(renorm_p=2.0))  # m must be the largest weight: 1 / 1e-30 overflows
    assert float(w[0, 0]) == pytest.approx(1.0, rel=1e-6) and float(w[0, 1]) == pytest.approx(math.exp(-69), rel=1e-4)


@pytest.mark.parametrize("p", [1.0, 2.0])
def test_all_nan_row_with_zero_eps_has_zero_weights_not_nan(p):
    cfg = RouterConfig(num_experts=4, top_k=2, renorm_eps=0.0, renorm_p=p)
    w, ids = r([[NAN] * 4], cfg)
    assert ids.tolist() == [[0, 1]] and w.tolist() == [[0.0, 0.0]]
    assert check_routing(w, ids, cfg, logits=torch.full((1, 4), NAN)) == []


def test_checker_flags_a_minus_one_in_a_live_row():
    cfg = RouterConfig(8, 2, scoring="sigmoid")
    x = torch.tensor([[0.0, 3.0, 1.0, 2.0, -1.0, 0.5, -2.0, 2.5]])
    w, ids = route(x, cfg, backend="reference")
    bad = ids.clone()
    bad[0, 1] = -1  # a live row written as half padding
    for kw in ({}, {"logits": x}):
        assert "id range" in {v.what for v in check_routing(w, bad, cfg, **kw)}


@pytest.mark.parametrize("value", [0.4, 2.5])
def test_checker_flags_a_shared_weight_too_large_or_too_small(value):
    cfg = RouterConfig(8, 2, scoring="sigmoid", num_shared_experts=1, routed_scaling_factor=2.5)
    layout = ExpertLayout(shared_slots="global")
    x = torch.tensor([[0.0, 3.0, 1.0, 2.0, -1.0, 0.5, -2.0, 2.5]])
    w, ids = route(x, cfg, layout, backend="reference")
    assert float(w[0, 2]) == 1.0
    bad = w.clone()
    bad[0, 2] = value  # 2.5: rsf folded into the shared column too
    assert {v.what for v in check_routing(bad, ids, cfg, layout)} == {"shared weight"}


def test_checker_without_logits_flags_a_short_sum_and_passes_an_all_zero_row():
    cfg = RouterConfig(8, 2, scoring="sigmoid")
    x = torch.tensor([[0.0, 3.0, 1.0, 2.0, -1.0, 0.5, -2.0, 2.5]])
    w, ids = route(x, cfg, backend="reference")
    assert {v.what for v in check_routing(w * 0.87, ids, cfg)} == {"renormalize"}
    nan = torch.full((1, 8), NAN)
    w, ids = route(nan, cfg, backend="reference")
    assert w.tolist() == [[0.0, 0.0]] and check_routing(w, ids, cfg) == []


def test_checker_without_logits_holds_the_sum_to_rsf_in_weights_and_1_on_output():
    cfg = RouterConfig(8, 2, scoring="sigmoid", routed_scaling_factor=2.5)
    x = torch.tensor([[0.0, 3.0, 1.0, 2.0, -1.0, 0.5, -2.0, 2.5]])
    for scale, wrong in (("in_weights", 1 / 2.5), ("on_output", 2.5)):
        layout = ExpertLayout(scale=scale)
        w, ids = route(x, cfg, layout, backend="reference")
        assert check_routing(w, ids, cfg, layout) == []
        assert {v.what for v in check_routing(w * wrong, ids, cfg, layout)} == {"renormalize"}


def test_checker_without_logits_allows_the_eps_shortfall_of_small_raw_sums():
    cfg = RouterConfig(8, 2, scoring="sigmoid", renorm_eps=1e-6)
    x = torch.full((1, 8), -6.9)  # scores ~1e-3: the renormalised sum is 1 - 5e-4, as eps makes it
    w, ids = route(x, cfg, backend="reference")
    assert float(w.sum()) < 1 - 1e-4
    assert check_routing(w, ids, cfg) == [] and check_routing(w, ids, cfg, logits=x) == []


def test_checker_near_ties_are_within_rtol_not_a_percent():
    cfg = RouterConfig(4, 1, scoring="sigmoid", renormalize=False)
    x = torch.tensor([[0.0, 0.01, -3.0, -3.0]])  # keys 0.5 and 0.5025: 0.5% apart, no near-tie at rtol 1e-5
    assert route(x, cfg, backend="reference").ids.tolist() == [[1]]
    got = check_routing(torch.sigmoid(x)[:, :1], torch.tensor([[0]], dtype=torch.int32), cfg, logits=x)
    assert {v.what for v in got} == {"selection"}


def test_checker_compares_each_weight_with_the_reference_not_only_the_sum():
    cfg = RouterConfig(8, 2, scoring="sigmoid")
    x = torch.tensor([[0.0, 3.0, 1.0, 2.0, -1.0, 0.5, -2.0, 2.5]])
    w, ids = route(x, cfg, backend="reference")
    swapped = w[:, [1, 0]]  # the right ids, their weights exchanged: the sum still 1
    assert [(v.what, v.column) for v in check_routing(swapped, ids, cfg, logits=x)] == [
        ("weight value", 0), ("weight value", 1)]


def test_checker_flags_experts_from_more_tied_groups_than_topk_group():
    cfg = RouterConfig(8, 2, scoring="sigmoid", n_group=4, topk_group=1, group_score="max", renormalize=False)
    x = torch.tensor([[2.0, -5.0, 2.0, -5.0, -6.0, -6.0, -6.0, -6.0]])  # groups 0 and 1 tie at max 2.0
    assert route(x, cfg, backend="reference").ids.tolist() == [[0, 1]]
    two = torch.tensor([[0, 2]], dtype=torch.int32)  # one expert of each tied group: two groups kept, not one
    assert {v.what for v in check_routing(torch.sigmoid(x)[:, [0, 2]], two, cfg, logits=x)} == {"group"}


def test_checker_near_tied_set_on_output_is_held_to_unscaled_weights():
    cfg = RouterConfig(8, 2, scoring="sigmoid", renormalize=False, routed_scaling_factor=2.5)
    layout = ExpertLayout(scale="on_output")
    x = torch.tensor([[3.0, 1.0, 1.0, 0.0, -1.0, -2.0, -3.0, -4.0]])  # experts 1 and 2 tie
    other = torch.tensor([[0, 2]], dtype=torch.int32)
    assert check_routing(torch.sigmoid(x)[:, [0, 2]], other, cfg, layout, logits=x) == []
    bad = check_routing(torch.sigmoid(x)[:, [0, 2]] * 2.5, other, cfg, layout, logits=x)
    assert {v.what for v in bad} == {"weight value"}


def test_all_nan_softmax_row_without_renormalize_scores_zero():
    cfg = RouterConfig(num_experts=4, top_k=2, renormalize=False)
    w, ids = r([[NAN] * 4, [NAN, 0.0, NAN, NAN]], cfg)
    assert ids.tolist() == [[0, 1], [1, 0]] and w.tolist() == [[0.0, 0.0], [1.0, 0.0]]


# A mutation review (2026-12-06) found the hand tests above passing with these bugs in the reference: each test
# below fails on the one named.


def test_per_rank_ids_of_every_expert():
    """Per-rank ids p + (p // L) * S for every expert (not only 3 and 7, which p // (L + S) maps alike)."""
    cfg = RouterConfig(num_experts=8, top_k=1, num_shared_experts=1)
    layout = ExpertLayout(shared_slots="per_rank", ep_size=2)
    got = [r([[9.0 if j == e else 0.0 for j in range(8)]], cfg, layout)[1][0, 0].item() for e in range(8)]
    assert got == [0, 1, 2, 3, 5, 6, 7, 8]


def test_group_score_and_fill_where_they_decide():
    """top2_sum against max, exclude against zero, and the zero fill's value: inputs where each choice routes
    differently (the earlier cases kept the same groups under max and top2_sum, and kept keys of -1 or below, so
    any fill above -1 routed alike)."""
    # Group 0's top two sum to 0.95 - 1 < group 1's 0.6 + 0.5, its max 0.95 > 0.6: logits selection keys.
    base = dict(num_experts=4, top_k=1, scoring="sigmoid", selection="logits", n_group=2, topk_group=1)
    logits = [[0.95, -1.0, 0.6, 0.5]]
    assert r(logits, RouterConfig(**base, group_score="top2_sum"))[1].tolist() == [[2]]
    assert r(logits, RouterConfig(**base, group_score="max"))[1].tolist() == [[0]]
    # Kept group 0's keys below 0.0: the zero fill takes a dropped expert at 0.0, exclude keeps to group 0.
    logits = [[-0.1, -3.0, -4.0, -5.0]]
    zero = RouterConfig(**{**base, "group_score": "max"}, group_fill="zero")
    assert r(logits, zero)[1].tolist() == [[2]]  # 0.0 beats -0.1; ties at 0.0 to the lower id
    assert r(logits, RouterConfig(**base, group_score="max"))[1].tolist() == [[0]]
    # A kept key just above 0.0 beats the dropped experts' 0.0.
    assert r([[1e-3, -3.0, -4.0, -5.0]], zero)[1].tolist() == [[0]]


def test_expert_scale_follows_the_expert_not_the_column():
    cfg = RouterConfig(num_experts=4, top_k=2, scoring="softmax", renorm_eps=0.0, has_expert_scale=True)
    w, ids = r([[0.0, -50.0, -50.0, 0.0]], cfg, expert_scale=torch.tensor([3.0, 5.0, 7.0, 11.0]))
    assert ids.tolist() == [[0, 3]]
    assert w[0].tolist() == pytest.approx([0.5 * 3, 0.5 * 11], rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_step_1_arithmetic_of_half_inputs_is_fp32(dtype):
    """Half logits and a half bias are widened before any arithmetic: the logit scale, the softcap and the bias add
    in fp32 (the scale in fp16 moved a weight from 0.764012 to 0.763836)."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(16, 32, generator=g).to(dtype)
    bias = (torch.randn(32, generator=g) * 0.1).to(dtype)
    for cfg in (RouterConfig(num_experts=32, top_k=4, scoring="softmax", logit_scale=3.0),
                RouterConfig(num_experts=32, top_k=4, scoring="softmax", softcap=2.5, logit_scale=1.7),
                RouterConfig(num_experts=32, top_k=4, scoring="sigmoid", has_correction_bias=True, logit_scale=3.0)):
        kw = dict(bias=bias) if cfg.has_correction_bias else {}
        w, ids = route(logits, cfg, backend="reference", **kw)
        kw32 = dict(bias=bias.float()) if cfg.has_correction_bias else {}
        w32, ids32 = route(logits.float(), cfg, backend="reference", **kw32)
        assert torch.equal(ids, ids32) and torch.equal(w, w32), cfg


def test_out_buffers_hold_what_a_call_without_them_returns():
    cfg = RouterConfig(num_experts=8, top_k=3, num_shared_experts=1)
    layout = ExpertLayout(shared_slots="global")
    x = torch.randn(5, 8)
    out = (torch.full((5, 4), float("nan")), torch.full((5, 4), -7, dtype=torch.int32))
    route(x, cfg, layout, out=out, backend="reference")
    want = route(x, cfg, layout, backend="reference")
    assert torch.equal(out[0], want.weights) and torch.equal(out[1], want.ids)


def test_hash_weights_come_from_each_rows_own_scores():
    cfg = RouterConfig(num_experts=4, top_k=2, scoring="sigmoid", routing="hash", renormalize=False)
    table = torch.tensor([[3, 0], [1, 2]])
    logits = [[0.0, 1.0, 2.0, 3.0], [-1.0, 0.5, -2.0, 4.0]]
    w, ids = r(logits, cfg, token_ids=torch.tensor([1, 0]), hash_table=table)
    assert ids.tolist() == [[1, 2], [3, 0]]
    sig = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731
    assert w.tolist() == [pytest.approx([sig(1.0), sig(2.0)], rel=1e-6), pytest.approx([sig(4.0), sig(-1.0)], rel=1e-6)]
