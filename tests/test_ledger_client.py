"""The ledger client's failure paths on real chains: a transaction that passes simulation
and fails on chain, out of gas, a lost answer to a send, a stuck transaction, concurrent
senders; the development chain's content-type rule, keystore backups, the event index."""

import http.client
import itertools
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from eth_tester.backends.pyevm.main import get_default_account_keys

from ledger.accounts import LIGHT_SCRYPT_N, AccountError, create_account, load_account
from ledger.chain import connect, start_anvil
from ledger.client import LedgerError, LedgerOutOfGas, LedgerPending, LedgerRevert
from ledger.devchain import DevChain, serve
from ledger.history import EventIndex
from node.cli.devnet import free_port
from tests.helpers.ledger import ETH, PARAMS, Ledger, key, ledger_fixture, paid  # noqa: F401


def test_a_transaction_that_passes_simulation_and_fails_on_chain_reports_the_reason(ledger):
    w = ledger.register(ledger.worker, 2 * ETH)
    first = w.prepare("submit_work", key(1), 5, 0)
    second = w.prepare("submit_work", key(1), 5, 0)  # simulated before the first is mined
    w.broadcast(first)
    assert w.wait(first).status == 1
    w.broadcast(second)
    with pytest.raises(LedgerRevert) as exc:
        w.wait(second)
    assert "reverted on chain" in str(exc.value) and "work key already submitted" in str(exc.value)
    w.submit_work(key(2), 5, 0)  # the client carries on


def test_out_of_gas_is_reported_as_such_and_claim_gas_is_estimated(ledger):
    w = ledger.register(ledger.worker, 2 * ETH)
    me = ledger.worker.address
    w.submit_work_many([(key(i), 1, 0) for i in range(20)])
    ledger.client(ledger.v1).send_many([("accept", (me, key(i))) for i in range(20)])
    ledger.mature()
    with pytest.raises(LedgerOutOfGas, match="ran out of gas on chain"):
        w._transact("claim", 256, gas=80_000)  # what a fixed gas limit did
    assert w.matured(me) == 20  # nothing changed
    before = ledger.balance(ledger.worker)
    receipt = w.claim()
    assert ledger.balance(ledger.worker) == before + 20 * PARAMS.reward_per_unit - paid(receipt)
    assert w.matured(me) == 0


def test_nonces_are_thread_safe(ledger):
    c = ledger.client(ledger.worker)
    errors = []

    def stake():
        try:
            for _ in range(4):
                c.add_stake(10**15)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=stake) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert c.worker(ledger.worker.address).stake == 16 * 10**15
    assert ledger.chain.w3.eth.get_transaction_count(ledger.worker.address) == 16


class LosingProxy:
    """Forwards JSON-RPC to a node but drops the answer to the first raw transaction (the
    node got it; the client sees the connection die): what a timeout looks like."""

    def __init__(self, upstream: str) -> None:
        self.dropped = 0
        self.sends = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                req = urllib.request.Request(upstream, body, {"Content-Type": "application/json"})
                answer = urllib.request.urlopen(req, timeout=10).read()
                if b"eth_sendRawTransaction" in body:
                    proxy.sends += 1
                    if proxy.dropped == 0:
                        proxy.dropped = 1
                        self.connection.close()  # no answer at all
                        return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_send_whose_answer_was_lost_is_looked_up_not_sent_twice():
    server = serve(DevChain(), free_port())
    keys = [k.to_hex() for k in get_default_account_keys()]
    proxy = LosingProxy(f"http://127.0.0.1:{server.server_address[1]}")
    try:
        direct = Ledger(connect(f"http://127.0.0.1:{server.server_address[1]}", dev_keys=keys))
        via = Ledger.__new__(Ledger)
        via.__dict__.update(direct.__dict__)
        via.chain = connect(proxy.url, dev_keys=keys)
        c = via.client(via.stranger)
        before = direct.balance(direct.stranger)
        receipt = c.add_stake(ETH)
        assert proxy.dropped == 1 and proxy.sends == 1  # looked up by hash, not resent
        assert direct.balance(direct.stranger) == before - ETH - paid(receipt)
        assert c.worker(direct.stranger.address).stake == ETH
        c.add_stake(ETH)  # and the nonce is still right
        assert c.worker(direct.stranger.address).stake == 2 * ETH
    finally:
        proxy.close()
        server.shutdown()
        server.server_close()


