"""check_routing: every invariant of docs/contract.md ("What is always true"), on any routing output."""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import torch

from moegate._checks import (
    INT_DTYPES,
    _check_bias,
    _check_expert_scale,
    _check_hash_table,
    _check_home_rank,
    _check_logits,
    _check_num_valid_tokens,
    _check_token_ids,
)
from moegate.config import RouterConfig
from moegate.layout import ExpertLayout, _check_layout_for
from moegate.reference import (
    _stable_order,
    apply_kept_groups,
    group_keys,
    group_scores,
    outside_domain,
    place,
    route_reference,
    routed_weights,
    scores_and_keys,
    shared_columns,
    valid_rows,
)


class Violation(NamedTuple):
    """One broken invariant. ``row``/``column`` are -1 where the whole output is concerned."""

    row: int
    column: int
    what: str
    why: str

    def __str__(self) -> str:
        return f"row {self.row}, column {self.column}: {self.what}: {self.why}"


class RoutingCheckError(ValueError):
    """Raised by ``check_routing(..., strict=True)``; ``.violations`` lists them all."""

    def __init__(self, violations: list[Violation]) -> None:
        self.violations = violations
        head = "\n".join(str(v) for v in violations[:10])
        more = f"\n... and {len(violations) - 10} more" if len(violations) > 10 else ""
        super().__init__(f"{len(violations)} routing invariant(s) violated:\n{head}{more}")


def logical_routed_ids(ids: torch.Tensor, config: RouterConfig, layout: ExpertLayout) -> torch.Tensor:
    """Undo placement and shared slots on the routed columns [T, K] -> logical ids (int64).

    Ids that do not name a routed slot of the layout (out of range, or a per-rank shared slot) map to -1.
    """
    ids = ids.long()
    E, S = config.num_experts, config.num_shared_experts
    P = layout.num_physical(E)
    physical = ids.clone()
    if layout.shared_slots == "per_rank":
        L = layout.slots_per_rank(E)
        rank, local = ids // (L + S), ids % (L + S)
        physical = torch.where((local < L) & (ids >= 0), rank * L + local, torch.full_like(ids, -1))
    upper = P if config.num_zero_experts == 0 else config.num_scored
    physical = torch.where((physical >= 0) & (physical < upper), physical, torch.full_like(ids, -1))
    if layout.placement is None:
        return physical
    p2l, _, _ = layout.placement.tables(ids.device)
    return torch.where(physical >= 0, p2l.long()[physical.clamp(min=0)], physical)


def _kept_group_sets(key64: torch.Tensor, config: RouterConfig, rtol: float = 1e-5) -> list[torch.Tensor] | None:
    """The kept-group masks [G] a row's fp64 keys [W] allow: the top ``topk_group`` groups by score, where groups
    whose scores lie within ``rtol`` of the row's largest key of the boundary may stand in for one another (a router
    in fp32 may keep either). None where that leaves more than 64 choices."""
    G, k = config.n_group, config.topk_group
    if k >= G:
        return [torch.ones(G, dtype=torch.bool, device=key64.device)]
    score = group_scores(key64[None], config)[0]  # [G]
    order = _stable_order(score[None])[0].tolist()
    finite = key64[key64.isfinite()]
    tol = rtol * 2 * (float(finite.abs().max()) if len(finite) else 0.0)
    edge = (float(score[order[k - 1]]) + float(score[order[k]])) / 2
    near = [g for g in order if math.isclose(float(score[g]), edge, abs_tol=tol) or float(score[g]) == edge]
    sure = [g for g in order[:k] if g not in near]
    choices = list(itertools.combinations(near, k - len(sure)))
    if len(choices) > 64:
        return None
    masks = []
    for chosen in choices:
        kept = torch.zeros(G, dtype=torch.bool, device=key64.device)
        kept[list(sure) + list(chosen)] = True
        masks.append(kept)
    return masks


