"""Validation of user input, in one place.

Every function raises ``ValueError`` (``TypeError`` for a wrong type or dtype) whose message names the argument,
the value it got and the range it allows. Nothing here synchronises with a device: values that live on a
GPU are checked only where docs/contract.md says so (hash tables, once per CUDA table, on the host).
"""

from __future__ import annotations

import math
import operator
import weakref
from collections.abc import Iterable, Sequence

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _check_int(name: str, value, low: int | None = None, high: int | None = None) -> None:
    """An int (not a bool) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be <= {high}, got {value}")


# The routing runs in fp32: a config's factors must be fp32 numbers (a larger one is inf there, a positive one below
# the normal range loses its precision, and its reciprocal, the shared weight with scale="on_output", overflows).
FP32_MAX = 3.4028234663852886e38
FP32_TINY = 1.1754943508222875e-38  # the smallest normal fp32


def _as_float(name: str, value) -> float:
    """A Python int or float (not a bool) as a float; an int past the float range is inf (then out of range)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {value!r} ({type(value).__name__})")
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _check_positive_float(name: str, value) -> None:
    value = _as_float(name, value)
    if not math.isfinite(value) or not FP32_TINY <= value <= FP32_MAX:
        raise ValueError(f"{name} must be a normal fp32 number > 0 (in [{FP32_TINY:.4g}, {FP32_MAX:.4g}]), "
                         f"got {value}")


def _check_nonnegative_float(name: str, value) -> None:
    value = _as_float(name, value)
    if not math.isfinite(value) or not 0 <= value <= FP32_MAX:
        raise ValueError(f"{name} must be finite in fp32 and >= 0 (at most {FP32_MAX:.4g}), got {value}")


def _check_choice(name: str, value, choices: Sequence[str]) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, one of {tuple(choices)}, got {value!r} ({type(value).__name__})")
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")


