"""One DiLoCo member's loop: ``H`` inner steps, then the group's outer step.

The inner steps run off the trio thread (``trio.to_thread.run_sync``), so the node keeps
answering heartbeats and serving ring chunks of a neighbour that is ahead. After each
outer step the model's parameters equal the outer copy ``θ``, identical on every member
(``params_hash``); ``history`` keeps one line per outer step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import trio

from node.diloco.group import DilocoGroup, Reduced
from node.diloco.outer import OuterState, layout_of, params_hash


@dataclass
class OuterRecord:
    step: int
    hash: str
    members: list[str]
    attempts: int
    received: int
    inner_s: float
    reduce_s: float
    loss: float


@dataclass
class Member:
    model: torch.nn.Module
    outer: OuterState
    group: DilocoGroup
    inner: Callable[[], float]  # one inner step; returns its loss
    inner_steps: int = 100  # H
    history: list[OuterRecord] = field(default_factory=list)

    def state_hash(self) -> str:
        return params_hash(self.outer.params)

    async def outer_step(self) -> OuterRecord:
        start_hash = self.state_hash()
        t0 = time.perf_counter()
        losses = await trio.to_thread.run_sync(self._inner_phase)
        t1 = time.perf_counter()
        delta = self.outer.pseudo_gradient(self.model)
        red: Reduced = await self.group.all_reduce(
            self.outer.step, delta, start_hash, layout_of(self.model)
        )
        t2 = time.perf_counter()
        self.outer.apply(self.model, red.average, alone=len(red.roster) == 1)
        rec = OuterRecord(
            step=self.outer.step,
            hash=self.state_hash(),
            members=red.roster,
            attempts=red.attempts,
            received=red.received,
            inner_s=t1 - t0,
            reduce_s=t2 - t1,
            loss=sum(losses) / len(losses),
        )
        self.history.append(rec)
        return rec

    def _inner_phase(self) -> list[float]:
        return [self.inner() for _ in range(self.inner_steps)]

    def status(self) -> dict[str, Any]:
        last = self.history[-1] if self.history else None
        return {"outer_step": self.outer.step, "last": last.__dict__ if last else None}
