"""The dashboard's parts without a browser: its routes on the admin endpoint's app, the
devnet's page that relays each node's GETs, and `intellect-node dashboard`. (The page in a
real browser against real nodes: tests/test_dashboard_browser.py.)"""

import json
import subprocess
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
import trio
import trio.testing
from starlette.applications import Starlette
from starlette.testclient import TestClient

from node.cli.dashboard import can_open_browser
from node.cli.devnetpage import DevnetPage
from node.config import NodeConfig
from node.net import dashboard
from node.net.dashboard import STATIC_DIR, AccountHistory, account_of, dashboard_routes
from tests.helpers.net import CLI

WORKER = {"role": "inference", "peer_id": "12D3KooWabcdefghijkl", "run_id": "r"}
WORKER["inference"] = {"address": "0x" + "ab" * 20}
CONTRACT = "0x" + "11" * 20
HANG = 30.0  # generous: only catches a hang, never times the page


def client(status, **cfg):
    app = Starlette(routes=dashboard_routes(NodeConfig(**cfg), lambda: status))
    return TestClient(app)


def test_the_page_and_its_files_are_served_and_hold_no_token():
    c = client(WORKER)
    page = c.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for src in ("dashboard/app.js", "dashboard/chart.js", "dashboard/style.css"):
        assert src in page.text
        assert c.get("/" + src).status_code == 200
    # nothing from another origin, nothing that could carry the admin token
    for f in STATIC_DIR.iterdir():
        text = f.read_text().lower()
        assert "http://" not in text.replace('"http://www.w3.org/2000/svg"', "")
        assert "https://" not in text and "authorization" not in text and "bearer" not in text
        assert "admin.json" not in text and "method:" not in text  # fetch() GETs only
    assert c.get("/dashboard/../admin.py").status_code == 404
    spec = c.get("/nodes.json").json()
    assert spec == {
        "title": "inference 12D3KooWabcd… (r)",
        "nodes": [{"name": "", "base": ""}],
        "live": "events",
    }


def test_history_says_why_it_is_unavailable():
    assert client(WORKER).get("/history").json() == {
        "available": False,
        "reason": "no ledger contract configured",
    }
    trainer = {"role": "trainer", "peer_id": "x", "run_id": "r", "trainer": {"step": 1}}
    assert client(trainer, chain={"contract": "0x" + "11" * 20}).get("/history").json() == {
        "available": False,
        "reason": "this role has no ledger account",
    }
    assert account_of(WORKER) == "0x" + "ab" * 20
    unreachable = client(WORKER, chain={"contract": "0x" + "11" * 20, "url": "http://127.0.0.1:9"})
    reply = unreachable.get("/history").json()
    assert reply["available"] is False and reply["reason"].startswith("cannot read the chain")


def test_history_shows_why_the_chain_failed_but_not_its_url(tmp_path):
    """An RPC URL often carries an API key (…/v3/KEY, ?apikey=): the reason names the error
    and never the URL, its path or its host."""
    chain = "http://127.0.0.1:9/v3/SECRETKEY?apikey=SECRET2"
    reply = client(WORKER, chain={"contract": CONTRACT, "url": chain}, data_dir=tmp_path).get(
        "/history"
    )
    reason = reply.json()["reason"]
    assert reason.startswith("cannot read the chain (RpcUnavailable: "), reason
    assert "SECRET" not in reason and "/v3" not in reason and "127.0.0.1" not in reason
    # an RPC's HTTP error (web3 raises requests' HTTPError, naming the whole URL)
    history = AccountHistory(NodeConfig(chain={"contract": CONTRACT, "url": chain}))

    def refused(_address):
        raise requests.HTTPError(f"401 Client Error: Unauthorized for url: {chain}")

    history._read = refused
    reason = history.read(WORKER["inference"]["address"])["reason"]
    assert reason.startswith("cannot read the chain (HTTPError: 401 Client Error: Unauthorized")
    assert "SECRET" not in reason and "http" not in reason.split("HTTPError")[1]


def test_a_failed_history_read_is_reused_as_long_as_a_good_one():
    """A chain that is down is asked once per ``every`` seconds, like one that answers; the
    answer says so and when the next try is."""
    now, asked = [100.0], []
    history = AccountHistory(
        NodeConfig(chain={"contract": CONTRACT}), every=5.0, clock=lambda: now[0]
    )
    address = WORKER["inference"]["address"]

    def down(_address):
        asked.append(now[0])
        raise TimeoutError("read timed out")

    history._read = down
    reason = "cannot read the chain (TimeoutError: read timed out); next try in {} s"
    assert history.read(address) == {"available": False, "reason": reason.format(5)}
    now[0] = 104.5
    assert history.read(address) == {"available": False, "reason": reason.format(1)}
    assert asked == [100.0]
    now[0] = 105.0
    history.read(address)
    assert asked == [100.0, 105.0]
    history._read = lambda _address: (asked.append(now[0]), {"available": True, "rows": []})[1]
    now[0] = 110.0
    assert history.read(address) == {"available": True, "rows": []}
    now[0] = 114.9
    assert history.read(address) == {"available": True, "rows": []}
    assert asked == [100.0, 105.0, 110.0]


