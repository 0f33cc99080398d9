"""The inference role: generate rollout batches for the assigned tasks, prove, submit.

This is where a rollout starts. For every step the run's trainer announces
(``node/roles/clock.py``), the worker draws its tasks from (its address, the step, the
index) (SPEC §13); its batch maker (``node/rollouts/maker.py``, in a child process)
generates ``group_size`` samples per task with the engine (``node/engine/``: seeded
sampling, TOPLOC proofs) and scores them, and the role seals one ``RolloutBatch``
(``protocol/rollouts.py``, where the rollout goes next). A batch the async window has
moved past while it was generated is dropped (a validator would reject it). Otherwise it
then, in this order: stores the envelope durably (``node/rollouts/store.py``: nothing
announced can be lost; a disk that refuses it, full, leaves the batch in memory, stored
again every few seconds instead of generated again), announces a ``BatchNotice`` on the
``batches`` topic, and submits the work key with its units (the generated tokens)
on-chain. Validators fetch the batch from here (``node/roles/exchange.py``) and judge it
(``node/roles/validator.py``).

The policy (``VersionChoice``, ``node/roles/working.py``): for step n the worker generates
with the newest version it holds in the async window (version ≥ n − ``async_level``, and not newer than the trainer announced): version 0
is the run's base model (``--model``), later ones arrive over SHARDCAST
(``node/shardcast/service.py``, which follows new versions by itself). It switches at batch
boundaries and keeps generating with an older version while the next one downloads; with
none in the window it waits.

Generation runs in a child process (``Offload(BatchMaker, MakerSpec.of(cfg))``, one
``MakeBatch`` call per batch), so the node keeps answering while the CPU or GPU is busy.
Back-pressure: with ``max_unjudged`` submitted batches still without a verdict
(``PendingVerdicts``), the worker waits (validators lag; more work would only risk the
stake). One batch per step.

The role is built from parts a test may replace with its own (``tests/helpers/`` does, to
run a misbehaving worker as a real process): the batch maker's class (``maker``), what is
served to peers (``served``: the store itself), and its steps ``register`` (stake and
register the node's peer key), ``make`` (one ``MakeBatch`` call) and ``submit`` (announce
a stored batch, submit its work key and units).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import trio

from ledger.client import LedgerError, LedgerUnreachable
from ledger.codes import REASON_NAMES
from node.config import NodeConfig
from node.files import write_atomic
from node.net.runtime import Node
from node.roles.busy import BusyTime
from node.roles.chain import WEI, ChainSetupError, open_ledger
from node.roles.clock import StepClock, follow_steps
from node.roles.exchange import Served, serve_batches
from node.roles.offload import Offload, OffloadError
from node.roles.status import InferenceStatus, Stake
from node.roles.working import ChainReads, PendingVerdicts, StoreRetention, VersionChoice
from node.rollouts.maker import BatchMaker, MadeBatch, MakeBatch, MakerSpec
from node.rollouts.store import BatchStore, BatchStoreError
from protocol.batches import BATCH_TOPIC, BatchNotice
from protocol.errors import WireError
from protocol.rollouts import RolloutBatch
from protocol.wire import open_message, seal

log = logging.getLogger("intellect.inference")
POLL_S = 1.0
REANNOUNCE_S = 20.0  # a batch still without a verdict is announced again this often


@dataclass
class WorkerCounts:
    generated: int = 0
    submitted: int = 0
    tokens: int = 0
    seconds: float = 0.0
    generation: float = 0.0  # of the seconds, the batch maker's generating (no loading)
    errors: int = 0
    stale: int = 0  # generated, then left unsubmitted: the window had moved past it

    def made(self, tokens: int, seconds: float, generation: float) -> None:
        self.generated += 1
        self.tokens += tokens
        self.seconds += seconds
        self.generation += generation


@dataclass
class Sealed:
    """A batch made and signed, not stored yet: kept in memory while the disk refuses it
    (full), stored again at the next pass instead of generated again."""

    step: int
    version: int
    envelope: bytes
    notice: BatchNotice


class InferenceRole:
    def __init__(
        self,
        node: Node,
        cfg: NodeConfig,
        weights: Any = None,
        *,
        maker: type[BatchMaker] = BatchMaker,
    ) -> None:
        """``maker``: the class the child process runs (``BatchMaker`` or a subclass)."""
        if cfg.run.model is None:
            raise ChainSetupError("the inference role needs a model (--model DIR)")
        if cfg.run.trainer_peer_id is None:
            raise ChainSetupError("the inference role needs the run's trainer_peer_id")
        self.node, self.cfg, self.weights = node, cfg, weights
        self.store = BatchStore(cfg.resolved_data_dir / "batches")
        self.state_path = cfg.resolved_data_dir / "inference-state.json"
        self.clock = StepClock(cfg.run.trainer_peer_id, cfg.run.async_level)
        self.counts = WorkerCounts()
        self.pending = PendingVerdicts()  # submitted, no verdict yet
        self.versions = VersionChoice(cfg.run.async_level)
        self.ledger: Any = None
        self.address = ""
        self.maker_class = maker
        self.maker: Any = None  # the child process, while the role serves
        self.done_step: int | None = None
        self.busy = BusyTime()  # generating, signing, storing, submitting
        self.stake: Stake | None = None
        self.reads = ChainReads()
        self.served: Served | BatchStore = self.store  # every stored batch, to every peer
        self.notices: dict[bytes, bytes] = {}  # submitted key -> its encoded notice
        self.announced_at = 0.0
        self.retention = StoreRetention(cfg.run.async_level)  # when stored batches are deleted
        self.unstored: Sealed | None = None  # made, but the disk refused it

    # ---- setup -------------------------------------------------------------------------

    def _setup(self) -> None:
        """Blocking: the ledger account, registration with stake."""
        self.ledger = open_ledger(self.cfg)
        self.address = self.ledger.address.lower()
        self.adopt_window(self.ledger.params().max_staleness)
        self.register(self.ledger.worker(self.address))

    def register(self, info: Any) -> None:
        """Blocking: stake and register this node's peer key for the account, or make sure
        the account (``info``: the ledger's record of it) is registered for it."""
        if not info.registered:
            self.ledger.register_identity(self.node.identity, int(self.cfg.inference.stake * WEI))
            log.info("registered %s with %.3f ETH stake", self.address, self.cfg.inference.stake)
        elif info.peer_key != self.node.identity.public_bytes:
            raise ChainSetupError(
                f"{self.address} is registered for another peer key; this node cannot work for it"
            )

    def adopt_window(self, chain_staleness: int) -> None:
        level = narrower_window(self.cfg.run.async_level, chain_staleness)
        self.clock.async_level = self.versions.async_level = level

    def status(self) -> InferenceStatus:
        c = self.counts
        return InferenceStatus(
            address=self.address,
            step=self.clock.step,
            policy_version=self.clock.policy_version,
            version_used=self.versions.used,
            weights_held=self.held_versions(),
            last_batch_step=self.done_step,
            idle_share=self.busy.idle_share(time.monotonic()),
            generated=c.generated,
            submitted=c.submitted,
            accepted=self.pending.accepted,
            rejected=self.pending.rejected,
            unjudged=len(self.pending),
            expired=self.pending.expired,
            tokens=c.tokens,
            errors=c.errors,
            stale=c.stale,
            tokens_per_s=round(c.tokens / c.seconds, 1) if c.seconds else 0.0,
            generation_s=round(c.generation, 3),
            stake=self.stake,
            rejected_by_reason=dict(self.pending.rejected_by_reason),
        )

    # ---- the loop ----------------------------------------------------------------------

    async def serve(
        self, *, task_status: trio.TaskStatus[InferenceRole] = trio.TASK_STATUS_IGNORED
    ) -> None:
        await trio.to_thread.run_sync(self._setup)
        async with Offload.of(self.maker_class, MakerSpec, self.cfg) as self.maker:
            await self._serve(task_status)

    async def _serve(self, task_status: trio.TaskStatus[InferenceRole]) -> None:
        serve_batches(self.node, self.served)
        follow_steps(self.node, self.clock)
        self.node.add_status("inference", lambda: self.status().as_dict())
        self._resume_pending()
        self.busy.since = time.monotonic()
        task_status.started(self)
        try:
            await self._refresh_verdicts()  # resubmits what a crash left unsubmitted
        except LedgerError as exc:  # the chain not answering yet: the loop reads it again
            log.warning("cannot read the chain yet: %s", exc)
        for key in self.pending.keys():  # and tells validators where to fetch it again
            if stored := stored_batch(self.store, key):
                self.node.announce(BATCH_TOPIC, BatchNotice.of(*stored).encode())
        while True:
            try:
                await self._refresh_verdicts()
                await self._forget_spent()
                self._reannounce()
                if self.unstored is not None:  # the disk refused it: store it, not make anew
                    sealed, self.unstored = self.unstored, None
                    await self._send(sealed)
                    continue
                step = self.clock.step
                if (
                    step is None
                    or step == self.done_step
                    or len(self.pending) >= self.cfg.inference.max_unjudged
                ):
                    await trio.sleep(POLL_S)
                    continue
                picked = self.pick_version(step)
                if picked is None:  # nothing in the window yet: the next version downloads
                    await trio.sleep(POLL_S)
                    continue
                began = time.monotonic()
                try:
                    await self._work(step, *picked)
                finally:
                    self.busy.add(time.monotonic() - began)
            except (LedgerError, OffloadError, OSError) as exc:  # the chain said no, or a failure
                if isinstance(exc, OffloadError) and not self.maker.alive():
                    raise  # its batch maker died: every batch would fail so, the node stops
                self.counts.errors += 1
                log.error("work failed: %s", exc)
                await trio.sleep(5 * POLL_S)

    def _reannounce(self) -> None:
        """Announce the batches still without a verdict again: a notice lost on the way
        (gossip drops, a validator that joined later) must not leave a served batch to end
        as unavailable."""
        now = time.monotonic()
        if now - self.announced_at < REANNOUNCE_S:
            return
        self.announced_at = now
        pending = set(self.pending.keys())
        self.notices = {k: n for k, n in self.notices.items() if k in pending}
        for body in self.notices.values():
            try:
                self.node.announce(BATCH_TOPIC, body)
            except trio.WouldBlock:  # the publisher's queue is full: next time
                return

    def _resume_pending(self) -> None:
        """After a restart: the stored batches still without a verdict are pending, and the
        last step worked on is not worked on again (same tasks, same work key)."""
        self.pending.restored(self.store.keys())
        try:
            self.done_step = int(json.loads(self.state_path.read_text())["done_step"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            self.done_step = None

    def _done(self, step: int) -> None:
        """Step ``step`` is worked on: not again, after a restart too (if the disk allows)."""
        self.done_step = step
        try:
            write_atomic(self.state_path, json.dumps({"done_step": step}).encode())
        except OSError as exc:
            log.warning("cannot save %s: %s", self.state_path.name, exc)

    async def _refresh_verdicts(self) -> None:
        waiting = len(self.pending)
        head = await trio.to_thread.run_sync(self.ledger.head) if waiting else None
        if head is not None and self.reads.statuses_due(head):
            keys = self.pending.keys()
            infos = await trio.to_thread.run_sync(
                lambda: [self.ledger.submission(self.address, k) for k in keys]
            )
            late = await windows_passed(self.ledger, keys, infos)
            for key, info, gone in zip(keys, infos, late, strict=True):
                reason = REASON_NAMES.get(info.reason, "rejected")
                if self.pending.settle(
                    key, info.status, reason, window_passed=gone, unlock_at=info.unlock_at
                ):
                    await self._resubmit(key)  # stored, but a crash came before the submission
        if self.reads.money_due(time.monotonic(), len(self.pending) < waiting):
            self.stake = await trio.to_thread.run_sync(read_stake, self.ledger, self.address)

    async def _forget_spent(self) -> None:
        """Delete the stored batches nobody fetches again (``PendingVerdicts.spent``)."""
        floor = self.retention.floor(time.monotonic(), self.clock, len(self.pending.settled))
        if floor is None:
            return
        chain_now = await trio.to_thread.run_sync(self.ledger.chain_time)
        for key in self.pending.spent(floor, chain_now, lambda k: stored_step(self.store, k)):
            self.store.delete(key)

    async def _resubmit(self, key: bytes) -> None:
        if (found := stored_batch(self.store, key)) is None:
            return
        batch = found[0]
        try:
            await trio.to_thread.run_sync(
                self.ledger.submit_work, key, batch.num_tokens, batch.policy_version
            )
        except LedgerError as exc:
            log.warning("stored batch %s not submitted: %s", key.hex()[:16], exc)
            self.pending.refused(key, batch.step, unreachable=isinstance(exc, LedgerUnreachable))
            return
        self.counts.submitted += 1
        self.pending.submitted(key, batch.step)

    def held_versions(self) -> list[int]:
        held = set(self.weights.store.complete) if self.weights is not None else set()
        return sorted(held | {0})

    def pick_version(self, step: int) -> tuple[int, str] | None:
        """The newest version held that the async window admits for ``step``, with its
        model directory; None when none is held yet."""
        v = self.versions.pick(step, self.held_versions(), self.clock.policy_version)
        if v is None:
            return None
        path = self.cfg.run.model if v == 0 else self.weights.model_dir(v)
        return None if path is None else (v, str(path))

    async def _work(self, step: int, version: int, model_dir: str) -> None:
        started = time.perf_counter()
        made = await self.make(step, version, model_dir)
        if self.versions.use(version):
            log.info("generating with policy version %d (%s)", version, model_dir)
        batch = RolloutBatch.decode(made.encoded)
        envelope = seal(self.node.identity, batch)
        notice = BatchNotice.of(batch, envelope)
        seconds = time.perf_counter() - started
        self.counts.made(notice.units, seconds, made.seconds)
        if seconds > 0:
            self.node.metrics.observe("generation_tokens_per_second", notice.units / seconds)
        await self._send(Sealed(step, version, envelope, notice))

    async def make(self, step: int, version: int, model_dir: str) -> MadeBatch:
        """The batch of ``step``, made by the child process with policy ``version`` (its
        weights in ``model_dir``), encoded and unsigned."""
        made: MadeBatch = await self.maker.call(
            MakeBatch(model_dir, self.address, step, version, self.node.header())
        )
        return made

    async def _send(self, sealed: Sealed) -> None:
        """Store, announce and submit a batch made (``unstored`` again if the disk refuses)."""
        step, version = sealed.step, sealed.version
        if why := self.clock.window(step, version):
            # the trainer moved on while we generated: a validator would reject it as
            # invalid (and slash the stake for it), so it is neither stored nor submitted
            self.counts.stale += 1
            self._done(step)
            log.warning("batch of step %d v%d not submitted: %s", step, version, why)
            return
        try:
            self.store.put(sealed.envelope)  # durable before anyone hears of it
        except OSError as exc:  # a full disk: stored again at the next pass, not made again
            self.unstored = sealed
            raise OSError(f"cannot store the batch of step {step} (kept for later): {exc}") from exc
        self._done(step)
        await self.submit(step, version, sealed.notice)

    async def submit(self, step: int, version: int, notice: BatchNotice) -> None:
        """Announce a stored batch (``notice``) and submit its work key and units on-chain."""
        key = notice.work_key
        self.node.announce(BATCH_TOPIC, notice.encode())
        self.notices[key] = notice.encode()
        try:
            await trio.to_thread.run_sync(self.ledger.submit_work, key, notice.units, version)
        except LedgerError as exc:
            self.pending.refused(key, step, unreachable=isinstance(exc, LedgerUnreachable))
            raise
        self.counts.submitted += 1
        self.pending.submitted(key, step)
        self.node.metrics.inc("batches_submitted")
        self.node.metrics.inc("tokens_generated", notice.units)
        log_progress(self.counts, self.pending, self.stake)
        log.info(
            "batch step %d v%d: %d tokens, key %s submitted",
            step,
            version,
            notice.units,
            key.hex()[:16],
        )


async def run(
    node: Node,
    cfg: NodeConfig,
    weights: Any = None,
    *,
    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The role as a service the runtime starts."""
    await InferenceRole(node, cfg, weights).serve(task_status=task_status)


def log_progress(c: WorkerCounts, pending: PendingVerdicts, stake: Stake | None) -> None:
    log.info(
        "progress: %d batches, %.1f tokens/s, accepted %d, rejected %d, waiting %d, "
        "slashed %d, pending %.6f ETH, claimable %.6f ETH",
        c.generated,
        c.tokens / c.seconds if c.seconds else 0.0,
        pending.accepted,
        pending.rejected,
        len(pending),
        stake.slashed if stake else 0,
        (stake.pending_wei if stake else 0) / WEI,
        (stake.claimable_wei if stake else 0) / WEI,
    )


def narrower_window(async_level: int, chain_staleness: int) -> int:
    """The chain refuses a submission whose version lags the newest by more than its
    ``max_staleness``: a wider ``async_level`` would generate batches only to have them
    refused (and their step lost), so the narrower of the two is the worker's window."""
    if chain_staleness < async_level:
        log.warning(
            "async_level %d is wider than the chain's max_staleness %d: using %d",
            async_level,
            chain_staleness,
            chain_staleness,
        )
    return min(async_level, chain_staleness)


def stored_batch(store: BatchStore, key: bytes) -> tuple[RolloutBatch, bytes] | None:
    """A stored batch with its envelope; None if not stored."""
    envelope = store.get(key)
    return None if envelope is None else (open_message(envelope, RolloutBatch), envelope)


def stored_step(store: BatchStore, key: bytes) -> int | None:
    """The step of a stored batch; None if it is gone or damaged (it can go too)."""
    try:
        found = stored_batch(store, key)
    except (BatchStoreError, WireError):
        return None
    return None if found is None else found[0].step


def read_stake(ledger: Any, address: str) -> Stake:
    """The worker's money as the ledger has it (blocking)."""
    w = ledger.worker(address)
    return Stake(
        stake_wei=w.stake,
        locked_wei=w.locked,
        slashed=w.slashed,
        pending_wei=ledger.pending(address),
        claimable_wei=ledger.claimable(address),
    )


async def windows_passed(ledger: Any, keys: list[bytes], infos: list[Any]) -> list[bool]:
    """For each pending submission: whether its verdict window has passed without a
    verdict (no validator can judge it now). The chain's clock decides; it is read only
    when our clock says some window has passed."""
    late = [i.status == "pending" and time.time() > i.verdict_until for i in infos]
    if not any(late):
        return late
    now = int(await trio.to_thread.run_sync(ledger.chain_time))
    out = [was and now > i.verdict_until for was, i in zip(late, infos, strict=True)]
    for key, gone in zip(keys, out, strict=True):
        if gone:
            log.warning("batch %s got no verdict within its verdict window", key.hex()[:16])
    return out
