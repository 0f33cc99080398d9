"""The embedded development chain (py-evm via eth-tester) served over JSON-RPC.

One process owns the chain; nodes and the CLI reach it at ``http://127.0.0.1:<port>`` like
any Ethereum node, so a new user needs nothing but pip. Requests go through web3's own
eth-tester formatters, results are turned into JSON-RPC wire form (integers as hex
quantities, bytes as hex), and a revert becomes the standard error (code 3) carrying the
ABI-encoded ``Error(string)`` data, as geth and anvil report it. Besides the ``eth_``
methods it serves ``evm_increaseTime`` and ``evm_mine`` for tests. It holds unlocked
development keys, so it listens on 127.0.0.1 unless told otherwise (a test lab's private
address, ``intellect-node chain --host``) and refuses any request that is not
``application/json`` (a browser page could otherwise drive it with a simple POST).

Its state can outlive the process (``save`` / ``load``, ``intellect-node chain --state``):
py-evm keeps every block, receipt and state trie node in one key-value store, so the store
(as hex JSON: nothing in the file is executed when it is read) plus the clock's offset is
the whole chain. A restarted chain answers with the same blocks, logs, balances and nonces,
and mines on from the last block.

Its clock is the wall clock (plus any ``evm_increaseTime``), also under load. It mines a
block per transaction, and py-evm wants each block strictly later than its parent, so a
chain taking 40 transactions a second ran 39 s ahead of the wall clock every second: a long
devnet's chain was minutes ahead, and a deadline on it (the fetch deadline of a withheld
batch) came minutes late while the chain stood idle. Blocks here may share a second, as the
transactions of one block on a real chain share its timestamp.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from eth_abi.abi import encode as abi_encode
from web3 import EthereumTesterProvider
from web3.providers.eth_tester.middleware import request_formatters, result_formatters

from ledger.chain import ERROR_SELECTOR

MAX_BODY = 4 * 1024 * 1024
IDLE_CONNECTION_S = 60.0  # a kept-alive RPC connection idle this long is closed
STATE_FORMAT = "intellect-devchain/1"


class StateError(ValueError):
    """A chain state file that cannot be loaded (one line for the user)."""


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


def to_wire(value: Any) -> Any:
    """Python-level results to JSON-RPC form: ints as hex quantities, bytes as hex."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return hex(value)
    if isinstance(value, bytes | bytearray):
        return "0x" + bytes(value).hex()
    if isinstance(value, dict):
        return {k: to_wire(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_wire(v) for v in value]
    return value


def _sharing_seconds(vm: Any) -> type:
    """``vm``, but a block may have its parent's timestamp (not an earlier one)."""

    class SharingSeconds(vm):  # type: ignore[misc]  # py-evm's VM classes are untyped (Any)
        @classmethod
        def validate_header(cls, header: Any, parent_header: Any) -> None:
            if parent_header is not None and header.timestamp == parent_header.timestamp:
                parent_header = parent_header.copy(timestamp=header.timestamp - 1)
            super().validate_header(header, parent_header)

    SharingSeconds.__name__ = SharingSeconds.__qualname__ = vm.__name__
    return SharingSeconds


def _chain_sharing_seconds(chain_class: Any) -> type:
    """``chain_class`` whose every VM lets a block share its parent's second."""
    config = tuple((n, _sharing_seconds(vm)) for n, vm in chain_class.vm_configuration)
    return type(chain_class.__name__, (chain_class,), {"vm_configuration": config})


class DevChain:
    """The chain and a lock: eth-tester is not thread-safe."""

    def __init__(self) -> None:
        self.provider = EthereumTesterProvider()
        tester = self.provider.ethereum_tester
        if tester is None:  # the provider makes one when given none
            raise RuntimeError("eth-tester is not installed")
        self.tester: Any = tester  # eth-tester is untyped
        backend = self.tester.backend
        # the same chain (genesis, funded keys) over the same store, its VMs sharing seconds
        backend.chain = _chain_sharing_seconds(type(backend.chain))(backend.chain.chaindb.db)
        self.lock = threading.Lock()
        self.offset = 0  # seconds evm_increaseTime moved the clock ahead of the wall clock
        self._logs: list[dict[str, Any]] = []  # every mined block's logs, in order
        self._indexed = 0  # the last block whose logs are in ``_logs`` (0: genesis, none)

    def call(self, method: str, params: list[Any]) -> Any:
        with self.lock:
            return self._call(method, params)

    def _store(self) -> dict[bytes, bytes]:
        """py-evm's key-value store: blocks, receipts, state (an in-memory dict)."""
        db = self.tester.backend.chain.chaindb.db
        return db.wrapped_db.kv_store  # type: ignore[no-any-return]

    def save(self, path: Path, extra: dict[str, Any] | None = None) -> None:
        """Write the whole chain to ``path`` (atomically: a crash mid-write keeps the old
        file); ``extra`` (e.g. the deployment's chain.json) is kept alongside."""
        with self.lock:
            doc = {
                "format": STATE_FORMAT,
                "offset": self.offset,
                "extra": extra or {},
                "db": {k.hex(): v.hex() for k, v in self._store().items()},
            }
        tmp = path.with_name(path.name + ".tmp")
        tmp.unlink(missing_ok=True)
        # ``extra`` may hold the development keys: the file is the owner's only
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(json.dumps(doc))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> tuple[DevChain, dict[str, Any]]:
        """A chain from a file ``save`` wrote, and the ``extra`` saved with it."""
        from eth.db.atomic import AtomicDB
        from eth.db.backends.memory import MemoryDB

        try:
            doc = json.loads(path.read_text())
            if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
                raise StateError(f"{path} is not a development chain state ({STATE_FORMAT})")
            kv = {bytes.fromhex(k): bytes.fromhex(v) for k, v in doc["db"].items()}
            offset, extra = int(doc["offset"]), dict(doc["extra"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            if isinstance(exc, StateError):
                raise
            raise StateError(f"cannot read the chain state {path}: {exc}") from exc
        chain = cls()
        backend = chain.tester.backend
        # the same chain class (its VM schedule and chain id), over the saved store: the
        # canonical head is read from it and the next block is built on that head
        try:
            backend.chain = type(backend.chain)(AtomicDB(MemoryDB(kv)))
        except Exception as exc:  # py-evm's lookups raise their own errors on a bad store
            raise StateError(f"the chain state {path} is damaged: {exc!r}") from exc
        chain.offset = offset
        return chain, extra

    def _follow_wall_clock(self) -> None:
        """The next block's timestamp is now (plus the time travelled), or its parent's if
        that is later: like a real chain, the clock moves while nobody transacts
        (eth-tester stamps a pending block when the previous one is mined, so a chain left
        idle would stay in the past), and it does not run ahead while many do (py-evm
        stamps the pending block a second after its parent)."""
        chain = self.tester.backend.chain
        parent = chain.get_canonical_head().timestamp
        target = max(int(time.time()) + self.offset, parent)
        if chain.header.timestamp != target:
            chain.header = chain.header.copy(timestamp=target)

    def _call(self, method: str, params: list[Any]) -> Any:
        self._follow_wall_clock()
        if method == "evm_increaseTime":
            # the clock moves ``seconds`` ahead of where it was (the wall clock plus the
            # offset), and a block is mined there; travelling from the last block instead
            # was refused as going backwards once the chain had been idle longer than that
            seconds = int(params[0], 16) if isinstance(params[0], str) else int(params[0])
            self.offset += seconds
            self._follow_wall_clock()
            self.tester.mine_blocks(1)
            return hex(seconds)
        if method == "evm_mine":
            self.tester.mine_blocks(1)
            return "0x0"
        if method in ("eth_call", "eth_estimateGas") and params and "from" not in params[0]:
            params = [{**params[0], "from": self.tester.get_accounts()[0]}, *params[1:]]
        fmt = request_formatters.get(method)  # type: ignore[call-overload]
        if fmt is not None:
            params = fmt(params)
        from eth_tester.exceptions import TransactionFailed

        response: Mapping[str, Any]
        try:
            if method == "eth_getLogs" and params and "block_hash" not in params[0]:
                response = {"result": self.logs(params[0])}
            else:
                response = self.provider.make_request(method, params)  # type: ignore[arg-type]
        except TransactionFailed as exc:
            reason = str(exc.args[0]).removeprefix("execution reverted: ") if exc.args else ""
            data = "0x" + (ERROR_SELECTOR + abi_encode(["string"], [reason])).hex()
            raise RpcError(3, f"execution reverted: {reason}", data) from exc
        if "error" in response:
            err = response["error"]
            message = err.get("message", str(err)) if isinstance(err, dict) else str(err)
            raise RpcError(-32000, message)
        result = response.get("result")
        rfmt = result_formatters.get(method) if result_formatters else None  # type: ignore[call-overload]
        if rfmt is not None:
            result = rfmt(result)
        return to_wire(result)

    def logs(self, flt: dict[str, Any]) -> list[dict[str, Any]]:
        """``eth_getLogs`` (``flt`` in eth-tester's form) from an index of every block's
        logs, extended by the blocks mined since the last call. eth-tester reads every
        block of the range on every call (8 s for 200 blocks here), and the chain's lock
        made every node's call wait for it: a test's scan from block 0 timed a run out."""
        head = int(self.tester.get_block_by_number("latest")["number"])
        for n in range(self._indexed + 1, head + 1):
            self._logs.extend(self._block_logs(n))
            self._indexed = n
        first, last = _block(flt.get("from_block"), head), _block(flt.get("to_block"), head)
        wanted = flt.get("address")
        if isinstance(wanted, str):
            wanted = [wanted]
        addresses = None if not wanted else {a.lower() for a in wanted}
        topics = flt.get("topics") or []
        out = []
        for log in self._logs:
            if not first <= log["block_number"] <= last:
                continue
            if addresses is not None and log["address"].lower() not in addresses:
                continue
            if _topics_match(topics, [t.lower() for t in log["topics"]]):
                out.append(log)
        return out

    def _block_logs(self, number: int) -> list[dict[str, Any]]:
        """The logs of block ``number`` in eth-tester's form, read from py-evm directly
        (eth-tester finds a receipt's transaction by scanning every block: 30 ms a receipt
        at 100 blocks, and growing)."""
        from eth_utils.address import to_checksum_address

        chain = self.tester.backend.chain
        block = chain.get_canonical_block_by_number(number)
        out = []
        receipts = block.get_receipts(chain.chaindb)
        for i, (tx, receipt) in enumerate(zip(block.transactions, receipts, strict=True)):
            for j, log in enumerate(receipt.logs):
                out.append(
                    {
                        "type": "mined",
                        "log_index": j,
                        "transaction_index": i,
                        "transaction_hash": "0x" + tx.hash.hex(),
                        "block_hash": "0x" + block.header.hash.hex(),
                        "block_number": number,
                        "address": to_checksum_address(log.address),
                        "data": "0x" + log.data.hex(),
                        "topics": ["0x" + t.to_bytes(32, "big").hex() for t in log.topics],
                    }
                )
        return out


def _block(ident: Any, head: int) -> int:
    """A block parameter of a log filter as a number (absent: the newest block)."""
    if ident is None or ident in ("latest", "pending", "safe", "finalized"):
        return head
    if ident == "earliest":
        return 0
    return int(ident, 16) if isinstance(ident, str) else int(ident)


def _topics_match(wanted: list[Any], topics: list[str]) -> bool:
    """Each position: None matches anything, a topic that topic, a list any of them."""
    if len(wanted) > len(topics) and any(w is not None for w in wanted[len(topics) :]):
        return False
    for want, have in zip(wanted, topics, strict=False):
        if want is None:
            continue
        options = [want] if isinstance(want, str | bytes) else list(want)
        if not options:  # an empty list of alternatives: anything
            continue
        if not any(_hex(o) == have for o in options if o is not None):
            return False
    return True


def _hex(topic: str | bytes) -> str:
    text = topic.hex() if isinstance(topic, bytes) else topic.lower()
    return text if text.startswith("0x") else "0x" + text


def _handler(chain: DevChain) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.1: a client keeps its connection for many calls (HTTP/1.0 closed it after
        # each, so every call of every node paid a TCP connect and a new server thread);
        # a connection idle for ``timeout`` seconds is closed, and an error closes it
        protocol_version = "HTTP/1.1"
        timeout = IDLE_CONNECTION_S
        # the headers and the body go out in two writes: with Nagle's algorithm the body
        # waited for the client's delayed ACK of the headers, 40 ms on every call of a
        # kept connection (44 ms per eth_blockNumber here, against 3.6 ms without)
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _one(self, req: Any) -> dict[str, Any]:
            rid = req.get("id") if isinstance(req, dict) else None
            if not isinstance(req, dict) or not isinstance(req.get("method"), str):
                return {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "error": {"code": -32600, "message": "invalid request"},
                }
            try:
                result = chain.call(req["method"], list(req.get("params") or []))
                return {"jsonrpc": "2.0", "id": rid, "result": result}
            except RpcError as exc:
                err: dict[str, Any] = {"code": exc.code, "message": exc.message}
                if exc.data is not None:
                    err["data"] = exc.data
                return {"jsonrpc": "2.0", "id": rid, "error": err}
            except Exception as exc:  # a bad request must not take the chain down
                return {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "error": {"code": -32603, "message": f"{type(exc).__name__}: {exc}"},
                }

        def do_POST(self) -> None:
            # A web page can POST text/plain to 127.0.0.1 without a CORS preflight; only a
            # JSON request (which needs one, and gets no CORS headers here) is served.
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            if ctype != "application/json":
                self.send_error(415, "Content-Type must be application/json")
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self.send_error(413)
                return
            try:
                req = json.loads(self.rfile.read(length))
            except ValueError:
                body: Any = {
                    "jsonrpc": "2.0",
                    "id": None,
                    "error": {"code": -32700, "message": "parse error"},
                }
            else:
                body = [self._one(r) for r in req] if isinstance(req, list) else self._one(req)
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


class RpcServer(ThreadingHTTPServer):
    """The chain's JSON-RPC server: a thread per connection, connections kept alive.
    ``server_close()`` also ends the kept-alive connections, so that no call reaches the
    chain after it (it is saved next)."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        # before the bind: a bind that fails (the port taken) calls server_close()
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def server_close(self) -> None:
        super().server_close()
        with self._open_lock:
            kept = list(self._open)
        for conn in kept:  # a handler waiting for the next request reads EOF and ends
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return  # a client gone mid-answer (or closed at shutdown): not the chain's error
        super().handle_error(request, client_address)


def serve(chain: DevChain, port: int = 8545, host: str = "127.0.0.1") -> RpcServer:
    """Start serving on ``host`` in a background thread; ``shutdown()`` stops it."""
    try:
        server = RpcServer((host, port), _handler(chain))
    except (OSError, OverflowError) as exc:
        text = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise OSError(f"cannot serve the chain on {host}:{port}: {text}") from exc
    threading.Thread(target=server.serve_forever, name="devchain-rpc", daemon=True).start()
    return server
