"""The trainer role pretraining in a DiLoCo group (``--diloco.enabled --trainer.objective pretrain
--trainer.data PATH``, SPEC §22): INTELLECT-1's objective, next-token loss on a text corpus.

Where the data comes from: not from the network. Every member reads the same local text
file, each its own contiguous shard of it (``node/diloco/corpus.py``: shard i of k, i the
member's index in the roster that formed the group); there are no rollouts, so the role
reads no chain, fetches no batch and announces no step to workers.

One outer step n (policy version n, the same on every member, bit for bit):

1. the inner phase: ``[diloco] inner_steps`` (H) AdamW steps on the next H batches of the
   member's shard, in the role's child process (``node/roles/children/pretrainpolicy.py``);
2. the outer step: ``θ − θ_after`` through the group's ring all-reduce
   (``node/diloco/group.py``, int8 or fp32) and one Nesterov step on the average; the child
   writes checkpoint n + 1: the model directory and the member's DiLoCo state (θ, b, AdamW,
   step, data position);
3. ``pretrain-state.json`` records step n + 1 and the member's shard (a restarted member
   resumes there, at the data position its state holds);
4. the leader (the member the run's ``trainer_peer_id`` names) publishes version n + 1 over
   SHARDCAST; every member appends its line to ``metrics.jsonl`` (``loss``, ``position``,
   the token ranges it ``read``, ``diloco.params_hash``) and logs it.

Before its first outer step the group forms (an all-reduce of a zero vector, as with GRPO):
its roster fixes the shards. A member started after that joins instead
(``node/roles/io/joining.py``): it recovers the leader's state, data position included, sits
its first outer step out with a zero pseudo-gradient (it has no shard yet) and is admitted
by that step's roster. Whenever an outer step's roster differs from the recorded one, every
member cuts the text again over it and reads its new shard from the group's data position
on (SPEC §22). Where the weights go next: any node of the run pulls them.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import trio

from node.config import NodeConfig
from node.diloco.group import DilocoGroup, GroupConfig, GroupError, Reduced
from node.files import saved, write_atomic
from node.net.runtime import Node
from node.roles.children.grouppolicy import Delta, OuterApply, PseudoGradient
from node.roles.children.offload import Offload
from node.roles.children.pretrainpolicy import (
    InnerStats,
    PretrainInner,
    PretrainSpec,
    PretrainWorker,
    ShardInfo,
    UseShard,
)
from node.roles.decisions.status import CURVE_POINTS, PretrainStatus
from node.roles.decisions.workbook import append_line, prune_checkpoints
from node.roles.given import Weights
from node.roles.io.chain import ChainSetupError
from node.roles.io.joining import Joined, came_too_late, enter, join, offer
from node.roles.io.rounds import form, keep_feedback, reduce, resume_feedback
from node.training.ranks import RankedPolicyWorker, RanksSpec

log = logging.getLogger("intellect.trainer")
STATE_FILE = "pretrain-state.json"
METRICS_FILE = "metrics.jsonl"
KEEP_CHECKPOINTS = 2


@dataclass
class PretrainState:
    """What the role needs after a restart besides the child's checkpoint: the outer step
    reached and the shard the group gave this member (``pretrain-state.json``)."""

    step: int = 0
    shard: int = -1  # -1: the group has not formed yet
    shards: int = 0
    roster: list[str] = field(default_factory=list)  # the formation's

    @classmethod
    def load(cls, path: Path) -> PretrainState:
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return cls()
        return cls(int(raw["step"]), int(raw["shard"]), int(raw["shards"]), list(raw["roster"]))

    def save(self, path: Path) -> None:
        write_atomic(path, json.dumps(asdict(self)).encode())


class PretrainRole:
    def __init__(self, node: Node, cfg: NodeConfig, weights: Weights | None = None) -> None:
        if cfg.run.model is None:
            raise ChainSetupError("pretraining needs the base model (--model DIR)")
        if weights is None:
            raise ChainSetupError("the trainer role needs the weight service (SHARDCAST)")
        if cfg.run.trainer_peer_id is None:
            raise ChainSetupError("a DiLoCo group needs the run's trainer_peer_id (its leader)")
        self.node, self.cfg = node, cfg
        self.weights: Weights = weights
        self.dir = cfg.resolved_data_dir
        self.state = PretrainState.load(self.dir / STATE_FILE)
        self.leading = node.peer_id == cfg.run.trainer_peer_id
        self.group = DilocoGroup(
            node,
            GroupConfig.of_run(cfg.run.trainer_peer_id, cfg.diloco, 600.0, 900.0),
        )
        self.policy: Any = None
        self.recovered: dict[str, Any] | None = None  # how a joiner got the group's state
        self.info: ShardInfo | None = None
        self.position = 0
        recorded = recorded_lines(self.dir / METRICS_FILE)  # a restarted member shows them
        self.last: dict[str, Any] = recorded[-1] if recorded else {}
        self.curve = deque((curve_point(x) for x in recorded), maxlen=CURVE_POINTS)
        self.idle_s = self.busy_s = 0.0
        self.done = False

    @property
    def step(self) -> int:
        return self.state.step

    def _child(self, spec: PretrainSpec) -> Offload:
        """The member's model: in the child, or with ``[trainer] procs`` > 1 on that many
        torchrun ranks the child drives (FSDP2 inside the member, DiLoCo across)."""
        if self.cfg.trainer.procs > 1:
            ranks = RanksSpec(self.cfg.trainer.procs, spec, PretrainWorker)
            return Offload(RankedPolicyWorker, ranks)
        return Offload(PretrainWorker, spec, threads=self.cfg.engine.torch_threads)

    def checkpoint_dir(self, version: int) -> Path:
        return self.dir / "checkpoints" / f"v{version}"

    # ---- the loop ----------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        spec = PretrainSpec.of(self.cfg, self.dir / "checkpoints", self.step)
        async with self._child(spec) as self.policy:
            self.node.add_status("trainer", lambda: self.status().as_dict())
            self.node.add_status("diloco", self.group_status)
            async with trio.open_nursery() as nursery:
                await nursery.start(self.group.serve)
                resume_feedback(self.group, self.dir / "checkpoints", self.step)
                await self._publish(self.step)  # after a restart: what a crash left unpublished
                task_status.started(self)
                if self.state.shards == 0 and self.state.shard < 0:
                    await self._enter()
                if self.state.shard >= 0:
                    await self._use_shard()
                while self.cfg.trainer.steps == 0 or self.step < self.cfg.trainer.steps:
                    await self._outer_step()
                self.done = True
                log.info("pretrained %d outer steps: done (still serving weights)", self.step)
                await trio.sleep_forever()

    async def _use_shard(self) -> None:
        """Read the shard ``state`` names from the data position on."""
        self.info = await self.policy.call(UseShard(self.state.shard, self.state.shards))
        self.position = self.info.position
        log.info(
            "pretraining on shard %d of %d (tokens %d..%d of %d), data position %d",
            self.state.shard,
            self.state.shards,
            *self.info.shard["tokens"],
            self.info.text_tokens,
            self.position,
        )

    async def _enter(self) -> None:
        """A member with no state of its own: form the group, or join it if it runs
        already (``node/roles/io/joining.py``)."""
        joined = await enter(self.group, self.policy) if not self.leading else None
        if joined is None:
            try:
                await self._form()
                return
            except GroupError:
                if self.leading:
                    raise
                log.info("DiLoCo: the group formed without us: joining it")
            joined = await join(self.group, self.policy)
        await self._joined(joined)

    async def _joined(self, joined: Joined) -> None:
        """Continue from the recovered state: its version and data position; no shard until
        the roster that admits us (shard -1: the first inner phase reads nothing)."""
        self.state = PretrainState(joined.version, -1, 0, list(joined.roster))
        await saved(self.state.save, self.dir / STATE_FILE, what="the pretrainer state")
        self.position = int(joined.record["position"])
        self.recovered = joined.record
        self.last = {"step": joined.version, "diloco": {"recovered": joined.record}}
        await trio.to_thread.run_sync(append_line, self.dir / METRICS_FILE, self.last)

    async def _recut(self, roster: list[str]) -> None:
        """The roster changed (a member joined or left): the text is cut again over it,
        each member reads its new shard from the group's data position on."""
        if roster == self.state.roster and self.state.shard >= 0:
            return
        me = roster.index(self.node.peer_id)
        log.info(
            "DiLoCo: the roster changed at version %d (%d members): reading shard %d of %d",
            self.step,
            len(roster),
            me,
            len(roster),
        )
        self.state = PretrainState(self.step, me, len(roster), list(roster))
        await saved(self.state.save, self.dir / STATE_FILE, what="the pretrainer state")
        await self._use_shard()

    async def _form(self) -> None:
        """The group's first roster; this member's index in it is its shard."""
        n = self.step
        log.info("DiLoCo: forming the pretraining group at version %d", n)
        began = time.monotonic()
        red = await form(self.group, self.policy, n)
        self.idle_s += time.monotonic() - began
        me = red.roster.index(self.node.peer_id)
        self.state = PretrainState(n, me, len(red.roster), list(red.roster))
        await saved(self.state.save, self.dir / STATE_FILE, what="the pretrainer state")
        log.info("DiLoCo: group formed: %s", ", ".join(p[-8:] for p in red.roster))

    async def _outer_step(self) -> None:
        n, began = self.step, time.monotonic()
        if self.leading and (self.group.snapshot or (-1,))[0] != n + 1:
            await offer(self.group, self.policy, n)  # at start-up: the version we hold
        stats: InnerStats = await self.policy.call(PretrainInner(n, self.state.shard >= 0))
        delta: Delta = await self.policy.call(PseudoGradient())
        reducing = time.monotonic()
        try:
            red = await reduce(self.group, n + 1, delta.vector, delta)
        except GroupError as exc:  # a joiner's first step (shard -1: it read nothing)
            if not came_too_late(exc) or self.state.shard >= 0:
                raise
            log.warning(
                "DiLoCo: step %d formed before we came (our recovery took longer than the "
                "leader's diloco.join_timeout): joining again",
                n + 1,
            )
            await self._joined(await join(self.group, self.policy))
            return
        reduce_s = time.monotonic() - reducing
        digest = await self.policy.call(OuterApply(n, red.average, red.alone))
        await keep_feedback(self.group, self.dir / "checkpoints", n + 1)
        self.position = stats.position
        self.state.step = n + 1
        await saved(self.state.save, self.dir / STATE_FILE, what="the pretrainer state")
        offered = await offer(self.group, self.policy, n + 1) if self.leading else None
        await self._publish(n + 1)
        self.idle_s += reduce_s
        self.busy_s += time.monotonic() - began - reduce_s
        line = self._line(stats, red, digest, reduce_s, began)
        line["diloco"]["state_hash"] = offered
        await self._recut(red.roster)  # the next inner phase reads the new roster's shard
        self.last = line
        self.curve.append(curve_point(line))
        await trio.to_thread.run_sync(append_line, self.dir / METRICS_FILE, line)
        log.info(
            "pretrain: outer step %d with %d members: loss %s, data position %d "
            "(%d tokens seen, read %s), params %s",
            n + 1,
            len(red.roster),
            "-" if stats.loss is None else f"{stats.loss:.4f}",
            stats.position,
            line["tokens_trained_total"],
            stats.read,
            digest[:16],
        )
        prune_checkpoints(self.dir / "checkpoints", self.step, KEEP_CHECKPOINTS)

    def _line(
        self, stats: InnerStats, red: Reduced, digest: str, reduce_s: float, began: float
    ) -> dict[str, Any]:
        """The step's line of ``metrics.jsonl``."""
        return {
            "step": self.step,
            "policy_version": self.step,
            "objective": "pretrain",
            "loss": stats.loss,
            "shard": self.state.shard,
            "shards": self.state.shards,
            "position": stats.position,
            "read": stats.read,
            "tokens_trained": stats.tokens,
            "tokens_trained_total": self._tokens_seen(),
            "inner_seconds": round(stats.seconds, 3),
            "diloco": {
                "params_hash": digest,
                "roster": red.roster,
                "inner_steps": self.cfg.diloco.inner_steps,
                "attempts": red.attempts,
                "reduce_s": round(reduce_s, 3),
                "received_bytes": red.received,
                "leader": self.leading,
            },
            "seconds": round(time.monotonic() - began, 3),
            "time": time.time(),
        }

    async def _publish(self, version: int) -> None:
        """The leader alone: version ``version`` over SHARDCAST, unless it already is. A
        pretraining run has no rollouts to judge or pay: nothing goes on-chain."""
        if version == 0 or not self.leading:
            return
        if self.weights.model_dir(version) is None and version > self.weights.newest_known:
            await self.weights.publish(self.checkpoint_dir(version), version=version, step=version)
        log.info("policy version %d published (SHARDCAST)", version)

    # ---- /status -------------------------------------------------------------------------

    def _tokens_seen(self) -> int:
        return self.position * self.cfg.trainer.pretrain_batch * self.cfg.trainer.pretrain_seq_len

    def status(self) -> PretrainStatus:
        total = self.idle_s + self.busy_s
        data: dict[str, Any] = {"path": str(self.cfg.trainer.data), "position": self.position}
        if self.info is not None:
            per_pass = self.info.shard["per_pass"]
            data |= {
                **self.info.shard,
                "text_tokens": self.info.text_tokens,
                "tokens_seen": self._tokens_seen(),
                "passes": round(self.position * self.cfg.trainer.pretrain_batch / per_pass, 4),
                "read": self.last.get("read", []),
            }
        return PretrainStatus(
            step=self.step,
            policy_version=self.step,
            train_steps=self.cfg.trainer.steps,
            done=self.done,
            loss=self.last.get("loss"),
            data=data,
            batches_used=self.position,
            tokens_trained=self._tokens_seen(),
            idle_share=round(self.idle_s / total, 3) if total else 0.0,
            last={k: v for k, v in self.last.items() if k != "read"},
            curve=list(self.curve),
        )

    def group_status(self) -> dict[str, Any]:
        return {
            **self.group.status(),
            "objective": "pretrain",
            "inner_steps": self.cfg.diloco.inner_steps,
            "roster": self.state.roster,
            "last": self.last.get("diloco", {}),
        }


def curve_point(line: dict[str, Any]) -> dict[str, Any]:
    return {k: line.get(k) for k in ("step", "loss", "tokens_trained_total")}


def recorded_lines(path: Path) -> list[dict[str, Any]]:
    """The lines of ``metrics.jsonl`` (one a crash cut short is skipped)."""
    try:
        raw = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for text in raw:
        try:
            out.append(json.loads(text))
        except ValueError:
            continue
    return out


async def run(
    node: Node,
    cfg: NodeConfig,
    weights: Weights | None = None,
    *,
    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The role as a service the runtime starts (``--role trainer --diloco.enabled --trainer.objective
    pretrain``)."""
    await PretrainRole(node, cfg, weights).serve(task_status=task_status)
