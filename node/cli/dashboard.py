"""``intellect-node dashboard``: the local URL of a running node's dashboard, opened in a
browser where there is one.

The page is served by the node's admin endpoint (``node/net/dashboard.py``) on 127.0.0.1;
its port is in ``<data_dir>/admin.json``. A browser is opened only where a graphical one
can be (a display on Linux, or macOS / Windows): on a server over SSH the URL is printed,
for an SSH tunnel (``ssh -L PORT:127.0.0.1:PORT host``), and nothing else happens.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from node.cli.adminclient import data_dir
from node.net.adminfile import read_admin_file


def add_dashboard_parser(sub: Any) -> None:
    p = sub.add_parser(
        "dashboard",
        help="print the running node's dashboard URL (http://127.0.0.1:PORT/) and open it "
        "in a browser where one exists",
    )
    p.add_argument("--name", help="the node's name (data dir ~/.intellect-node/<name>)")
    p.add_argument("--data-dir", type=Path, help="the node's data dir")
    p.add_argument("--no-open", action="store_true", help="only print the URL")


def dashboard_url(info: dict[str, Any]) -> str:
    return f"http://127.0.0.1:{int(info['port'])}/"


def can_open_browser() -> bool:
    """A graphical browser can be shown here (console browsers would take the terminal)."""
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def cmd_dashboard(args: argparse.Namespace) -> int:
    url = dashboard_url(read_admin_file(data_dir(args)))
    print(url, flush=True)
    if args.no_open or not can_open_browser():
        return 0
    import webbrowser

    try:
        opened = webbrowser.open(url, new=2)
    except webbrowser.Error:
        opened = False
    if not opened:
        print("(no browser could be opened: open the URL above)", file=sys.stderr)
    return 0
