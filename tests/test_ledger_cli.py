"""The ledger from the command line: the ledger guide's walk-through as a new user runs it,
`stake`, `rewards [claim]` (256 matured submissions in one claim), `chain fund`."""

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from eth_account import Account

from ledger.accounts import load_account
from ledger.chain import connect
from ledger.client import LedgerClient
from node.cli.devnet import free_port
from tests.helpers.net import CLI, one_clear_line

ENV = {**os.environ, "INTELLECT_NODE_PASSWORD": "correct horse"}
ETH = 10**18
RATE = 10**12  # the development chain's reward per unit
GUIDE = Path(__file__).resolve().parent.parent / "docs" / "ledger.md"


def run(*args, check=True, env=ENV):
    res = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=120)
    if check:
        assert res.returncode == 0, res.stdout + res.stderr
    return res


def start_chain(data_dir: Path, env=ENV, *extra: str):
    port = free_port()
    proc = subprocess.Popen(
        [*CLI, "chain", "--port", str(port), "--data-dir", str(data_dir), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    info_path = data_dir / "chain.json"
    deadline = time.monotonic() + 60
    while not info_path.exists():
        assert proc.poll() is None, proc.stdout.read().decode()
        assert time.monotonic() < deadline, "the chain did not start"
        time.sleep(0.1)
    time.sleep(0.2)
    return json.loads(info_path.read_text()), proc, info_path


def stop_chain(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        proc.wait(15)
    proc.stdout.close()


@pytest.fixture
def dev_chain(tmp_path):
    info, proc, info_path = start_chain(tmp_path / "chain")
    yield info, proc, info_path
    stop_chain(proc)


def guide_ledger_commands() -> list[str]:
    text = GUIDE.read_text()
    block = text.split("## Walk-through", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line.split("  #")[0].strip() for line in block.strip().splitlines()]


def test_the_guide_walk_through_works_for_a_new_user(tmp_path):
    """Run docs/ledger.md's walk-through block line by line, as written, in a fresh home directory
    (only the chain's port differs, so tests can run side by side)."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTELLECT_NODE_")}
    env["HOME"] = str(home)
    commands = guide_ledger_commands()
    assert commands[0] == "intellect-node chain"
    info, proc, _ = start_chain(home / ".intellect-node" / "chain", env)
    outputs = []
    account = None
    try:
        for line in commands[1:]:
            if line.startswith("export INTELLECT_NODE_PASSWORD="):
                env["INTELLECT_NODE_PASSWORD"] = "a new user's password"
                continue
            for part in line.split(" && "):
                argv = part.split()
                assert argv[0] == "intellect-node"
                argv = [a if a != "ACCOUNT" else account for a in argv[1:]]
                res = subprocess.run(
                    [*CLI, *argv], capture_output=True, text=True, env=env, timeout=120
                )
                outputs.append((argv, res))
                if argv[:2] == ["keys", "new"]:
                    account = re.search(r"^account\s+(0x[0-9a-fA-F]{40})", res.stdout, re.M)[1]
    finally:
        stop_chain(proc)
    by_cmd = {" ".join(a[:2]): r for a, r in outputs}
    for cmd in ("keys new", "chain fund", "stake add", "rewards --name", "stake unbond"):
        assert by_cmd[cmd].returncode == 0, (cmd, by_cmd[cmd].stderr)
    assert "registered" in by_cmd["stake add"].stdout
    assert re.search(r"^stake\s+2 ETH ", by_cmd["rewards --name"].stdout, re.M)
    # nothing matured yet, and the unbonding delay is not over: one clear line each
    one_clear_line(by_cmd["rewards claim"], "nothing to claim")
    one_clear_line(by_cmd["stake withdraw"], "unbonding delay not over")


def test_stake_rewards_claim_unbond_withdraw_from_the_cli(dev_chain, tmp_path):
    info, proc, info_path = dev_chain
    loc = [
        "--chain",
        info["url"],
        "--contract",
        info["contract"],
        "--chain-id",
        str(info["chain_id"]),
    ]
    node_dir = tmp_path / "node"
    out = run("keys", "new", "--data-dir", str(node_dir)).stdout
    address = out.split("account")[1].split()[0]
    assert (node_dir / "account.json").stat().st_mode & 0o777 == 0o600
    assert json.loads((node_dir / "account.json").read_text())["crypto"]  # encrypted

    res = run("stake", "add", "2", "--data-dir", str(node_dir), *loc, check=False)
    one_clear_line(res, address, "has 0 ETH", "needs up to 2.0", f"chain fund {address}")
    out = run("chain", "fund", address, "10", "--data-dir", str(info_path.parent)).stdout
    assert f"sent 10 ETH to {address}; balance now 10 ETH" in out

    report = json.loads(run("rewards", "--json", "--data-dir", str(node_dir), *loc).stdout)
    assert report["address"] == address and not report["registered"] and report["stake"] == 0

    assert "registered" in run("stake", "add", "2", "--data-dir", str(node_dir), *loc).stdout
    run("stake", "add", "0.5", "--data-dir", str(node_dir), *loc)

    chain = connect(info["url"], dev_keys=info["dev_keys"])
    worker = LedgerClient(chain, info["contract"], load_account(node_dir, "correct horse"))
    validator = LedgerClient(chain, info["contract"], Account.from_key(info["validator_key"]))
    for i in (1, 2):
        worker.submit_work(i.to_bytes(32, "big"), 100, 0)
    validator.accept(address, (1).to_bytes(32, "big"))
    validator.reject(address, (2).to_bytes(32, "big"), "invalid")

    collateral = 100 * RATE * 2
    report = json.loads(run("rewards", "--json", "--data-dir", str(node_dir), *loc).stdout)
    assert report["registration_valid"]
    assert report["stake"] == int(2.5 * ETH) and report["locked"] == 2 * collateral
    assert (report["accepted"], report["rejected"]) == (1, 1)
    assert report["pending"] == 100 * RATE and report["claimable"] == 0
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
    one_clear_line(res, "nothing to claim")
    chain.advance_time(7201)
    before = chain.w3.eth.get_balance(address)
    out = run("rewards", "claim", "--data-dir", str(node_dir), *loc).stdout
    assert "claimed 0.0001 ETH in 1 transaction(s)" in out
    assert chain.w3.eth.get_balance(address) > before + 100 * RATE - 10**15  # minus gas
    report = json.loads(run("rewards", "--json", "--data-dir", str(node_dir), *loc).stdout)
    assert report["claimable"] == 0 and report["locked"] == 0
    assert report["stake"] == int(2.5 * ETH) - collateral == int(2.5 * ETH) - report["slashed"]
    assert report["history"][-1]["event"] == "Claimed"
    assert report["history"][-1]["args"]["reward"] == 100 * RATE

    run("stake", "unbond", "1", "--data-dir", str(node_dir), *loc)
    res = run("stake", "withdraw", "--data-dir", str(node_dir), *loc, check=False)
    one_clear_line(res, "unbonding delay not over")
    chain.advance_time(86401)
    run("stake", "withdraw", "--data-dir", str(node_dir), *loc)
    report = json.loads(run("rewards", "--json", "--data-dir", str(node_dir), *loc).stdout)
    assert report["unbonding"] == 0

    wrong = {**ENV, "INTELLECT_NODE_PASSWORD": "wrong"}
    bad = run("stake", "add", "1", "--data-dir", str(node_dir), *loc, check=False, env=wrong)
    one_clear_line(bad, "wrong password")

    proc.send_signal(signal.SIGINT)
    assert proc.wait(15) == 0
    assert not info_path.exists()


@pytest.fixture
def anvil_chain(tmp_path):
    info, proc, info_path = start_chain(tmp_path / "chain", ENV, "--chain", "anvil")
    yield info, proc, info_path
    stop_chain(proc)


def test_a_256_entry_claim_through_the_cli(anvil_chain, tmp_path):
    """256 matured, accepted submissions: `rewards claim` estimates the gas and pays all of
    them (a fixed 400,000-gas claim ran out of gas at 60). On `intellect-node chain --chain
    anvil`, where 512 setup transactions take seconds, not half a minute."""
    info, _, info_path = anvil_chain
    loc = [
        "--chain",
        info["url"],
        "--contract",
        info["contract"],
        "--chain-id",
        str(info["chain_id"]),
    ]
    node_dir = tmp_path / "node"
    address = run("keys", "new", "--data-dir", str(node_dir)).stdout.split("account")[1].split()[0]
    run("chain", "fund", address, "10", "--data-dir", str(info_path.parent))
    run("stake", "add", "2", "--data-dir", str(node_dir), *loc)
    chain = connect(info["url"], dev_keys=info["dev_keys"])
    worker = LedgerClient(chain, info["contract"], load_account(node_dir, "correct horse"))
    validator = LedgerClient(chain, info["contract"], Account.from_key(info["validator_key"]))
    keys = [(1000 + i).to_bytes(32, "big") for i in range(256)]
    blast(worker, [("submit_work", (k, 10, 0)) for k in keys])
    blast(validator, [("accept", (address, k)) for k in keys])
    chain.advance_time(7201)
    assert worker.matured(address) == 256
    before = chain.w3.eth.get_balance(address)
    out = run("rewards", "claim", "--data-dir", str(node_dir), *loc).stdout
    m = re.search(r"claimed ([0-9.]+) ETH in 1 transaction\(s\), ([0-9,]+) gas", out)
    assert m, out
    # progress over the entries, as a log line: stdout is a pipe here, not a terminal
    assert "claim: 256/256 entries (100%)\n" in out and "\x1b" not in out, out
    assert int(float(m[1]) * 10**6) == 256 * 10  # 2560 units at 1e-6 ETH
    gas = int(m[2].replace(",", ""))
    assert gas > 400_000  # what the old fixed limit allowed
    assert worker.matured(address) == 0 and worker.claimable(address) == 0
    assert chain.w3.eth.get_balance(address) > before + 256 * 10 * RATE - 10**16


def blast(client, calls):
    """Test setup only: sign and send calls with consecutive nonces, without the client's
    per-transaction checks, and await them all."""
    w3, account = client.w3, client.account
    nonce = w3.eth.get_transaction_count(account.address)
    hashes = []
    for i, (name, args) in enumerate(calls):
        tx = getattr(client.contract.functions, name)(*args).build_transaction(
            {
                "from": account.address,
                "nonce": nonce + i,
                "gas": 300_000,
                "chainId": client.chain.chain_id,
                "maxFeePerGas": 10**11,
                "maxPriorityFeePerGas": 10**9,
            }
        )
        hashes.append(w3.eth.send_raw_transaction(account.sign_transaction(tx).raw_transaction))
    for h in hashes:
        assert w3.eth.wait_for_transaction_receipt(h, poll_latency=0.01).status == 1


def test_ledger_commands_take_the_chain_from_the_environment(dev_chain, tmp_path):
    """What the devnet does: INTELLECT_NODE_CHAIN__URL / _CONTRACT / _CHAIN_ID point the CLI at a chain."""
    info, _, _ = dev_chain
    node_dir = tmp_path / "n"
    run("keys", "new", "--data-dir", str(node_dir))
    env = {
        **ENV,
        "INTELLECT_NODE_CHAIN__URL": info["url"],
        "INTELLECT_NODE_CHAIN__CONTRACT": info["contract"],
    }
    res = run("rewards", "--json", "--data-dir", str(node_dir), check=False, env=env)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["contract"] == info["contract"]
    res = run("stake", "add", "1", "--data-dir", str(node_dir), check=False, env=env)
    one_clear_line(res, "no chain id", "[chain] id")  # never signs for an unknown chain
    env["INTELLECT_NODE_CHAIN__ID"] = str(info["chain_id"])
    res = run("stake", "add", "1", "--data-dir", str(node_dir), check=False, env=env)
    one_clear_line(res, "has 0 ETH", "chain fund")  # no ETH yet
    env["INTELLECT_NODE_CHAIN__ID"] = str(info["chain_id"] + 1)
    res = run("stake", "add", "1", "--data-dir", str(node_dir), check=False, env=env)
    one_clear_line(res, "config says")


def test_chain_fund_without_a_running_chain_says_what_to_do(tmp_path):
    res = run("chain", "fund", "0x" + "11" * 20, "1", "--data-dir", str(tmp_path), check=False)
    one_clear_line(res, "no development chain is running", "intellect-node chain")
    res = run("chain", "fund", "nope", "1", "--data-dir", str(tmp_path), check=False)
    one_clear_line(res, "not an address")


def test_chain_on_a_taken_or_impossible_port_says_so_in_one_line(tmp_path):
    """The bind failed inside the server's constructor, whose cleanup then raised an
    AttributeError that hid it."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = run("chain", "--port", str(port), "--data-dir", str(tmp_path), check=False)
        one_clear_line(res, f"cannot serve the chain on 127.0.0.1:{port}: Address already in use")
    res = run("chain", "--port", "99999", "--data-dir", str(tmp_path), check=False)
    one_clear_line(res, "cannot serve the chain on 127.0.0.1:99999: ")
    for flag in ("--verdict-window", "--reward-lock", "--unbonding-delay", "--max-staleness"):
        res = run("chain", flag, "-1", "--data-dir", str(tmp_path), check=False)
        assert res.returncode == 2 and "must be" in res.stderr and "or more, got -1" in res.stderr
        assert "Traceback" not in res.stderr
    assert not (tmp_path / "chain.json").exists()