def _check_float_tensor(name: str, t, shape: tuple[int, ...] | None = None, ndim: int | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")


def _check_same_device(name: str, t: torch.Tensor, device: torch.device) -> None:
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, but logits are on {device}")


def _check_logits(logits, width: int) -> None:
    """logits: [T, width] float tensor, any strides."""
    _check_float_tensor("logits", logits, ndim=2)
    if logits.shape[1] != width:
        raise ValueError(
            f"logits must have shape [T, {width}] (num_experts + num_zero_experts), got {tuple(logits.shape)}"
        )


def _check_bias(bias, has_bias: bool, width: int, device: torch.device) -> None:
    if has_bias and bias is None:
        raise ValueError("bias: the config has has_correction_bias=True, so route() needs bias=[E] tensor")
    if not has_bias and bias is not None:
        raise ValueError("bias: the config has has_correction_bias=False, but a bias tensor was given")
    if bias is not None:
        _check_float_tensor("bias", bias, shape=(width,))
        _check_same_device("bias", bias, device)
        _check_values_on_cpu("bias", bias)


def _check_expert_scale(expert_scale, has_scale: bool, num_experts: int, device: torch.device) -> None:
    if has_scale and expert_scale is None:
        raise ValueError("expert_scale: the config has has_expert_scale=True, so route() needs expert_scale=[E]")
    if not has_scale and expert_scale is not None:
        raise ValueError("expert_scale: the config has has_expert_scale=False, but expert_scale was given")
    if expert_scale is not None:
        _check_float_tensor("expert_scale", expert_scale, shape=(num_experts,))
        _check_same_device("expert_scale", expert_scale, device)
        _check_values_on_cpu("expert_scale", expert_scale, nonnegative=True)


def _check_values_on_cpu(name: str, t: torch.Tensor, nonnegative: bool = False) -> None:
    """A CPU vector's values (free to read); a device tensor is never read on the host (no sync, CUDA-graph safe:
    a trainer updates its bias in place every step), nor a traced one. A NaN or +inf bias would win every row for
    its expert whatever the logit; a negative or non-finite expert_scale breaks "weights finite and >= 0"."""
    if t.device.type != "cpu" or torch.compiler.is_compiling():
        return
    v = t.detach().float()
    bad = ~torch.isfinite(v)
    if nonnegative:
        bad |= v < 0
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        need = "finite and >= 0" if nonnegative else "finite"
        raise ValueError(f"{name}[{i}] = {float(v[i])}: {name} must be {need} (a CPU tensor is checked on every call; "
                         "a device tensor is not read)")


def _check_num_valid_tokens(num_valid_tokens, num_tokens: int, device: torch.device) -> None:
    if num_valid_tokens is None:
        return
    if isinstance(num_valid_tokens, torch.Tensor):
        if num_valid_tokens.numel() != 1 or num_valid_tokens.dtype not in INT_DTYPES:
            # A wrong dtype is a TypeError (docs/contract.md, "Errors"), a wrong size a ValueError.
            error = ValueError if num_valid_tokens.dtype in INT_DTYPES else TypeError
            raise error(
                "num_valid_tokens must be an int or a one-element integer tensor, got a tensor of "
                f"shape {tuple(num_valid_tokens.shape)} and dtype {num_valid_tokens.dtype}"
            )
        _check_same_device("num_valid_tokens", num_valid_tokens, device)
        if num_valid_tokens.device.type == "cpu" and not torch.compiler.is_compiling():
            # Free to read on the CPU; a device tensor is never read on the host (no sync, CUDA-graph safe).
            _check_int("num_valid_tokens", int(num_valid_tokens.reshape(())), 0, num_tokens)
        return
    _check_int("num_valid_tokens", num_valid_tokens, 0, num_tokens)


def _check_home_rank(home_rank, ep_size: int) -> None:
    if isinstance(home_rank, bool) or not isinstance(home_rank, int):
        raise TypeError(f"home_rank must be an int, got {home_rank!r}")
    if not 0 <= home_rank < ep_size:
        raise ValueError(f"home_rank must be in [0, ep_size={ep_size}), got {home_rank}")


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """[first, last + 1) bytes that a tensor's elements span (strides are never negative in torch)."""
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))
    first = t.data_ptr()
    return first, first + (last + 1) * t.element_size()


