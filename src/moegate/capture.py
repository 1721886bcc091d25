"""RoutingRecorder: routed-only, logical expert ids per layer, for replay (docs/contract.md step 12)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from moegate._checks import INT_DTYPES, _check_int

RECORD_DTYPES = (torch.int16, torch.int32)


class RoutingRecorder:
    """A preallocated buffer ``ids [num_layers, max_tokens, top_k]`` of logical routed ids.

    ``route(..., recorder=rec, layer=i)`` writes the batch's logical routed ids (before placement, never
    the shared columns) into ``ids[i, :T]``; padded rows are written as -1. The buffer is allocated once,
    here, so recording is CUDA-graph safe; a batch with more than ``max_tokens`` rows raises ValueError
    before anything runs. ``num_tokens[i]`` holds the T of the last batch recorded at layer i
    (-1: never recorded).

    Parameters
    ----------
    num_layers, max_tokens, top_k : int
        Buffer shape. ``top_k`` is the routed K; shared experts are never recorded.
    num_experts : int
        E, kept as metadata so that a saved file can be checked on its own.
    dtype : torch.int16 or torch.int32
        int16 holds ids up to 32767.
    device : torch device of the buffer; must be the device of the logits routed into it.
    """

    def __init__(
        self,
        num_layers: int,
        max_tokens: int,
        top_k: int,
        num_experts: int,
        *,
        dtype: torch.dtype = torch.int32,
        device: torch.device | str = "cpu",
    ) -> None:
        _check_int("num_layers", num_layers, 1)
        _check_int("max_tokens", max_tokens, 0)
        _check_int("top_k", top_k, 1)
        _check_int("num_experts", num_experts, 1)
        if dtype not in RECORD_DTYPES:
            raise TypeError(f"dtype must be torch.int16 or torch.int32, got {dtype}")
        if dtype == torch.int16 and num_experts > 32768:  # ids 0 .. num_experts - 1
            raise ValueError(f"num_experts={num_experts} does not fit int16 ids (up to 32767); use dtype=torch.int32")
        self.num_experts = num_experts
        self.ids = torch.full((num_layers, max_tokens, top_k), -1, dtype=dtype, device=device)
        self.num_tokens = torch.full((num_layers,), -1, dtype=torch.int64, device=device)

    @property
    def num_layers(self) -> int:
        return self.ids.shape[0]

    @property
    def max_tokens(self) -> int:
        return self.ids.shape[1]

    @property
    def top_k(self) -> int:
        return self.ids.shape[2]

    def check_batch(self, layer: int, num_tokens: int, top_k: int, num_ids: int, device: torch.device) -> None:
        """Raise ValueError unless a [num_tokens, top_k] batch of ids in [0, num_ids) on ``device`` fits
        ``layer``: an id is never silently wrapped, nor recorded past the recorder's num_experts. That is an upper
        bound, not the routing's own E: a recorder for a model whose layers route different expert counts
        (HunYuan-MoE-V1's per-layer num_experts) is made for the largest. ``moegate check`` reads a saved file against
        its metadata's num_experts unless given the model's config (then its load figures are over the model's E)."""
        _check_int("layer", layer, 0, self.num_layers - 1)
        if top_k != self.top_k:
            raise ValueError(f"recorder has top_k={self.top_k}, but the config routes top_k={top_k}")
        if num_ids > self.num_experts:
            raise ValueError(
                f"recorder was made for num_experts={self.num_experts}, but the config routes ids up to "
                f"{num_ids - 1} (num_experts + num_zero_experts = {num_ids})"
            )
        if num_ids - 1 > torch.iinfo(self.ids.dtype).max:  # a loaded file may pair int16 with a wide model
            raise ValueError(f"recorder holds {self.ids.dtype} ids, which cannot hold id {num_ids - 1}; "
                             "use dtype=torch.int32")
        if num_tokens > self.max_tokens:
            raise ValueError(
                f"recorder holds max_tokens={self.max_tokens} rows, but the batch has T={num_tokens}; "
                "allocate the recorder for the largest batch"
            )
        if self.ids.device != device:
            raise ValueError(f"recorder is on {self.ids.device}, but logits are on {device}")

    def record(self, layer: int, ids: torch.Tensor) -> None:
        """Write logical routed ids [T, K] (padded rows already -1) at ``layer``. No host sync: the shape, dtype and
        device are checked (ValueError), never broadcast; the values are the caller's to vouch for (route() writes
        its own ids here) except on the CPU, where they are read too: ids in [-1, num_experts) that the buffer's
        dtype holds, never wrapped."""
        _check_int("layer", layer, 0, self.num_layers - 1)
        if not isinstance(ids, torch.Tensor) or ids.dtype not in INT_DTYPES:
            raise TypeError(f"ids must be an integer tensor [T, K], got "
                            f"{type(ids).__name__ if not isinstance(ids, torch.Tensor) else ids.dtype}")
        if ids.dim() != 2:
            raise ValueError(f"ids must be an integer tensor [T, K], got shape {tuple(ids.shape)}")
        if ids.shape[1] != self.top_k:
            raise ValueError(f"recorder has top_k={self.top_k}, but ids are [T, {ids.shape[1]}]")
        if ids.shape[0] > self.max_tokens:
            raise ValueError(f"recorder holds max_tokens={self.max_tokens} rows, but ids have T={ids.shape[0]}")
        if ids.device != self.ids.device:
            raise ValueError(f"recorder is on {self.ids.device}, but ids are on {ids.device}")
        if ids.device.type == "cpu" and ids.numel():
            lo, hi = int(ids.min()), int(ids.max())
            if lo < -1 or hi >= self.num_experts:
                raise ValueError(f"ids must be in [-1, num_experts={self.num_experts}) (-1: padding), got "
                                 f"[{lo}, {hi}]")
            if hi > torch.iinfo(self.ids.dtype).max:  # a loaded file may pair int16 with a wide model
                raise ValueError(f"recorder holds {self.ids.dtype} ids, which cannot hold id {hi}")
        T = ids.shape[0]
        self.ids[layer, :T].copy_(ids)
        self.num_tokens[layer].fill_(T)

    def layer_ids(self, layer: int) -> torch.Tensor:
        """The ids [T, K] last recorded at ``layer`` (reads num_tokens on the host)."""
        return self.ids[layer, : max(int(self.num_tokens[layer]), 0)]

    def replay(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Inputs that route a batch again to the experts recorded at ``layer`` (routing replay: the recorded
        experts, the weights from the replaying forward's logits).

        Returns ``(hash_table [T, K] int64, token_ids [T] int64, num_valid_tokens)`` on the recorder's device,
        T the batch recorded there. ``route(logits, config.replace(routing="hash"), layout, hash_table=...,
        token_ids=..., num_valid_tokens=...)`` then chooses the recorded ids in their recorded column order and
        runs steps 6-12 on them: on the logits that were recorded, the ids of the recorded call and its weights
        (bit for bit on the reference backend; the kernel sums a row in another order where it keeps the winners'
        scores in registers, within its 1e-6). Padded rows (recorded -1, the trailing rows) get ids 0 .. K - 1
        in the table and stay padding through ``num_valid_tokens``. Zero-computation experts (ids >= E) cannot
        be replayed (a hash table holds ids in [0, E): route() raises). Reads the layer on the host."""
        _check_int("layer", layer, 0, self.num_layers - 1)
        T = int(self.num_tokens[layer])
        if T < 0:
            raise ValueError(f"layer {layer} was never recorded")
        ids = self.ids[layer, :T].to(torch.int64)
        padded = (ids == -1).all(dim=1)
        num_valid = int((~padded).sum())
        if bool(padded[:num_valid].any()) or bool((ids[:num_valid] < 0).any()):
            raise ValueError(f"layer {layer}: padded rows must come last and be all -1 (a capture route() wrote)")
        table = ids.clone()
        table[num_valid:] = torch.arange(self.top_k, device=ids.device)
        if T == 0:  # a table has at least one row; no token reads it
            table = torch.arange(self.top_k, device=ids.device)[None]
        return table, torch.arange(T, device=ids.device), num_valid

    def save(self, path: str | Path) -> None:
        """Write a .safetensors file: tensors ``ids``, ``num_tokens``; metadata ``num_experts``, ``top_k``.

        Rows at and past a layer's ``num_tokens`` are written as -1 (the buffer keeps an earlier, larger batch's
        ids there), so a reader of the ``ids`` tensor alone sees no stale ids."""
        from safetensors.torch import save_file

        ids, num_tokens = self.ids.cpu().clone(), self.num_tokens.cpu()
        rows = torch.arange(ids.shape[1])
        ids[rows[None, :] >= num_tokens.clamp(min=0)[:, None]] = -1
        meta = {"format": "moegate.routing/1", "num_experts": str(self.num_experts), "top_k": str(self.top_k)}
        save_file({"ids": ids.contiguous(), "num_tokens": num_tokens}, str(path), meta)

    @classmethod
    def load(cls, path: str | Path, device: torch.device | str = "cpu", *, validate: bool = True) -> RoutingRecorder:
        """Read a file written by ``save``. Raises ValueError on a file that is not a moegate capture: its tensors'
        shapes and dtypes, its metadata, and (``validate``) each recorded row, which must be all -1 (padding, the
        batch's last rows only) or K distinct ids in [0, num_experts). ``moegate check`` loads with ``validate=False``
        and lists every bad row instead."""
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                names = set(f.keys())
                tensors = {name: f.get_tensor(name) for name in names}
        except Exception as exc:  # safetensors raises its own error types for corrupt headers
            raise ValueError(f"{path}: not a readable safetensors file ({exc})") from exc
        if meta.get("format") != "moegate.routing/1" or not {"ids", "num_tokens"} <= names:
            raise ValueError(f"{path}: not a moegate routing capture (metadata {json.dumps(meta)})")
        ids, num_tokens = tensors["ids"], tensors["num_tokens"]
        if ids.dim() != 3 or ids.dtype not in RECORD_DTYPES or num_tokens.shape != (ids.shape[0],) \
                or num_tokens.dtype not in INT_DTYPES or ids.shape[0] < 1 \
                or ids.shape[2] < 1:
            raise ValueError(
                f"{path}: ids must be [layers >= 1, max_tokens, top_k >= 1] int16/int32 and num_tokens [layers] of "
                f"integers, got {tuple(ids.shape)} {ids.dtype} and {tuple(num_tokens.shape)} {num_tokens.dtype}"
            )
        try:
            num_experts = int(meta["num_experts"])
        except (KeyError, ValueError):
            raise ValueError(f"{path}: metadata num_experts missing or not an int ({json.dumps(meta)})") from None
        if num_experts < 1:
            raise ValueError(f"{path}: metadata num_experts={num_experts}, must be >= 1")
        if "top_k" in meta and meta["top_k"] != str(ids.shape[2]):
            raise ValueError(f"{path}: metadata top_k={meta['top_k']!r}, but the ids are {ids.shape[2]} wide")
        bad = (num_tokens < -1) | (num_tokens > ids.shape[1])
        if bool(bad.any()):
            layer = int(bad.nonzero()[0, 0])
            raise ValueError(f"{path}: layer {layer} has num_tokens={int(num_tokens[layer])}, outside [-1, "
                             f"max_tokens={ids.shape[1]}] (-1: never recorded)")
        if validate:
            found = _Found(1)
            for layer, n in enumerate(num_tokens.tolist()):
                if n > 0:
                    _capture_row_violations(ids[layer, :n].long(), num_experts, layer, found)
                    if found.count:
                        raise ValueError(f"{path}: {found.messages[0]} (num_experts={num_experts})")
        rec = cls.__new__(cls)
        rec.num_experts = num_experts
        rec.ids = ids.to(device)
        rec.num_tokens = num_tokens.to(device=device, dtype=torch.int64)
        return rec


class _Found:
    """Counts every violation; words only for the first ``limit`` (a bad file can break millions of rows)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.count, self.messages = limit, 0, []

    def add(self, message: str) -> None:
        if len(self.messages) < self.limit:
            self.messages.append(message)
        self.count += 1

    def add_each(self, positions: torch.Tensor, message) -> None:
        """One violation per row of ``positions`` (from nonzero()); ``message(*position)`` words one."""
        room = max(self.limit - len(self.messages), 0)
        self.messages += [message(*p) for p in positions[:room].tolist()]
        self.count += positions.shape[0]


def _capture_row_violations(ids: torch.Tensor, num_experts: int, layer: int, found: _Found) -> None:
    """ids [T, K] int64: each row all -1 (padding) or K distinct ids in [0, E); padding only at the end."""
    is_pad = ids == -1  # [T, K]
    padded = is_pad.all(dim=1)  # [T]
    mixed = is_pad.any(dim=1) & ~padded  # [T]
    found.add_each(torch.nonzero(mixed), lambda t: f"layer {layer}, row {t}: a padded row must be all -1, "
                                                   f"got {ids[t].tolist()}")
    out = ~padded.unsqueeze(1) & ~is_pad & ((ids < 0) | (ids >= num_experts))  # [T, K]
    found.add_each(torch.nonzero(out), lambda t, k: f"layer {layer}, row {t}, column {k}: id {int(ids[t, k])} "
                                                    f"is outside [0, {num_experts})")
    live = ~is_pad.any(dim=1)  # [T]
    if bool(padded.any()):
        first_pad = int(torch.nonzero(padded)[0, 0])
        later_live = torch.nonzero(live[first_pad:]).flatten()
        if later_live.numel():
            row = first_pad + int(later_live[0])
            found.add(f"layer {layer}, row {row}: a live row after the padded row {first_pad}: padding must be the "
                      "last rows of the batch (rows >= num_valid_tokens)")
    ordered = ids.sort(dim=1).values  # [T, K]
    dup = ((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] != -1)).any(dim=1) & ~padded  # [T]
    found.add_each(torch.nonzero(dup), lambda t: f"layer {layer}, row {t}: an expert repeats within the row: "
                                                 f"{ids[t].tolist()}")
