"""The hostile chain (``tests/helpers/hostilechain.py``) does what it says: anvil's reorgs,
drops and fee spikes as a real chain shows them, and the proxy's RPC faults at their rates.

Most tests mine on demand (``block_time=None``), so each block is the test's own; the ones
that need interval mining use short blocks."""

from __future__ import annotations

import random
import time

import pytest
import requests
from eth_account import Account

from node.cli.devnet import free_port
from tests.helpers.hostilechain import FAULTS, WRONG_CHAIN_ID, FaultProxy, HostileAnvil, rpc

TIP = 10**9


@pytest.fixture
def anvil():
    node = HostileAnvil(free_port(), block_time=None)
    try:
        yield node
    finally:
        node.stop()


def send(node: HostileAnvil, key: int = 0, *, nonce: int | None = None, max_fee=None) -> str:
    """A 1-wei transfer from dev key ``key``, signed here and sent raw; its hash."""
    acct = Account.from_key(node.keys[key])
    if nonce is None:
        nonce = int(node.rpc("eth_getTransactionCount", [acct.address, "pending"]), 16)
    tx = {
        "to": Account.from_key(node.keys[9]).address,
        "value": 1,
        "gas": 21_000,
        "nonce": nonce,
        "chainId": 31337,
        "maxFeePerGas": max_fee or 2 * node.base_fee("pending") + TIP,
        "maxPriorityFeePerGas": TIP,
    }
    raw = acct.sign_transaction(tx).raw_transaction.hex()
    return str(node.rpc("eth_sendRawTransaction", ["0x" + raw.removeprefix("0x")]))


def receipt(node: HostileAnvil, tx_hash: str):
    return node.rpc("eth_getTransactionReceipt", [tx_hash])


def nonce(node: HostileAnvil, key: int, block: str = "latest") -> int:
    address = Account.from_key(node.keys[key]).address
    return int(node.rpc("eth_getTransactionCount", [address, block]), 16)


# ---- reorgs --------------------------------------------------------------------------------


def test_a_reorg_of_depth_2_removes_a_receipt_and_replay_mines_it_again(anvil):
    tx = send(anvil)
    anvil.mine()
    first = receipt(anvil, tx)
    anvil.mine()  # the transaction is 2 blocks deep
    assert first is not None and nonce(anvil, 0) == 1

    assert anvil.reorg(2) == [tx]
    assert receipt(anvil, tx) is None  # gone from the chain ...
    assert nonce(anvil, 0) == 0  # ... its nonce free again ...
    assert [h for _, _, h in anvil.pending()] == [tx]  # ... and back in the mempool
    anvil.mine()
    again = receipt(anvil, tx)
    assert again is not None
    assert again["blockHash"] != first["blockHash"]
    assert int(again["blockNumber"], 16) > int(first["blockNumber"], 16)
    assert anvil.counts["reorgs"] == 1 and anvil.counts["replayed"] == 1


def test_a_reorg_without_replay_loses_the_transaction(anvil):
    tx = send(anvil)
    anvil.mine()
    head = anvil.head()
    assert anvil.reorg(1, replay=False) == [tx]
    assert anvil.head() == head  # the removed block is replaced by an empty one
    assert anvil.pending() == [] and anvil.rpc("eth_getTransactionByHash", [tx]) is None
    anvil.mine(3)
    assert receipt(anvil, tx) is None and nonce(anvil, 0, "pending") == 0


def test_a_reorg_deeper_than_a_transaction_leaves_it_alone(anvil):
    tx = send(anvil)
    anvil.mine(3)  # 3 blocks deep: a reorg of 2 does not reach it
    assert anvil.reorg(2) == []
    assert receipt(anvil, tx) is not None


def test_a_reorg_deeper_than_the_chain_stops_at_genesis(anvil):
    assert anvil.reorg(3) == [] and anvil.counts["reorgs"] == 0  # at genesis: none
    tx = send(anvil)
    anvil.mine()
    assert anvil.reorg(3) == [tx] and anvil.head() == 1  # as deep as the chain
    anvil.mine()
    assert receipt(anvil, tx) is not None


def test_interval_mining_goes_on_after_a_reorg():
    with HostileAnvil(free_port(), block_time=0.5) as node:
        deadline = time.monotonic() + 10
        while node.head() < 3:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        node.reorg(2)
        head = node.head()
        time.sleep(1.6)
        assert node.head() >= head + 2


# ---- the mempool -----------------------------------------------------------------------------


