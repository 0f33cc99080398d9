"""The admin endpoint as it was before issue #30: a hand-written HTTP/1.1 server on raw
trio sockets. Kept ONLY as the baseline of ``bench/admin.py``; the node serves
``node/net/admin.py`` (starlette on hypercorn). Unchanged but for ``/metrics``, whose text
now comes from ``prometheus_client`` (``Node.prometheus()`` returns bytes).

GET  /status       the node's status as JSON (what ``intellect-node status`` shows)
GET  /metrics      Prometheus text format
POST /announce     {"topic", "count", "body"}: queue announcements (needs the token)
POST /ping         {"peer_id"}: presence round trip to a peer (needs the token)
plus the routes services add (``routes``: GET ones open, POST ones need the token), e.g.
GET /weights, POST /weights/publish and /weights/pull (node/shardcast/service.py).

On start it writes ``<data_dir>/admin.json`` (mode 0600) with its port and a random
bearer token that POST requests must carry; the file is removed on exit.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from node.net.adminfile import ADMIN_FILE

if TYPE_CHECKING:
    from node.net.runtime import Node

log = logging.getLogger("intellect.admin")
MAX_REQUEST = 64 * 1024
READ_TIMEOUT = 5.0
Route = Callable[[dict[str, Any]], Awaitable[Any]]


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def _read_request(stream: trio.SocketStream) -> tuple[str, str, dict[str, str], bytes]:
    buf = b""
    with trio.fail_after(READ_TIMEOUT):
        while b"\r\n\r\n" not in buf:
            chunk = await stream.receive_some(4096)
            if not chunk:
                raise HttpError(400, "incomplete request")
            buf += chunk
            if len(buf) > MAX_REQUEST:
                raise HttpError(413, "request too large")
        head, _, body = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        try:
            method, path, _version = lines[0].split(" ", 2)
        except ValueError as exc:
            raise HttpError(400, "bad request line") from exc
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        length = int(headers.get("content-length", "0") or 0)
        if length > MAX_REQUEST:
            raise HttpError(413, "body too large")
        while len(body) < length:
            chunk = await stream.receive_some(length - len(body))
            if not chunk:
                raise HttpError(400, "incomplete body")
            body += chunk
    return method, path, headers, body


class AdminServer:
    def __init__(
        self,
        node: Node,
        data_dir: Path,
        port: int = 0,
        routes: dict[tuple[str, str], Route] | None = None,
    ) -> None:
        self.node = node
        self.routes = dict(routes or {})
        self.data_dir = data_dir
        self.port = port
        self.token = secrets.token_hex(16)

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        path = self.data_dir / ADMIN_FILE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(
                {
                    "port": self.port,
                    "token": self.token,
                    "pid": os.getpid(),
                    "peer_id": self.node.peer_id,
                },
                f,
            )
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(trio.serve_listeners, self._handle, listeners)
                task_status.started(self.port)
        finally:
            path.unlink(missing_ok=True)

    async def _handle(self, stream: trio.SocketStream) -> None:
        try:
            method, path, headers, body = await _read_request(stream)
            status, ctype, payload = await self._route(method, path, headers, body)
        except HttpError as exc:
            status, ctype, payload = (
                exc.status,
                "application/json",
                json.dumps({"error": str(exc)}).encode(),
            )
        except (trio.TooSlowError, trio.BrokenResourceError, OSError):
            return
        except Exception as exc:  # never let one request take the admin server down
            log.exception("admin request failed: %s", exc)
            status, ctype, payload = (
                500,
                "application/json",
                json.dumps({"error": str(exc)}).encode(),
            )
        reason = {
            200: "OK",
            400: "Bad Request",
            401: "Unauthorized",
            404: "Not Found",
            413: "Too Large",
        }.get(status, "Error")
        head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
        try:
            with trio.fail_after(READ_TIMEOUT):
                await stream.send_all(head.encode() + payload)
                await stream.aclose()
        except (trio.TooSlowError, trio.BrokenResourceError, OSError):
            pass

    async def _route(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, str, bytes]:
        if method == "GET" and path == "/status":
            return 200, "application/json", json.dumps(self.node.status()).encode()
        if method == "GET" and path == "/metrics":
            return 200, "text/plain; version=0.0.4", self.node.prometheus()
        route = self.routes.get((method, path))
        if method == "POST" and (route is not None or path in ("/announce", "/ping")):
            if not secrets.compare_digest(headers.get("authorization", ""), f"Bearer {self.token}"):
                raise HttpError(401, "missing or wrong bearer token (see admin.json)")
            try:
                args: dict[str, Any] = json.loads(body or b"{}")
            except ValueError as exc:
                raise HttpError(400, "body is not JSON") from exc
            if route is not None:
                return 200, "application/json", json.dumps(await _call(route, args)).encode()
            if path == "/ping":
                result = await self.node.ping(str(args.get("peer_id", "")))
                return 200, "application/json", json.dumps(result).encode()
            count = int(args.get("count", 1))
            text = str(args.get("body", ""))
            topic = str(args.get("topic", "test"))
            queued = 0
            try:
                for i in range(count):
                    self.node.announce(topic, f"{text}{i}".encode())
                    queued += 1
            except trio.WouldBlock:
                pass
            return 200, "application/json", json.dumps({"queued": queued}).encode()
        if route is not None:
            return 200, "application/json", json.dumps(await _call(route, {})).encode()
        raise HttpError(404, f"no such endpoint: {method} {path}")


async def _call(route: Route, args: dict[str, Any]) -> Any:
    """Run a service's route; a ValueError is the caller's mistake (HTTP 400)."""
    try:
        return await route(args)
    except ValueError as exc:
        raise HttpError(400, str(exc)) from exc
