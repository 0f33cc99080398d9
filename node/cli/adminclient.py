"""Talking to a running node's local admin endpoint (``node/net/admin.py``): the one
client every command, the devnet, the tests' helpers and the benches use.

The endpoint's port and bearer token are in ``<data_dir>/admin.json``
(``node/net/adminfile.py``, which imports neither trio nor py-libp2p, so ``--help`` and
offline commands stay instant). Every request carries the token.
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from node.config import NodeConfig, default_data_dir
from node.net.adminfile import ADMIN_FILE, read_admin_file


def devnet_base() -> Path:
    """The devnet's default ``--base-dir``: a data dir per node, and its chain's."""
    return Path.home() / ".intellect-node" / "devnet"


def data_dir(args: argparse.Namespace) -> Path:
    """The data directory a command names: ``--data-dir``, else the one of ``--name``; a
    ``--name`` that names no running node of its own but a running devnet's node
    (``inference-0``, ``validator``) is that node's."""
    if getattr(args, "data_dir", None) is not None:
        return Path(args.data_dir).expanduser()
    own = default_data_dir(args.name or NodeConfig.model_fields["role"].default)
    if args.name and not (own / ADMIN_FILE).exists():
        devnet = devnet_base() / str(args.name)
        if (devnet / ADMIN_FILE).exists():
            return devnet
    return own


def devnet_chain_dir(default: Path) -> Path:
    """Where the development chain's ``chain.json`` is: ``default`` (``intellect-node
    chain``'s), else, if only a running devnet has one, the devnet's."""
    devnet = devnet_base() / "chain"
    if not (default / "chain.json").exists() and (devnet / "chain.json").exists():
        return devnet
    return default


def admin_request(data_dir: Path, path: str, body: dict[str, Any] | None, timeout: float) -> bytes:
    """GET ``path`` (``body`` None) or POST ``body`` to it, with the token; the reply."""
    info = read_admin_file(data_dir)
    req = urllib.request.Request(
        f"http://127.0.0.1:{info['port']}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {info['token']}", "Content-Type": "application/json"},
        method="GET" if body is None else "POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            reply: bytes = resp.read()
            return reply
    except urllib.error.URLError as exc:
        if isinstance(exc, urllib.error.HTTPError):
            raise
        raise RuntimeError(
            f"the node of {data_dir} does not answer on its admin port {info['port']}: {exc.reason}"
        ) from exc


def admin_call(data_dir: Path, path: str, body: dict[str, Any] | None, timeout: float) -> Any:
    """``admin_request`` with a JSON reply."""
    return json.loads(admin_request(data_dir, path, body, timeout))


def admin_get(data_dir: Path, path: str, timeout: float = 10) -> Any:
    return admin_call(data_dir, path, None, timeout)


def admin_text(data_dir: Path, path: str, timeout: float = 10) -> str:
    """A text page, such as ``/metrics`` (Prometheus text)."""
    return admin_request(data_dir, path, None, timeout).decode()


def admin_status(data_dir: Path, timeout: float = 5) -> dict[str, Any] | None:
    """The node's ``/status``, or None while it does not answer (not started yet, still
    writing its admin file, stopped)."""
    try:
        st: dict[str, Any] = admin_get(data_dir, "/status", timeout)
    except (RuntimeError, OSError, ValueError):  # no admin file, no answer, half a reply
        return None
    return st


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
