"""What each role shows in ``/status`` (its ``add_status`` section), as typed models.

``as_dict`` gives the JSON the devnet, the CLI, the bench and the tests read: the keys
are part of the node's interface, so they are written out here, once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Stake:
    """The worker's money on the ledger, in wei (``slashed``: times slashed)."""

    stake_wei: int
    locked_wei: int
    slashed: int
    pending_wei: int
    claimable_wei: int


@dataclass(frozen=True)
class InferenceStatus:
    address: str
    step: int | None
    policy_version: int
    version_used: int | None
    weights_held: list[int]
    last_batch_step: int | None
    cheat: str
    idle_share: float
    generated: int
    submitted: int
    accepted: int
    rejected: int
    unjudged: int  # submitted, no verdict yet
    tokens: int
    errors: int
    stale: int  # generated, then left unsubmitted: the window had moved past it
    tokens_per_s: float
    stake: Stake | None = None  # None until first read from the ledger

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        stake = out.pop("stake")
        return {**out, **(stake or {})}


@dataclass(frozen=True)
class ValidatorStatus:
    address: str
    step: int | None
    judged: int
    accepted: int
    rejected: int
    rejected_by_reason: dict[str, int]
    fetch_failures: int
    unposted: int
    removed_at: int | None  # when removed as a validator on-chain (timestamp)
    not_ours: int  # submissions after the removal, left to the other validators
    judge_seconds: float
    idle_share: float
    waiting: int  # keys tracked, not judged yet
    recent: list[dict[str, Any]] = field(default_factory=list)  # the last verdicts posted

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TrainerStatus:
    step: int
    policy_version: int
    train_steps: int
    done: bool
    accepted: int
    rejected: int
    slashed: int
    usable: int
    batches_used: int
    tokens_trained: int
    idle_share: float
    last: dict[str, Any] = field(default_factory=dict)  # step, reward_mean, heldout_accuracy

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
