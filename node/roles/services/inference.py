"""The inference role: generate rollout batches for the assigned tasks, prove, submit.

This is where a rollout starts. For every step the run's trainer announces
(``node/roles/decisions/clock.py``), the worker draws its tasks from (its address, the step, the
index) (SPEC §12); its batch maker (``node/rollouts/maker.py``, in a child process)
generates ``group_size`` samples per task with the engine (``node/engine/``: seeded
sampling, TOPLOC proofs) and scores them, and the role seals one ``RolloutBatch``
(``protocol/rollouts.py``, where the rollout goes next). A batch the async window has
moved past while it was generated is dropped (a validator would reject it). Otherwise it
then, in this order: stores the envelope durably (``node/rollouts/store.py``: nothing
announced can be lost; a disk that refuses it, full, leaves the batch in memory, stored
again every few seconds instead of generated again), announces a ``BatchNotice`` on the
``batches`` topic, and submits the work key with its units (the generated tokens)
on-chain (``Submissions``, ``node/roles/io/submissions.py``, which follows each submission
to its verdict). Validators fetch the batch from here (``node/roles/io/exchange.py``) and judge it
(``node/roles/services/validator.py``).

The policy (``VersionChoice``, ``node/roles/decisions/working.py``): for step n the worker generates
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from ledger.client import LedgerError, WorkerInfo
from node.config import NodeConfig
from node.files import write_atomic
from node.net.runtime import Node
from node.roles.children.offload import Offload, OffloadError
from node.roles.decisions.busy import BusyTime
from node.roles.decisions.clock import StepClock
from node.roles.decisions.status import InferenceStatus, Stake
from node.roles.decisions.working import PendingVerdicts, VersionChoice
from node.roles.given import Maker, Started, Weights
from node.roles.io.chain import WEI, ChainSetupError, open_ledger
from node.roles.io.exchange import FirstServed, Served, follow_steps, serve_batches
from node.roles.io.submissions import Submissions, stored_batch
from node.rollouts.maker import BatchMaker, MadeBatch, MakeBatch, MakerSpec
from node.rollouts.store import BatchStore
from protocol.batches import BATCH_TOPIC, BatchNotice
from protocol.rollouts import RolloutBatch
from protocol.wire import seal

log = logging.getLogger("intellect.inference")
POLL_S = 1.0
REANNOUNCE_S = 20.0  # a batch still without a verdict is announced again this often


@dataclass
class WorkerCounts:
    generated: int = 0
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
    maker = Started[Maker](OffloadError, "the batch maker runs only while the role serves")

    def __init__(
        self,
        node: Node,
        cfg: NodeConfig,
        weights: Weights | None = None,
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
        self.versions = VersionChoice(cfg.run.async_level)
        # its account on-chain and its submissions until judged (node/roles/io/submissions.py)
        self.chain = Submissions(self.store, self.clock, cfg.run.async_level)
        self.maker_class = maker
        self._maker: Maker | None = None  # the child process, while the role serves
        self.done_step: int | None = None
        self.busy = BusyTime()  # generating, signing, storing, submitting
        self.served: Served | BatchStore = self.store  # every stored batch, to every peer
        self.notices: dict[bytes, bytes] = {}  # submitted key -> its encoded notice
        self.announced_at = 0.0
        self.unstored: Sealed | None = None  # made, but the disk refused it

    # ---- setup -------------------------------------------------------------------------

    def _setup(self) -> None:
        """Blocking: the ledger account, registration with stake."""
        ledger = self.chain.ledger = open_ledger(self.cfg)
        self.node.add_status("chain", ledger.health)  # its RPC URLs' faults, its transactions
        self.chain.address = ledger.address.lower()
        self.adopt_window(ledger.params().max_staleness)
        self.register(ledger.worker(self.chain.address))

    def register(self, info: WorkerInfo) -> None:
        """Blocking: stake and register this node's peer key for the account, or make sure
        the account (``info``: the ledger's record of it) is registered for it."""
        if not info.registered:
            squatter = self.chain.ledger.peer_owner(self.node.identity.public_bytes)
            if int(squatter, 16) != 0:
                raise ChainSetupError(
                    f"this node's peer key is registered by {squatter} with a signature this "
                    "node never made (a squat): the run's validators vote it out on their own; "
                    f"a validator votes now with 'intellect-node stake revoke {squatter}'"
                )
            self.chain.ledger.register_identity(
                self.node.identity, int(self.cfg.inference.stake * WEI)
            )
            log.info(
                "registered %s with %.3f ETH stake", self.chain.address, self.cfg.inference.stake
            )
        elif info.peer_key != self.node.identity.public_bytes:
            raise ChainSetupError(
                f"{self.chain.address} is registered for another peer key; this node cannot work for it"
            )

    def adopt_window(self, chain_staleness: int) -> None:
        level = narrower_window(self.cfg.run.async_level, chain_staleness)
        self.clock.async_level = self.versions.async_level = level

    def status(self) -> InferenceStatus:
        c, pending = self.counts, self.chain.pending
        return InferenceStatus(
            address=self.chain.address,
            step=self.clock.step,
            policy_version=self.clock.policy_version,
            version_used=self.versions.used,
            weights_held=self.held_versions(),
            last_batch_step=self.done_step,
            idle_share=self.busy.idle_share(time.monotonic()),
            generated=c.generated,
            submitted=self.chain.submitted,
            accepted=pending.accepted,
            rejected=pending.rejected,
            unjudged=len(pending),
            expired=pending.expired,
            tokens=c.tokens,
            errors=c.errors,
            stale=c.stale,
            tokens_per_s=round(c.tokens / c.seconds, 1) if c.seconds else 0.0,
            generation_s=round(c.generation, 3),
            stake=self.chain.stake,
            rejected_by_reason=dict(pending.rejected_by_reason),
        )

    # ---- the loop ----------------------------------------------------------------------

    async def serve(
        self, *, task_status: trio.TaskStatus[InferenceRole] = trio.TASK_STATUS_IGNORED
    ) -> None:
        if self.cfg.net.bootstrap:  # nothing staked before a peer of the run answered
            await until_run_peers(lambda: len(self.node.peers.peers), self.cfg, log.warning)
        await trio.to_thread.run_sync(self._setup)
        async with Offload.of(self.maker_class, MakerSpec, self.cfg) as maker:
            self.maker = maker
            await self._serve(task_status)

    async def _serve(self, task_status: trio.TaskStatus[InferenceRole]) -> None:
        first = FirstServed(  # the run's trainer and validators before anyone else
            self.cfg.run.trainer_peer_id,
            self.chain.ledger.is_validator,
            chain_id=int(self.cfg.chain.id or 0),
            contract=self.cfg.chain.contract or "",
        )
        serve_batches(self.node, self.served, first=first)
        follow_steps(self.node, self.clock)
        self.node.add_status("inference", lambda: self.status().as_dict())
        self._resume_pending()
        self.busy.since = time.monotonic()
        task_status.started(self)
        try:
            await self.chain.refresh()  # resubmits what a crash left unsubmitted
        except LedgerError as exc:  # the chain not answering yet: the loop reads it again
            log.warning("cannot read the chain yet: %s", exc)
        for key in self.chain.pending.keys():  # and tells validators where to fetch it again
            if stored := stored_batch(self.store, key):
                self.node.announce(BATCH_TOPIC, BatchNotice.of(*stored).encode())
        while True:
            try:
                await self.chain.refresh()
                await self.chain.forget_spent()
                self._reannounce()
                if self.unstored is not None:  # the disk refused it: store it, not make anew
                    sealed, self.unstored = self.unstored, None
                    await self._send(sealed)
                    continue
                step = self.clock.step
                if (
                    step is None
                    or step == self.done_step
                    or len(self.chain.pending) >= self.cfg.inference.max_unjudged
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
        pending = set(self.chain.pending.keys())
        self.notices = {k: n for k, n in self.notices.items() if k in pending}
        for body in self.notices.values():
            try:
                self.node.announce(BATCH_TOPIC, body)
            except trio.WouldBlock:  # the publisher's queue is full: next time
                return

    def _resume_pending(self) -> None:
        """After a restart: the stored batches still without a verdict are pending, and the
        last step worked on is not worked on again (same tasks, same work key)."""
        self.chain.pending.restored(self.store.keys())
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

    def held_versions(self) -> list[int]:
        held = set(self.weights.store.complete) if self.weights is not None else set()
        return sorted(held | {0})

    def pick_version(self, step: int) -> tuple[int, str] | None:
        """The newest version held that the async window admits for ``step``, with its
        model directory; None when none is held yet."""
        v = self.versions.pick(step, self.held_versions(), self.clock.policy_version)
        if v is None:
            return None
        if v == 0:
            path = self.cfg.run.model
        else:
            assert self.weights is not None  # held_versions: only version 0 without them
            path = self.weights.model_dir(v)
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
        return await self.maker.call(
            MakeBatch(model_dir, self.chain.address, step, version, self.node.header())
        )

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
        await self.chain.submit(key, step, notice.units, version)
        self.node.metrics.inc("batches_submitted")
        self.node.metrics.inc("tokens_generated", notice.units)
        log_progress(self.counts, self.chain.pending, self.chain.stake)
        log.info(
            "batch step %d v%d: %d tokens, key %s submitted",
            step,
            version,
            notice.units,
            key.hex()[:16],
        )


PEERS_LINE_EVERY = 10.0  # seconds between the lines of a worker that reached no peer yet


async def until_run_peers(
    peers: Callable[[], int], cfg: NodeConfig, say: Callable[[str], None]
) -> None:
    """Return once ``peers()`` (the peers of the run that greeted this node) is not zero;
    until then, one line every ``PEERS_LINE_EVERY`` seconds: the worker stakes nothing
    while it has found none of its run (an unreachable bootstrap must not cost a stake)."""
    waited = 0.0
    while not peers():
        if waited % PEERS_LINE_EVERY == 0:
            say(
                f"no peer of run {cfg.run.id} reached yet (bootstrap: "
                f"{', '.join(cfg.net.bootstrap)}): nothing is staked until one answers"
            )
        await trio.sleep(1.0)
        waited += 1.0


async def run(
    node: Node,
    cfg: NodeConfig,
    weights: Weights | None = None,
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