def _check_out(out, num_tokens: int, width: int, device: torch.device) -> None:
    """out: a (weights float32, ids int32) pair of contiguous [T, K + C] tensors on the logits' device (whether they
    share memory with each other or an input: _check_no_aliasing)."""
    if out is None:
        return
    if not isinstance(out, (tuple, list)):
        raise TypeError(f"out must be a (weights, ids) pair of tensors, got {type(out).__name__}")
    if len(out) != 2:
        raise ValueError(f"out must be a (weights, ids) pair of tensors, got {len(out)} items")
    weights, ids = out
    for name, t, dtype in (("out[0] (weights)", weights, torch.float32), ("out[1] (ids)", ids, torch.int32)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != dtype:
            raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")
        if tuple(t.shape) != (num_tokens, width):
            raise ValueError(f"{name} must have shape {(num_tokens, width)}, got {tuple(t.shape)}")
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, but logits are on {device}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")


def _check_no_aliasing(written, read) -> None:
    """No buffer a launch writes shares memory with another it writes or with one it reads: the kernel writes rows
    while other programs still read theirs (the reference reads everything first, so only the kernel would go
    wrong). ``written`` / ``read``: (name, tensor or None) pairs. Under torch.compile's tracing the tensors have no
    memory (their data pointers cannot be traced): not checked there (the compiled call checks them at run time)."""
    if torch.compiler.is_compiling():
        return
    # Each tensor's byte range once (this runs on every route() call: host time a launch), and no data pointer read
    # where nothing is written (make_fx's fake tensors and functorch's wrappers have none: route(logits, config)).
    written = [(n, t.device, *_byte_range(t)) for n, t in written if isinstance(t, torch.Tensor) and t.numel()]
    if not written:
        return
    read = [(n, t.device, *_byte_range(t)) for n, t in read if isinstance(t, torch.Tensor) and t.numel()]
    for i, (name, device, lo, hi) in enumerate(written):
        for other, device_u, lo_u, hi_u in written[i + 1:] + read:
            if lo < hi_u and lo_u < hi and device == device_u:
                raise ValueError(f"{name} overlaps {other} in memory; each output needs a buffer of its own")


def _check_token_ids(token_ids, num_tokens: int, device: torch.device) -> None:
    if token_ids is None:
        raise ValueError("token_ids: routing='hash' needs token_ids=[T] integer tensor")
    if not isinstance(token_ids, torch.Tensor) or token_ids.dtype not in INT_DTYPES:
        raise TypeError(f"token_ids must be an integer tensor, got {getattr(token_ids, 'dtype', type(token_ids))}")
    if tuple(token_ids.shape) != (num_tokens,):
        raise ValueError(f"token_ids must have shape ({num_tokens},), got {tuple(token_ids.shape)}")
    _check_same_device("token_ids", token_ids, device)


def _check_token_range(token_ids: torch.Tensor, vocab: int, num_valid_tokens) -> None:
    """Live rows' token ids index the hash table. Checked only for CPU tensors: on a GPU it would synchronise
    (there, such a row is written as padding)."""
    if token_ids.device.type != "cpu" or token_ids.numel() == 0:
        return
    if torch.compiler.is_compiling():  # data-dependent: not in a traced graph
        return
    live = token_ids
    if num_valid_tokens is not None:
        n = int(num_valid_tokens.reshape(-1)[0]) if isinstance(num_valid_tokens, torch.Tensor) else num_valid_tokens
        live = token_ids[: max(n, 0)]
    bad = (live < 0) | (live >= vocab)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ValueError(f"token_ids[{row}] = {int(live[row])} is outside the hash table's rows [0, {vocab})")


# Tables already validated, so that a CUDA table is copied to the host once, not on every call. Keyed by the
# tensor that owns the memory (a view's _base: engines pass tables[layer], a new view each call) and the view's
# place in it; the weak reference tells a live owner from a new one that reuses a dead one's id, and the version
# counter, which views share with their base, says whether the table was written in place since.
_CHECKED_TABLES: dict[tuple, tuple[weakref.ref, int]] = {}


def _table_key(hash_table: torch.Tensor, num_experts: int) -> tuple[tuple, torch.Tensor]:
    owner = hash_table if hash_table._base is None else hash_table._base
    key = (id(owner), hash_table.data_ptr(), tuple(hash_table.shape), hash_table.stride(), hash_table.dtype,
           num_experts)
    return key, owner


def _check_hash_table(hash_table, num_experts: int, top_k: int, device: torch.device) -> None:
    """hash_table: [vocab, K] integer tensor of logical ids, distinct within a row."""
    if hash_table is None:
        raise ValueError("hash_table: routing='hash' needs hash_table=[vocab, K] integer tensor")
    if not isinstance(hash_table, torch.Tensor) or hash_table.dtype not in INT_DTYPES:
        raise TypeError(f"hash_table must be an integer tensor, got {getattr(hash_table, 'dtype', type(hash_table))}")
    if hash_table.dim() != 2 or hash_table.shape[1] != top_k or hash_table.shape[0] < 1:
        raise ValueError(f"hash_table must have shape [vocab >= 1, top_k={top_k}], got {tuple(hash_table.shape)}")
    _check_same_device("hash_table", hash_table, device)
    if torch.compiler.is_compiling():
        # A traced graph has no table contents to read (nor data pointers to key the cache on): under torch.compile
        # the fused op checks the table when the graph runs (kernels.router._route_op).
        return
    cached = _checks_once(hash_table)
    if cached:
        key, owner = _table_key(hash_table, num_experts)
        seen = _CHECKED_TABLES.get(key)
        version = _version_of(hash_table)
        if seen is not None and seen[0]() is owner and seen[1] == version:
            return
    if hash_table.is_cuda and torch.cuda.is_current_stream_capturing():
        raise ValueError("hash_table: a CUDA table is checked on the host the first time route() sees it (and after "
                         "an in-place write), which cannot run while a CUDA graph is captured: call route() once "
                         "with this table (or the stacked tables' views) before capturing")
    table = hash_table.detach().to("cpu", torch.int64)
    bad = (table < 0) | (table >= num_experts)
    if bool(bad.any()):
        row, col = (int(v) for v in bad.nonzero()[0])
        raise ValueError(
            f"hash_table[{row}, {col}] = {int(table[row, col])} is outside [0, num_experts={num_experts})"
        )
    ordered = table.sort(dim=1).values
    repeats = ordered[:, 1:] == ordered[:, :-1]
    if bool(repeats.any()):
        row = int(repeats.nonzero()[0, 0])
        raise ValueError(f"hash_table row {row} repeats an expert: {table[row].tolist()}")
    if cached:
        for dead in [k for k, (ref, _v) in _CHECKED_TABLES.items() if ref() is None]:
            del _CHECKED_TABLES[dead]
        _CHECKED_TABLES[key] = (weakref.ref(owner), version)


def _checks_once(hash_table: torch.Tensor) -> bool:
    """Whether a table's check is cached (until an in-place write that its version counter sees): CUDA tables only,
    whose check copies the table to the host. A CPU table is checked on every call, so no write goes unseen (numpy's
    shared memory, ``.data``, an inference tensor have no version the cache could watch)."""
    return hash_table.is_cuda


def _version_of(tensor: torch.Tensor) -> int:
    """torch's in-place write counter of a tensor; 0 for an inference tensor (made under torch.inference_mode(),
    as engines load their models), which has none: its in-place writes are not seen."""
    return 0 if tensor.is_inference() else tensor._version


def _check_placement_table(physical_to_logical: Iterable[int], num_experts: int) -> tuple[int, ...]:
    if isinstance(physical_to_logical, torch.Tensor):  # an EPLB solver's output, on any device
        if physical_to_logical.dtype not in INT_DTYPES:
            raise TypeError("physical_to_logical must be a 1-D integer tensor or a sequence of ints, got a tensor of "
                            f"dtype {physical_to_logical.dtype}")
        if physical_to_logical.dim() != 1:
            raise ValueError("physical_to_logical must be a 1-D integer tensor or a sequence of ints, got a tensor of "
                             f"shape {tuple(physical_to_logical.shape)}")
        physical_to_logical = physical_to_logical.tolist()
    if getattr(physical_to_logical, "ndim", 1) != 1:  # a numpy array
        raise ValueError(f"physical_to_logical must be 1-D, got shape {physical_to_logical.shape}")
    table = tuple(physical_to_logical)
    if not table:
        raise ValueError("physical_to_logical must name at least one slot, got an empty table")
    ints = []
    for slot, value in enumerate(table):
        # Python ints and numpy integers (what EPLB solvers return); not bools or floats.
        try:
            expert = operator.index(value) if not isinstance(value, bool) else None
        except TypeError:
            expert = None
        if expert is None:
            raise TypeError(f"physical_to_logical[{slot}] must be an int, got {value!r}")
        if not 0 <= expert < num_experts:
            raise ValueError(
                f"physical_to_logical[{slot}] = {expert} is outside [0, num_experts={num_experts})"
            )
        ints.append(expert)
    table = tuple(ints)
    missing = sorted(set(range(num_experts)) - set(table))
    if missing:
        raise ValueError(
            f"physical_to_logical must place every logical expert at least once; missing {missing[:8]}"
            + (" ..." if len(missing) > 8 else "")
        )
    return table


def _needs_grad(*tensors) -> bool:
    """Whether autograd differentiates through any of these inputs here (grad mode on, a tensor that requires grad):
    the fused op has no backward, so route(backend="auto") takes the reference then and backend="triton" raises."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)
