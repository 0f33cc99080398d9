"""The node's ``/status`` (JSON) and ``/metrics`` (Prometheus) views.

Assembled from each service's typed status: the keys here are what ``intellect-node
status``, the devnet's table and the tests read (SPEC §10), so they change only with them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import trio

from node.config import NodeConfig
from node.net.announcements import Announcements
from node.net.discovery import Discovery
from node.net.host import WIRE
from node.net.metrics import Metrics
from node.net.network import Network
from node.net.peers import PeerTable
from node.net.presence import Presence
from protocol import ids

STATUS_FULL_LIST = 32  # /status lists every known peer up to this many, else the peers in use


@dataclass(frozen=True)
class StatusView:
    """What ``/status`` and ``/metrics`` are built from: the node's services."""

    cfg: NodeConfig
    network: Network
    peers: PeerTable
    presence: Presence
    discovery: Discovery
    announcements: Announcements
    metrics: Metrics
    sections: dict[str, Callable[[], dict[str, Any]]]  # the roles' own (``add_status``)


def node_status(v: StatusView) -> dict[str, Any]:
    now = _trio_now()
    connected = v.network.connected_peers()
    in_use = v.discovery.in_use()
    count = len(v.peers.peers)
    metrics = v.metrics
    return {
        "peer_id": v.network.identity.peer_id,
        "role": v.cfg.role,
        "run_id": v.cfg.run_id,
        "model": str(v.cfg.model) if v.cfg.model else None,
        "addrs": v.network.addrs,
        "peers": [asdict(r) for r in v.presence.rows(connected, in_use, STATUS_FULL_LIST)],
        "peer_count": count,
        "peers_listed": "all" if count <= STATUS_FULL_LIST else "in use",
        "peers_by_role": v.peers.by_role(),
        "connections": asdict(v.discovery.connection_status(now, connected)),
        "presence": asdict(v.presence.status()),
        "traffic": {
            "messages": metrics.by_label("messages", "direction"),
            "bytes": metrics.by_label("bytes", "direction"),
            "wire_bytes": dict(WIRE),  # all TCP bytes: encryption, muxing, libp2p's own
        },
        "rejected": metrics.by_label("rejected", "reason"),
        "announcements": asdict(v.announcements.status()),
        "discovery": asdict(v.discovery.status(now)),
        **{name: section() for name, section in v.sections.items()},
    }


def prometheus(v: StatusView) -> str:
    by_role = v.peers.by_role()
    gauges = {
        "peers": {(("role", r),): float(by_role.get(r, 0)) for r in ids.ROLES},
        "connections": {(): float(len(v.network.connected_peers()))},
        "announcements_published": {(): float(v.announcements.count)},
    }
    return v.metrics.render(gauges)


def _trio_now() -> float:
    try:
        return trio.current_time()
    except RuntimeError:  # outside trio (a test reading the status)
        return 0.0
