"""The roles' access to the ledger: the node's account, and the work submitted on-chain.

Every call here blocks (JSON-RPC); roles run them with ``trio.to_thread.run_sync`` so the
node keeps answering while a transaction is mined.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ledger.client import REASONS, STATUS
from node.config import NodeConfig
from node.roles.work import ACCEPTED, Key, Verdict

WEI = 10**18


class ChainSetupError(RuntimeError):
    """The node cannot use the ledger as configured (one line for the user)."""


def open_ledger(cfg: NodeConfig, *, signing: bool = True) -> Any:
    """A ``LedgerClient`` for the configured contract, with this node's account."""
    from ledger.accounts import AccountError, load_account, read_password
    from ledger.chain import connect
    from ledger.client import LedgerClient

    if not cfg.contract:
        raise ChainSetupError("no ledger contract configured (contract / INTELLECT_NODE_CONTRACT)")
    if signing and cfg.chain_id is None:
        raise ChainSetupError("no chain id configured (chain_id): nothing is signed without one")
    account = None
    if signing:
        try:
            account = load_account(cfg.resolved_data_dir, read_password())
        except AccountError as exc:
            raise ChainSetupError(str(exc)) from exc
    try:
        return LedgerClient(
            connect(cfg.chain), cfg.contract, account, expected_chain_id=cfg.chain_id
        )
    except Exception as exc:
        raise ChainSetupError(f"cannot reach the ledger at {cfg.chain}: {exc}") from exc


@dataclass(frozen=True)
class Submission:
    worker: str  # lower-case 0x address
    key: bytes
    units: int
    policy_version: int
    block: int


class SubmissionWatcher:
    """New ``WorkSubmitted`` events since the last poll (the validator's view of claimed
    work), read up to the chain head."""

    def __init__(self, client: Any, from_block: int) -> None:
        self.client = client
        self.next_block = from_block

    def _span(self) -> dict[str, int] | None:
        """The blocks not read yet, up to the head (None: none); the caller marks them read
        once its reads succeeded (a failed poll reads them again)."""
        head = int(self.client.w3.eth.block_number)
        if head < self.next_block:
            return None
        return {"from_block": self.next_block, "to_block": head}

    def poll(self) -> list[Submission]:
        span = self._span()
        if span is None:
            return []
        logs = self.client.contract.events.WorkSubmitted.get_logs(**span)
        self.next_block = span["to_block"] + 1
        return [_submission(ev) for ev in logs]


@dataclass(frozen=True)
class Ruling:
    """A validator's vote as the chain recorded it: the verdict that stands on the
    submission ``key`` after it (accepted: its status is "accepted"; the reject reason is
    the vote's, "rejected" when an accept vote left it rejected)."""

    key: Key
    verdict: Verdict
    final: bool  # a quorum overturned the first verdict
    block: int


_REASON_NAMES = {code: name for name, code in REASONS.items()}


def _ruling(ev: Any) -> Ruling:
    args = ev["args"]
    if STATUS.get(int(args["status"])) == ACCEPTED:
        verdict = Verdict.accept("")
    else:
        verdict = Verdict.reject(_REASON_NAMES.get(int(args.get("reason", -1)), "rejected"), "")
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
        events = self.client.contract.events
        subs = events.WorkSubmitted.get_logs(**span)
        votes = list(events.WorkAccepted.get_logs(**span)) + list(
            events.WorkRejected.get_logs(**span)
        )
        self.next_block = span["to_block"] + 1
        votes.sort(key=lambda ev: (int(ev["blockNumber"]), int(ev["logIndex"])))
        return [_submission(ev) for ev in subs], [_ruling(ev) for ev in votes]


def _submission(ev: Any) -> Submission:
    return Submission(
        worker=str(ev["args"]["worker"]).lower(),
        key=bytes(ev["args"]["key"]),
        units=int(ev["args"]["units"]),
        policy_version=int(ev["args"]["policy_version"]),
        block=int(ev["blockNumber"]),
    )
