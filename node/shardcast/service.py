"""SHARDCAST, the service: publish, announce, find, download, verify, relay and retain
checkpoint versions over the node's libp2p runtime.

Registered on the runtime through its public API only:
- ``/intellect/weights/1.0.0`` (``WeightsQuery``): what we hold of a version (or our
  newest), with the trainer's manifest if asked;
- ``/intellect/shardcast/1.0.0`` (``ShardRequest``): one shard's bytes, from a complete
  version or from a download in progress (every holder relays), at most
  ``upload_slots`` at once (more are refused ``busy``), paced by ``upload_rate``;
- the ``weights`` announcement topic (``WeightsNotice``): a new version exists.

Following: every node but a bootstrap pulls the newest version it learns of (from a
notice, or by asking a few known peers every ``discovery_interval`` since gossip can miss),
if it is newer than its current one: the current version only moves forward. A version
inside the retention window (newest − ``async_level``) can also be pulled on request
(``pull``), e.g. by a validator that needs the weights a batch was generated with.

A download asks every candidate holder (DHT providers of the version's key, known peers,
the announcer) for its shard bitmap every ``REFRESH`` seconds, lets ``DownloadPlan`` pick
(shard, peer) pairs, verifies each shard on arrival, writes it in place and journals it
(``store.Partial``), so a restarted node resumes; complete, it checks the whole digest and
renames the version into view, provides it in the DHT, and keeps the newest
``async_level + 2`` versions. Memory is bounded by ``download_slots`` shards plus one
frame per upload.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from libp2p.stream_muxer.yamux.yamux import HEADER_SIZE as YAMUX_HEADER

from node.config import NodeConfig
from node.net.host import YAMUX_FRAME
from node.net.runtime import Node, RemoteRefusal, Responder
from node.shardcast.schedule import DownloadPlan, PeerState
from node.shardcast.store import Partial, ShardSource, StoreError, WeightStore, publish
from node.shardcast.transfer import (
    BadShard,
    ByteBucket,
    PeerBusy,
    PeerLacks,
    Wakeup,
    run_download,
)
from protocol import ids
from protocol.errors import Reason, WireError
from protocol.framing import HEADER as FRAME_HEADER
from protocol.messages import Announcement
from protocol.shardcast import (
    DATA_FRAME,
    WEIGHTS_TOPIC,
    ShardReply,
    ShardRequest,
    WeightManifest,
    WeightsHolding,
    WeightsNotice,
    WeightsQuery,
    bitmap,
    check_notice,
    encode_notice,
    manifest_id,
    open_manifest,
    unbitmap,
)

log = logging.getLogger("intellect.shardcast")
REFRESH = 1.0  # seconds between holdings refreshes during a download
PROVIDE_EVERY = 30.0
MAX_QUERY_PEERS = 16  # holders asked per refresh
POLL_PEERS = 4  # peers asked for their newest version per discovery interval
MIN_FRAME = 64 * 1024
# an upload frame's bytes plus our 4-byte frame length and yamux's 12-byte header fill one
# yamux frame of the node's host (node/net/host.py: YAMUX_FRAME)
UPLOAD_FRAME = min(DATA_FRAME, YAMUX_FRAME - FRAME_HEADER.size - YAMUX_HEADER)


@dataclass
class DownloadJob:
    version: int
    total: int
    shards: int
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    resumed_shards: int = 0
    resumed_bytes: int = 0
    fetched_bytes: int = 0
    done_bytes: int = 0
    state: str = "downloading"  # downloading, complete, failed
    error: str = ""
    plan: DownloadPlan | None = None

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
            "peers": {
                p.peer: {"bytes": p.fetched_bytes, "holds": len(p.have), "banned": p.banned}
                for p in (plan.peers.values() if plan else [])
            },
            "banned": plan.banned if plan else [],
        }


class WeightService:
    def __init__(self, node: Node, cfg: NodeConfig) -> None:
        self.node = node
        self.cfg = cfg
        self.trainer = cfg.trainer_peer_id or (node.peer_id if cfg.role == "trainer" else None)
        self.store = WeightStore(cfg.resolved_data_dir / "weights", cfg.run_id, self.trainer)
        self.follow = (
            cfg.follow_weights if cfg.follow_weights is not None else cfg.role != "bootstrap"
        )
        # one more than the window: a validator still judges work of the version just left
        self.keep = cfg.async_level + 2
        self.manifests: dict[int, tuple[WeightManifest, bytes]] = {}
        self.partials: dict[int, Partial] = {}
        self.jobs: dict[int, DownloadJob] = {}
        self.hints: dict[int, set[str]] = {}  # peers known to hold something of a version
        self.banned: set[str] = set()  # served a bad shard: never asked again in this run
        self.upload_slots = trio.Semaphore(cfg.upload_slots)
        rate = cfg.upload_rate * 1e6
        self.bucket = ByteBucket(rate, burst=max(rate / 10, DATA_FRAME)) if rate else None
        self.frame = (
            UPLOAD_FRAME
            if not rate
            else int(min(UPLOAD_FRAME, max(MIN_FRAME, rate / (4 * cfg.upload_slots))))
        )
        self.uploaded = 0
        self.uploads_active = 0
        self._learning: set[int] = set()
        self._nursery: trio.Nursery | None = None

    # ---- views ------------------------------------------------------------------------

    @property
    def newest_known(self) -> int:
        return max(self.manifests, default=0)

    @property
    def current(self) -> int:
        """The newest complete, verified version (0: none)."""
        return max(self.store.complete, default=0)

    def model_dir(self, version: int) -> Path | None:
        """The files of a complete, verified version (a model directory); None if not held."""
        src = self.store.complete.get(version)
        return None if src is None else src.root / "files"

    def _source(self, version: int) -> ShardSource | None:
        return self.store.complete.get(version) or self.partials.get(version)

    def status(self) -> dict[str, Any]:
        versions = []
        for v, (m, _env) in sorted(self.manifests.items()):
            src = self._source(v)
            versions.append(
                {
                    "version": v,
                    "step": m.step,
                    "bytes": m.total_size,
                    "shards": m.num_shards,
                    "held": len(src.held) if src else 0,
                    "complete": v in self.store.complete,
                    "files": len(m.files),
                    "path": str(self.store.complete[v].root / "files")
                    if v in self.store.complete
                    else None,
                }
            )
        return {
            "trainer": self.trainer,
            "current": self.current,
            "newest_known": self.newest_known,
            "keep": self.keep,
            "versions": versions,
            "downloads": {str(v): j.view() for v, j in self.jobs.items()},
            "uploads": {"active": self.uploads_active, "bytes": self.uploaded},
        }

    def summary(self) -> dict[str, Any]:
        """The short form in the node's ``/status`` (``GET /weights`` has everything)."""
        return {
            "current": self.current,
            "newest_known": self.newest_known,
            "held": sorted(self.store.complete),
            "downloading": {
                str(v): f"{len(j.plan.done) if j.plan else 0}/{j.shards}"
                for v, j in self.jobs.items()
                if j.state == "downloading"
            },
            "uploads_active": self.uploads_active,
            "uploaded_bytes": self.uploaded,
            "downloaded_bytes": sum(j.fetched_bytes for j in self.jobs.values()),
        }

    def admin_routes(self) -> dict[tuple[str, str], Any]:
        async def get(_args: dict[str, Any]) -> Any:
            return self.status()

        async def do_publish(args: dict[str, Any]) -> Any:
            return await self.publish(
                Path(str(args.get("dir", ""))),
                version=_opt_int(args.get("version")),
                step=_opt_int(args.get("step")),
            )

        async def do_pull(args: dict[str, Any]) -> Any:
            return {"version": await self.pull(_opt_int(args.get("version")))}

        return {
            ("GET", "/weights"): get,
            ("POST", "/weights/publish"): do_publish,
            ("POST", "/weights/pull"): do_pull,
        }

    # ---- lifecycle --------------------------------------------------------------------

    async def serve(
        self, *, task_status: trio.TaskStatus[WeightService] = trio.TASK_STATUS_IGNORED
    ) -> None:
        partials = await trio.to_thread.run_sync(self.store.load)
        for v, src in self.store.complete.items():
            self.manifests[v] = (src.manifest, src.envelope)
        resume = []
        for v in partials:
            env = self.store.partial_manifest(v)
            try:
                m = open_manifest(env or b"", run_id=self.cfg.run_id, trainer=self.trainer)
            except WireError as err:
                log.warning("ignoring partial download of version %d: %s", v, err)
                continue
            self.manifests.setdefault(m.version, (m, env or b""))
            resume.append(m.version)
        if not self.trainer:
            log.warning("no trainer_peer_id configured: weight manifests will be refused")
        self.node.add_status("weights", self.summary)
        self.node.serve_requests(ids.WEIGHTS, WeightsQuery, self._on_query)
        self.node.serve_requests(ids.SHARDCAST, ShardRequest, self._on_shard, deadline=3600)
        self.node.subscribe(WEIGHTS_TOPIC, self._on_notice)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for v in resume:
                if v not in self.store.complete:
                    log.info("resuming the download of version %d", v)
                    self._start_download(v)
            nursery.start_soon(self._poll_loop)
            nursery.start_soon(self._provide_loop)
            log.info(
                "shardcast up current=%d trainer=%s keep=%d",
                self.current,
                (self.trainer or "none")[-8:],
                self.keep,
            )
            task_status.started(self)
            await trio.sleep_forever()

    # ---- publishing -------------------------------------------------------------------

    async def publish(
        self, src: Path, *, version: int | None = None, step: int | None = None
    ) -> dict[str, Any]:
        """Sign and serve the checkpoint in ``src`` as a new version; announce it."""
        if self.trainer != self.node.peer_id:
            raise ValueError(
                f"only the run's trainer publishes weights (trainer_peer_id is "
                f"{self.trainer}, this node is {self.node.peer_id})"
            )
        version = version if version is not None else self.newest_known + 1
        if version <= self.newest_known:
            raise ValueError(f"version {version} is not newer than {self.newest_known}")
        header = self.node.header()
        try:
            source = await trio.to_thread.run_sync(
                lambda: publish(
                    self.store,
                    src,
                    identity=self.node.identity,
                    version=version,
                    step=step if step is not None else version,
                    shard_size=self.cfg.shard_size,
                    seq=header["seq"],
                    ts_ms=header["ts_ms"],
                )
            )
        except (StoreError, OSError) as exc:
            raise ValueError(str(exc)) from exc
        m = source.manifest
        self.manifests[version] = (m, source.envelope)
        self._announce(m, source.envelope)
        await self._retain()
        log.info(
            "published version=%d step=%d bytes=%d shards=%d files=%d",
            version,
            m.step,
            m.total_size,
            m.num_shards,
            len(m.files),
        )
        if self._nursery is not None:
            self._nursery.start_soon(self._provide, version)
        return {
            "version": version,
            "step": m.step,
            "bytes": m.total_size,
            "shards": m.num_shards,
            "files": len(m.files),
            "digest": m.digest.hex(),
            "path": str(source.root / "files"),
        }

    def _announce(self, m: WeightManifest, envelope: bytes) -> None:
        notice = WeightsNotice(version=m.version, step=m.step, manifest=manifest_id(envelope))
        try:
            self.node.announce(WEIGHTS_TOPIC, encode_notice(notice))
        except trio.WouldBlock:
            log.warning("announce queue full: version %d is found by polling", m.version)

    # ---- learning of versions ---------------------------------------------------------

    def _on_notice(self, msg: Announcement) -> None:
        try:
            notice = check_notice(msg.body)
        except WireError as err:
            self.node.reject("gossip-weights", msg.sender, err)
            return
        self.hints.setdefault(notice.version, set()).add(msg.sender)
        if notice.version > self.newest_known and self._nursery is not None:
            self._nursery.start_soon(self._learn, msg.sender, notice.version, notice.manifest)

    async def _learn(self, peer: str, version: int, expect: bytes | None) -> int | None:
        """Fetch the manifest a peer says is newer than ours; accept it if it is."""
        if version in self._learning:
            return None
        self._learning.add(version)
        try:
            holding = await self._query(peer, version, with_manifest=True)
            if holding.version != version or not holding.manifest:
                return None
            m = self._accept(holding.manifest, peer, claimed=version, expect=expect)
            if m is None:
                return None
            self._follow()
            return m.version
        except Exception as exc:
            log.info("learning version %d from %s failed: %r", version, peer[-8:], exc)
            return None
        finally:
            self._learning.discard(version)

    def _accept(
        self,
        envelope: bytes,
        peer: str,
        *,
        claimed: int | None = None,
        expect: bytes | None = None,
    ) -> WeightManifest | None:
        """Verify a manifest (offered as version ``claimed``, with the notice's digest
        ``expect``) and remember it; every refusal is counted with its reason."""
        try:
            m = open_manifest(envelope, run_id=self.cfg.run_id, trainer=self.trainer)
            if expect is not None and manifest_id(envelope) != expect:
                raise WireError(Reason.MALFORMED, "not the manifest the notice announced")
            if claimed is not None and m.version < claimed:
                raise WireError(
                    Reason.REPLAY, f"offered as version {claimed}, it is version {m.version}"
                )
            if claimed is not None and m.version != claimed:
                raise WireError(Reason.MALFORMED, f"asked for version {claimed}, got {m.version}")
            held = self.manifests.get(m.version)
            if held is not None:
                if held[1] != envelope:
                    raise WireError(
                        Reason.MALFORMED, f"a second, different manifest for version {m.version}"
                    )
                return m
            if m.version < self.newest_known - self.cfg.async_level:
                raise WireError(
                    Reason.REPLAY,
                    f"version {m.version} is below the retention window "
                    f"({self.newest_known} - {self.cfg.async_level})",
                )
        except WireError as err:
            self.node.reject(ids.WEIGHTS, peer, err)
            return None
        self.manifests[m.version] = (m, envelope)
        self.hints.setdefault(m.version, set()).add(peer)
        log.info("manifest accepted version=%d step=%d from=%s", m.version, m.step, peer[-8:])
        return m

    def _follow(self) -> None:
        v = self.newest_known
        if self.follow and v > self.current and v not in self.jobs:
            self._start_download(v)

    async def _poll_loop(self) -> None:
        """Gossip can miss a notice: ask a few known peers for their newest version."""
        while True:
            await trio.sleep(self.cfg.discovery_interval)
            # peers we are connected to: a poll must not dial (connections are bounded)
            peers = [p for p in self.node.reachable_peers() if p not in self.banned]
            for peer in random.sample(peers, min(POLL_PEERS, len(peers))):
                try:
                    holding = await self._query(peer, 0, with_manifest=False)
                except Exception as exc:
                    log.debug("poll of %s failed: %s", peer[-8:], exc)
                    continue
                if holding.version > self.newest_known:
                    await self._learn(peer, holding.version, None)

    async def _query(self, peer: str, version: int, *, with_manifest: bool) -> WeightsHolding:
        req = WeightsQuery(**self.node.header(), version=version, with_manifest=with_manifest)
        reply: WeightsHolding = await self.node.request(peer, ids.WEIGHTS, req, WeightsHolding)
        return reply

    async def _on_query(self, req: WeightsQuery, r: Responder) -> None:
        version = req.version or self.newest_known
        known = self.manifests.get(version)
        if known is None:
            await r.send(WeightsHolding(**self.node.header(), version=0, manifest=b"", have=b""))
            return
        m, envelope = known
        src = self._source(version)
        await r.send(
            WeightsHolding(
                **self.node.header(),
                version=version,
                manifest=envelope if req.with_manifest else b"",
                have=bitmap(set(src.held) if src else set(), m.num_shards),
            )
        )

    # ---- pulling ----------------------------------------------------------------------

    async def pull(self, version: int | None = None) -> int:
        """Start (or join) the download of ``version`` (default: the newest known)."""
        if version is None:
            await self._poll_all()
            version = self.newest_known
            if version == 0:
                raise ValueError("no version known: no peer holds a verified manifest")
        if version < self.newest_known - self.cfg.async_level:
            raise ValueError(
                f"version {version} is outside the retention window "
                f"({self.newest_known} - {self.cfg.async_level})"
            )
        if version not in self.manifests:
            for peer in self.node.known_peers():
                try:
                    holding = await self._query(peer, version, with_manifest=True)
                except Exception:
                    continue
                if holding.version == version and self._accept(
                    holding.manifest, peer, claimed=version
                ):
                    break
            else:
                raise ValueError(f"no peer has a verified manifest of version {version}")
        if version not in self.store.complete and version not in self.jobs:
            self._start_download(version)
        elif version in self.jobs and self.jobs[version].state == "failed":
            self._start_download(version)
        return version

    async def _poll_all(self) -> None:
        async with trio.open_nursery() as nursery:
            for peer in self.node.known_peers():
                nursery.start_soon(self._poll_one, peer)

    async def _poll_one(self, peer: str) -> None:
        with trio.move_on_after(self.cfg.read_timeout * 2):
            try:
                holding = await self._query(peer, 0, with_manifest=True)
            except Exception:
                return
            if holding.version and holding.manifest:
                self._accept(holding.manifest, peer)

    def _start_download(self, version: int) -> None:
        m, _env = self.manifests[version]
        self.jobs[version] = DownloadJob(version, m.total_size, m.num_shards)
        assert self._nursery is not None
        self._nursery.start_soon(self._download, version)

    async def _download(self, version: int) -> None:
        job = self.jobs[version]
        m, envelope = self.manifests[version]
        try:
            partial = await trio.to_thread.run_sync(self.store.begin, m, envelope)
        except StoreError as exc:
            job.state, job.error = "failed", str(exc)
            log.error("cannot download version %d: %s", version, exc)
            return
        self.partials[version] = partial
        job.resumed_shards = partial.resumed
        job.resumed_bytes = job.done_bytes = sum(m.shard_length(i) for i in partial.held)
        if partial.resumed:
            log.info(
                "resumed version=%d verified_shards=%d of %d (not fetched again)",
                version,
                partial.resumed,
                m.num_shards,
            )
        plan = job.plan = DownloadPlan(
            m.num_shards,
            done=set(partial.held),
            origin=m.sender,
            me=self.node.peer_id,
            max_inflight=self.cfg.download_slots,
            per_peer=max(1, min(2, self.cfg.download_slots)),
        )
        for peer in self.banned:
            plan.peers.setdefault(peer, PeerState(peer)).banned = True
        wakeup = Wakeup()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._refresh_loop, version, plan, wakeup)
                nursery.start_soon(self._provide, version)

                async def fetch(shard: int, peer: str) -> int:
                    try:
                        return await self._fetch(partial, job, shard, peer)
                    except RemoteRefusal as refusal:
                        if refusal.reason == Reason.BUSY:
                            raise PeerBusy(str(refusal)) from None
                        if refusal.reason == Reason.NOT_FOUND:
                            raise PeerLacks(str(refusal)) from None
                        raise

                await run_download(
                    plan,
                    fetch,
                    shard_deadline=self._shard_deadline(m),
                    wakeup=wakeup,
                    report=self._report(version),
                )
                nursery.cancel_scope.cancel()
            await trio.to_thread.run_sync(self.store.finish, partial)
        except StoreError as exc:
            job.state, job.error = "failed", str(exc)
            log.error("version %d failed: %s", version, exc)
            return
        finally:
            self.partials.pop(version, None)
        job.state, job.finished = "complete", time.monotonic()
        log.info(
            "version complete version=%d bytes=%d fetched=%d resumed=%d seconds=%.2f",
            version,
            m.total_size,
            job.fetched_bytes,
            job.resumed_bytes,
            time.monotonic() - job.started,
        )
        await self._retain()

    def _shard_deadline(self, m: WeightManifest) -> Any:
        """A whole shard's deadline: a peer slower than 256 kB/s counts as stalled."""
        return lambda shard: max(4 * self.cfg.read_timeout, m.shard_length(shard) / 262_144)

    def _report(self, version: int) -> Any:
        def report(outcome: str, shard: int, peer: str, err: BaseException | None) -> None:
            if outcome == "completed":
                return
            if outcome in ("busy", "lacks"):
                self.node.metrics.inc("shardcast_refusals", outcome=outcome)
                return
            if outcome == "corrupt":
                self.banned.add(peer)
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
        req = ShardRequest(**self.node.header(), version=m.version, index=shard)
        buf = bytearray(length)
        view = memoryview(buf)
        async with self.node.open_request(peer, ids.SHARDCAST, req, ShardReply) as ex:
            r: ShardReply = ex.reply
            if (r.version, r.index, r.size) != (m.version, shard, length):
                raise WireError(Reason.MALFORMED, "shard reply for another shard or size")
            got = 0
            while got < length:
                piece = await ex.reader.read_frame_into(
                    view[got : got + min(DATA_FRAME, length - got)],  # type: ignore[arg-type]
                    self.cfg.read_timeout,
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

        if not await trio.to_thread.run_sync(store):
            raise BadShard(f"shard {shard} from {peer} does not match its hash")
        job.done_bytes += length
        return length

    async def _refresh_loop(self, version: int, plan: DownloadPlan, wakeup: Wakeup) -> None:
        providers: set[str] = set()

        async def lookups() -> None:  # DHT lookups run beside, never delaying a refresh
            while True:
                providers.update(await self._find_providers(version))
                await trio.sleep(5)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(lookups)
            while True:
                candidates = (
                    (self.hints.get(version, set()) | providers | set(self.node.known_peers()))
                    - self.banned
                    - {self.node.peer_id}
                )
                known = [p for p in candidates if p in plan.peers]
                fresh = [p for p in candidates if p not in plan.peers]
                random.shuffle(fresh)
                async with trio.open_nursery() as queries:
                    for peer in (known + fresh)[:MAX_QUERY_PEERS]:
                        queries.start_soon(self._refresh_one, version, plan, peer)
                wakeup.set()
                await trio.sleep(REFRESH)

    async def _refresh_one(self, version: int, plan: DownloadPlan, peer: str) -> None:
        m = self.manifests[version][0]
        with trio.move_on_after(self.cfg.read_timeout):
            try:
                holding = await self._query(peer, version, with_manifest=False)
                if holding.version != version:
                    plan.remove_peer(peer)
                    return
                plan.update_peer(peer, unbitmap(holding.have, m.num_shards))
                self.hints.setdefault(version, set()).add(peer)
                return
            except WireError as err:
                self.node.reject(ids.WEIGHTS, peer, err)
            except Exception as exc:
                log.debug("holdings of %s failed: %s", peer[-8:], exc)
        plan.remove_peer(peer)

    async def _find_providers(self, version: int) -> set[str]:
        with trio.move_on_after(self.cfg.read_timeout):
            try:
                return await self.node.find_providers(ids.weights_key(self.cfg.run_id, version))
            except Exception as exc:
                log.debug("find_providers failed: %s", exc)
        return set()

    async def _provide(self, version: int) -> None:
        with trio.move_on_after(self.cfg.read_timeout):
            try:
                await self.node.provide(ids.weights_key(self.cfg.run_id, version))
            except Exception as exc:
                log.debug("dht provide of version %d failed: %s", version, exc)

    async def _provide_loop(self) -> None:
        while True:
            for v in list(self.store.complete):
                await self._provide(v)
            await trio.sleep(PROVIDE_EVERY)

    async def _retain(self) -> None:
        floor = self.newest_known - self.cfg.async_level
        dropped = await trio.to_thread.run_sync(self.store.retain, self.keep, floor)
        for v in dropped:
            if v not in self.jobs or self.jobs[v].state != "downloading":
                self.manifests.pop(v, None)
        if dropped:
            log.info("retention: deleted versions %s (keeping %d)", sorted(dropped), self.keep)

    # ---- serving ----------------------------------------------------------------------

    async def _on_shard(self, req: ShardRequest, r: Responder) -> None:
        src = self._source(req.version)
        if src is None or req.index not in src.held:
            raise WireError(Reason.NOT_FOUND, f"shard {req.index} of v{req.version} not held")
        # wait in line for a slot a while (a refusal would only bring the request back)
        acquired = False
        with trio.move_on_after(self.cfg.read_timeout / 2):
            await self.upload_slots.acquire()
            acquired = True
        if not acquired:
            raise WireError(Reason.BUSY, "every upload slot is taken")
        self.uploads_active += 1
        try:
            length = src.manifest.shard_length(req.index)
            await r.send(
                ShardReply(**self.node.header(), version=req.version, index=req.index, size=length)
            )
            for offset in range(0, length, self.frame):
                n = min(self.frame, length - offset)
                data = self.read_shard_bytes(src, req.index, offset, n)
                if self.bucket is not None:
                    await self.bucket.spend(n)
                await r.write(data, self.cfg.read_timeout)
                self.uploaded += n
                self.node.metrics.inc("shardcast_bytes", n, direction="out")
            self.node.metrics.inc("shardcast_uploads")
        finally:
            self.uploads_active -= 1
            self.upload_slots.release()

    def read_shard_bytes(self, src: ShardSource, index: int, offset: int, n: int) -> bytes:
        """The bytes we upload (one place, so a test's malicious node can corrupt them)."""
        return src.read(index, offset, n)


def _opt_int(value: Any) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"not an integer: {value!r}") from exc
