"""The WorkLedger contract and its client on a real EVM (py-evm, in process)."""

import pytest
from eth_account import Account
from eth_tester.backends.pyevm.main import get_default_account_keys

from ledger.build import compile_contract, load_artifact
from ledger.chain import connect, decode_revert_data, start_anvil
from ledger.client import LedgerClient, LedgerRevert, Params, deploy
from ledger.devchain import DevChain, serve
from node.devnet import free_port

ETH = 10**18
PARAMS = Params(
    min_stake=1 * ETH,
    reward_per_unit=10**15,
    slash_bps=2000,  # 20 %
    validator_share_bps=5000,  # half of the slash to the validator
    verdict_window=3600,
    unbonding_delay=7 * 86400,
    reward_lock=86400,
)
PEER_KEY = bytes(range(32))


class Ledger:
    def __init__(self, chain):
        self.chain = chain
        keys = self.chain.dev_keys
        self.owner = Account.from_key(keys[0])
        self.address, self.block = deploy(self.chain, self.owner, PARAMS)
        self.as_owner = self.client(self.owner)
        self.validator = Account.from_key(keys[1])
        self.worker = Account.from_key(keys[2])
        self.stranger = Account.from_key(keys[3])
        self.as_owner.set_validator(self.validator.address, True)
        self.as_owner.fund(100 * ETH)

    def client(self, account):
        return LedgerClient(self.chain, self.address, account)

    def balance(self, account):
        return self.chain.w3.eth.get_balance(account.address)


@pytest.fixture(params=["embedded", "served", "anvil"])
def ledger(request):
    """The same contract and client on each backend: in-process py-evm, the same chain
    served over JSON-RPC (what `intellect-node chain` runs), and anvil (a real dev node)."""
    if request.param == "embedded":
        yield Ledger(connect("embedded"))
    elif request.param == "served":
        dev = DevChain()
        server = serve(dev, free_port())
        keys = [k.to_hex() for k in get_default_account_keys()]
        try:
            yield Ledger(connect(f"http://127.0.0.1:{server.server_address[1]}", dev_keys=keys))
        finally:
            server.shutdown()
            server.server_close()
    else:
        node = start_anvil(free_port())
        try:
            yield Ledger(connect(node.url, dev_keys=node.keys))
        finally:
            node.stop()


def key(i):
    return i.to_bytes(32, "big")


def test_artifact_is_what_the_source_compiles_to():
    assert compile_contract() == load_artifact()


