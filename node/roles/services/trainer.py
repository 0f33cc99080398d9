"""The trainer role: the run owner's node, where accepted rollouts become a new policy.

Where the rollout comes from: a worker generated it (``node/roles/services/inference.py``), a
validator judged it and posted ``accept`` on-chain (``node/roles/services/validator.py``). The
trainer reads verdicts from the chain, never from gossip (``WorkWatcher``), fetches each
accepted batch from its worker over ``/intellect/batch/1.0.0`` (``Gatherer``,
``node/roles/io/gathering.py``: it must hash to the work key the chain accepted), keeps it in
its inbox, and trains on it: ``PolicyWorker`` (a
child process, ``node/training/worker.py``) turns the batches into GRPO samples
(``node/training/grpo.py``) and takes one optimizer step (``node/training/policy.py``);
with ``[trainer] procs`` > 1 the child drives that many torchrun ranks that shard the step
with FSDP2 (``node/training/ranks.py``).

One training step n (the policy is version n; version 0 is the base ``--model``):

1. announce the step: ``StepNotice(step=n, policy_version=n)``; workers generate for step n;
2. wait until ``batches_per_step`` accepted batches are usable (or at least one after
   ``step_wait`` seconds): usable means accepted on-chain, fetched, not used before, and
   generated with a version ≥ n − ``async_level`` (older ones are not trained on; their
   workers are still paid: the work was valid when judged, SPEC §20);
3. with ``async_level`` ≥ 1, announce step n + 1 at once (version still n): workers
   generate the next step with the current policy while this one trains (generation and
   training overlap; with ``async_level`` 0 workers wait for version n + 1: on-policy);
4. train, write checkpoint n + 1 (weights and optimizer state) and then, atomically, the
   trainer state (step n + 1 and the batches consumed): a restart resumes here and uses no
   batch twice and loses none; a checkpoint the disk refuses (full) is saved again, 5 s
   later and then doubling up to 300 s, without the step being taken twice (``trained``);
5. publish version n + 1 over SHARDCAST (``node/shardcast/service.py``) and on-chain
   (``set_policy_version``, so workers may submit work made with it), announce
   ``StepNotice(n + 1, n + 1)``;
6. evaluate the held-out set (sampled and greedy, every ``eval_every`` steps) and append
   one line to ``metrics.jsonl``.

Where it goes next: workers pull the new version and switch at their next batch.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from pathlib import Path
from typing import Any

import trio

from crypto.verdict import proof_parameters
from ledger.client import LedgerPending, LedgerRevert, LedgerUnreachable
from node.config import NodeConfig
from node.files import SAVE_RETRY_FIRST, SAVE_RETRY_MAX, saved
from node.net.runtime import Node
from node.roles.children.offload import Offload, OffloadError
from node.roles.decisions.status import CURVE_POINTS, TrainerStatus, curve_point
from node.roles.decisions.work import Key
from node.roles.decisions.workbook import (
    TrainerState,
    WorkBook,
    append_line,
    key_text,
    prune_checkpoints,
    recorded_curve,
    recorded_step,
    step_batches,
)
from node.roles.given import Started, TrainerLedger, Weights
from node.roles.io.chain import ChainSetupError, WorkWatcher, open_ledger
from node.roles.io.exchange import follow_notices
from node.roles.io.gathering import Gatherer
from node.rollouts.store import BatchStore
from node.training.ranks import RankedPolicyWorker, RanksSpec
from node.training.worker import Evaluate, PolicySpec, PolicyWorker, StepStats, TrainStep
from protocol.batches import STEP_TOPIC, StepNotice

log = logging.getLogger("intellect.trainer")
STATE_FILE = "trainer-state.json"
METRICS_FILE = "metrics.jsonl"
POLL_S = 0.5
ANNOUNCE_EVERY = 5.0  # the step notice is repeated (gossip can miss, nodes join late)
KEEP_CHECKPOINTS = 2
CHAIN_RETRY_S = 2.0  # a chain that does not answer is asked again this often


class TrainerRole:
    ledger = Started[TrainerLedger](ChainSetupError, "the ledger is opened when the role starts")

    def __init__(self, node: Node, cfg: NodeConfig, weights: Weights | None = None) -> None:
        if cfg.run.model is None:
            raise ChainSetupError("the trainer role needs the run's base model (--model DIR)")
        if weights is None:
            raise ChainSetupError("the trainer role needs the weight service (SHARDCAST)")
        self.node, self.cfg = node, cfg
        self.weights: Weights = weights
        self.dir = cfg.resolved_data_dir
        self.state_path = self.dir / STATE_FILE
        self.state = TrainerState.load(self.state_path)
        self.book = WorkBook.resumed(cfg.run.async_level, self.state)
        self.inbox = BatchStore(self.dir / "trainer-inbox")
        self.gatherer = Gatherer(  # fetches the accepted batches into the inbox
            node,
            self.inbox,
            self.book,
            registered=lambda worker: registered_peer(self._ledger, worker),
            proofs=proof_parameters(cfg.run.verify_profile),
        )
        self.announced: tuple[int, int] = (-1, -1)
        self.policy: Any = None
        self._ledger: TrainerLedger | None = None  # opened when the role starts
        self.watcher: WorkWatcher | None = None
        self.slashed = 0
        self.idle_s = 0.0
        self.busy_s = 0.0
        self.curve = deque(recorded_curve(self.dir / METRICS_FILE), maxlen=CURVE_POINTS)
        self.done = False

    @property
    def step(self) -> int:
        return self.state.step

    # ---- setup -------------------------------------------------------------------------

    def _setup(self) -> None:
        """Blocking: the owner's ledger account, the chain's view of versions."""
        self.ledger = open_ledger(self.cfg)
        self.node.add_status("chain", self.ledger.health)  # its RPC URLs' faults, its transactions
        owner = self.ledger.owner().lower()
        if self.ledger.address.lower() != owner:
            raise ChainSetupError(
                f"the trainer publishes policy versions on-chain: its account "
                f"{self.ledger.address} must be the contract's owner {owner}"
            )
        self.watcher = WorkWatcher(self.ledger, self.cfg.chain.contract_block)

    def checkpoint_dir(self, version: int) -> Path:
        """The model directory of ``version`` (0: the base model)."""
        return (
            Path(str(self.cfg.run.model))
            if version == 0
            else self.dir / "checkpoints" / f"v{version}"
        )

    def status(self) -> TrainerStatus:
        total = self.idle_s + self.busy_s
        return TrainerStatus(
            step=self.step,
            policy_version=self.step,
            train_steps=self.cfg.trainer.steps,
            done=self.done,
            accepted=len(self.book.accepted),
            rejected=len(self.book.rejected),
            slashed=self.slashed,
            usable=len(self.book.usable(self.step)),
            batches_used=self.state.batches_used,
            tokens_trained=self.state.tokens_trained,
            idle_share=round(self.idle_s / total, 3) if total else 0.0,
            last={k: v for k, v in (self.curve or [{}])[-1].items() if k != "batches_used"},
            curve=list(self.curve),
        )

    # ---- the loop ----------------------------------------------------------------------

    async def serve(
        self, *, task_status: trio.TaskStatus[TrainerRole] = trio.TASK_STATUS_IGNORED
    ) -> None:
        await trio.to_thread.run_sync(self._setup)
        async with self._child(PolicySpec.of(self.cfg, self.dir / "checkpoints", self.step)) as (
            self.policy
        ):
            await self._serve(task_status)

    def _child(self, spec: PolicySpec) -> Offload:
        """The policy's process: one, or torchrun ranks with FSDP2 (node/training/ranks.py)."""
        if self.cfg.trainer.procs > 1:
            return Offload(RankedPolicyWorker, RanksSpec(self.cfg.trainer.procs, spec))
        return Offload(PolicyWorker, spec)

    async def _serve(self, task_status: trio.TaskStatus[TrainerRole]) -> None:
        follow_notices(self.node, self.gatherer.on_notice)
        self.node.add_status("trainer", lambda: self.status().as_dict())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_chain)
            nursery.start_soon(self.gatherer.run, lambda: self._mine(self.book.wanted(self.step)))
            nursery.start_soon(self._announce_loop)
            await self._publish(self.step)  # after a restart: what a crash left unpublished
            task_status.started(self)
            if recorded_step(self.dir / METRICS_FILE) < self.step:  # the base policy's line,
                await self._record(self.state.line or self._line(StepStats(), [], time.monotonic()))
                # or the line a crash cut off between the checkpoint and the record
            while self.cfg.trainer.steps == 0 or self.step < self.cfg.trainer.steps:
                await self._train_one()
            self.done = True
            log.info("trained %d steps: done (still serving weights)", self.step)
            await trio.sleep_forever()

    async def _train_one(self) -> None:
        n = self.step
        self._announce(n, n)
        began = time.monotonic()
        keys = await self._wait_for_batches(n)
        if self.cfg.run.async_level >= 1:  # workers go on with version n while n trains
            self._announce(n + 1, n)
        envelopes = [e for k in keys if (e := self.inbox.get(k[1])) is not None]
        busy = time.monotonic()
        stats = await self._step(n, envelopes)
        self.book.consume(keys, n + 1)
        self.state.step = n + 1
        self.state.consumed = dict(self.book.consumed)
        self.state.batches_used += len(keys)
        self.state.tokens_trained += stats.tokens
        self.state.line = self._line(stats, keys, began)
        await saved(self.state.save, self.state_path, what="the trainer state")
        for k in keys + self.book.drop_stale(n + 1):  # used, or never usable again
            self.inbox.delete(k[1])
        await self._publish(n + 1)
        self._announce(n + 1, n + 1)
        self.busy_s += time.monotonic() - busy
        await self._record(self.state.line)
        prune_checkpoints(self.dir / "checkpoints", self.step, KEEP_CHECKPOINTS)

    async def _step(self, n: int, envelopes: list[bytes]) -> StepStats:
        """Train version ``n`` on the batches; checkpoint ``n + 1`` is written."""
        stats: StepStats = await trained(self.policy, TrainStep(n, envelopes))
        return stats

    def _mine(self, keys: list[Key]) -> list[Key]:
        """Those of ``keys`` this trainer fetches (all; a DiLoCo member: its share)."""
        return keys

    async def _wait_for_batches(self, n: int) -> list[Key]:
        """The accepted batches step ``n`` trains on (see the module docstring, 2.)."""
        started = time.monotonic()
        while True:
            waited = time.monotonic() - started
            keys = step_batches(
                self.book.usable(n),
                waited,
                self.cfg.trainer.batches_per_step,
                self.cfg.trainer.step_wait,
            )
            if keys is not None:
                self.idle_s += waited
                return keys
            await trio.sleep(POLL_S)

    async def _publish(self, version: int) -> None:
        """Version ``version`` over SHARDCAST and on-chain, unless it already is (a restart
        between the checkpoint and the announcement publishes it here)."""
        if version == 0:
            return
        if self.weights.model_dir(version) is None and version > self.weights.newest_known:
            await self.weights.publish(self.checkpoint_dir(version), version=version, step=version)
        await publish_on_chain(self.ledger, version)
        log.info("policy version %d published (SHARDCAST and on-chain)", version)

    def _announce(self, step: int, version: int) -> None:
        self.announced = (step, version)
        if not self._send_step():
            log.warning("announce queue full: step %d goes out with the next repeat", step)
        log.info("step %d (policy version %d)", step, version)

    def _send_step(self) -> bool:
        """The current step notice on gossip; False when the announce queue is full."""
        step, version = self.announced
        try:
            self.node.announce(STEP_TOPIC, StepNotice(step=step, policy_version=version).encode())
        except trio.WouldBlock:
            return False
        return True

    async def _announce_loop(self) -> None:
        while True:
            await trio.sleep(ANNOUNCE_EVERY)
            if self.announced[0] >= 0:
                self._send_step()

    def _line(self, stats: StepStats, keys: list[Key], began: float) -> dict[str, Any]:
        """The step's line of ``metrics.jsonl`` before the held-out evaluation."""
        return {
            "step": self.step,
            "policy_version": self.step,
            "reward_mean": stats.reward_mean,
            "heldout_sampled": None,
            "heldout_greedy": None,
            "heldout_pass_at_k": None,
            "heldout_draws": self.cfg.trainer.heldout_draws,
            "heldout_by_level": {},
            "accepted": len(self.book.accepted),
            "rejected": len(self.book.rejected),
            "slashed": self.slashed,
            "batches_used": len(keys),
            "batches_used_total": self.state.batches_used,
            "tokens_trained": stats.tokens,
            "tokens_trained_total": self.state.tokens_trained,
            "samples": stats.samples,
            "stale_unused": self.book.stale(self.step),
            "loss": stats.loss,
            "grad_norm": stats.grad_norm,
            "clip_frac": stats.clip_frac,
            "train_ranks": self.cfg.trainer.procs if stats.ranks is None else stats.ranks,
            "versions_used": sorted({self.book.submitted[k].policy_version for k in keys}),
            "used": [key_text(k) for k in keys],
            "seconds": round(time.monotonic() - began, 3),  # the step, its checkpoint saved
            "train_seconds": stats.seconds,  # the GRPO step alone (None: no samples)
            "idle_share": self.status().idle_share,
            "time": time.time(),
        }

    async def _record(self, line: dict[str, Any]) -> None:
        """Evaluate (when due) and append the step's line to ``metrics.jsonl``."""
        line = dict(line)
        if self.cfg.trainer.eval_every and self.step % self.cfg.trainer.eval_every == 0:
            scores = await self.policy.call(Evaluate(str(self.checkpoint_dir(self.step))))
            line |= scores.fields()
        self.curve.append(curve_point(line))
        await trio.to_thread.run_sync(append_line, self.dir / METRICS_FILE, line)
        log.info(
            "step %d: reward %s, held-out sampled %s (greedy %s), %d batches, %d tokens",
            self.step,
            "-" if line["reward_mean"] is None else f"{line['reward_mean']:.3f}",
            "-" if line["heldout_sampled"] is None else f"{line['heldout_sampled']:.3f}",
            "-" if line["heldout_greedy"] is None else f"{line['heldout_greedy']:.3f}",
            line["batches_used"],
            line["tokens_trained"],
        )

    # ---- the chain and the batches ------------------------------------------------------

    async def _watch_chain(self) -> None:
        assert self.watcher is not None
        while True:
            try:
                subs, rulings = await trio.to_thread.run_sync(self.watcher.poll_work)
                for sub in subs:
                    self.book.on_submission(sub)
                for ruling in rulings:
                    self.book.on_ruling(ruling)
                self.slashed = await trio.to_thread.run_sync(self._count_slashed)
            except Exception as exc:  # the chain may be briefly unreachable
                log.warning("reading the chain failed: %s", exc)
            await trio.sleep(POLL_S * 2)

    def _count_slashed(self) -> int:
        workers = {w for w, _ in self.book.submitted}
        return sum(1 for w in workers if self.ledger.worker(w).slashed)


