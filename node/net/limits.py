"""Per-peer limits on inbound request streams, so one peer cannot starve the others.

A pure state machine (no sockets; the caller passes the time). Before a request stream's
handler runs, ``open(peer, protocol, now, per_protocol)`` decides, cheapest first:

- ``rate``: each peer has a token bucket of ``burst`` request streams refilled at ``rate``
  per second (``node/net/pacing.py``): a peer flooding small requests gets refusals while
  every other peer keeps its own full bucket;
- ``streams``: at most ``max_streams`` of a peer's request streams are handled at once,
  over all protocols (slow readers and stalled writers hold theirs until their deadlines);
- ``protocol``: a protocol whose handler holds a shared resource (upload slots) names its
  own cap per peer (``per_protocol``), below the resource's size, so one peer's concurrent
  fetches always leave slots for others.

A refused stream never reaches the handler (``Requests`` answers ``busy`` and counts the
limit); an admitted one must be given back with ``close`` when its handler ends. Buckets
of at most ``max_peers`` peers are kept (least recently seen forgotten first: a forgotten
peer only starts again with a full bucket); a peer with streams open is never forgotten.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from node.net.pacing import TokenBucket

LIMITS = ("rate", "streams", "protocol")


@dataclass
class PeerLimits:
    max_streams: int
    rate: float
    burst: float
    max_peers: int = 4096
    _buckets: OrderedDict[str, TokenBucket] = field(default_factory=OrderedDict)
    _open: Counter[str] = field(default_factory=Counter)  # peer -> streams being handled
    _by_protocol: Counter[tuple[str, str]] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)  # limit -> refusals

    def __post_init__(self) -> None:
        if self.max_streams < 1 or self.max_peers < 1:
            raise ValueError("max_streams and max_peers must be >= 1")
        TokenBucket(self.rate, self.burst)  # validates rate and burst

    def open(self, peer: str, protocol: str, now: float, per_protocol: int | None = None) -> str:
        """Admit one stream of ``peer`` on ``protocol``: "" if admitted, else the limit
        that refuses it (one of ``LIMITS``), counted in ``refused``."""
        bucket = self._bucket(peer)
        limit = ""
        if bucket.delay(now) > 0:
            limit = "rate"
        elif self._open[peer] >= self.max_streams:
            limit = "streams"
        elif per_protocol is not None and self._by_protocol[peer, protocol] >= per_protocol:
            limit = "protocol"
        if limit:
            self.refused[limit] += 1
            return limit
        bucket.take(now)
        self._open[peer] += 1
        self._by_protocol[peer, protocol] += 1
        return ""

    def close(self, peer: str, protocol: str) -> None:
        """An admitted stream's handler ended."""
        for counter, key in ((self._open, peer), (self._by_protocol, (peer, protocol))):
            counter[key] -= 1  # type: ignore[index]
            if counter[key] <= 0:  # type: ignore[index]
                del counter[key]  # type: ignore[attr-defined]

    def streams(self, peer: str) -> int:
        """Streams of ``peer`` being handled now."""
        return self._open[peer]

    def _bucket(self, peer: str) -> TokenBucket:
        bucket = self._buckets.get(peer)
        if bucket is None:
            bucket = self._buckets[peer] = TokenBucket(self.rate, self.burst)
            for old in list(self._buckets):
                if len(self._buckets) <= self.max_peers:
                    break
                if old != peer and old not in self._open:
                    del self._buckets[old]
        self._buckets.move_to_end(peer)
        return bucket
