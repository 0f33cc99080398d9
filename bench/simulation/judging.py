"""The judging queue and verdict posting on a simulated clock, every decision made by the
real code.

Each validator holds its own ``JudgingQueue`` (``node/roles/decisions/judging.py``),
constructed as ``ValidatorRole`` constructs it (``JudgingQueue()``, then the chain's
``fetch_deadline`` set on it as ``_setup`` does), and driven through its public methods
the way ``node/roles/services/validator.py`` drives it:

- **Notices**: a worker announces its batch when it is made; each validator gets the
  notice half the path's RTT later (``noticed``). A notice alone wakes nothing: nothing is
  fetched before its submission.
- **Submissions**: the worker submits the key at the same time; the chain includes it in
  the next block (``block_s``), the validator's ``Docket`` sees it ``confirmations``
  blocks later, on its next read (``CHAIN_POLL_MIN_S``, the validator's own constant:
  a notice nudges the reads to their fastest pace), with the worker's registered peer as
  holder (``submitted``). The verdict window counts from the inclusion block.
- **The loop** (``ValidatorRole._serve``): ``unavailable(now)`` (each posted as a reject),
  then ``next_fetch(now)`` while fewer than ``FETCHES`` fetches hold a slot, then
  ``wake_at(now, can_fetch=...)`` for its next wakeup (no sooner than 0.05 s, as the real
  nap). It runs after every change: a submission read, a fetch ended, a batch taken to
  judgement, a wakeup. (The real loop also wakes every ``POLL_S`` and on every notice;
  neither changes a decision: nothing becomes due that ``wake_at`` does not name.)
- **Fetches** (``_fetch_for_judging``): one slot each, held until the judging loop takes
  the fetched batch. A fetch moves ``batch_bytes`` at ``min(worker uplink / its uploads,
  validator downlink / its downloads, loss-bound TCP rate)``, the shares taken when it
  starts, plus one RTT. One slower than the exchange's deadline
  (``min(TRANSFER_DEADLINE_S, FRAMES_BASE_S + size / MIN_RATE)``, ``node/roles/io/exchange.py``)
  fails at that deadline (``fetch_failed``); so does one from a worker that no longer
  holds the batch (the worker keeps it for the verdict window, SPEC §13), after one RTT.
  Success: ``fetched``.
- **Judgement** (``_judge_fetched``): one at a time a validator, ``check_cost`` × the
  time the worker took to make the batch; then ``judged`` and the verdict posted, or, with
  probability ``check_fail``, ``check_failed`` (``_not_judged``: fetched and judged again
  after the queue's back-off, or given up).
- **Posting** (``Votes.post``): the vote is in the next block; the first vote on a key is
  its verdict (the contract's: later agreeing votes are refused as standing), which must
  come within ``verdict_window`` of the submission's block.

Which validators judge a batch (``judges``): as ``[validator] judge = "all"`` (None, the
node's default) every validator is given every submission, so every batch goes to every
validator. As ``judge = "assigned"`` (k = quorum + 1) each batch goes to the k validators
the real ``ranking`` (``node/roles/decisions/assignment.py``) puts first for a random block
hash; every validator is told of every batch and ``passed`` the keys not its own as its
docket reads them; the next k in rank are backups: at the real ``duty``'s time (by the
docket's clock: the later of the confirmed head's timestamp and the machine's, on a chain
that makes blocks the machine's; on its next read) each takes the batch if no verdict stands
then. ``down`` validators never run (their batches wait for backups).

**Validator churn** (``JudgingConfig.churn``, off by default): each running validator
leaves after a session and comes back after a downtime (``links.Churn``). Leaving, it loses
what its process held: its queue, its fetches under way (the worker's upload ends), the
judgement in progress and the fetched batches waiting for it; it is told of nothing while
away, and a backup whose time comes then is not taken by it. Back, it is a restarted node:
a new queue, and its docket reads the chain from the contract's block (``Docket.open``,
``node/roles/io/docket.py``), so it is given every batch submitted so far that it is to
judge and has not voted on and whose verdict window is still open (assigned: those it ranks
among the judges of, and those it is a backup for whose time has come with no verdict
standing), each as learned now.
``symmetric`` simulates one validator of ``validators`` given each batch with probability
k / ``validators`` (k = 1: one validator a batch, what ``derived.validators_needed``'s formula
assumes): for counts too large to simulate each, with no backups (``keeps_up`` then asks the
p99 to come before the first backup's time, so that none would be needed).
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field

from bench.simulation.events import EventLoop
from bench.simulation.links import LOSS, Churn, Link, home_link, mathis_cap, path_rtt
from node.roles.decisions.assignment import duty, ranking
from node.roles.decisions.judging import JudgingQueue
from node.roles.decisions.work import Key
from node.roles.io.exchange import FRAMES_BASE_S, MIN_RATE, TRANSFER_DEADLINE_S
from node.roles.services.validator import CHAIN_POLL_MIN_S, FETCHES

# A batch's envelope: ~34,000 generated tokens (16 samples of ~2,000) at the devnet's
# ~30 bytes a token with proofs (protocol/rollouts.py: 10,240 tokens take 0.3 MiB).
BATCH_BYTES = 1 << 20
# The chain: Base (docs/chain-costs.md), a block every 2 s; the node's default
# confirmations on the main L2s (node/config/work.py ``chain.confirmations``).
BLOCK_S = 2.0
CONFIRMATIONS = 10
# The development chain's run parameters (node/cli/ledger.py ``dev_params``):
# ``--verdict-window`` 3,600 s by default, ``fetch_deadline`` a sixth of it.
VERDICT_WINDOW = 3600.0
FETCH_DEADLINE = VERDICT_WINDOW // 6
NAP_S = 0.05  # the validator loop's shortest nap
DC_VALIDATOR = Link(up=1250e6, down=1250e6, rtt=0.001, region=0, nat="open")


@dataclass
class JudgingConfig:
    workers: int
    validators: int = 1
    check_cost: float = 0.46  # a judgement over the worker's time to make the batch
    batch_s: float = 60.0  # a worker's time per batch, on average
    jitter: float = 0.1  # each batch takes batch_s × uniform(1 - jitter, 1 + jitter)
    horizon_s: float = 600.0  # batches are made during this long (then the queue drains)
    batch_bytes: int = BATCH_BYTES
    verdict_window: float = VERDICT_WINDOW
    fetch_deadline: float = FETCH_DEADLINE
    block_s: float = BLOCK_S
    confirmations: int = CONFIRMATIONS
    # who judges a batch (module docstring): None every validator; k assigned, k judges
    judges: int | None = None
    symmetric: bool = False  # assigned: one validator simulated, given k / validators
    down: int = 0  # assigned: validators that never run (the first ``down``)
    # the chance that a judgement cannot finish (its version's weights never came, the
    # batch checker failed): it held the judge as long, and the queue's ``check_failed``
    # decides (fetched and judged again later, or given up after ``check_tries``)
    check_fail: float = 0.0
    churn: Churn | None = None  # running validators leave and come back (module docstring)
    loss: float = LOSS
    seed: int = 0


@dataclass
class Batch:
    key: Key
    worker: int
    made_at: float
    submitted_at: float  # its block's time: the verdict window counts from here
    make_s: float  # the worker's time to make it
    verdict_at: float | None = None  # the block of the first vote on it
    verdict: str = ""
    judges: list[int] = field(default_factory=list)  # assigned: who judges it at once
    voted: set[int] = field(default_factory=set)  # the validators that voted on it
    backups: list[tuple[int, float]] = field(default_factory=list)  # (validator, after s)


@dataclass
class SimValidator:
    index: int
    link: Link
    queue: JudgingQueue
    slots: int = 0  # fetch slots held (fetching, or fetched and not yet taken to judge)
    downloads: int = 0
    ready: deque[Key] = field(default_factory=deque)  # fetched, waiting for the judge
    judging: Key | None = None
    kicked: bool = False
    wake_due: float | None = None
    online: bool = True
    life: int = 0  # sessions ended (churn): an event of an earlier session is stale
    fetching: dict[Key, int] = field(default_factory=dict)  # key -> the worker serving it


@dataclass
class JudgingResult:
    batches: list[Batch]  # every batch a simulated validator was to judge
    backlog: list[tuple[float, int]]  # (time, the largest queue.waiting() of any validator)
    unavailable: int  # keys posted as unavailable (by any validator)
    given_up: int  # keys the queues gave up (check_tries)
    fetch_failures: int
    horizon_s: float
    verdict_window: float
    arrivals_per_s: float  # batches a simulated validator is given a second, on average
    events: int
    p99_limit: float = math.inf  # keeps_up's bound on the p99 (default: the window)
    backups_taken: int = 0  # assigned: batches a backup took (no verdict by its time)
    check_failures: int = 0  # judgements that could not finish (``check_fail``)
    departures: int = 0  # churn: validator sessions that ended

    def latencies(self) -> list[float]:
        """Seconds from each batch's submission block to its verdict (inf: none)."""
        return sorted(
            math.inf if b.verdict_at is None else b.verdict_at - b.submitted_at
            for b in self.batches
        )

    def percentile(self, q: float) -> float:
        times = self.latencies()
        return times[max(0, math.ceil(q * len(times)) - 1)] if times else 0.0

    def late(self) -> int:
        """Keys without a verdict within the window (the chain refuses any later: unpaid)."""
        return sum(1 for t in self.latencies() if t > self.verdict_window)

    def lost(self) -> int:
        """Keys lost: rejected as unavailable, or without a verdict in the window (given
        up among them: never judged)."""
        w = self.verdict_window
        return sum(
            1
            for b in self.batches
            if b.verdict == "unavailable"
            or b.verdict_at is None
            or b.verdict_at - b.submitted_at > w
        )

    def backlog_at(self, t: float) -> int:
        before = [n for when, n in self.backlog if when <= t]
        return before[-1] if before else 0

    def backlog_mean(self, start: float, end: float) -> float:
        inside = [n for when, n in self.backlog if start <= when <= end]
        return sum(inside) / len(inside) if inside else 0.0

    def bounded(self) -> bool:
        """Whether the backlog stopped growing while batches came: its mean over the
        horizon's last quarter is at most 5 batches, or 5 % of the arrivals in half the
        horizon, above its mean over the second quarter (a validator given rho times the
        batches it can judge falls behind by 1 - 1/rho of them: this resolves rho above
        about 1.1 from the noise of random arrivals)."""
        h = self.horizon_s
        growth = self.backlog_mean(0.75 * h, h) - self.backlog_mean(0.25 * h, 0.5 * h)
        return growth <= max(5.0, 0.05 * self.arrivals_per_s * h / 2)

    def summary(self) -> dict[str, object]:
        def s(t: float) -> float | str:
            return round(t, 1) if math.isfinite(t) else "none"

        return {
            "p50_s": s(self.percentile(0.5)),
            "p99_s": s(self.percentile(0.99)),
            "bounded": self.bounded(),
            "backlog_mid": self.backlog_at(self.horizon_s / 2),
            "backlog_end": self.backlog_at(self.horizon_s),
            "batches": len(self.batches),
            "lost": self.lost(),
            "late": self.late(),
            "unavailable": self.unavailable,
            "given_up": self.given_up,
            "fetch_failures": self.fetch_failures,
            "backups_taken": self.backups_taken,
            "check_failures": self.check_failures,
            "departures": self.departures,
        }


