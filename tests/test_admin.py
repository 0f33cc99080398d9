"""The local admin endpoint (``node/net/admin.py``): starlette served by hypercorn on trio,
tested over raw HTTP/1.1 on loopback against a real in-process node: the token on every
state-changing request, the size and time limits, ``/metrics`` parsed back with
``prometheus_client``'s parser, the ``/events`` stream, the pages another module mounts,
the 127.0.0.1-only listener and ``admin.json``."""

from __future__ import annotations

import json
import math
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.types import Message

from crypto.identity import Identity
from node.config import load_config
from node.net import admin as admin_module
from node.net.admin import MAX_REQUEST, READ_TIMEOUT, AdminApp, AdminServer
from node.net.adminfile import ADMIN_FILE
from node.net.runtime import Node

HANG = 30.0  # generous: only catches a hang, never times the endpoint


class Endpoint:
    """A running node and its admin endpoint; ``calls`` records the service route's calls."""

    def __init__(self, node: Node, server: AdminServer, calls: list[dict[str, Any]]) -> None:
        self.node, self.server, self.calls = node, server, calls
        self.port, self.token = server.port, server.token

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@asynccontextmanager
async def endpoint(tmp_path: Path, **server_args: Any) -> AsyncIterator[Endpoint]:
    await trio.Path(tmp_path).mkdir(parents=True, exist_ok=True)
    cfg = load_config(
        environ={},
        flags={
            "run.id": "admin-test",
            "net.listen": ["/ip4/127.0.0.1/tcp/0"],
            "data_dir": tmp_path,
            "net.discovery_interval": 600.0,
        },
    )
    calls: list[dict[str, Any]] = []

    async def act(args: dict[str, Any]) -> Any:
        if args.get("fail") == "value":
            raise ValueError("bad argument")
        if args.get("fail") == "crash":
            raise RuntimeError("the service broke")
        calls.append(args)
        return {"done": len(calls)}

    async def look(_args: dict[str, Any]) -> Any:
        return {"calls": len(calls)}

    routes = {("POST", "/service/act"): act, ("GET", "/service"): look}
    async with trio.open_nursery() as nursery:
        node = await nursery.start(Node(cfg, Identity.generate()).serve)
        server = AdminServer(node, tmp_path, routes=routes, **server_args)
        await nursery.start(server.serve)
        try:
            yield Endpoint(node, server, calls)
        finally:
            node.request_stop()
            nursery.cancel_scope.cancel()


