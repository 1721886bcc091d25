"""route(): the public entry point. Validates everything, then runs one backend."""

from __future__ import annotations

from typing import NamedTuple

import torch

from moegate._checks import (
    _check_bias,
    _check_choice,
    _check_expert_scale,
    _check_hash_table,
    _check_home_rank,
    _check_int,
    _check_logits,
    _check_no_aliasing,
    _check_num_valid_tokens,
    _check_out,
    _check_token_ids,
    _check_token_range,
    _needs_grad,
)
from moegate.capture import RoutingRecorder
from moegate.config import RouterConfig
from moegate.layout import ExpertLayout, _check_layout_for
from moegate.reference import route_reference

BACKENDS = ("auto", "reference", "triton")


class RouteResult(NamedTuple):
    """weights float32 [T, K + C] and ids int32 [T, K + C]; C shared columns (0 or S)."""

    weights: torch.Tensor
    ids: torch.Tensor


def _check_route_args(
    logits, config, layout, bias, num_valid_tokens, home_rank, token_ids, hash_table, expert_scale,
    recorder, layer, out, packed_out=None,
) -> None:
    if not isinstance(config, RouterConfig):
        raise TypeError(f"config must be a RouterConfig, got {type(config).__name__}")
    if not isinstance(layout, ExpertLayout):
        raise TypeError(f"layout must be an ExpertLayout or None, got {type(layout).__name__}")
    _check_logits(logits, config.num_scored)
    T, device = logits.shape[0], logits.device
    _check_layout_for(layout, config)
    _check_bias(bias, config.has_correction_bias, config.num_scored, device)
    _check_expert_scale(expert_scale, config.has_expert_scale, config.num_experts, device)
    _check_num_valid_tokens(num_valid_tokens, T, device)
    _check_home_rank(home_rank, layout.ep_size)
    width = config.top_k + layout.num_shared_columns(config.num_shared_experts)
    _check_out(out, T, width, device)
    if config.routing == "hash":
        _check_token_ids(token_ids, T, device)
        _check_hash_table(hash_table, config.num_experts, config.top_k, device)
        _check_token_range(token_ids, hash_table.shape[0], num_valid_tokens)
    elif token_ids is not None or hash_table is not None:
        raise ValueError("token_ids/hash_table are only for routing='hash'; the config has routing='topk'")
    _check_int("layer", layer, 0)
    if recorder is not None:
        if not isinstance(recorder, RoutingRecorder):
            raise TypeError(f"recorder must be a RoutingRecorder or None, got {type(recorder).__name__}")
        recorder.check_batch(layer, T, config.top_k, config.num_scored, device)
    # Every buffer the launch writes (route_triton's packed_out too) apart from the others and from every input.
    written = [("out[0] (weights)", out[0]), ("out[1] (ids)", out[1])] if out is not None else []
    written.append(("packed_out", packed_out))
    if recorder is not None:
        written += [("the recorder's ids", recorder.ids), ("the recorder's num_tokens", recorder.num_tokens)]
    _check_no_aliasing(written, [("the logits", logits), ("the bias", bias), ("expert_scale", expert_scale),
                                 ("token_ids", token_ids), ("hash_table", hash_table),
                                 ("num_valid_tokens", num_valid_tokens)])


