"""Where each parameter's values live on this process: the whole tensor, or an FSDP2 shard.

A DiLoCo member may train on several processes (``[trainer] procs`` > 1: torchrun ranks that
shard the policy with FSDP2, ``node/training/policy.py``). Then every parameter is a
``DTensor`` split along dim 0 across the ranks (``Shard(0)``, ``torch.chunk``'s rows: rank r
holds rows ``[lo, hi)``, possibly none). The outer step is elementwise, so each rank keeps
the outer copy ``θ`` and the momentum ``b`` of its own rows only and steps them alone; what
leaves or enters the member is whole: the flat pseudo-gradient (gathered, every rank joins
the collective), the group's average (every rank takes its rows of it), parameter hashes,
the momentum file and the packed state (gathered, and on loading cut to the rank's rows).

``ParamShards.of(model)`` reads the layout once. For a model that is not sharded every map
is the identity, so one code path serves a member in one process and one over N ranks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Slot:
    """One parameter: its whole shape, and this rank's rows of it (all of them unsharded)."""

    shape: torch.Size
    lo: int
    hi: int
    sharded: Any = None  # the DTensor parameter when sharded (its mesh and placements)

    @property
    def numel(self) -> int:
        return self.shape.numel()


def _is_dtensor(t: Any) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch built without distributed
        return False
    return isinstance(t, DTensor)


def _rows(p: Any) -> tuple[int, int]:
    """Rank r's rows of a ``Shard(0)`` DTensor: ``torch.chunk``'s r-th chunk of dim 0."""
    from torch.distributed.tensor import Shard

    placements = tuple(p.placements)
    if len(placements) != 1 or not isinstance(placements[0], Shard) or placements[0].dim != 0:
        raise ValueError(f"a parameter sharded as {placements}: only Shard(0) is supported")
    mesh = p.device_mesh
    world, rank = mesh.size(), mesh.get_local_rank()
    n = p.shape[0]
    step = -(-n // world)  # torch.chunk: chunks of ceil(n / world) rows, the last shorter
    lo, hi = min(rank * step, n), min((rank + 1) * step, n)
    local = p.to_local()
    if local.shape[0] != hi - lo or tuple(local.shape[1:]) != tuple(p.shape[1:]):
        raise ValueError(
            f"rank {rank}'s shard is {tuple(local.shape)}, not rows {lo}:{hi} of {tuple(p.shape)}"
        )
    return lo, hi


@dataclass(frozen=True)
class ParamShards:
    slots: list[Slot]

    @classmethod
    def of(cls, model: torch.nn.Module) -> ParamShards:
        slots = []
        for p in model.parameters():
            if _is_dtensor(p):
                lo, hi = _rows(p)
                slots.append(Slot(p.shape, lo, hi, p))
            else:
                slots.append(Slot(p.shape, 0, p.shape[0] if p.dim() else 1))
        return cls(slots)

    @property
    def numel(self) -> int:
        """Values of the whole parameters (what a pseudo-gradient holds)."""
        return sum(s.numel for s in self.slots)

    @staticmethod
    def local(t: Any) -> torch.Tensor:
        """This rank's values of a parameter or of optimizer state shaped like one."""
        mine: torch.Tensor = t.to_local() if _is_dtensor(t) else t
        return mine

    def whole(self, i: int, local: torch.Tensor) -> torch.Tensor:
        """Parameter ``i``'s whole tensor from every rank's ``local`` rows (a collective
        when sharded: every rank calls, in the same order)."""
        if self.slots[i].sharded is None:
            return local
        full: torch.Tensor = self.spread(i, local).full_tensor()
        return full

    def part(self, i: int, whole: torch.Tensor) -> torch.Tensor:
        """This rank's rows of parameter ``i``'s ``whole`` tensor."""
        slot = self.slots[i]
        if slot.sharded is None:
            return whole
        return whole[slot.lo : slot.hi]

    def spread(self, i: int, local: torch.Tensor) -> Any:
        """``local`` rows as a tensor shaped and sharded like parameter ``i`` (a DTensor
        when sharded: optimizer state, or the pieces ``whole`` gathers)."""
        slot = self.slots[i]
        if slot.sharded is None:
            return local
        from torch.distributed.tensor import DTensor

        p = slot.sharded
        return DTensor.from_local(
            local, p.device_mesh, p.placements, shape=p.shape, stride=p.stride()
        )

    def wholes(self, locals_: list[torch.Tensor]) -> Iterator[torch.Tensor]:
        """Every parameter's whole tensor from this rank's rows (collective when sharded)."""
        for i, t in enumerate(locals_):
            yield self.whole(i, t)

    def model_wholes(self, model: torch.nn.Module) -> Iterator[torch.Tensor]:
        """The model's parameters, whole (collective when sharded)."""
        for i, p in enumerate(model.parameters()):
            yield self.whole(i, self.local(p).detach())
