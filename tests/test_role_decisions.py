"""The roles' decisions, each on its own with given times: which policy version a worker
generates with and which of its batches still wait for a verdict, when the validator posts
a refused verdict again, when the trainer asks again for a batch; how busy a role is; and
the keys of each role's /status section."""

import json
import time

import pytest
import trio

from node.roles.decisions.busy import BusyTime
from node.roles.decisions.judging import VerdictPosts
from node.roles.decisions.status import (
    InferenceStatus,
    Stake,
    TrainerStatus,
    ValidatorStatus,
    VerdictLatency,
)
from node.roles.decisions.work import Verdict
from node.roles.decisions.workbook import (
    FetchRetry,
    prune_checkpoints,
    recorded_curve,
    step_batches,
)
from node.roles.decisions.working import ChainReads, PendingVerdicts, StoreRetention, VersionChoice

W = "0x" + "22" * 20


def k(n: int) -> tuple[str, bytes]:
    return (W, bytes([n]) * 32)


@pytest.mark.parametrize(
    ("step", "held", "announced", "want"),
    [
        (5, [0, 3, 4, 5], 5, 5),  # the newest held
        (5, [0, 3, 4, 5], 4, 4),  # not newer than the trainer announced
        (5, [0, 3], 5, 3),  # an older one while 4 and 5 download
        (5, [0, 2], 5, None),  # 2 < 5 - 2: nothing in the window, wait
        (1, [0], 1, 0),  # the base model
    ],
)
def test_the_worker_generates_with_the_newest_version_the_window_admits(
    step, held, announced, want
):
    assert VersionChoice(async_level=2).pick(step, held, announced) == want


def test_a_version_switch_is_reported_once():
    choice = VersionChoice(async_level=2)
    assert choice.use(0) and not choice.use(0) and choice.use(1) and choice.used == 1


def test_pending_verdicts_settle_by_the_ledger_and_restored_batches_are_resubmitted():
    p = PendingVerdicts()
    p.submitted(b"a", 3)
    p.submitted(b"b", 3)
    p.restored([b"a", b"c"])  # after a restart: c was stored, maybe never submitted
    assert (len(p), p.steps[b"a"], p.steps[b"c"]) == (3, 3, -1)
    assert not p.settle(b"a", "pending") and not p.settle(b"a", "none")  # submitted: wait
    assert not p.settle(b"a", "accepted") and not p.settle(b"b", "rejected")
    assert p.settle(b"c", "none")  # the ledger never heard of it: submit it
    assert (len(p), p.accepted, p.rejected) == (0, 1, 1)
    p.submitted(b"c", 4)
    assert not p.settle(b"c", "none") and p.keys() == [b"c"]


def test_pending_verdicts_count_rejections_by_the_ledgers_reason():
    p = PendingVerdicts()
    for n in range(4):
        p.submitted(bytes([n]), 1)
    p.settle(b"\x00", "rejected", "invalid")
    p.settle(b"\x01", "rejected", "unavailable")
    p.settle(b"\x02", "rejected", "invalid")
    p.settle(b"\x03", "accepted", "invalid")  # an acceptance has no reason
    assert dict(p.rejected_by_reason) == {"invalid": 2, "unavailable": 1}
    assert (p.accepted, p.rejected) == (1, 3)


def test_a_pending_batch_whose_verdict_window_passed_waits_no_more():
    """No validator can judge it after its window (it is never paid): the worker stops
    waiting for it (with ``max_unjudged`` 1 it would never generate again)."""
    p = PendingVerdicts()
    p.submitted(b"a", 1)
    assert not p.settle(b"a", "pending") and len(p) == 1  # within its window: wait
    assert not p.settle(b"a", "pending", window_passed=True)
    assert (len(p), p.expired, p.accepted, p.rejected) == (0, 1, 0, 0)
    p.submitted(b"b", 2)
    p.settle(b"b", "accepted", window_passed=True)  # a verdict came: it counts as that
    assert (p.expired, p.accepted) == (1, 1)


