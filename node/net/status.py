"""The node's ``/status`` (JSON) and ``/metrics`` (Prometheus) views.

Assembled from each service's typed status: the keys here are what ``intellect-node
status``, the devnet's table and the tests read (SPEC §10), so they change only with them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import trio

from node.net.host import WIRE
from protocol import ids

if TYPE_CHECKING:
    from node.net.runtime import Node

STATUS_FULL_LIST = 32  # /status lists every known peer up to this many, else the peers in use


def node_status(node: Node, sections: dict[str, Callable[[], dict[str, Any]]]) -> dict[str, Any]:
    now = _trio_now()
    connected = node.connected_peers()
    in_use = node.discovery.in_use()
    count = len(node.peers.peers)
    metrics = node.metrics
    return {
        "peer_id": node.peer_id,
        "role": node.cfg.role,
        "run_id": node.cfg.run_id,
        "model": str(node.cfg.model) if node.cfg.model else None,
        "addrs": node.addrs,
        "peers": [asdict(r) for r in node.presence.rows(connected, in_use, STATUS_FULL_LIST)],
        "peer_count": count,
        "peers_listed": "all" if count <= STATUS_FULL_LIST else "in use",
        "peers_by_role": node.peers.by_role(),
        "connections": asdict(node.discovery.connection_status(now)),
        "presence": asdict(node.presence.status()),
        "traffic": {
            "messages": metrics.by_label("messages", "direction"),
            "bytes": metrics.by_label("bytes", "direction"),
            "wire_bytes": dict(WIRE),  # all TCP bytes: encryption, muxing, libp2p's own
        },
        "rejected": metrics.by_label("rejected", "reason"),
        "announcements": asdict(node.announcements.status()),
        "discovery": asdict(node.discovery.status(now)),
        **{name: section() for name, section in sections.items()},
    }


def prometheus(node: Node) -> str:
    by_role = node.peers.by_role()
    gauges = {
        "peers": {(("role", r),): float(by_role.get(r, 0)) for r in ids.ROLES},
        "connections": {(): float(len(node.connected_peers()))},
        "announcements_published": {(): float(node.announcements.count)},
    }
    return node.metrics.render(gauges)


def _trio_now() -> float:
    try:
        return trio.current_time()
    except RuntimeError:  # outside trio (a test reading the status)
        return 0.0
