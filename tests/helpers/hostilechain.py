"""A chain that behaves like a real one, for tests and benches (issue #55): blocks every few
seconds, shallow reorgs, transactions that vanish from the mempool, base fees that jump
tenfold, and RPC providers that answer 429, fail, time out, reset the connection, answer
from a lagging backend or for another chain.

``HostileAnvil`` is a real anvil process (1.7.1) with interval mining (``block_time``
seconds; ``None``: no mining at all until ``mine``), and the faults it can inject through
anvil's own RPC. ``FaultProxy`` is a JSON-RPC HTTP proxy in a thread, in front of one
upstream URL, that injects the provider's faults at seeded rates.

What anvil 1.7.1 does, found by experiment (``tests/test_hostile_chain.py`` holds each):

- ``anvil_reorg(depth, [])`` replaces the last ``depth`` blocks by as many new, empty
  blocks: the head's number stays, the hashes change. The removed blocks' transactions are
  *gone*: no receipt, ``eth_getTransactionByHash`` null, not in ``txpool_content``, and each
  sender's nonce (``latest`` and ``pending``) goes back to what it was before them. A real
  chain puts them back into the mempool, so ``reorg(replay=True)`` sends their raw bytes
  again (same hashes), oldest first; they are mined in a later block. ``replay=False``
  loses them, as a node whose mempool forgot them would.
- Interval mining goes on after a reorg, from the new head, at the same pace. A depth above
  the head's number is refused (-32602 "Reorg depth must not exceed current chain height").
- ``anvil_setNextBlockBaseFeePerGas`` sets the base fee of the next block mined, interval
  mined or not (``eth_getBlockByNumber pending`` shows it at once); the blocks after it
  fall back by 12.5 % each (EIP-1559, empty blocks). A transaction sent afterwards whose max
  fee is below it is refused at once (-32003 "max fee per gas less than block base fee").
  One already in the mempool whose max fee no longer pays it is not mined, and anvil
  *evicts* it at that block (unlike geth, which keeps it until the fee falls): a spike
  drops underpriced transactions too.
- ``anvil_dropTransaction`` answers the hash when it removed the transaction and null
  otherwise; it removes the sender's later nonces from the mempool too (they can no longer
  be mined). It finds only ready transactions: one queued behind a nonce gap stays (null);
  ``anvil_removePoolTransactions(address)`` removes those.
- ``txpool_content`` answers ``{"pending": {sender (lower case): {nonce (decimal text):
  transaction}}, "queued": {...}}``; ``eth_getRawTransactionByHash`` answers a pending or
  mined transaction's raw bytes.
"""

from __future__ import annotations

import http.server
import json
import random
import socket
import struct
import threading
import time
from collections import deque
from typing import Any

import requests

from ledger.chain import Chain, connect, start_anvil

FAULTS = ("429", "500", "timeout", "reset", "stale", "wrong_chain")
# answers a lagging backend gives older versions of (receipts: only "not mined yet")
STALE_METHODS = frozenset(
    {
        "eth_blockNumber",
        "eth_getBlockByNumber",
        "eth_getTransactionCount",
        "eth_getTransactionReceipt",
        "eth_getBalance",
        "eth_call",
        "eth_getLogs",
        "eth_gasPrice",
        "eth_maxPriorityFeePerGas",
        "eth_feeHistory",
    }
)
WRONG_CHAIN_ID = 8453  # Base's, answered for any other chain (1 when the chain is Base)


class HostileChainError(RuntimeError):
    """The chain refused one of our own calls (an injection, not a fault we inject)."""


