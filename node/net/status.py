"""The node's ``/status`` (JSON) view and the gauges of its ``/metrics``.

Assembled from each service's typed status: the keys here are what ``intellect-node
status``, the devnet's table and the tests read (SPEC §10), so they change only with them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import trio
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from node.config import NodeConfig
from node.net.announcements import Announcements
from node.net.discovery import Discovery
from node.net.host import WIRE
from node.net.metrics import Metrics
from node.net.network import Network
from node.net.peers import PeerTable
from node.net.presence import Presence
from node.net.reachability import Reachability
from node.net.relay import Relays
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
    reachability: Reachability
    relays: Relays
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
        "run_id": v.cfg.run.id,
        "model": str(v.cfg.run.model) if v.cfg.run.model else None,
        "addrs": v.network.addrs,
        "reachability": asdict(v.reachability.status()),  # SPEC §16
        "relay": asdict(v.relays.status()),  # SPEC §17
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
        "peer_limited": metrics.by_label("peer_limited", "limit"),  # SPEC §6 per-peer limits
        "announcements": asdict(v.announcements.status()),
        "discovery": asdict(v.discovery.status(now)),
        **{name: section() for name, section in v.sections.items()},
    }


class StatusGauges:
    """A ``prometheus_client`` collector of the gauges read from the services at scrape
    time: peers by role, open connections, announcements published."""

    def __init__(self, view: StatusView) -> None:
        self.view = view

    def collect(self) -> Iterator[Metric]:
        v = self.view
        by_role = v.peers.by_role()
        peers = GaugeMetricFamily(
            "intellect_peers", "Known peers of this run, by role.", None, ["role"]
        )
        for r in ids.ROLES:
            peers.add_metric([r], float(by_role.get(r, 0)))
        yield peers
        yield GaugeMetricFamily(
            "intellect_connections",
            "Connections held now.",
            float(len(v.network.connected_peers())),
        )
        yield GaugeMetricFamily(
            "intellect_announcements_published",
            "Announcements this node published.",
            float(v.announcements.count),
        )


def _trio_now() -> float:
    try:
        return trio.current_time()
    except RuntimeError:  # outside trio (a test reading the status)
        return 0.0
