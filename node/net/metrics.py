"""The node's Prometheus metrics: ``prometheus_client`` on a registry of the node's own.

One ``CollectorRegistry`` per ``Node`` (several nodes may share a test process, and each
must show only its own figures), holding the process's CPU, memory and file descriptors
(``ProcessCollector``, ``PlatformCollector``), the counters and histograms declared below,
and whatever collectors the node adds (the gauges of ``status.py``, read at scrape time).

Every metric is declared here, once, with its labels: a call with an undeclared name or
other label names is a programming error (``KeyError`` / ``ValueError``), not a new
series. Counters are exposed as ``intellect_<name>_total``, histograms as
``intellect_<name>_bucket|_sum|_count``.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.registry import Collector

PREFIX = "intellect_"

# name: (help, label names)
COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "messages": ("Envelopes sent and received, by protocol.", ("direction", "protocol")),
    "bytes": ("Envelope bytes sent and received, by protocol.", ("direction", "protocol")),
    "rejected": ("Inputs refused, by protocol and reason (SPEC §9).", ("protocol", "reason")),
    "peer_limited": (
        "Request streams refused by a per-peer limit (rate, streams, protocol), by protocol.",
        ("protocol", "limit"),
    ),
    "connections_dialed": ("Connections dialed to reach the low watermark.", ()),
    "connections_trimmed": ("Connections closed above the high watermark.", ()),
    "connections_dropped": ("Connections to peers that left or expired, closed.", ()),
    "dht_lookups": ("DHT lookups for peers of a role, by scope.", ("scope",)),
    "dht_provides": ("DHT provider records published for our role.", ()),
    "peers_expired": ("Peers dropped from the table after the TTL.", ()),
    "liveness_probes": ("Presence probes of quiet peers, by outcome.", ("outcome",)),
    "subscriber_errors": ("Announcement handlers that raised, by topic.", ("topic",)),
    "synced_announcements": ("Announcements fetched by request to repair a gap.", ()),
    "syncs_deferred": ("Gap repairs left to a later heartbeat: too many running.", ()),
    "weights_notices_deferred": (
        "Weights notices not followed up at once: too many manifest requests running.",
        (),
    ),
    "shardcast_bytes": ("SHARDCAST shard bytes served and fetched.", ("direction",)),
    "shardcast_uploads": ("SHARDCAST shards served whole.", ()),
    "shardcast_refusals": ("SHARDCAST shard requests refused by the peer.", ("outcome",)),
    "shardcast_fetch_failures": ("SHARDCAST shard fetches that failed.", ("outcome",)),
    "batches_submitted": ("Rollout batches generated and submitted on-chain.", ()),
    "tokens_generated": ("Output tokens of the submitted rollout batches.", ()),
    "batches_served": ("Rollout batches served to validators and trainers.", ()),
    "verdicts": ("Verdicts posted on-chain, by verdict.", ("verdict",)),
    "autonat_answers": (
        "AutoNAT questions of other peers answered, by outcome (SPEC §16).",
        ("outcome",),
    ),
    "relay_reservations": ("Relay: reservations asked of us, by outcome (SPEC §17).", ("outcome",)),
    "relay_circuits": (
        "Relay: circuits asked of us, by outcome: opened, refused (by which limit), cut.",
        ("outcome",),
    ),
    "relay_bytes": ("Relay: bytes we copied between the two ends of circuits.", ()),
    "hole_punch_attempts": ("DCUtR hole punches, by outcome (direct / failed).", ("outcome",)),
}

_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# name: (help, label names, buckets)
HISTOGRAMS: dict[str, tuple[str, tuple[str, ...], tuple[float, ...]]] = {
    "verdict_latency_seconds": (
        "Validator: from learning a submission on-chain to its verdict posted.",
        ("verdict",),
        (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0),
    ),
    "batch_fetch_seconds": ("A rollout batch fetched from its holder, whole.", (), _SECONDS),
    "shardcast_shard_seconds": (
        "A SHARDCAST shard fetched, verified and written.",
        (),
        _SECONDS,
    ),
    "generation_tokens_per_second": (
        "Inference: output tokens per second of each generated batch.",
        (),
        (1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5),
    ),
}


class Metrics:
    """The counters and histograms of one node, and the registry that exposes them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.counters = {
            name: Counter(PREFIX + name, doc, labels, registry=self.registry)
            for name, (doc, labels) in COUNTERS.items()
        }
        self.histograms = {
            name: Histogram(PREFIX + name, doc, labels, registry=self.registry, buckets=buckets)
            for name, (doc, labels, buckets) in HISTOGRAMS.items()
        }

    def inc(self, name: str, amount: int = 1, **labels: str) -> None:
        counter = self.counters[name]
        (counter.labels(**labels) if labels else counter).inc(amount)

    def observe(self, name: str, value: float, **labels: str) -> None:
        histogram = self.histograms[name]
        (histogram.labels(**labels) if labels else histogram).observe(value)

    def get(self, name: str, **labels: str) -> int:
        """The sum of counter ``name`` over its series whose labels include ``labels``."""
        return sum(v for have, v in self._series(name) if labels.items() <= have.items())

    def by_label(self, name: str, label: str) -> dict[str, int]:
        """Counter ``name`` summed per value of ``label``."""
        out: dict[str, int] = {}
        for have, v in self._series(name):
            key = have.get(label, "")
            out[key] = out.get(key, 0) + v
        return out

    def _series(self, name: str) -> list[tuple[dict[str, str], int]]:
        total = PREFIX + name + "_total"
        return [
            (s.labels, int(s.value))
            for family in self.counters[name].collect()
            for s in family.samples
            if s.name == total
        ]

    def add_collector(self, collector: Collector) -> None:
        """Expose ``collector``'s metrics too (e.g. gauges read at scrape time)."""
        self.registry.register(collector)

    def exposition(self) -> bytes:
        """Everything in the Prometheus text format (``prometheus_client``'s exposition)."""
        return generate_latest(self.registry)