async def asgi_get(app, path):
    """One GET through the ASGI app itself, in this trio run: its status and JSON body."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1")],
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 1),
    }
    await app(scope, receive, send)
    return sent[0]["status"], json.loads(b"".join(m.get("body", b"") for m in sent[1:]))


async def test_history_requests_hold_one_worker_thread_and_ask_a_dead_chain_once(
    monkeypatch, tmp_path
):
    """More /history requests than trio has worker threads, against a chain that never
    answers: the node's other work in threads (the roles' chain calls, SHARDCAST's disk I/O)
    still runs while they wait, and the chain is asked once; its failure answers them all."""
    monkeypatch.setattr(dashboard, "HISTORY_EVERY", 600.0)  # the cache outlives the test
    asked, asking, answer = [], trio.Event(), threading.Event()

    def never_answers(_self, address):
        asked.append(address)
        trio.from_thread.run_sync(asking.set)
        answer.wait(HANG)  # released by the test
        raise ConnectionError("the chain did not answer")

    monkeypatch.setattr(AccountHistory, "_read", never_answers)
    cfg = NodeConfig(chain={"contract": CONTRACT}, data_dir=tmp_path)
    app = Starlette(routes=dashboard_routes(cfg, lambda: WORKER))
    many = trio.to_thread.current_default_thread_limiter().total_tokens + 10
    replies = []

    async def ask():
        replies.append(await asgi_get(app, "/history"))

    async with trio.open_nursery() as nursery:
        try:
            for _ in range(many):
                nursery.start_soon(ask)
            with trio.fail_after(HANG):
                await asking.wait()
            await trio.testing.wait_all_tasks_blocked()
            with trio.fail_after(HANG):  # the old code: every thread waited on the chain
                assert await trio.to_thread.run_sync(lambda: "ran") == "ran"
            assert replies == []  # ... while the history requests still wait
        finally:
            answer.set()
    assert asked == [WORKER["inference"]["address"]]
    assert len(replies) == many
    reason = "cannot read the chain (ConnectionError: the chain did not answer); next try in"
    for status, body in replies:
        assert status == 200 and body["available"] is False
        assert body["reason"].startswith(reason), body


class FakeAdmin(BaseHTTPRequestHandler):
    """A stand-in for a node's admin endpoint: /status, /history and /metrics answer."""

    def do_GET(self):  # noqa: N802
        body = {
            "/status": b'{"role": "validator"}',
            "/history": b'{"available": false}',
            "/metrics": b"# metrics",
        }
        if self.path not in body:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body[self.path])))
        self.end_headers()
        self.wfile.write(body[self.path])

    def log_message(self, *_):
        pass


@pytest.fixture
def devnet_page(tmp_path):
    node = ThreadingHTTPServer(("127.0.0.1", 0), FakeAdmin)
    threading.Thread(target=node.serve_forever, daemon=True).start()
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "admin.json").write_text(
        json.dumps({"port": node.server_address[1], "token": "t"})
    )
    (tmp_path / "gone").mkdir()
    page = DevnetPage({"v": tmp_path / "v", "gone": tmp_path / "gone"}, title="t").start()
    yield page
    page.close()
    node.shutdown()
    node.server_close()


def get(url, host=None):
    req = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_the_devnet_page_lists_every_node_and_relays_only_their_gets(devnet_page):
    url = devnet_page.url
    assert url.startswith("http://127.0.0.1:")
    status, body = get(url)
    assert status == 200 and b"dashboard/app.js" in body
    assert get(url + "dashboard/chart.js")[0] == 200
    assert json.loads(get(url + "nodes.json")[1]) == {
        "title": "t: 2 nodes",
        "nodes": [{"name": "v", "base": "node/v"}, {"name": "gone", "base": "node/gone"}],
        "live": "poll",
    }
    assert get(url + "node/v/status") == (200, b'{"role": "validator"}')
    assert get(url + "node/v/history") == (200, b'{"available": false}')
    assert get(url + "node/v/metrics")[0] == 404  # only what the page reads is relayed
    assert get(url + "node/nobody/status")[0] == 404
    assert get(url + "dashboard/..%2f..%2fconfig.py")[0] == 404
    # another site's page that points its name at 127.0.0.1 (DNS rebinding) reads nothing
    port = url.rsplit(":", 1)[1].rstrip("/")
    assert get(url + "node/v/status", host=f"evil.example:{port}")[0] == 400
    assert get(url, host="evil.example")[0] == 400
    assert get(url + "node/v/status", host=f"localhost:{port}")[0] == 200
    status, body = get(url + "node/gone/status")  # no admin.json: not running
    assert status == 502 and b"node unreachable" in body


def test_the_dashboard_command_prints_the_url_and_opens_nothing_without_a_display(tmp_path):
    (tmp_path / "admin.json").write_text(json.dumps({"port": 4321, "token": "t"}))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no DISPLAY: no browser opened
    res = subprocess.run(
        [*CLI, "dashboard", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0 and res.stdout == "http://127.0.0.1:4321/\n", res.stderr
    assert res.stderr == ""
    res = subprocess.run(
        [*CLI, "dashboard", "--data-dir", str(tmp_path / "none")],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert res.returncode == 1 and "no running node found" in res.stderr
    assert "Traceback" not in res.stderr


def test_a_browser_is_opened_only_where_a_display_exists(monkeypatch):
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setattr("sys.platform", "linux")
    assert not can_open_browser()
    monkeypatch.setenv("DISPLAY", ":0")
    assert can_open_browser()


def test_static_files_are_package_data():
    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert 'node = ["net/static/*"]' in text
