"""The dashboard in a real browser (Debian's chromium, driven by Selenium): real node
processes (bootstrap, trainer, validator, one worker) on 127.0.0.1 with the served
development chain and the tiny model, the smallest set that produces verdicts.

The validator's own page (``intellect-node dashboard``'s URL, live through ``/events``) and
the devnet's page of every node side by side load with no console error and nothing from
another origin; every figure on them equals ``intellect-node status --json`` of its node,
and the rewards panel's counts equal the chain's events of the node's account; the page
follows a new verdict without a reload; it never holds the admin token. Screenshots are
kept under ``$TEST_ARTIFACTS`` (default ``.pytest_artifacts/``). Without a browser the test
skips, saying why (CI installs one: scripts/setup.sh).

The page's own recovery runs against the real admin endpoint over a stand-in node: a page
refused its event stream (503, the node at its maximum of streams) keeps following the node
and takes a stream again once one is free; a failed ``/history`` shows the endpoint's error;
a node that stops is said to be gone, with what to do."""

import json
import queue
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from node.cli.devnet import wait_ready
from node.cli.devnetpage import DevnetPage
from node.config import NodeConfig
from node.net import admin as admin_module
from node.net.admin import AdminServer
from node.net.adminfile import read_admin_file
from node.net.dashboard import dashboard_routes
from tests.helpers.browser import Browser, artifacts_dir, browser_missing
from tests.helpers.net import CLI, wait_until
from tests.test_loop import Loop

MISSING = browser_missing()
# a real browser against real nodes: over a minute, so behind the slow marker (-m slow)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]

FIGURES = """
return [...document.querySelectorAll('[data-node]')].map((n) => ({
  node: n.dataset.node,
  role: (n.querySelector('.role') || {}).textContent || null,
  peer_id: (n.querySelector('[data-k=peer_id]') || {}).title || null,
  figs: [...n.querySelectorAll('[data-k][data-value]')].map(
    (e) => [e.dataset.k, JSON.parse(e.dataset.value), e.classList.contains('v') ? e.textContent : null]),
}));
"""
ORIGINS = "return performance.getEntriesByType('resource').map((e) => e.name)"
SUMMARY = """
return [...document.querySelectorAll('[data-summary]')].map((r) => ({
  node: r.dataset.summary,
  figs: Object.fromEntries([...r.querySelectorAll('[data-k][data-value]')].map(
    (e) => [e.dataset.k, JSON.parse(e.dataset.value)])),
  link: (r.querySelector('a') || {}).hash || null,
}));
"""
REACH_TEXT = "return [...document.querySelectorAll('[data-node] dl.kv')].map((e) => e.textContent)"
HISTORY_KINDS = {  # what the rewards panel counts, by the chain's event names
    "submission": ("WorkSubmitted",),
    "verdict": ("WorkAccepted", "WorkRejected", "RejectOverturned"),
    "slash": ("Slashed",),
    "claim": ("Claimed",),
    "stake": ("Registered", "StakeAdded", "Unbonded", "Withdrawn"),
}
ACCOUNT_ARGS = ("worker", "validator", "account")


