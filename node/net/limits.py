"""Per-peer limits on inbound request streams, so one peer cannot starve the others.

A pure state machine (no sockets; the caller passes the time). Before a request stream's
handler runs, ``open(peer, protocol, now, per_protocol)`` decides, cheapest first:

- ``rate``: each peer has a token bucket of ``burst`` request streams refilled at ``rate``
  per second (``node/net/pacing.py``): a peer flooding small requests gets refusals while
  every other peer keeps its own full bucket;
- ``protocol_rate``: a protocol that honest peers ask rarely (presence: one greeting per
  connection, one probe per silence) has a bucket of its own per peer (``protocol_rates``:
  protocol -> (rate, burst)), well above that use and far below ``rate``, so a flood of
  one cheap request meets it long before ``rate``;
- ``streams``: at most ``max_streams`` of a peer's request streams are handled at once,
  over all protocols (slow readers and stalled writers hold theirs until their deadlines);
- ``protocol``: a protocol whose handler holds a shared resource (upload slots) names its
  own cap per peer (``per_protocol``), below the resource's size, so one peer's concurrent
  fetches always leave slots for others.

A refused stream never reaches the handler (``Requests`` answers ``busy`` and counts the
limit); an admitted one must be given back with ``close`` when its handler ends.

A refusal still costs the listener about what an answer costs (py-libp2p's stream set-up
and protocol negotiation, a signed ``Refusal``: ~5 ms of CPU here), and even a stream
reset on arrival costs ~2 ms of py-libp2p's own work. A peer that ignores ``busy`` (an
honest dialer waits before it asks again) would keep the listener busy refusing it, so
refusals have a bucket of their own per peer (``burst`` / 10 in a row, at least 1, and
``rate`` / 10 per second: 20 and 10/s by default). A stream refused past it is reset
instead of answered, and empties the peer's request bucket: the peer is *shunned*
(``shunned``: no refusal and no request token left). ``Requests`` resets a shunned peer's
new streams on arrival, before protocol negotiation (counted as the limit ``shunned``),
and the network stops reading its connections for ``cooldown`` seconds (``held``), so a
flood costs the listener nothing until then; the peer comes back with one token in each
bucket, not a full burst, so one that floods on is held again at once, and for twice as
long each time it is held again within a cooldown of its last hold's end (up to
``MAX_HOLD`` times the cooldown).

Buckets of at most ``max_peers`` peers are kept (least recently seen forgotten first: a
forgotten peer only starts again with full buckets); a peer with streams open or held is
never forgotten.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from node.net.pacing import TokenBucket

LIMITS = ("rate", "protocol_rate", "streams", "protocol", "shunned")
REFUSALS = 0.1  # a peer's signed refusals: this share of its request rate and burst
MAX_HOLD = 8  # a peer held again and again: the cooldown doubles each time, up to this many


@dataclass
class _Peer:
    requests: TokenBucket  # request streams admitted
    refusals: TokenBucket  # signed refusals sent
    protocols: dict[str, TokenBucket] = field(default_factory=dict)  # protocol_rates'
    held_until: float | None = None  # shunned: its connections are not read until then
    released: float | None = None  # when its last hold ended
    holds: int = 0  # holds in a row, each starting within a cooldown of the last one's end


@dataclass
class PeerLimits:
    max_streams: int
    rate: float
    burst: float
    max_peers: int = 4096
    cooldown: float = 0.0  # seconds a shunned peer's connections are not read
    protocol_rates: dict[str, tuple[float, float]] = field(default_factory=dict)
    _buckets: OrderedDict[str, _Peer] = field(default_factory=OrderedDict)
    _open: Counter[str] = field(default_factory=Counter)  # peer -> streams being handled
    _by_protocol: Counter[tuple[str, str]] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)  # limit -> refusals

    def __post_init__(self) -> None:
        if self.max_streams < 1 or self.max_peers < 1:
            raise ValueError("max_streams and max_peers must be >= 1")
        if self.cooldown < 0:
            raise ValueError("cooldown must be >= 0")
        TokenBucket(self.rate, self.burst)  # validates rate and burst
        for rate, burst in self.protocol_rates.values():
            TokenBucket(rate, burst)

    def limit_protocol(self, protocol: str, rate: float, burst: float) -> None:
        """Give ``protocol`` a request bucket of its own per peer (``protocol_rate``)."""
        TokenBucket(rate, burst)  # validates
        self.protocol_rates[protocol] = (rate, burst)

    def open(self, peer: str, protocol: str, now: float, per_protocol: int | None = None) -> str:
        """Admit one stream of ``peer`` on ``protocol``: "" if admitted, else the limit
        that refuses it (one of ``LIMITS``), counted in ``refused``. A refused stream's
        refusal is signed only if ``refusal(peer, now)`` allows it."""
        state = self._peer(peer)
        own = self._protocol_bucket(state, protocol)
        limit = ""
        if state.requests.delay(now) > 0:
            limit = "rate"
        elif own is not None and own.delay(now) > 0:
            limit = "protocol_rate"
        elif self._open[peer] >= self.max_streams:
            limit = "streams"
        elif per_protocol is not None and self._by_protocol[peer, protocol] >= per_protocol:
            limit = "protocol"
        if limit:
            self.refused[limit] += 1
            return limit
        state.requests.take(now)
        if own is not None:
            own.take(now)
        self._open[peer] += 1
        self._by_protocol[peer, protocol] += 1
        return ""

    def refusal(self, peer: str, now: float) -> bool:
        """Whether a refused stream of ``peer`` gets a signed ``busy`` (its refusal bucket
        has a token: spent). If not, the stream is reset and the peer's request bucket
        emptied: it ignores ``busy``, so its next stream is shunned."""
        state = self._peer(peer)
        if state.refusals.delay(now) > 0:
            _empty(state.requests, now)
            return False
        state.refusals.take(now)
        return True

    def shunned(self, peer: str, now: float) -> bool:
        """Whether a new stream of ``peer`` is reset on arrival, before its protocol is
        negotiated: it is held (``held``), or its refusals are used up and its request
        bucket is empty (so ``open`` would refuse it for ``rate``), which holds it for
        ``cooldown`` seconds from now (doubled for each hold in a row, up to ``MAX_HOLD``
        times). Counted in ``refused`` as ``shunned``."""
        state = self._buckets.get(peer)
        if state is None:
            return False
        if state.held_until is not None and now >= state.held_until:
            # back from its hold: one token in each bucket, not the burst it would have
            # saved up meanwhile (a peer that floods on is shunned again at once)
            state.held_until, state.released = None, now
            for bucket in (state.requests, state.refusals, *state.protocols.values()):
                _empty(bucket, now, keep=1.0)
        if state.held_until is None:
            if state.refusals.delay(now) == 0 or state.requests.delay(now) == 0:
                return False
            if self.cooldown > 0:
                again = state.released is not None and now - state.released < self.cooldown
                state.holds = state.holds + 1 if again else 1
                factor = min(MAX_HOLD, 2 ** (state.holds - 1))
                state.held_until = now + self.cooldown * factor
        self.refused["shunned"] += 1
        return True

    def held(self, peer: str, now: float) -> float:
        """Seconds left before a shunned ``peer``'s connections are read again (0: none)."""
        state = self._buckets.get(peer)
        if state is None or state.held_until is None:
            return 0.0
        return max(0.0, state.held_until - now)

    def close(self, peer: str, protocol: str) -> None:
        """An admitted stream's handler ended."""
        for counter, key in ((self._open, peer), (self._by_protocol, (peer, protocol))):
            counter[key] -= 1  # type: ignore[index]
            if counter[key] <= 0:  # type: ignore[index]
                del counter[key]

    def streams(self, peer: str) -> int:
        """Streams of ``peer`` being handled now."""
        return self._open[peer]

    def _protocol_bucket(self, state: _Peer, protocol: str) -> TokenBucket | None:
        limits = self.protocol_rates.get(protocol)
        if limits is None:
            return None
        bucket = state.protocols.get(protocol)
        if bucket is None:
            bucket = state.protocols[protocol] = TokenBucket(*limits)
        return bucket

    def _peer(self, peer: str) -> _Peer:
        state = self._buckets.get(peer)
        if state is None:
            refusals = TokenBucket(REFUSALS * self.rate, max(1.0, REFUSALS * self.burst))
            state = self._buckets[peer] = _Peer(TokenBucket(self.rate, self.burst), refusals)
            for old in list(self._buckets):
                if len(self._buckets) <= self.max_peers:
                    break
                if old != peer and old not in self._open and not self._buckets[old].held_until:
                    del self._buckets[old]
        self._buckets.move_to_end(peer)
        return state


def _empty(bucket: TokenBucket, now: float, keep: float = 0.0) -> None:
    """Leave ``bucket`` with at most ``keep`` tokens as of ``now``."""
    bucket.delay(now)  # refill up to now first
    bucket.tokens = min(bucket.tokens, keep)
