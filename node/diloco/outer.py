"""The DiLoCo outer step: pseudo-gradient, then Nesterov momentum on an fp32 outer copy.

DiLoCo (Douillard et al. 2023; INTELLECT-1): every member runs ``H`` inner optimizer steps
(AdamW) from the same parameters ``θ``, then the group averages the pseudo-gradients
``Δ = θ − θ_after`` and takes one outer step on ``θ`` with SGD + Nesterov momentum
(lr 0.7, momentum 0.9, the published setting), exactly as ``torch.optim.SGD(nesterov=True)``
would with ``Δ`` as the gradient:

    b ← μ·b + Δ            (b starts at 0)
    d ← Δ + μ·b
    θ ← θ − lr·d

``θ`` lives in an fp32 copy (``OuterState.params``) that every member holds identically
(the model itself may be in another dtype); after the step the model's parameters are set
from it and the inner phase starts again. The inner optimizer's state is kept across outer
steps, as PRIME does.

Group of one: when the averaged pseudo-gradient is the member's own (nobody else
contributed), the step is computed in the equal form ``θ ← θ_after + (Δ − lr·d)``. In
exact arithmetic both forms are the same number; in floating point this one makes outer lr
1 without momentum reproduce plain training bit for bit (``Δ − 1·Δ = 0``), which is the
test that the sign and scale of the pseudo-gradient are right. With several members the
first form is used, since only ``θ`` (not ``θ_after``) is the same on every member.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from node.diloco.shards import ParamShards


@dataclass(frozen=True)
class OuterConfig:
    lr: float = 0.7
    momentum: float = 0.9  # Nesterov; 0 disables momentum

    def __post_init__(self) -> None:
        if not (0 < self.lr <= 10):
            raise ValueError(f"outer lr must be in (0, 10]: {self.lr}")
        if not (0 <= self.momentum < 1):
            raise ValueError(f"outer momentum must be in [0, 1): {self.momentum}")


def flat(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """The fp32 concatenation of ``tensors`` (flattened, in order)."""
    return torch.cat([t.detach().reshape(-1).float() for t in tensors])


def layout_of(model: torch.nn.Module) -> str:
    """A hash of the parameters' names, shapes and order: members must agree on it."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(f"{name}:{tuple(p.shape)};".encode())
    return h.hexdigest()[:32]


def params_hash(tensors: Iterable[torch.Tensor]) -> str:
    """sha256 of the parameters' bytes: equal hashes mean bitwise-identical parameters."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@dataclass
class OuterState:
    """The outer copy ``θ`` (fp32), the momentum ``b``, the outer steps taken, and which
    rows of each parameter this process holds (all of them unless the model is sharded)."""

    params: list[torch.Tensor]
    momentum: list[torch.Tensor]
    step: int = 0
    cfg: OuterConfig = field(default_factory=OuterConfig)
    shards: ParamShards = field(default_factory=lambda: ParamShards([]))  # set by ``of``

    @classmethod
    def of(cls, model: torch.nn.Module, cfg: OuterConfig | None = None) -> OuterState:
        """θ from the model's parameters: of this rank's rows when the model is sharded
        (``node/diloco/shards.py``), whole otherwise."""
        shards = ParamShards.of(model)
        params = [shards.local(p).detach().float().clone() for p in model.parameters()]
        momentum = [torch.zeros_like(p) for p in params]
        return cls(params, momentum, 0, cfg or OuterConfig(), shards)

    @property
    def numel(self) -> int:
        """Values of the whole parameters (those of every rank when sharded)."""
        return self.shards.numel

    def whole_params(self) -> list[torch.Tensor]:
        """θ whole (a collective when sharded: every rank calls)."""
        return list(self.shards.wholes(self.params))

    def whole_momentum(self) -> list[torch.Tensor]:
        """b whole (a collective when sharded)."""
        return list(self.shards.wholes(self.momentum))

    def pseudo_gradient(self, model: torch.nn.Module) -> torch.Tensor:
        """``Δ = θ − θ_after`` as one flat fp32 vector (the model's parameter order), whole
        (gathered from every rank when sharded: a collective)."""
        local = ParamShards.local
        deltas = [
            o - local(p).detach().float()
            for o, p in zip(self.params, model.parameters(), strict=True)
        ]
        return flat(self.shards.wholes(deltas))

    def apply(self, model: torch.nn.Module, avg_delta: torch.Tensor, *, alone: bool) -> None:
        """One outer step with the group's averaged pseudo-gradient (flat fp32, whole); sets
        the model's parameters from the new ``θ``. ``alone``: the average is our own (see the
        module docstring). Sharded, each rank steps its own rows of θ, b and the model."""
        if avg_delta.numel() != self.numel:
            raise ValueError(f"pseudo-gradient has {avg_delta.numel()} values, not {self.numel}")
        lr, mu = self.cfg.lr, self.cfg.momentum
        offset = 0
        with torch.no_grad():
            for i, (theta, buf, param, slot) in enumerate(
                zip(self.params, self.momentum, model.parameters(), self.shards.slots, strict=True)
            ):
                size = slot.numel
                g = self.shards.part(i, avg_delta[offset : offset + size].view(slot.shape))
                offset += size
                p = ParamShards.local(param)
                buf.mul_(mu).add_(g)
                d = g + mu * buf
                if alone:
                    theta.copy_(p.detach().float() + (g - lr * d))
                else:
                    theta.sub_(lr * d)
                p.copy_(theta.to(p.dtype))
        self.step += 1