def test_a_stuck_transaction_is_replaced_and_a_timeout_is_not_called_a_failure():
    node = start_anvil(free_port())
    try:
        chain = connect(node.url, dev_keys=node.keys)
        ledger = Ledger(chain)
        chain.w3.provider.make_request("evm_setAutomine", [False])
        c = ledger.client(ledger.stranger, timeout=2)
        # mined by hand after the client replaced it with higher fees (half-way: 1 s)
        threading.Timer(1.5, lambda: chain.w3.provider.make_request("evm_mine", [])).start()
        p = c.send("add_stake", value=ETH)
        receipt = c.wait(p)
        assert len(p.hashes) == 2 and bytes(receipt.transactionHash) == p.hashes[-1]
        assert c.worker(ledger.stranger.address).stake == ETH

        p = c.send("add_stake", value=ETH)
        with pytest.raises(LedgerPending, match="do not send it again") as exc:
            c.wait(p)  # nobody mines
        chain.w3.provider.make_request("evm_mine", [])
        receipt = chain.w3.eth.get_transaction_receipt(exc.value.tx_hash)
        assert receipt.status == 1  # it was not a failure
        assert c.worker(ledger.stranger.address).stake == 2 * ETH
        chain.w3.provider.make_request("evm_setAutomine", [True])
        c.add_stake(ETH)  # the next nonce is asked from the chain
        assert c.worker(ledger.stranger.address).stake == 3 * ETH
    finally:
        node.stop()


def test_the_development_chain_refuses_requests_that_are_not_json():
    server = serve(DevChain(), free_port())
    url = f"http://127.0.0.1:{server.server_address[1]}"
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_accounts", "params": []})
    try:
        for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {"Content-Type": ctype} if ctype else {}
            req = urllib.request.Request(url, body.encode(), headers)
            if ctype is None:
                req.remove_header("Content-type")
            with pytest.raises(urllib.error.HTTPError) as exc:
                urllib.request.urlopen(req, timeout=5)
            assert exc.value.code == 415
        req = urllib.request.Request(
            url, body.encode(), {"Content-Type": "application/json; charset=utf-8"}
        )
        assert json.loads(urllib.request.urlopen(req, timeout=5).read())["result"]
    finally:
        server.shutdown()
        server.server_close()


def test_the_development_chain_keeps_a_connection_for_many_calls_and_closes_it_on_errors_and_stop():
    server = serve(DevChain(), free_port())
    port = server.server_address[1]
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber", "params": []})
    json_headers = {"Content-Type": "application/json"}
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        answers = []
        for _ in range(3):
            conn.request("POST", "/", body, json_headers)
            resp = conn.getresponse()
            answers.append(json.loads(resp.read())["result"])
            assert not resp.will_close  # HTTP/1.1: the connection stays open
            if not answers[1:]:
                sock = conn.sock
        assert answers == ["0x0"] * 3 and conn.sock is sock  # one socket served all three
        # no answer waits for the client's delayed ACK of its headers (Nagle's algorithm held
        # the body back 40 ms on every call of a kept connection)
        (kept,) = server._open
        assert kept.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)

        # an error answer closes the connection: the body it did not read is never taken
        # for a request of its own
        bad = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        bad.request("POST", "/", "POST / HTTP/1.1\r\n\r\n", {"Content-Type": "text/plain"})
        resp = bad.getresponse()
        assert resp.status == 415 and resp.will_close
        resp.read()
        bad.close()

        server.shutdown()
        server.server_close()

        # the kept connection is ended with the server: no call reaches the chain after it
        def call() -> bytes:
            conn.request("POST", "/", body, json_headers)
            return conn.getresponse().read()

        with pytest.raises((http.client.HTTPException, OSError)):
            call()
        conn.close()
    finally:
        server.shutdown()
        server.server_close()


