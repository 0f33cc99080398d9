"""The node's dashboard: a page the admin endpoint serves at ``/``, and what it reads.

GET /                   the page (``static/index.html``; its script and style under /dashboard/)
GET /nodes.json         which nodes the page shows and how it follows them: this node, live
                        through the endpoint's ``/events`` stream
GET /history            the node's own ledger account's history (``ledger/accounthistory.py``):
                        every submission, verdict, slash, claim and stake change, per day

All GET: the page never holds the bearer token and cannot change anything. The page draws
its charts itself (hand-written SVG, ``static/chart.js``): nothing is loaded from elsewhere,
so it works offline. The devnet serves the same page for all its nodes side by side
(``node/cli/devnetpage.py``), with a ``nodes.json`` that lists them.
"""

from __future__ import annotations

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
HISTORY_EVERY = 3.0  # seconds a history read is reused for (one chain scan per page refresh)
HISTORY_FILE = "dashboard-events.json"  # the event index's cache, apart from the CLI's


def account_of(status: dict[str, Any]) -> str | None:
    """The node's ledger account, as its role reports it (workers and validators)."""
    for role in ("inference", "validator"):
        section = status.get(role)
        if isinstance(section, dict) and section.get("address"):
            return str(section["address"])
    return None


class AccountHistory:
    """The node's account history, read from the chain (blocking: call it in a thread),
    at most once per ``every`` seconds; an unreachable chain is a reason, not an error."""

    def __init__(self, cfg: NodeConfig, every: float = HISTORY_EVERY) -> None:
        self.cfg = cfg
        self.every = every
        self.lock = threading.Lock()
        self.index: Any = None
        self.cached: tuple[float, str, dict[str, Any]] | None = None

    def read(self, address: str | None) -> dict[str, Any]:
        if address is None:
            return {"available": False, "reason": "this role has no ledger account"}
        if not self.cfg.contract:
            return {"available": False, "reason": "no ledger contract configured"}
        with self.lock:
            now = time.monotonic()
            if self.cached and self.cached[1] == address and now - self.cached[0] < self.every:
                return self.cached[2]
            try:
                report = self._read(address)
            except Exception as exc:  # the chain may be down: the page says so
                return {"available": False, "reason": f"cannot read the chain: {exc}"}
            self.cached = (now, address, report)
            return report

    def _read(self, address: str) -> dict[str, Any]:
        from ledger.accounthistory import account_history
        from ledger.chain import connect
        from ledger.history import EventIndex

        if self.index is None:
            chain = connect(self.cfg.chain)
            self.index = EventIndex(
                chain.w3,
                self.cfg.contract or "",
                self.cfg.contract_block,
                self.cfg.resolved_data_dir / HISTORY_FILE,
                confirmations=self.cfg.chain_confirmations,
            )
        return {"available": True, **account_history(self.index, address)}


def dashboard_routes(
    cfg: NodeConfig, status: Callable[[], dict[str, Any]], *, live: str = "events"
) -> list[BaseRoute]:
    """The page's routes, to mount on the admin endpoint's app (``live``: how the page
    follows the node, ``events`` for the ``/events`` stream or ``poll`` for ``/status``)."""
    import anyio.to_thread
    from starlette.responses import FileResponse, JSONResponse
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    history = AccountHistory(cfg)

    async def page(_: Request) -> Response:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-store"})

    async def nodes(_: Request) -> Response:
        st = status()
        title = f"{st['role']} {st['peer_id'][:12]}… ({st['run_id']})"
        return JSONResponse({"title": title, "nodes": [{"name": "", "base": ""}], "live": live})

    async def account(_: Request) -> Response:
        address = account_of(status())
        return JSONResponse(await anyio.to_thread.run_sync(history.read, address))

    return [
        Route("/", page, methods=["GET"]),
        Route("/nodes.json", nodes, methods=["GET"]),
        Route("/history", account, methods=["GET"]),
        Mount("/dashboard", StaticFiles(directory=STATIC_DIR), name="dashboard"),
    ]