def test_settled_batches_are_spent_once_matured_and_below_the_floor_and_pending_never():
    p = PendingVerdicts()
    for key, step in ((b"a", 1), (b"b", 4), (b"p", 0), (b"young", 0)):
        p.submitted(key, step)
    p.restored([b"r", b"gone"])  # found in the store after a restart: their step unknown
    for key in (b"a", b"b", b"r", b"gone"):
        p.settle(key, "accepted" if key != b"b" else "rejected", unlock_at=100.0)
    p.settle(b"young", "accepted", unlock_at=500.0)  # others may still vote to overturn it
    p.settle(b"p", "pending", unlock_at=100.0)  # no verdict yet: needed however old
    read = []

    def step_of(key):
        read.append(key)
        return {b"r": 3}.get(key)  # "gone": no longer stored

    assert p.spent(2, 100.0, step_of) == []  # not matured yet: not even at its maturity
    assert sorted(p.spent(2, 101.0, step_of)) == [b"a", b"gone"]
    assert sorted(p.spent(4, 101.0, step_of)) == [b"r"] and sorted(read) == [b"gone", b"r"]
    assert p.spent(4, 101.0, step_of) == [] and p.spent(5, 101.0, step_of) == [b"b"]
    assert p.spent(100, 499.0, step_of) == [] and p.spent(100, 501.0, step_of) == [b"young"]
    assert p.spent(100, 1e9, step_of) == [] and p.keys() == [b"p"]


class StatusChain:
    """The chain as a worker reads it for its pending batches and its money; every read
    is recorded in ``calls``. Each submission has ``status`` and ends its verdict window at
    ``until``; the chain's clock reads ``now``."""

    def __init__(self, status: str = "pending", until: float | None = None) -> None:
        self.block, self.status, self.now = 5, status, 0
        self.until = time.time() + 600 if until is None else until
        self.calls: list[str] = []

    def head(self):
        self.calls.append("head")
        return self.block

    def confirmed_head(self):
        self.calls.append("head")
        return self.block

    def chain_time(self):
        self.calls.append("time")
        return self.now

    def submission(self, worker, key, block=None):
        self.calls.append("submission")
        info = {
            "status": self.status,
            "reason": 0,
            "verdict_until": self.until,
            "unlock_at": self.until + 3600,
            "accept_votes": int(self.status == "accepted"),
            "reject_votes": int(self.status == "rejected"),
            "reward": 10**15,
            "collateral": 10**15,
            "rejecter": "0x0",
        }
        return type("Info", (), info)()

    def worker(self, address):
        self.calls.append("money")
        return type("W", (), {"stake": 1, "locked": 0, "slashed": 0})()

    def pending(self, account):  # part of the money
        return 0

    claimable = pending

    def is_validator(self, account):  # whom its uploads serve first
        self.calls.append("validator")
        return False


def test_the_chain_double_has_the_shape_of_what_the_worker_reads():
    """``StatusChain`` stands for the ledger where the worker follows its submissions and
    its money: it has every member of the protocol those reads take, by its shape alone."""
    from node.roles.given import SubmissionViews

    assert isinstance(StatusChain(), SubmissionViews)
    assert not isinstance(object(), SubmissionViews)


def worker_role(tmp_path, ledger: StatusChain):
    """An inference role reading ``ledger``, with one batch submitted and pending."""
    from node.config import load_config
    from node.net.metrics import Metrics
    from node.roles.services.inference import InferenceRole

    cfg = load_config(
        environ={
            "INTELLECT_NODE_RUN__MODEL": str(tmp_path),
            "INTELLECT_NODE_DATA_DIR": str(tmp_path),
        }
    )

    class Node:
        metrics = Metrics()

    role = InferenceRole(Node(), cfg.changed({"run.trainer_peer_id": "12D3KooW" + "A" * 44}))
    role.chain.ledger, role.chain.address = ledger, "0x" + "11" * 20
    role.chain.pending.submitted(b"k" * 32, 3)
    return role


async def test_the_worker_role_stops_waiting_for_a_batch_the_chain_says_is_past_its_window(
    tmp_path,
):
    """The chain's clock decides: by our clock the window passed, by the chain's not yet
    (still waited for); once the chain's time passes it, the batch is expired."""
    ledger = StatusChain(until=time.time() - 10)  # our clock: 10 s past the window
    role = worker_role(tmp_path, ledger)
    ledger.now = int(ledger.until) - 5  # the chain's clock lags ours: not yet
    await role.chain.refresh()
    assert len(role.chain.pending) == 1 and role.status().expired == 0
    ledger.block, ledger.now = ledger.block + 1, int(ledger.until) + 1  # a new block: read
    await role.chain.refresh()
    assert (
        len(role.chain.pending) == 0 and role.status().expired == 1 and role.status().unjudged == 0
    )


def test_the_worker_looks_for_batches_to_delete_every_so_often_below_the_window():
    from node.roles.decisions.clock import StepClock

    r = StoreRetention(every_s=30.0, keep=2)
    clock = StepClock("trainer", async_level=1)
    assert r.floor(0.0, clock, settled=3) is None  # no step announced yet
    clock.step = 10
    assert r.floor(0.0, clock, settled=0) is None  # nothing settled: nothing to look at
    assert r.floor(0.0, clock, settled=3) == 7  # 10 - 1 - 2
    clock.step = 11
    assert r.floor(29.9, clock, settled=3) is None and r.floor(30.0, clock, settled=3) == 8
    # the clock's window narrowed to the chain's max_staleness: the configured one counts
    wide = StoreRetention(async_level=3, every_s=30.0, keep=2)
    assert wide.floor(0.0, clock, settled=1) == 11 - 3 - 2