def test_replacing_a_keystore_keeps_a_backup(tmp_path):
    old = create_account(tmp_path, "pw1")
    new = create_account(tmp_path, "pw2", force=True)
    assert load_account(tmp_path, "pw2").address == new.address != old.address
    (backup,) = tmp_path.glob("account.json.bak-*")
    assert backup.stat().st_mode & 0o777 == 0o600
    (tmp_path / "restored").mkdir()
    (tmp_path / "restored" / "account.json").write_bytes(backup.read_bytes())
    assert load_account(tmp_path / "restored", "pw1").address == old.address


def test_devnet_keystores_take_the_light_scrypt_and_users_the_full_one(tmp_path):
    """The devnet's password is public: its keystores take geth's light work factor (a
    node decrypts its own at every start); ``create_account`` keeps eth-account's 2**18."""
    from node.cli.devnet import DEVNET_PASSWORD, make_account

    address = make_account(tmp_path / "dev")
    keystore = json.loads((tmp_path / "dev" / "account.json").read_text())
    assert keystore["crypto"]["kdf"] == "scrypt"
    assert keystore["crypto"]["kdfparams"]["n"] == LIGHT_SCRYPT_N < 2**18
    assert load_account(tmp_path / "dev", DEVNET_PASSWORD).address.lower() == address
    with pytest.raises(AccountError, match="wrong password"):
        load_account(tmp_path / "dev", "not the devnet's")
    assert make_account(tmp_path / "dev") == address  # kept, not replaced
    create_account(tmp_path / "user", "pw")
    user = json.loads((tmp_path / "user" / "account.json").read_text())
    assert user["crypto"]["kdfparams"]["n"] == 2**18


def test_replacing_the_node_identity_keeps_a_backup(tmp_path):
    """``keys new --force`` replaces the node's Ed25519 key, which may be registered on-chain:
    the old one is kept aside (``identity.key.bak-<time>``, mode 0600)."""
    from node.keystore import create_identity, load_identity

    old = create_identity(tmp_path)
    new = create_identity(tmp_path, force=True)
    assert load_identity(tmp_path).public_bytes == new.public_bytes != old.public_bytes
    (backup,) = tmp_path.glob("identity.key.bak-*")
    assert backup.stat().st_mode & 0o777 == 0o600
    (tmp_path / "restored").mkdir(mode=0o700)
    restored = tmp_path / "restored" / "identity.key"
    restored.write_bytes(backup.read_bytes())
    restored.chmod(0o600)
    assert load_identity(tmp_path / "restored").public_bytes == old.public_bytes


def test_claim_asks_only_for_the_entries_that_matured_when_its_gas_was_estimated(monkeypatch):
    """Entries that mature between the gas estimate and the block must not be settled by
    that claim: it would run out of gas (3 matured when estimated, 63 when mined)."""
    ledger = Ledger(connect("embedded"))
    w = ledger.register(ledger.worker, 2 * ETH)
    me = ledger.worker.address
    w.submit_work_many([(key(i), 1, 0) for i in range(3)])
    ledger.chain.advance_time(600)
    w.submit_work_many([(key(100 + i), 1, 0) for i in range(60)])
    ledger.chain.advance_time(PARAMS.verdict_window + PARAMS.reward_lock - 600 + 1)
    assert w.matured(me) == 3
    estimate = w._gas_for

    def estimate_then_time_passes(name, *args):
        gas = estimate(name, *args)
        ledger.chain.advance_time(700)  # the other 60 mature before the claim is mined
        return gas

    monkeypatch.setattr(w, "_gas_for", estimate_then_time_passes)
    receipt = w.claim()
    assert receipt.status == 1 and w.matured(me) == 60
    assert w.worker(me).locked == 60 * 2 * PARAMS.reward_per_unit


