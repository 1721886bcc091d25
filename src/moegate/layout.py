"""ExpertLayout and ExpertPlacement: where one deployment puts the routed and shared ids.

Id spaces (docs/contract.md steps 9-10), with P physical routed slots, L = P / ep_size per rank, rank-major:

- shared_slots="none":     routed ids in [0, P); no shared columns.
- shared_slots="global":   routed ids in [0, P); shared column j holds P + j. Id space P + S.
- shared_slots="per_rank": rank r owns ids [r * (L + S), (r + 1) * (L + S)): L routed slots, then S shared.
                           Routed physical p becomes p + (p // L) * S; shared j of home rank r is
                           r * (L + S) + L + j. Id space ep_size * (L + S).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from moegate._checks import _check_choice, _check_int, _check_placement_table

SHARED_SLOTS = ("none", "global", "per_rank")
SCALE_MODES = ("in_weights", "on_output")
REPLICA_POLICIES = ("round_robin", "home_rank", "first")


@dataclass(frozen=True)
class ExpertPlacement:
    """EPLB placement: physical routed slot -> logical expert, rank-major, replicas allowed.

    Parameters
    ----------
    physical_to_logical : sequence of int (numpy integers too) or a 1-D integer tensor, length P
        ``physical_to_logical[p]`` is the logical expert that physical slot p holds. Slot p lives on rank
        ``p // (P / ep_size)``. Every logical expert in [0, num_experts) appears at least once.
    num_experts : int
        E, the number of logical experts.
    """

    physical_to_logical: tuple[int, ...]
    num_experts: int
    _tables: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)
    _replicas: tuple = field(default=(), init=False, repr=False, compare=False, hash=False)
    _max_replicas: int = field(default=1, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        _check_int("num_experts", self.num_experts, 1)
        table = _check_placement_table(self.physical_to_logical, self.num_experts)
        object.__setattr__(self, "physical_to_logical", table)
        out: list[list[int]] = [[] for _ in range(self.num_experts)]
        for slot, expert in enumerate(table):
            out[expert].append(slot)
        # Once, not on every route(): a Python loop over P slots cost ~100 us a call (P = 288).
        object.__setattr__(self, "_replicas", tuple(tuple(r) for r in out))
        object.__setattr__(self, "_max_replicas", max(len(r) for r in out))

    @classmethod
    def from_tensor(cls, physical_to_logical: torch.Tensor, num_experts: int) -> ExpertPlacement:
        """The placement of a 1-D integer tensor (an EPLB's physical_to_logical map), checked as the constructor
        checks it: a float or bool tensor is a TypeError, a 2-D one a ValueError, never truncated into another
        placement."""
        return cls(physical_to_logical, num_experts)

    @property
    def num_physical(self) -> int:
        """P, physical routed slots."""
        return len(self.physical_to_logical)

    @property
    def replicas(self) -> tuple[tuple[int, ...], ...]:
        """``replicas[e]``: the physical slots of logical expert e, ascending."""
        return self._replicas

    @property
    def max_replicas(self) -> int:
        return self._max_replicas

    def tables(self, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Device tensors, built once per device.

        Returns ``(physical_to_logical [P], logical_to_physical [E, R] padded with -1, replica_count [E])``,
        all int32, R = max_replicas.
        """
        device = torch.device(device)
        key = str(device)
        if key not in self._tables:
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise ValueError("placement: its device tables are built (copied to the GPU) the first time route() "
                                 "uses it on a device, which cannot run while a CUDA graph is captured: call route() "
                                 "once with this layout before capturing")
            replicas = self.replicas
            l2p = torch.full((self.num_experts, self.max_replicas), -1, dtype=torch.int32)
            for e, slots in enumerate(replicas):
                l2p[e, : len(slots)] = torch.tensor(slots, dtype=torch.int32)
            count = torch.tensor([len(r) for r in replicas], dtype=torch.int32)
            p2l = torch.tensor(self.physical_to_logical, dtype=torch.int32)
            self._tables[key] = (p2l.to(device), l2p.to(device), count.to(device))
        return self._tables[key]


@dataclass(frozen=True)
class ExpertLayout:
    """How one deployment consumes the routing. The default: no fusion, one rank, no placement, rsf in
    the weights.

    Parameters
    ----------
    shared_slots : {"none", "global", "per_rank"}
        Where the model's S shared experts get columns (see the module docstring for the id spaces).
    ep_size : int
        Expert-parallel ranks (>= 1). P must be divisible by it when > 1.
    placement : ExpertPlacement or None
        Physical slots with replicas; None means P = E and physical = logical.
    replica_policy : {"round_robin", "home_rank", "first"}
        Which replica a logical expert with several takes, deterministically: "round_robin" takes
        replica ``t % count`` for token t; "home_rank" the first replica on the token's home rank, else
        round robin; "first" always the lowest slot.
    scale : {"in_weights", "on_output"}
        rsf folded into the routed weights, or left for the caller to apply to the MoE output once.
    """

    shared_slots: str = "none"
    ep_size: int = 1
    placement: ExpertPlacement | None = None
    replica_policy: str = "round_robin"
    scale: str = "in_weights"

    def __post_init__(self) -> None:
        _check_choice("shared_slots", self.shared_slots, SHARED_SLOTS)
        _check_choice("replica_policy", self.replica_policy, REPLICA_POLICIES)
        _check_choice("scale", self.scale, SCALE_MODES)
        _check_int("ep_size", self.ep_size, 1)
        if self.placement is not None and not isinstance(self.placement, ExpertPlacement):
            raise TypeError(f"placement must be an ExpertPlacement or None, got {type(self.placement).__name__}")
        if self.placement is not None and self.placement.num_physical % self.ep_size:
            raise ValueError(
                f"placement has P={self.placement.num_physical} physical slots, not divisible by "
                f"ep_size={self.ep_size}"
            )

    @property
    def is_default(self) -> bool:
        return self == ExpertLayout()

    def num_physical(self, num_experts: int) -> int:
        """P for a model of E routed experts."""
        return num_experts if self.placement is None else self.placement.num_physical

    def slots_per_rank(self, num_experts: int) -> int:
        """L = P / ep_size."""
        return self.num_physical(num_experts) // self.ep_size

    def num_shared_columns(self, num_shared: int) -> int:
        return 0 if self.shared_slots == "none" else num_shared

    def id_space(self, num_experts: int, num_shared: int) -> int:
        """Ids of this layout lie in [0, id_space)."""
        P = self.num_physical(num_experts)
        if self.shared_slots == "global":
            return P + num_shared
        if self.shared_slots == "per_rank":
            return self.ep_size * (P // self.ep_size + num_shared)
        return P


def _check_layout_for(layout: ExpertLayout, config) -> None:
    """The layout fits the model: P divisible by ep_size, placement over the right E."""
    E = config.num_experts
    P = layout.num_physical(E)
    if layout.placement is not None and layout.placement.num_experts != E:
        raise ValueError(
            f"placement covers num_experts={layout.placement.num_experts}, but the config has num_experts={E}"
        )
    if layout.ep_size > 1 and P % layout.ep_size:
        raise ValueError(f"P={P} physical routed slots must be divisible by ep_size={layout.ep_size}")
    if config.num_zero_experts and (
        layout.placement is not None or layout.ep_size > 1 or layout.num_shared_columns(config.num_shared_experts)
    ):
        raise ValueError(
            f"num_zero_experts={config.num_zero_experts} needs a layout without placement, on one rank (ep_size=1) "
            f"and without shared columns (shared_slots='none' or num_shared_experts=0), got {layout}"
        )