def rpc(url: str, method: str, params: list[Any] | None = None, *, timeout: float = 10) -> Any:
    """One JSON-RPC call to ``url``; its result (an error answer raises)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []}
    answer = requests.post(url, json=body, timeout=timeout).json()
    if "error" in answer:
        raise HostileChainError(f"{method}: {answer['error']}")
    return answer.get("result")


class HostileAnvil:
    """An anvil process on 127.0.0.1 with interval mining, and the chain faults it can
    inject: reorgs, dropped transactions, base fee spikes (see the module docstring)."""

    def __init__(self, port: int, *, block_time: float | None = 2.0, accounts: int = 10) -> None:
        """``block_time`` None: no block until ``mine`` is called."""
        self.block_time = block_time
        self.counts: dict[str, int] = {
            "reorgs": 0,
            "reorged_txs": 0,
            "replayed": 0,
            "dropped": 0,
            "fee_spikes": 0,
        }
        self._lock = threading.Lock()  # one injection at a time (the chaos thread, a test)
        self.node = start_anvil(
            port, accounts=accounts, block_time=block_time, mining=block_time is not None
        )
        self.url, self.keys, self.proc = self.node.url, self.node.keys, self.node.proc

    def __enter__(self) -> HostileAnvil:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.node.stop()

    def rpc(self, method: str, params: list[Any] | None = None) -> Any:
        return rpc(self.url, method, params)

    def chain(self, *, timeout: float = 30) -> Chain:
        """A ``ledger.chain.Chain`` on this node, its prefunded keys as the dev keys."""
        return connect(self.url, timeout=timeout, dev_keys=self.keys)

    def head(self) -> int:
        return int(self.rpc("eth_blockNumber"), 16)

    def base_fee(self, block: str = "latest") -> int:
        return int(self.rpc("eth_getBlockByNumber", [block, False])["baseFeePerGas"], 16)

    def pending(self) -> list[tuple[str, int, str]]:
        """The mempool's pending transactions as (sender, nonce, hash), sorted."""
        pool = self.rpc("txpool_content")["pending"]
        return sorted(
            (sender, int(nonce), str(tx["hash"]))
            for sender, by_nonce in pool.items()
            for nonce, tx in by_nonce.items()
        )

    def mine(self, blocks: int = 1) -> None:
        self.rpc("anvil_mine", [hex(blocks)])

    # ---- chain faults --------------------------------------------------------------------

    def reorg(self, depth: int, *, replay: bool = True) -> list[str]:
        """Replace the last ``depth`` blocks by empty ones (``anvil_reorg``); the hashes of
        the transactions that were in them. ``replay``: send them again, oldest first, as a
        real chain's mempool would take them back (one refused now, e.g. below a spiked base
        fee, is lost, as it would be there). A reorg deeper than the chain is made as deep
        as it (none on a chain at genesis)."""
        if depth < 1:
            raise ValueError("a reorg is at least one block deep")
        with self._lock:
            head = self.head()
            depth = min(depth, head)  # anvil refuses to reorg the genesis block
            if depth == 0:
                return []
            raws: list[tuple[str, str]] = []  # (hash, raw), oldest first
            for n in range(head - depth + 1, head + 1):
                block = self.rpc("eth_getBlockByNumber", [hex(n), False])
                for h in block["transactions"]:
                    raws.append((h, self.rpc("eth_getRawTransactionByHash", [h])))
            # a block mined between these reads and the reorg holds what the mempool had
            raws += [
                (h, self.rpc("eth_getRawTransactionByHash", [h])) for _, _, h in self.pending()
            ]
            self.rpc("anvil_reorg", [depth, []])
            self.counts["reorgs"] += 1
            removed = [h for h, _ in raws if self.rpc("eth_getTransactionByHash", [h]) is None]
            self.counts["reorged_txs"] += len(removed)
            if replay:
                for h, raw in raws:
                    if h in removed and raw is not None:
                        try:
                            self.rpc("eth_sendRawTransaction", [raw])
                            self.counts["replayed"] += 1
                        except HostileChainError:
                            continue  # refused now (fees, a nonce taken meanwhile): lost
            return removed

    def drop(self, tx_hash: str) -> bool:
        """Remove one pending transaction from the mempool (and its sender's later ones)."""
        with self._lock:
            gone = self.rpc("anvil_dropTransaction", [tx_hash]) is not None
            self.counts["dropped"] += int(gone)
            return gone

    def drop_pending(
        self, count: int = 1, rng: random.Random | None = None, *, wait_s: float = 0.0
    ) -> list[str]:
        """Drop ``count`` of the transactions now in the mempool, picked by ``rng`` (seeded:
        the same pool gives the same picks); the hashes dropped. ``wait_s``: wait up to that
        long for a transaction to come when the pool is empty (on interval mining one sits
        there for less than a block)."""
        rng = rng or random.Random(0)
        deadline = time.monotonic() + wait_s
        while not (pool := self.pending()) and time.monotonic() < deadline:
            time.sleep(0.02)
        picked = rng.sample(pool, min(count, len(pool)))
        return [h for _, _, h in picked if self.drop(h)]

    def spike_fees(self, factor: float = 10.0, *, at_least: int = 1) -> int:
        """The next block's base fee set to ``factor`` times the latest one's, and to at
        least ``at_least`` wei (anvil's base fee falls towards zero on empty blocks, where a
        tenfold spike is still below what any transaction offers); returns it."""
        with self._lock:
            fee = max(int(self.base_fee() * factor), at_least)
            self.rpc("anvil_setNextBlockBaseFeePerGas", [hex(fee)])
            self.counts["fee_spikes"] += 1
            return fee


