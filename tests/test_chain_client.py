"""The ledger client on a chain that behaves like a real one (issue #55): providers that
fail in each way a hosted RPC provider does, several URLs, a nonce journal shared by
processes and kept across restarts, transactions dropped from the mempool, fee spikes,
reorgs, confirmations, idempotent submissions.

The providers' faults are scripted (``ScriptedRpc``: each answer chosen by the test) so
that each class is seen exactly; the chain's are anvil's own (``anvil_reorg``,
``anvil_dropTransaction``, ``anvil_setNextBlockBaseFeePerGas``) with automatic mining off,
so that the test decides when blocks come."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ledger.chain import connect, start_anvil
from ledger.client import LedgerPending
from ledger.nonces import NonceJournal
from ledger.rpc import FailoverProvider, RpcUnavailable
from node.cli.devnet import free_port
from node.roles.io.chain import SubmissionWatcher
from tests.helpers.ledger import ETH, Ledger, key

ROOT = Path(__file__).resolve().parent.parent


# ---- providers ---------------------------------------------------------------------------


class ScriptedRpc:
    """A JSON-RPC endpoint whose next answers the test scripts: ``"429"``, ``"500"``,
    ``"reset"`` (closes without an answer), ``"garbage"`` (not JSON), or a dict (the
    answer's ``result``); once the script is used up, ``default``."""

    def __init__(self, script: list, default) -> None:
        self.script, self.default, self.seen = list(script), default, []
        rpc = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                rpc.seen.append(body["method"])
                step = rpc.script.pop(0) if rpc.script else rpc.default
                if step == "reset":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                if step in ("429", "500"):
                    self.send_response(int(step))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if step == "garbage":
                    data = b"<html>bad gateway</html>"
                else:
                    data = json.dumps({"jsonrpc": "2.0", "id": body["id"], **step}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted():
    made = []

    def make(script, default=None):
        made.append(ScriptedRpc(script, default or {"result": hex(100)}))
        return made[-1]

    yield make
    for s in made:
        s.close()


def provider(*urls: str, **kw) -> FailoverProvider:
    return FailoverProvider(list(urls), timeout=5, seed=1, sleep=lambda s: None, **kw)


def test_each_provider_fault_is_classified_counted_and_tried_again(scripted):
    rpc = scripted(["429", "500", "reset", "garbage", {"error": {"code": -32000, "message": "x"}}])
    p = provider(rpc.url)
    refused = p.make_request("eth_blockNumber", [])  # a JSON-RPC error is the chain's answer
    assert refused["error"]["message"] == "x"
    (health,) = p.health()
    assert {k: health[k] for k in ("rate_limit", "server", "unreachable", "bad_answer")} == {
        "rate_limit": 1,
        "server": 1,
        "unreachable": 1,
        "bad_answer": 1,
    }
    assert health["refusal"] == 1 and health["ok"] == 0
    assert p.make_request("eth_blockNumber", [])["result"] == hex(100)
    assert p.health()[0]["ok"] == 1


def test_a_provider_that_lies_about_the_chain_or_lags_is_not_believed(scripted):
    rpc = scripted(
        [{"result": hex(7)}, {"result": hex(100)}, {"result": hex(100)}, {"result": hex(90)}]
    )
    p = provider(rpc.url, expected_chain_id=100)
    assert p.make_request("eth_chainId", [])["result"] == hex(100)  # the lie was tried again
    assert p.health()[0]["bad_answer"] == 1
    assert p.make_request("eth_blockNumber", [])["result"] == hex(100)
    # a lagging backend: 90 after 100 is not the head; the next answer (100) is
    assert p.make_request("eth_blockNumber", [])["result"] == hex(100)
    assert p.health()[0]["bad_answer"] == 2


def test_a_head_that_stays_behind_on_every_try_is_the_chain_going_back(scripted):
    rpc = scripted([{"result": hex(100)}], default={"result": hex(40)})
    p = provider(rpc.url)
    assert p.make_request("eth_blockNumber", [])["result"] == hex(100)
    # the only URL says so twice: the chain went back
    assert p.make_request("eth_blockNumber", [])["result"] == hex(40)
    assert p.make_request("eth_blockNumber", [])["result"] == hex(40)  # and believed since
    assert p.health()[0]["bad_answer"] == 1


def test_requests_go_to_the_next_url_when_one_fails(scripted):
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens
    good = scripted([])
    p = provider(down, good.url)
    assert p.make_request("eth_blockNumber", [])["result"] == hex(100)
    first, second = p.health()
    assert first["unreachable"] == 1 and not first["current"]
    assert second["ok"] == 1 and second["current"]
    p.make_request("eth_blockNumber", [])  # the working one is asked first from now on
    assert p.health()[0]["unreachable"] == 1 and p.health()[1]["ok"] == 2


def test_every_url_failing_raises_unavailable_naming_the_last_fault(scripted):
    rpc = scripted([], default="500")
    p = provider(rpc.url, attempts=4)
    with pytest.raises(RpcUnavailable, match="server"):
        p.make_request("eth_blockNumber", [])
    assert p.health()[0]["server"] == 4


def test_a_send_is_tried_again_only_after_a_rate_limit(scripted):
    rpc = scripted(["429", "500"])
    p = provider(rpc.url)
    with pytest.raises(RpcUnavailable):
        p.make_request("eth_sendRawTransaction", ["0x00"])
    # sent twice: refused with 429 (not taken), then a 500 (it may have arrived: not again)
    assert rpc.seen == ["eth_sendRawTransaction"] * 2


def test_a_silent_provider_is_not_waited_out_twice_when_it_is_the_only_one():
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts, never answers
    try:
        p = FailoverProvider([f"http://127.0.0.1:{silent.getsockname()[1]}"], timeout=0.5)
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            p.make_request("eth_blockNumber", [])
        assert time.monotonic() - start < 5  # one time-out, not six (generous)
    finally:
        silent.close()


# ---- the nonce journal -------------------------------------------------------------------


def test_the_journal_hands_out_released_nonces_first_and_continues_from_the_chain(tmp_path):
    j = NonceJournal(tmp_path / "n.json")
    assert [j.reserve(lambda: 7) for _ in range(3)] == [7, 8, 9]
    j.release(8)  # refused, not the newest: handed out again first
    j.release(9)  # the newest: the counter steps back
    assert j.reserve(lambda: 0) == 8
    assert j.reserve(lambda: 0) == 9
    again = NonceJournal(tmp_path / "n.json")  # a restart
    assert again.reserve(lambda: 0) == 10
    again.forget_next(20)  # the chain has seen more: never hand out one it has
    assert again.reserve(lambda: 0) == 20


def test_the_journal_is_one_counter_for_several_processes(tmp_path):
    path = tmp_path / "n.json"
    code = (
        "import sys; from pathlib import Path; from ledger.nonces import NonceJournal\n"
        "j = NonceJournal(Path(sys.argv[1]))\n"
        "print(' '.join(str(j.reserve(lambda: 0)) for _ in range(50)))\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True, cwd=ROOT
        )
        for _ in range(3)
    ]
    got = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        got += [int(n) for n in out.split()]
    assert sorted(got) == list(range(150))  # no nonce twice, none skipped


def test_a_damaged_journal_is_refused_not_guessed(tmp_path):
    path = tmp_path / "n.json"
    path.write_text("{not json")
    with pytest.raises(RuntimeError, match="damaged"):
        NonceJournal(path).reserve(lambda: 0)


# ---- transactions on anvil ---------------------------------------------------------------


@pytest.fixture(name="anvil")
def anvil_fixture():
    """anvil with the contract deployed, then automatic mining off: blocks come when the
    test mines them (``mine``)."""
    node = start_anvil(free_port())
    try:
        chain = connect(node.url, dev_keys=node.keys)
        ledger = Ledger(chain)
        chain.w3.provider.make_request("evm_setAutomine", [False])
        yield ledger
    finally:
        node.stop()


def rpc(ledger: Ledger, method: str, *params):
    answer = ledger.chain.w3.provider.make_request(method, list(params))
    assert "error" not in answer, answer
    return answer.get("result")


def mine(ledger: Ledger, blocks: int = 1) -> None:
    for _ in range(blocks):
        rpc(ledger, "evm_mine")


def mining(ledger: Ledger, every: float, stop: threading.Event) -> threading.Thread:
    def run():
        while not stop.wait(every):
            mine(ledger)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_transaction_dropped_from_the_mempool_is_sent_again(anvil):
    c = anvil.client(anvil.stranger, timeout=30)
    p = c.send("add_stake", value=ETH)
    assert rpc(anvil, "anvil_dropTransaction", "0x" + p.hashes[-1].hex())
    stop = threading.Event()
    mining(anvil, 0.5, stop)
    try:
        receipt = c.wait(p)
    finally:
        stop.set()
    assert receipt.status == 1 and c.worker(anvil.stranger.address).stake == ETH
    assert c.tx.counts["resent"] >= 1


def test_a_tenfold_fee_spike_is_met_with_replacements_up_to_the_cap(anvil):
    c = anvil.client(anvil.stranger, timeout=20, replace_after=0.5)
    p = c.send("add_stake", value=ETH)
    base = anvil.chain.w3.eth.get_block("latest")["baseFeePerGas"]
    assert p.tx["maxFeePerGas"] < 10 * base
    rpc(anvil, "anvil_setNextBlockBaseFeePerGas", hex(10 * base))
    mine(anvil)  # an empty block at ten times the base fee: ours did not pay enough
    assert anvil.chain.w3.eth.get_block("latest")["baseFeePerGas"] >= 10 * base
    stop = threading.Event()
    mining(anvil, 0.4, stop)
    try:
        receipt = c.wait(p)
    finally:
        stop.set()
    assert receipt.status == 1 and len(p.hashes) >= 2
    assert bytes(receipt.transactionHash) in p.hashes[1:]  # a replacement was mined
    assert c.tx.counts["replaced"] >= 1
    assert p.tx["maxFeePerGas"] >= receipt.effectiveGasPrice


def test_above_the_fee_cap_a_transaction_waits_and_is_not_counted_done(anvil, tmp_path):
    base = anvil.chain.w3.eth.get_block("latest")["baseFeePerGas"]
    journal = tmp_path / "nonces.json"
    c = anvil.client(
        anvil.stranger, timeout=3, replace_after=0.3, max_fee=3 * base, journal=journal
    )
    p = c.send("add_stake", value=ETH)
    rpc(anvil, "anvil_setNextBlockBaseFeePerGas", hex(10 * base))
    mine(anvil)
    with pytest.raises(LedgerPending):
        c.wait(p)
    assert p.tx["maxFeePerGas"] <= 3 * base  # never above the cap
    assert c.tx.counts["fee_capped"] >= 1 and c.tx.counts["confirmed"] == 0
    assert c.worker(anvil.stranger.address).stake == 0
    # kept in the journal: its nonce is not handed out to another transaction
    assert [n for n, *_ in NonceJournal(journal).unfinished()] == [p.nonce]


def test_a_reorg_that_removes_a_transaction_before_its_confirmations_sends_it_again(anvil):
    c = anvil.client(anvil.stranger, timeout=40, confirmations=3)
    p = c.send("add_stake", value=ETH)
    mine(anvil)
    first = anvil.chain.w3.eth.get_transaction_receipt(p.hashes[-1])
    done = {}
    t = threading.Thread(target=lambda: done.setdefault("receipt", c.wait(p)))
    t.start()
    time.sleep(0.5)
    assert "receipt" not in done  # 0 blocks on top: not confirmed
    rpc(anvil, "anvil_reorg", 1, [])  # the block with it is replaced by one without it
    assert anvil.chain.w3.eth.get_transaction_count(anvil.stranger.address) == p.nonce
    stop = threading.Event()
    mining(anvil, 0.3, stop)
    try:
        t.join(40)
    finally:
        stop.set()
    receipt = done["receipt"]
    assert receipt.status == 1 and bytes(receipt.blockHash) != bytes(first.blockHash)
    assert anvil.chain.w3.eth.block_number - receipt.blockNumber >= 3
    assert c.tx.counts["reorged"] + c.tx.counts["resent"] >= 1
    assert c.worker(anvil.stranger.address).stake == ETH  # staked once


def test_a_restarted_client_sends_what_it_had_sent_before_it_died(anvil, tmp_path):
    journal = tmp_path / "nonces.json"
    dead = anvil.client(anvil.stranger, journal=journal)
    p = dead.send("add_stake", value=ETH)  # then the process dies: nobody waits for it
    rpc(anvil, "anvil_dropTransaction", "0x" + p.hashes[-1].hex())  # and the mempool drops it
    restarted = anvil.client(anvil.stranger, journal=journal, timeout=30)
    q = restarted.send("add_stake", value=2 * ETH)
    assert q.nonce == p.nonce + 1  # its nonce was not taken again
    assert restarted.tx.counts["resent"] == 1
    stop = threading.Event()
    mining(anvil, 0.3, stop)
    try:
        restarted.wait(q)
    finally:
        stop.set()
    assert restarted.worker(anvil.stranger.address).stake == 3 * ETH  # both, once each
    assert NonceJournal(journal).unfinished() == [] or all(
        n < anvil.chain.w3.eth.get_transaction_count(anvil.stranger.address)
        for n, *_ in NonceJournal(journal).unfinished()
    )


def test_a_node_and_the_cli_on_one_account_never_collide(anvil, tmp_path):
    journal = tmp_path / "nonces.json"
    node, cli = (anvil.client(anvil.stranger, journal=journal, timeout=30) for _ in range(2))
    sent = []
    for i in range(6):  # interleaved, as a node and a CLI command would
        sent.append((node if i % 2 else cli).send("add_stake", value=ETH))
    assert sorted(p.nonce for p in sent) == list(range(sent[0].nonce, sent[0].nonce + 6))
    mine(anvil)
    assert all(cli.wait(p).status == 1 for p in sent)
    assert cli.worker(anvil.stranger.address).stake == 6 * ETH
    assert anvil.chain.w3.eth.get_transaction_count(anvil.stranger.address, "pending") == (
        anvil.chain.w3.eth.get_transaction_count(anvil.stranger.address)
    )


def test_a_work_key_is_submitted_once_whatever_was_retried(anvil):
    rpc(anvil, "evm_setAutomine", True)
    w = anvil.register(anvil.worker, 2 * ETH)
    assert w.submit_work(key(1), 5, 0).status == 1
    sent = w.tx.counts["sent"]
    assert w.submit_work(key(1), 5, 0) is None  # already there: done, nothing sent
    assert w.tx.counts["sent"] == sent
    assert w.submission(anvil.worker.address, key(1)).status == "pending"


def test_events_are_acted_on_only_once_confirmed(anvil):
    rpc(anvil, "evm_setAutomine", True)
    w = anvil.register(anvil.worker, 2 * ETH)
    v = anvil.client(anvil.v1, confirmations=2)
    watcher = SubmissionWatcher(v, anvil.block)
    watcher.poll()
    w.submit_work(key(1), 5, 0)
    assert watcher.poll() == []  # in the head block: a reorg could still remove it
    mine(anvil)
    assert watcher.poll() == []
    mine(anvil)
    (sub,) = watcher.poll()
    assert sub.key == key(1)
    mine(anvil, 3)
    assert watcher.poll() == []  # read once


def test_a_chain_behind_several_urls_keeps_working_when_one_dies(anvil):
    url = anvil.chain.url
    dead = f"http://127.0.0.1:{free_port()}"
    chain = connect(f"{dead},{url}", expected_chain_id=31337)
    assert chain.chain_id == 31337
    assert chain.health()[0]["unreachable"] >= 1 and chain.health()[1]["current"]


def test_connect_refuses_what_is_not_a_json_rpc_url():
    with pytest.raises(ValueError, match="ftp://x"):
        connect("http://127.0.0.1:1,ftp://x")


def test_a_send_refused_for_fees_read_before_a_spike_is_priced_again(anvil):
    """A base fee that jumps tenfold inside the fees' cache time (``FEES_TTL_S``): the node
    refuses the transaction built with the fees read before ("max fee per gas less than
    block base fee"; the trainer of a chaos run died of it), and the client signs it again
    once with the fees read at once."""
    c = anvil.client(anvil.stranger, timeout=20)
    first = c.send("add_stake", value=ETH)  # reads the fees: cached for FEES_TTL_S
    mine(anvil)
    assert c.wait(first).status == 1
    base = anvil.chain.w3.eth.get_block("latest")["baseFeePerGas"]
    rpc(anvil, "anvil_setNextBlockBaseFeePerGas", hex(10 * base))
    mine(anvil)
    assert anvil.chain.w3.eth.get_block("latest")["baseFeePerGas"] >= 10 * base
    p = c.send("add_stake", value=ETH)  # within FEES_TTL_S of the first read
    assert p.tx["maxFeePerGas"] >= 10 * base
    mine(anvil)
    assert c.wait(p).status == 1 and c.worker(anvil.stranger.address).stake == 2 * ETH