def test_drop_removes_a_pending_transaction_and_not_another(anvil):
    kept, dropped = send(anvil, 0), send(anvil, 1)
    assert anvil.drop(dropped) is True
    assert anvil.drop(dropped) is False  # no longer there
    assert [h for _, _, h in anvil.pending()] == [kept]
    anvil.mine()
    assert receipt(anvil, kept) is not None and receipt(anvil, dropped) is None
    assert anvil.counts["dropped"] == 1


def test_drop_pending_picks_by_its_seed():
    picks = []
    for _ in range(2):
        with HostileAnvil(free_port(), block_time=None) as node:
            sent = [send(node, k) for k in range(5)]
            dropped = node.drop_pending(2, random.Random(7))
            assert len(dropped) == 2 and set(dropped) <= set(sent)
            assert sorted(h for _, _, h in node.pending()) == sorted(set(sent) - set(dropped))
            picks.append([sent.index(h) for h in dropped])
    assert picks[0] == picks[1]


# ---- fees ------------------------------------------------------------------------------------


def test_a_fee_spike_leaves_a_transaction_paying_the_old_max_fee_unmined(anvil):
    base = anvil.base_fee("pending")
    cheap = send(anvil, 0, max_fee=2 * base + TIP)
    fee = anvil.spike_fees(10)
    assert fee == 10 * anvil.base_fee("latest") and anvil.base_fee("pending") == fee
    rich = send(anvil, 1, max_fee=3 * fee)
    anvil.mine(3)
    assert receipt(anvil, rich) is not None  # the chain goes on ...
    assert receipt(anvil, cheap) is None  # ... without the underpriced one
    assert anvil.pending() == []  # anvil evicts it, geth would keep it
    with pytest.raises(Exception, match="less than block base fee"):
        send(anvil, 2, max_fee=2 * base + TIP)  # a new one at the old fee: refused
    assert anvil.counts["fee_spikes"] == 1


def test_a_spike_has_a_floor(anvil):
    assert anvil.spike_fees(2, at_least=7 * 10**9) == 7 * 10**9 > 2 * anvil.base_fee()
    assert anvil.base_fee("pending") == 7 * 10**9


def test_drop_pending_waits_for_a_transaction_to_come(anvil):
    import threading

    later = threading.Timer(0.3, lambda: send(anvil))
    later.start()
    try:
        assert anvil.drop_pending(1) == []  # nothing there now
        dropped = anvil.drop_pending(1, wait_s=3)
    finally:
        later.join()
    assert len(dropped) == 1 and anvil.pending() == []


def test_a_spike_falls_back_an_eighth_a_block_with_interval_mining():
    with HostileAnvil(free_port(), block_time=0.5) as node:
        fee = node.spike_fees(10)
        deadline = time.monotonic() + 10
        seen = {}
        while len(seen) < 3:
            assert time.monotonic() < deadline
            block = node.rpc("eth_getBlockByNumber", ["latest", False])
            seen[int(block["number"], 16)] = int(block["baseFeePerGas"], 16)
            time.sleep(0.1)
        fees = [seen[n] for n in sorted(seen)]
        assert fee in fees
        after = fees[fees.index(fee) :]
        assert all(
            b == a - a // 8 or b == a * 7 // 8 + 1 for a, b in zip(after, after[1:], strict=False)
        )


# ---- the RPC proxy -----------------------------------------------------------------------------


def outcome(url: str, method: str = "eth_blockNumber", params=None, timeout: float = 0.3) -> str:
    """What a client saw: a fault kind, or "ok" with the result."""
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params or []}
    try:
        r = requests.post(url, json=body, timeout=timeout)
    except requests.ReadTimeout:
        return "timeout"
    except requests.ConnectionError:
        return "reset"
    if r.status_code != 200:
        return str(r.status_code)
    return "ok"


def test_the_proxy_injects_each_fault_at_its_rate_and_forwards_the_rest(anvil):
    rates = {"429": 0.1, "500": 0.1, "timeout": 0.05, "reset": 0.1}
    n = 400
    seen: list[list[str]] = []
    for _ in range(2):  # the same seed gives the same faults
        with FaultProxy(anvil.url, rates=rates, seed=3, hold_s=0.6) as proxy:
            seen.append([outcome(proxy.url) for _ in range(n)])
            got = {k: seen[-1].count(k) for k in (*rates, "ok")}
            assert got == {**{k: proxy.counts[k] for k in rates}, "ok": proxy.counts["forwarded"]}
            assert proxy.counts["stale"] == proxy.counts["wrong_chain"] == 0
    assert seen[0] == seen[1]
    for kind, rate in rates.items():  # binomial: within 4 standard deviations
        sd = (n * rate * (1 - rate)) ** 0.5
        assert abs(got[kind] - n * rate) < 4 * sd, (kind, got)
    assert abs(got["ok"] - n * 0.65) < 4 * (n * 0.65 * 0.35) ** 0.5


