"""The ledger from the command line: `intellect-node chain`, `keys new`, `stake`, `rewards`."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from eth_account import Account

from ledger.accounts import load_account
from ledger.chain import connect
from ledger.client import LedgerClient
from node.devnet import free_port

CLI = [sys.executable, "-m", "node.cli"]
ENV = {**os.environ, "INTELLECT_NODE_PASSWORD": "correct horse"}
ETH = 10**18


def run(*args, check=True, env=ENV):
    res = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=120)
    if check:
        assert res.returncode == 0, res.stdout + res.stderr
    return res


@pytest.fixture
def dev_chain(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [*CLI, "chain", "--port", str(port), "--data-dir", str(tmp_path / "chain")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=ENV,
    )
    info_path = tmp_path / "chain" / "chain.json"
    deadline = time.monotonic() + 60
    while not info_path.exists():
        assert proc.poll() is None, proc.stdout.read().decode()
        assert time.monotonic() < deadline, "the chain did not start"
        time.sleep(0.1)
    time.sleep(0.2)
    info = json.loads(info_path.read_text())
    yield info, proc, info_path
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        proc.wait(15)
    proc.stdout.close()


def test_stake_rewards_claim_unbond_withdraw_from_the_cli(dev_chain, tmp_path):
    info, proc, info_path = dev_chain
    loc = ["--chain", info["url"], "--contract", info["contract"]]
    node_dir = tmp_path / "node"
    out = run("keys", "new", "--data-dir", str(node_dir)).stdout
    address = out.split("account")[1].split()[0]
    assert (node_dir / "account.json").stat().st_mode & 0o777 == 0o600
    assert json.loads((node_dir / "account.json").read_text())["crypto"]  # encrypted, not a raw key

    chain = connect(info["url"], dev_keys=info["dev_keys"])
    funder = Account.from_key(info["dev_keys"][5])
    tx = {
        "to": address,
        "value": 10 * ETH,
        "gas": 21000,
        "nonce": chain.w3.eth.get_transaction_count(funder.address),
        "chainId": chain.chain_id,
        "maxFeePerGas": 10**10,
        "maxPriorityFeePerGas": 10**9,
    }
    chain.w3.eth.wait_for_transaction_receipt(
        chain.w3.eth.send_raw_transaction(funder.sign_transaction(tx).raw_transaction)
    )

    report = json.loads(run("rewards", "--json", "--data-dir", str(node_dir), *loc).stdout)
    assert report["address"] == address and not report["registered"] and report["stake"] == 0

    assert "registered" in run("stake", "add", "2", "--data-dir", str(node_dir), *loc).stdout
    run("stake", "add", "0.5", "--data-dir", str(node_dir), *loc)

    worker = LedgerClient(chain, info["contract"], load_account(node_dir, "correct horse"))
    validator = LedgerClient(chain, info["contract"], Account.from_key(info["validator_key"]))
    for i in (1, 2):
        worker.submit_work(i.to_bytes(32, "big"), 100, 3)
    validator.accept((1).to_bytes(32, "big"))
    validator.reject((2).to_bytes(32, "big"))

    report = json.loads(run("rewards", "--json", "--data-dir", str(node_dir), *loc).stdout)
    slashed = int(2.5 * ETH) * 2000 // 10000
    assert report["stake"] == int(2.5 * ETH) - slashed
    assert report["slashed"] == slashed
    assert (report["accepted"], report["rejected"]) == (1, 1)
    assert report["pending"] == 100 * 10**15 and report["claimable"] == 0
    assert [e["event"] for e in report["history"]] == [
        "Registered",
        "StakeAdded",
        "WorkSubmitted",
        "WorkSubmitted",
        "WorkAccepted",
        "WorkRejected",
    ]
    table = run("rewards", "--data-dir", str(node_dir), *loc).stdout
    assert "accepted 1" in table and "WorkRejected" in table

    res = run("rewards", "claim", "--data-dir", str(node_dir), *loc, check=False)
    assert (
        res.returncode == 1 and "nothing to claim" in res.stderr and "Traceback" not in res.stderr
    )
    chain.advance_time(3601)
    before = chain.w3.eth.get_balance(address)
    run("rewards", "claim", "--data-dir", str(node_dir), *loc)
    assert chain.w3.eth.get_balance(address) > before + 100 * 10**15 - 10**15  # minus gas
    assert (
        json.loads(run("rewards", "--json", "--data-dir", str(node_dir), *loc).stdout)["claimable"]
        == 0
    )

    run("stake", "unbond", "1", "--data-dir", str(node_dir), *loc)
    res = run("stake", "withdraw", "--data-dir", str(node_dir), *loc, check=False)
    assert res.returncode == 1 and "unbonding delay not over" in res.stderr
    chain.advance_time(86401)
    run("stake", "withdraw", "--data-dir", str(node_dir), *loc)
    assert (
        json.loads(run("rewards", "--json", "--data-dir", str(node_dir), *loc).stdout)["unbonding"]
        == 0
    )

    wrong = {**ENV, "INTELLECT_NODE_PASSWORD": "wrong"}
    bad = run("stake", "add", "1", "--data-dir", str(node_dir), *loc, check=False, env=wrong)
    assert bad.returncode == 1 and "wrong password" in bad.stderr

    proc.send_signal(signal.SIGINT)
    assert proc.wait(15) == 0
    assert not info_path.exists()


def test_ledger_commands_take_the_chain_from_the_environment(dev_chain, tmp_path):
    """What the devnet does: INTELLECT_NODE_CHAIN / _CONTRACT / _CHAIN_ID point the CLI at a chain."""
    info, _, _ = dev_chain
    node_dir = tmp_path / "n"
    run("keys", "new", "--data-dir", str(node_dir))
    env = {**ENV, "INTELLECT_NODE_CHAIN": info["url"], "INTELLECT_NODE_CONTRACT": info["contract"]}
    res = run("rewards", "--json", "--data-dir", str(node_dir), check=False, env=env)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["contract"] == info["contract"]
    res = run("stake", "add", "1", "--data-dir", str(node_dir), check=False, env=env)
    assert (
        res.returncode == 1
        and "refused by the chain" in res.stderr
        and "Traceback" not in res.stderr
    )  # no ETH yet
    env["INTELLECT_NODE_CHAIN_ID"] = str(info["chain_id"] + 1)
    res = run("stake", "add", "1", "--data-dir", str(node_dir), check=False, env=env)
    assert res.returncode == 1 and "config says" in res.stderr