def _tie_order_violation(ids: torch.Tensor, logits: torch.Tensor, config: RouterConfig, layout: ExpertLayout,
                         bias: torch.Tensor | None, rows: torch.Tensor) -> str | None:
    """The first break of the lower-id rule among ``rows`` (indices into ``ids`` [T, K + C] and ``logits``), or None:
    a routed expert ahead of, or picked instead of, an expert of a lower id and the same fp64 key (equal inputs, so
    the keys tie in any arithmetic), as step 4 leaves the keys: with groups, under every choice of kept groups that
    near-tied group scores allow (_kept_group_sets) and that the row's experts fit (``exclude``: from kept groups;
    ``zero``: dropped groups' keys 0.0, competing), a row breaks the rule only if it does under each. check_routing
    forgives near ties either way and so leaves this rule out; the kernel tests and the GPU fuzz hold the rows they
    forgive to it."""
    if not len(rows) or config.routing == "hash":
        return None
    K = config.top_k
    _, key64 = scores_and_keys(logits[rows], config, bias, torch.float64)  # [n, W]
    logical = logical_routed_ids(ids[rows, :K], config, layout)  # [n, K]
    for i, r in enumerate(rows.tolist()):
        picked = logical[i].tolist()
        live = [e for e in picked if e >= 0]
        masks = [None] if config.n_group == 1 else _kept_group_sets(key64[i], config)
        if masks is None:
            continue
        found = None  # stays None where no choice of kept groups fits the row's experts
        for kept in masks:
            key, allowed = key64[i], None
            if kept is not None:
                key, allowed = apply_kept_groups(key[None], kept[None], config)
                key, allowed = key[0], None if allowed is None else allowed[0]
                if allowed is not None and not bool(allowed[live].all()):
                    continue  # not the groups this row kept
            eligible = torch.ones_like(key, dtype=torch.bool) if allowed is None else allowed
            found = None
            for c, e in enumerate(picked):
                if e < 0:
                    continue
                equal = ((key == key[e]) & eligible).nonzero().flatten().tolist()
                lower = [j for j in equal if j < e and j not in picked[:c]]
                if lower:
                    found = (f"row {r}: expert {e} in column {c} ahead of expert {lower[0]}, whose key is equal (ties "
                             "go to the lower id)")
                    break
            if found is None:
                break  # a choice of kept groups under which the row keeps the rule
        if found is not None:
            return found
    return None


