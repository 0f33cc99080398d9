"""Where a running node's admin endpoint listens: ``<data_dir>/admin.json``.

Kept apart from the endpoint (``admin.py``) so that commands can find a running node
without importing trio or py-libp2p: ``--help`` and offline commands stay instant.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ADMIN_FILE = "admin.json"
LOCAL_NAMES = frozenset({"127.0.0.1", "localhost"})


def local_host(host: str) -> bool:
    """Whether a request's ``Host`` header names this machine's loopback (with or without a
    port). The admin endpoint and the devnet's page answer only such requests: a web page
    the user has open elsewhere could otherwise point its own name at 127.0.0.1 (DNS
    rebinding) and read a node's status from the browser. An absent header (an HTTP/1.0
    client, never a browser) is let through."""
    if not host:
        return True
    name, sep, port = host.rpartition(":")
    if not sep or not port.isdigit():
        name = host
    return name.lower() in LOCAL_NAMES


def read_admin_file(data_dir: Path) -> dict[str, Any]:
    """The running node's admin port and token; a clear error if no node runs there."""
    path = data_dir / ADMIN_FILE
    try:
        info: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise RuntimeError(f"no running node found: {path} does not exist") from exc
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"cannot read {path}: {exc}") from exc
    if not (
        isinstance(info, dict)
        and isinstance(info.get("port"), int)
        and isinstance(info.get("token"), str)
    ):
        raise RuntimeError(f"{path} is damaged (no port and token): is a node running there?")
    pid = info.get("pid")
    if isinstance(pid, int) and not _alive(pid):
        raise RuntimeError(
            f"no running node found: {path} is left from node process {pid}, which has ended"
            " (killed?)"
        )
    return info


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True
