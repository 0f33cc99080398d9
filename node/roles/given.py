"""What a role is given: the services it calls, each as the protocol of what it calls on it.

A role is built from the node (``node/net/runtime.py``), the config, and these services:
- the ledger (``ledger/client.py``'s ``LedgerClient``, opened by ``open_ledger`` in
  ``node/roles/io/chain.py``), by concern as the client is split: ``LedgerViews`` (its reads),
  ``LedgerWrites`` (the transactions a role sends, from its account), ``EventLog`` (the
  contract's events); each role's ledger is the part of them it calls (``WorkerLedger``,
  ``ValidatorLedger``, ``TrainerLedger``);
- the weights (SHARDCAST, ``node/shardcast/service.py``'s ``WeightService``): ``Weights``;
- its child process (``node/roles/children/offload.py``'s ``Offload``): the validator's ``Checker``,
  the worker's ``Maker``.

The real services satisfy these by their shape (mypy checks it where the runtime hands them
over); so do the tests' doubles, which implement only what a role calls.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, overload, runtime_checkable

if TYPE_CHECKING:
    import trio
    from web3.types import EventData

    from ledger.client import Params, PeerIdentity, SubmissionInfo, WorkerInfo
    from node.config import NodeConfig
    from node.net.runtime import Node
    from node.roles.children.checking import CheckBatch
    from node.roles.decisions.work import Verdict
    from node.rollouts.maker import MadeBatch, MakeBatch

# ---- the ledger, by concern ---------------------------------------------------------------


class ChainClock(Protocol):
    """The chain's head and its clock."""

    def head(self) -> int: ...

    def chain_time(self) -> int: ...


class StakeViews(Protocol):
    """A worker's money as the contract keeps it."""

    def worker(self, account: str) -> WorkerInfo: ...

    def pending(self, account: str) -> int: ...

    def claimable(self, account: str) -> int: ...


class LedgerViews(ChainClock, StakeViews, Protocol):
    """The contract's views a role reads (``ledger/reads.py``)."""

    def params(self) -> Params: ...

    def submission(self, worker: str, key: bytes, block: int | None = None) -> SubmissionInfo: ...

    def registration(self, account: str) -> tuple[bytes, bytes]: ...

    def registration_status(self, account: str, block: int | None = None) -> tuple[bytes, bool]: ...

    def block_time(self, block: int) -> int: ...

    def is_validator(self, account: str) -> bool: ...

    def voucher(self, peer: str) -> bytes: ...

    def validator_until(self, account: str) -> int: ...

    def policy_version(self) -> int: ...

    def owner(self) -> str: ...


class EventLog(Protocol):
    """The contract's events of a span of blocks, in chain order (``ledger/events.py``)."""

    def read(self, names: tuple[str, ...], from_block: int, to_block: int) -> list[EventData]: ...


class EventSource(ChainClock, Protocol):
    """What reads the chain's events block by block: its head and its event log."""

    @property
    def log(self) -> EventLog: ...

    def confirmed_head(self) -> int:
        """The newest block deep enough to act on (``ledger.client.LedgerClient``)."""
        ...


class RegistrationViews(Protocol):
    """Each worker's registration: (peer key, whether its signature is valid)."""

    def registration_status(self, account: str, block: int | None = None) -> tuple[bytes, bool]: ...


@runtime_checkable
class SubmissionViews(ChainClock, StakeViews, Protocol):
    """What a worker reads of its submissions and its money (``Submissions.refresh``)."""

    def confirmed_head(self) -> int: ...

    def submission(self, worker: str, key: bytes, block: int | None = None) -> SubmissionInfo: ...


class WorkerLedger(SubmissionViews, Protocol):
    """The inference role's ledger: its stake and registration, its submissions."""

    @property
    def address(self) -> str: ...

    def params(self) -> Params: ...

    def register_identity(self, identity: PeerIdentity, stake: int) -> object: ...

    def peer_owner(self, peer_key: bytes) -> str: ...

    def is_validator(self, account: str) -> bool: ...

    def submit_work(self, key: bytes, units: int, policy_version: int) -> object: ...


