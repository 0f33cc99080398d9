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
limit); an admitted one must be given back with ``close`` when its handler ends.

A refusal still costs the listener: the stream's protocol negotiation (four messages), a
signed ``Refusal``, the writes. A peer that ignores ``busy`` (an honest dialer waits
before it asks again) would keep the listener busy refusing it, so refusals have a bucket
of their own per peer (``burst`` / 10 in a row, at least 1, and ``rate`` / 10 per second:
20 and 10/s by default): past it the peer is *shunned* (``shunned``) while its request
bucket is empty too, and ``Requests`` resets its new streams on arrival, before protocol
negotiation and without a signed refusal (counted as the limit ``shunned``); a stream
refused past it after negotiation is reset the same way. Buckets of at most ``max_peers``
peers are kept (least recently seen forgotten first: a forgotten peer only starts again
with full buckets); a peer with streams open is never forgotten.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from node.net.pacing import TokenBucket

LIMITS = ("rate", "streams", "protocol", "shunned")
REFUSALS = 0.1  # a peer's signed refusals: this share of its request rate and burst


@dataclass
class _Peer:
    requests: TokenBucket  # request streams admitted
    refusals: TokenBucket  # signed refusals sent


@dataclass
class PeerLimits:
    max_streams: int
    rate: float
    burst: float
    max_peers: int = 4096
    _buckets: OrderedDict[str, _Peer] = field(default_factory=OrderedDict)
    _open: Counter[str] = field(default_factory=Counter)  # peer -> streams being handled
    _by_protocol: Counter[tuple[str, str]] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)  # limit -> refusals

    def __post_init__(self) -> None:
        if self.max_streams < 1 or self.max_peers < 1:
            raise ValueError("max_streams and max_peers must be >= 1")
        TokenBucket(self.rate, self.burst)  # validates rate and burst

    def open(self, peer: str, protocol: str, now: float, per_protocol: int | None = None) -> str:
        """Admit one stream of ``peer`` on ``protocol``: "" if admitted, else the limit
        that refuses it (one of ``LIMITS``), counted in ``refused``. A refused stream's
        refusal is signed only if ``refusal(peer, now)`` allows it."""
        bucket = self._peer(peer).requests
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

    def refusal(self, peer: str, now: float) -> bool:
        """Whether a refused stream of ``peer`` gets a signed ``busy`` (its refusal bucket
        has a token: spent), else it is reset."""
        bucket = self._peer(peer).refusals
        if bucket.delay(now) > 0:
            return False
        bucket.take(now)
        return True

    def shunned(self, peer: str, now: float) -> bool:
        """Whether a new stream of ``peer`` is reset on arrival, before its protocol is
        negotiated: its refusals are used up and its request bucket is empty (so ``open``
        would refuse it for ``rate``). Counted in ``refused`` as ``shunned``."""
        state = self._buckets.get(peer)
        if state is None or state.refusals.delay(now) == 0 or state.requests.delay(now) == 0:
            return False
        self.refused["shunned"] += 1
        return True

    def close(self, peer: str, protocol: str) -> None:
        """An admitted stream's handler ended."""
        for counter, key in ((self._open, peer), (self._by_protocol, (peer, protocol))):
            counter[key] -= 1  # type: ignore[index]
            if counter[key] <= 0:  # type: ignore[index]
                del counter[key]  # type: ignore[attr-defined]

    def streams(self, peer: str) -> int:
        """Streams of ``peer`` being handled now."""
        return self._open[peer]

    def _peer(self, peer: str) -> _Peer:
        state = self._buckets.get(peer)
        if state is None:
            refusals = TokenBucket(REFUSALS * self.rate, max(1.0, REFUSALS * self.burst))
            state = self._buckets[peer] = _Peer(TokenBucket(self.rate, self.burst), refusals)
            for old in list(self._buckets):
                if len(self._buckets) <= self.max_peers:
                    break
                if old != peer and old not in self._open:
                    del self._buckets[old]
        self._buckets.move_to_end(peer)
        return state