def test_a_timeout_holds_the_request_past_the_clients_timeout(anvil):
    with FaultProxy(anvil.url, rates={"timeout": 1.0}, hold_s=1.0) as proxy:
        t0 = time.monotonic()
        assert outcome(proxy.url, timeout=0.5) == "timeout"
        assert time.monotonic() - t0 >= 0.5
        with pytest.raises(requests.ConnectionError):  # then closed, never answered
            requests.post(proxy.url, json={"method": "eth_blockNumber", "id": 1}, timeout=5)


def test_the_wrong_chain_answers_only_chain_id(anvil):
    with FaultProxy(anvil.url, rates={"wrong_chain": 1.0}) as proxy:
        assert int(rpc(proxy.url, "eth_chainId"), 16) == WRONG_CHAIN_ID
        assert int(rpc(proxy.url, "eth_blockNumber"), 16) == anvil.head()
        assert proxy.counts["wrong_chain"] == 1 and proxy.counts["forwarded"] == 1


def test_a_stale_answer_is_really_older(anvil):
    acct = Account.from_key(anvil.keys[0]).address
    with FaultProxy(anvil.url, rates={}) as proxy:
        assert int(rpc(proxy.url, "eth_blockNumber"), 16) == 0
        assert rpc(proxy.url, "eth_getTransactionCount", [acct, "latest"]) == "0x0"
        tx = send(anvil)
        assert rpc(proxy.url, "eth_getTransactionReceipt", [tx]) is None
        anvil.mine(2)
        time.sleep(0.3)  # past the proxy's head cache
        assert int(rpc(proxy.url, "eth_blockNumber"), 16) == 2  # this one is current
        proxy.set_rates(stale=1.0)
        assert int(rpc(proxy.url, "eth_blockNumber"), 16) == 0  # the head went back
        assert rpc(proxy.url, "eth_getTransactionCount", [acct, "latest"]) == "0x0"
        assert rpc(proxy.url, "eth_getTransactionReceipt", [tx]) is None  # "not mined"
        # nothing older cached: forwarded, fresh
        assert rpc(proxy.url, "eth_getBalance", [acct, "latest"]) is not None
        assert proxy.counts["stale"] == 3
        proxy.set_rates(stale=0.0)
        assert int(rpc(proxy.url, "eth_blockNumber"), 16) == 2
        assert rpc(proxy.url, "eth_getTransactionReceipt", [tx]) is not None


def test_a_batch_passes_through(anvil):
    with FaultProxy(anvil.url, rates={"429": 1.0}) as proxy:
        batch = [{"jsonrpc": "2.0", "id": i, "method": "eth_chainId", "params": []} for i in (1, 2)]
        answers = requests.post(proxy.url, json=batch, timeout=5).json()
        assert [a["result"] for a in answers] == ["0x7a69", "0x7a69"]
        assert proxy.counts["429"] == 0 and proxy.counts["forwarded"] == 1


def test_rates_are_checked():
    with pytest.raises(ValueError, match="unknown fault"):
        FaultProxy("http://127.0.0.1:1", rates={"slow": 0.1})
    with pytest.raises(ValueError, match="at most 1"):
        FaultProxy("http://127.0.0.1:1", rates=dict.fromkeys(FAULTS, 0.2))


# ---- on 2 s blocks ---------------------------------------------------------------------------


@pytest.mark.slow
def test_on_two_second_blocks_a_reorged_transaction_is_mined_again():
    with HostileAnvil(free_port(), block_time=2.0) as node:
        tx = send(node)
        deadline = time.monotonic() + 20
        while (first := receipt(node, tx)) is None:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        while node.head() < int(first["blockNumber"], 16) + 1:
            time.sleep(0.1)
        depth = node.head() - int(first["blockNumber"], 16) + 1
        assert node.reorg(depth) == [tx]
        while (again := receipt(node, tx)) is None:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert again["blockHash"] != first["blockHash"]
