"""The local admin endpoint: a starlette (ASGI) app served by hypercorn on trio, on
127.0.0.1 only.

GET  /status       the node's status as JSON (what ``intellect-node status`` shows)
GET  /metrics      every metric in the Prometheus text format (``prometheus_client``)
GET  /events       server-sent events: the status, pushed live (below)
POST /announce     {"topic", "count", "body"}: queue announcements (needs the token; count a
                   whole number from 0 to ``MAX_ANNOUNCE``, default 1)
POST /ping         {"peer_id"}: presence round trip to a peer (needs the token)
plus the routes services add (``routes``: GET ones open, POST ones need the token), e.g.
GET /weights, POST /weights/publish and /weights/pull (node/shardcast/service.py), and
the pages another module mounts (``pages``: starlette routes, e.g. the dashboard at
``/`` and ``/dashboard/...``), after ours, so a page never shadows an API route.

On start it writes ``<data_dir>/admin.json`` (mode 0600) with its port and a random
bearer token; the file is removed on exit.

Limits, enforced before any route runs (``AdminGuard``, an ASGI middleware, and the
hypercorn config): a request whose ``Host`` header names anything but 127.0.0.1 or
localhost gets 400 (a page elsewhere cannot read the node through DNS rebinding); every request other than GET/HEAD must carry ``Authorization: Bearer
<token>`` (else 401); a request body over ``MAX_REQUEST`` (64 KiB) is refused with 413
(from ``Content-Length`` before reading, or once that much arrived), as is a request head
(its path with the query string, and its headers) over the same size (a head that is still
incomplete at that size is cut off by hypercorn's ``h11_max_incomplete_size`` with 400 or
431); a client whose
request head has not arrived whole within ``READ_TIMEOUT`` (hypercorn's
``keep_alive_timeout``, which runs until a request's head is complete) is disconnected,
and one whose body has not arrived whole within ``READ_TIMEOUT`` of its head gets 408.
Errors are JSON ``{"error": "..."}``. WebSocket upgrades are refused. No read timeout applies once a request is whole:
an event stream and a long ``/weights/publish`` wait on the server, not on the client.

The event stream: ``GET /events[?interval=S]`` (open, no token; S in seconds, 0.1 to 60,
default 1) answers ``text/event-stream`` and sends, at once and then every S seconds,

    event: status
    data: <the /status JSON, on one line>

(each event ends with a blank line) until the client leaves. A browser's ``EventSource``
reconnects by itself if the node restarts. At most ``MAX_EVENT_STREAMS`` streams at once
(503 beyond), so a page left open in many tabs cannot pile up work on the node. A stream
counts from the moment it is granted until it ends, however it ends, so a burst of requests
cannot pass the cap. A browser's ``EventSource`` does not retry after a 503: the page opens
its stream again itself (``static/app.js``).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from crypto.identity import public_key_of_peer_id
from node.net.adminfile import ADMIN_FILE, local_host

if TYPE_CHECKING:
    from node.net.runtime import Node

log = logging.getLogger("intellect.admin")
SERVER_LOG = logging.getLogger("intellect.admin.server")
SERVER_LOG.setLevel(logging.WARNING)
MAX_REQUEST = 64 * 1024
READ_TIMEOUT = 5.0
MAX_EVENT_STREAMS = 64
MAX_ANNOUNCE = 1_000_000  # ``count`` of one POST /announce (the largest gossip_queue)
EVENT_INTERVAL = (0.1, 60.0)  # bounds of ``?interval=``, seconds
SAFE_METHODS = ("GET", "HEAD")
RouteHandler = Callable[[dict[str, Any]], Awaitable[Any]]  # a service's route
Endpoint = Callable[[Request], Awaitable[Response]]


def _json(payload: Any, status: int = 200) -> Response:
    return Response(json.dumps(payload).encode(), status, media_type="application/json")


def _error(status: int, message: str, **headers: str) -> Response:
    return Response(
        json.dumps({"error": message}).encode(),
        status,
        headers=headers or None,
        media_type="application/json",
    )


class AdminGuard:
    """The endpoint's limits as an ASGI middleware: the token for any request that is not
    GET/HEAD, the body's size and its deadline. The body is read whole here, before the
    app, and replayed to it."""

    def __init__(
        self,
        app: ASGIApp,
        token: str,
        *,
        max_body: int = MAX_REQUEST,
        read_timeout: float = READ_TIMEOUT,
    ) -> None:
        self.app, self.token = app, token
        self.max_body, self.read_timeout = max_body, read_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # none served: nothing may bypass the checks below
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":  # lifespan
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is None:
            body = await self._read_body(receive)
            if isinstance(body, Response):
                refusal = body
            else:
                receive = _replay(body, receive)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> Response | None:
        raw: list[tuple[bytes, bytes]] = scope["headers"]
        query = scope.get("query_string", b"")
        target = len(scope["raw_path"]) + (len(query) + 1 if query else 0)  # path?query
        if sum(len(k) + len(v) + 4 for k, v in raw) + target > self.max_body:
            return _error(413, f"request head over {self.max_body} bytes", connection="close")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw}
        if not local_host(headers.get("host", "")):
            return _error(400, "the Host header must name 127.0.0.1 or localhost")
        if scope["method"] not in SAFE_METHODS and not secrets.compare_digest(
            headers.get("authorization", "").encode(), f"Bearer {self.token}".encode()
        ):
            return _error(401, "missing or wrong bearer token (see admin.json)")
        try:
            length = int(headers.get("content-length", "0") or 0)
        except ValueError:
            return _error(400, "bad Content-Length")
        if length > self.max_body:
            return _error(413, f"body over {self.max_body} bytes", connection="close")
        return None

    async def _read_body(self, receive: Receive) -> bytes | Response:
        body = bytearray()
        try:
            with trio.fail_after(self.read_timeout):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":  # the client left
                        return _error(400, "incomplete request", connection="close")
                    body += message.get("body", b"")
                    if len(body) > self.max_body:
                        return _error(413, f"body over {self.max_body} bytes", connection="close")
                    if not message.get("more_body", False):
                        return bytes(body)
        except trio.TooSlowError:
            return _error(
                408, f"body not received within {self.read_timeout} s", connection="close"
            )


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` for the app: the body already read, then the client's own messages
    (``http.disconnect`` when it leaves)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class AdminApp:
    """The endpoint's routes over one node; ``app()`` builds the starlette app."""

    def __init__(
        self,
        node: Node,
        token: str,
        routes: dict[tuple[str, str], RouteHandler] | None = None,
        pages: Sequence[BaseRoute] = (),
    ) -> None:
        self.node, self.token = node, token
        self.routes = dict(routes or {})
        self.pages = list(pages)
        self.event_streams = 0

    def app(self) -> ASGIApp:
        api: dict[tuple[str, str], RouteHandler] = {
            ("POST", "/announce"): self.announce,
            ("POST", "/ping"): self.ping,
            **self.routes,
        }
        table: list[BaseRoute] = [
            Route("/status", _guarded(self.status), methods=["GET"]),
            Route("/metrics", _guarded(self.metrics), methods=["GET"]),
            Route("/events", _guarded(self.events), methods=["GET"]),
        ]
        by_path: dict[str, dict[str, RouteHandler]] = {}
        for (method, path), handler in api.items():
            by_path.setdefault(path, {})[method] = handler
        for path, handlers in by_path.items():
            table.append(Route(path, _guarded(_endpoint(handlers)), methods=list(handlers)))
        app = Starlette(routes=table + self.pages, exception_handlers={HTTPException: _http_error})
        return AdminGuard(app, self.token)

    async def status(self, _request: Request) -> Response:
        return _json(self.node.status())

    async def metrics(self, _request: Request) -> Response:
        return Response(self.node.prometheus(), media_type="text/plain; version=0.0.4")

    async def events(self, request: Request) -> Response:
        try:
            interval = float(request.query_params.get("interval", "1"))
        except ValueError:
            return _error(400, "interval must be a number of seconds")
        low, high = EVENT_INTERVAL
        if not low <= interval <= high:  # also refuses nan
            return _error(400, f"interval must be between {low} and {high} seconds")
        if self.event_streams >= MAX_EVENT_STREAMS:
            return _error(503, f"{MAX_EVENT_STREAMS} event streams open already")
        self.event_streams += 1  # counted now, not at its first event; _EventStream releases it
        return _EventStream(self._status_events(interval), self._stream_ended)

    def _stream_ended(self) -> None:
        self.event_streams -= 1

    async def _status_events(self, interval: float) -> AsyncIterator[bytes]:
        while True:
            yield b"event: status\ndata: " + json.dumps(self.node.status()).encode() + b"\n\n"
            await trio.sleep(interval)

    async def ping(self, args: dict[str, Any]) -> Any:
        peer = str(args.get("peer_id", ""))
        public_key_of_peer_id(peer)  # an IdentityError (a ValueError) is the caller's: 400
        return await self.node.ping(peer)

    async def announce(self, args: dict[str, Any]) -> Any:
        wrong = f"count must be a whole number from 0 to {MAX_ANNOUNCE}"
        try:
            count = int(args.get("count", 1))  # null, [1], Infinity, NaN, "x": refused
        except (TypeError, ValueError, OverflowError):
            raise ValueError(wrong) from None
        if not 0 <= count <= MAX_ANNOUNCE:
            raise ValueError(wrong)
        text = str(args.get("body", ""))
        topic = str(args.get("topic", "test"))
        queued = 0
        try:
            for i in range(count):
                self.node.announce(topic, f"{text}{i}".encode())
                queued += 1
        except trio.WouldBlock:
            pass
        return {"queued": queued}