class VoteLedger(Protocol):
    """A validator's votes (``node/roles/io/votes.py``): each sent, then followed to its
    confirmations (``wait``, which raises what a refused or failed vote raises)."""

    def send_vote(self, worker: str, key: bytes, accept: bool, reason: str = "invalid") -> Any: ...

    def wait(self, p: Any) -> object: ...


class ValidatorLedger(EventSource, RegistrationViews, VoteLedger, Protocol):
    """The validator role's ledger: whether it may vote, the submissions, its votes."""

    @property
    def address(self) -> str: ...

    def params(self) -> Params: ...

    def is_validator(self, account: str) -> bool: ...

    def validator_until(self, account: str) -> int: ...

    def block_time(self, block: int) -> int: ...

    def submission(self, worker: str, key: bytes, block: int | None = None) -> SubmissionInfo: ...

    def revoke_registration(self, worker: str) -> object: ...


class TrainerLedger(EventSource, Protocol):
    """The trainer role's ledger: the work judged, the policy version it publishes."""

    @property
    def address(self) -> str: ...

    def owner(self) -> str: ...

    def worker(self, account: str) -> WorkerInfo: ...

    def registration(self, account: str) -> tuple[bytes, bytes]: ...

    def policy_version(self) -> int: ...

    def set_policy_version(self, version: int) -> object: ...


# ---- the weights ---------------------------------------------------------------------------


class HeldVersions(Protocol):
    """The versions held complete on disk (``WeightStore``)."""

    @property
    def complete(self) -> Mapping[int, object]: ...


class Weights(Protocol):
    """SHARDCAST as a role uses it: the versions held, their files, pulling and publishing."""

    @property
    def store(self) -> HeldVersions: ...

    @property
    def newest_known(self) -> int: ...

    def model_dir(self, version: int) -> Path | None: ...

    def keep_needed(self, needed: Callable[[], Collection[int]]) -> None: ...

    async def pull(self, version: int | None = None, *, now: bool = False) -> int: ...

    async def publish(
        self, src: Path, *, version: int | None = None, step: int | None = None
    ) -> dict[str, Any]: ...


# ---- the child processes --------------------------------------------------------------------


class Child(Protocol):
    """A child process that may die (``Offload``)."""

    def alive(self) -> bool: ...


class Checker(Child, Protocol):
    """The validator's batch checker: checks 4-6 of a fetched batch (``BatchChecker``)."""

    async def call(self, call: CheckBatch) -> Verdict: ...


class Maker(Child, Protocol):
    """The worker's batch maker: one batch per call (``BatchMaker``)."""

    async def call(self, call: MakeBatch) -> MadeBatch: ...


# ---- the role itself ------------------------------------------------------------------------


class RoleRun(Protocol):
    """``run(node, cfg, weights, *, task_status)`` of a role (``node/roles/__init__.py``)."""

    def __call__(
        self,
        node: Node,
        cfg: NodeConfig,
        weights: Weights | None = None,
        *,
        task_status: trio.TaskStatus[Any] = ...,
    ) -> Awaitable[None]: ...


# ---- what a role holds only once it has started ------------------------------------------

T = TypeVar("T")


class Started(Generic[T]):
    """A part a role (or a part of it) holds only once the role has started: its ledger, its
    child process. Read before, it raises ``error(message)``; assigned, it is held (the tests
    assign their doubles). The value lives in the instance's ``_<name>``, None until then,
    which code that must not raise may read as it is."""

    def __init__(self, error: Callable[[str], Exception], message: str) -> None:
        self.error, self.message = error, message
        self.slot = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = f"_{name}"

    @overload
    def __get__(self, obj: None, owner: type) -> Started[T]: ...
    @overload
    def __get__(self, obj: object, owner: type) -> T: ...
    def __get__(self, obj: object | None, owner: type) -> Started[T] | T:
        if obj is None:
            return self
        value: T | None = getattr(obj, self.slot, None)
        if value is None:
            raise self.error(self.message)
        return value

    def __set__(self, obj: object, value: T) -> None:
        setattr(obj, self.slot, value)
