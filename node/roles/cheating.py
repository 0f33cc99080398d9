"""The inference role's side of the test-only cheats (``cheat``, refused without
``dev_cheats``; the catalogue is ``node/rollouts/cheats.py``, the matrix SPEC §12.1).

The batch maker makes most cheats (other weights, sampling, tasks, edits); the role makes
the ones that are about what it claims and serves rather than what it generates: which
held policy version generates the batch (``stale_weights``, ``older_version``), the units
(``inflate_units``) and the work key (``key_mismatch``) it submits, the peer key it
registers (``other_key``), and what it serves (``withhold``, ``key_mismatch``,
``serve_some``). Pure but
for the store it wraps: the role asks, then acts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from crypto.hashing import digest_parts
from node.config import parse_cheats
from node.rollouts.store import BatchStore

MAKER_CHEATS = frozenset(
    {
        "other_weights",
        "int8_weights",
        "fewer_layers",
        "foreign_proofs",
        "edit_token",
        "greedy",
        "other_temperature",
        "early_stop",
        "truncated",
        "inflate_reward",
        "easy_tasks",
        "replay_step",
        "replay_other",
    }
)
VERSION_CHEATS = frozenset({"stale_weights", "older_version"})  # the role picks the weights
# A version cheat is made only between weights at least this far ``apart`` (SPEC §12.1:
# closer versions are within the verification's noise, undetectable by design, and the
# batch is generated honestly instead; the cheat comes again on a later batch).
DETECTABLE_APART = 1e-2
EARLY_KEY_DOMAIN = b"intellect-node/test-cheat/key-before-work/v1"


class ServedStore:
    """What a cheating worker serves: its store, less the withheld keys, plus bodies
    served under keys they do not hash to, and the keys served to some peers only (the
    run's trainer and the first other peer that asks: ``serve_some``)."""

    def __init__(self, store: BatchStore, trainer: str | None = None) -> None:
        self.store = store
        self.trainer = trainer
        self.withheld: set[bytes] = set()
        self.forged: dict[bytes, bytes] = {}  # submitted key -> envelope of another body
        self.some: dict[bytes, str | None] = {}  # key served to some -> the first other asker
        self.refused = 0  # requests for such a key from anyone else

    def get(self, work_key: bytes, peer: str | None = None) -> bytes | None:
        if work_key in self.withheld:
            return None
        if work_key in self.forged:
            return self.forged[work_key]
        if work_key in self.some and peer != self.trainer:
            first = self.some[work_key]
            if first is None:
                self.some[work_key] = peer
            elif peer != first:
                self.refused += 1
                return None
        return self.store.get(work_key)


@dataclass
class CheatPlan:
    """Which cheat the worker's next batch makes, and the role's part of it."""

    cheats: tuple[str, ...]
    made: int = 0  # cheats begun (a version cheat that could not be made does not count)
    by_key: dict[str, str] = field(default_factory=dict)  # submitted key (hex) -> cheat

    @classmethod
    def of(cls, setting: str) -> CheatPlan:
        return cls(parse_cheats(setting))

    def __bool__(self) -> bool:
        return bool(self.cheats)

    def next(self) -> str:
        """The cheat of the next batch ("none" for an honest worker)."""
        from node.rollouts.cheats import pick

        cheat = pick(self.cheats, self.made)
        self.made += 1
        return cheat

    def not_made(self, cheat: str) -> str:
        """The ``cheat`` ``next`` gave could not be made (a version cheat with no other
        version to lie about yet, a greedy batch no check could tell from sampling) or
        nobody saw it: the batch is honest ("none", returned), and the next one tries the
        cheat again, so one pass over the cheats makes each of them."""
        if cheat != "none":
            self.made -= 1
        return "none"

    def refused(self, key: bytes) -> None:
        """The chain refused the submission of ``key``: nobody will judge it, so it is no
        cheat made (the matrix counts only what the chain saw), and the next batch makes
        the cheat again."""
        self.not_made(self.by_key.pop(key.hex(), "none"))

    @staticmethod
    def for_maker(cheat: str) -> str:
        return cheat if cheat in MAKER_CHEATS else "none"

    @staticmethod
    def generation_version(cheat: str, picked: int, held: list[int], oldest: int) -> int:
        """The version whose weights generate a batch claimed as ``picked``: the oldest
        held (``stale_weights``: the base model, beyond the window once the run moves on),
        or the oldest held below ``picked`` and not below ``oldest`` (``older_version``: the
        weights a worker that skips downloads keeps using while the window admits them);
        ``picked`` when there is none (then the cheat cannot be made: the batch is honest)."""
        if cheat == "stale_weights":
            return min(held, default=picked)
        if cheat == "older_version":
            return min((v for v in held if oldest <= v < picked), default=picked)
        return picked

    @staticmethod
    def apart(dir_a: str, dir_b: str) -> float:
        """How far the weights of model directory ``dir_a`` are from ``dir_b``'s: the mean
        over tensors of ``‖a − b‖ / ‖b‖`` (SPEC §12.1 states the verification's bound in
        this measure). The loaded models are compared, not the files: a saved version
        leaves out tied weights the base file holds (``lm_head.weight``), so equal weights
        can be different bytes (0.0 then: a training step that changed nothing)."""
        from node.engine.models import load_model

        a = load_model(dir_a, dtype="float32", device="cpu").model.state_dict()
        b = load_model(dir_b, dtype="float32", device="cpu").model.state_dict()
        if a.keys() != b.keys():
            return float("inf")
        changes = [float((a[k] - b[k]).norm() / b[k].norm().clamp_min(1e-12)) for k in sorted(a)]
        return sum(changes) / max(1, len(changes))

    def registered_identity(self, own: Any) -> Any:
        """The identity registered on-chain: another one than the node signs with for
        ``other_key`` (work done by an unregistered machine, claimed by a staked account)."""
        from crypto.identity import Identity

        return Identity.generate() if "other_key" in self.cheats else own

    @staticmethod
    def claim(cheat: str, key: bytes, units: int) -> tuple[bytes, int]:
        """The (work key, units) submitted for a batch whose own are ``key`` and ``units``."""
        if cheat == "inflate_units":
            return key, units * 2
        if cheat == "key_mismatch":  # a key committed before (and apart from) the work
            return digest_parts(EARLY_KEY_DOMAIN, key), units
        return key, units

    def serve(self, served: ServedStore, cheat: str, submitted: bytes, envelope: bytes) -> None:
        """Record what is served under the submitted key."""
        self.by_key[submitted.hex()] = cheat
        if cheat == "withhold":
            served.withheld.add(submitted)
        elif cheat == "key_mismatch":
            served.forged[submitted] = envelope
        elif cheat == "serve_some":
            served.some[submitted] = None