def test_full_life_cycle(ledger):
    w = ledger.client(ledger.worker)
    v = ledger.client(ledger.validator)
    w.register(PEER_KEY, 5 * ETH)
    info = w.worker(ledger.worker.address)
    assert info.registered and info.stake == 5 * ETH and info.peer_key == PEER_KEY

    w.submit_work(key(1), 100, 7)
    w.submit_work(key(2), 50, 7)
    w.submit_work(key(3), 10, 8)
    s = w.submission(key(1))
    assert (s.worker, s.units, s.policy_version, s.status) == (
        ledger.worker.address,
        100,
        7,
        "pending",
    )

    v.accept(key(1))  # 100 units
    assert w.submission(key(1)).status == "accepted"
    assert w.pending(ledger.worker.address) == 100 * PARAMS.reward_per_unit
    assert w.claimable(ledger.worker.address) == 0

    pool_before = w.reward_pool()
    v.reject(key(2))  # slash 20 % of 5 ETH = 1 ETH: 0.5 to the validator, 0.5 burned
    info = w.worker(ledger.worker.address)
    assert (
        info.stake == 4 * ETH
        and info.slashed == 1 * ETH
        and info.rejected == 1
        and info.accepted == 1
    )
    assert w.claimable(ledger.validator.address) == ETH // 2
    assert w.reward_pool() == pool_before

    ledger.chain.advance_time(PARAMS.verdict_window + 1)
    with pytest.raises(LedgerRevert, match="verdict window closed"):
        v.accept(key(3))
    ledger.client(ledger.stranger).settle(
        key(3)
    )  # unvalidated past the window: accepted optimistically
    assert w.submission(key(3)).status == "accepted"
    assert w.pending(ledger.worker.address) == 110 * PARAMS.reward_per_unit

    with pytest.raises(LedgerRevert, match="nothing to claim"):
        w.claim()
    ledger.chain.advance_time(PARAMS.reward_lock + 1)
    assert w.claimable(ledger.worker.address) == 110 * PARAMS.reward_per_unit
    assert w.pending(ledger.worker.address) == 0
    before = ledger.balance(ledger.worker)
    receipt = w.claim()
    gas_cost = receipt.gasUsed * receipt.effectiveGasPrice
    assert ledger.balance(ledger.worker) == before + 110 * PARAMS.reward_per_unit - gas_cost
    assert w.claimable(ledger.worker.address) == 0

    before = ledger.balance(ledger.validator)
    receipt = v.claim()
    assert (
        ledger.balance(ledger.validator)
        == before + ETH // 2 - receipt.gasUsed * receipt.effectiveGasPrice
    )

    w.unbond(3 * ETH)
    info = w.worker(ledger.worker.address)
    assert (info.stake, info.unbonding) == (1 * ETH, 3 * ETH)
    with pytest.raises(LedgerRevert, match="unbonding delay not over"):
        w.withdraw()
    ledger.chain.advance_time(PARAMS.unbonding_delay + 1)
    before = ledger.balance(ledger.worker)
    receipt = w.withdraw()
    assert (
        ledger.balance(ledger.worker)
        == before + 3 * ETH - receipt.gasUsed * receipt.effectiveGasPrice
    )
    assert w.worker(ledger.worker.address).unbonding == 0


def test_reject_overturns_an_accept_within_the_window_and_voids_its_reward(ledger):
    w, v = ledger.client(ledger.worker), ledger.client(ledger.validator)
    w.register(PEER_KEY, 2 * ETH)
    w.submit_work(key(9), 40, 1)
    v.accept(key(9))
    assert w.pending(ledger.worker.address) == 40 * PARAMS.reward_per_unit
    pool = w.reward_pool()
    v.reject(key(9))
    assert w.pending(ledger.worker.address) == 0
    assert w.reward_pool() == pool + 40 * PARAMS.reward_per_unit
    ledger.chain.advance_time(PARAMS.reward_lock + 1)
    assert w.claimable(ledger.worker.address) == 0


def test_slashing_reaches_unbonding_stake(ledger):
    w, v = ledger.client(ledger.worker), ledger.client(ledger.validator)
    w.register(PEER_KEY, 2 * ETH)
    w.submit_work(key(5), 1, 1)
    w.unbond(2 * ETH)  # trying to run from the slash
    v.reject(key(5))
    info = w.worker(ledger.worker.address)
    assert info.stake == 0 and info.unbonding == 2 * ETH - 2 * ETH * 2000 // 10000


