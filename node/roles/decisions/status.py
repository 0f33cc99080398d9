"""What each role shows in ``/status`` (its ``add_status`` section), as typed models.

``as_dict`` gives the JSON the devnet, the CLI, the bench and the tests read: the keys
are part of the node's interface, so they are written out here, once.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from typing import Any

from node.roles.decisions.work import ACCEPTED

LATENCY_WINDOW = 200  # verdicts the latency figures are over
TALLY_WORKERS = 256  # workers whose verdicts a validator's /status counts (the latest)
CURVE_POINTS = 500  # trainer steps the learning curve in /status keeps


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
    idle_share: float
    generated: int
    submitted: int
    accepted: int
    rejected: int
    unjudged: int  # submitted, no verdict yet
    expired: int  # submitted, no verdict within the verdict window (never paid)
    tokens: int
    errors: int
    stale: int  # generated, then left unsubmitted: the window had moved past it
    tokens_per_s: float
    # seconds the batch maker spent generating them (proofs and scores; no model loading)
    generation_s: float = 0.0
    stake: Stake | None = None  # None until first read from the ledger
    rejected_by_reason: dict[str, int] = field(default_factory=dict)  # the ledger's reasons

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
    given_up: int  # batches that could not be judged (JudgingQueue.check_tries times)
    # judge = "assigned": submissions assigned to others (or a backup a verdict made
    # unneeded), backups waiting for their time, and backups taken (no verdict by then)
    left_to_others: int = 0
    backups_held: int = 0
    backups_taken: int = 0
    # submissions before this start whose verdict window had closed: not judged (a vote
    # would be refused), not fetched
    windows_closed: int = 0
    recent: list[dict[str, Any]] = field(default_factory=list)  # the last verdicts posted
    # seconds from seeing a submission on-chain to posting its verdict (VerdictLatency)
    latency_s: dict[str, float | int | None] = field(default_factory=dict)
    # per worker address, its verdicts by reason (WorkerTally: the latest workers)
    by_worker: dict[str, dict[str, int]] = field(default_factory=dict)

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
    # step, reward_mean, heldout_sampled (the headline), heldout_greedy
    last: dict[str, Any] = field(default_factory=dict)
    # per step, oldest first (the last CURVE_POINTS): step, reward_mean, heldout_sampled,
    # heldout_greedy, batches_used: the learning curve the dashboard draws
    curve: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "objective": "grpo"}


@dataclass(frozen=True)
class PretrainStatus:
    """A pretraining DiLoCo member (``--trainer.objective pretrain``): the trainer section's keys
    (what the CLI's table and the dashboard read; no rollouts, so no verdicts) and its own."""

    step: int  # outer steps taken = the policy version its parameters are
    policy_version: int
    train_steps: int
    done: bool
    loss: float | None  # mean next-token loss of the last inner phase
    data: dict[str, Any]  # path, shard, shards, tokens [lo, hi), position, tokens_seen, passes
    batches_used: int  # batches of the text consumed (the data position)
    tokens_trained: int  # tokens seen
    idle_share: float  # of its time, waiting for the group (the formation and all-reduces)
    last: dict[str, Any] = field(default_factory=dict)
    curve: list[dict[str, Any]] = field(default_factory=list)  # step, loss, tokens seen

    def as_dict(self) -> dict[str, Any]:
        compat = {"accepted": 0, "rejected": 0, "slashed": 0, "usable": 0}
        return {**asdict(self), **compat, "objective": "pretrain"}


class VerdictLatency:
    """How long verdicts take: seconds from a submission seen on-chain to its verdict
    posted, over the last ``window`` verdicts. Pure: the validator feeds it times."""

    def __init__(self, window: int = LATENCY_WINDOW) -> None:
        self.seconds: deque[float] = deque(maxlen=window)
        self.count = 0

    def add(self, seen_at: float, posted_at: float) -> float:
        s = max(0.0, posted_at - seen_at)
        self.seconds.append(s)
        self.count += 1
        return s

    def summary(self) -> dict[str, float | int | None]:
        """count (all verdicts), then last, mean, p95 and max over the window (None: none)."""
        if not self.seconds:
            return {"count": 0, "last": None, "mean": None, "p95": None, "max": None}
        ordered = sorted(self.seconds)
        p95 = ordered[math.ceil(0.95 * len(ordered)) - 1]  # nearest rank
        return {
            "count": self.count,
            "last": round(self.seconds[-1], 3),
            "mean": round(sum(ordered) / len(ordered), 3),
            "p95": round(p95, 3),
            "max": round(ordered[-1], 3),
        }


class PostedVerdicts:
    """What a validator's posted verdicts add up to, for its ``/status``: counts by reason,
    the latest 20, per worker (``WorkerTally``), the latency from first sight
    (``VerdictLatency``) and the time spent judging. Pure: the validator feeds it times."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()  # accepted, invalid, mismatch, unavailable
        self.recent: deque[dict[str, Any]] = deque(maxlen=20)
        self.tally = WorkerTally()
        self.latency = VerdictLatency()
        self.seen_at: dict[tuple[str, bytes], float] = {}  # when a submission was first seen
        self.judge_seconds = 0.0

    def posted(
        self, key: tuple[str, bytes], reason: str, detail: str, seconds: float, now: float
    ) -> tuple[dict[str, Any], float | None]:
        """Count the verdict posted on ``key`` (``seconds``: its judging): its ``recent``
        entry, and its latency (None for a submission never seen on-chain here)."""
        worker, work_key = key
        self.counts[reason] += 1
        self.tally.add(worker, reason)
        latency = None
        if (seen := self.seen_at.pop(key, None)) is not None:
            latency = self.latency.add(seen, now)
        self.judge_seconds += seconds
        entry = {
            "worker": worker,
            "key": work_key.hex()[:16],
            "verdict": reason,
            "detail": detail[:200],
            "latency_s": None if latency is None else round(latency, 3),
        }
        self.recent.append(entry)
        return entry, latency

    def fields(self) -> dict[str, Any]:
        """Their ``ValidatorStatus`` fields."""
        judged = sum(self.counts.values())
        return {
            "judged": judged,
            "accepted": self.counts[ACCEPTED],
            "rejected": judged - self.counts[ACCEPTED],
            "rejected_by_reason": {k: v for k, v in self.counts.items() if k != ACCEPTED},
            "judge_seconds": round(self.judge_seconds, 3),
            "recent": list(self.recent),
            "latency_s": self.latency.summary(),
            "by_worker": self.tally.as_dict(),
        }


class WorkerTally:
    """A validator's verdicts per worker, by reason, for the last ``limit`` workers judged
    (the one judged longest ago goes first): what each validator concluded of whose work,
    where the chain records only the verdict that stands."""

    def __init__(self, limit: int = TALLY_WORKERS) -> None:
        self.limit = limit
        self.counts: dict[str, dict[str, int]] = {}

    def add(self, worker: str, reason: str) -> None:
        counts = self.counts.pop(worker, {})  # re-inserted: now the latest
        counts[reason] = counts.get(reason, 0) + 1
        self.counts[worker] = counts
        while len(self.counts) > self.limit:
            del self.counts[next(iter(self.counts))]

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {w: dict(c) for w, c in self.counts.items()}


def curve_point(line: dict[str, Any]) -> dict[str, Any]:
    """A step's point of the learning curve, from its ``metrics.jsonl`` line."""
    keys = ("step", "reward_mean", "heldout_sampled", "heldout_greedy", "batches_used")
    return {k: line.get(k) for k in keys}
