"""The download plan's peer rules as they were before the simulator found three faults in
them (``node/shardcast/schedule.py`` before this change), kept to show the figures before
and after in the same bench run:

- a peer whose fetches had all failed or stalled (never measured) was still "untried" and
  taken first at each backoff's end, ahead of measured fast peers;
- such a direct peer, however often it failed, kept the origin and the relayed holders
  from a shard for good: a downloader whose only other holders were those never completed;
- a busy peer was asked again every quarter second however often it had refused, each ask
  holding a download slot in its line for ``read_timeout / 2``.

(The third fault, ``2 ** failures`` overflowing a float after 1,025 failures in a row and
ending the download, is fixed in both: the "before" figures would otherwise be a crash.)
It also takes ``per_peer`` fetches from the origin at once, as the plan did before the
origin's one-at-a-time rule (docs/simulation.md, the fifth fix).
"""

from __future__ import annotations

from node.shardcast.schedule import DownloadPlan, PeerState, download_plan


class LegacyPlan(DownloadPlan):
    def _pick(self, now: float) -> tuple[int, str] | None:
        holders: dict[int, list[PeerState]] = {}
        taken = self.done.union(self.inflight)
        for p in self.peers.values():
            if p.banned:
                continue
            for s in p.have - taken:
                holders.setdefault(s, []).append(p)
        order = list(holders)
        self.rng.shuffle(order)
        order.sort(key=lambda s: len(holders[s]))
        mine = self._share()
        deferred: tuple[int, list[PeerState]] | None = None
        for shard in order:
            reach = [p for p in holders[shard] if not p.relayed] or holders[shard]
            live = [p for p in reach if p.backoff_until <= now]
            others = [p for p in live if p.peer != self.origin]
            pool = others or live
            usable = [p for p in pool if p.inflight < self.per_peer]
            if not usable:
                continue
            if not others and not mine(shard):
                deferred = deferred or (shard, usable)
                continue
            return shard, self._choose(usable).peer
        if deferred and not self.inflight:
            shard, usable = deferred
            return shard, self._choose(usable).peer
        return None

    def busy(self, shard: int, peer: str, now: float, wait: float = 0.25) -> None:
        self._release(shard, peer)
        p = self.peers[peer]
        p.backoff_until = max(p.backoff_until, now + wait)

    def _choose(self, usable: list[PeerState]) -> PeerState:
        untried = [p for p in usable if p.rate is None]
        if untried:
            return min(untried, key=lambda p: (p.inflight, p.failures, self.rng.random()))
        if self.rng.random() < self.explore:
            return self.rng.choice(usable)
        return max(usable, key=lambda p: (p.score(), self.rng.random()))


def legacy_plan(num_shards: int, **kw: object) -> DownloadPlan:
    plan = download_plan(num_shards, **kw)  # type: ignore[arg-type]
    plan.__class__ = LegacyPlan
    return plan
