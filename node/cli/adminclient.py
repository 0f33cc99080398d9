"""Talking to a running node's local admin endpoint (``node/net/admin.py``) from a command.

The endpoint's port and bearer token are in ``<data_dir>/admin.json``
(``node/net/adminfile.py``, which imports neither trio nor py-libp2p, so ``--help`` and
offline commands stay instant).
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from node.config import NodeConfig
from node.net.adminfile import read_admin_file


def data_dir(args: argparse.Namespace) -> Path:
    """The data directory a command names: ``--data-dir``, else the one of ``--name``."""
    if getattr(args, "data_dir", None) is not None:
        return Path(args.data_dir).expanduser()
    return NodeConfig(name=args.name).resolved_data_dir


def admin_call(data_dir: Path, path: str, body: dict[str, Any] | None, timeout: float) -> Any:
    """GET ``path`` (``body`` None) or POST ``body`` to it, with the token; the JSON reply."""
    info = read_admin_file(data_dir)
    req = urllib.request.Request(
        f"http://127.0.0.1:{info['port']}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {info['token']}", "Content-Type": "application/json"},
        method="GET" if body is None else "POST",
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def admin_get(data_dir: Path, path: str, timeout: float = 10) -> Any:
    return admin_call(data_dir, path, None, timeout)


def admin_post(data_dir: Path, path: str, body: dict[str, Any], timeout: float = 30) -> Any:
    """POST to the admin endpoint; a refusal becomes a ``RuntimeError`` with its reason."""
    try:
        return admin_call(data_dir, path, body, timeout)
    except urllib.error.HTTPError as exc:
        try:
            reason = json.loads(exc.read()).get("error", str(exc))
        except ValueError:
            reason = str(exc)
        raise RuntimeError(reason) from None