def status_json(node):
    """What ``intellect-node status --json`` says of the node, as a user runs it."""
    res = subprocess.run(
        [*CLI, "status", "--json", "--data-dir", str(node.data_dir)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def lookup(data, path):
    for part in path.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def shown(key, value):
    """The text the page shows for ``value`` (how the user reads it)."""
    if value is None:
        return "–"
    if key.endswith("_wei"):
        return f"{value / 1e18:.6f} ETH"
    if key.endswith("_bytes") or ".latency_s." in key or key == "inference.tokens_per_s":
        return None  # rounded for reading: the raw value is compared
    if key == "trainer.train_steps" and value == 0:
        return "no limit"
    return f"{value:,}" if isinstance(value, int) else None


def chain_counts(client, address):
    """The rewards panel's counts, from the chain's own logs of ``address``'s events."""
    a = address.lower()
    counts = {}
    for kind, names in HISTORY_KINDS.items():
        counts[kind] = sum(
            1
            for name in names
            for e in getattr(client.contract.events, name).get_logs(from_block=0)
            if any(str(e["args"].get(k, "")).lower() == a for k in ACCOUNT_ARGS)
        )
    return counts


def disagreements(browser, nodes, client):
    """Every figure on the page that differs from its node's ``status --json`` or the chain."""
    panels = browser.js(FIGURES)
    if sorted(p["node"] for p in panels) != sorted(nodes):
        return [("panels", sorted(p["node"] for p in panels), sorted(nodes))]
    wrong = []
    for panel in panels:
        st = status_json(nodes[panel["node"]])
        if panel["role"] != st["role"] or panel["peer_id"] != st["peer_id"]:
            wrong.append((panel["node"], "identity", panel["role"], st["role"]))
        account = (st.get("inference") or st.get("validator") or {}).get("address")
        counts = chain_counts(client, account) if account else {}
        keys = {k for k, _, _ in panel["figs"]}
        if len(keys) < 8:  # the page has not drawn its figures (yet)
            wrong.append((panel["node"], "figures", sorted(keys)))
        if "reachability.state" not in keys:  # SPEC §16: every node measures it
            wrong.append((panel["node"], "reachability", "missing"))
        for key, value, text in panel["figs"]:
            want = counts.get(key.split(".")[-1]) if key.startswith("history.") else lookup(st, key)
            close = isinstance(want, float) and isinstance(value, int | float)
            if value != want and not (close and abs(value - want) < 1e-9):
                wrong.append((panel["node"], key, value, want))
            elif text is not None and shown(key, want) not in (None, text):
                wrong.append((panel["node"], key, text, shown(key, want)))
        if account and not keys >= {f"history.count.{k}" for k in HISTORY_KINDS}:
            wrong.append((panel["node"], "history", "missing", sorted(keys)))
    return wrong


def agree(browser, nodes, client, what):
    """The page's figures agree with the nodes and the chain (live figures move: asked
    again until one reading agrees)."""
    last = []

    def ok():
        nonlocal last
        last = disagreements(browser, nodes, client)
        return not last

    try:
        wait_until(ok, 120, what, interval=1)
    except AssertionError:
        raise AssertionError(f"{what}: the page disagrees: {last}") from None


def figure(browser, node, key):
    for panel in browser.js(FIGURES):
        if panel["node"] == node:
            return next((v for k, v, _ in panel["figs"] if k == key), None)
    return None


def verdicts_on_chain(client):
    return sum(
        len(getattr(client.contract.events, n).get_logs(from_block=0))
        for n in ("WorkAccepted", "WorkRejected")
    )


def same_origin_only(browser, url):
    loaded = browser.js(ORIGINS)
    assert loaded and all(u.startswith(url) for u in loaded), loaded


@pytest.mark.timeout(900)
def test_the_dashboard_shows_the_nodes_figures_live_in_a_real_browser(tmp_path, tiny_model_dir):
    loop = Loop(tmp_path, tiny_model_dir)
    browser = page = None
    try:
        loop.spawn("trainer", "trainer")
        loop.validator()
        loop.worker("w")
        for node in loop.nodes.values():
            wait_ready(node, timeout=120)
        client = loop.client()
        wait_until(lambda: verdicts_on_chain(client) >= 1, 600, "a first verdict", interval=2)
        browser = Browser()
        shots = artifacts_dir()

        # the validator's own page, as `intellect-node dashboard` gives it
        validator = loop.nodes["validator"]
        res = subprocess.run(
            [*CLI, "dashboard", "--no-open", "--data-dir", str(validator.data_dir)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        url = res.stdout.strip()
        admin = read_admin_file(validator.data_dir)
        assert url == f"http://127.0.0.1:{admin['port']}/"
        browser.open(url)
        agree(browser, {"": validator}, client, "the validator's page")
        assert browser.console_errors() == []
        same_origin_only(browser, url)
        assert admin["token"] not in browser.driver.page_source

        # a new verdict lands: the page follows (no reload)
        before = figure(browser, "", "validator.judged")
        wait_until(lambda: verdicts_on_chain(client) > before, 300, "a new verdict", interval=2)
        wait_until(
            lambda: figure(browser, "", "validator.judged") > before,
            60,
            "the page to show the new verdict",
            interval=0.5,
        )
        agree(browser, {"": validator}, client, "the validator's page after a new verdict")
        assert browser.console_errors() == []
        browser.screenshot(shots / "dashboard-validator.png")

        # the devnet's page: every node side by side
        page = DevnetPage({n.name: n.data_dir for n in loop.nodes.values()}).start()
        browser.open(page.url)
        agree(browser, dict(loop.nodes), client, "the devnet's page")
        # a line per node on top, each naming its role and linking to its panel
        rows = wait_until(
            lambda: (r := browser.js(SUMMARY)) and all(x["figs"] for x in r) and r,
            60,
            "the devnet page's summary of every node",
            interval=0.5,
        )
        assert sorted(x["node"] for x in rows) == sorted(loop.nodes), rows
        for row in rows:
            st = status_json(loop.nodes[row["node"]])
            assert row["figs"]["role"] == st["role"], (row, st["role"])
            assert row["link"] == f"#node-{row['node']}", row
        # reachability in words: no field names, no raw JSON (issue #53 item 6)
        reach = browser.js(REACH_TEXT)
        assert len(reach) == len(loop.nodes), reach
        for text in reach:
            assert "not_reached_by" not in text and '{"' not in text, text
        time.sleep(2)  # a few more polls of every node
        assert browser.console_errors() == []
        same_origin_only(browser, page.url)
        path = browser.screenshot(shots / "dashboard-devnet.png")
        assert path.stat().st_size > 10_000
    finally:
        if browser is not None:
            browser.close()
        if page is not None:
            page.close()
        loop.close()


class StandIn:
    """What the page reads of a worker node, with no node behind it."""

    peer_id = "12D3KooWstandinstandin"

    def __init__(self) -> None:
        self.accepted = 0

    def status(self) -> dict[str, Any]:
        return {
            "role": "inference",
            "peer_id": self.peer_id,
            "run_id": "page-test",
            "addrs": [],
            "peer_count": 0,
            "peers_by_role": {},
            "connections": {"count": 0, "low": 1, "high": 2, "dialed": 0, "dropped": 0},
            "weights": {"current": 1, "downloading": {}, "held": [1]},
            "inference": {
                "address": "0x" + "ab" * 20,
                "accepted": self.accepted,
                "rejected": 0,
                "rejected_by_reason": {},
                "tokens_per_s": 1.0,
            },
        }

    def prometheus(self) -> bytes:
        return b""


class Endpoint:
    """The real admin endpoint and the page's routes over ``StandIn``, in a thread of its
    own (the browser is driven from this one); ``/history`` answers 502 with an error."""

    def __init__(self, data_dir: Path) -> None:
        self.node = StandIn()

        async def broken_history(_: Request) -> Response:
            return JSONResponse({"error": "node unreachable: the chain is down (test)"}, 502)

        pages = [Route("/history", broken_history)]
        pages += dashboard_routes(NodeConfig(data_dir=data_dir), self.node.status)
        self.server = AdminServer(self.node, data_dir, pages=pages)  # type: ignore[arg-type]
        self.started: queue.Queue[Any] = queue.Queue()
        self.thread = threading.Thread(target=trio.run, args=(self._serve,), daemon=True)
        self.thread.start()
        self.port, self.trio_token, self.scope = self.started.get(timeout=60)

    async def _serve(self) -> None:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                port = await nursery.start(self.server.serve)
                self.started.put((port, trio.lowlevel.current_trio_token(), scope))

    def streams(self) -> int:
        return self.server.app.event_streams

    def stop(self) -> None:
        trio.from_thread.run_sync(self.scope.cancel, trio_token=self.trio_token)
        self.thread.join(30)


def node_panel(browser: Browser) -> dict[str, Any]:
    return browser.js("""
        const n = document.querySelector('[data-node]'), q = (s) => n.querySelector(s);
        const v = q('[data-k="inference.accepted"]');
        return {role: q('.role') && q('.role').textContent, accepted: v && v.dataset.value,
                offline: n.classList.contains('offline'),
                notice: q('.notice') && !q('.notice').hidden ? q('.notice').textContent : null,
                history: [...n.querySelectorAll('p.muted')].map((e) => e.textContent)
                    .find((t) => t.startsWith('history')) || null};
    """)


@pytest.mark.timeout(300)
def test_the_page_recovers_from_a_refused_stream_and_says_when_the_node_is_gone(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(admin_module, "MAX_EVENT_STREAMS", 1)
    endpoint = Endpoint(tmp_path)
    browser = held = None
    try:
        held = socket.create_connection(("127.0.0.1", endpoint.port))  # the one stream
        held.sendall(b"GET /events?interval=60 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert held.recv(100).startswith(b"HTTP/1.1 200")
        browser = Browser()
        browser.open(f"http://127.0.0.1:{endpoint.port}/")
        # its stream refused (503), the page follows the node all the same
        endpoint.node.accepted = 7
        wait_until(lambda: node_panel(browser)["accepted"] == "7", 60, "the page to show /status")
        panel = node_panel(browser)
        assert panel["role"] == "inference" and not panel["offline"] and panel["notice"] is None
        assert panel["history"] == "history unavailable: node unreachable: the chain is down (test)"
        # room for a stream: the page takes it (asked again later each time: 1, 2, 4 ... s)
        monkeypatch.setattr(admin_module, "MAX_EVENT_STREAMS", 2)
        wait_until(lambda: endpoint.streams() == 2, 90, "the page to open its stream again")
        endpoint.node.accepted = 8
        wait_until(lambda: node_panel(browser)["accepted"] == "8", 30, "a figure by the stream")
        # the node stops: the page says so, and what to do
        endpoint.stop()
        wait_until(lambda: node_panel(browser)["notice"], 60, "the page to say the node is gone")
        panel = node_panel(browser)
        assert panel["offline"] and "intellect-node dashboard" in panel["notice"], panel
        assert "stopped" in panel["notice"]
        browser.screenshot(artifacts_dir() / "dashboard-node-gone.png")
    finally:
        if held is not None:
            held.close()
        if browser is not None:
            browser.close()
        if endpoint.thread.is_alive():
            endpoint.stop()
