"""The chain's books (``tests/helpers/chainbooks.py``) on a small run built with the real
client on anvil: exact books give zeros, and each kind of wrong books gives its figure
with a line saying what; the chaos schedule injects what it counts."""

from __future__ import annotations

import dataclasses
import random
import time

import pytest
from eth_account import Account

from ledger.chain import connect, start_anvil
from node.cli.devnet import free_port
from tests.helpers.chainbooks import ChaosSchedule, check, figures, read_chain_books, reconcile
from tests.helpers.hostilechain import FaultProxy, HostileAnvil
from tests.helpers.ledger import Ledger, key

ZERO = dict.fromkeys(("lost", "paid_twice", "slashed_twice", "honest_slashed", "stuck_nonces"), 0)


@pytest.fixture(scope="module")
def run():
    """A worker with two submissions on anvil: the first accepted, the second rejected (a
    cheat, so slashed), both matured and claimed."""
    node = start_anvil(free_port())
    try:
        led = Ledger(connect(node.url, dev_keys=node.keys))
        worker = led.register(led.worker, 5 * 10**18)
        worker.submit_work(key(1), 100, 0)
        worker.submit_work(key(2), 100, 0)
        validator = led.client(led.v1)
        validator.accept(led.worker.address, key(1))
        validator.reject(led.worker.address, key(2), "invalid")
        led.mature()
        worker.claim()
        yield led
    finally:
        node.stop()


def accounts(led):
    return [a.address for a in (led.owner, led.worker, *led.validators, led.stranger)]


def books(led, **kw):
    kw.setdefault("honest", set())  # the worker cheated on key 2
    return read_chain_books(
        led.as_owner, workers=[led.worker.address], accounts=accounts(led), **kw
    )


def test_a_run_whose_books_add_up_gives_zeros(run):
    got, lines = reconcile(
        run.as_owner,
        workers=[run.worker.address],
        accounts=accounts(run),
        honest=set(),
        expected={(run.worker.address, key(1)), (run.worker.address, key(2))},
    )
    assert (got, lines) == (ZERO, dict.fromkeys(ZERO, []))
    b = books(run)
    assert len(b.settles) == 1 and b.settles[0].entries == 2 and b.settles[0].reward > 0
    assert len(b.slashes) == 1 and b.index_of[(b.slashes[0].worker, b.slashes[0].index)][1] == key(
        2
    )
    assert b.claimed[run.worker.address.lower()] == b.settles[0].reward


def test_an_event_counted_twice_is_paid_or_slashed_twice(run):
    b = books(run)
    doubled = dataclasses.replace(b, settles=b.settles * 2, slashes=b.slashes * 2)
    lines = check(doubled)
    assert figures(lines) == {**ZERO, "paid_twice": 2, "slashed_twice": 1}
    assert "4 entries settled, 2 submitted" in lines["paid_twice"][0]
    assert "worth" in lines["paid_twice"][1]
    assert lines["slashed_twice"] == [
        f"{run.worker.address.lower()}:{key(2).hex()}: slashed 2 times"
    ]


def test_a_claim_above_what_was_settled_is_paid_twice(run):
    b = books(run)
    more = {w: r + 1 for w, r in b.claimed.items()}
    assert figures(check(dataclasses.replace(b, claimed=more)))["paid_twice"] == 1


def test_a_slash_of_accepted_work_and_of_an_honest_worker(run):
    b = books(run)
    accepted_index = next(i for (w, i), k in b.index_of.items() if k[1] == key(1))
    wrong = dataclasses.replace(b.slashes[0], index=accepted_index)
    lines = check(dataclasses.replace(b, slashes=[*b.slashes, wrong]))
    assert lines["slashed_twice"] == [
        f"{run.worker.address.lower()}:{key(1).hex()}: slashed, though accepted"
    ]
    honest = check(books(run, honest={run.worker.address}))["honest_slashed"]
    assert len(honest) == 2  # its reject vote, and the slash the chain counts
    assert "honest worker's batch got a reject vote" in honest[0]


def test_work_never_submitted_or_never_judged_is_lost(run):
    expected = {(run.worker.address, key(1)), (run.worker.address, key(3))}
    lines = check(books(run, expected=expected))["lost"]
    assert lines == [
        f"{run.worker.address.lower()}:{key(3).hex()}: meant to be submitted, not on-chain"
    ]
    b = books(run)
    b.status[(run.worker.address.lower(), key(1))] = "pending"
    assert "no final verdict (status pending)" in check(b)["lost"][0]


