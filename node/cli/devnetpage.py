"""The devnet's one page: every node of the devnet side by side, on 127.0.0.1.

The devnet process serves the nodes' own dashboard page (``node/net/static``) with a
``nodes.json`` that lists every node, and relays the page's reads to each node's admin
endpoint: ``GET /node/<name>/status`` and ``/node/<name>/history`` (nothing else, GET only,
no token). A relay rather than CORS on the nodes: a node's admin endpoint stays readable
by its own page only, so no other web page open in the same browser can read a node's
status cross-origin, and the devnet page is one origin that polls each node.

It runs in a thread of the devnet process (``http.server``: a few requests a second, no
event loop to share with the devnet's supervision loop), and stops with it.
"""

from __future__ import annotations

import json
import threading
import urllib.error
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from node.cli.adminclient import admin_request
from node.net.adminfile import local_host
from node.net.dashboard import STATIC_DIR

RELAYED = ("status", "history")  # the node endpoints the page reads
RELAY_TIMEOUT = 10.0
TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}


class DevnetPage:
    """Serves the page for ``nodes`` ({name: data dir}) until ``close``."""

    def __init__(self, nodes: dict[str, Path], port: int = 0, title: str = "devnet") -> None:
        self.nodes = dict(nodes)
        self.title = title
        page = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if local_host(self.headers.get("Host", "")):
                    status, ctype, body = page.answer(self.path.split("?", 1)[0])
                else:  # DNS rebinding: another site's page naming 127.0.0.1 as its own
                    status, ctype = 400, "application/json"
                    body = b'{"error": "the Host header must name 127.0.0.1 or localhost"}'
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:  # quiet: the devnet prints its table
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/"

    def start(self) -> DevnetPage:
        self.thread.start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def answer(self, path: str) -> tuple[int, str, bytes]:
        if path == "/":
            return 200, TYPES[".html"], (STATIC_DIR / "index.html").read_bytes()
        if path == "/nodes.json":
            listing = [{"name": n, "base": f"node/{n}"} for n in self.nodes]
            spec = {
                "title": f"{self.title}: {len(listing)} nodes",
                "nodes": listing,
                "live": "poll",
            }
            return 200, "application/json", json.dumps(spec).encode()
        parts = path.strip("/").split("/")
        if len(parts) == 2 and parts[0] == "dashboard":
            files = {p.name: p for p in STATIC_DIR.iterdir()}  # only the page's own files
            if parts[1] in files:
                ctype = TYPES.get(files[parts[1]].suffix, "application/octet-stream")
                return 200, ctype, files[parts[1]].read_bytes()
        if (
            len(parts) == 3
            and parts[0] == "node"
            and parts[1] in self.nodes
            and parts[2] in RELAYED
        ):
            return self.relay(self.nodes[parts[1]], parts[2])
        return 404, "application/json", json.dumps({"error": f"no such page: {path}"}).encode()

    def relay(self, data_dir: Path, what: str) -> tuple[int, str, bytes]:
        """GET ``/<what>`` of the node (its port read afresh: a restarted node moves)."""
        try:
            return 200, "application/json", admin_request(data_dir, f"/{what}", None, RELAY_TIMEOUT)
        except urllib.error.HTTPError as exc:
            return exc.code, "application/json", exc.read()
        except (OSError, RuntimeError, ValueError) as exc:
            return (
                502,
                "application/json",
                json.dumps({"error": f"node unreachable: {exc}"}).encode(),
            )
