"""The roles' access to the ledger: the node's account, and the work submitted on-chain.

Every call here blocks (JSON-RPC); roles run them with ``trio.to_thread.run_sync`` so the
node keeps answering while a transaction is mined.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from ledger.codes import REASON_NAMES, STATUS
from node.config import NodeConfig
from node.roles.decisions.assignment import ValidatorTerms
from node.roles.decisions.work import ACCEPTED, Ruling, Submission, Verdict
from node.roles.given import EventSource, RegistrationViews

log = logging.getLogger("intellect.chain")

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount
    from web3.types import EventData

    from ledger.client import LedgerClient

WEI = 10**18


class ChainSetupError(RuntimeError):
    """The node cannot use the ledger as configured (one line for the user)."""


def open_ledger(cfg: NodeConfig, *, signing: bool = True) -> LedgerClient:
    """A ``LedgerClient`` for the configured contract, with this node's account."""
    from ledger.accounts import AccountError, load_account, read_password

    if not cfg.chain.contract:
        raise ChainSetupError(
            "no ledger contract configured ([chain] contract: --contract, INTELLECT_NODE_CHAIN__CONTRACT)"
        )
    if signing and cfg.chain.id is None:
        raise ChainSetupError("no chain id configured (chain_id): nothing is signed without one")
    account = None
    if signing:
        try:
            account = load_account(cfg.resolved_data_dir, read_password(cfg.chain.password_file))
        except AccountError as exc:
            raise ChainSetupError(str(exc)) from exc
    try:
        return ledger_client(cfg, cfg.chain.url, cfg.chain.contract, account, cfg.chain.id)
    except Exception as exc:
        raise ChainSetupError(f"cannot reach the ledger at {cfg.chain.url}: {exc}") from exc


def ledger_client(
    cfg: NodeConfig,
    url: str,
    contract: str,
    account: LocalAccount | None,
    chain_id: int | None,
) -> LedgerClient:
    """A ``LedgerClient`` with the node's chain settings: its URLs in turn (each request
    ``rpc_timeout_s`` at most), the account's
    nonce journal in the data directory (shared by the node and the CLI), the
    confirmations (the configured ones, else the chain id's default), the replacement
    delay and fee cap."""
    from ledger.chain import connect, default_confirmations
    from ledger.client import LedgerClient

    chain = connect(url, timeout=cfg.chain.rpc_timeout_s, expected_chain_id=chain_id)
    journal = None
    if account is not None:
        journal = cfg.resolved_data_dir / "nonces" / f"{str(account.address).lower()}.json"
    c = cfg.chain
    confirmations = c.confirmations
    if confirmations is None:
        confirmations = default_confirmations(chain_id or chain.chain_id)
    return LedgerClient(
        chain,
        contract,
        account,
        timeout=c.tx_timeout_s,
        expected_chain_id=chain_id,
        journal=journal,
        confirmations=confirmations,
        replace_after=c.replace_after_s,
        max_fee=int(c.max_fee_gwei * 10**9),
    )


REGISTRATION_EVENTS = ("Registered", "PeerKeyChanged", "RegistrationRevoked")
# the validators' terms (ValidatorTerms: who may vote on work submitted when)
VALIDATOR_EVENTS = ("ValidatorProposed", "ValidatorRemoved")


def read_events(
    client: EventSource, names: tuple[str, ...], span: dict[str, int]
) -> list[EventData]:
    """The contract's events of the kinds ``names`` in the blocks of ``span``, in chain
    order, read with one ``eth_getLogs`` (``ledger/events.py``)."""
    return client.log.read(names, span["from_block"], span["to_block"])


class Registrations:
    """Each worker's registration as the validator checks it: (peer key, whether its stored
    signature is valid), read once from the chain and kept until the chain logs a change
    (``Registered``, ``PeerKeyChanged``, ``RegistrationRevoked``: ``changed``). The watcher
    reads those events in the same poll as the submissions, before it hands them out, so it
    knows of every change after a submission it hands out. A submission is judged against
    the registration as of its own block (``get(worker, block)``): the one kept while no
    change came after that block, else a read of the chain as of the block. A worker that
    rotated its key after submitting, to serve one validator a batch signed with the new
    key and the others with the old, split them (issue #54): the validators judging after
    the rotation rejected with a bond, those before accepted and overturned them.
    Thread-safe: a read that a change overtook is not kept."""

    def __init__(self, client: RegistrationViews) -> None:
        self.client = client
        self.known: dict[str, tuple[bytes, bool]] = {}
        self.changes: dict[str, int] = {}
        self.changed_at: dict[str, int] = {}  # the newest block that logged a change
        self.unchecked: set[str] = set()  # changed since ``take_changed`` (revocations)
        self.reads = 0  # chain reads so far (a test counts them)
        self.lock = threading.Lock()

    def get(self, worker: str, block: int | None = None) -> tuple[bytes, bool]:
        """As of ``block`` (default: now)."""
        worker = worker.lower()
        with self.lock:  # kept: the registration now, the same as of any block since the
            # last change the watcher logged (it logs every change before the work after it)
            past = block is not None and self.changed_at.get(worker, -1) > block
            if not past and worker in self.known:
                return self.known[worker]
            seen = self.changes.get(worker, 0)
        # as of the block, not the head: a change mined since the last poll must not count
        got = self._read(worker, block)
        with self.lock:
            self.reads += 1
            if not past and self.changes.get(worker, 0) == seen:
                self.known[worker] = got
        return got

    def _read(self, worker: str, block: int | None) -> tuple[bytes, bool]:
        if block is None:
            return self.client.registration_status(worker)
        try:
            return self.client.registration_status(worker, block)
        except Exception as exc:  # a node that no longer keeps that block's state
            log.warning(
                "registration of %s as of block %d not read (%s): read now", worker, block, exc
            )
            return self.client.registration_status(worker)

    def changed(self, worker: str, block: int | None = None) -> None:
        """The chain logged a change of ``worker``'s registration (in ``block``)."""
        worker = worker.lower()
        with self.lock:
            self.known.pop(worker, None)
            self.changes[worker] = self.changes.get(worker, 0) + 1
            self.unchecked.add(worker)
            if block is not None:
                self.changed_at[worker] = max(block, self.changed_at.get(worker, -1))

    def take_changed(self) -> set[str]:
        """The workers whose registration the chain logged a change of since the last call
        (every registration since the watcher's first block, at the first call)."""
        with self.lock:
            taken, self.unchecked = self.unchecked, set()
        return taken