def test_event_index_confirmation_lag_per_account_retention_and_fields(tmp_path):
    ledger = Ledger(connect("embedded"))
    w = ledger.register(ledger.worker, 2 * ETH)
    me = ledger.worker.address
    w.submit_work_many([(key(i), 1, 0) for i in range(6)])
    ledger.client(ledger.v1).reject(me, key(0), "invalid")
    ledger.client(ledger.v2).accept(me, key(1))
    ledger.mature()
    w.claim()
    path = tmp_path / "events.json"
    index = EventIndex(ledger.chain.w3, ledger.address, ledger.block, path, confirmations=2, keep=4)
    events = index.update()
    latest = ledger.chain.w3.eth.block_number
    state = json.loads(path.read_text())
    assert state["last_block"] == latest - 2
    cached = {e["block"] for evs in state["accounts"].values() for e in evs}
    assert max(cached) <= latest - 2
    tail = [e for e in events if not e["confirmed"]]
    assert tail and all(e["block"] > latest - 2 for e in tail)
    assert [e["event"] for e in tail][-1] == "Claimed"
    # per account: the worker's many events do not push out a validator's
    assert len(state["accounts"][me.lower()]) == 4
    assert [e["event"] for e in state["accounts"][ledger.v3.address.lower()]] == [
        "ValidatorProposed",
        "StakeAdded",
        "ValidatorCounted",  # bonded: it counts toward the validators new work needs
    ]
    # the fields say what part is reward, credit, stake
    claimed = next(e for e in events if e["event"] == "Claimed")
    assert set(claimed["args"]) == {"account", "reward", "credit", "total"}
    assert claimed["args"]["reward"] == PARAMS.reward_per_unit and claimed["args"]["credit"] == 0
    slashed = next(e for e in events if e["event"] == "Slashed")
    assert (
        slashed["args"]["stake"] == slashed["args"]["validator_share"] + slashed["args"]["burned"]
    )
    ledger.client(ledger.v1).claim()  # two more blocks: the old tail becomes confirmed
    ledger.client(ledger.v2).add_stake(ETH)
    events = index.update()
    state = json.loads(path.read_text())
    assert state["last_block"] == latest
    for evs in state["accounts"].values():  # cached once each
        assert len({(e["block"], e["log"]) for e in evs}) == len(evs)
    assert [e["event"] for e in events if not e["confirmed"]] == ["Claimed", "StakeAdded"]


def test_event_index_of_an_earlier_chain_with_the_same_contract_address_is_not_reused(
    tmp_path,
):
    """A new development chain has the same chain id and, deployed by the same key, the
    same contract address: `rewards history` showed the earlier chain's events from the
    index cached in the data dir. The cache is keyed by the genesis block hash too."""
    earlier = Ledger(connect("embedded"))
    earlier.register(earlier.worker, 2 * ETH).submit_work_many([(key(i), 1, 0) for i in range(3)])
    earlier.mature()  # the work is confirmed and cached
    path = tmp_path / "events.json"
    w3 = earlier.chain.w3
    cached = EventIndex(w3, earlier.address, earlier.block, path, confirmations=2).update()
    assert "WorkSubmitted" in {e["event"] for e in cached}
    while w3.eth.get_block(0)["timestamp"] >= int(time.time()):
        time.sleep(0.1)  # a genesis of another second: the embedded chain's is the clock's
    now = Ledger(connect("embedded"))
    assert (now.address, now.chain.w3.eth.chain_id) == (earlier.address, w3.eth.chain_id)
    index = EventIndex(now.chain.w3, now.address, now.block, path, confirmations=2)
    fresh = EventIndex(
        now.chain.w3, now.address, now.block, tmp_path / "new.json", confirmations=2
    ).update()
    assert index.update() == fresh and "WorkSubmitted" not in {e["event"] for e in fresh}


