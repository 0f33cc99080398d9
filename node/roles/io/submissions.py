"""The worker's side of the chain: its account, and each batch it submitted followed to a
verdict.

The inference role (``node/roles/services/inference.py``) makes, stores and announces a batch and
hands its work key here: ``submit`` sends it on-chain (``ledger/client.py``). From then on
``refresh`` reads the submissions still without a verdict when the chain can have changed
(``ChainReads``, ``node/roles/decisions/working.py``) and settles them in ``PendingVerdicts``; a
batch stored but never submitted (a crash between the two) is submitted again; a batch
whose verdict window passed unjudged waits no more. ``forget_spent`` deletes the stored
batches nobody fetches any more (``StoreRetention``), and the worker's money is read after
verdicts (``stake``, shown in ``/status``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import trio

from ledger.client import LedgerError, LedgerUnreachable, SubmissionInfo
from ledger.codes import REASON_NAMES
from node.roles.decisions.clock import StepClock
from node.roles.decisions.status import Stake
from node.roles.decisions.working import ChainReads, PendingVerdicts, StoreRetention
from node.roles.given import ChainClock, StakeViews, Started, WorkerLedger
from node.roles.io.chain import ChainSetupError
from node.rollouts.store import BatchStore, BatchStoreError
from protocol.errors import WireError
from protocol.rollouts import RolloutBatch
from protocol.wire import open_message

log = logging.getLogger("intellect.inference")


class Submissions:
    """The worker's account on-chain (``ledger``, ``address``, ``stake``) and its submitted
    batches (``pending``) until each is judged, expired, and spent."""

    ledger = Started[WorkerLedger](ChainSetupError, "the ledger is opened when the role starts")

    def __init__(self, store: BatchStore, clock: StepClock, async_level: int) -> None:
        self.store, self.clock = store, clock
        self._ledger: WorkerLedger | None = None  # opened when the role starts
        self.address = ""
        self.pending = PendingVerdicts()  # submitted, no verdict yet
        self.reads = ChainReads()
        self.retention = StoreRetention(async_level)  # when stored batches are deleted
        self.stake: Stake | None = None
        self.submitted = 0  # submissions the chain took

    async def submit(self, key: bytes, step: int, units: int, version: int) -> None:
        """Submit a stored batch's work key and units on-chain; it waits for its verdict."""
        try:
            await trio.to_thread.run_sync(self.ledger.submit_work, key, units, version)
        except LedgerError as exc:
            self.pending.refused(key, step, unreachable=isinstance(exc, LedgerUnreachable))
            raise
        self.submitted += 1
        self.pending.submitted(key, step)

    async def refresh(self) -> None:
        """Settle what the chain judged since the last read; read the money after verdicts."""
        waiting = len(self.pending)
        # as of the newest confirmed block: a verdict a reorg can still take back is not one
        head = await trio.to_thread.run_sync(self.ledger.confirmed_head) if waiting else None
        if head is not None and self.reads.statuses_due(head):
            keys = self.pending.keys()
            infos = await trio.to_thread.run_sync(
                lambda: [self.ledger.submission(self.address, k, head) for k in keys]
            )
            late = await windows_passed(self.ledger, keys, infos)
            for key, info, gone in zip(keys, infos, late, strict=True):
                reason = REASON_NAMES.get(info.reason, "rejected")
                if (line := verdict_line(key, info, reason)) is not None:
                    (log.info if info.status == "accepted" else log.warning)("%s", line)
                if self.pending.settle(
                    key, info.status, reason, window_passed=gone, unlock_at=info.unlock_at
                ):
                    await self._resubmit(key)  # stored, but a crash came before the submission
        if self.reads.money_due(time.monotonic(), len(self.pending) < waiting):
            self.stake = await trio.to_thread.run_sync(read_stake, self.ledger, self.address)

    async def _resubmit(self, key: bytes) -> None:
        if (found := stored_batch(self.store, key)) is None:
            return
        batch = found[0]
        try:
            await self.submit(key, batch.step, batch.num_tokens, batch.policy_version)
        except LedgerError as exc:
            log.warning("stored batch %s not submitted: %s", key.hex()[:16], exc)

    async def forget_spent(self) -> None:
        """Delete the stored batches nobody fetches again (``PendingVerdicts.spent``)."""
        floor = self.retention.floor(time.monotonic(), self.clock, len(self.pending.settled))
        if floor is None:
            return
        chain_now = await trio.to_thread.run_sync(self.ledger.chain_time)
        for key in self.pending.spent(floor, chain_now, lambda k: stored_step(self.store, k)):
            self.store.delete(key)


def local_record(data_dir: Path, address: str) -> LocalRecord:
    """What this node believes of ``address``'s work, from its data directory: the keys of
    the batches it stores (each stored batch is submitted), and the transactions its nonce
    journal holds as sent and not confirmed ((nonce, call, hash)). Compared with the chain
    by ``rewards history`` and the dashboard (``ledger.accounthistory.disagreements``)."""
    from ledger.nonces import NonceJournal

    batches = data_dir / "batches"
    stored = {"0x" + k.hex() for k in BatchStore(batches).keys()} if batches.is_dir() else set()
    journal = data_dir / "nonces" / f"{address.lower()}.json"
    unconfirmed = []
    if journal.exists():
        for nonce, call, hashes, _raw in NonceJournal(journal).unfinished():
            unconfirmed.append((nonce, call, "0x" + hashes[-1].hex()))
    return LocalRecord(stored, unconfirmed)


@dataclass(frozen=True)
class LocalRecord:
    stored: set[str]  # work keys, 0x hex
    unconfirmed: list[tuple[int, str, str]]  # (nonce, call, transaction hash)


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


def verdict_line(key: bytes, info: SubmissionInfo, reason: str) -> str | None:
    """The line a worker logs for the verdict on its batch ``key`` (None: none yet). Each
    pending batch is read until it has one, so each verdict is said once."""
    votes = f"{info.accept_votes} accept, {info.reject_votes} reject"
    if info.status == "accepted":
        return f"batch {key.hex()[:16]} accepted ({votes}): reward {info.reward / 1e18:.6f} ETH"
    if info.status == "rejected":
        by = f" by validator {info.rejecter}" if int(info.rejecter or "0", 16) else ""
        return (
            f"batch {key.hex()[:16]} rejected{by}: {reason} ({votes}); its collateral of "
            f"{info.collateral / 1e18:.6f} ETH is slashed when the verdict matures"
        )
    return None


def read_stake(ledger: StakeViews, address: str) -> Stake:
    """The worker's money as the ledger has it (blocking)."""
    w = ledger.worker(address)
    return Stake(
        stake_wei=w.stake,
        locked_wei=w.locked,
        slashed=w.slashed,
        pending_wei=ledger.pending(address),
        claimable_wei=ledger.claimable(address),
    )


async def windows_passed(
    ledger: ChainClock, keys: list[bytes], infos: list[SubmissionInfo]
) -> list[bool]:
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