@pytest.mark.parametrize(
    ("who", "call", "reason"),
    [
        ("stranger", lambda c, L: c.reject(key(1)), "only a validator"),
        ("worker", lambda c, L: c.accept(key(1)), "only a validator"),
        ("stranger", lambda c, L: c.set_validator(L.stranger.address, True), "only the owner"),
        ("validator", lambda c, L: c.set_params(PARAMS), "only the owner"),
        ("worker", lambda c, L: c.submit_work(key(1), 5, 1), "work key already submitted"),
        ("worker", lambda c, L: c.submit_work(key(7), 0, 1), "zero units"),
        ("stranger", lambda c, L: c.submit_work(key(8), 5, 1), "not a registered worker"),
        ("stranger", lambda c, L: c.register(PEER_KEY, ETH // 2), "stake below minimum"),
        ("worker", lambda c, L: c.register(PEER_KEY, 2 * ETH), "already registered"),
        ("stranger", lambda c, L: c.claim(), "nothing to claim"),
        ("worker", lambda c, L: c.withdraw(), "nothing unbonding"),
        ("worker", lambda c, L: c.unbond(100 * ETH), "amount above stake"),
        ("validator", lambda c, L: c.accept(key(404)), "work is not pending"),
        ("stranger", lambda c, L: c.settle(key(1)), "verdict window still open"),
    ],
)
def test_access_control_and_bad_input_revert_and_change_nothing(ledger, who, call, reason):
    w = ledger.client(ledger.worker)
    w.register(PEER_KEY, 2 * ETH)
    w.submit_work(key(1), 5, 1)
    chain = ledger.chain
    snapshot = {
        "worker": w.worker(ledger.worker.address),
        "submission": w.submission(key(1)),
        "pool": w.reward_pool(),
        "validator": w.is_validator(ledger.stranger.address),
        "params": w.params(),
        "block": chain.w3.eth.block_number,
    }
    client = ledger.client(getattr(ledger, who))
    with pytest.raises(LedgerRevert) as exc:
        call(client, ledger)
    assert exc.value.reason == reason
    assert snapshot == {
        "worker": w.worker(ledger.worker.address),
        "submission": w.submission(key(1)),
        "pool": w.reward_pool(),
        "validator": w.is_validator(ledger.stranger.address),
        "params": w.params(),
        "block": chain.w3.eth.block_number,  # nothing was even sent
    }


def test_verdict_after_the_window_and_claim_of_anothers_rewards(ledger):
    w, v = ledger.client(ledger.worker), ledger.client(ledger.validator)
    w.register(PEER_KEY, 2 * ETH)
    w.submit_work(key(1), 5, 1)
    w.submit_work(key(2), 5, 1)
    v.accept(key(1))
    ledger.chain.advance_time(PARAMS.verdict_window + PARAMS.reward_lock + 10)
    with pytest.raises(LedgerRevert, match="verdict window closed"):
        v.reject(key(2))
    with pytest.raises(LedgerRevert, match="verdict window closed"):
        v.reject(key(1))  # an accepted key can no longer be overturned
    # the stranger cannot take the worker's rewards: claim pays msg.sender only
    with pytest.raises(LedgerRevert, match="nothing to claim"):
        ledger.client(ledger.stranger).claim()
    assert w.claimable(ledger.worker.address) == 5 * PARAMS.reward_per_unit


def test_revert_data_decoding():
    data = (
        "0x08c379a0" + "20".rjust(64, "0") + "09".rjust(64, "0") + b"not owner".hex().ljust(64, "0")
    )
    assert decode_revert_data(data) == "not owner"
    assert decode_revert_data("0x4e487b71" + "11".rjust(64, "0")) == "panic 0x11"
    assert decode_revert_data("0xdeadbeef") is None
    assert decode_revert_data("nonsense") is None


def test_several_transactions_in_flight_get_consecutive_nonces(ledger):
    w = ledger.client(ledger.worker)
    w.register(PEER_KEY, 2 * ETH)
    receipts = w.submit_work_many([(key(100 + i), 1 + i, 1) for i in range(12)])
    assert all(r.status == 1 for r in receipts)
    assert [w.submission(key(100 + i)).units for i in range(12)] == [1 + i for i in range(12)]
    w.submit_work(key(200), 1, 1)  # the local nonce counter is still right afterwards


def test_refuses_to_sign_for_another_chain(ledger):
    from ledger.client import LedgerError

    wrong = LedgerClient(
        ledger.chain, ledger.address, ledger.worker, expected_chain_id=ledger.chain.chain_id + 1
    )
    with pytest.raises(LedgerError, match="config says"):
        wrong.register(PEER_KEY, 2 * ETH)
    assert not ledger.client(ledger.worker).worker(ledger.worker.address).registered


def test_transient_rpc_failures_are_retried_then_reported(monkeypatch):
    from ledger import client as client_module

    monkeypatch.setattr(client_module.time, "sleep", lambda s: None)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("connection refused")
        return "ok"

    assert client_module._retry(flaky) == "ok" and len(calls) == 3

    def down():
        raise TimeoutError("timed out")

    with pytest.raises(client_module.LedgerError, match="unreachable after 3 tries"):
        client_module._retry(down)