def test_a_worker_reads_statuses_after_a_new_block_and_its_money_after_verdicts():
    reads = ChainReads(money_every=15)
    assert reads.statuses_due(7) and not reads.statuses_due(7) and reads.statuses_due(8)
    assert reads.money_due(0.0, verdicts=False)  # never read yet
    assert not reads.money_due(1.0, verdicts=False) and not reads.money_due(14.9, False)
    assert reads.money_due(2.0, verdicts=True)  # a verdict changes the money
    assert not reads.money_due(16.9, False) and reads.money_due(17.0, False)


async def test_the_worker_role_reads_the_chain_only_when_it_can_have_changed(tmp_path):
    """Per poll: one block-number read; the pending batches' statuses only in a new block;
    the money after a verdict (else every 15 s)."""
    role = worker_role(tmp_path, StatusChain())
    calls = role.chain.ledger.calls
    await role.chain.refresh()
    assert calls == ["head", "submission", "money"]
    calls.clear()
    for _ in range(3):  # no new block: nothing but the head
        await role.chain.refresh()
    assert calls == ["head"] * 3
    calls.clear()
    role.chain.ledger.block, role.chain.ledger.status = 6, "accepted"
    await role.chain.refresh()  # a new block with the verdict: statuses, then money
    assert calls == ["head", "submission", "money"] and role.chain.pending.accepted == 1
    calls.clear()
    await role.chain.refresh()  # nothing pending: no reads until the money is due
    assert calls == []


async def test_the_worker_deletes_stored_batches_once_matured_and_past_the_window(tmp_path):
    """A worker's batch store no longer grows for the whole run: a batch is deleted once
    its submission matured (no vote can overturn the verdict: nobody fetches it to check)
    and ``keep`` steps after the trainer's window passed it; a restored one (its step
    read from the store) too; one still waiting for its verdict stays."""
    from crypto.identity import Identity
    from protocol.wire import seal
    from tests.helpers.batches import a_batch

    chain = StatusChain(status="accepted", until=time.time() + 60)
    role = worker_role(tmp_path, chain)
    identity = Identity.generate()
    keys = {s: role.store.put(seal(identity, a_batch(identity, step=s))) for s in (1, 2, 6)}
    role.chain.pending.submitted(keys[1], 1)
    role.chain.pending.submitted(keys[6], 6)
    role.chain.pending.restored([keys[2]])  # stored by the worker's previous run
    role.clock.async_level = role.chain.retention.async_level = 1

    async def forget(step, chain_now):
        role.clock.step, chain.now, role.chain.retention.next_at = step, chain_now, 0.0
        await role.chain.forget_spent()
        return sorted(role.store.keys())

    assert await forget(None, 0) == sorted(keys.values())  # no step announced yet
    await role.chain.refresh()
    assert len(role.chain.pending) == 0 and role.chain.pending.accepted == 4
    matured = chain.until + 3600 + 1
    floor_2 = 2 + 1 + role.chain.retention.keep  # the clock's step whose floor is step 2
    assert await forget(100, matured - 2) == sorted(keys.values())  # not matured yet
    assert await forget(floor_2, matured) == sorted([keys[2], keys[6]])  # 1 is below 2
    role.clock.step += 1
    await role.chain.forget_spent()  # within every_s of the last look: not looked at
    assert sorted(role.store.keys()) == sorted([keys[2], keys[6]])
    assert await forget(floor_2 + 1, matured) == [keys[6]]
    role.chain.pending.submitted(keys[6], 6)  # waiting for a verdict: it stays however old
    chain.status, chain.block = "pending", chain.block + 1
    await role.chain.refresh()
    assert await forget(100, matured) == [keys[6]] and role.chain.pending.keys() == [keys[6]]


class ServedNode:
    """What the worker's serve loop asks of its node: handlers, topics, announcements."""

    def __init__(self, metrics) -> None:
        from crypto.identity import Identity

        self.metrics, self.announced, self.identity = metrics, [], Identity.generate()

    def header(self) -> dict:
        return {}

    def serve_requests(self, *args, **kw) -> None:
        pass

    def subscribe(self, topic, handler) -> None:
        pass

    def add_status(self, name, section) -> None:
        pass

    def announce(self, topic, body) -> None:
        self.announced.append(topic)


