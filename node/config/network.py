"""The network's sections: ``[net]`` (libp2p transport, discovery, presence, gossip and
per-peer limits), ``[relay]`` (circuit relay for nodes behind NAT), ``[shardcast]`` (how
weight shards move) and ``[admin]`` (the local admin port)."""

from __future__ import annotations

from typing import Any, Self

from pydantic import Field, ValidationInfo, field_validator, model_validator

from node.config.section import Multiaddrs, Section, split_commas


class NetConfig(Section):
    """libp2p transport, discovery, presence and gossip. The defaults suit most nodes; a
    bootstrap node wants a fixed `listen` port."""

    listen: Multiaddrs = Field(
        default_factory=lambda: ["/ip4/0.0.0.0/tcp/0"],
        description="libp2p listen multiaddrs (TCP). Use a fixed port to be a stable bootstrap.",
        json_schema_extra={"metavar": "MULTIADDR", "flag": "--listen"},
    )
    bootstrap: Multiaddrs = Field(
        default_factory=list,
        description="Multiaddrs (with /p2p/<id>) of peers to join through.",
        json_schema_extra={"metavar": "MULTIADDR", "flag": "--bootstrap"},
    )
    heartbeat_interval: float = Field(
        5.0, ge=0.1, le=300, description="Seconds between presence heartbeats on gossip."
    )
    peer_ttl: float = Field(
        30.0,
        ge=0.3,
        le=3600,
        description="A peer silent this many seconds is forgotten (a connected one is asked "
        "first); scaled up with the heartbeat interval when presence_rate lengthens it.",
    )
    presence_rate: float = Field(
        2.0,
        ge=0.01,
        le=1000,
        description="Presence heartbeats per second the whole network aims at: a node's "
        "heartbeat interval is max(heartbeat_interval, (known peers + 1) / presence_rate).",
    )
    discovery_interval: float = Field(
        5.0,
        ge=0.1,
        le=600,
        description="Seconds before the first DHT lookup round; rounds back off from there.",
    )
    discovery_max_interval: float = Field(
        300.0,
        ge=0.1,
        le=86400,
        description="Longest seconds between DHT lookup rounds once the roles a node works "
        "with are found (half of it while one is missing).",
    )
    conn_low: int = Field(
        6, ge=1, le=1000, description="Connections below which a node dials known peers."
    )
    conn_high: int = Field(
        12, ge=1, le=1000, description="Connections above which a node closes the surplus."
    )
    peers_per_role: int = Field(
        256, ge=1, le=100_000, description="Peers of each role the peer table holds at most."
    )
    read_timeout: float = Field(
        10.0, ge=0.05, le=600, description="Deadline in seconds for every remote read."
    )
    connect_timeout: float = Field(
        5.0, ge=0.05, le=600, description="Deadline in seconds for dialing a peer."
    )
    peer_max_streams: int = Field(16, ge=1, le=4096, description="Requests of a peer at once.")
    peer_request_rate: float = Field(100.0, ge=0.1, le=1e5, description="Requests/s of a peer.")
    peer_request_burst: int = Field(200, ge=1, le=10**6, description="Burst above that rate.")
    peer_presence_rate: float = Field(20.0, ge=0.1, le=1e5, description="Presence requests/s.")
    peer_presence_streams: int = Field(4, ge=1, le=4096, description="Presence requests at once.")
    peer_shun_cooldown: float = Field(10.0, ge=0, le=3600, description="Seconds unread if shunned.")
    max_clock_skew: float = Field(
        300.0, ge=1, le=86400, description="Messages whose timestamp is further off are stale."
    )
    gossip_rate: float = Field(
        100.0, ge=1, le=10000, description="Most announcements per second this node publishes."
    )
    gossip_queue: int = Field(
        10000, ge=16, le=1_000_000, description="Announcements that may wait for the pacer."
    )
    announce_buffer: int = Field(
        4096, ge=64, le=1_000_000, description="Own announcements kept for peers that missed them."
    )

    @field_validator("listen", "bootstrap", mode="before")
    @classmethod
    def _split_commas(cls, v: Any) -> Any:
        return split_commas(v)

    @field_validator("listen", "bootstrap")
    @classmethod
    def _multiaddrs(cls, v: list[str], info: ValidationInfo) -> list[str]:
        return check_multiaddrs(v, bootstrap=info.field_name == "bootstrap")

    @model_validator(mode="after")
    def _ttl_above_heartbeat(self) -> Self:
        if self.peer_ttl <= self.heartbeat_interval:
            raise ValueError("peer_ttl must be longer than heartbeat_interval")
        return self

    @model_validator(mode="after")
    def _watermarks_in_order(self) -> Self:
        if self.conn_low > self.conn_high:
            raise ValueError("conn_low must not be above conn_high")
        return self


