"""Which shard to fetch next, and from whom: a pure state machine (no sockets, no clock).

The download loop tells it what each peer holds (``update_peer``), asks it for work
(``assign(now)``), and reports every outcome (``completed``, ``failed``, ``corrupt``).

- **Shards**: rarest first (fewest non-banned holders), ties broken at random, so that
  downloaders pulling at the same time take different shards from the origin and can
  trade them among themselves.
- **Origin last**: the run's trainer is asked for a shard only when no other usable peer
  holds it, so the origin's egress stays near one copy however many nodes pull.
- **Origin shares**: the downloaders of a version split the origin's shards among
  themselves without talking: with the ``n`` downloaders a node knows of (itself and the
  peers that answered holdings for this version, the origin aside) sorted by peer id, the
  node at rank ``r`` takes from the origin only shards ``s`` with ``s mod n == r``, and
  gets the others from the peers that fetched them. Only when it has had nothing else to
  fetch for ``share_patience`` seconds, and nothing is in flight, does it take another's
  share from the origin (a downloader that left or is slow does not hold the rest up for
  longer). The patience is two holdings refreshes of an idle download (``pulling.py``:
  ``REFRESH_IDLE``, 1 s): at once, the three joiners of a small model (``bench/join.py``),
  each done with its own share in a fifth of a second, took the others' shares from the
  origin before a refresh showed the peers held them, and the origin sent 0.77 of all
  bytes. Without shares at all, downloaders starting together pick the same rare shards
  and the origin sends 1.66 copies for 6 downloaders (``bench/shardcast.py``).
- **Direct first**: a holder only a circuit relay joins us to (behind NAT, hole punching
  failed) is asked for a shard only when no holder reachable directly has it, the origin
  included, and is left out of the origin shares (it takes its own copy from the origin;
  the others do not wait for its share, nor for a failing peer's, below): a relay's
  limits are small and its bandwidth is somebody else's, so bulk bytes never ride a relay
  where a direct path exists.
- **Peers**: a moving average (EWMA, ``alpha``) of measured throughput and of success,
  scored ``rate × success / (1 + in flight)``; a peer never tried is tried first
  (optimism; one whose fetches only failed scores 0 until one completes), and with
  probability ``explore`` a random holder is taken, so a new fast peer is found.
- **Refusals**: a peer that is busy (every upload slot taken) is asked again after a
  quarter second, doubled for each refusal in a row up to ``max_backoff`` and reset by a
  fetch it serves, without penalty; one that lacks the shard loses it from its holdings.
- **Failures**: a peer whose fetch failed or stalled loses that shard (it goes back to the
  pool at once) and is backed off for ``backoff × 2^(failures − 1)`` seconds (at most
  ``max_backoff``); after ``FAILING`` failures in a row it is asked for a shard only when
  no other holder has it, the origin and relayed holders included (a direct peer whose
  every fetch stalls, a home uplink split over four uploads, otherwise held a download up
  for good); a peer that served a shard whose hash is wrong is banned for good.
- **Bounds**: at most ``max_inflight`` shards in flight (memory is that many shards) and
  ``per_peer`` from any one peer; from the origin, one at a time once the plan knows
  another downloader, a peer that answered holdings and lacks a shard (alone with the
  origin, ``per_peer``: a second fetch hides the gap between shards). The origin's uplink
  is the swarm's scarcest and its upload slots serve in turn: a second request there took
  a second share of it from the other downloaders, or waited in its queue holding a
  download slot a peer could have filled. The swarm bench (6 downloaders, 256 MiB in
  8 MiB shards, ``bench/shardcast.py``), before and after: 1.52-1.56 -> 1.31-1.36 x ideal
  at 10 MB/s, 1.48-1.91 -> 1.38-1.76 at 40 (CPU-bound there); simulated, 1.46 -> 1.34 and
  1.55 -> 1.43 (docs/simulation.md).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

# consecutive failures after which a peer serves a shard only when no other holder has it
FAILING = 3
# a peer that moves a shard slower than this (bytes/s) counts as stalled
STALL_RATE = 262_144


def shard_deadline(length: int, read_timeout: float) -> float:
    """A whole shard's deadline in seconds: a peer slower than ``STALL_RATE`` counts as
    stalled (the runtime cancels the fetch and reports ``failed``)."""
    return max(4 * read_timeout, length / STALL_RATE)


@dataclass
class PeerState:
    peer: str
    have: set[int] = field(default_factory=set)
    rate: float | None = None  # EWMA of bytes/s over completed fetches
    success: float = 1.0  # EWMA of 1 (completed) / 0 (failed)
    inflight: int = 0
    failures: int = 0  # consecutive
    backoff_until: float = 0.0
    banned: bool = False
    joined: bool = False  # it answered holdings for this version (holds or downloads it)
    relayed: bool = False  # only a circuit relay joins us to it (it is behind NAT)
    fetched_bytes: int = 0
    busy_streak: int = 0  # refusals ``busy`` in a row

    def score(self) -> float:
        return (self.rate or 0.0) * self.success / (1 + self.inflight)


@dataclass
class DownloadPlan:
    num_shards: int
    done: set[int] = field(default_factory=set)
    origin: str | None = None
    me: str | None = None  # our peer id: turns on origin shares (None: any shard)
    max_inflight: int = 4
    per_peer: int = 2
    alpha: float = 0.3
    explore: float = 0.1
    backoff: float = 1.0
    max_backoff: float = 30.0
    share_patience: float = 2.0  # seconds with only others' origin shares left (module doc)
    rng: random.Random = field(default_factory=random.Random)
    peers: dict[str, PeerState] = field(default_factory=dict)
    inflight: dict[int, str] = field(default_factory=dict)
    starved_since: float | None = None  # since when only others' origin shares were left

    # ---- what the loop tells it ---------------------------------------------------------

    def update_peer(self, peer: str, have: set[int]) -> None:
        state = self.peers.setdefault(peer, PeerState(peer))
        state.have = {i for i in have if 0 <= i < self.num_shards}
        state.joined = True

    def asks_holdings(self, peer: str) -> bool:
        """Whether a holdings refresh asks ``peer`` again: not while it is known to hold
        every shard and its fetches are not failing (its bitmap can only lose a shard, which
        a fetch it refuses ``lacks`` tells; a failing one is asked, so that a holder gone
        away is dropped). A swarm's finished downloaders and its origin are most of those
        asked late in a spread (docs/simulation.md: the holdings refresh's cost)."""
        p = self.peers.get(peer)
        return p is None or len(p.have) < self.num_shards or p.failures > 0

    def remove_peer(self, peer: str) -> None:
        """Forget a peer's holdings (its in-flight fetches report their own outcome)."""
        if peer in self.peers:
            self.peers[peer].have = set()
            self.peers[peer].joined = False

    def completed(self, shard: int, peer: str, nbytes: int, seconds: float) -> None:
        self._release(shard, peer)
        self.done.add(shard)
        p = self.peers[peer]
        rate = nbytes / max(seconds, 1e-6)
        p.rate = rate if p.rate is None else (1 - self.alpha) * p.rate + self.alpha * rate
        p.success = (1 - self.alpha) * p.success + self.alpha
        p.failures = 0
        p.busy_streak = 0
        p.fetched_bytes += nbytes

    def failed(self, shard: int, peer: str, now: float) -> None:
        """The fetch failed, stalled or was refused: the shard goes back, the peer waits."""
        self._release(shard, peer)
        p = self.peers[peer]
        p.success = (1 - self.alpha) * p.success
        p.failures += 1
        # the exponent is bounded: 2 ** 1024 is past a float (a peer failing all day)
        doubling = 2.0 ** min(p.failures - 1, 32)
        p.backoff_until = now + min(self.max_backoff, self.backoff * doubling)

    def busy(self, shard: int, peer: str, now: float, wait: float = 0.25) -> None:
        """The peer refused for now (all its upload slots taken): the shard goes back and
        the peer is asked again after ``wait`` seconds, doubled for each refusal in a row
        (at most ``max_backoff``; a fetch it serves starts again at ``wait``); no failure is
        counted. A holder busy with large shards stays busy for tens of seconds: asked
        every quarter second, it tied up a download slot for ``read_timeout / 2`` at each
        ask (97% of fetches were refused in a simulated swarm of 300 home workers)."""
        self._release(shard, peer)
        p = self.peers[peer]
        p.busy_streak += 1
        wait = min(self.max_backoff, wait * 2.0 ** min(p.busy_streak - 1, 32))
        p.backoff_until = max(p.backoff_until, now + wait)

    def lacks(self, shard: int, peer: str) -> None:
        """The peer does not hold the shard after all (its bitmap was stale)."""
        self._release(shard, peer)
        self.peers[peer].have.discard(shard)

    def corrupt(self, shard: int, peer: str) -> None:
        """The peer served bytes whose hash is not the manifest's: banned for the run."""
        self._release(shard, peer)
        p = self.peers[peer]
        p.banned = True
        p.have = set()

    def _release(self, shard: int, peer: str) -> None:
        if self.inflight.get(shard) == peer:
            del self.inflight[shard]
        p = self.peers.get(peer)
        if p is not None:
            p.inflight = max(0, p.inflight - 1)
        else:
            self.peers[peer] = PeerState(peer)

    # ---- what it decides ----------------------------------------------------------------

    @property
    def complete(self) -> bool:
        return len(self.done) == self.num_shards

    @property
    def slot_free(self) -> bool:
        """Whether fewer than ``max_inflight`` fetches are under way (``assign`` found
        nothing more to start: the holdings it knows give it no more work)."""
        return len(self.inflight) < self.max_inflight

    @property
    def banned(self) -> list[str]:
        return sorted(p.peer for p in self.peers.values() if p.banned)

    def next_wakeup(self, now: float) -> float | None:
        """When a backed-off peer becomes usable again (None: no peer is waiting)."""
        waits = [
            p.backoff_until for p in self.peers.values() if not p.banned and p.backoff_until > now
        ]
        if self.starved_since is not None and self.starved_since + self.share_patience > now:
            waits.append(self.starved_since + self.share_patience)
        return min(waits) if waits else None

    def assign(self, now: float) -> list[tuple[int, str]]:
        """New (shard, peer) fetches to start now, within the in-flight bounds."""
        out: list[tuple[int, str]] = []
        while len(self.inflight) < self.max_inflight:
            pick = self._pick(now)
            if pick is None:
                break
            shard, peer = pick
            self.inflight[shard] = peer
            self.peers[peer].inflight += 1
            out.append(pick)
        return out

    def _pick(self, now: float) -> tuple[int, str] | None:
        holders: dict[int, list[PeerState]] = {}
        taken = self.done.union(self.inflight)
        for p in self.peers.values():
            if p.banned:
                continue
            for s in p.have - taken:  # a set difference: assign runs at every wakeup
                got = holders.get(s)
                if got is None:
                    holders[s] = [p]
                else:
                    got.append(p)
        order = list(holders)
        self.rng.shuffle(order)
        order.sort(key=lambda s: len(holders[s]))  # stable: random among equally rare
        origin, per_peer = self.origin, self.per_peer
        origin_room = 1 if self._crowded() else per_peer  # from the origin (module doc)
        mine: Callable[[int], bool] | None = None  # the origin shares, when first needed
        deferred: tuple[int, list[PeerState]] | None = None  # the rarest of another's share
        for shard in order:
            held = holders[shard]
            # a holder whose last FAILING fetches failed only when nobody else has it: a
            # direct peer that stalls every fetch kept the origin and the relayed holders
            # from a downloader for good (bench/sim.py found it: docs/simulation.md)
            sound = [p for p in held if p.failures < FAILING] or held
            # a holder behind a relay only when no direct holder has it, even a busy one
            reach = [p for p in sound if not p.relayed] or sound
            live = [p for p in reach if p.backoff_until <= now]  # (banned: not holders)
            others = [p for p in live if p.peer != origin]
            pool = others or live  # the origin only when nobody else can serve this shard
            usable = [
                p for p in pool if p.inflight < (origin_room if p.peer == origin else per_peer)
            ]
            if not usable:
                continue
            if not others:
                if mine is None:
                    mine = self._share()
                if not mine(shard):
                    deferred = deferred or (shard, usable)  # another downloader's share
                    continue
            self.starved_since = None
            return shard, self._choose(usable).peer
        if deferred is None:
            return None
        if self.starved_since is None:
            self.starved_since = now
        if not self.inflight and now - self.starved_since >= self.share_patience:
            shard, usable = deferred  # idle too long: another's share rather than wait
            return shard, self._choose(usable).peer
        return None

    def _crowded(self) -> bool:
        """Whether another downloader of this version is known: a peer that answered
        holdings and still lacks a shard (it competes with us for the origin's uplink)."""
        n = self.num_shards
        return any(
            p.joined and not p.banned and p.peer != self.origin and len(p.have) < n
            for p in self.peers.values()
        )

    def _share(self) -> Callable[[int], bool]:
        """Whether a shard only the origin holds is ours to take from it (module doc)."""
        if self.me is None:
            return lambda shard: True
        group = sorted(
            {self.me}
            | {
                p.peer
                for p in self.peers.values()
                if p.joined
                and not p.banned
                and not p.relayed
                and p.failures < FAILING  # it would not serve its share to us either
                and p.peer != self.origin
            }
        )
        n, rank = len(group), group.index(self.me)
        return lambda shard: shard % n == rank

    def _choose(self, usable: list[PeerState]) -> PeerState:
        # optimism for a peer never tried, not for one whose every fetch failed or stalled:
        # it was re-tried first at each backoff's end, ahead of measured fast peers (a home
        # uplink split over four uploads stalls every shard: bench/sim.py, docs/simulation.md)
        untried = [p for p in usable if p.rate is None and p.failures == 0]
        if untried:
            return min(untried, key=lambda p: (p.inflight, self.rng.random()))
        if self.rng.random() < self.explore:
            return self.rng.choice(usable)
        return max(usable, key=lambda p: (p.score(), self.rng.random()))


def download_plan(
    num_shards: int,
    *,
    done: set[int],
    origin: str | None,
    me: str | None,
    download_slots: int,
    rng: random.Random | None = None,
) -> DownloadPlan:
    """The plan a download runs with ``download_slots`` shards in flight, at most two of
    them from any one peer (``node/shardcast/pulling.py``; ``bench/simulation`` drives the
    same plan)."""
    return DownloadPlan(
        num_shards,
        done=set(done),
        origin=origin,
        me=me,
        max_inflight=download_slots,
        per_peer=max(1, min(2, download_slots)),
        rng=rng if rng is not None else random.Random(),
    )
