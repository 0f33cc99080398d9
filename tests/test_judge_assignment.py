"""Assigned judging (``[validator] judge = "assigned"``, SPEC §19 "Assignment"): each
submission to quorum + 1 of its validators, ranked by its block's hash; the next quorum + 1
take it later only if no verdict stands (``node/roles/decisions/assignment.py``, the
validator's ``Docket``), on the embedded chain with six validators."""

import random
from collections import Counter

import pytest

from crypto.identity import Identity
from ledger.chain import connect
from node.roles.decisions.assignment import ValidatorTerms, duty, ranking
from node.roles.io.docket import Docket
from tests.helpers.ledger import ETH, PARAMS, Ledger, key

Q = PARAMS.quorum  # 2: three judges, three backups
W = PARAMS.verdict_window


def addresses(n: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return ["0x" + rng.randbytes(20).hex() for _ in range(n)]


def test_each_validator_judges_its_share_of_the_submissions():
    """Over 3,000 submissions of 10 validators, each is among the first quorum + 1 of
    3/10 of them, within sampling noise; the ranking is a permutation of the validators
    and moves with the block hash (what the worker cannot choose)."""
    validators = addresses(10)
    worker = addresses(1, seed=2)[0]
    rng = random.Random(3)
    judged: Counter[str] = Counter()
    moved = 0
    for _ in range(3000):
        block_hash, k = rng.randbytes(32), rng.randbytes(32)
        order = ranking(block_hash, worker, k, validators)
        assert sorted(order) == sorted(validators)
        assert order == ranking(block_hash, worker, k, list(reversed(validators)))
        judged.update(order[: Q + 1])
        moved += order != ranking(rng.randbytes(32), worker, k, validators)
    assert all(800 <= judged[v] <= 1000 for v in validators), judged  # 900 expected
    assert moved > 2900  # another block hash, another order (10! of them)


def test_a_backups_time_is_a_share_of_the_window_and_later_ranks_never_take_it():
    assert [duty(r, Q, W) for r in range(8)] == [0, 0, 0, W // 4, W // 2, 3 * W // 4, None, None]
    assert [duty(r, 1, 600) for r in range(5)] == [0, 0, 200, 400, None]


def test_validators_of_a_submission_are_those_whose_terms_cover_its_time():
    terms = ValidatorTerms()
    terms.proposed("0xA", 100)
    terms.proposed("0xb", 100)
    terms.proposed("0xc", 500)  # appointed later
    terms.removed("0xb", 300)  # removed: still a validator of work up to 300
    assert terms.of(99) == []
    assert terms.of(300) == ["0xa", "0xb"]
    assert terms.of(301) == ["0xa"]
    assert terms.of(500) == ["0xa", "0xc"]


@pytest.fixture
def six():
    """The embedded chain with six validators (quorum 2) and a registered worker."""
    ledger = Ledger(connect("embedded"), extra_validators=3)
    ledger.register(ledger.worker, 20 * ETH)
    return ledger


def dockets(ledger: Ledger, assigned: bool = True) -> dict[str, Docket]:
    out = {}
    for v in ledger.validators:
        d = Docket()
        d.open(ledger.client(v), ledger.block, assigned=assigned)
        out[v.address.lower()] = d
    return out


def read_keys(docket: Docket) -> set[bytes]:
    found, cases, error = docket.read(clock=(3, 1))
    assert error is None, error
    return {c.sub.key for c in cases}


def test_each_submission_goes_to_quorum_plus_one_and_backups_take_only_open_ones(six):
    """Twelve submissions: each is handed to exactly three of the six validators at once,
    those its block hash ranks first; the other three hold it as a backup. A quarter of the
    window later the fourth in rank takes the submissions with no verdict yet (not the one
    accepted meanwhile), with the clock of when it first read them; half the window later
    the fifth takes what is still open."""
    worker = six.client(six.worker)
    for i in range(12):
        worker.submit_work(key(i), 100, 0)
    validators = dockets(six)
    got = {v: read_keys(d) for v, d in validators.items()}
    me = six.worker.address.lower()
    subs = {b.case.sub.key: b.case.sub for d in validators.values() for b in d.backups}

    def rank_of(i: int, r: int) -> str:
        sub = subs[key(i)]
        return ranking(sub.block_hash, me, key(i), sorted(validators))[r]

    for i in range(12):
        judges = {v for v, keys in got.items() if key(i) in keys}
        assert judges == {rank_of(i, r) for r in range(Q + 1)}, i
    assert all(len(d.backups) + len(got[v]) == 12 for v, d in validators.items())
    assert 0 < min(len(k) for k in got.values()) and max(len(k) for k in got.values()) < 12
    assert all(d.left == 0 for d in validators.values())  # six validators: 3 judge, 3 back up

    judge0 = next(a for a in six.validators if a.address.lower() == rank_of(0, 0))
    six.client(judge0).accept(me, key(0))
    assert all(read_keys(d) == set() for d in validators.values())  # not their time yet
    six.chain.advance_time(W // 4 + 1)
    got = {v: read_keys(d) for v, d in validators.items()}
    fourth = {i for i in range(12) if key(i) in got[rank_of(i, Q + 1)]}
    assert fourth == set(range(1, 12))  # every open one, by its fourth in rank
    assert sum(len(k) for k in got.values()) == 11  # and nobody else yet
    assert validators[rank_of(0, Q + 1)].covered == 1  # the accepted one was left
    taken = [b for d in validators.values() for b in d.backups]
    assert len(taken) == 2 * 12  # the fifth and sixth in rank still hold theirs
    six.chain.advance_time(W // 4)
    got = {v: read_keys(d) for v, d in validators.items()}
    assert sum(len(k) for k in got.values()) == 11
    assert all(key(i) in got[rank_of(i, Q + 2)] for i in range(1, 12))


def test_a_backup_is_judged_against_the_clock_of_its_first_read(six):
    """Submitted while the validators run (the clock then is today's, not the history's),
    a backup taken a quarter of the window later keeps the trainer's clock of its first
    read: staleness is the worker's fault only as of its submission."""
    validators = dockets(six)
    six.client(six.worker).submit_work(key(1), 100, 0)
    for d in validators.values():
        d.read(clock=(7, 5))
    six.chain.advance_time(W // 4 + 1)
    cases = [c for d in validators.values() for c in d.read(clock=(30, 28))[1]]
    assert [c.then for c in cases] == [(7, 5)]


def test_judging_all_takes_every_submission(six):
    for i in range(5):
        six.client(six.worker).submit_work(key(i), 100, 0)
    for d in dockets(six, assigned=False).values():
        assert read_keys(d) == {key(i) for i in range(5)}
        assert not d.backups


def test_a_restarted_validator_is_not_handed_work_whose_window_closed(six):
    """A validator back after longer than the verdict window (its docket reads the chain
    from the contract's block): the submissions whose window closed meanwhile are not
    handed out (the workers deleted the batches, and the chain refuses a vote), one
    submitted since is; those it voted on are skipped as before. Found by the judging
    simulation's validator churn (docs/simulation.md)."""
    worker = six.client(six.worker)
    for i in range(3):
        worker.submit_work(key(i), 100, 0)
    six.chain.advance_time(W + 10)
    worker.submit_work(key(3), 100, 0)
    for d in dockets(six, assigned=False).values():
        assert read_keys(d) == {key(3)}
        assert d.closed == 3
    six.chain.advance_time(W - 100)  # key 3's window still open: it is handed out again
    for d in dockets(six, assigned=False).values():
        assert read_keys(d) == {key(3)}


def test_a_validator_is_no_judge_of_its_own_work(six):
    """A validator that also works: its submissions rank the five others only."""
    v1 = six.client(six.v1)
    v1.add_stake(20 * ETH)
    v1.register_identity(Identity.generate(), 0)
    for i in range(6):
        v1.submit_work(key(i), 100, 0)
    validators = dockets(six)
    assert read_keys(validators[six.v1.address.lower()]) == set()
    assert validators[six.v1.address.lower()].left == 6
    judged = Counter(k for d in validators.values() for k in read_keys(d))
    assert judged == {key(i): Q + 1 for i in range(6)}
    total = sum(len(d.backups) for d in validators.values())
    assert total == 6 * 2  # of the five others, three judge and two back up


class Flaky:
    """A validator's ledger whose parameter reads fail while ``down``; ``reads`` counts
    them."""

    def __init__(self, inner) -> None:
        self.inner, self.down, self.reads = inner, True, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def params(self):
        self.reads += 1
        if self.down:
            raise ConnectionError("provider down")
        return self.inner.params()


def test_a_read_cut_short_by_the_chain_loses_no_submission(six):
    for i in range(4):
        six.client(six.worker).submit_work(key(i), 100, 0)
    ledgers = {v.address.lower(): Flaky(six.client(v)) for v in six.validators}
    validators = {}
    for v, ledger in ledgers.items():
        d = Docket()
        d.open(ledger, six.block, assigned=True)
        validators[v] = d
    for d in validators.values():
        found, cases, error = d.read()
        assert found and not cases and isinstance(error, ConnectionError)
    for ledger in ledgers.values():
        ledger.down = False
        ledger.reads = 0
    judged = Counter(k for d in validators.values() for k in read_keys(d))
    assert judged == {key(i): Q + 1 for i in range(4)}
    assert all(ledger.reads == 1 for ledger in ledgers.values())  # one a read, not a key


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_the_one_validator_of_four_running_judges_its_share_at_once_and_backs_up_the_rest(
    tmp_path, tiny_model_dir
):
    """Real nodes on the served development chain (four validators appointed, quorum 2, a
    60 s verdict window), one validator running with ``judge = "assigned"``: the
    submissions it ranks among the first three it judges at once; those it ranks fourth it
    takes as a backup, no sooner than a quarter of the window after the submission, since no
    other validator runs to judge them; nothing is left without a verdict."""
    from eth_account import Account

    from node.cli.devnet import wait_ready
    from tests.helpers.net import wait_until
    from tests.test_loop import Loop

    loop = Loop(
        tmp_path,
        tiny_model_dir,
        # steps every 5 s: a submission a step, a quarter of them the validator's backups
        step_wait=5,
        chain_args=["--verdict-window", "60"],
        env={"INTELLECT_NODE_VALIDATOR__JUDGE": "assigned"},
    )
    try:
        loop.spawn("trainer", "trainer")
        loop.validator(0)
        loop.worker("w")
        for node in loop.nodes.values():
            wait_ready(node, timeout=120)
        client = loop.client()
        me = loop.addresses["validator"].lower()
        appointed = sorted(
            Account.from_key(k).address.lower() for k in loop.chain_info["validator_keys"]
        )
        assert me in appointed and len(appointed) == 4

        def ranked():
            """(submission's time, our rank, our verdict's time or None) per submission."""
            out = []
            votes = {}
            for name in ("WorkAccepted", "WorkRejected"):
                for e in getattr(client.contract.events, name).get_logs(from_block=0):
                    votes[bytes(e["args"]["key"])] = client.block_time(e["blockNumber"])
            for e in client.contract.events.WorkSubmitted.get_logs(from_block=0):
                k, worker = bytes(e["args"]["key"]), str(e["args"]["worker"]).lower()
                rank = ranking(bytes(e["blockHash"]), worker, k, appointed).index(me)
                out.append((client.block_time(e["blockNumber"]), rank, votes.get(k)))
            return out

        def enough():
            judged = [r for _, r, v in ranked() if v is not None]
            return any(r == Q + 1 for r in judged) and sum(r <= Q for r in judged) >= 2

        wait_until(enough, 480, "a backup judged and two of its own share", interval=2)
        rows = ranked()
        backups = [(t0, v) for t0, r, v in rows if r == Q + 1 and v is not None]
        assert all(v >= t0 + 60 // 4 for t0, v in backups), rows
        status = loop.section("validator", "validator")
        assert status["backups_taken"] >= len(backups), status
        assert status["left_to_others"] == 0, status  # four validators: no rank past the backups
        assert all(r <= Q + 1 for _, r, _ in rows)
    finally:
        loop.close()


def test_the_announcements_of_a_key_not_ours_are_forgotten_when_it_is_read(six):
    """The queue kept every announced key until its submission or the fetch deadline; a
    validator judging its share is told of every batch and submitted only a share, so the
    rest are dropped as the docket passes them (``take_passed``), not left to fill the
    queue's room for announcements."""
    from node.roles.decisions.judging import JudgingQueue

    validators = dockets(six)
    queues = {v: JudgingQueue() for v in validators}
    worker = six.worker.address.lower()
    for i in range(6):
        six.client(six.worker).submit_work(key(i), 100, 0)
        for q in queues.values():
            q.noticed((worker, key(i)), "peer-w", 0.0)
    for v, d in validators.items():
        mine = read_keys(d)
        for k in d.take_passed():
            queues[v].passed(k)
        assert d.take_passed() == []
        assert set(queues[v].entries) == {(worker, k) for k in mine}
        assert queues[v].expired == 0