async def publish_on_chain(ledger: TrainerLedger, version: int) -> None:
    """Set the contract's policy version to ``version`` unless it is there already; no
    worker can submit work of it before that, so a chain that does not answer (down,
    restarting) or a transaction not mined in time (it stays in the account's journal and
    is sent again) is waited for, not a reason for the role to fail. A refusal after that
    is no failure when the chain has the version: an earlier send got there first."""
    while True:
        try:
            if await trio.to_thread.run_sync(ledger.policy_version) < version:
                await trio.to_thread.run_sync(ledger.set_policy_version, version)
            return
        except (LedgerUnreachable, LedgerPending) as exc:  # nothing was refused: ask again
            log.warning("publishing version %d on-chain: %s; trying again", version, exc)
            await trio.sleep(CHAIN_RETRY_S)
        except LedgerRevert:
            if await trio.to_thread.run_sync(ledger.policy_version) >= version:
                return
            raise


def registered_peer(ledger: TrainerLedger | None, worker: str) -> str | None:
    """The peer id ``worker`` registered on-chain (None: none, the chain did not answer, or
    the role has not opened it yet)."""
    from crypto.identity import peer_id_of

    if ledger is None:
        return None
    try:
        peer_key, _ = ledger.registration(worker)
    except Exception:
        return None
    return peer_id_of(peer_key) if any(peer_key) else None


async def trained(policy: Any, call: Any) -> Any:
    """``call`` (a step of version ``call.step`` that writes checkpoint ``step + 1``: a
    ``TrainStep``, a DiLoCo ``OuterApply``) in the policy's process. A checkpoint its disk
    refused (full: an ``OSError`` there) is saved again after 5 s, doubling up to 300 s,
    without taking the step twice (``PolicyWorker.train``, ``GroupPolicyWorker.apply``);
    any other failure stops the trainer."""
    delay = SAVE_RETRY_FIRST
    while True:
        try:
            return await policy.call(call)
        except OffloadError as exc:
            if not exc.os_error:
                log.error("training step %d failed: %s", call.step, exc)
                raise
            log.error(
                "checkpoint v%d not saved: %s (saving it again in %.0f s; the step is kept)",
                call.step + 1,
                exc,
                delay,
            )
        await trio.sleep(delay)
        delay = min(2 * delay, SAVE_RETRY_MAX)


async def run(
    node: Node,
    cfg: NodeConfig,
    weights: Weights | None = None,
    *,
    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The role as a service the runtime starts."""
    await TrainerRole(node, cfg, weights).serve(task_status=task_status)