def new_queue(fetch_deadline: float) -> JudgingQueue:
    """A validator's queue as ``ValidatorRole`` makes it: ``JudgingQueue()`` in
    ``__init__``, the chain's fetch deadline set in ``_setup``."""
    queue = JudgingQueue()
    queue.fetch_deadline_s = float(fetch_deadline)
    return queue


class JudgingSim:
    def __init__(self, cfg: JudgingConfig, links: list[Link] | None = None) -> None:
        self.cfg = cfg
        self.loop = EventLoop()
        self.rng = random.Random(cfg.seed)
        self.links = (
            links if links is not None else [home_link(self.rng) for _ in range(cfg.workers)]
        )
        self.peers = [f"peer{i}" for i in range(len(self.links))]
        self.by_peer = {p: i for i, p in enumerate(self.peers)}
        self.uploads = [0] * len(self.links)
        simulated = 1 if cfg.symmetric else cfg.validators
        self.validators = [
            SimValidator(v, DC_VALIDATOR, new_queue(cfg.fetch_deadline)) for v in range(simulated)
        ]
        self.running = self.validators[cfg.down :]
        self.explicit = cfg.judges is not None and not cfg.symmetric  # assigned, each one
        self.addresses = [f"0x{v:040x}" for v in range(simulated)]
        self.index = {a: i for i, a in enumerate(self.addresses)}
        self.backups_taken = 0
        self.check_failures = 0
        self.fail_rng = random.Random(cfg.seed + 7919)  # drawn only when check_fail > 0
        self.churn_rng = random.Random(cfg.seed * 7919 + 23)  # drawn only with churn
        self.departures = 0
        self.batches: dict[Key, Batch] = {}
        self.backlog: list[tuple[float, int]] = []
        self.unavailable: set[Key] = set()
        self.fetch_failures = 0
        size = cfg.batch_bytes
        self.fetch_limit = min(TRANSFER_DEADLINE_S, FRAMES_BASE_S + size / MIN_RATE)

    # ---- the workers and the chain ------------------------------------------------------

    def _make_batches(self) -> None:
        cfg = self.cfg
        share = self._share()
        reads: dict[float, list[Batch]] = {}
        for w in range(len(self.links)):
            made = -self.rng.uniform(0, cfg.batch_s)  # each worker is mid-batch at 0
            seq = 0
            while True:
                make_s = cfg.batch_s * self.rng.uniform(1 - cfg.jitter, 1 + cfg.jitter)
                made += make_s
                if made >= cfg.horizon_s:
                    break
                if made < 0 or not (share >= 1 or self.rng.random() < share):
                    continue
                seq += 1
                key = (f"w{w}", seq.to_bytes(8, "big"))
                block = (math.floor(made / cfg.block_s) + 1) * cfg.block_s
                b = self.batches[key] = Batch(key, w, made, block, make_s)
                if self.explicit:
                    self._assign(b)
                for v in self.running:
                    rtt = path_rtt(self.links[w], v.link)
                    self.loop.at(made + rtt / 2, self._notice, v, key, self.peers[w])
                seen = block + cfg.confirmations * cfg.block_s + CHAIN_POLL_MIN_S
                reads.setdefault(seen, []).append(b)
        for when, batches in reads.items():
            self.loop.at(when, self._read_chain, batches)

    def _share(self) -> float:
        """The share of the batches the simulated validator is given (``symmetric``)."""
        cfg = self.cfg
        return min(1.0, (cfg.judges or 1) / cfg.validators) if cfg.symmetric else 1.0

    def _assign(self, b: Batch) -> None:
        """The batch's judges and backups, by the node's own ranking and duty."""
        assert self.cfg.judges is not None
        k, quorum = self.cfg.judges, self.cfg.judges - 1
        worker = f"0x{(1 << 100) + b.worker:040x}"
        order = ranking(self.rng.randbytes(32), worker, b.key[1], self.addresses)
        for rank, a in enumerate(order[: 2 * k]):
            after = duty(rank, quorum, int(self.cfg.verdict_window))
            if after == 0:
                b.judges.append(self.index[a])
            elif after is not None:
                b.backups.append((self.index[a], float(after)))

    def _notice(self, v: SimValidator, key: Key, peer: str) -> None:
        if v.online:
            v.queue.noticed(key, peer, self.loop.now)

    def _read_chain(self, batches: list[Batch]) -> None:
        now = self.loop.now
        cfg = self.cfg
        for v in self.running:
            if not v.online:  # it reads them when it is back (``_come_back``)
                continue
            for b in batches:  # units and version: not what this simulation judges
                if self.explicit and v.index not in b.judges:
                    v.queue.passed(b.key)  # another's, or a backup held (Docket)
                    continue
                v.queue.submitted(b.key, 1, 0, now, holder=self.peers[b.worker])
            self._kick(v)
        for b in batches if self.explicit else []:
            for i, after in b.backups:
                if i >= cfg.down:  # the docket's clock: the machine's, here
                    seen = b.submitted_at + after + CHAIN_POLL_MIN_S
                    self.loop.at(max(now, seen), self._backup, self.validators[i], b)

    def _backup(self, v: SimValidator, b: Batch) -> None:
        """A backup's time: taken if no verdict stands (the docket reads the newest block)."""
        if b.verdict_at is not None and b.verdict_at <= self.loop.now:
            return
        if not v.online:  # back later, its docket hands it out if still no verdict stands
            return
        self.backups_taken += 1
        v.queue.submitted(b.key, 1, 0, self.loop.now, holder=self.peers[b.worker])
        self._kick(v)

    # ---- the validator loop (ValidatorRole._serve) --------------------------------------

    def _kick(self, v: SimValidator) -> None:
        if not v.kicked:
            v.kicked = True
            self.loop.at(self.loop.now, self._serve_once, v, v.life)

    def _serve_once(self, v: SimValidator, life: int | None = None) -> None:
        if life is not None and life != v.life or not v.online:
            return  # a kick of an earlier session
        v.kicked = False
        now = self.loop.now
        q = v.queue
        for key in q.unavailable(now):
            self.unavailable.add(key)
            self._post(key, "unavailable", v)
        while v.slots < FETCHES and (got := q.next_fetch(now)) is not None:
            v.slots += 1
            self._fetch(v, *got)
        wake = q.wake_at(now, can_fetch=v.slots < FETCHES)
        if wake is not None:
            due = max(now + NAP_S, wake)
            if v.wake_due is None or due < v.wake_due or v.wake_due < now:
                v.wake_due = due
                self.loop.at(due, self._wake, v, due)

    def _wake(self, v: SimValidator, due: float) -> None:
        if v.wake_due == due:
            v.wake_due = None
            self._serve_once(v)

    # ---- fetches (ValidatorRole._fetch_for_judging, _fetch) -----------------------------

    def _fetch(self, v: SimValidator, key: Key, peer: str) -> None:
        now = self.loop.now
        w = self.by_peer[peer]
        b = self.batches[key]
        rtt = path_rtt(self.links[w], v.link)
        if now >= b.submitted_at + self.cfg.verdict_window:  # the worker deleted it
            self.loop.at(now + rtt, self._fetch_failed, v, key, None, v.life)
            return
        rate = min(
            self.links[w].up / (self.uploads[w] + 1),
            v.link.down / (v.downloads + 1),
            mathis_cap(rtt, self.cfg.loss),
        )
        took = rtt + self.cfg.batch_bytes / rate
        self.uploads[w] += 1
        v.downloads += 1
        v.fetching[key] = w
        if took > self.fetch_limit:
            self.loop.at(now + self.fetch_limit, self._fetch_failed, v, key, w, v.life)
        else:
            self.loop.at(now + took, self._fetched, v, key, w, v.life)

    def _fetch_failed(self, v: SimValidator, key: Key, w: int | None, life: int) -> None:
        if life != v.life:  # its process is gone: ended when it left (``_leave``)
            return
        if w is not None:
            del v.fetching[key]
            self.uploads[w] -= 1
            v.downloads -= 1
        self.fetch_failures += 1
        v.queue.fetch_failed(key, self.loop.now)
        v.slots -= 1
        self._kick(v)

    def _fetched(self, v: SimValidator, key: Key, w: int, life: int) -> None:
        if life != v.life:
            return
        del v.fetching[key]
        self.uploads[w] -= 1
        v.downloads -= 1
        v.queue.fetched(key)
        v.ready.append(key)  # the slot is held until the judging loop takes it
        self._take(v)

    # ---- judging (ValidatorRole._judge_fetched, _judge) ---------------------------------

    def _take(self, v: SimValidator) -> None:
        if v.judging is not None or not v.ready:
            return
        key = v.ready.popleft()
        v.slots -= 1
        v.judging = key
        b = self.batches[key]
        self.loop.at(self.loop.now + self.cfg.check_cost * b.make_s, self._judged, v, key, v.life)
        self._kick(v)

    def _judged(self, v: SimValidator, key: Key, life: int) -> None:
        if life != v.life:
            return
        v.judging = None
        fail = self.cfg.check_fail
        if fail > 0 and self.fail_rng.random() < fail:  # ValidatorRole._not_judged
            self.check_failures += 1
            v.queue.check_failed(key, self.loop.now)
            self._kick(v)
        else:
            v.queue.judged(key)
            self._post(key, "accept", v)
        self._take(v)

    def _post(self, key: Key, verdict: str, v: SimValidator) -> None:
        """The vote is in the next block; the first vote on a key is its verdict."""
        block = (math.floor(self.loop.now / self.cfg.block_s) + 1) * self.cfg.block_s
        b = self.batches[key]
        b.voted.add(v.index)
        if b.verdict_at is None or block < b.verdict_at:
            b.verdict_at, b.verdict = block, verdict

    # ---- churn --------------------------------------------------------------------------

    def _leave(self, v: SimValidator) -> None:
        """Its process ends: what it held is gone (the module docstring)."""
        assert self.cfg.churn is not None
        self.departures += 1
        v.online, v.life = False, v.life + 1
        for w in v.fetching.values():
            self.uploads[w] -= 1
        v.fetching.clear()
        v.slots = v.downloads = 0
        v.ready.clear()
        v.judging, v.kicked, v.wake_due = None, False, None
        self.loop.at(self.loop.now + self.cfg.churn.downtime(self.churn_rng), self._come_back, v)

    def _come_back(self, v: SimValidator) -> None:
        """Restarted: a new queue, and every batch submitted so far that is its to judge
        and that it has not voted on (its docket reads from the contract's block)."""
        assert self.cfg.churn is not None
        now = self.loop.now
        v.online = True
        v.queue = new_queue(self.cfg.fetch_deadline)
        seen = self.cfg.confirmations * self.cfg.block_s  # confirmed by now
        for b in self.batches.values():
            if b.submitted_at + seen > now or v.index in b.voted:
                continue
            if b.submitted_at + self.cfg.verdict_window < now:
                continue  # its window closed meanwhile: the docket skips it (``_window_closed``)
            if self.explicit and v.index not in b.judges:
                due = next((after for i, after in b.backups if i == v.index), None)
                standing = b.verdict_at is not None and b.verdict_at <= now
                if due is None or b.submitted_at + due > now or standing:
                    continue  # not its own; or a backup not due yet (its event takes it)
                self.backups_taken += 1
            v.queue.submitted(b.key, 1, 0, now, holder=self.peers[b.worker])
        self.loop.at(now + self.cfg.churn.session(self.churn_rng), self._leave, v)
        self._kick(v)

    # ---- the run ------------------------------------------------------------------------

    def _sample(self) -> None:
        now = self.loop.now
        self.backlog.append((now, max(v.queue.waiting() for v in self.validators)))
        every = min(self.cfg.batch_s, self.cfg.horizon_s / 8)
        if now + every <= self.until:
            self.loop.at(now + every, self._sample)

    def run(self) -> JudgingResult:
        cfg = self.cfg
        self._make_batches()
        # every batch made in the horizon has its window, then the queue's state is final
        self.until = cfg.horizon_s + cfg.verdict_window + (cfg.confirmations + 2) * cfg.block_s
        self.loop.at(0.0, self._sample)
        if cfg.churn is not None:
            for v in self.running:
                self.loop.at(cfg.churn.session(self.churn_rng), self._leave, v)
        self.loop.run(until=self.until)
        share = self._share()
        if self.explicit:  # each running validator's share
            share = min(1.0, (cfg.judges or 1) / max(1, cfg.validators - cfg.down))
        limit = math.inf
        if cfg.symmetric and cfg.judges is not None:  # no backups simulated: none may be due
            limit = first_backup_s(cfg.judges, cfg.verdict_window)
        return JudgingResult(
            batches=list(self.batches.values()),
            backlog=self.backlog,
            unavailable=len(self.unavailable),
            given_up=sum(v.queue.given_up for v in self.validators),
            fetch_failures=self.fetch_failures,
            horizon_s=cfg.horizon_s,
            verdict_window=cfg.verdict_window,
            arrivals_per_s=len(self.links) * share / cfg.batch_s,
            events=self.loop.processed,
            p99_limit=limit,
            backups_taken=self.backups_taken,
            check_failures=self.check_failures,
            departures=self.departures,
        )


