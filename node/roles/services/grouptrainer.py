"""The trainer role in a DiLoCo group (``--diloco.enabled``, SPEC §21): several trainers of one run
train the policy together and publish it as one.

Where the rollouts come from: as for a single trainer (``node/roles/services/trainer.py``), accepted
batches read from the chain and fetched from their workers; but each member fetches and
trains on only its own share (``node/roles/decisions/grouping.py``: the owner of a batch is picked by
its work key's hash over the roster that produced the batch's policy version).

One outer step n (policy version n, the same on every member, bit for bit):

1. the leader (the member the run's ``trainer_peer_id`` names) announces step n as a single
   trainer does; the other members announce nothing;
2. each member waits for its share of the step's batches (``batches_per_step`` spread over
   the roster), or ``step_wait`` seconds: then it goes on with what it has, or with none
   (a zero pseudo-gradient) if other members have new accepted batches;
3. the inner phase: up to ``[diloco] inner_steps`` (H) GRPO steps on slices of its samples
   (``node/roles/children/grouppolicy.py``, in the role's child process);
4. the outer step: the pseudo-gradient ``θ − θ_after`` goes through the group's ring
   all-reduce (``node/diloco/group.py``, int8 or fp32), the averaged one makes one Nesterov
   step on ``θ``; the child writes checkpoint n + 1, which every member now holds alike;
5. the leader alone publishes version n + 1 over SHARDCAST and on-chain and announces
   step n + 1; every member appends its line to ``metrics.jsonl`` (with ``params_hash``,
   the hash of the parameters after the outer step, and the ``roster``).

Before its first outer step (or after a restart without a recorded roster) the group
forms: an all-reduce of a zero vector whose roster decides the owners of version n's
batches. A member started after the group formed joins it instead (``node/roles/io/joining.py``:
the leader's state over SHARDCAST, then its first outer step with no batch of its own); the
leader offers its state at every boundary for that. Where the weights go next: as from a single trainer, the workers pull them.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import trio

from node.config import NodeConfig
from node.diloco.group import DilocoGroup, GroupConfig, GroupError
from node.files import saved
from node.net.runtime import Node
from node.roles.children.grouppolicy import (
    Delta,
    GroupPolicyWorker,
    GroupSpec,
    InnerSteps,
    OuterApply,
    PseudoGradient,
)
from node.roles.children.offload import Offload
from node.roles.decisions.grouping import Rosters, share, step_ready
from node.roles.decisions.work import Key
from node.roles.given import Weights
from node.roles.io.chain import ChainSetupError, WorkWatcher, open_ledger
from node.roles.io.joining import Joined, came_too_late, enter, join, offer
from node.roles.io.rounds import form, keep_feedback, reduce, resume_feedback
from node.roles.services.trainer import POLL_S, TrainerRole, trained
from node.training.ranks import RankedPolicyWorker, RanksSpec
from node.training.worker import PolicySpec, StepStats

log = logging.getLogger("intellect.trainer")
ROSTERS_FILE = "diloco-rosters.json"


class GroupTrainerRole(TrainerRole):
    def __init__(self, node: Node, cfg: NodeConfig, weights: Weights | None = None) -> None:
        super().__init__(node, cfg, weights)
        if cfg.run.trainer_peer_id is None:
            raise ChainSetupError("a DiLoCo group needs the run's trainer_peer_id (its leader)")
        self.me = node.peer_id
        self.leading = self.me == cfg.run.trainer_peer_id
        sync = 600.0 + 2 * cfg.trainer.step_wait  # members still waiting for batches, then training
        self.group = DilocoGroup(
            node,
            GroupConfig.of_run(cfg.run.trainer_peer_id, cfg.diloco, sync, sync + 300.0),
        )
        self.rosters = Rosters.load(self.dir / ROSTERS_FILE)
        self.outer: dict[str, Any] = {}  # the last outer step, for metrics and /status
        self.seen: set[Key] = set()  # other members' batches counted for an earlier step

    def _setup(self) -> None:
        """The leader: the owner's account, as a single trainer. A member: read-only."""
        if self.leading:
            super()._setup()
            return
        self.ledger = open_ledger(self.cfg, signing=False)
        self.watcher = WorkWatcher(self.ledger, self.cfg.chain.contract_block)

    def _child(self, spec: PolicySpec) -> Offload:
        """The member's policy: in the child, or with ``[trainer] procs`` > 1 on that many
        torchrun ranks the child drives (FSDP2 inside the member, DiLoCo across)."""
        cfg = self.cfg
        group = GroupSpec(spec, cfg.diloco.inner_steps, cfg.diloco.outer_lr, cfg.diloco.momentum)
        if cfg.trainer.procs > 1:
            return Offload(
                RankedPolicyWorker, RanksSpec(cfg.trainer.procs, group, GroupPolicyWorker)
            )
        return Offload(GroupPolicyWorker, group)

    async def _serve(self, task_status: trio.TaskStatus[TrainerRole]) -> None:
        self.node.add_status("diloco", self.group_status)
        async with trio.open_nursery() as nursery:
            # the group's protocols, and its DHT provider record (the leader's from the start)
            await nursery.start(self.group.serve)
            resume_feedback(self.group, self.dir / "checkpoints", self.step)
            if self._fresh():  # started after the group formed: recover its state first
                await self._joined(await enter(self.group, self.policy))
            await super()._serve(task_status)
            nursery.cancel_scope.cancel()

    def group_status(self) -> dict[str, Any]:
        return {
            **self.group.status(),
            "inner_steps": self.cfg.diloco.inner_steps,
            "roster": self.rosters.latest(),
            "last": self.outer,
        }

    # ---- one outer step ------------------------------------------------------------------

    def _fresh(self) -> bool:
        """A member with nothing of its own yet: it forms the group or joins it."""
        return not self.leading and self.step == 0 and not self.rosters.by_version

    async def _joined(self, joined: Joined | None) -> None:
        """Continue from the state a join recovered (``None``: the group forms with us)."""
        if joined is None:
            return
        self.state.step = joined.version
        await saved(self.state.save, self.state_path, what="the trainer state")
        self.rosters.record(joined.version, joined.roster)  # its batches are not ours
        await saved(self.rosters.save, self.dir / ROSTERS_FILE, what="the rosters")
        self.outer = {"recovered": joined.record, "leader": False}

    async def _train_one(self) -> None:
        if self.step not in self.rosters.by_version:
            try:
                await self._form(self.step)
            except GroupError:
                if not self._fresh():
                    raise
                log.info("DiLoCo: the group formed without us: joining it")
                await self._joined(await join(self.group, self.policy))
        if self.leading and (self.group.snapshot or (-1,))[0] != self.step + 1:
            await offer(self.group, self.policy, self.step)  # at start-up: the version we hold
        try:
            await super()._train_one()
        except GroupError as exc:
            # a joiner that came after its first roster formed (it recovered for longer than
            # the leader's diloco.join_timeout) has taken nothing of its own: it joins again
            joining = self.me not in self.rosters.by_version.get(self.step, [self.me])
            if not came_too_late(exc) or not joining:
                raise
            log.warning(
                "DiLoCo: step %d formed before we came (our recovery took longer than the "
                "leader's diloco.join_timeout): joining again",
                self.step + 1,
            )
            await self._joined(await join(self.group, self.policy))

    async def _form(self, n: int) -> None:
        """The group's first roster: it decides who trains on version ``n``'s batches."""
        log.info(
            "DiLoCo: forming the group at version %d (leader %s, %d members at least)",
            n,
            self.cfg.run.trainer_peer_id,
            self.cfg.diloco.members,
        )
        red = await form(self.group, self.policy, n)
        self.rosters.record(n, red.roster)
        await saved(self.rosters.save, self.dir / ROSTERS_FILE, what="the rosters")
        log.info("DiLoCo: group formed: %s", ", ".join(p[-8:] for p in red.roster))

    async def _step(self, n: int, envelopes: list[bytes]) -> StepStats:
        """Inner phase, all-reduce, outer step: checkpoint ``n + 1`` is written."""
        stats: StepStats = await self.policy.call(InnerSteps(n, envelopes))
        delta: Delta = await self.policy.call(PseudoGradient())
        began = time.monotonic()
        red = await reduce(self.group, n + 1, delta.vector, delta)
        reduce_s = time.monotonic() - began
        self.rosters.record(n + 1, red.roster)
        self.rosters.forget_before(n - self.cfg.run.async_level)
        await saved(self.rosters.save, self.dir / ROSTERS_FILE, what="the rosters")
        digest = await trained(self.policy, OuterApply(n, red.average, red.alone))
        await keep_feedback(self.group, self.dir / "checkpoints", n + 1)
        offered = await offer(self.group, self.policy, n + 1) if self.leading else None
        self.outer = {
            "state_hash": offered,
            "params_hash": digest,
            "roster": red.roster,
            "inner_steps": min(self.cfg.diloco.inner_steps, stats.samples),
            "attempts": red.attempts,
            "reduce_s": round(reduce_s, 3),
            "received_bytes": red.received,
            "leader": self.leading,
        }
        log.info(
            "DiLoCo: outer step %d with %d members (%d inner steps), params %s",
            n + 1,
            len(red.roster),
            self.outer["inner_steps"],
            digest[:16],
        )
        return stats

    async def _wait_for_batches(self, n: int) -> list[Key]:
        """This member's share of step ``n``'s batches; after ``step_wait``, what it has if
        the group has anything new (possibly nothing of its own: it still takes part in the
        outer step, with a zero pseudo-gradient); with nothing new anywhere, it waits on."""
        if self.me not in self.rosters.by_version.get(n, [self.me]):
            return []  # a joiner's first step: version n's batches were split without it
        started = time.monotonic()
        want = share(self.cfg.trainer.batches_per_step, len(self.rosters.latest()))
        while True:
            waited = time.monotonic() - started
            usable = self._mine(self.book.usable(n))
            theirs = self._theirs(n) - self.seen
            if step_ready(len(usable), want, waited, self.cfg.trainer.step_wait, len(theirs)):
                self.idle_s += waited
                self.seen |= theirs
                return usable
            await trio.sleep(POLL_S)

    def _theirs(self, n: int) -> set[Key]:
        """Accepted batches in step ``n``'s window that other members own (the chain says
        so; they are not fetched here)."""
        subs, book = self.book.submitted, self.book
        return {
            k
            for k in book.accepted
            if k in subs
            and book.in_window(subs[k].policy_version, n)
            and subs[k].policy_version in self.rosters.by_version
            and not self.rosters.mine(self.me, k[1], subs[k].policy_version)
        }

    def _mine(self, keys: list[Key]) -> list[Key]:
        subs = self.book.submitted
        return [
            k
            for k in keys
            if k in subs and self.rosters.mine(self.me, k[1], subs[k].policy_version)
        ]

    def _line(self, stats: StepStats, keys: list[Key], began: float) -> dict[str, Any]:
        return {**super()._line(stats, keys, began), "diloco": dict(self.outer)}

    # ---- only the leader speaks for the group ----------------------------------------------

    async def _publish(self, version: int) -> None:
        if self.leading:
            await super()._publish(version)

    def _send_step(self) -> bool:
        return super()._send_step() if self.leading else True


async def run(
    node: Node,
    cfg: NodeConfig,
    weights: Weights | None = None,
    *,
    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The role as a service the runtime starts (``--role trainer --diloco.enabled``)."""
    await GroupTrainerRole(node, cfg, weights).serve(task_status=task_status)