class _EventStream(StreamingResponse):
    """``/events``' answer; ``ended`` is called once when it ends, however it ends: the
    client left, the node stopped, or sending failed before the first event."""

    def __init__(self, events: AsyncIterator[bytes], ended: Callable[[], None]) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self.ended = ended

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.ended()


def _endpoint(handlers: dict[str, RouteHandler]) -> Endpoint:
    """One path's handlers as a starlette endpoint: a POST's JSON object body is the
    handler's arguments; a ``ValueError`` is the caller's mistake (400)."""

    async def endpoint(request: Request) -> Response:
        args: Any = {}
        if request.method not in SAFE_METHODS:
            try:
                args = json.loads(await request.body() or b"{}")
            except ValueError:
                return _error(400, "body is not JSON")
            if not isinstance(args, dict):
                return _error(400, "body is not a JSON object")
        try:
            return _json(await handlers[request.method](args))
        except ValueError as exc:
            return _error(400, str(exc))

    return endpoint


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return _error(404, f"no such endpoint: {request.method} {request.url.path}")
    return _error(exc.status_code, str(exc.detail), **(exc.headers or {}))


def _guarded(endpoint: Endpoint) -> Endpoint:
    """``endpoint``, with any error it raises answered as a 500 and logged: one request
    never takes the endpoint down."""

    async def guarded(request: Request) -> Response:
        try:
            return await endpoint(request)
        except Exception as exc:
            log.exception("admin request %s %s failed", request.method, request.url.path)
            return _error(500, str(exc))

    return guarded