# ---- the RPC provider's faults ---------------------------------------------------------------


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    proxy: FaultProxy


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as providers and web3's session use
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.proxy.handle(self, body)

    def answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def reset(self) -> None:
        """Close the connection with a TCP RST and no answer."""
        self.close_connection = True
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()


class FaultProxy:
    """A JSON-RPC proxy in front of ``upstream`` that, per request and with its own rate each
    (a probability; they add up to at most 1), answers:

    - ``429``: HTTP 429 with a JSON-RPC error and ``Retry-After: 1`` (rate limited);
    - ``500``: HTTP 500 with a text body (the provider's backend failed);
    - ``timeout``: nothing for ``hold_s`` seconds (past the client's timeout), then closes;
    - ``reset``: closes the connection at once with a TCP RST, no answer;
    - ``stale``: an answer a lagging backend gives: for a method of ``STALE_METHODS``, the
      newest earlier answer to the same method and parameters that was given at least one
      block before the head (a request with none cached is forwarded);
    - ``wrong_chain``: ``eth_chainId`` answered with another chain's id (other methods are
      forwarded).

    Everything else is forwarded (``counts["forwarded"]``); a JSON-RPC batch always is. The
    faults drawn are seeded (``seed``): one draw per request, in the order requests arrive."""

    def __init__(
        self,
        upstream: str,
        *,
        rates: dict[str, float],
        seed: int = 0,
        port: int = 0,
        hold_s: float = 35.0,
    ) -> None:
        self.upstream = upstream
        self.hold_s = hold_s
        self.rates: dict[str, float] = dict.fromkeys(FAULTS, 0.0)
        self.set_rates(**rates)
        self.counts: dict[str, int] = {**dict.fromkeys(FAULTS, 0), "forwarded": 0}
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._released = threading.Event()  # stop(): held requests end at once
        self._cache: dict[str, deque[tuple[int, Any]]] = {}  # method+params -> (head, result)
        self._head: tuple[float, int] = (0.0, -1)  # (when read, the upstream's head)
        self._local = threading.local()  # one requests session per handler thread
        self._server = _Server(("127.0.0.1", port), _Handler)
        self._server.proxy = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread: threading.Thread | None = None

    def set_rates(self, **rates: float) -> None:
        """Change some rates (``set_rates(**{"429": 0.05, "reset": 0.01})``), at any time."""
        unknown = set(rates) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}: use {', '.join(FAULTS)}")
        new = {**self.rates, **{k: float(v) for k, v in rates.items()}}
        if any(v < 0 for v in new.values()) or sum(new.values()) > 1:
            raise ValueError(f"rates must be >= 0 and add up to at most 1: {new}")
        self.rates = new

    def start(self) -> FaultProxy:
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._released.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(10)
        self._server.server_close()

    # ---- one request ---------------------------------------------------------------------

    def _draw(self, method: str | None) -> str | None:
        """The fault for this request (None: forward it)."""
        with self._lock:
            u = self._rng.random()
        if method is None:
            return None  # a batch, or not JSON-RPC: forwarded
        edge = 0.0
        for kind in FAULTS:
            edge += self.rates[kind]
            if u < edge:
                return kind
        return None

    def _session(self) -> requests.Session:
        s: requests.Session | None = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = requests.Session()
        return s

    def _forward(self, body: bytes) -> tuple[int, bytes]:
        try:
            r = self._session().post(
                self.upstream, data=body, headers={"Content-Type": "application/json"}, timeout=30
            )
        except requests.RequestException as exc:
            return 502, json.dumps({"error": f"upstream unreachable: {exc}"}).encode()
        return r.status_code, r.content

    def _upstream_head(self) -> int:
        """The upstream's head, read at most every 0.2 s (so at most the current one)."""
        at, head = self._head
        if time.monotonic() - at > 0.2:
            try:
                head = int(rpc(self.upstream, "eth_blockNumber", timeout=5), 16)
                self._head = (time.monotonic(), head)
            except (requests.RequestException, HostileChainError, ValueError):
                pass
        return head

    def _stale(self, key: str) -> tuple[bool, Any]:
        head = self._upstream_head()
        with self._lock:
            older = [r for h, r in self._cache.get(key, ()) if h < head]
        return (True, older[-1]) if older else (False, None)

    def _remember(self, key: str, method: str, answer: bytes) -> None:
        """Keep an answer, labelled with a head read after it came (so at least the block it
        was read at: a stale answer served later is never the current one)."""
        try:
            result = json.loads(answer)["result"]
            if method == "eth_getTransactionReceipt" and result is not None:
                return  # a lagging backend's receipt is one not yet mined: keep only those
            if method == "eth_blockNumber":
                head = int(result, 16)
            else:
                head = int(rpc(self.upstream, "eth_blockNumber", timeout=5), 16)
        except (ValueError, KeyError, TypeError, requests.RequestException, HostileChainError):
            return
        with self._lock:
            entries = self._cache.setdefault(key, deque(maxlen=8))
            if not entries or entries[-1][0] != head:
                entries.append((head, result))
            else:
                entries[-1] = (head, result)

    def handle(self, h: _Handler, body: bytes) -> None:
        try:
            req = json.loads(body)
        except ValueError:
            req = None
        single = isinstance(req, dict)
        method = str(req.get("method")) if single and isinstance(req, dict) else None
        rid = req.get("id") if isinstance(req, dict) else None
        kind = self._draw(method)
        key = json.dumps([method, req.get("params", [])]) if isinstance(req, dict) else ""
        if kind == "stale":
            found, result = self._stale(key) if method in STALE_METHODS else (False, None)
            if not found:
                kind = None
            else:
                self._count("stale")
                h.answer(200, json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}).encode())
                return
        if kind == "wrong_chain" and method != "eth_chainId":
            kind = None
        if kind is None:
            status, answer = self._forward(body)
            self._count("forwarded")
            if method in STALE_METHODS and status == 200:
                self._remember(key, method, answer)
            h.answer(status, answer)
            return
        self._count(kind)
        if kind == "429":
            error = {"code": -32005, "message": "rate limit exceeded"}
            text = json.dumps({"jsonrpc": "2.0", "id": rid, "error": error}).encode()
            h.answer(429, text, {"Retry-After": "1"})
        elif kind == "500":
            h.answer(500, b"internal server error", {"Content-Type": "text/plain"})
        elif kind == "timeout":
            self._released.wait(self.hold_s)
            h.close_connection = True
        elif kind == "reset":
            h.reset()
        elif kind == "wrong_chain":
            status, answer = self._forward(body)
            real = int(json.loads(answer)["result"], 16) if status == 200 else 0
            wrong = 1 if real == WRONG_CHAIN_ID else WRONG_CHAIN_ID
            h.answer(200, json.dumps({"jsonrpc": "2.0", "id": rid, "result": hex(wrong)}).encode())

    def _count(self, kind: str) -> None:
        with self._lock:
            self.counts[kind] += 1