def test_the_development_chains_log_index_answers_as_eth_tester_does():
    """``eth_getLogs`` comes from an index built as blocks are mined (eth-tester reads
    every block of the range on every call, holding the chain's lock): for every kind of
    filter it gives exactly eth-tester's answer, also for blocks mined after a first call."""
    from web3.providers.eth_tester.middleware import request_formatters

    port = free_port()
    chain = DevChain()
    server = serve(chain, port)
    try:
        keys = [k.to_hex() for k in get_default_account_keys()]
        ledger = Ledger(connect(f"http://127.0.0.1:{port}", dev_keys=keys))
        c = ledger.client(ledger.stranger)
        c.add_stake(ETH)
        c.fund(ETH // 10)
        w3 = ledger.chain.w3
        staked = w3.keccak(text="StakeAdded(address,uint256)").hex()
        funded = w3.keccak(text="Funded(address,uint256)").hex()
        me = "0x" + "00" * 12 + ledger.stranger.address[2:].lower()

        def same(flt):
            params = request_formatters["eth_getLogs"]([flt])
            with chain.lock:
                ours = chain.logs(params[0])
                theirs = list(chain.provider.make_request("eth_getLogs", params)["result"])
            assert ours == theirs, flt
            return len(ours)

        def all_filters():
            head = w3.eth.block_number
            return [
                same(f)
                for f in (
                    {"fromBlock": "0x0"},
                    {"fromBlock": "0x1", "toBlock": "latest"},
                    {"fromBlock": hex(head - 1), "toBlock": hex(head)},
                    {"fromBlock": hex(head), "toBlock": hex(head - 1)},  # an empty range
                    {"fromBlock": "0x0", "address": c.contract.address},
                    {"fromBlock": "0x0", "address": [c.contract.address.lower(), me[-40:]]},
                    {"fromBlock": "0x0", "address": "0x" + "12" * 20},
                    {"fromBlock": "0x0", "topics": [staked]},
                    {"fromBlock": "0x0", "topics": [[staked, funded]]},
                    {"fromBlock": "0x0", "topics": [None, me]},
                    {"fromBlock": "0x0", "topics": [funded, None, None, me]},
                )
            ]

        with chain.lock:  # "earliest" is block 0, as geth and anvil read it (eth-tester: none)
            earliest = chain.logs({"from_block": "earliest", "to_block": "latest"})
            assert earliest == chain.logs({"from_block": 0}) and earliest
        counts = all_filters()
        assert counts[0] >= 2 and counts[4] == counts[0] and 0 in counts  # filters that bite
        c.add_stake(ETH)  # mined after the index was built: it grows with the chain
        again = all_filters()
        assert again[0] > counts[0]
    finally:
        server.shutdown()
        server.server_close()


def test_the_development_chains_clock_keeps_to_the_wall_clock_under_a_burst(tmp_path):
    """A block per transaction, each strictly later than its parent, ran the chain ahead of
    the wall clock by a second per transaction beyond one a second (60 stakes: a minute
    ahead), so a deadline on it came late while it stood idle. Blocks may share a second:
    after a burst the chain is where the wall clock is, its blocks in order, also when it
    is served again from a saved state; and its clock can be moved on after it stood idle."""
    port = free_port()
    chain = DevChain()
    server = serve(chain, port)
    keys = [k.to_hex() for k in get_default_account_keys()]
    ledger = Ledger(connect(f"http://127.0.0.1:{port}", dev_keys=keys))
    w3 = ledger.chain.w3

    def burst(n):
        first = w3.eth.block_number
        c = ledger.client(ledger.stranger)
        for _ in range(n):
            c.add_stake(1)
        blocks = [w3.eth.get_block(b) for b in range(first, w3.eth.block_number + 1)]
        stamps = [b["timestamp"] for b in blocks]
        assert len(blocks) > n and stamps == sorted(stamps)
        assert all(b["parentHash"] == a["hash"] for a, b in itertools.pairwise(blocks))
        # ahead by at most the second the last block was mined in, not by n - 1 seconds
        assert w3.eth.get_block("latest")["timestamp"] <= int(time.time()), stamps
        assert stamps[-1] - stamps[0] < n - 1  # several blocks shared a second

    try:
        burst(60)
    finally:
        server.shutdown()
        server.server_close()
    chain.save(tmp_path / "state.json")
    again, _ = DevChain.load(tmp_path / "state.json")
    server = serve(again, port)
    try:
        burst(60)
        # moving the clock a second on from a chain idle for longer than that: from the
        # wall clock on, not from the last block (that was refused as travelling backwards)
        time.sleep(2.5)
        before = int(time.time())
        ledger.chain.advance_time(1)
        assert w3.eth.get_block("latest")["timestamp"] >= before + 1
    finally:
        server.shutdown()
        server.server_close()


def test_the_development_chain_keeps_its_state_across_a_restart(tmp_path):
    """``intellect-node chain --state``: the whole chain (blocks, events, balances, nonces,
    the contract and its storage) is written at stop and served again from the file on the
    same port, and a client that was talking to it before carries on."""
    from ledger.devchain import StateError

    port = free_port()
    state = tmp_path / "state.json"
    chain = DevChain()
    server = serve(chain, port)
    keys = [k.to_hex() for k in get_default_account_keys()]
    ledger = Ledger(connect(f"http://127.0.0.1:{port}", dev_keys=keys))
    c = ledger.client(ledger.stranger)
    c.add_stake(ETH)
    c.contract.functions.policy_version().call()
    head = ledger.chain.w3.eth.block_number
    events = list(c.contract.events.Funded.get_logs(from_block=0))
    balance = ledger.balance(ledger.stranger)
    server.shutdown()
    server.server_close()
    chain.save(state, {"contract": ledger.address})
    assert state.stat().st_mode & 0o777 == 0o600  # it may hold development keys
    with pytest.raises(LedgerError, match="chain unreachable"):  # down: tried, no hang
        c.worker(ledger.stranger.address)

    again, extra = DevChain.load(state)
    server = serve(again, port)
    try:
        assert extra == {"contract": ledger.address}
        assert ledger.chain.w3.eth.block_number == head
        assert list(c.contract.events.Funded.get_logs(from_block=0)) == events and events
        assert ledger.balance(ledger.stranger) == balance
        assert c.worker(ledger.stranger.address).stake == ETH
        c.add_stake(ETH)  # the nonce and the contract's storage carry on
        assert c.worker(ledger.stranger.address).stake == 2 * ETH
        assert ledger.chain.w3.eth.block_number == head + 1
        latest = ledger.chain.w3.eth.get_block("latest")
        assert latest["parentHash"] == ledger.chain.w3.eth.get_block(head)["hash"]
    finally:
        server.shutdown()
        server.server_close()

    state.write_text('{"format": "something else"}')
    with pytest.raises(StateError, match="not a development chain state"):
        DevChain.load(state)
    state.write_text("{")
    with pytest.raises(StateError, match="cannot read"):
        DevChain.load(state)
    state.write_text(
        json.dumps({"format": "intellect-devchain/1", "offset": 0, "extra": {}, "db": {}})
    )
    with pytest.raises(StateError, match="damaged"):
        DevChain.load(state)


def test_a_chain_that_accepts_and_never_answers_is_asked_once_not_six_or_eighteen_times():
    """A silent JSON-RPC endpoint: web3 retried each call five times after a timeout and
    the client three times over that, so `rewards` against one sat for many minutes. A
    timeout now ends the call at once; a refused connection is still asked again."""
    from ledger.client import LedgerUnreachable, _retry

    accepted = []
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        server.settimeout(0.2)
        stop = threading.Event()

        def accept():
            while not stop.is_set():
                try:
                    accepted.append(server.accept()[0])  # kept open, never answered
                except TimeoutError:
                    continue

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        chain = connect(f"http://127.0.0.1:{server.getsockname()[1]}", timeout=0.5)
        try:
            with pytest.raises(LedgerUnreachable, match="did not answer in time"):
                _retry(lambda: chain.chain_id)
            assert len(accepted) == 1
        finally:
            stop.set()
            thread.join(5)
            for conn in accepted:
                conn.close()
    # a refused connection (nothing listens) is asked again: three tries, then unreachable
    calls = []

    def refused():
        calls.append(1)
        raise ConnectionRefusedError("refused")

    with pytest.raises(LedgerUnreachable, match="after 3 tries"):
        _retry(refused)
    assert len(calls) == 3


def test_a_wrong_contract_address_is_named_not_a_decoding_error():
    """web3 reads an address without code as empty output and raised its 70-line
    BadFunctionCallOutput; `rewards --contract <wrong>` now says there is no contract."""
    from ledger.client import LedgerClient

    nowhere = "0x" + "11" * 20
    client = LedgerClient(connect("embedded"), nowhere)
    with pytest.raises(LedgerError, match=f"no contract at {nowhere} on embedded"):
        client.params()


# ---- refusals, reverts and a chain that changed, on the embedded chain ----------------------


def node_error(message):
    """What web3 raises for a JSON-RPC error answer of the node (not a revert)."""
    from web3.exceptions import Web3RPCError

    error = {"code": -32000, "message": message}
    return Web3RPCError(message, rpc_response={"jsonrpc": "2.0", "id": 1, "error": error})


class MovableChain:
    """The client's chain, whose id the test changes (another node behind the URL)."""

    def __init__(self, chain):
        self.w3, self.chain_id = chain.w3, chain.chain_id


def test_a_transaction_the_chain_refuses_is_not_retried_as_a_transport_failure(monkeypatch):
    """A node's answer "nonce too low" is a refusal, not a lost connection: reported at
    once as refused, sent once, and the next nonce is asked from the chain."""
    ledger = Ledger(connect("embedded"))
    c = ledger.client(ledger.stranger)
    c.add_stake(ETH)  # the nonce is now counted locally
    sends = []

    def refuse(raw):
        sends.append(raw)
        raise node_error("nonce too low")

    monkeypatch.setattr(c.w3.eth, "send_raw_transaction", refuse)
    with pytest.raises(LedgerError, match="add_stake refused by the chain: nonce too low"):
        c.add_stake(ETH)
    assert len(sends) == 1, f"a refused transaction was sent {len(sends)} times"
    monkeypatch.undo()
    c.add_stake(ETH)  # the nonce the refused one took is asked again, not skipped
    assert c.worker(ledger.stranger.address).stake == 2 * ETH


def test_an_error_that_is_not_a_revert_is_not_reported_as_one(monkeypatch):
    """The node refusing a call itself (not the contract) is a ``LedgerError`` with the
    node's message, never a ``LedgerRevert``; the contract's own refusal still is one."""
    from ledger.chain import revert_reason

    ledger = Ledger(connect("embedded"))
    c = ledger.client(ledger.stranger)
    with pytest.raises(LedgerRevert):
        c.claim()  # nothing to claim: the contract reverts
    assert revert_reason(node_error("header not found")) is None
    assert revert_reason(ConnectionError("reset")) is None

    def node_refuses(*args, **kwargs):
        raise node_error("header not found")

    monkeypatch.setattr(c.w3.eth, "call", node_refuses)
    with pytest.raises(LedgerError, match="refused by the chain: header not found") as exc:
        c.add_stake(ETH)
    assert not isinstance(exc.value, LedgerRevert), "a node's refusal reported as a revert"
    monkeypatch.setattr(c.w3.eth, "estimate_gas", node_refuses)
    with pytest.raises(LedgerError, match="refused by the chain: header not found") as exc:
        c.estimate("add_stake", value=ETH)
    assert not isinstance(exc.value, LedgerRevert), "a node's refusal reported as a revert"


def test_after_a_lost_connection_a_client_signs_nothing_for_another_chain(monkeypatch):
    """The chain id is pinned on the first transaction; a connection lost while sending
    may mean another node (another chain) behind the URL now: checked again, and the
    client refuses to send there."""
    ledger = Ledger(connect("embedded"))
    c = ledger.client(ledger.stranger)
    c.tx.guard.chain = moved = MovableChain(c.chain)  # what the client asks the chain id of
    c.add_stake(ETH)  # pins the chain id
    pinned = moved.chain_id
    send = c.w3.eth.send_raw_transaction
    sends = []

    def lost_and_moved(raw):
        sends.append(raw)
        if len(sends) == 1:
            moved.chain_id = pinned + 1  # the URL now leads to another chain
            raise ConnectionError("connection reset")
        return send(raw)

    monkeypatch.setattr(c.w3.eth, "send_raw_transaction", lost_and_moved)
    with pytest.raises(LedgerError, match=f"the chain changed from {pinned} to {pinned + 1}"):
        c.add_stake(ETH)
    assert len(sends) == 1, "the transaction was sent again to another chain"
    assert c.worker(ledger.stranger.address).stake == ETH
