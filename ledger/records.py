"""What the ledger client's parts share: its errors, the contract's records as typed
values, and how a read survives a node restarting (``retry``).

The parts (``ledger/reads.py``, ``ledger/transactions.py``, ``ledger/events.py``) and the
``LedgerClient`` that composes them (``ledger/client.py``) all raise these errors.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from decimal import Decimal
from typing import TypeVar

from requests.exceptions import Timeout

T = TypeVar("T")
RETRIES = 3
WEI = 10**18


class LedgerError(RuntimeError):
    """A ledger operation that could not be done, with a message for the user."""


class LedgerUnreachable(LedgerError):
    """The chain did not answer (down, restarting): nothing was refused; try again later."""


class LedgerRevert(LedgerError):
    """The contract refused: ``reason`` is its revert reason."""

    def __init__(self, call: str, reason: str) -> None:
        super().__init__(f"{call} reverted: {reason}")
        self.call = call
        self.reason = reason


class LedgerOutOfGas(LedgerError):
    """A transaction used all the gas it was given."""


class LedgerPending(LedgerError):
    """Sent, but not mined within the timeout: it may still be; do not send it again."""

    def __init__(self, call: str, tx_hash: str, timeout: float) -> None:
        super().__init__(
            f"{call}: transaction {tx_hash} not mined within {timeout:.0f} s; it may still be "
            "mined, so do not send it again (check its hash, or the state, first)"
        )
        self.tx_hash = tx_hash


@dataclass(frozen=True)
class Params:
    """The run parameters (SPEC.md section 12); the contract bounds each one."""

    min_stake: int
    reward_per_unit: int
    max_units: int
    collateral_bps: int
    validator_share_bps: int
    verdict_window: int
    fetch_deadline: int
    reward_lock: int
    unbonding_delay: int
    max_staleness: int
    quorum: int

    def as_tuple(self) -> tuple[int, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))


@dataclass(frozen=True)
class WorkerInfo:
    peer_key: bytes
    stake: int  # bonded, including ``locked``
    locked: int  # collateral of unsettled work and bonds of standing rejects
    unbonding: int
    unbond_at: int
    accepted: int
    rejected: int
    slashed: int

    @property
    def registered(self) -> bool:
        return self.peer_key != bytes(32)

    @property
    def free(self) -> int:
        return self.stake - self.locked


@dataclass(frozen=True)
class SubmissionInfo:
    index: int
    units: int
    policy_version: int
    submitted_at: int
    fetch_after: int
    verdict_until: int
    unlock_at: int
    reward: int
    collateral: int
    validator_share_bps: int
    quorum: int
    status: str  # none, pending, accepted, rejected
    final: bool
    settled: bool
    reason: int
    rejecter: str
    accept_votes: int
    reject_votes: int


def rpc_message(exc: Exception) -> str:
    """The message a JSON-RPC node gave, without web3's wrapping."""
    response = getattr(exc, "rpc_response", None)
    if isinstance(response, dict) and isinstance(response.get("error"), dict):
        return str(response["error"].get("message", exc))
    return str(getattr(exc, "message", None) or exc)


def retry(fn: Callable[[], T]) -> T:
    """``fn`` again after a connection that failed (refused, reset: a node restarting), at
    most ``RETRIES`` times; not after one that timed out (a node that accepts and does not
    answer would hold the caller three times as long)."""
    delay = 0.2
    for attempt in range(RETRIES):
        try:
            return fn()
        except (ConnectionError, TimeoutError, OSError) as exc:
            if isinstance(exc, Timeout | TimeoutError):
                raise LedgerUnreachable(f"the chain did not answer in time: {exc}") from exc
            if attempt == RETRIES - 1:
                raise LedgerUnreachable(f"chain unreachable after {RETRIES} tries: {exc}") from exc
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


def fmt_eth(wei: int) -> str:
    return f"{Decimal(wei) / WEI:f} ETH"