def check_routing(
    weights: torch.Tensor,
    ids: torch.Tensor,
    config: RouterConfig,
    layout: ExpertLayout | None = None,
    *,
    logits: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    num_valid_tokens=None,
    home_rank: int = 0,
    token_ids: torch.Tensor | None = None,
    hash_table: torch.Tensor | None = None,
    expert_scale: torch.Tensor | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    strict: bool = False,
) -> list[Violation]:
    """The invariants that ``(weights, ids)`` from a router break, as a list (empty when all hold).

    Checks, for each live row: exactly K distinct routed experts inside the layout's id space; S shared
    columns with the right ids and weight (shared_expert_scale, divided by rsf with scale="on_output");
    finite weights >= 0; with renormalize, routed weights summing to 1 (rsf when folded); padded rows all
    -1 / 0. Given
    ``logits`` (and ``bias``, ...), it also recomputes the selection with the fp32 reference: the same experts
    (up to near-ties within ``rtol``) and the same weights (``rtol``/``atol``). With hash routing and
    ``token_ids``/``hash_table`` it checks the ids against the table. A row with a +inf logit (after step 1) is
    outside the contract's domain: given ``logits``, such a row is checked for its ids (K distinct routed experts
    in the id space, the shared ids, the hash table's ids) and its shared columns' weights, which do not depend on
    the logits; its routed weights and its choice among the experts are unspecified (docs/contract.md, step 2).

    Near-ties: two keys within ``rtol`` of their size (|score| + |bias|, or |logit| + |bias| selecting on logits)
    may be chosen either way, and equal keys too: the checker does not test the lower-id tie rule (the kernel tests
    do). The keys are those step 5 ranks (group_fill="zero": 0.0 for every dropped expert); a dead expert (-inf
    key) is near only another dead one. Another set of near-tied experts than the reference's is held to its own
    column order and weights (steps 6-8 on its scores). With group_fill="exclude", the routed experts come from at
    most topk_group groups, each kept by the reference or within rtol of its last kept group's score ("group"). With
    a placement, each routed id is the slot replica_policy gives its expert ("replica"). Without ``logits``, a
    renormalized row whose routed weights are all 0 passes (all-NaN logits give it), and with ``has_expert_scale``
    the sum is not checked (the scale multiplies after the norm).
    The layout must fit the config and ``home_rank`` lie in [0, ep_size); given ``logits``, a config's bias and
    expert_scale are required, as route() requires them.

    Reads the tensors on the host; not for the hot path. ``strict=True`` raises RoutingCheckError.
    """
    layout = ExpertLayout() if layout is None else layout  # 0, [], '' are refused below, not defaults
    found: list[Violation] = []
    if not isinstance(config, RouterConfig):
        raise TypeError(f"config must be a RouterConfig, got {type(config).__name__}")
    for name, t in (("weights", weights), ("ids", ids)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"check_routing: {name} must be a tensor, got {type(t).__name__}")
    if ids.dtype not in INT_DTYPES:
        raise TypeError(f"check_routing: ids must be an integer tensor, got {ids.dtype}")
    if not weights.is_floating_point():
        raise TypeError(f"check_routing: weights must be a floating-point tensor, got {weights.dtype}")
    for name, v in (("rtol", rtol), ("atol", atol)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"check_routing: {name} must be a float, got {v!r}")
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"check_routing: {name} must be a finite float >= 0, got {v!r}")
    if config.routing == "hash" and (token_ids is None) != (hash_table is None):
        missing = "token_ids" if token_ids is None else "hash_table"
        raise ValueError(f"check_routing: hash routing checks the ids against hash_table[token_ids]: {missing} is "
                         "missing (pass both, or neither to skip that check)")
    if not isinstance(layout, ExpertLayout):
        raise TypeError(f"layout must be an ExpertLayout or None, got {type(layout).__name__}")
    _check_layout_for(layout, config)
    _check_home_rank(home_rank, layout.ep_size)
    if logits is not None:
        _check_logits(logits, config.num_scored)
        _check_bias(bias, config.has_correction_bias, config.num_scored, logits.device)
        _check_expert_scale(expert_scale, config.has_expert_scale, config.num_experts, logits.device)

    def add(row: int, col: int, what: str, why: str) -> None:
        found.append(Violation(int(row), int(col), what, why))

    K, S = config.top_k, config.num_shared_experts
    C = layout.num_shared_columns(S)
    width = K + C
    weights_c, ids_c = weights.detach().cpu(), ids.detach().cpu()
    if ids_c.dim() != 2 or ids_c.shape[1] != width or weights_c.shape != ids_c.shape:
        add(-1, -1, "shape", f"ids and weights must both be [T, K + C] = [T, {width}], got "
            f"{tuple(ids_c.shape)} and {tuple(weights_c.shape)}")
        return _finish(found, strict)
    T = ids_c.shape[0]
    for name, t in (("logits", logits), ("token_ids", token_ids)):
        if t is not None and t.shape[0] != T:
            raise ValueError(f"check_routing: {name} has {t.shape[0]} rows, the routing {T}: pass the {name} it was "
                             "routed from")
    if config.routing == "hash" and token_ids is not None:
        # As route() checks them (a float table was truncated, a [vocab, K'] one broadcast or indexed past E).
        _check_token_ids(token_ids, T, token_ids.device)
        _check_hash_table(hash_table, config.num_experts, K, hash_table.device)
    if isinstance(num_valid_tokens, torch.Tensor):  # the checker reads everything on the host
        _check_num_valid_tokens(num_valid_tokens, T, num_valid_tokens.device)
        num_valid_tokens = int(num_valid_tokens.reshape(()).cpu())
    _check_num_valid_tokens(num_valid_tokens, T, torch.device("cpu"))
    valid = valid_rows(T, num_valid_tokens, torch.device("cpu")).squeeze(1)
    ids64, w64 = ids_c.long(), weights_c.double()
    space = layout.id_space(config.num_experts, S) if config.num_zero_experts == 0 else config.num_scored

    for t in torch.nonzero(~valid).flatten().tolist():
        bad = torch.nonzero((ids64[t] != -1) | (w64[t] != 0)).flatten().tolist()
        for col in bad:
            add(t, col, "padding", f"padded row must be id -1 / weight 0, got id {int(ids64[t, col])} "
                f"weight {float(w64[t, col])}")

    live = valid.clone()
    # Rows with a +inf logit: ids and shared weights checked like every live row's; routed weights and the
    # selection are unspecified.
    defined = live & ~outside_domain(logits.detach().cpu(), config) if logits is not None else live
    out_of_space = live.unsqueeze(1) & ((ids64 < 0) | (ids64 >= space))
    for t, col in torch.nonzero(out_of_space).tolist():
        add(t, col, "id range", f"id {int(ids64[t, col])} is outside the id space [0, {space})")
    checked = torch.cat([defined.unsqueeze(1).expand(T, K), live.unsqueeze(1).expand(T, C)], dim=1)  # [T, K + C]
    bad_w = checked & (~torch.isfinite(w64) | (w64 < 0))
    for t, col in torch.nonzero(bad_w).tolist():
        add(t, col, "weight", f"weight {float(w64[t, col])} is not finite and >= 0")

    logical = logical_routed_ids(ids_c[:, :K], config, layout)  # [T, K]
    not_routed = live.unsqueeze(1) & (logical < 0) & (ids64[:, :K] >= 0) & (ids64[:, :K] < space)
    for t, col in torch.nonzero(not_routed).tolist():
        add(t, col, "routed slot", f"id {int(ids64[t, col])} is not a routed slot (a shared slot in a routed column?)")
    ordered = logical.sort(dim=1).values
    dup = live.unsqueeze(1) & (ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)
    for t in torch.nonzero(dup.any(dim=1)).flatten().tolist():
        add(t, -1, "distinct", f"routed experts repeat: logical ids {logical[t].tolist()}")
    if layout.placement is not None:
        # Step 9 is a function of the logical id, the row and home_rank (replica_policy): a replica of the right expert
        # on another rank than the policy's is a wrong id too.
        named = live.unsqueeze(1) & (logical >= 0)
        want_phys = place(logical.clamp(min=0), config, layout, home_rank)
        for t, col in torch.nonzero(named & (ids64[:, :K] != want_phys)).tolist():
            add(t, col, "replica", f"expert {int(logical[t, col])} must take slot {int(want_phys[t, col])} "
                f"(replica_policy={layout.replica_policy!r}, home_rank={home_rank}), got {int(ids64[t, col])}")

    if C:
        shared_ids, shared_w = shared_columns(1, config, layout, home_rank, torch.device("cpu"), torch.float64)
        expected_ids, expected_w = shared_ids[0].tolist(), float(shared_w[0, 0])
        for j in range(C):
            col = K + j
            wrong_id = live & (ids64[:, col] != expected_ids[j])
            for t in torch.nonzero(wrong_id).flatten().tolist():
                add(t, col, "shared id", f"shared column {j} must hold id {expected_ids[j]}, got {int(ids64[t, col])}")
            wrong_w = live & ((w64[:, col] - expected_w).abs() > atol + rtol * expected_w)
            for t in torch.nonzero(wrong_w).flatten().tolist():
                add(t, col, "shared weight", f"shared weight must be {expected_w:.8g} "
                    f"({'shared_expert_scale' if layout.scale == 'in_weights' else 'shared_expert_scale / rsf'}), "
                    f"got {float(w64[t, col]):.8g}")

    if config.renormalize and not config.has_expert_scale:  # expert_scale multiplies after the norm
        target = config.routed_scaling_factor if layout.scale == "in_weights" else 1.0
        norm = _norm(w64[:, :K] / target, config.renorm_p)
        if logits is None or (config.routing == "hash" and hash_table is None):
            # The raw sum is unknown, and eps pulls the norm below 1 by eps / (raw + eps): flag a row only
            # when its raw sum would have to be below 1e-3. A row whose selected scores are all 0 (all-NaN
            # logits) normalises to 0.
            slack = config.renorm_eps / (config.renorm_eps + 1e-3)
            off = (norm != 0) & ((norm > 1.0 + 1e-5) | (norm < 1.0 - 1e-5 - slack))
            want = torch.ones_like(norm)
        else:
            # With logits the norm this row must have, eps included, is the reference's.
            ref_w, _ = _reference(logits, bias, token_ids, hash_table, expert_scale, config, layout)
            want = _norm(ref_w[:, :K] / target, config.renorm_p)
            off = (norm - want).abs() > 1e-5 * want.clamp(min=1.0)
        for t in torch.nonzero(defined & off).flatten().tolist():
            add(t, -1, "renormalize", f"routed weights must sum to {float(want[t]) * target:.8g} "
                f"(norm p={config.renorm_p}), got {float(norm[t]) * target:.8g}")

    if config.routing == "hash" and token_ids is not None and hash_table is not None:
        table, tid = hash_table.detach().cpu().long(), token_ids.detach().cpu().long()
        in_table = (tid >= 0) & (tid < table.shape[0])
        for t in torch.nonzero(live & ~in_table).flatten().tolist():
            add(t, -1, "hash ids", f"token id {int(tid[t])} is outside the hash table's rows [0, {table.shape[0]})")
        expected = table[torch.where(in_table, tid, 0)]
        wrong = (live & in_table).unsqueeze(1) & (logical != expected)
        for t, col in torch.nonzero(wrong).tolist():
            add(t, col, "hash ids", f"hash table gives expert {int(expected[t, col])}, got {int(logical[t, col])}")

    if logits is not None:
        _check_against_reference(found, add, logits, bias, token_ids, hash_table, expert_scale, config, layout,
                                 defined, logical, w64, rtol, atol)
    return _finish(found, strict)