def route(
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
    backend: str = "auto",
) -> RouteResult:
    """Route a batch of tokens: docs/contract.md's twelve steps.

    Algorithm
    ---------
    1. x = logit_scale * logits; x = c * tanh(x / c) with a softcap c.
    2. Scores s: softmax (max-subtracted) / sigmoid / sqrt(softplus(x)). NaN logits count as -inf.
    3. Key: s or x (``selection``), + bias when the model has one. NaN and -inf x (after step 1) get key -inf.
    4. Groups: keep the ``topk_group`` best of ``n_group`` (top2_sum / max); exclude or zero the rest.
    5. The K largest keys, descending, ties to the lower id: K distinct ids in [0, E + Z).
    6. w = s[ids] (unbiased).  7. renormalize: w / (norm + eps).  8. rsf once, in weights or on output.
    9. Placement: logical -> physical replica.  10. Shared columns (global / per_rank).
    11. Rows t >= num_valid_tokens: ids -1, weights 0.  12. Recorder gets logical routed ids [T, K].

    Parameters
    ----------
    logits : Tensor [T, E + Z], float32 / float16 / bfloat16, any strides
        The gate projection's raw output.
    config : RouterConfig
    layout : ExpertLayout, optional (default: ``ExpertLayout()``)
    bias : Tensor [E + Z], float, optional
        The correction bias; required iff ``config.has_correction_bias``.
    num_valid_tokens : int in [0, T] or one-element integer tensor on the logits' device, optional
        Rows at or past it are padding. A device tensor is never read on the host (CUDA-graph safe).
    home_rank : int in [0, ep_size)
        The rank this batch runs on (per-rank shared slots, the "home_rank" replica policy).
    token_ids : Tensor [T], integer; hash_table : Tensor [vocab, K], integer
        Required iff ``config.routing == "hash"``. The table is validated on the host: a CUDA table once (until an
        in-place write its version counter sees), a CPU table on every call.
    expert_scale : Tensor [E], float, optional
        Required iff ``config.has_expert_scale``.
    recorder : RoutingRecorder, optional; layer : int
        Capture the logical routed ids into ``recorder.ids[layer, :T]``.
    out : (weights float32 [T, K + C], ids int32 [T, K + C]), contiguous, optional
        Preallocated outputs, written in place and returned (no allocation on the fast path).
    backend : {"auto", "reference", "triton"}
        "auto" picks "triton" for CUDA tensors when Triton is installed, the kernel takes the config and
        layout (docs/kernel.md, "Limits") and no gradient must flow (grad mode on and logits, bias or expert_scale
        requiring grad: the fused op has no backward), else "reference". "triton" raises a ValueError for those.

    Returns
    -------
    RouteResult(weights, ids): float32 and int32, [T, K + C], C = S for shared_slots != "none", else 0.

    Raises
    ------
    ValueError / TypeError before anything runs, for every bad input listed in docs/contract.md.

    Notes
    -----
    On CUDA with the Triton backend this is one kernel launch, with no host synchronisation, and no
    allocation when ``out`` is given: it can be captured in a CUDA graph and traced by torch.compile.
    """
    layout = ExpertLayout() if layout is None else layout
    _check_choice("backend", backend, BACKENDS)
    _check_route_args(
        logits, config, layout, bias, num_valid_tokens, home_rank, token_ids, hash_table, expert_scale,
        recorder, layer, out,
    )
    args = dict(
        bias=bias, num_valid_tokens=num_valid_tokens, home_rank=home_rank, token_ids=token_ids,
        hash_table=hash_table, expert_scale=expert_scale, recorder=recorder, layer=layer, out=out,
    )
    backend = resolve_backend(backend, logits.device, config, layout, _needs_grad(logits, bias, expert_scale))
    if backend == "triton":
        from moegate.kernels.router import _route_triton

        return RouteResult(*_route_triton(logits, config, layout, **args))
    return RouteResult(*route_reference(logits, config, layout, **args))


def resolve_backend(backend: str, device: torch.device, config: RouterConfig | None = None,
                    layout: ExpertLayout | None = None, needs_grad: bool = False) -> str:
    """The backend ``route`` runs for ``backend`` on ``device``: "auto" is "triton" for CUDA tensors when
    Triton is installed, one launch takes ``config`` and ``layout`` (docs/kernel.md, "Limits": top_k <= 64,
    a row tile of at most 16384 lanes, at most 64 shared columns and 64 replicas of an expert) and no gradient
    has to flow through the router (``needs_grad``: the fused op has no backward), else "reference". Without a
    config, only the device, the install and ``needs_grad`` decide."""
    _check_choice("backend", backend, BACKENDS)
    if backend != "auto":
        return backend
    if device.type != "cuda" or needs_grad:
        return "reference"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "reference"
    if config is not None:
        from moegate.kernels.router import _kernel_limit

        if _kernel_limit(config, ExpertLayout() if layout is None else layout) is not None:
            return "reference"
    return "triton"