def test_a_transaction_left_in_the_mempool_is_a_stuck_nonce(run):
    w3 = run.chain.w3
    stranger = run.stranger
    latest = w3.eth.get_transaction_count(stranger.address)
    tx = {
        "to": stranger.address,
        "value": 1,
        "gas": 21_000,
        "nonce": latest + 1,  # a gap: it waits for a nonce that never comes
        "chainId": w3.eth.chain_id,
        "maxFeePerGas": 10**10,
        "maxPriorityFeePerGas": 10**9,
    }
    raw = Account.from_key(stranger.key).sign_transaction(tx).raw_transaction
    w3.eth.send_raw_transaction(raw)
    try:
        lines = check(books(run))["stuck_nonces"]
        assert lines == [f"{stranger.address}: nonces [{latest + 1}] still in the mempool"]
        b = books(run)
        b.nonces[stranger.address] = (latest, latest + 1)
        assert f"nonce {latest} mined, {latest + 1} pending" in check(b)["stuck_nonces"][0]
    finally:  # the other tests share this chain
        # (anvil_dropTransaction finds ready transactions only, not queued ones)
        w3.provider.make_request("anvil_removePoolTransactions", [stranger.address])
    assert check(books(run))["stuck_nonces"] == []


def test_the_chaos_schedule_injects_what_it_counts():
    with HostileAnvil(free_port(), block_time=0.5) as chain:
        proxy = FaultProxy(chain.url, rates={}, seed=1, hold_s=0.5).start()
        try:
            schedule = ChaosSchedule(
                chain, [proxy], seed=4, gap_s=(0.3, 0.6), first_drop_wait_s=0.5
            ).start()
            assert proxy.rates["429"] == 0.03 and abs(sum(proxy.rates.values()) - 0.10) < 1e-9
            deadline = time.monotonic() + 30
            rng = random.Random(0)
            while {"reorg", "drop", "spike"} - {k for _, k, _ in schedule.log}:
                assert time.monotonic() < deadline, schedule.errors
                for _ in range(20):
                    try:
                        connect(proxy.url, timeout=0.2).w3.eth.block_number  # noqa: B018
                    except Exception:  # the faults it injects
                        pass
                time.sleep(rng.uniform(0, 0.05))
            counts = schedule.stop()
        finally:
            proxy.stop()
        assert schedule.errors == []
        kinds = [k for _, k, _ in schedule.log]
        assert kinds[0] == "drop"  # the drop leads (it waits for a transaction)
        # each kind first, until it bit (no transaction here, so no drop ever does): a run
        # that settles early has still met a reorg and the spike
        bitten = [k for _, k, what in schedule.log if not what.startswith("dropped nothing")]
        assert sorted(bitten[:2]) == ["reorg", "spike"], schedule.log
        assert counts["reorgs"] == kinds.count("reorg") >= 1
        assert counts["fee_spikes"] == kinds.count("spike") == 1  # once by default
        assert counts["rpc_faults"] == sum(proxy.counts[k] for k in proxy.rates) > 0
        assert proxy.rates == dict.fromkeys(proxy.rates, 0.0)  # stopped: forwards everything


def test_the_first_drop_waits_for_a_transaction_that_comes_late():
    """The first drop waits past its two blocks for the network's next transaction: a short
    run whose mempool was idle when the drop came once settled without any (CI, seed 1)."""
    import threading

    from tests.test_hostile_chain import send

    with HostileAnvil(free_port(), block_time=0.5) as chain:
        schedule = ChaosSchedule(chain, [], seed=4, gap_s=(0.1, 0.2), first_drop_wait_s=20)
        late = threading.Timer(4.0, lambda: send(chain))  # eight blocks after the start
        schedule.start()
        late.start()
        try:
            deadline = time.monotonic() + 30
            while not schedule.log:
                assert time.monotonic() < deadline, schedule.errors
                time.sleep(0.1)
        finally:
            late.join()
            counts = schedule.stop()
        at, kind, what = schedule.log[0]
        assert kind == "drop" and at >= 3.5 and "nothing" not in what, schedule.log
        assert counts["dropped"] == 1