def _check_against_reference(found, add, logits, bias, token_ids, hash_table, expert_scale, config, layout, live,
                             logical, w64, rtol, atol) -> None:
    """Selection and weights against the fp32 reference, near-ties forgiven."""
    if config.routing == "hash" and hash_table is None:
        return
    K = config.top_k
    ref_w, ref_ids = _reference(logits, bias, token_ids, hash_table, expert_scale, config, layout)
    bias_c = None if bias is None else bias.detach().cpu()
    scores, key = scores_and_keys(logits.detach().cpu(), config, bias_c)  # [T, W]
    # A key's size for the near-tie test: |s| + |b| (|x| + |b| selecting on logits), what its fp32 rounding scales
    # with. Relative, not absolute: softmax keys of 1e-10 and 2e-7 are no near-tie. FTZ'd denormals are.
    mag = key.abs() if bias_c is None else (key - bias_c.float()).abs() + bias_c.float().abs()
    floor = 2 * torch.finfo(torch.float32).tiny
    # The keys as step 5 ranks them: group_fill="zero" ties every dropped expert at 0.0 (any of them may be taken),
    # exactly 0.0, whatever its own logit's size.
    raw_key = key
    key = group_keys(key, config)[0]
    mag = torch.where(key != raw_key, torch.zeros_like(mag), mag)
    T, G, gsz = key.shape[0], config.n_group, config.group_size
    exclude_groups = G > 1 and config.group_fill == "exclude" and config.routing != "hash"
    if exclude_groups:
        # Step 4's choice, near-ties forgiven as step 5's are: the groups whose score is within rtol of the
        # topk_group-th kept one's may be kept instead of it; a routed expert of any other group is a violation.
        grouped, gmag_e = raw_key.view(T, G, gsz), mag.view(T, G, gsz)
        top = 2 if config.group_score == "top2_sum" else 1
        g_top, g_idx = grouped.sort(dim=2, descending=True, stable=True)
        g_score = g_top[:, :, :top].sum(dim=2)  # [T, G]
        g_mag = gmag_e.gather(2, g_idx[:, :, :top]).sum(dim=2)  # [T, G]
        g_order = _stable_order(g_score)  # [T, G]
        last = g_order[:, config.topk_group - 1 : config.topk_group]  # [T, 1] the topk_group-th kept group
        kth, kth_mag = g_score.gather(1, last), g_mag.gather(1, last)
        admissible = (g_score >= kth) | (torch.isfinite(g_score) & torch.isfinite(kth)
                                         & (kth - g_score <= rtol * torch.maximum(g_mag, kth_mag) + floor))

    def near(k_got, k_want, m_got, m_want):
        # A dead expert's key (-inf) ties only with another's: its size is inf, and inf * rtol forgives anything.
        close = (k_got - k_want).abs() <= rtol * torch.maximum(m_got, m_want) + floor
        return (k_got == k_want) | (torch.isfinite(k_got) & torch.isfinite(k_want) & close)

    ref_ids = ref_ids[:, :K].long()
    for t in torch.nonzero(live).flatten().tolist():
        got, want = logical[t], ref_ids[t]
        if (got < 0).any():
            continue  # already reported
        other_groups = False
        if exclude_groups:
            used = sorted(set((got // gsz).tolist()))
            if not bool(admissible[t, used].all()) or len(used) > config.topk_group:
                add(t, -1, "group", f"experts {sorted(got.tolist())} come from groups {used}; step 4 keeps "
                    f"{config.topk_group} of {G} groups, here {sorted(g_order[t, :config.topk_group].tolist())} (or "
                    "groups whose score is within rtol of the last kept one's)")
                continue
            if not set(used) <= set(g_order[t, :config.topk_group].tolist()):
                # A near-tied group kept instead of the reference's: the reference's selection within that choice.
                kept = used + [g for g in g_order[t].tolist() if g not in used][: config.topk_group - len(used)]
                cand = torch.cat([torch.arange(g * gsz, (g + 1) * gsz) for g in sorted(kept)])
                want = cand[_stable_order(key[t, cand][None, :])[0, :K]]
                other_groups = True
        if other_groups or set(got.tolist()) != set(want.tolist()):
            got_keys, got_order = key[t, got].sort(descending=True)
            want_keys, want_order = key[t, want].sort(descending=True)
            if not bool(near(got_keys, want_keys, mag[t, got][got_order], mag[t, want][want_order]).all()):
                add(t, -1, "selection", f"experts {sorted(got.tolist())} differ from the reference's "
                    f"{sorted(want.tolist())}")
                continue
            # Another set of near-tied experts: its columns by key, descending (near-ties either way), and its
            # weights steps 6-8 on that set's scores.
            if config.routing != "hash":
                for col in range(1, K):
                    k_prev, k_col = key[t, got[col - 1]], key[t, got[col]]
                    if k_col > k_prev and not bool(near(k_col, k_prev, mag[t, got[col]], mag[t, got[col - 1]])):
                        add(t, col, "column order", f"column {col} holds expert {int(got[col])} (key "
                            f"{float(k_col):.8g}) above column {col - 1}'s (key {float(k_prev):.8g}): columns go by "
                            "key, descending")
            expected = routed_weights(scores[t : t + 1], got[None, :], config, ExpertLayout(scale=layout.scale),
                                      None if expert_scale is None else expert_scale.detach().cpu())[0, :K]
            for col, e in enumerate(got.tolist()):
                want_w = float(expected[col])
                if abs(float(w64[t, col]) - want_w) > atol + rtol * abs(want_w):
                    add(t, col, "weight value", f"expert {e}: weight {float(w64[t, col]):.8g}, reference (for "
                        f"this set of near-tied experts) {want_w:.8g}")
            continue
        if config.routing != "hash":
            # Columns by key, descending (ties to the lower id): position by position against the reference's
            # order, a swap of near-tied keys forgiven. (Hash rows keep the table's order: checked above.)
            for col in torch.nonzero(got != want).flatten().tolist():
                k_got, k_want = key[t, got[col]], key[t, want[col]]
                if not bool(near(k_got, k_want, mag[t, got[col]], mag[t, want[col]])):
                    add(t, col, "column order", f"column {col} holds expert {int(got[col])} (key {float(k_got):.8g}), "
                        f"the reference's order has expert {int(want[col])} (key {float(k_want):.8g}) there: columns "
                        "go by key, descending")
        by_id_ref = dict(zip(want.tolist(), ref_w[t, :K].tolist(), strict=True))
        for col, e in enumerate(got.tolist()):
            expected = by_id_ref[e]
            if abs(float(w64[t, col]) - expected) > atol + rtol * abs(expected):
                add(t, col, "weight value", f"expert {e}: weight {float(w64[t, col]):.8g}, reference {expected:.8g}")


def _norm(w: torch.Tensor, p: float) -> torch.Tensor:
    return w.sum(dim=1) if p == 1.0 else w.pow(p).sum(dim=1).pow(1.0 / p)


def _reference(logits, bias, token_ids, hash_table, expert_scale, config, layout):
    """The reference routing of these inputs without fusion: (weights [T, K], logical ids [T, K]).

    fp32, as the contract computes: at fp32 ties (a saturated softcap, say) fp64 would rank differently.
    """
    def host(t):
        return None if t is None else t.detach().cpu()

    if config.routing == "hash" and hash_table is None:
        raise ValueError("check_routing: hash routing with logits also needs token_ids and hash_table")
    return route_reference(
        host(logits), config, ExpertLayout(scale=layout.scale), bias=host(bias), token_ids=host(token_ids),
        hash_table=host(hash_table), expert_scale=host(expert_scale),
    )


def _finish(found: list[Violation], strict: bool) -> list[Violation]:
    if strict and found:
        raise RoutingCheckError(found)
    return found
