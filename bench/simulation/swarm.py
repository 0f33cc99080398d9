"""SHARDCAST on simulated links, every decision made by the real code.

Each downloader runs ``node.shardcast.schedule.download_plan`` (the ``DownloadPlan`` the
node runs: rarest first, origin last, origin shares, relayed holders last, throughput
scoring with exploration, busy/failed/backoff, bans) and is driven the way
``node/shardcast/pulling.py`` and ``transfer.py`` drive it:

- **Holdings**: a download asks up to ``MAX_QUERY_PEERS`` peers for their bitmaps every
  ``REFRESH_IDLE`` seconds while a slot is free, else every ``REFRESH`` (here: on a grid of
  ``REFRESH_IDLE`` from its start, each point taken when a slot is free, every
  ``REFRESH / REFRESH_IDLE``-th always; the node restarts its wait at each refresh), the
  peers its plan knows first, then others at random (the real constants, imported), and
  not a peer the plan knows holds every shard unless its fetches fail
  (``DownloadPlan.asks_holdings``). A peer that does not know the version yet is not
  added. A refresh is simulated only when a queried peer's holdings changed (the same
  result as asking it and getting the same bitmap: ``update_peer`` with an equal set), or
  a complete holder's that went away when a fetch from it fails.
- **Fetches**: ``plan.assign(now)`` after every change (a fetch ended, holdings came, a
  backoff ran out), as ``run_download`` re-plans on its wakeup. A request reaches the
  holder after half the path's RTT; the holder serves at most ``upload_slots`` at once, the
  others wait in FIFO order (``trio.Semaphore``) up to ``read_timeout / 2`` and are then
  refused busy (``plan.busy``). A fetch past ``shard_deadline`` is cancelled
  (``plan.failed``); its bytes are wasted.
- **Rates**: an active transfer moves at ``min(up_s / uploads_s, down_r / downloads_r,
  path cap)``: the fair share of the sender's uplink (its ``ByteBucket`` serves its uploads
  in turns) and of the receiver's downlink, recomputed whenever a transfer starts or ends
  at either end; the path cap is a relay's rate and the loss-bound TCP rate
  (``links.mathis_cap``). A piece's verify-and-write time (``piece_overhead``) follows.
- Every holder serves what it has, a download in progress included.
- **Churn** (``SwarmConfig.churn``, off by default): a downloader goes offline after a
  session and comes back after a downtime (``links.Churn``: lengths, source). Offline, it
  neither serves nor downloads: its own fetches end unreported (the process is gone), each
  fetch it was serving fails at its client half an RTT later (``plan.failed``, as
  ``transfer.py`` reports a reset stream), a request that reaches it fails likewise, and the
  peers that query it drop its holdings at their next refresh (``plan.remove_peer``, as
  ``pulling.py`` does when a holdings query fails). Back, it keeps what it had stored and
  resumes as a restarted node: a new plan of the same factory with ``done`` = its shards,
  peers found afresh; the peers that know it see its holdings at their next refresh.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.simulation.events import EventLoop
from bench.simulation.links import Churn, Link, mathis_cap, relayed
from node.config import NodeConfig
from node.shardcast.pulling import MAX_QUERY_PEERS, REFRESH, REFRESH_IDLE
from node.shardcast.schedule import DownloadPlan, download_plan, shard_deadline

PlanFactory = Callable[..., DownloadPlan]
_DEFAULTS = NodeConfig()  # type: ignore[call-arg]  # the defaults of every setting


@dataclass
class SwarmConfig:
    shards: int
    shard_bytes: int
    upload_slots: int = _DEFAULTS.shardcast.upload_slots
    download_slots: int = _DEFAULTS.shardcast.download_slots
    read_timeout: float = _DEFAULTS.net.read_timeout
    refresh: float = REFRESH  # every slot busy (a multiple of refresh_idle)
    refresh_idle: float = REFRESH_IDLE  # a slot free
    query_peers: int = MAX_QUERY_PEERS
    piece_overhead: float = 0.0  # seconds a downloader spends verifying and writing a piece
    region_rtt_ms: tuple[tuple[float, ...], ...] = ((0.0,),)
    loss: float = 0.0
    relay_rate: float = 1e6
    seed: int = 0
    plan_factory: PlanFactory = download_plan
    until: float = 1e9  # give up at this simulated time
    churn: Churn | None = None  # downloaders leave and come back (module docstring)


@dataclass
class Request:
    client: int
    server: int
    shard: int
    asked: float
    rtt: float
    state: str = "travel"  # travel, queued, flowing, arriving, over
    remaining: float = 0.0
    rate: float = 0.0
    stamp: float = 0.0  # when ``remaining`` was last brought up to date
    epoch: int = 0  # bumped at every rate change: older completion events are stale
    cap: float = math.inf  # the path's own limit
    sent: float = 0.0
    life: int = 0  # the client's session when it asked (a restarted client has a new plan)


@dataclass
class SimNode:
    index: int
    peer: str
    link: Link
    have: set[int] = field(default_factory=set)
    plan: DownloadPlan | None = None
    started: bool = False
    done_at: float | None = None
    uploading: list[Request] = field(default_factory=list)
    downloading: list[Request] = field(default_factory=list)
    queue: deque[Request] = field(default_factory=deque)
    asked: list[int] = field(default_factory=list)  # the peers it queries for holdings
    dirty: set[int] = field(default_factory=set)  # queried peers whose holdings changed
    tick_due: float | None = None
    wake_due: float | None = None
    uploaded: float = 0.0
    online: bool = True
    life: int = 0  # sessions so far: churn
    outgoing: dict[int, Request] = field(default_factory=dict)  # its fetches under way


@dataclass
class SwarmResult:
    done_at: list[float | None]  # per downloader: when it held every piece (None: never)
    origin_uploaded: float  # bytes
    uploaded: float  # bytes, every node
    wasted: float  # bytes sent for fetches cancelled past their deadline
    busy: int
    stalled: int
    events: int
    total_bytes: int
    departures: int = 0  # churn: sessions that ended
    churn_failed: int = 0  # fetches that failed because a holder went offline
    # churn: (time, downloader, online) for every start, departure and return
    transitions: list[tuple[float, int, bool]] = field(default_factory=list)

    def online_spread(self, q: float) -> float:
        """The first time at which a share ``q`` of the downloaders online then held the
        whole version (inf: never); without churn, ``percentile(q)``."""
        events = sorted(
            [(t, 1, i, on) for t, i, on in self.transitions]
            + [(t, 0, i, True) for i, t in enumerate(self.done_at) if t is not None]
        )
        online: set[int] = set()
        done: set[int] = set()
        for t, kind, i, on in events:
            if kind == 0:
                done.add(i)
            elif on:
                online.add(i)
            else:
                online.discard(i)
            if online and len(online & done) >= q * len(online) - 1e-9:
                return t
        return math.inf

    def fraction_times(self) -> list[float]:
        """Completion times, sorted; a downloader that never completed counts as inf."""
        return sorted(math.inf if t is None else t for t in self.done_at)

    def percentile(self, q: float) -> float:
        times = self.fraction_times()
        k = max(0, math.ceil(q * len(times)) - 1)
        return times[k]


class Swarm:
    """One origin holding every piece at time 0, and downloaders with the given links."""

    def __init__(self, cfg: SwarmConfig, origin: Link, downloaders: list[Link]) -> None:
        self.cfg = cfg
        self.loop = EventLoop()
        self.rng = random.Random(cfg.seed)
        links = [origin, *downloaders]
        ids = sorted({f"{self.rng.getrandbits(64):016x}" for _ in range(len(links) * 2)})
        self.rng.shuffle(ids)
        self.nodes = [SimNode(i, ids[i], link) for i, link in enumerate(links)]
        self.by_peer = {n.peer: n.index for n in self.nodes}
        self.watchers: list[list[int]] = [[] for _ in self.nodes]
        origin_node = self.nodes[0]
        origin_node.have = set(range(cfg.shards))
        origin_node.started = True
        self.deadline = shard_deadline(cfg.shard_bytes, cfg.read_timeout)
        self.slot_wait = cfg.read_timeout / 2
        assert self.slot_wait < self.deadline / 2  # a queued request never meets it
        self.wasted = 0.0
        self.busy = 0
        self.stalled = 0
        self.pending = len(downloaders)
        # churn draws its own numbers: a run with churn that never fires is the same run
        self.churn_rng = random.Random(cfg.seed * 7919 + 17)
        self.departures = 0
        self.churn_failed = 0
        self.transitions: list[tuple[float, int, bool]] = []

    # ---- paths ------------------------------------------------------------------------

    def _rtt(self, a: SimNode, b: SimNode) -> float:
        m = self.cfg.region_rtt_ms
        between = m[a.link.region % len(m)][b.link.region % len(m)] / 1000
        return a.link.rtt + b.link.rtt + between

    def _cap(self, a: SimNode, b: SimNode, rtt: float) -> float:
        cap = mathis_cap(rtt, self.cfg.loss)
        if relayed(a.link, b.link):
            cap = min(cap, self.cfg.relay_rate)
        return cap

    # ---- the run ----------------------------------------------------------------------

    def run(self) -> SwarmResult:
        for n in self.nodes[1:]:
            self.loop.at(n.link.start, self._start, n.index)
        self.loop.run(until=self.cfg.until, stop=lambda: self.pending == 0)
        return SwarmResult(
            done_at=[n.done_at for n in self.nodes[1:]],
            origin_uploaded=self.nodes[0].uploaded,
            uploaded=sum(n.uploaded for n in self.nodes),
            wasted=self.wasted,
            busy=self.busy,
            stalled=self.stalled,
            events=self.loop.processed,
            total_bytes=self.cfg.shards * self.cfg.shard_bytes,
            departures=self.departures,
            churn_failed=self.churn_failed,
            transitions=[(t, i - 1, on) for t, i, on in self.transitions],
        )

    def _start(self, i: int) -> None:
        n = self.nodes[i]
        n.started = True
        self.transitions.append((self.loop.now, i, True))
        self._open_plan(n)
        self._schedule_leave(n)

    def _open_plan(self, n: SimNode) -> None:
        i = n.index
        n.plan = self.cfg.plan_factory(
            self.cfg.shards,
            done=set(n.have),
            origin=self.nodes[0].peer,
            me=n.peer,
            download_slots=self.cfg.download_slots,
            rng=random.Random(self.rng.getrandbits(64)),
        )
        n.tick_due = self.loop.now
        self._tick(i)

    # ---- holdings refresh (pulling.py: _refresh_loop) ---------------------------------

    def _tick(self, i: int) -> None:
        n = self.nodes[i]
        plan = n.plan
        if plan is None or n.done_at is not None or n.tick_due != self.loop.now:
            return
        n.tick_due = None
        k = round((self.loop.now - n.link.start) / self.cfg.refresh_idle)
        if not plan.slot_free and k % round(self.cfg.refresh / self.cfg.refresh_idle):
            self._schedule_tick(n)  # every slot busy: the refresh waits a point longer
            return
        skipped = set()  # complete holders, not asked (DownloadPlan.asks_holdings)
        for j in n.dirty:
            if not plan.asks_holdings(self.nodes[j].peer):
                skipped.add(j)
            elif self.nodes[j].online:
                plan.update_peer(self.nodes[j].peer, self.nodes[j].have)
            else:  # its holdings query failed (pulling.py: _refresh_one)
                plan.remove_peer(self.nodes[j].peer)
        n.dirty = skipped  # seen once a fetch from it fails (``_tell``)
        grow = len(n.asked) < self.cfg.query_peers
        if grow:  # known peers first, then fresh ones at random, up to MAX_QUERY_PEERS
            known = set(n.asked)
            tries = 4 * (self.cfg.query_peers - len(n.asked))
            fresh: list[int] = []
            for _ in range(tries):
                if len(n.asked) + len(fresh) >= self.cfg.query_peers:
                    break
                j = self.rng.randrange(len(self.nodes))
                if j != i and j not in known and j not in fresh:
                    fresh.append(j)
            if len(self.nodes) - 1 <= self.cfg.query_peers:
                fresh = [j for j in range(len(self.nodes)) if j != i and j not in known]
            for j in fresh:
                m = self.nodes[j]
                if not m.started or not m.online:  # it does not know the version yet,
                    continue  # or its query fails: not added
                n.asked.append(j)
                self.watchers[j].append(i)
                plan.update_peer(m.peer, m.have)
                plan.peers[m.peer].relayed = relayed(n.link, m.link)
            grow = len(n.asked) < min(self.cfg.query_peers, len(self.nodes) - 1)
        if grow:
            self._schedule_tick(n)
        self._wake(i)

    def _schedule_tick(self, n: SimNode) -> None:
        if n.tick_due is not None or n.plan is None:
            return
        start, step = n.link.start, self.cfg.refresh_idle
        k = math.floor((self.loop.now - start) / step) + 1
        while start + k * step <= self.loop.now:  # rounding: strictly later
            k += 1
        n.tick_due = start + k * step
        self.loop.at(n.tick_due, self._tick, n.index)

    def _changed(self, j: int) -> None:
        """Node ``j``'s holdings grew: the peers that query it see it at their next refresh."""
        for i in self.watchers[j]:
            w = self.nodes[i]
            if w.done_at is None:
                w.dirty.add(j)
                self._schedule_tick(w)

    # ---- the download loop (transfer.py: run_download) --------------------------------

    def _wake(self, i: int) -> None:
        n = self.nodes[i]
        plan = n.plan
        if plan is None or n.done_at is not None:
            return
        now = self.loop.now
        for shard, peer in plan.assign(now):
            self._ask(n, shard, self.by_peer[peer])
        nxt = plan.next_wakeup(now)
        if nxt is not None and (n.wake_due is None or nxt < n.wake_due or n.wake_due < now):
            n.wake_due = nxt
            self.loop.at(nxt, self._wake_timer, i, nxt)

    def _wake_timer(self, i: int, due: float) -> None:
        n = self.nodes[i]
        if n.wake_due == due:
            n.wake_due = None
        self._wake(i)

    def _ask(self, client: SimNode, shard: int, server: int) -> None:
        s = self.nodes[server]
        rtt = self._rtt(client, s)
        req = Request(client.index, server, shard, self.loop.now, rtt, life=client.life)
        client.outgoing[id(req)] = req
        req.cap = self._cap(client, s, rtt)
        req.remaining = float(self.cfg.shard_bytes)
        self.loop.at(self.loop.now + rtt / 2, self._arrive, req)
        # the deadline (from the ask) is set when the bytes start to flow: a request still
        # travelling or queued is over long before it (half an RTT, then at most
        # ``slot_wait``), and most requests end refused busy (one heap entry fewer each)

    def _arrive(self, req: Request) -> None:
        if req.state != "travel":
            return
        s = self.nodes[req.server]
        if not s.online:  # churn: nobody there, the dial fails
            req.state = "over"
            self.loop.at(self.loop.now + req.rtt / 2, self._reset, req)
        elif req.shard not in s.have:
            req.state = "over"
            self.loop.at(self.loop.now + req.rtt / 2, self._lacks, req)
        elif len(s.uploading) < self.cfg.upload_slots:
            self._begin(req)
        else:
            req.state = "queued"
            s.queue.append(req)
            self.loop.at(self.loop.now + self.slot_wait, self._slot_timeout, req)

    def _slot_timeout(self, req: Request) -> None:
        if req.state != "queued":
            return
        req.state = "over"
        self.nodes[req.server].queue.remove(req)
        self.loop.at(self.loop.now + req.rtt / 2, self._busy, req)

    def _current(self, req: Request) -> SimNode | None:
        """The client of ``req`` if it is still the session that asked (churn), done with
        ``req``; else None (the outcome reaches nobody)."""
        c = self.nodes[req.client]
        c.outgoing.pop(id(req), None)
        return c if c.online and c.life == req.life and c.plan is not None else None

    def _tell(self, req: Request, outcome: Callable[[DownloadPlan, str], None]) -> bool:
        """Hand ``req``'s outcome to its client's plan (``outcome(plan, server's peer id)``)
        and wake the client; False if the session that asked is gone (churn)."""
        c = self._current(req)
        if c is None:
            return False
        assert c.plan is not None
        outcome(c.plan, self.nodes[req.server].peer)
        if req.server in c.dirty:  # a complete holder that changed: asked again if failing
            self._schedule_tick(c)
        self._wake(c.index)
        return True

    def _busy(self, req: Request) -> None:
        if self._tell(req, lambda plan, peer: plan.busy(req.shard, peer, self.loop.now)):
            self.busy += 1

    def _lacks(self, req: Request) -> None:
        self._tell(req, lambda plan, peer: plan.lacks(req.shard, peer))

    def _cancel(self, req: Request) -> None:
        """End ``req`` where it stands: out of its server's queue, or its flow stopped (the
        bytes it moved wasted)."""
        if req.state == "queued":
            self.nodes[req.server].queue.remove(req)
        elif req.state == "flowing":
            self._end_flow(req)
            self.wasted += req.sent
        req.state = "over"

    def _deadline(self, req: Request) -> None:
        if req.state in ("over", "arriving"):
            return
        self._cancel(req)
        self.stalled += 1
        self._tell(req, lambda plan, peer: plan.failed(req.shard, peer, self.loop.now))

    # ---- flows --------------------------------------------------------------------------

    def _begin(self, req: Request) -> None:
        s, c = self.nodes[req.server], self.nodes[req.client]
        req.state = "flowing"
        req.stamp = self.loop.now
        self.loop.at(req.asked + self.deadline, self._deadline, req)
        s.uploading.append(req)
        c.downloading.append(req)
        self._rerate(s, c)

    def _rerate(self, *ends: SimNode) -> None:
        """Bring every transfer at these nodes up to date and give it its new fair share."""
        now = self.loop.now
        seen: set[int] = set()
        for node in ends:
            for req in (*node.uploading, *node.downloading):
                if id(req) in seen:
                    continue
                seen.add(id(req))
                moved = req.rate * (now - req.stamp)
                req.remaining = max(0.0, req.remaining - moved)
                req.sent += moved
                req.stamp = now
                s, c = self.nodes[req.server], self.nodes[req.client]
                req.rate = min(
                    s.link.up / len(s.uploading), c.link.down / len(c.downloading), req.cap
                )
                req.epoch += 1
                self.loop.at(now + req.remaining / req.rate, self._sent, req, req.epoch)

    def _end_flow(self, req: Request) -> None:
        s, c = self.nodes[req.server], self.nodes[req.client]
        moved = req.rate * (self.loop.now - req.stamp)
        req.sent += moved
        s.uploaded += min(req.sent, self.cfg.shard_bytes)
        s.uploading.remove(req)
        c.downloading.remove(req)
        req.epoch += 1
        self._rerate(s, c)
        while s.online and s.queue and len(s.uploading) < self.cfg.upload_slots:
            self._begin(s.queue.popleft())

    def _sent(self, req: Request, epoch: int) -> None:
        if req.epoch != epoch or req.state != "flowing":
            return
        req.state = "arriving"
        req.rate = req.rate  # the last bytes are on the wire
        self._end_flow(req)
        self.loop.at(self.loop.now + req.rtt / 2 + self.cfg.piece_overhead, self._stored, req)

    def _stored(self, req: Request) -> None:
        c = self._current(req)
        if c is None:  # churn: it left before the last bytes were written
            return
        plan = c.plan
        assert plan is not None
        now = self.loop.now
        plan.completed(
            req.shard, self.nodes[req.server].peer, self.cfg.shard_bytes, now - req.asked
        )
        req.state = "over"
        if req.shard not in c.have:
            c.have.add(req.shard)
            self._changed(c.index)
        if plan.complete and c.done_at is None:
            c.done_at = now
            self.pending -= 1
            return
        self._wake(c.index)

    # ---- churn --------------------------------------------------------------------------

    def _schedule_leave(self, n: SimNode) -> None:
        if self.cfg.churn is not None:
            after = self.cfg.churn.session(self.churn_rng)
            if math.isfinite(after):
                self.loop.at(self.loop.now + after, self._leave, n.index)

    def _leave(self, i: int) -> None:
        n = self.nodes[i]
        now = self.loop.now
        assert self.cfg.churn is not None
        n.online = False
        self.departures += 1
        self.transitions.append((now, i, False))
        for req in list(n.outgoing.values()):  # its own fetches end with it
            self._cancel(req)
        n.outgoing.clear()
        for req in [*n.uploading, *n.queue]:  # those it served fail at their clients
            if req.state == "flowing":
                self._end_flow(req)
                self.wasted += req.sent
            req.state = "over"
            self.loop.at(now + req.rtt / 2, self._reset, req)
        n.queue.clear()
        n.plan, n.tick_due, n.wake_due = None, None, None
        n.dirty.clear()
        for j in n.asked:
            self.watchers[j].remove(i)
        n.asked = []
        self._changed(i)  # its holdings vanish for the peers that query it
        after = self.cfg.churn.downtime(self.churn_rng)
        if math.isfinite(after):
            self.loop.at(now + after, self._return, i)

    def _return(self, i: int) -> None:
        """Back as a restarted node: what it stored is there, its peers are found afresh."""
        n = self.nodes[i]
        n.online = True
        n.life += 1
        self.transitions.append((self.loop.now, i, True))
        if n.done_at is None:
            self._open_plan(n)
        self._changed(i)
        self._schedule_leave(n)

    def _reset(self, req: Request) -> None:
        """A fetch from a holder that went offline fails (transfer.py: ``plan.failed``)."""
        if self._tell(req, lambda plan, peer: plan.failed(req.shard, peer, self.loop.now)):
            self.churn_failed += 1


def run_swarm(cfg: SwarmConfig, origin: Link, downloaders: list[Link]) -> SwarmResult:
    return Swarm(cfg, origin, downloaders).run()