class AdminServer:
    """The endpoint as a trio service: ``serve`` listens, writes ``admin.json``, reports
    the port, and removes the file when it stops."""

    def __init__(
        self,
        node: Node,
        data_dir: Path,
        port: int = 0,
        routes: dict[tuple[str, str], RouteHandler] | None = None,
        pages: Sequence[BaseRoute] = (),
    ) -> None:
        self.node = node
        self.data_dir = data_dir
        self.port = port
        self.token = secrets.token_hex(16)
        self.app = AdminApp(node, self.token, routes, pages)

    def config(self) -> HypercornConfig:
        config = HypercornConfig()
        config.bind = [f"127.0.0.1:{self.port}"]
        config.keep_alive_timeout = READ_TIMEOUT  # also: a request head must arrive by then
        config.h11_max_incomplete_size = MAX_REQUEST
        config.include_server_header = False
        config.graceful_timeout = 1.0
        config.accesslog = None
        config.errorlog = SERVER_LOG  # hypercorn's own lines: its errors, not its banner
        return config

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        app = self.app.app()
        async with trio.open_nursery() as nursery:
            try:
                binds: list[str] = await nursery.start(_serve, app, self.config())
            except* OSError as group:  # the port taken: say which port
                first: BaseException = group
                while isinstance(first, BaseExceptionGroup):
                    first = first.exceptions[0]
                text = first.strerror if isinstance(first, OSError) and first.strerror else first
                raise OSError(f"admin port {self.port}: {text}") from group
            self.port = int(binds[0].rsplit(":", 1)[1])
            path = self.data_dir / ADMIN_FILE
            try:
                self._write(path)
                task_status.started(self.port)
                await trio.sleep_forever()
            finally:
                path.unlink(missing_ok=True)
                nursery.cancel_scope.cancel()

    def _write(self, path: Path) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            info = {
                "port": self.port,
                "token": self.token,
                "pid": os.getpid(),
                "peer_id": self.node.peer_id,
            }
            json.dump(info, f)


async def _serve(
    app: ASGIApp, config: HypercornConfig, *, task_status: trio.TaskStatus[list[str]]
) -> None:
    await hypercorn_serve(app, config, task_status=task_status)  # type: ignore[arg-type]
