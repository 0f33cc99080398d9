"""The downloads side of SHARDCAST: pull a known version's shards from whoever holds them.

A download asks every candidate holder (DHT providers of the version's key, the peers
``Holders`` saw with it, known peers) for its shard bitmap every ``REFRESH_IDLE`` or
``REFRESH`` seconds (a slot free or not), lets ``DownloadPlan`` pick (shard, peer) pairs,
and runs them through ``run_download``: each shard is verified on arrival, written in place
and journalled (``store.Partial``), so a restarted node resumes. Complete, the whole digest is checked and the version renamed into
view (``VersionBook.finish``), then retention runs. A peer that served a bad shard is
banned (the node's ban list, ``node/net/bans.py``: an hour). Memory: at most ``download_slots`` shards in flight.
A download this node's disk fails (``DiskFault``: full, say) ends with that error, blames
no peer, keeps its journalled shards and starts again after ``RETRY_FIRST`` seconds,
doubling up to ``RETRY_MAX``, while the version is still wanted.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from node.config import NodeConfig
from node.net.bans import PeerBans
from node.net.requests import RemoteRefusal
from node.net.runtime import Node
from node.shardcast.providers import keep_finding, provide
from node.shardcast.schedule import DownloadPlan, PeerState, download_plan, shard_deadline
from node.shardcast.store import DiskFault, Partial, StoreError
from node.shardcast.transfer import (
    BadShard,
    LocalFault,
    PeerBusy,
    PeerLacks,
    Wakeup,
    run_download,
)
from node.shardcast.versions import VersionBook
from protocol import ids
from protocol.errors import Reason, WireError
from protocol.shardcast import (
    DATA_FRAME,
    ShardReply,
    ShardRequest,
    WeightManifest,
    WeightsHolding,
    WeightsQuery,
    unbitmap,
)

log = logging.getLogger("intellect.shardcast")
# seconds between holdings refreshes during a download: REFRESH_IDLE while one of its
# slots is free (new holdings may give it work), REFRESH while every slot is busy. Each
# refresh asks up to 16 peers, some 4 ms of processor time a request at both ends: at 1 s
# throughout, a 10-node swarm bench spent a quarter more of it (docs/simulation.md)
REFRESH_IDLE, REFRESH = 1.0, 2.0
MAX_QUERY_PEERS = 16  # holders asked per refresh
LOOKUP_EVERY = 5.0  # seconds between DHT provider lookups during a download
# a download its own disk failed (full, say) starts again after RETRY_FIRST seconds,
# doubling each time up to RETRY_MAX: the shards it verified are kept, never fetched again
RETRY_FIRST, RETRY_MAX = 5.0, 300.0


async def ask_holding(
    node: Node, peer: str, version: int, *, with_manifest: bool
) -> WeightsHolding:
    """What ``peer`` holds of ``version`` (0: its newest), with the manifest if asked."""
    req = WeightsQuery(**node.header(), version=version, with_manifest=with_manifest)
    reply: WeightsHolding = await node.request(peer, ids.WEIGHTS, req, WeightsHolding)
    return reply


class Holders:
    """Peers known to hold something of a version, and the node's ban list
    (``node/net/bans.py``: a peer that served a bad shard or a forged manifest is not asked
    again until its ban ends); ``on_ban`` is called after each ban (the service keeps the
    list on disk)."""

    def __init__(
        self, bans: PeerBans | None = None, on_ban: Callable[[], None] | None = None
    ) -> None:
        self._hints: dict[int, set[str]] = {}
        self.bans = bans if bans is not None else PeerBans()
        self.on_ban = on_ban

    def saw(self, version: int, peer: str) -> None:
        self._hints.setdefault(version, set()).add(peer)

    def of(self, version: int) -> set[str]:
        return set(self._hints.get(version, ()))

    def ban(self, peer: str, reason: str) -> None:
        self.bans.ban(peer, reason, time.time())
        if self.on_ban is not None:
            self.on_ban()

    @property
    def banned(self) -> frozenset[str]:
        return frozenset(self.bans.active(time.time()))


@dataclass
class DownloadJob:
    version: int
    total: int
    shards: int
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    ended_at: float | None = None  # Unix time of ``finished``: when, for people and benches
    resumed_shards: int = 0
    resumed_bytes: int = 0
    fetched_bytes: int = 0
    done_bytes: int = 0
    state: str = "downloading"  # downloading, complete, failed
    error: str = ""
    plan: DownloadPlan | None = None
    attempt: int = 1  # 2 and more: started again after a failure
    retry_at: float | None = None  # failed on this node's disk: when it starts again

    def view(self) -> dict[str, Any]:
        elapsed = max((self.finished or time.monotonic()) - self.started, 1e-6)
        plan = self.plan
        return {
            "version": self.version,
            "state": self.state,
            "error": self.error,
            "total_bytes": self.total,
            "done_bytes": self.done_bytes,
            "fetched_bytes": self.fetched_bytes,
            "resumed_shards": self.resumed_shards,
            "resumed_bytes": self.resumed_bytes,
            "shards": self.shards,
            "done_shards": len(plan.done) if plan else 0,
            "rate_Bps": round(self.fetched_bytes / elapsed),
            "elapsed_s": round(elapsed, 3),
            "ended_at": None if self.ended_at is None else round(self.ended_at, 3),
            "peers": {
                p.peer: {"bytes": p.fetched_bytes, "holds": len(p.have), "banned": p.banned}
                for p in (plan.peers.values() if plan else [])
            },
            "banned": plan.banned if plan else [],
            "attempt": self.attempt,
            "retry_in_s": (
                None
                if self.retry_at is None
                else round(max(0.0, self.retry_at - time.monotonic()), 1)
            ),
        }


@dataclass(frozen=True)
class DownloadsStatus:
    jobs: dict[str, dict[str, Any]]  # every download of this run by version: its view
    progress: dict[str, str]  # downloads in progress: "done/total" shards
    fetched_bytes: int  # shard bytes fetched from peers by every download


class Downloads:
    """The download jobs of this run, one per version, each in its own task."""

    def __init__(self, node: Node, cfg: NodeConfig, book: VersionBook, holders: Holders) -> None:
        self.node = node
        self.cfg = cfg
        self.book = book
        self.holders = holders
        self._jobs: dict[int, DownloadJob] = {}
        self._nursery: trio.Nursery | None = None

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await self._retry_loop()

    def has_job(self, version: int) -> bool:
        return version in self._jobs

    def downloading(self) -> set[int]:
        return {v for v, j in self._jobs.items() if j.state == "downloading"}

    def start(self, version: int) -> None:
        """Download a known version (again, if a job for it failed)."""
        known = self.book.manifest(version)
        assert known is not None and self._nursery is not None
        m = known[0]
        before = self._jobs.get(version)
        attempt = before.attempt + 1 if before is not None and before.state == "failed" else 1
        self._jobs[version] = DownloadJob(version, m.total_size, m.num_shards, attempt=attempt)
        self._nursery.start_soon(self._download, version)

    def _failed(self, job: DownloadJob, exc: StoreError) -> None:
        """End ``job`` with ``exc``; one its own disk failed starts again later."""
        job.state, job.error, job.finished = "failed", str(exc), time.monotonic()
        job.ended_at = time.time()
        if not isinstance(exc, DiskFault):
            log.error("version %d failed: %s", job.version, exc)
            return
        wait = min(RETRY_MAX, RETRY_FIRST * 2 ** (job.attempt - 1))
        job.retry_at = job.finished + wait
        log.error(
            "version %d failed: %s (again in %.0f s; its %d verified shards are kept)",
            job.version,
            exc,
            wait,
            len(job.plan.done) if job.plan else 0,
        )

    async def _retry_loop(self) -> None:
        """Start again each download its disk failed once its wait is over, if it is still
        wanted: known, not held, in the window, and no newer version held."""
        while True:
            await trio.sleep(1.0)
            now = time.monotonic()
            for version, job in list(self._jobs.items()):
                if job.state != "failed" or job.retry_at is None or job.retry_at > now:
                    continue
                job.retry_at = None
                book = self.book
                if (
                    book.manifest(version) is None
                    or book.is_complete(version)
                    or book.outside(version)
                    or book.current > version
                ):
                    continue
                log.info("downloading version %d again (attempt %d)", version, job.attempt + 1)
                self.start(version)

    def ensure(self, version: int, *, now: bool = False) -> None:
        """Download ``version`` unless it is held or downloading. One its own disk failed
        waits out its back-off (the retry loop starts it; a validator asking for the same
        weights again and again restarted it at once on a disk still full), unless ``now``
        (a person asked: ``weights pull``)."""
        job = self._jobs.get(version)
        if job is None:
            if not self.book.is_complete(version):
                self.start(version)
        elif job.state == "failed" and (now or job.retry_at is None):
            self.start(version)

    async def retain(self) -> None:
        await self.book.retain(self.downloading())

    def status(self) -> DownloadsStatus:
        return DownloadsStatus(
            jobs={str(v): j.view() for v, j in self._jobs.items()},
            progress={
                str(v): f"{len(j.plan.done) if j.plan else 0}/{j.shards}"
                for v, j in self._jobs.items()
                if j.state == "downloading"
            },
            fetched_bytes=sum(j.fetched_bytes for j in self._jobs.values()),
        )

    async def _download(self, version: int) -> None:
        job = self._jobs[version]
        try:
            partial = await self.book.begin(version)
        except StoreError as exc:
            self._failed(job, exc)
            return
        m = partial.manifest
        job.resumed_shards = partial.resumed
        job.resumed_bytes = job.done_bytes = sum(m.shard_length(i) for i in partial.held)
        if partial.resumed:
            log.info(
                "resumed version=%d verified_shards=%d of %d (not fetched again)",
                version,
                partial.resumed,
                m.num_shards,
            )
        plan = job.plan = download_plan(
            m.num_shards,
            done=set(partial.held),
            origin=m.sender,
            me=self.node.peer_id,
            download_slots=self.cfg.shardcast.download_slots,
        )
        for peer in self.holders.banned:
            plan.peers.setdefault(peer, PeerState(peer)).banned = True
        wakeup = Wakeup()
        fault: LocalFault | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._refresh_loop, m, plan, wakeup)
                nursery.start_soon(provide, self.node, self.cfg, version)

                async def fetch(shard: int, peer: str) -> int:
                    try:
                        return await self._fetch(partial, job, shard, peer)
                    except RemoteRefusal as refusal:
                        if refusal.reason == Reason.BUSY:
                            raise PeerBusy(str(refusal)) from None
                        if refusal.reason == Reason.NOT_FOUND:
                            raise PeerLacks(str(refusal)) from None
                        raise

                try:
                    await run_download(
                        plan,
                        fetch,
                        shard_deadline=self._shard_deadline(m),
                        wakeup=wakeup,
                        report=self._report(version),
                    )
                except LocalFault as exc:  # raised here, not out of the nursery (a group)
                    fault = exc
                nursery.cancel_scope.cancel()
            if fault is not None:
                assert isinstance(fault.__cause__, StoreError)
                raise fault.__cause__
            await self.book.finish(partial)
        except StoreError as exc:
            self._failed(job, exc)
            return
        finally:
            self.book.end(version)
        job.state, job.finished, job.ended_at = "complete", time.monotonic(), time.time()
        log.info(
            "version complete version=%d bytes=%d fetched=%d resumed=%d seconds=%.2f",
            version,
            m.total_size,
            job.fetched_bytes,
            job.resumed_bytes,
            time.monotonic() - job.started,
        )
        await self.retain()

    def _shard_deadline(self, m: WeightManifest) -> Callable[[int], float]:
        """A whole shard's deadline: a peer slower than 256 kB/s counts as stalled."""
        return lambda shard: shard_deadline(m.shard_length(shard), self.cfg.net.read_timeout)

    def _report(self, version: int) -> Callable[[str, int, str, BaseException | None], None]:
        def report(outcome: str, shard: int, peer: str, err: BaseException | None) -> None:
            if outcome == "completed":
                return
            if outcome in ("busy", "lacks"):
                self.node.metrics.inc("shardcast_refusals", outcome=outcome)
                return
            if outcome == "corrupt":
                self.holders.ban(peer, f"served a bad shard {shard} of version {version}")
                self.node.reject(
                    ids.SHARDCAST, peer, WireError(Reason.BAD_SHARD, f"v{version} shard {shard}")
                )
                log.warning("banned peer=%s: served a bad shard %d of v%d", peer, shard, version)
            else:
                self.node.metrics.inc("shardcast_fetch_failures", outcome=outcome)
                log.info(
                    "shard fetch %s version=%d shard=%d peer=%s: %s",
                    outcome,
                    version,
                    shard,
                    peer[-8:],
                    err,
                )

        return report

    async def _fetch(self, partial: Partial, job: DownloadJob, shard: int, peer: str) -> int:
        m = partial.manifest
        length = m.shard_length(shard)
        started = trio.current_time()
        req = ShardRequest(**self.node.header(), version=m.version, index=shard)
        buf = bytearray(length)
        view = memoryview(buf)
        await self.node.direct_path(peer)  # a hole punch under way: wait for it a little
        async with self.node.open_request(peer, ids.SHARDCAST, req, ShardReply) as ex:
            r: ShardReply = ex.reply
            if (r.version, r.index, r.size) != (m.version, shard, length):
                raise WireError(Reason.MALFORMED, "shard reply for another shard or size")
            got = 0
            while got < length:
                piece = await ex.reader.read_frame_into(
                    view[got : got + min(DATA_FRAME, length - got)],  # type: ignore[arg-type]
                    self.cfg.net.read_timeout,
                )
                if not piece:
                    raise WireError(Reason.MALFORMED, "empty data frame")
                got += len(piece)
        self.node.metrics.inc("shardcast_bytes", length, direction="in")
        job.fetched_bytes += length

        def store() -> bool:
            if not partial.verify(shard, buf):
                return False
            partial.write(shard, buf)
            return True

        try:
            stored = await trio.to_thread.run_sync(store)
        except StoreError as exc:  # this node's disk, not the peer: the download stops
            raise LocalFault(str(exc)) from exc
        if not stored:
            raise BadShard(f"shard {shard} from {peer} does not match its hash")
        job.done_bytes += length
        self.node.metrics.observe("shardcast_shard_seconds", trio.current_time() - started)
        return length

    async def _refresh_loop(self, m: WeightManifest, plan: DownloadPlan, wakeup: Wakeup) -> None:
        """Ask up to ``MAX_QUERY_PEERS`` candidate holders for their bitmaps every
        ``REFRESH_IDLE`` seconds while a download slot is free, every ``REFRESH`` while
        none is (those the plan knows first; of those, not the ones it knows hold the whole
        version: ``DownloadPlan.asks_holdings``), and wake the transfer loop."""
        providers: set[str] = set()
        async with trio.open_nursery() as nursery:  # DHT lookups beside the refreshes
            nursery.start_soon(
                keep_finding, self.node, self.cfg, m.version, providers, LOOKUP_EVERY
            )
            while True:
                candidates = (
                    (self.holders.of(m.version) | providers | set(self.node.known_peers()))
                    - self.holders.banned
                    - {self.node.peer_id}
                )
                known = [p for p in candidates if p in plan.peers]
                fresh = [p for p in candidates if p not in plan.peers]
                random.shuffle(fresh)
                async with trio.open_nursery() as queries:
                    for peer in (known + fresh)[:MAX_QUERY_PEERS]:
                        if plan.asks_holdings(peer):
                            queries.start_soon(self._refresh_one, m, plan, peer)
                        else:  # a complete holder: its path may have turned direct
                            plan.peers[peer].relayed = self.node.relayed(peer)
                wakeup.set()
                await trio.sleep(REFRESH_IDLE)
                if not plan.slot_free:
                    await trio.sleep(REFRESH - REFRESH_IDLE)

    async def _refresh_one(self, m: WeightManifest, plan: DownloadPlan, peer: str) -> None:
        with trio.move_on_after(self.cfg.net.read_timeout):
            try:
                holding = await ask_holding(self.node, peer, m.version, with_manifest=False)
                if holding.version != m.version:
                    plan.remove_peer(peer)
                    return
                plan.update_peer(peer, unbitmap(holding.have, m.num_shards))
                plan.peers[peer].relayed = self.node.relayed(peer)
                self.holders.saw(m.version, peer)
                return
            except WireError as err:
                self.node.reject(ids.WEIGHTS, peer, err)
            except Exception as exc:
                log.debug("holdings of %s failed: %s", peer[-8:], exc)
        plan.remove_peer(peer)
