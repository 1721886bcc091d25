"""The routing contract (docs/contract.md, "The pipeline, in order") in straight-line torch.

This is the oracle: tests, benchmarks, the checker and the CLI import it; the Triton kernel must agree
with it. It runs on any device, in fp32 (the contract) or fp64 (``dtype=torch.float64``, an oracle for
the fp32 paths). Inputs are validated by ``moegate.route`` before they reach this module.

Shape legend:
    T  tokens (rows of logits)         E  routed experts      Z  zero (identity) experts
    W  E + Z, width of the logits      K  routed experts per token
    S  shared experts                  C  shared columns of the layout (0 or S)
    G  groups (n_group)                P  physical routed slots, L = P / ep_size
"""

from __future__ import annotations

import torch

from moegate._checks import FP32_TINY
from moegate.config import RouterConfig
from moegate.layout import ExpertLayout


def scores_and_keys(
    logits: torch.Tensor, config: RouterConfig, bias: torch.Tensor | None, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 1-3: the scores s (weights come from these) and the selection keys. Both [T, W], ``dtype``."""
    x = _scaled_logits(logits, config, dtype)  # [T, W]
    # NaN counts as -inf: score 0, key -inf, and the softmax of the other experts is undisturbed.
    dead = torch.isnan(x) | (x == float("-inf"))  # [T, W]
    x = x.masked_fill(dead, float("-inf"))
    if config.scoring == "softmax":
        row_max = x.amax(dim=1, keepdim=True)  # [T, 1]
        row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
        e = _flush(torch.exp(x - row_max))  # [T, W]
        total = e.sum(dim=1, keepdim=True)  # [T, 1]
        s = torch.where(total > 0, e / total, torch.zeros_like(e))
    elif config.scoring == "sigmoid":
        s = torch.sigmoid(x)
    else:  # sqrtsoftplus
        softplus = torch.where(x > 20, x, torch.log1p(_flush(torch.exp(torch.clamp(x, max=20)))))
        s = torch.sqrt(softplus)
    key = s if config.selection == "scores" else x
    if bias is not None:
        key = key + bias.to(dtype)  # [T, W]
    key = key.masked_fill(dead, float("-inf"))
    return s, key


def _flush(e: torch.Tensor) -> torch.Tensor:
    """Step 2's exponentials below fp32's normal range are 0 (the contract; GPU math libraries flush them)."""
    return e.masked_fill(e < FP32_TINY, 0.0)


def _scaled_logits(logits: torch.Tensor, config: RouterConfig, dtype: torch.dtype) -> torch.Tensor:
    """Step 1: logit_scale, then the softcap. [T, W], ``dtype``."""
    x = logits.to(dtype) * config.logit_scale
    if config.softcap is not None:
        x = config.softcap * torch.tanh(x / config.softcap)
    return x


def outside_domain(logits: torch.Tensor, config: RouterConfig) -> torch.Tensor:
    """[T] bool: rows with a +inf logit after step 1 (a softcap maps +inf to c, which is inside). Such rows are
    outside the contract's domain: their ids are still K distinct valid experts, their weights unspecified."""
    return (_scaled_logits(logits, config, torch.float32) == float("inf")).any(dim=1)


def _stable_order(key: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Indices sorting each row by key, descending; ties to the lower index. ``allowed`` entries first."""
    order = torch.sort(key, dim=1, descending=True, stable=True).indices  # [T, N]
    if allowed is not None:
        allowed_sorted = torch.gather(allowed, 1, order).to(torch.int8)
        regroup = torch.sort(allowed_sorted, dim=1, descending=True, stable=True).indices
        order = torch.gather(order, 1, regroup)
    return order


def select_topk(key: torch.Tensor, config: RouterConfig) -> torch.Tensor:
    """Steps 4-5: the K routed ids [T, K] (int64), ordered by key descending, ties to the lower id."""
    key, allowed = group_keys(key, config)
    return _stable_order(key, allowed)[:, : config.top_k]  # [T, K]


def group_scores(key: torch.Tensor, config: RouterConfig) -> torch.Tensor:
    """Step 4's group scores [T, G] of the keys [T, W]: each group's top-two sum or max."""
    grouped = key.view(key.shape[0], config.n_group, config.group_size)  # [T, G, W/G]
    if config.group_score == "top2_sum":
        return torch.sort(grouped, dim=2, descending=True).values[:, :, :2].sum(dim=2)  # [T, G]
    return grouped.amax(dim=2)  # [T, G]


def apply_kept_groups(key: torch.Tensor, kept: torch.Tensor, config: RouterConfig
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Step 4 given the kept groups [T, G] bool: (the keys [T, W] as step 5 ranks them, the experts it may take [T, W]
    bool or None for all). ``group_fill="zero"`` sets the dropped groups' keys to 0.0 (dead experts stay -inf);
    ``"exclude"`` keeps the keys and allows the kept groups' experts only."""
    kept = kept.repeat_interleave(config.group_size, dim=1)  # [T, W]
    if config.group_fill == "zero":
        # Dropped experts' keys become 0.0; dead ones (NaN / -inf logits) stay -inf, below every key.
        return torch.where(kept | (key == float("-inf")), key, torch.zeros_like(key)), None
    return key, kept


def group_keys(key: torch.Tensor, config: RouterConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Step 4: (the keys [T, W] as step 5 ranks them, the experts it may take [T, W] bool or None for all): the
    ``topk_group`` best groups by group_scores (ties to the lower group) kept, as apply_kept_groups says; no groups:
    the keys, None."""
    if config.n_group == 1:
        return key, None
    group_order = _stable_order(group_scores(key, config))[:, : config.topk_group]  # [T, topk_group]
    kept = torch.zeros(key.shape[0], config.n_group, dtype=torch.bool, device=key.device)
    kept.scatter_(1, group_order, True)  # [T, G]
    return apply_kept_groups(key, kept, config)


def routed_weights(
    scores: torch.Tensor,
    ids: torch.Tensor,
    config: RouterConfig,
    layout: ExpertLayout,
    expert_scale: torch.Tensor | None,
) -> torch.Tensor:
    """Steps 6-8: weights [T, K] from the unbiased scores, renormalised and scaled exactly once."""
    w = torch.gather(scores, 1, ids)  # [T, K]
    if config.renormalize:
        if config.renorm_p == 1.0:
            norm = w.sum(dim=1, keepdim=True)  # [T, 1]
        else:
            # The norm of w / m times m, m the row's largest weight: the powers stay near 1, where w ** p itself
            # would underflow (weights near 1e-20, p = 2: subnormal, or 0 with p = 3) or overflow.
            m = w.amax(dim=1, keepdim=True)  # [T, 1]
            m = torch.where((m > 0) & torch.isfinite(m), m, torch.ones_like(m))
            norm = m * (w / m).pow(config.renorm_p).sum(dim=1, keepdim=True).pow(1.0 / config.renorm_p)
        if config.renorm_eps_mode == "add":
            denom = norm + config.renorm_eps  # [T, 1]
        else:
            denom = norm.clamp(min=config.renorm_eps)
        # renorm_eps may be 0: a row whose selected scores are all 0 (all-NaN logits) keeps weights 0, not NaN.
        w = torch.where(denom > 0, w / denom, torch.zeros_like(w))
    if expert_scale is not None:
        w = w * expert_scale.to(w.dtype)[ids]  # [T, K]
    if layout.scale == "in_weights" and config.routed_scaling_factor != 1.0:
        w = w * config.routed_scaling_factor
    return w


def place(
    ids: torch.Tensor, config: RouterConfig, layout: ExpertLayout, home_rank: int
) -> torch.Tensor:
    """Step 9 and the routed half of step 10: logical ids [T, K] -> ids of the layout's id space [T, K]."""
    T, K = ids.shape
    physical = ids
    if layout.placement is not None:
        _, l2p, count = layout.placement.tables(ids.device)
        L = layout.slots_per_rank(config.num_experts)
        n = count.long()[ids]  # [T, K] replicas of each selected expert
        token = torch.arange(T, device=ids.device).unsqueeze(1)  # [T, 1]
        choice = token % n  # [T, K] round robin
        if layout.replica_policy == "first":
            choice = torch.zeros_like(choice)
        elif layout.replica_policy == "home_rank":
            slots = l2p.long()[ids]  # [T, K, R]
            r = torch.arange(slots.shape[2], device=ids.device)
            home = (slots >= 0) & (slots // L == home_rank)  # [T, K, R]
            first_home = torch.where(home, r, slots.shape[2]).amin(dim=2)  # [T, K]
            choice = torch.where(first_home < slots.shape[2], first_home, choice)
        physical = l2p.long()[ids, choice]  # [T, K]
    if layout.shared_slots == "per_rank":
        L = layout.slots_per_rank(config.num_experts)
        physical = physical + (physical // L) * config.num_shared_experts
    return physical


def shared_columns(
    T: int, config: RouterConfig, layout: ExpertLayout, home_rank: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 10: the shared columns' ids [T, C] and weights [T, C]."""
    C = layout.num_shared_columns(config.num_shared_experts)
    j = torch.arange(C, device=device)  # [C]
    P = layout.num_physical(config.num_experts)
    if layout.shared_slots == "global":
        cols = P + j
    else:
        L = layout.slots_per_rank(config.num_experts)
        cols = home_rank * (L + config.num_shared_experts) + L + j
    w = shared_weight(config, layout)
    ids = cols.unsqueeze(0).expand(T, C)  # [T, C]
    weights = torch.full((T, C), w, dtype=dtype, device=device)  # [T, C]
    return ids, weights


def shared_weight(config: RouterConfig, layout: ExpertLayout) -> float:
    """Step 10's shared-column weight: the shared experts' net factor, contributed exactly once."""
    if layout.scale == "in_weights":
        return config.shared_expert_scale
    return config.shared_expert_scale / config.routed_scaling_factor


def valid_rows(T: int, num_valid_tokens, device: torch.device) -> torch.Tensor:
    """Step 11: [T, 1] bool, rows t < num_valid_tokens (an int or a one-element device tensor)."""
    t = torch.arange(T, device=device).unsqueeze(1)  # [T, 1]
    if num_valid_tokens is None:
        return torch.ones_like(t, dtype=torch.bool)
    if isinstance(num_valid_tokens, torch.Tensor):
        return t < num_valid_tokens.reshape(1, 1).to(device=device, dtype=torch.long)
    return t < num_valid_tokens


def _live_rows(T: int, num_valid_tokens, device: torch.device, token_ids: torch.Tensor | None = None,
               vocab: int = 0) -> torch.Tensor:
    """[T, 1] bool: valid_rows, and with hash routing (``token_ids``) rows whose token id lies in the table's
    [0, vocab) (route() rejects others on the host for CPU tensors; on a device, where that check would synchronise,
    such a row is written as padding, never read out of bounds)."""
    valid = valid_rows(T, num_valid_tokens, device)
    if token_ids is not None:
        tid = token_ids.long()  # [T]
        valid = valid & ((tid >= 0) & (tid < vocab)).unsqueeze(1)
    return valid


@torch.library.custom_op("moegate::reference_valid_rows", mutates_args=())
def _valid_rows_checked(
    logits: torch.Tensor, num_valid: torch.Tensor | None, num_valid_int: int, token_ids: torch.Tensor | None,
    hash_table: torch.Tensor | None, bias: torch.Tensor | None, expert_scale: torch.Tensor | None, num_experts: int,
    top_k: int,
) -> torch.Tensor:
    """Under torch.compile: route()'s checks of the inputs' values (a traced graph has none to read) made when the
    graph runs, on the real tensors, and the rows step 11 keeps ([T, 1] bool, with hash routing's rows of token ids
    outside the table too), which the outputs depend on: a CPU bias that is not finite, a CPU expert_scale that is
    not finite and >= 0, a CPU num_valid_tokens outside [0, T], a hash table whose ids leave [0, E) or repeat in a
    row, a CPU token id outside the table are the ValueErrors an eager call raises. ``num_valid_int``: the int
    num_valid_tokens, -1 for none."""
    from moegate._checks import _check_hash_table, _check_num_valid_tokens, _check_token_range, _check_values_on_cpu

    T, device = logits.shape[0], logits.device
    if bias is not None:
        _check_values_on_cpu("bias", bias)
    if expert_scale is not None:
        _check_values_on_cpu("expert_scale", expert_scale, nonnegative=True)
    nv = num_valid if num_valid is not None else (None if num_valid_int < 0 else num_valid_int)
    _check_num_valid_tokens(nv, T, device)
    if hash_table is not None:
        _check_hash_table(hash_table, num_experts, top_k, device)
        _check_token_range(token_ids, hash_table.shape[0], nv)
    return _live_rows(T, nv, device, token_ids, 0 if hash_table is None else hash_table.shape[0])


@_valid_rows_checked.register_fake
def _valid_rows_checked_fake(logits, num_valid, num_valid_int, token_ids, hash_table, bias, expert_scale,
                             num_experts, top_k):
    return logits.new_empty((logits.shape[0], 1), dtype=torch.bool)


def route_reference(
    logits: torch.Tensor,
    config: RouterConfig,
    layout: ExpertLayout | None = None,
    *,
    bias: torch.Tensor | None = None,
    num_valid_tokens=None,
    home_rank: int = 0,
    token_ids: torch.Tensor | None = None,
    hash_table: torch.Tensor | None = None,
    expert_scale: torch.Tensor | None = None,
    recorder=None,
    layer: int = 0,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """All twelve steps. Returns ``(weights [T, K + C] float32 (or dtype), ids [T, K + C] int32)``.

    ``dtype=torch.float64`` computes everything in fp64 and returns fp64 weights (an oracle mode;
    ``out`` must then be None).
    """
    layout = layout or ExpertLayout()
    T = logits.shape[0]
    device = logits.device
    scores, key = scores_and_keys(logits, config, bias, dtype)  # [T, W], [T, W]
    hashed = config.routing == "hash"
    if torch.compiler.is_compiling():
        # A traced graph has no values for route()'s checks to read: they run with the graph (_valid_rows_checked).
        tensor_nv = isinstance(num_valid_tokens, torch.Tensor)
        valid = _valid_rows_checked(
            logits, num_valid_tokens if tensor_nv else None,
            -1 if num_valid_tokens is None or tensor_nv else int(num_valid_tokens),
            token_ids if hashed else None, hash_table if hashed else None,
            None if bias is None else bias.detach(), None if expert_scale is None else expert_scale.detach(),
            config.num_experts, config.top_k)
    else:
        valid = _live_rows(T, num_valid_tokens, device, token_ids if hashed else None,
                           hash_table.shape[0] if hashed else 0)  # [T, 1]
    if hashed:
        tid = torch.where(valid.squeeze(1), token_ids.long(), torch.zeros_like(token_ids, dtype=torch.long))
        ids = hash_table.long()[tid]  # [T, K]
    else:
        ids = select_topk(key, config)  # [T, K]
    weights = routed_weights(scores, ids, config, layout, expert_scale)  # [T, K]
    if recorder is not None:
        recorder.record(layer, torch.where(valid, ids, -1))
    placed = place(ids, config, layout, home_rank)  # [T, K]
    shared_ids, shared_w = shared_columns(T, config, layout, home_rank, device, weights.dtype)  # [T, C]
    all_ids = torch.cat([placed, shared_ids], dim=1)  # [T, K + C]
    all_w = torch.cat([weights, shared_w], dim=1)  # [T, K + C]
    all_ids = torch.where(valid, all_ids, -1).to(torch.int32)
    all_w = torch.where(valid, all_w, torch.zeros_like(all_w))
    if out is not None:
        out[0].copy_(all_w)
        out[1].copy_(all_ids)
        return out[0], out[1]
    return all_w, all_ids
