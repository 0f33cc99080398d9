"""``intellect-node rewards history ADDRESS``: an account's history from the chain's events,
run as a user runs it against the development chain (py-evm served over JSON-RPC) with a
known sequence of events, over two UTC days: the exact rows, the exact per-day totals, as
JSON, CSV and text, for the worker and for a validator that judged it; no keystore."""

import csv
import io
import json
import os
import subprocess
from datetime import UTC, datetime, timedelta

import pytest
from eth_tester.backends.pyevm.main import get_default_account_keys

from ledger.chain import connect
from ledger.devchain import DevChain, serve
from node.cli.devnet import free_port
from tests.helpers.ledger import ETH, PARAMS, Ledger, key
from tests.helpers.net import CLI

DAY = 86400
K1, K2 = "0x" + key(1).hex(), "0x" + key(2).hex()


@pytest.fixture(scope="module")
def chain():
    """A worker registers with 2 ETH and submits 100 and 50 units; a validator accepts the
    first and rejects the second as invalid (day 1). A day later it adds 1 ETH, the work
    matures, anyone settles (the rejected one's collateral is slashed), it claims and
    unbonds 0.5 ETH (day 2)."""
    server = serve(DevChain(), free_port())
    keys = [k.to_hex() for k in get_default_account_keys()]
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        L = Ledger(connect(url, dev_keys=keys))
        now = L.now()
        L.chain.advance_time(DAY - now % DAY + 3600)  # 01:00 UTC: both days well inside
        start = L.chain.w3.eth.block_number
        w = L.register(L.worker, 2 * ETH)
        w.submit_work(key(1), 100, 0)
        w.submit_work(key(2), 50, 0)
        L.client(L.v1).accept(L.worker.address, key(1))
        L.client(L.v1).reject(L.worker.address, key(2), "invalid")
        L.chain.advance_time(DAY)
        w.add_stake(1 * ETH)
        L.mature()
        L.client(L.stranger).settle(L.worker.address)
        w.claim()
        w.unbond(ETH // 2)
        first = L.chain.w3.eth.get_block(start)["timestamp"]
        day1 = datetime.fromtimestamp(first, UTC).date()
        yield L, url, day1.isoformat(), (day1 + timedelta(days=1)).isoformat()
    finally:
        server.shutdown()
        server.server_close()


def history(chain, tmp_path, address, *fmt, contract=None):
    L, url, _, _ = chain
    env = {**os.environ, "HOME": str(tmp_path)}  # no keystore, no dev chain file
    env.pop("INTELLECT_NODE_PASSWORD", None)
    res = subprocess.run(
        [*CLI, "rewards", "history", address, "--chain", url, "--contract", contract or L.address,
         "--data-dir", str(tmp_path / "reader"), *fmt],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    return res


REWARD1, REWARD2 = 100 * PARAMS.reward_per_unit, 50 * PARAMS.reward_per_unit
COLLATERAL2 = REWARD2 * PARAMS.collateral_bps // 10_000
WORKER_ROWS = [  # (day index, event, kind, role, amount_wei, key, detail)
    (0, "Registered", "stake", "account", 2 * ETH, "", "registered"),
    (0, "WorkSubmitted", "submission", "worker", REWARD1, K1, "100 units, policy v0"),
    (0, "WorkSubmitted", "submission", "worker", REWARD2, K2, "50 units, policy v0"),
    (0, "WorkAccepted", "verdict", "worker", 0, K1, "accepted"),
    (0, "WorkRejected", "verdict", "worker", 0, K2, "rejected: invalid"),
    (1, "StakeAdded", "stake", "account", 1 * ETH, "", "stake added"),
    (1, "Slashed", "slash", "worker", -COLLATERAL2, "",
     f"burned {COLLATERAL2 * (10_000 - PARAMS.validator_share_bps) // 10_000} wei"),
    (1, "Settled", "settle", "worker", REWARD1, "", f"2 entries, unpaid {REWARD2} wei"),
    (1, "Claimed", "claim", "account", REWARD1, "", f"reward {REWARD1} wei + credit 0 wei"),
    (1, "Unbonded", "stake", "account", -ETH // 2, "", "unbonding"),
]  # fmt: skip
ZERO = dict.fromkeys(
    ("submitted", "accepted", "rejected", "judged", "slashed_wei", "settled_reward_wei",
     "claimed_wei", "staked_wei"), 0,
)  # fmt: skip
WORKER_DAYS = [
    {**ZERO, "submitted": 2, "accepted": 1, "rejected": 1, "staked_wei": 2 * ETH},
    {**ZERO, "slashed_wei": COLLATERAL2, "settled_reward_wei": REWARD1, "claimed_wei": REWARD1,
     "staked_wei": ETH - ETH // 2},
]  # fmt: skip


def test_history_of_a_worker_as_json_has_every_event_and_the_totals_per_day(chain, tmp_path):
    L, _, day1, day2 = chain
    res = history(chain, tmp_path, L.worker.address, "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["address"] == L.worker.address and report["contract"] == L.address
    got = [
        (r["day"], r["event"], r["kind"], r["role"], r["amount_wei"], r["key"], r["detail"])
        for r in report["rows"]
    ]
    days = (day1, day2)
    assert got == [(days[d], *rest) for d, *rest in WORKER_ROWS]
    for r in report["rows"]:  # each row's time is its block's
        assert r["time"] == L.chain.w3.eth.get_block(r["block"])["timestamp"]
    assert report["days"] == [{"day": d, **t} for d, t in zip(days, WORKER_DAYS, strict=True)]


def test_history_of_a_validator_counts_the_verdicts_it_gave_and_its_share_of_the_slash(
    chain, tmp_path
):
    L, _, day1, day2 = chain
    report = json.loads(history(chain, tmp_path, L.v1.address.lower(), "--json").stdout)
    got = [(r["day"], r["event"], r["kind"], r["role"], r["amount_wei"]) for r in report["rows"]]
    share = COLLATERAL2 * PARAMS.validator_share_bps // 10_000
    day0 = got[0][0]  # its bond, before the test's first day began
    assert got == [
        (day0, "StakeAdded", "stake", "account", 25 * ETH),
        (day1, "WorkAccepted", "verdict", "validator", 0),
        (day1, "WorkRejected", "verdict", "validator", 0),
        (day2, "Slashed", "slash", "validator", share),
    ]
    assert [(d["day"], d["judged"], d["staked_wei"]) for d in report["days"]] == [
        (day0, 0, 25 * ETH),
        (day1, 2, 0),
        (day2, 0, 0),
    ]


def test_history_as_csv_and_text(chain, tmp_path):
    L, _, day1, day2 = chain
    res = history(chain, tmp_path, L.worker.address, "--csv")
    assert res.returncode == 0, res.stderr
    rows_part, days_part = res.stdout.split("\n\n")
    rows = list(csv.DictReader(io.StringIO(rows_part)))
    assert [(r["event"], int(r["amount_wei"])) for r in rows] == [
        (e, a) for _, e, _, _, a, _, _ in WORKER_ROWS
    ]
    days = list(csv.DictReader(io.StringIO(days_part)))
    assert [d["day"] for d in days] == [day1, day2]
    assert [int(d["claimed_wei"]) for d in days] == [0, REWARD1]
    text = history(chain, tmp_path, L.worker.address)
    assert text.returncode == 0, text.stderr
    assert "rejected: invalid" in text.stdout and day2 in text.stdout
    assert text.stdout.count("\n" + day1[:4]) >= len(WORKER_ROWS)  # one line per row


def test_history_refuses_what_is_not_an_address(chain, tmp_path):
    res = history(chain, tmp_path, "0x1234")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "not an address" in res.stderr


def test_history_against_a_wrong_contract_names_it_instead_of_no_events(chain, tmp_path):
    """Events alone cannot tell an account with no history from an address with no
    contract: a mistyped --contract printed "no events for this account"."""
    nowhere = "0x" + "11" * 20
    res = history(chain, tmp_path, chain[0].worker.address, contract=nowhere)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert f"no contract at {nowhere}" in res.stderr and "no events" not in res.stdout


def test_each_batchs_life_names_the_transaction_of_each_stage(chain, tmp_path):
    L, _, _, _ = chain
    report = json.loads(history(chain, tmp_path, L.worker.address, "--json").stdout)
    first, second = report["batches"]
    assert (first["key"], second["key"]) == (K1, K2)

    def events_of(at, name):
        receipt = L.chain.w3.eth.get_transaction_receipt(at["tx"])
        assert receipt.blockNumber == at["block"]
        return L.as_owner.events(name, receipt)

    for b, k, verdict in ((first, key(1), "WorkAccepted"), (second, key(2), "WorkRejected")):
        assert [e.args.key for e in events_of(b["submitted"], "WorkSubmitted")] == [k]
        (vote,) = b["verdicts"]
        assert vote["event"] == verdict and vote["validator"].lower() == L.v1.address.lower()
        assert [e.args.key for e in events_of(vote, verdict)] == [k]
        # both settled by one settle (oldest first), then claimed by the worker's claim
        assert events_of(b["settled"], "Settled")[0].args.entries == 2
        assert events_of(b["claimed"], "Claimed")[0].args.account == L.worker.address
    assert report["disagreements"] == []
    text = history(chain, tmp_path, L.worker.address).stdout
    assert "the last 2 batches" in text and "the node and the chain agree" in text


def test_what_the_node_believes_and_the_chain_does_not_say_is_flagged(chain, tmp_path):
    from ledger.nonces import NonceJournal
    from node.rollouts.store import SUFFIX

    L, _, _, _ = chain
    reader = tmp_path / "reader"
    (reader / "batches").mkdir(parents=True)
    lost = bytes(range(32))  # stored (so submitted, the node believes), not on chain
    (reader / "batches" / f"{lost.hex()}{SUFFIX}").write_bytes(b"envelope")
    (reader / "batches" / f"{key(1).hex()}{SUFFIX}").write_bytes(b"envelope")  # on chain
    journal = NonceJournal(reader / "nonces" / f"{L.worker.address.lower()}.json")
    journal.sent(41, "submit_work", [b"\x07" * 32], b"\x01")
    report = json.loads(history(chain, tmp_path, L.worker.address, "--json").stdout)
    assert report["disagreements"] == [
        f"batch 0x{lost.hex()[:16]}: stored by the node, not submitted on-chain",
        f"transaction 0x{'07' * 8} (submit_work, nonce 41): sent, not confirmed",
    ]
    text = history(chain, tmp_path, L.worker.address).stdout
    assert "disagreements between the node and the chain" in text and lost.hex()[:16] in text


def test_the_contracts_view_is_held_against_the_events():
    from types import SimpleNamespace

    from ledger.accounthistory import batch_lives, disagreements

    def ev(block, name, **args):
        return {"block": block, "log": 0, "tx": f"0x{block:02x}", "event": name, "args": args}

    me = "0x" + "ab" * 20
    events = [
        ev(1, "WorkSubmitted", worker=me, key=K1, index=0, units=5, policy_version=0),
        ev(2, "WorkSubmitted", worker=me, key=K2, index=1, units=5, policy_version=0),
        ev(3, "WorkAccepted", worker=me, key=K1, validator="0xv"),
        ev(4, "Settled", worker=me, entries=1),
        ev(5, "Claimed", account=me),
    ]
    lives = batch_lives(events, me)
    assert lives[0]["settled"] == {"block": 4, "tx": "0x04"}
    assert lives[0]["claimed"] == {"block": 5, "tx": "0x05"}
    assert lives[1]["settled"] is None and lives[1]["claimed"] is None  # not past index 1
    view = {
        K1: SimpleNamespace(status="rejected", settled=True),  # the events said accepted
        K2: SimpleNamespace(status="pending", settled=True),  # no Settled covers it
    }
    assert disagreements(lives, view) == [
        f"batch {K1[:18]}: the events say accepted, the contract rejected",
        f"batch {K2[:18]}: the contract says settled, the events do not",
    ]