def first_backup_s(judges: int, window: float) -> float:
    """When the first backup of a batch takes it, after the submission (``duty``)."""
    after = duty(judges, judges - 1, int(window))
    assert after is not None
    return float(after)


def run_judging(cfg: JudgingConfig, links: list[Link] | None = None) -> JudgingResult:
    return JudgingSim(cfg, links).run()


def keeps_up(r: JudgingResult) -> bool:
    """Bounded backlog, p99 submission-to-verdict within the window (and within
    ``p99_limit``), no key lost."""
    p99 = r.percentile(0.99)
    return r.bounded() and p99 <= min(r.verdict_window, r.p99_limit) and r.lost() == 0


def validators_needed(
    workers: int, check_cost: float, *, judges: int | None, most: int, **kw: object
) -> tuple[int | None, dict[int, JudgingResult]]:
    """The smallest number of validators that keeps up (``keeps_up``) with ``workers``, and
    the runs tried. ``judges=None`` (``judge = "all"``): every validator judges every batch,
    so one that cannot keep up alone is not helped by more; tried at 1, 3 (the contract's
    least, quorum + 1) and 10, up to ``most``; None when none did. ``judges=k``: assigned,
    one validator simulated (``symmetric``), bisected between a count that does not keep up
    and one that does (assumes more validators never keep up worse)."""
    runs: dict[int, JudgingResult] = {}
    symmetric = judges is not None

    def ok(v: int) -> bool:
        if v not in runs:
            cfg = JudgingConfig(
                workers,
                v,
                check_cost,
                judges=judges,
                symmetric=symmetric,
                **kw,  # type: ignore[arg-type]
            )
            runs[v] = run_judging(cfg)
        return keeps_up(runs[v])

    if judges is None:
        return next((v for v in (1, 3, 10) if v <= most and ok(v)), None), runs
    # bracketed from the rate bound, a hint only: a validator given rho times the batches
    # it can judge holds a queue that grows, and a run with thousands of them costs more
    # than the whole search (the queue walks its entries per call)
    hi = min(most, max(judges, math.ceil(judges * workers * check_cost)))
    while not ok(hi):
        if hi >= most:
            return None, runs
        hi = min(most, 2 * hi)
    lo = hi // 2
    while lo >= judges and ok(lo):
        hi, lo = lo, lo // 2
    lo = max(lo, judges - 1)
    while hi - lo > 1:  # lo did not keep up (or is below the judges), hi did
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi, runs
