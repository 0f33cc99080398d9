"""Where a running node's admin endpoint listens: ``<data_dir>/admin.json``.

Kept apart from the endpoint (``admin.py``) so that commands can find a running node
without importing trio or py-libp2p: ``--help`` and offline commands stay instant.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ADMIN_FILE = "admin.json"


def read_admin_file(data_dir: Path) -> dict[str, Any]:
    """The running node's admin port and token; a clear error if no node runs there."""
    path = data_dir / ADMIN_FILE
    try:
        info: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise RuntimeError(f"no running node found: {path} does not exist") from exc
    return info
