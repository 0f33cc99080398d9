"""One DiLoCo member's loop: ``H`` inner steps, then the group's outer step.

The inner steps run off the trio thread (``trio.to_thread.run_sync``), so the node keeps
answering heartbeats and serving ring chunks of a neighbour that is ahead. After each
outer step the model's parameters equal the outer copy ``θ``, identical on every member
(``params_hash``); ``history`` keeps one line per outer step. After each outer step the
member's whole state (``node.diloco.state``) is offered to joiners and, with ``checkpoint``,
written to disk: ``restore`` continues from either.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import trio

from node.diloco.group import DilocoGroup, GroupError, Reduced
from node.diloco.outer import OuterState, layout_of, params_hash
from node.diloco.recovery import JoinRefused
from node.diloco.state import load_state, pack_state, save_checkpoint, state_hash
from node.diloco.statecast import Pulled, StateTransferError

log = logging.getLogger("intellect.diloco")


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
    state: str  # hash of the whole state after the step (what a joiner would receive)


@dataclass
class Member:
    model: torch.nn.Module
    outer: OuterState
    group: DilocoGroup
    inner: Callable[[], float]  # one inner step; returns its loss
    opt: torch.optim.Optimizer  # the inner optimizer (its state is part of ours)
    data: Any  # the data stream: its ``position`` (batches consumed) is part of our state
    inner_steps: int = 100  # H
    checkpoint: Path | None = None  # written after every outer step
    history: list[OuterRecord] = field(default_factory=list)
    recovered: Pulled | None = None  # how ``join`` got its state (SHARDCAST)
    found: set[str] = field(default_factory=set)  # the group's members ``join`` found in the DHT

    def __post_init__(self) -> None:
        self._publish()

    def packed(self) -> bytes:
        return pack_state(self.model, self.outer, self.opt, int(self.data.position))

    def _publish(self) -> bytes:
        """Offer our state at this boundary to joiners; write the checkpoint."""
        data = self.packed()
        self.group.snapshot = (self.outer.step, data)
        if self.checkpoint is not None:
            save_checkpoint(self.checkpoint, data)
        return data

    def restore(self, data: bytes) -> None:
        """Continue from state bytes (a checkpoint, or a peer's state): both copies set."""
        self.data.position = load_state(data, self.model, self.outer, self.opt)
        self._publish()

    async def join(self, at_least: int = 0) -> tuple[int, str]:
        """Join a running group: find it in the DHT (its provider records lead to the
        leader), announce ourselves to the leader, pull over SHARDCAST the leader's state at
        the boundary it expects us at, and load it into both parameter copies: (step, the
        hash of our state packed again after loading, equal to the donor's if every part of
        it was taken over)."""
        self.found = await self.group.find_leader()
        if self.group.cfg.leader not in self.found:
            log.warning("the DHT did not name the leader: asking it at the address we know")
        while True:
            try:
                step = await self.group.announce_join(at_least)
            except JoinRefused as exc:
                raise GroupError(str(exc)) from exc
            try:
                pulled = await self.group.pull_state(step)
            except StateTransferError as exc:
                raise GroupError(f"the leader's state could not be pulled: {exc}") from exc
            if pulled is None:
                continue  # the group moved past that boundary meanwhile: ask again
            try:
                self.restore(pulled.data)
            except ValueError as exc:
                raise GroupError(f"the leader's state does not fit our model: {exc}") from exc
            self.group.feedback.reset()  # held back for a state we left (SPEC §15)
            self.recovered = pulled
            return step, state_hash(self.packed())  # what we hold now, packed again

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
        self.outer.apply(self.model, red.average, alone=red.alone)
        packed = self._publish()
        rec = OuterRecord(
            step=self.outer.step,
            hash=self.state_hash(),
            members=red.roster,
            attempts=red.attempts,
            received=red.received,
            inner_s=t1 - t0,
            reduce_s=t2 - t1,
            loss=sum(losses) / len(losses),
            state=state_hash(packed),
        )
        self.history.append(rec)
        return rec

    def _inner_phase(self) -> list[float]:
        return [self.inner() for _ in range(self.inner_steps)]

    def status(self) -> dict[str, Any]:
        last = self.history[-1] if self.history else None
        return {"outer_step": self.outer.step, "last": last.__dict__ if last else None}