def check_multiaddrs(addrs: list[str], *, bootstrap: bool) -> list[str]:
    """``addrs`` if each is a multiaddr a node can listen on (TCP) or, ``bootstrap``, dial
    (ending in ``/p2p/<peer id>``): a bad one is a config error before anything starts."""
    from multiaddr import Multiaddr

    for a in addrs:
        try:
            names = [p.name for p in Multiaddr(a).protocols()]
        except Exception as exc:  # multiaddr raises several unrelated types
            raise ValueError(f"{a!r} is not a multiaddr: {exc}") from None
        if not bootstrap and "tcp" not in names:
            raise ValueError(f"{a!r}: a node listens on TCP (/ip4/<address>/tcp/<port>)")
        if bootstrap and names[-1] != "p2p":
            raise ValueError(f"{a!r} must end in /p2p/<peer id> (the node's peer id)")
    return addrs


class RelayConfig(Section):
    """Circuit relay v2 (HOP) for nodes behind NAT, served by publicly reachable nodes
    (SPEC §17)."""

    enabled: bool | None = Field(
        None,
        description="Relay circuits for nodes behind NAT while publicly reachable. Default: "
        "on for the bootstrap role, off for others.",
        json_schema_extra={"was": "relay"},
    )
    max_reservations: int = Field(
        64,
        ge=1,
        le=100_000,
        description="Reservations held for other peers at most.",
        json_schema_extra={"was": "relay_max_reservations"},
    )
    reservation_ttl: int = Field(
        900,
        ge=30,
        le=86_400,
        description="Seconds a reservation lasts (renewed before).",
        json_schema_extra={"was": "relay_reservation_ttl"},
    )
    circuits_per_reservation: int = Field(
        8,
        ge=1,
        le=1024,
        description="Circuits open at once to one reserved peer.",
        json_schema_extra={"was": "relay_circuits_per_reservation"},
    )
    circuits_per_peer: int = Field(
        4,
        ge=1,
        le=1024,
        description="Circuits one peer may open through us at once.",
        json_schema_extra={"was": "relay_circuits_per_peer"},
    )
    circuit_bytes: int = Field(
        32 * 1024 * 1024,
        ge=1024,
        le=2**40,
        description="Bytes one circuit may carry (both ways) before it is cut.",
        json_schema_extra={"was": "relay_circuit_bytes"},
    )
    circuit_seconds: int = Field(
        600,
        ge=1,
        le=86_400,
        description="Seconds a circuit may last before it is cut.",
        json_schema_extra={"was": "relay_circuit_seconds"},
    )


class ShardcastConfig(Section):
    """How weight shards move (SHARDCAST): their size, transfers at once, the upload cap."""

    shard_size: int = Field(
        8 * 1024 * 1024,
        ge=64 * 1024,
        le=64 * 1024 * 1024,
        description="Bytes per weight shard in the manifests this node publishes.",
    )
    download_slots: int = Field(
        4, ge=1, le=64, description="Shards fetched at once (memory: this many shards)."
    )
    upload_slots: int = Field(
        4, ge=1, le=256, description="Shard uploads served at once; more are refused as busy."
    )
    upload_rate: float = Field(
        0.0, ge=0, le=100_000, description="Upload cap for weight shards in MB/s (0: none)."
    )
    follow_weights: bool | None = Field(
        None, description="Fetch every new weight version (default: every role but bootstrap)."
    )


class AdminConfig(Section):
    """The node's local admin and metrics HTTP server (`intellect-node status`, the
    dashboard)."""

    port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Local admin/metrics HTTP port on 127.0.0.1 (0: any free port).",
        json_schema_extra={"was": "admin_port"},
    )
