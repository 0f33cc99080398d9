"""``intellect-node chain deploy --rpc URL`` as a run owner runs it, against a chain that
mines a block a second (``HostileAnvil``): the contract answers with the parameters asked
for and the file says where it is; a reorg while it waits is ridden through; a wrong
password, an unfunded account and a declined question each end with one clear line."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from eth_account import Account

from ledger.accounts import LIGHT_SCRYPT_N, create_account
from ledger.client import LedgerClient
from node.cli.devnet import free_port
from tests.helpers.hostilechain import HostileAnvil
from tests.helpers.net import CLI, one_clear_line

PASSWORD = "the owner's password"


@pytest.fixture(scope="module")
def chain():
    node = HostileAnvil(free_port(), block_time=1.0)
    try:
        yield node
    finally:
        node.stop()


def owner(tmp_path, key: str, password: str = PASSWORD):
    """A node data dir whose keystore holds ``key``, and its password file."""
    data_dir = tmp_path / "owner"
    create_account(data_dir, password, private_key=key, scrypt_n=LIGHT_SCRYPT_N)
    pw = tmp_path / "password"
    pw.write_text(password + "\n")
    return data_dir, pw


def validators(chain) -> list[str]:
    return [Account.from_key(k).address for k in chain.keys[:3]]


def deploy_cmd(chain, data_dir, pw, out, *extra, appoint: bool = True):
    flags = [x for v in validators(chain) for x in ("--validator", v)] if appoint else []
    return [
        *CLI,
        *("chain", "deploy", "--rpc", chain.url, "--data-dir", str(data_dir)),
        *("--password-file", str(pw), "--out", str(out), *flags, *extra),
    ]


def run(cmd, stdin: str = ""):
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=120)


def test_deploy_from_the_keystore_account_waits_for_confirmations(chain, tmp_path):
    data_dir, pw = owner(tmp_path, chain.keys[3])
    out = tmp_path / "run" / "chain.json"
    cmd = deploy_cmd(chain, data_dir, pw, out, "--yes")
    res = run([*cmd, "--chain-id", "31337", "--verdict-window", "7200"])
    assert res.returncode == 0, res.stdout + res.stderr
    info = json.loads(out.read_text())
    assert info["chain_id"] == 31337 and info["url"] == chain.url
    assert chain.head() >= info["block"] + 2  # 2 blocks on top when it returned
    client = LedgerClient(chain.chain(), info["contract"], expected_chain_id=31337)
    assert client.owner() == Account.from_key(chain.keys[3]).address == info["owner_address"]
    assert client.params().verdict_window == 7200 == info["params"]["verdict_window"]
    assert all(client.is_validator(v) for v in validators(chain))
    assert info["validator_addresses"] == validators(chain)
    receipt = chain.rpc("eth_getTransactionReceipt", [info["tx"]])
    assert int(receipt["blockNumber"], 16) == info["block"]
    assert receipt["contractAddress"] == info["contract"].lower()
    # it showed the price before it sent, and the settings a node needs after
    assert "estimated, limit" in res.stdout and "at most" in res.stdout
    assert res.stdout.index("cost") < res.stdout.index("sent ")
    assert f'contract = "{info["contract"]}"' in res.stdout
    assert f"contract_block = {info['block']}\nid = 31337\nconfirmations = 2" in res.stdout


def test_a_reorg_while_it_waits_is_ridden_through(chain, tmp_path):
    data_dir, pw = owner(tmp_path, chain.keys[5])
    address = Account.from_key(chain.keys[5]).address
    out = tmp_path / "chain.json"
    cmd = deploy_cmd(chain, data_dir, pw, out, "--yes", "--confirmations", "4")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while int(chain.rpc("eth_getTransactionCount", [address, "latest"]), 16) == 0:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        removed = chain.reorg(2, replay=False)  # mined, then gone: not even in the mempool
        assert len(removed) == 1
        stdout, _ = proc.communicate(timeout=90)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, stdout
    info = json.loads(out.read_text())
    assert info["tx"] == removed[0]  # the same transaction, mined again
    assert chain.rpc("eth_getCode", [info["contract"], "latest"]) not in ("0x", None)
    block = chain.rpc("eth_getBlockByNumber", [hex(info["block"]), False])
    assert block["hash"] == info["block_hash"]  # on the chain as it is now


def test_a_wrong_password_is_one_line(chain, tmp_path):
    data_dir, _ = owner(tmp_path, chain.keys[6])
    bad = tmp_path / "bad"
    bad.write_text("not it\n")
    res = run(deploy_cmd(chain, data_dir, bad, tmp_path / "c.json", "--yes"))
    one_clear_line(res, "wrong password")
    assert not (tmp_path / "c.json").exists()


def test_an_unfunded_account_is_one_line_saying_what_it_needs(chain, tmp_path):
    data_dir, pw = owner(tmp_path, Account.create().key.hex())
    res = run(deploy_cmd(chain, data_dir, pw, tmp_path / "c.json", "--yes"))
    one_clear_line(res, "has 0 ETH", "needs up to", "send it ETH first")


@pytest.mark.parametrize("answer", ["n\n", ""])
def test_a_declined_question_sends_nothing(chain, tmp_path, answer):
    data_dir, pw = owner(tmp_path, chain.keys[7])
    address = Account.from_key(chain.keys[7]).address
    res = run(deploy_cmd(chain, data_dir, pw, tmp_path / "c.json"), stdin=answer)
    one_clear_line(res, "nothing sent", "not confirmed")
    assert "send this deployment? [y/N]" in res.stdout and "cost" in res.stdout
    time.sleep(1.2)  # a block later: nothing of it mined or pending
    assert chain.rpc("eth_getTransactionCount", [address, "pending"]) == "0x0"
    assert not (tmp_path / "c.json").exists()


def test_the_wrong_chain_is_refused_before_anything_is_sent(chain, tmp_path):
    data_dir, pw = owner(tmp_path, chain.keys[8])
    res = run(deploy_cmd(chain, data_dir, pw, tmp_path / "c.json", "--yes", "--chain-id", "8453"))
    one_clear_line(res, "is chain 31337, not 8453")


def test_too_few_validators_is_one_line_before_the_keystore_is_opened(chain, tmp_path):
    res = run(
        deploy_cmd(chain, tmp_path / "none", tmp_path / "pw", tmp_path / "c.json", appoint=False)
    )
    one_clear_line(res, "needs 3 validators", "--validator ADDRESS")