async def serving_until(role, done, deadline=30.0):
    """Run the worker's serve loop (no generation: its step is done) until ``done()``."""
    role.node = ServedNode(role.node.metrics)
    role._done(role.clock.step)  # read back at start: the step is not worked on again
    async with trio.open_nursery() as nursery:
        await nursery.start(role._serve)
        with trio.fail_after(deadline):
            while not done():  # noqa: ASYNC110 - polls the role's state
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()


async def test_the_serve_loop_deletes_spent_batches(tmp_path):
    """The loop itself looks for spent batches (not only ``_forget_spent`` when called):
    started with matured, accepted batches below the window, it deletes them and keeps
    the one the window still holds."""
    from crypto.identity import Identity
    from protocol.wire import seal
    from tests.helpers.batches import a_batch

    chain = StatusChain(status="accepted", until=time.time() - 7200)
    chain.now = int(time.time())  # past every submission's unlock_at: matured
    role = worker_role(tmp_path, chain)
    identity = Identity.generate()
    keys = {s: role.store.put(seal(identity, a_batch(identity, step=s))) for s in (1, 6)}
    role.chain.pending = PendingVerdicts()
    for step, key in keys.items():
        role.chain.pending.submitted(key, step)
    role.clock.async_level = role.chain.retention.async_level = 1
    role.clock.step = 1 + 1 + role.chain.retention.keep + 1  # the floor is step 2: 1 is below
    await serving_until(role, lambda: role.store.keys() == [keys[6]])
    assert role.chain.pending.accepted == 2


async def test_a_chain_that_does_not_answer_at_start_is_read_again_by_the_loop(tmp_path):
    """The worker's first chain read (resubmitting what a crash left) fails while the chain
    is down: the role starts anyway and its loop reads the verdict once the chain answers."""
    from ledger.client import LedgerUnreachable

    chain = StatusChain(status="accepted")
    head, down = chain.confirmed_head, [True]

    def flaky_head():
        if down:
            down.clear()
            raise LedgerUnreachable("connection refused")
        return head()

    chain.confirmed_head = flaky_head
    role = worker_role(tmp_path, chain)
    role.clock.step = 3
    await serving_until(role, lambda: role.chain.pending.accepted == 1)
    assert not down and len(role.chain.pending) == 0


