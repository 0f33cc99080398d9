"""A cheating worker's inference role: the real ``InferenceRole`` with the parts it is built
from (``node/roles/services/inference.py``: its batch maker, what it serves, its ``register``,
``make`` and ``submit`` steps) swapped for ones that cheat (the catalogue is
``catalogue.py``, the matrix SPEC §19.1).

The batch maker makes most cheats (other weights, sampling, tasks, edits: ``maker.py``);
the role makes the ones that are about what it claims and serves rather than what it
generates: which held policy version generates the batch (``stale_weights``,
``older_version``), the units (``inflate_units``) and the work key (``key_mismatch``) it
submits, the peer key it registers (``other_key``), and what it serves (``withhold``,
``key_mismatch``, ``serve_some``), and the splits (``SPLITS``: an honest batch served to
one validator first under other chain state, to the others later: ``Split``).
``CheatPlan`` decides (pure but for the store it wraps); ``CheatingRole`` acts. A cheat
counts as made once the chain took its submission: one that could not be made, or that
nobody saw (dropped as stale, refused by the chain), comes again on the next batch, so one
pass over the cheats makes each of them. Its record (submitted key -> cheat, and what each
split did) is the node's ``/status`` section ``cheating``.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

import trio

from crypto.hashing import digest_parts
from node.engine.modeldir import ModelError
from node.roles.io.chain import WEI
from node.roles.services.inference import InferenceRole
from node.rollouts.store import BatchStore
from protocol.batches import BatchNotice
from tests.helpers.cheating.catalogue import SPLITS, parse_cheats, pick
from tests.helpers.cheating.maker import CheatingBatch, CheatingMaker

log = logging.getLogger("intellect.cheating")
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
# A version cheat is made only between weights at least this far ``apart`` (SPEC §19.1:
# closer versions are within the verification's noise, undetectable by design, and the
# batch is generated honestly instead; the cheat comes again on a later batch).
DETECTABLE_APART = 1e-2
EARLY_KEY_DOMAIN = b"intellect-node/test-cheat/key-before-work/v1"
# A split waits this long after each change of chain state before it serves on, so that
# every validator's chain reads (every 4 s at the most while idle) have seen the change
SEEN_S = 10.0
VOTE_WAIT_S = 300.0  # a split waits at most this long for the first validator's vote


@dataclass
class Split:
    """Whom a split key is served to: nobody (``hold``), the first peer that asks other than
    the trainer and that one again (``one``), or everyone (``all``); and what the split did
    (``done``: "rotated", "served ahead", ...), for its ``/status`` record."""

    phase: str = "hold"
    first: str | None = None
    done: list[str] = field(default_factory=list)

    def admits(self, peer: str | None) -> bool:
        if self.phase == "all":
            return True
        if self.phase == "hold" or peer is None:
            return False
        if self.first is None:
            self.first = peer
            self.done.append("served the first")
        return peer == self.first

    def record(self) -> dict[str, Any]:
        return {"phase": self.phase, "first": self.first, "done": list(self.done)}


class ServedStore:
    """What a cheating worker serves: its store, less the withheld keys, plus bodies
    served under keys they do not hash to, the keys served to some peers only (the
    run's trainer and the first other peer that asks: ``serve_some``), and the keys of the
    splits (the trainer, and whom their ``Split`` admits)."""

    def __init__(self, store: BatchStore, trainer: str | None = None) -> None:
        self.store = store
        self.trainer = trainer
        self.withheld: set[bytes] = set()
        self.forged: dict[bytes, bytes] = {}  # submitted key -> envelope of another body
        self.some: dict[bytes, str | None] = {}  # key served to some -> the first other asker
        self.splits: dict[bytes, Split] = {}
        self.refused = 0  # requests for such a key from anyone else

    def get(self, work_key: bytes, peer: str | None = None) -> bytes | None:
        if work_key in self.withheld:
            return None
        if work_key in self.forged:
            return self.forged[work_key]
        split = self.splits.get(work_key)
        if split is not None and peer != self.trainer and not split.admits(peer):
            self.refused += 1
            return None
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
    made: int = 0  # cheats the chain took a submission of
    by_key: dict[str, str] = field(default_factory=dict)  # submitted key (hex) -> cheat

    @classmethod
    def of(cls, setting: str) -> CheatPlan:
        return cls(parse_cheats(setting))

    def __bool__(self) -> bool:
        return bool(self.cheats)

    def next(self) -> str:
        """The cheat of the next batch ("none" for an honest worker): the one after the
        last made, until the chain takes a submission of it (``submitted``); a split is
        made once (later batches of its turn are honest)."""
        cheat = pick(self.cheats, self.made)
        return "none" if cheat in SPLITS and cheat in self.by_key.values() else cheat

    def submitted(self, cheat: str, key: bytes) -> None:
        """The chain took the submission of ``key``, which made ``cheat``."""
        if cheat != "none":
            self.made += 1
            self.by_key[key.hex()] = cheat

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
        over tensors of ``‖a − b‖ / ‖b‖`` (SPEC §19.1 states the verification's bound in
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

    @staticmethod
    def serve(served: ServedStore, cheat: str, submitted: bytes, envelope: bytes) -> None:
        """Record what is served under the submitted key."""
        if cheat == "withhold":
            served.withheld.add(submitted)
        elif cheat == "key_mismatch":
            served.forged[submitted] = envelope
        elif cheat == "serve_some":
            served.some[submitted] = None
        elif cheat in SPLITS:  # served to one validator as the split goes (CheatingRole)
            served.splits[submitted] = Split(phase="one" if cheat == "ahead_split" else "hold")

    @staticmethod
    def batch_step(cheat: str, step: int) -> int:
        """The step whose batch is made while the trainer's is ``step``: the next one for
        ``ahead_split`` (tasks follow from the worker, the step and the index: anyone can
        derive a later step's before the trainer announces it)."""
        return step + 1 if cheat == "ahead_split" else step


class CheatingRole(InferenceRole):
    """The inference role with ``plan``'s cheats: ``CheatingMaker`` in its child process,
    a ``ServedStore`` served, and its own ``register``, ``make`` and ``submit``; a split
    goes on beside its work (``_split``), which makes no batch until it is over."""

    def __init__(self, node: Any, cfg: Any, weights: Any = None, *, cheats: str) -> None:
        super().__init__(node, cfg, weights, maker=CheatingMaker)
        self.plan = CheatPlan.of(cheats)
        self.served = ServedStore(self.store, cfg.run.trainer_peer_id)
        self.cheat_of: dict[int, str] = {}  # step -> the cheat its batch made
        self.splitting = 0  # splits under way
        self._splits: trio.Nursery | None = None

    def record(self) -> dict[str, Any]:
        """The ``cheating`` section of ``/status``."""
        splits = {k.hex(): s.record() for k, s in self.served.splits.items()}
        return {
            "cheats": ",".join(self.plan.cheats),
            "made": dict(self.plan.by_key),
            "splits": splits,
        }

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self.node.add_status("cheating", self.record)
        async with trio.open_nursery() as nursery:
            self._splits = nursery
            await super().serve(task_status=task_status)

    def register(self, info: Any) -> None:
        if "other_key" not in self.plan.cheats:
            super().register(info)
        elif not info.registered:  # registered once, the other key stays its record
            identity = self.plan.registered_identity(self.node.identity)
            self.chain.ledger.register_identity(identity, int(self.cfg.inference.stake * WEI))

    async def _work(self, step: int, version: int, model_dir: str) -> None:
        before = self.done_step
        while self.splitting:  # noqa: ASYNC110 - no new work while a split changes the chain
            await trio.sleep(0.5)
        if self.done_step != before and step == self.done_step:
            return  # an ``ahead_split`` made this step's batch while we waited
        await super()._work(step, version, model_dir)

    async def make(self, step: int, version: int, model_dir: str) -> Any:
        cheat = self.plan.next()
        used = self.plan.generation_version(
            cheat, version, self.held_versions(), self.clock.oldest_version()
        )
        if used != version:  # other weights than the version claimed
            used_dir = str(self.cfg.run.model if used == 0 else self.weights.model_dir(used))
            try:
                apart = await trio.to_thread.run_sync(self.plan.apart, used_dir, model_dir)
            except ModelError:  # retention deleted that version meanwhile: honest, comes again
                apart = 0.0
            if apart < DETECTABLE_APART:
                cheat = "none"  # too close to tell apart (SPEC §19.1): honest, comes again
            else:
                model_dir = used_dir
        elif cheat in VERSION_CHEATS:  # no older version held: this batch is honest
            cheat = "none"
        call = CheatingBatch(
            model_dir,
            self.chain.address,
            self.plan.batch_step(cheat, step),
            version,
            self.node.header(),
            cheat=self.plan.for_maker(cheat),
        )
        made = await self.maker.call(call)
        self.cheat_of = {step: "none" if getattr(made, "unchanged", False) else cheat}
        return made

    async def submit(self, step: int, version: int, notice: BatchNotice) -> None:
        cheat = self.cheat_of.pop(step, "none")
        envelope = self.store.get(notice.work_key) or b""
        key, units = self.plan.claim(cheat, notice.work_key, notice.units)
        self.plan.serve(self.served, cheat, key, envelope)
        await super().submit(step, version, dataclasses.replace(notice, work_key=key, units=units))
        self.plan.submitted(cheat, key)
        if cheat in SPLITS:
            assert self._splits is not None  # the role serves
            self.splitting += 1
            self._splits.start_soon(self._split, cheat, key, self.plan.batch_step(cheat, step))

    async def _split(self, cheat: str, key: bytes, step: int) -> None:
        """Serve ``key`` (an honest batch of ``step``) to one validator first, under other
        chain state than the others get it under; then to everyone."""
        split = self.served.splits[key]
        try:
            if cheat == "rotate_split":
                await self._rotate_split(key, split)
            else:
                await self._ahead_split(split, step)
        except Exception as exc:  # the worker goes on; its record says what was done
            log.error("split of %s failed: %s", key.hex()[:16], exc)
            split.done.append(f"failed: {exc}")
        finally:
            split.phase = "all"
            self.splitting -= 1

    async def _rotate_split(self, key: bytes, split: Split) -> None:
        """Submitted under this node's key: rotate the registration to another key, serve
        the first validator that asks, wait for its vote, rotate back, serve the others."""
        from crypto.identity import Identity

        ledger = self.chain.ledger
        await trio.to_thread.run_sync(ledger.change_peer_key, Identity.generate())
        split.done.append("rotated")
        await trio.sleep(SEEN_S)
        split.phase = "one"
        with trio.move_on_after(VOTE_WAIT_S):
            while not await trio.to_thread.run_sync(self._voted, key):  # noqa: ASYNC110 - the chain
                await trio.sleep(1.0)
        await trio.to_thread.run_sync(ledger.change_peer_key, self.node.identity)
        split.done.append("rotated back")
        await trio.sleep(SEEN_S)

    def _voted(self, key: bytes) -> bool:
        return self.chain.ledger.submission(self.chain.address, key).status != "pending"

    async def _ahead_split(self, split: Split, step: int) -> None:
        """Served to the first validator that asks from the start (the batch is of a step
        the trainer has not announced); to everyone once the trainer announced it."""
        while split.first is None or (self.clock.step or 0) < step:  # noqa: ASYNC110 - polls
            await trio.sleep(0.5)
        self._done(step)  # its batch is made: not made again
        split.done.append("step announced")
        await trio.sleep(SEEN_S)