class SubmissionWatcher:
    """New ``WorkSubmitted`` events since the last poll (the validator's view of claimed
    work), read up to the chain head; with ``registrations``, the registration changes in
    the same blocks are passed to it first; with ``terms``, the validators' appointments and
    removals (each takes effect after a timelock, so one read in the same poll is never
    late for a submission of that poll)."""

    def __init__(
        self,
        client: EventSource,
        from_block: int,
        registrations: Registrations | None = None,
        terms: ValidatorTerms | None = None,
    ) -> None:
        self.client = client
        self.next_block = from_block
        self.registrations = registrations
        self.terms = terms  # with it, the validators' terms are followed too
        self.head = from_block - 1  # the newest block read

    def _span(self) -> dict[str, int] | None:
        """The blocks not read yet, up to the newest confirmed one (None: none; a reorg no
        deeper than the confirmations cannot take back what was read); the caller marks them
        read once its reads succeeded (a failed poll reads them again)."""
        head = self.client.confirmed_head()
        if head < self.next_block:
            return None
        return {"from_block": self.next_block, "to_block": head}

    def poll(self) -> list[Submission]:
        span = self._span()
        if span is None:
            return []
        names = ("WorkSubmitted",) + (REGISTRATION_EVENTS if self.registrations else ())
        names += VALIDATOR_EVENTS if self.terms is not None else ()
        events = read_events(self.client, names, span)
        self.next_block = span["to_block"] + 1
        self.head = span["to_block"]
        subs = []
        for ev in events:
            if ev["event"] == "WorkSubmitted":
                subs.append(_submission(ev))
            elif ev["event"] == "ValidatorProposed" and self.terms is not None:
                self.terms.proposed(str(ev["args"]["validator"]), int(ev["args"]["active_at"]))
            elif ev["event"] == "ValidatorRemoved" and self.terms is not None:
                self.terms.removed(str(ev["args"]["validator"]), int(ev["args"]["removed_at"]))
            elif self.registrations is not None:
                self.registrations.changed(str(ev["args"]["worker"]), int(ev["blockNumber"]))
        return subs


def _ruling(ev: EventData) -> Ruling:
    args = ev["args"]
    if STATUS.get(int(args["status"])) == ACCEPTED:
        verdict = Verdict.accept("")
    else:
        verdict = Verdict.reject(REASON_NAMES.get(int(args.get("reason", -1)), "rejected"), "")
    return Ruling(
        key=(str(args["worker"]).lower(), bytes(args["key"])),
        verdict=verdict,
        final=bool(args["final"]),
        block=int(ev["blockNumber"]),
    )


class WorkWatcher(SubmissionWatcher):
    """Submissions and verdicts since the last poll, in chain order (the trainer's view of
    accepted work: the chain, never gossip)."""

    def poll_work(self) -> tuple[list[Submission], list[Ruling]]:
        span = self._span()
        if span is None:
            return [], []
        events = read_events(self.client, ("WorkSubmitted", "WorkAccepted", "WorkRejected"), span)
        self.next_block = span["to_block"] + 1
        subs = [_submission(ev) for ev in events if ev["event"] == "WorkSubmitted"]
        return subs, [_ruling(ev) for ev in events if ev["event"] != "WorkSubmitted"]


def _submission(ev: EventData) -> Submission:
    return Submission(
        worker=str(ev["args"]["worker"]).lower(),
        key=bytes(ev["args"]["key"]),
        units=int(ev["args"]["units"]),
        policy_version=int(ev["args"]["policy_version"]),
        block=int(ev["blockNumber"]),
        block_hash=bytes(ev["blockHash"]),
    )


class PacedReads:
    """When to read the chain: at once after ``nudge`` (a batch notice: its submission is on
    its way), else at intervals that double from ``min_s`` up to ``max_s`` while nothing
    new turns up (a submission nobody announced is seen within ``max_s``); at most one read
    per ``min_s``, however many nudges come."""

    def __init__(self, min_s: float, max_s: float) -> None:
        self.min_s, self.max_s = min_s, max_s
        self._news = trio.Event()

    def nudge(self) -> None:
        self._news.set()

    async def run(self, read: Callable[[], Awaitable[bool]]) -> None:
        """``read()`` for ever; it returns whether it found anything new."""
        interval = self.min_s
        while True:
            found = await read()
            read_at = trio.current_time()
            interval = self.min_s if found else min(self.max_s, 2 * interval)
            with trio.move_on_after(interval):
                await self._news.wait()
            if self._news.is_set():
                self._news = trio.Event()
                interval = self.min_s
                await trio.sleep_until(read_at + self.min_s)