async def test_a_batch_the_full_disk_refuses_is_stored_later_not_generated_again(
    tmp_path, monkeypatch
):
    """A full disk refuses the batch just made: the worker keeps it and stores it again
    at each pass, and once the disk has room stores, announces and submits that batch. It
    used to generate the batch again every 5 s (minutes of a GPU each time), for nothing."""
    from node.roles.services import inference
    from node.rollouts.maker import MadeBatch
    from protocol.batches import BATCH_TOPIC
    from tests.helpers.batches import a_batch
    from tests.helpers.disk import file_size_limit

    monkeypatch.setattr(inference, "POLL_S", 0.02)  # the loop's pauses, short
    chain = StatusChain(status="pending")
    submitted = []
    chain.submit_work = lambda key, units, version: submitted.append(key)
    role = worker_role(tmp_path, chain)
    role.node = ServedNode(role.node.metrics)
    role.clock.step, role.clock.policy_version = 2, 0  # the base model is in the window
    made = MadeBatch(a_batch(role.node.identity, step=2).encode())

    class Maker:
        calls = 0

        async def call(self, request):
            Maker.calls += 1
            return made

    role.maker = Maker()
    async with trio.open_nursery() as nursery:
        with file_size_limit(len(made.encoded) // 2):  # a full disk for the batch
            await nursery.start(role._serve)
            with trio.fail_after(30):
                while role.counts.errors < 3:  # noqa: ASYNC110 - polls the role's state
                    await trio.sleep(0.02)
            assert role.store.keys() == [] and role.unstored is not None
            assert Maker.calls == 1 and not submitted and BATCH_TOPIC not in role.node.announced
        with trio.fail_after(30):  # room again: the same batch goes out
            while not submitted:  # noqa: ASYNC110 - polls the role's state
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    assert Maker.calls == 1 and role.store.keys() == submitted and role.unstored is None
    assert role.node.announced == [BATCH_TOPIC] and role.done_step == 2


async def test_a_worker_whose_batch_maker_died_stops_instead_of_failing_for_good(
    tmp_path, monkeypatch
):
    """Its child process killed, a worker logged "work failed" every 5 s for as long as it
    ran, registered and announcing, and made nothing. A call failed with the child alive
    is retried; one failed with the child dead ends the role (the node stops)."""
    from node.roles.children.offload import OffloadError
    from node.roles.services import inference

    monkeypatch.setattr(inference, "POLL_S", 0.02)
    chain = StatusChain(status="pending")
    role = worker_role(tmp_path, chain)
    role.node = ServedNode(role.node.metrics)
    role.clock.step, role.clock.policy_version = 2, 0

    class Maker:
        calls, alive_now = 0, True

        async def call(self, request):
            Maker.calls += 1
            Maker.alive_now = Maker.calls < 2  # the first failure with the child alive
            raise OffloadError("the worker process died (exit code -9)")

        def alive(self):
            return Maker.alive_now

    role.maker = Maker()
    with trio.fail_after(30), pytest.raises(ExceptionGroup) as exc:
        async with trio.open_nursery() as nursery:
            await nursery.start(role._serve)
    assert exc.group_contains(OffloadError, match="died")
    assert Maker.calls == 2 and role.counts.errors == 1


async def test_a_stored_batch_the_chain_refuses_is_spent_and_one_unheard_waits(tmp_path):
    """A batch the chain refused (the pool cap, the stake) is never fetched: it is deleted
    once below the floor like a settled one (it stayed for good, and every restart
    submitted it again). One whose submission got no answer may have landed: it waits as a
    restored batch, and the next status read says which."""
    from crypto.identity import Identity
    from ledger.client import LedgerError, LedgerUnreachable
    from protocol.wire import seal
    from tests.helpers.batches import a_batch

    chain = StatusChain(status="none")
    role = worker_role(tmp_path, chain)
    identity = Identity.generate()
    refused = role.store.put(seal(identity, a_batch(identity, step=1)))
    unheard = role.store.put(seal(identity, a_batch(identity, step=2)))

    def submit_work(key, units, version):
        raise (LedgerError if key == refused else LedgerUnreachable)("no")

    chain.submit_work = submit_work
    role.chain.pending.restored([refused, unheard])  # after a restart: the chain never heard
    await role.chain.refresh()
    assert (
        role.chain.pending.settled[refused] == (1, 0.0)
        and unheard not in role.chain.pending.settled
    )
    assert unheard in role.chain.pending.keys() and refused not in role.chain.pending.keys()
    role.clock.step = 1 + 1 + role.chain.retention.keep + 1  # the floor is step 2: 1 is below
    role.clock.async_level = role.chain.retention.async_level = 1
    chain.now = 1  # the chain's clock, past the refused batch's "maturity" (none: 0)
    await role.chain.forget_spent()
    assert role.store.keys() == [unheard], (refused, unheard, role.store.keys())


def test_a_worker_that_cannot_save_its_state_still_sends_the_batch_it_stored(tmp_path):
    """The state file only keeps a restart from making the last step again: a full disk
    there must not stop the batch already stored from being announced and submitted."""
    from tests.helpers.disk import file_size_limit

    role = worker_role(tmp_path, StatusChain())
    role._done(3)
    assert json.loads(role.state_path.read_text()) == {"done_step": 3}
    with file_size_limit(10):  # '{"done_step": 4}' is 16 bytes
        role._done(4)
    assert role.done_step == 4 and json.loads(role.state_path.read_text()) == {"done_step": 3}
    role._resume_pending()  # a restart reads what was saved
    assert role.done_step == 3


def test_verdict_latency_over_a_window_of_the_last_verdicts():
    lat = VerdictLatency(window=4)
    assert lat.summary() == {"count": 0, "last": None, "mean": None, "p95": None, "max": None}
    for seen, posted in ((0.0, 2.0), (1.0, 5.0), (3.0, 4.0), (10.0, 16.0), (20.0, 23.0)):
        lat.add(seen, posted)
    # the first (2 s) left the window of 4: 4, 1, 6, 3
    assert lat.summary() == {"count": 5, "last": 3.0, "mean": 3.5, "p95": 6.0, "max": 6.0}
    assert lat.add(5.0, 4.0) == 0.0  # a clock that went back counts as no time
    twenty = VerdictLatency(window=20)
    for s in range(1, 21):
        twenty.add(0.0, float(s))
    assert twenty.summary()["p95"] == 19.0  # the 19th of 20 (nearest rank), not the maximum


def test_the_learning_curve_is_read_back_from_metrics_jsonl(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert recorded_curve(path) == []
    lines = [
        {"step": 0, "heldout_sampled": 0.25, "heldout_greedy": 0.5, "batches_used": 0, "x": 1},
        {"step": 1, "reward_mean": 0.5, "heldout_sampled": None, "batches_used": 2},
        {"step": 1, "reward_mean": 0.75, "heldout_sampled": 0.5, "heldout_greedy": 0.25},
    ]  # step 1 recorded twice (a crash between checkpoint and record): the last wins
    path.write_text("\n".join(json.dumps(x) for x in lines) + '\n{"step": 2, "rew')
    assert recorded_curve(path) == [
        {
            "step": 0,
            "reward_mean": None,
            "heldout_sampled": 0.25,
            "heldout_greedy": 0.5,
            "batches_used": 0,
        },
        {
            "step": 1,
            "reward_mean": 0.75,
            "heldout_sampled": 0.5,
            "heldout_greedy": 0.25,
            "batches_used": None,
        },
    ]


def test_a_refused_verdict_is_posted_again_after_the_retry_time_and_given_up_at_last():
    posts = VerdictPosts(attempts=3, retry_s=2.0)
    v = Verdict.reject("invalid", "toploc")
    assert posts.refused(k(1), v, now=10.0) == 1
    assert posts.due(11.9) == [] and posts.due(12.0) == [(k(1), v)]
    assert posts.refused(k(1), v, now=12.0) == 2 and posts.due(13.0) == []
    assert posts.refused(k(1), v, now=14.0) == 3  # the third refusal: given up
    assert (len(posts), posts.given_up, posts.due(100.0)) == (0, 1, [])
    posts.refused(k(2), Verdict.accept(), now=0.0)
    posts.posted(k(2))
    assert len(posts) == 0


def test_the_chain_saying_a_verdict_stands_already_or_comes_too_late_is_told_apart():
    """The real contract's refusals (embedded chain, three validators, quorum 2): a second
    validator's vote that agrees with the standing verdict, and a vote repeated after a
    restart, say it stands (``refusal``: counted as posted, not posted again 30 times); a
    vote after the verdict window says it is too late (given up at once); anything else
    is posted again."""
    from ledger.chain import connect
    from ledger.client import LedgerRevert
    from node.roles.decisions.judging import refusal
    from tests.helpers.ledger import ETH, Ledger, key

    ledger = Ledger(connect("embedded"))
    w = ledger.register(ledger.worker, 2 * ETH)
    me = ledger.worker.address
    v1, v2, v3 = (ledger.client(v) for v in (ledger.v1, ledger.v2, ledger.v3))
    for i in (1, 2, 3):
        w.submit_work(key(i), 10, 0)
    v1.accept(me, key(1))
    v1.reject(me, key(2), "invalid")

    def refused(call, *args):
        with pytest.raises(LedgerRevert) as info:
            call(me, *args)
        return refusal(info.value), info.value.reason

    assert refused(v2.accept, key(1)) == ("stands", "work already accepted")
    assert refused(v2.reject, key(2), "invalid") == ("stands", "work already rejected")
    assert refused(v1.accept, key(1)) == ("stands", "already voted on this work")
    assert refused(ledger.client(ledger.stranger).accept, key(3))[0] is None
    assert refusal(RuntimeError("work already accepted")) is None  # a revert only
    ledger.chain.advance_time(ledger.params.verdict_window + 1)
    assert refused(v3.accept, key(3)) == ("too late", "verdict window closed")


async def test_a_validator_counts_a_verdict_that_stands_already_as_posted(tmp_path):
    """The role's post: "stands" is a verdict posted (counted, nothing left to post),
    "too late" is given up at once, any other refusal waits to be posted again."""
    from ledger.client import LedgerRevert
    from tests.test_roles import validator_role

    role = validator_role(tmp_path)
    answers = {}

    class FakeLedger:
        def send_vote(self, worker, work_key, accept, reason="invalid"):
            raise LedgerRevert("accept", answers[work_key])

        def wait(self, sent):
            raise AssertionError("a refused vote is not followed")

    role.votes.ledger = FakeLedger()
    role.node = type("N", (), {"metrics": type("M", (), {"inc": lambda *a, **k: None})()})()
    for i, reason in enumerate(("work already accepted", "verdict window closed", "paused")):
        answers[bytes([i]) * 32] = reason
        await role._post(("0x" + "12" * 20, bytes([i]) * 32), Verdict.accept())
    assert role.votes.posted.counts["accepted"] == 1
    assert (len(role.votes.unposted), role.votes.unposted.given_up) == (1, 1)
    assert [k[1][0] for k in role.votes.unposted.waiting] == [2]


async def test_a_verdict_refused_before_the_chains_fetch_deadline_is_never_given_up_for_it(
    tmp_path,
):
    """A busy development chain's clock can run ahead of the validator's: an unavailable
    reject it refuses as "fetch deadline not reached" is posted again, however often, and
    counted as no refusal (the verdict window still ends it: "too late")."""
    from ledger.client import LedgerRevert
    from node.roles.decisions.judging import refusal
    from tests.test_roles import validator_role

    assert refusal(LedgerRevert("reject", "fetch deadline not reached")) == "not yet"
    role = validator_role(tmp_path)

    class FakeLedger:
        def send_vote(self, worker, work_key, accept, reason="invalid"):
            raise LedgerRevert("reject", "fetch deadline not reached")

        def wait(self, sent):
            raise AssertionError("a refused vote is not followed")

    role.votes.ledger = FakeLedger()
    key = ("0x" + "12" * 20, bytes(32))
    for _ in range(role.votes.unposted.attempts + 5):
        await role._post(key, Verdict.reject("unavailable", "nobody served the batch"))
    assert list(role.votes.unposted.waiting) == [key] and role.votes.unposted.given_up == 0
    assert role.votes.unposted.waiting[key].attempts == 0


def test_a_verdict_the_chain_could_not_take_while_down_is_never_given_up_for_it():
    """A chain restarting for minutes is no refusal: the post waits for it however long."""
    posts = VerdictPosts(attempts=3, retry_s=2.0)
    v = Verdict.accept()
    for i in range(50):
        assert posts.refused(k(1), v, now=2.0 * i, counted=False) == 0
    assert posts.due(100.0) == [(k(1), v)] and posts.given_up == 0
    assert posts.refused(k(1), v, now=100.0) == 1  # a real refusal still counts


def test_the_trainer_asks_again_for_a_batch_after_the_retry_time():
    retry = FetchRetry(retry_s=2.0)
    assert retry.due([k(1), k(2)], now=0.0) == [k(1), k(2)]
    retry.failed(k(1), now=5.0)
    assert retry.due([k(1), k(2)], now=6.9) == [k(2)]
    assert retry.due([k(1), k(2)], now=7.0) == [k(1), k(2)]
    retry.failed(k(2), now=7.0)
    retry.fetched(k(2))
    assert retry.due([k(2)], now=7.0) == [k(2)]


@pytest.mark.parametrize(
    ("usable", "waited", "want"),
    [
        ([], 99.0, None),  # nothing usable: wait however long it has been
        ([1], 9.9, None),  # one of two, before step_wait: wait for more
        ([1], 10.0, [1]),  # one of two at step_wait: train on what there is
        ([1, 2], 0.0, [1, 2]),  # enough at once
        ([1, 2, 3], 0.0, [1, 2, 3]),  # more than enough: all of them
    ],
)
def test_a_step_trains_once_it_has_its_batches_or_waited_step_wait(usable, waited, want):
    keys = [k(n) for n in usable]
    got = step_batches(keys, waited, per_step=2, step_wait=10.0)
    assert got == (None if want is None else [k(n) for n in want])


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    for v in (1, 2, 3, 4):
        (tmp_path / f"v{v}").mkdir()
    (tmp_path / "v2.partial").write_text("x")
    (tmp_path / "vx").mkdir()  # not a checkpoint: left alone
    prune_checkpoints(tmp_path, step=4, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v3", "v4", "vx"]


def test_idle_share_with_given_times():
    busy = BusyTime()
    assert busy.idle_share(100.0) == 0.0  # not serving yet
    busy.since = 100.0
    assert busy.idle_share(100.0) == 0.0
    busy.add(2.5)
    busy.add(0.5)
    assert busy.idle_share(110.0) == 0.7
    busy.add(20.0)
    assert busy.idle_share(110.0) == 0.0  # never below 0


def test_overlapping_work_is_busy_time_once():
    """A validator's concurrent fetches and its judging overlap: their union is busy."""
    now = [0.0]
    busy = BusyTime(since=0.0)
    with busy.working(lambda: now[0]):
        now[0] = 1.0
        with busy.working(lambda: now[0]):  # a second fetch beside the first
            now[0] = 3.0
        now[0] = 4.0
    now[0] = 6.0
    with busy.working(lambda: now[0]):
        now[0] = 7.0
    assert busy.busy_s == 5.0 and busy.idle_share(10.0) == 0.5


def test_the_status_sections_keep_their_keys():
    """The devnet, the CLI, the bench and the tests read these keys from /status."""
    counts = dict(generated=1, submitted=1, accepted=0, rejected=0, unjudged=1, expired=0)
    inference = InferenceStatus(
        address=W,
        step=3,
        policy_version=2,
        version_used=2,
        weights_held=[0, 2],
        last_batch_step=3,
        idle_share=0.5,
        **counts,
        tokens=8,
        errors=0,
        stale=0,
        tokens_per_s=4.0,
    )
    keys = [
        "address", "step", "policy_version", "version_used", "weights_held",
        "last_batch_step", "idle_share", "generated", "submitted", "accepted",
        "rejected", "unjudged", "expired", "tokens", "errors", "stale", "tokens_per_s",
        "generation_s",
    ]  # fmt: skip
    assert list(inference.as_dict()) == [*keys, "rejected_by_reason"]
    money = Stake(stake_wei=5, locked_wei=1, slashed=0, pending_wei=2, claimable_wei=3)
    with_stake = InferenceStatus(**{**inference.__dict__, "stake": money}).as_dict()
    assert list(with_stake) == [
        *keys, "rejected_by_reason", "stake_wei", "locked_wei", "slashed", "pending_wei", "claimable_wei"
    ]  # fmt: skip
    assert with_stake["claimable_wei"] == 3
    validator = ValidatorStatus(
        address=W, step=1, judged=2, accepted=1, rejected=1,
        rejected_by_reason={"invalid": 1}, fetch_failures=0, unposted=0, removed_at=None,
        not_ours=0, judge_seconds=0.1, idle_share=0.9, waiting=0, given_up=0, recent=[],
    )  # fmt: skip
    assert list(validator.as_dict()) == [
        "address", "step", "judged", "accepted", "rejected", "rejected_by_reason",
        "fetch_failures", "unposted", "removed_at", "not_ours", "judge_seconds",
        "idle_share", "waiting", "given_up", "left_to_others", "backups_held",
        "backups_taken", "windows_closed", "recent", "latency_s", "by_worker",
    ]  # fmt: skip
    trainer = TrainerStatus(
        step=1, policy_version=1, train_steps=3, done=False, accepted=2, rejected=0,
        slashed=0, usable=1, batches_used=2, tokens_trained=50, idle_share=0.2,
        last={"step": 1},
    )  # fmt: skip
    assert list(trainer.as_dict()) == [
        "step", "policy_version", "train_steps", "done", "accepted", "rejected", "slashed",
        "usable", "batches_used", "tokens_trained", "idle_share", "last", "curve", "objective",
    ]  # fmt: skip


class PublishingChain:
    """The trainer's ledger for ``publish_on_chain``: ``set_policy_version`` raises each of
    ``raises`` in turn (None: it sets the version); ``mined`` sets the version before the
    n-th call raises (an earlier send that got there meanwhile)."""

    def __init__(self, raises, mined=None):
        self.version, self.raises, self.mined, self.calls = 0, list(raises), mined, 0

    def policy_version(self):
        return self.version

    def set_policy_version(self, version):
        self.calls += 1
        if self.mined == self.calls:
            self.version = version
        exc = self.raises.pop(0) if self.raises else None
        if exc is not None:
            raise exc
        self.version = version


async def test_the_trainer_waits_out_a_transaction_not_mined_in_time(autojump_clock):
    from ledger.client import LedgerPending, LedgerRevert
    from node.roles.services.trainer import publish_on_chain

    # not mined in time; the journal's resend is mined, and the second send is refused
    chain = PublishingChain(
        [LedgerPending("set_policy_version", "0x1", 60), LedgerRevert("x", "version too old")],
        mined=2,
    )
    await publish_on_chain(chain, 3)
    assert chain.version == 3 and chain.calls == 2
    # a refusal while the chain does not have the version is a failure
    chain = PublishingChain([LedgerRevert("x", "only the owner")])
    with pytest.raises(LedgerRevert):
        await publish_on_chain(chain, 3)


async def test_a_validators_votes_are_sent_in_order_and_followed_side_by_side():
    """Each vote is sent under the account's lock (its nonce), then followed to its
    confirmations beside the others: three posts wait for their confirmations at once (one
    after the other, on 2 s blocks and 3 confirmations, capped a validator at a verdict per
    7 s)."""
    import threading

    from node.roles.io.votes import Votes

    release, all_following, sent, following = threading.Event(), threading.Event(), [], []

    class Ledger:
        def send_vote(self, worker, work_key, accept, reason="invalid"):
            sent.append(work_key)
            return work_key

        def wait(self, key):
            following.append(key)
            if len(following) == 3:
                all_following.set()
            assert release.wait(20)

    votes = Votes()
    votes.ledger = Ledger()
    keys = [bytes([i]) * 32 for i in range(3)]
    async with trio.open_nursery() as nursery:
        for k in keys:
            nursery.start_soon(votes.post, ("0x" + "12" * 20, k), Verdict.accept())
        # all three followed before any is confirmed
        followed = await trio.to_thread.run_sync(all_following.wait, 10)
        release.set()
        assert followed, f"followed one at a time: {len(following)} of 3 at once"
    assert sorted(sent) == keys and sorted(following) == keys
    assert votes.posted.counts["accepted"] == 3 and len(votes.unposted) == 0
