"""The node's dashboard: a page the admin endpoint serves at ``/``, and what it reads.

GET /                   the page (``static/index.html``; its script and style under /dashboard/)
GET /nodes.json         which nodes the page shows and how it follows them: this node, live
                        through the endpoint's ``/events`` stream
GET /history            the node's own ledger account's history (``ledger/accounthistory.py``):
                        every submission, verdict, slash, claim and stake change, per day;
                        read at most once per ``HISTORY_EVERY`` seconds, a failure too (the
                        answer says why, with no URL, and when the chain is asked again),
                        in at most one worker thread however many pages ask

All GET: the page never holds the bearer token and cannot change anything. The page draws
its charts itself (hand-written SVG, ``static/chart.js``): nothing is loaded from elsewhere,
so it works offline. The devnet serves the same page for all its nodes side by side
(``node/cli/devnetpage.py``), with a ``nodes.json`` that lists them.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import BaseRoute

    from node.config import NodeConfig

STATIC_DIR = Path(__file__).with_name("static")
HISTORY_EVERY = 3.0  # seconds a history read or its failure is reused (a scan per page refresh)
HISTORY_FILE = "dashboard-events.json"  # the event index's cache, apart from the CLI's
# what an error's text must not show: an RPC URL (its path or query often holds an API key),
# the path after ``url:`` (urllib3's "with url: /v3/KEY") and the host (urllib3's host='...')
URL_PARTS = re.compile(r"[a-z][a-z0-9+.-]*://\S+|(?<=url: )\S+|(?<=host=)'[^']*'", re.I)


def account_of(status: dict[str, Any]) -> str | None:
    """The node's ledger account, as its role reports it (workers and validators)."""
    for role in ("inference", "validator"):
        section = status.get(role)
        if isinstance(section, dict) and section.get("address"):
            return str(section["address"])
    return None


class AccountHistory:
    """The node's account history, read from the chain at most once per ``every`` seconds,
    whether the read succeeds or fails; an unreachable chain is a reason, not an error.
    ``read`` blocks (up to the chain's timeout); ``fetch`` runs it in a worker thread."""

    def __init__(
        self,
        cfg: NodeConfig,
        every: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        record: Callable[[str], Any] | None = None,
    ) -> None:
        """``record(address)``: what the node believes of its work (its stored batch keys,
        its unconfirmed transactions: ``.stored``, ``.unconfirmed``), checked against the
        chain."""
        import anyio

        self.cfg = cfg
        self.record = record
        self.every = HISTORY_EVERY if every is None else every
        self.clock = clock
        self.lock = threading.Lock()
        # one thread at most: the others wait in the event loop, not in trio's shared pool
        # of worker threads, which the roles' chain calls and SHARDCAST's disk I/O need
        self.limiter = anyio.CapacityLimiter(1)
        self.index: Any = None
        self.submission: Any = None  # the contract's view of a batch, once connected
        self.cached: tuple[float, str, dict[str, Any]] | None = None  # (read at, address, report)

    async def fetch(self, address: str | None) -> dict[str, Any]:
        import anyio.to_thread

        return await anyio.to_thread.run_sync(self.read, address, limiter=self.limiter)

    def read(self, address: str | None) -> dict[str, Any]:
        if address is None:
            return {"available": False, "reason": "this role has no ledger account"}
        if not self.cfg.chain.contract:
            return {"available": False, "reason": "no ledger contract configured"}
        with self.lock:
            if not self._fresh(address):
                try:
                    report = self._read(address)
                except Exception as exc:  # the chain may be down: the page says so
                    report = {"available": False, "error": chain_error(exc)}
                self.cached = (self.clock(), address, report)  # after the read: it may be slow
            assert self.cached is not None
            read_at, _, report = self.cached
        if report["available"]:
            return report
        retry = math.ceil(max(read_at + self.every - self.clock(), 0.0))
        reason = f"cannot read the chain ({report['error']}); next try in {retry} s"
        return {"available": False, "reason": reason}

    def _fresh(self, address: str) -> bool:
        return (
            self.cached is not None
            and self.cached[1] == address
            and self.clock() - self.cached[0] < self.every
        )

    def _read(self, address: str) -> dict[str, Any]:
        from ledger.accounthistory import account_history
        from ledger.chain import connect
        from ledger.client import LedgerClient
        from ledger.history import EventIndex

        if self.index is None:
            chain = connect(self.cfg.chain.url, timeout=self.cfg.chain.rpc_timeout_s)
            self.submission = LedgerClient(chain, self.cfg.chain.contract or "").submission
            self.index = EventIndex(
                chain.w3,
                self.cfg.chain.contract or "",
                self.cfg.chain.contract_block,
                self.cfg.resolved_data_dir / HISTORY_FILE,
                confirmations=self.cfg.chain.confirmations,
            )
        mine = self.record(address) if self.record is not None else None
        report = account_history(
            self.index,
            address,
            submission=self.submission,
            stored=mine.stored if mine else None,
            unconfirmed=mine.unconfirmed if mine else None,
        )
        return {"available": True, **report}


def chain_error(exc: BaseException) -> str:
    """A failed chain read, for the page: the exception's type and its text, with the RPC's
    URL, its path and its host cut out."""
    text = URL_PARTS.sub("…", str(exc)).strip()
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def dashboard_routes(
    cfg: NodeConfig,
    status: Callable[[], dict[str, Any]],
    *,
    live: str = "events",
    record: Callable[[str], Any] | None = None,
) -> list[BaseRoute]:
    """The page's routes, to mount on the admin endpoint's app (``live``: how the page
    follows the node, ``events`` for the ``/events`` stream or ``poll`` for ``/status``;
    ``record``: the node's own record of its work, see ``AccountHistory``)."""
    from starlette.responses import FileResponse, JSONResponse
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    history = AccountHistory(cfg, record=record)

    async def page(_: Request) -> Response:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-store"})

    async def nodes(_: Request) -> Response:
        st = status()
        title = f"{st['role']} {st['peer_id'][:12]}… ({st['run_id']})"
        return JSONResponse({"title": title, "nodes": [{"name": "", "base": ""}], "live": live})

    async def account(_: Request) -> Response:
        address = account_of(status())
        return JSONResponse(await history.fetch(address))

    return [
        Route("/", page, methods=["GET"]),
        Route("/nodes.json", nodes, methods=["GET"]),
        Route("/history", account, methods=["GET"]),
        Mount("/dashboard", StaticFiles(directory=STATIC_DIR), name="dashboard"),
    ]