async def http(
    port: int,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One request on a fresh connection (``Connection: close``): status, headers, body."""
    head = {"Host": "127.0.0.1", "Connection": "close", **(headers or {})}
    if (body or method not in ("GET", "HEAD")) and "Transfer-Encoding" not in head:
        head.setdefault("Content-Length", str(len(body)))
    with trio.fail_after(HANG):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            lines = "".join(f"{k}: {v}\r\n" for k, v in head.items())
            await stream.send_all(f"{method} {path} HTTP/1.1\r\n{lines}\r\n".encode() + body)
            raw = b""
            while chunk := await stream.receive_some(65536):
                raw += chunk
    return parse_response(raw)


def parse_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(status_line.split()[1]), headers, body


async def get_json(port: int, path: str) -> Any:
    status, _, body = await http(port, "GET", path)
    assert status == 200, body
    return json.loads(body)


# ---- the token ----------------------------------------------------------------------------


async def test_every_state_changing_request_needs_the_token(tmp_path):
    async with endpoint(tmp_path) as e:
        body = b'{"count": 3}'
        wrongs = [
            {},
            {"Authorization": f"Bearer {e.token[:-1]}x"},
            {"Authorization": "Bearer "},
            {"Authorization": f"Bearer {e.token}x"},
            {"Authorization": f"Basic {e.token}"},
            {"Authorization": e.token},
        ]
        for path in ("/announce", "/ping", "/service/act"):
            for headers in wrongs:
                status, _, reply = await http(e.port, "POST", path, body, headers)
                assert status == 401, (path, headers, reply)
                assert "token" in json.loads(reply)["error"]
        for method in ("PUT", "DELETE", "PATCH"):  # any method that is not GET/HEAD
            status, _, _ = await http(e.port, method, "/status", b"{}")
            assert status == 401, method
        assert e.calls == []  # nothing unauthorized reached the service
        assert e.node.announcements.count == 0
        # the right token is accepted, and the service's route gets the body as arguments
        status, _, reply = await http(e.port, "POST", "/service/act", b'{"x": 1}', e.auth)
        assert (status, json.loads(reply)) == (200, {"done": 1})
        assert e.calls == [{"x": 1}]
        status, _, reply = await http(e.port, "POST", "/announce", body, e.auth)
        assert (status, json.loads(reply)) == (200, {"queued": 3})
        # GETs are open, services' ones too
        assert (await get_json(e.port, "/service")) == {"calls": 1}


async def test_bad_requests_get_clear_json_errors_and_the_endpoint_keeps_serving(tmp_path):
    async with endpoint(tmp_path) as e:
        cases = [
            ("POST", "/service/act", b"not json", 400, "not JSON"),
            ("POST", "/service/act", b"[1, 2]", 400, "JSON object"),
            ("POST", "/service/act", b'{"fail": "value"}', 400, "bad argument"),
            ("POST", "/service/act", b'{"fail": "crash"}', 500, "the service broke"),
            ("POST", "/nothing", b"{}", 404, "no such endpoint"),
            ("GET", "/nothing", b"", 404, "no such endpoint"),
        ]
        for method, path, body, want, words in cases:
            status, headers, reply = await http(e.port, method, path, body, e.auth)
            assert status == want, (path, body, reply)
            assert headers["content-type"] == "application/json"
            assert words in json.loads(reply)["error"]
        assert (await get_json(e.port, "/status"))["peer_id"] == e.node.peer_id


async def test_announce_takes_only_a_sane_whole_count(tmp_path):
    async with endpoint(tmp_path) as e:
        wrong = f"count must be a whole number from 0 to {admin_module.MAX_ANNOUNCE}"
        for count in ("null", "[1]", "Infinity", "-Infinity", "1e400", "NaN", '"x"', "{}", "-1"):
            body = b'{"count": %s}' % count.encode()
            status, _, reply = await http(e.port, "POST", "/announce", body, e.auth)
            assert (status, json.loads(reply)) == (400, {"error": wrong}), count
        too_many = b'{"count": %d}' % (admin_module.MAX_ANNOUNCE + 1)
        status, _, reply = await http(e.port, "POST", "/announce", too_many, e.auth)
        assert (status, json.loads(reply)) == (400, {"error": wrong})
        assert e.node.announcements.count == 0
        status, _, reply = await http(e.port, "POST", "/announce", b'{"count": 2}', e.auth)
        assert (status, json.loads(reply)) == (200, {"queued": 2})


async def test_a_websocket_upgrade_is_refused(tmp_path):
    """Nothing reaches the app around the guard: a WebSocket handshake is turned away, even
    to a page that would take it."""

    async def echo(websocket):
        await websocket.accept()
        await websocket.close()

    async with endpoint(tmp_path, pages=[WebSocketRoute("/ws", echo)]) as e:
        headers = {
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Version": "13",
        }
        status, _, _ = await http(e.port, "GET", "/ws", headers=headers)
        assert status == 403
        assert (await get_json(e.port, "/status"))["peer_id"] == e.node.peer_id


async def test_only_requests_naming_loopback_are_answered(tmp_path):
    """DNS rebinding: a page elsewhere whose name resolves to 127.0.0.1 sends its own name
    as Host; the node answers nothing to it, not even the open GETs."""
    async with endpoint(tmp_path) as e:
        for host in (
            "evil.example",
            f"evil.example:{e.port}",
            "127.0.0.1.evil.example",
            "10.0.0.1",
        ):
            for path in ("/status", "/metrics", "/events", "/service"):
                status, _, reply = await http(e.port, "GET", path, headers={"Host": host})
                assert status == 400, (host, path)
                assert "Host" in json.loads(reply)["error"]
        for host in ("127.0.0.1", f"127.0.0.1:{e.port}", f"localhost:{e.port}", "LOCALHOST"):
            status, _, _ = await http(e.port, "GET", "/service", headers={"Host": host})
            assert status == 200, host


# ---- size and time limits -----------------------------------------------------------------


async def test_a_huge_body_is_refused_and_the_node_still_serves(tmp_path):
    async with endpoint(tmp_path) as e:
        # announced too large: refused from the header, before any of it is read
        headers = {**e.auth, "Content-Length": str(100 * MAX_REQUEST)}
        status, _, reply = await http(e.port, "POST", "/service/act", b"{", headers)
        assert status == 413, reply
        # sent in chunks with no length announced: refused once the limit is passed
        chunk = b"x" * 8192
        body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(20)) + b"0\r\n\r\n"
        headers = {**e.auth, "Transfer-Encoding": "chunked"}
        status, _, reply = await http(e.port, "POST", "/service/act", body, headers)
        assert status == 413, reply
        # at the limit it is still taken
        ok = json.dumps({"pad": "y" * (MAX_REQUEST - 20)}).encode()
        assert len(ok) <= MAX_REQUEST
        status, _, reply = await http(e.port, "POST", "/service/act", ok, e.auth)
        assert status == 200, reply
        # a request head over the limit is refused too, in its headers or its query string
        status, _, _ = await http(e.port, "GET", "/status", headers={"X-Pad": "z" * MAX_REQUEST})
        assert status == 413
        status, _, reply = await http(e.port, "GET", "/status?pad=" + "z" * MAX_REQUEST)
        assert status == 413, reply
        status, _, reply = await http(e.port, "GET", "/status?pad=" + "z" * 1000)
        assert status == 200, reply
        assert len(e.calls) == 1
        assert (await get_json(e.port, "/status"))["peer_id"] == e.node.peer_id


@pytest.mark.parametrize("part", ["head", "body"])
async def test_a_slow_client_is_cut_off_while_others_are_served(tmp_path, part):
    """A client that dribbles its request (the head, or the body after a whole head) a byte
    every 0.2 s would take minutes; it is cut off after about READ_TIMEOUT, and meanwhile
    other clients get their answers."""
    async with endpoint(tmp_path) as e:
        body = json.dumps({"pad": "p" * 1000}).encode()
        head = (
            f"POST /service/act HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {e.token}\r\n"
            f"Content-Length: {len(body)}\r\nX-Pad: {'q' * 500}\r\n\r\n"
        ).encode()
        served = []

        async def others() -> None:
            while True:
                served.append((await get_json(e.port, "/status"))["peer_id"])
                await trio.sleep(0.5)

        with trio.fail_after(HANG):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(others)
                stream = await trio.open_tcp_stream("127.0.0.1", e.port)
                if part == "head":
                    took, reply = await dribble(stream, head, 0.2)
                else:
                    await stream.send_all(head)  # a whole head at once, then the body slowly
                    took, reply = await dribble(stream, body, 0.2)
                nursery.cancel_scope.cancel()
        assert took < 4 * READ_TIMEOUT  # cut off, long before the request could have ended
        if part == "body":
            assert parse_response(reply)[0] == 408
        assert e.calls == []
        assert len(served) >= 2 and set(served) == {e.node.peer_id}


async def dribble(stream: trio.SocketStream, data: bytes, every: float) -> tuple[float, bytes]:
    """Send ``data`` a byte every ``every`` seconds; when the server closes or answers,
    how long it took and what it said."""
    started = trio.current_time()
    got = b""
    async with stream, trio.open_nursery() as nursery:

        async def send() -> None:
            for i in range(len(data)):
                try:
                    await stream.send_all(data[i : i + 1])
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                await trio.sleep(every)

        nursery.start_soon(send)
        try:
            while chunk := await stream.receive_some(65536):
                got += chunk
        except trio.BrokenResourceError:
            pass
        nursery.cancel_scope.cancel()
    return trio.current_time() - started, got


# ---- /metrics -----------------------------------------------------------------------------


async def test_metrics_parse_back_with_histograms_process_metrics_and_gauges(tmp_path):
    async with endpoint(tmp_path) as e:
        e.node.metrics.inc("rejected", 2, protocol="/x", reason="oversized")
        e.node.metrics.observe("verdict_latency_seconds", 3.0, verdict="accepted")
        e.node.metrics.observe("generation_tokens_per_second", 150.0)
        status, headers, body = await http(e.port, "GET", "/metrics")
        assert status == 200 and headers["content-type"].startswith("text/plain")
        families = {f.name: f for f in text_string_to_metric_families(body.decode())}
        for name in (
            "intellect_verdict_latency_seconds",
            "intellect_batch_fetch_seconds",
            "intellect_shardcast_shard_seconds",
            "intellect_generation_tokens_per_second",
        ):
            assert families[name].type == "histogram", name
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in families.values()
            for s in f.samples
        }
        assert samples[("intellect_verdict_latency_seconds_count", (("verdict", "accepted"),))] == 1
        assert samples[("intellect_verdict_latency_seconds_sum", (("verdict", "accepted"),))] == 3
        le = ("intellect_generation_tokens_per_second_bucket", (("le", "200.0"),))
        assert samples[le] == 1  # 150 tokens/s falls in the 200 bucket
        assert samples[("intellect_generation_tokens_per_second_bucket", (("le", "100.0"),))] == 0
        key = ("intellect_rejected_total", (("protocol", "/x"), ("reason", "oversized")))
        assert samples[key] == 2
        # the process's own figures, and the gauges read from the services at scrape time
        assert families["process_cpu_seconds"].type == "counter"
        assert samples[("process_resident_memory_bytes", ())] > 1e6
        assert "python_info" in families
        assert families["intellect_peers"].type == "gauge"
        peers = {s.labels["role"]: s.value for s in families["intellect_peers"].samples}
        assert peers == dict.fromkeys(("bootstrap", "inference", "validator", "trainer"), 0)
        assert samples[("intellect_connections", ())] == 0
        e.node.announce("test", b"hi")
        await trio.sleep(0.5)
        published = e.node.announcements.count
        assert published == 1
        _, _, body = await http(e.port, "GET", "/metrics")
        again = {
            s.name: s.value
            for f in text_string_to_metric_families(body.decode())
            for s in f.samples
            if not s.labels
        }
        assert again["intellect_announcements_published"] == published


async def test_each_node_has_a_registry_of_its_own(tmp_path):
    async with endpoint(tmp_path / "a") as a, endpoint(tmp_path / "b") as b:
        a.node.metrics.inc("batches_served")
        assert a.node.metrics.get("batches_served") == 1
        assert b.node.metrics.get("batches_served") == 0
        _, _, body = await http(b.port, "GET", "/metrics")
        served = [
            s.value
            for f in text_string_to_metric_families(body.decode())
            for s in f.samples
            if s.name == "intellect_batches_served_total"
        ]
        assert served == [0]


# ---- /events ------------------------------------------------------------------------------


async def read_events(port: int, count: int, query: str = "?interval=0.2") -> list[dict[str, Any]]:
    """The first ``count`` events of ``/events``, each {"event", "data"}."""
    with trio.fail_after(HANG):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(
                f"GET /events{query} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
            )
            raw = b""
            while b"\r\n\r\n" not in raw:
                raw += await stream.receive_some(65536)
            head, _, rest = raw.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            assert b"content-type: text/event-stream" in head.lower()
            text, events = dechunk(head, rest), []
            while True:
                while "\n\n" in text:
                    block, _, text = text.partition("\n\n")
                    fields = dict(line.split(": ", 1) for line in block.split("\n"))
                    events.append(fields)
                    if len(events) == count:
                        return events
                more = await stream.receive_some(65536)
                assert more, "the stream ended"
                rest += more
                text = dechunk(head, rest)
                for _ in events:  # drop the events already taken
                    text = text.split("\n\n", 1)[1]


def dechunk(head: bytes, data: bytes) -> str:
    """The body so far, undoing chunked transfer encoding where the server used it."""
    if b"transfer-encoding: chunked" not in head.lower():
        return data.decode()
    out = b""
    while b"\r\n" in data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line, 16)
        if len(rest) < size + 2:
            break
        out += rest[:size]
        data = rest[size + 2 :]
    return out.decode()


async def test_events_push_the_status_at_the_interval(tmp_path):
    async with endpoint(tmp_path) as e:
        status = await get_json(e.port, "/status")
        started = trio.current_time()
        events = await read_events(e.port, 3)
        assert trio.current_time() - started >= 0.4  # paced: three events, two intervals
        for ev in events:
            assert ev["event"] == "status"
            got = json.loads(ev["data"])
            assert got.keys() == status.keys()  # the /status schema, whole
            assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in status.items()}
            assert (got["peer_id"], got["role"], got["run_id"]) == (
                e.node.peer_id,
                "inference",
                "admin-test",
            )
        # live: what changes on the node shows in the next event
        e.node.announce("test", b"hello")
        await trio.sleep(0.5)
        later = json.loads((await read_events(e.port, 1))[0]["data"])
        assert later["announcements"]["published"] == 1


async def test_events_interval_is_bounded_and_streams_are_capped(tmp_path, monkeypatch):
    monkeypatch.setattr(admin_module, "MAX_EVENT_STREAMS", 2)
    async with endpoint(tmp_path) as e:
        for bad in ("0", "0.01", "61", "nan", "inf", "-1", "soon"):
            status, _, body = await http(e.port, "GET", f"/events?interval={bad}")
            assert status == 400, bad
            assert "interval" in json.loads(body)["error"]
        assert not math.isnan(admin_module.EVENT_INTERVAL[0])
        held = []
        for _ in range(2):
            stream = await trio.open_tcp_stream("127.0.0.1", e.port)
            await stream.send_all(b"GET /events?interval=60 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert (await stream.receive_some(65536)).startswith(b"HTTP/1.1 200")
            held.append(stream)
        status, _, body = await http(e.port, "GET", "/events")
        assert status == 503, body
        for stream in held:
            await stream.aclose()
        for _ in range(int(HANG / 0.05)):  # the node sees them go, and takes new ones
            if not e.server.app.event_streams:
                break
            await trio.sleep(0.05)
        assert len(await read_events(e.port, 1)) == 1


async def test_a_burst_of_event_streams_gets_no_more_than_the_cap(monkeypatch):
    """A stream counts from the moment it is granted, not from its first event: requests
    that all arrive before any answer went out (here: the client's socket takes the answer's
    head slowly) get the cap and no more; a stream cut off before its first event is
    released all the same."""
    monkeypatch.setattr(admin_module, "MAX_EVENT_STREAMS", 2)

    class Node:
        def status(self) -> dict[str, Any]:
            return {"role": "inference"}

    admin = AdminApp(Node(), "token")  # type: ignore[arg-type]
    app = admin.app()
    statuses: list[int] = []
    slow = trio.Event()  # never set: a granted stream's head waits on the client

    async def request() -> None:
        received = []

        async def receive() -> Message:  # the request, then nothing: the client stays
            if received:
                await trio.sleep_forever()
            received.append(True)
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])
                if message["status"] == 200:
                    await slow.wait()

        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.1"},  # as hypercorn says
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": "/events",
            "raw_path": b"/events",
            "query_string": b"",
            "root_path": "",
            "headers": [(b"host", b"127.0.0.1")],
            "server": ("127.0.0.1", 80),
            "client": ("127.0.0.1", 1),
        }
        await app(scope, receive, send)

    with trio.fail_after(HANG):
        async with trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(request)
            await trio.testing.wait_all_tasks_blocked()
            assert sorted(statuses) == [200, 200, 503, 503, 503, 503]
            assert admin.event_streams == 2
            nursery.cancel_scope.cancel()  # the clients leave before their first event
    assert admin.event_streams == 0


# ---- pages, the listener, admin.json ------------------------------------------------------


async def test_pages_are_mounted_after_the_api(tmp_path):
    async def hello(_request):
        return PlainTextResponse("a page")

    async def shadow(_request):
        return PlainTextResponse("not the status")

    pages = [Route("/", hello), Route("/status", shadow), Route("/dashboard/x", hello)]
    async with endpoint(tmp_path, pages=pages) as e:
        for path in ("/", "/dashboard/x"):
            status, _, body = await http(e.port, "GET", path)
            assert (status, body) == (200, b"a page")
        assert (await get_json(e.port, "/status"))["peer_id"] == e.node.peer_id


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the sockets listening on ``port`` (Linux's /proc/net)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            addr, _, hex_port = local.partition(":")
            if int(hex_port, 16) == port and state == "0A":  # LISTEN
                found.add(addr)
    return found


async def test_listens_on_loopback_only_and_keeps_admin_json_private(tmp_path):
    async with endpoint(tmp_path) as e:
        info = json.loads((tmp_path / ADMIN_FILE).read_text())
        assert info["port"] == e.port and info["token"] == e.token
        assert info["peer_id"] == e.node.peer_id
        assert stat.S_IMODE((tmp_path / ADMIN_FILE).stat().st_mode) == 0o600
        assert listening_addresses(e.port) == {"0100007F"}  # 127.0.0.1, and nothing else
    assert not (tmp_path / ADMIN_FILE).exists()  # removed on exit
