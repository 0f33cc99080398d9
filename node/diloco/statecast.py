"""Live recovery over SHARDCAST: the leader's state at an outer-step boundary as a signed
SHARDCAST version, pulled by a joiner shard by shard with SHARDCAST's own checks.

The leader (the run's ``trainer_peer_id``, the group's trust root) offers its whole state
(``node.diloco.state``: θ, momentum, AdamW state, step, data position) at each boundary as
one SHARDCAST version: a ``WeightManifest`` it signs, listing one file ``STATE_FILE``,
``version`` = outer step + 1 (versions start at 1), ``step`` = the outer step, a BLAKE3
hash per shard and one of the whole. Two protocols carry SHARDCAST's messages for it,
apart from the policy weights' own (a trainer serves those too, and a DiLoCo state is no
policy version for inference nodes to follow):

- ``DILOCO_STATE``: ``WeightsQuery`` → ``WeightsHolding`` (the version offered now; its
  signed manifest if it is the one asked; the bitmap of its shards);
- ``DILOCO_SHARD``: ``ShardRequest`` → ``ShardReply``, then the shard's bytes in raw frames.

The joiner opens the manifest as a weights download does (``open_manifest``: this run,
signed by the leader), checks that it is the state of the step asked for, then pulls the
shards through SHARDCAST's download loop (``schedule.DownloadPlan`` driving
``transfer.run_download``): every shard must hash to the manifest's value (a holder that
serves one that does not is banned for the transfer) and the whole to its digest, before
anything is loaded. The manifest is built when a joiner first asks for the boundary's state
(hashing is off the trio thread), once per boundary.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from crypto.hashing import bulk_digest
from crypto.identity import Identity
from node.net.requests import RemoteRefusal, Responder
from node.net.runtime import Node
from node.shardcast.schedule import DownloadPlan
from node.shardcast.serving import UPLOAD_FRAME
from node.shardcast.transfer import BadShard, PeerBusy, PeerLacks, Wakeup, run_download
from protocol.diloco import DILOCO_SHARD, DILOCO_STATE, STATE_FILE
from protocol.errors import Reason, WireError
from protocol.shardcast import (
    DATA_FRAME,
    ShardReply,
    ShardRequest,
    WeightFile,
    WeightManifest,
    WeightsHolding,
    WeightsQuery,
    bitmap,
    open_manifest,
    unbitmap,
)
from protocol.wire import seal

log = logging.getLogger("intellect.diloco")
POLL = 0.2  # seconds between asks while the donor has not reached the boundary
UPLOAD_SLOTS = 4
PEER_SHARE = max(1, UPLOAD_SLOTS // 2)  # of them one peer may hold (streams beyond: busy)
DOWNLOAD_SLOTS = 4

Snapshot = Callable[[], "tuple[int, bytes] | None"]  # (outer step, state bytes) offered now


class StateTransferError(Exception):
    """The donor's state could not be pulled (bad manifest, every holder banned, ...)."""


@dataclass(frozen=True)
class Offer:
    manifest: WeightManifest
    envelope: bytes  # the signed manifest
    data: bytes


@dataclass
class Pulled:
    """One state pulled over SHARDCAST, and how (``Member.join`` reports it)."""

    step: int
    data: bytes
    signer: str
    shards: int
    fetched: int  # shard bytes fetched, retries of bad shards included
    banned: list[str] = field(default_factory=list)
    via: str = "shardcast"


def build_offer(
    identity: Identity, header: dict[str, Any], step: int, data: bytes, shard_size: int
) -> Offer:
    """Sign ``data`` (our state at the start of outer ``step``) as a SHARDCAST version
    (blocking: hashes every byte; ``header`` is taken on the trio thread)."""
    hashes = b"".join(
        bulk_digest(memoryview(data)[i : i + shard_size]) for i in range(0, len(data), shard_size)
    )
    manifest = WeightManifest(
        **header,
        version=step + 1,
        step=step,
        shard_size=shard_size,
        total_size=len(data),
        digest=bulk_digest(data),
        files=[WeightFile(name=STATE_FILE, size=len(data), offset=0)],
        shard_hashes=hashes,
    )
    return Offer(manifest, seal(identity, manifest), data)


def check_manifest(envelope: bytes, *, run_id: str, leader: str, step: int) -> WeightManifest:
    """The manifest of the group's state at ``step``, verified: signed by ``leader`` for
    this run (as any weight manifest), one file ``STATE_FILE``, version ``step + 1``."""
    m = open_manifest(envelope, run_id=run_id, trainer=leader)
    if (m.version, m.step) != (step + 1, step):
        raise WireError(Reason.MALFORMED, f"state manifest v{m.version} is not step {step}'s")
    if [f.name for f in m.files] != [STATE_FILE]:
        raise WireError(Reason.MALFORMED, "a state manifest names one file, " + STATE_FILE)
    return m


class StateServer:
    """Answers ``DILOCO_STATE`` and ``DILOCO_SHARD`` from ``snapshot`` (the leader only
    offers: nobody else's manifest would pass a joiner's signature check)."""

    def __init__(self, node: Node, snapshot: Snapshot, *, offers: bool, shard_size: int) -> None:
        self.node, self.snapshot, self.offers, self.shard_size = node, snapshot, offers, shard_size
        self._offer: Offer | None = None
        self._lock = trio.Lock()
        self._slots = trio.Semaphore(UPLOAD_SLOTS)
        self.uploaded = 0  # shard bytes served

    def register(self) -> None:
        # one peer never holds every upload slot (a reader that stops holds its slot until
        # the write deadline, and may ask again at once): as SHARDCAST's own shards
        self.node.serve_requests(DILOCO_STATE, WeightsQuery, self.on_query, per_peer=PEER_SHARE)
        self.node.serve_requests(
            DILOCO_SHARD, ShardRequest, self.on_shard, deadline=3600, per_peer=PEER_SHARE
        )

    async def current(self) -> Offer | None:
        """The signed offer of the snapshot we hold now (built on first use)."""
        snap = self.snapshot() if self.offers else None
        if snap is None:
            return None
        step, data = snap
        async with self._lock:
            have = self._offer
            if have is None or have.manifest.step != step or have.data is not data:
                header = self.node.header()
                have = self._offer = await trio.to_thread.run_sync(
                    build_offer, self.node.identity, header, step, data, self.shard_size
                )
        return have

    async def on_query(self, req: WeightsQuery, r: Responder) -> None:
        offer = await self.current()
        if offer is None:
            await r.send(WeightsHolding(**self.node.header(), version=0, manifest=b"", have=b""))
            return
        m = offer.manifest
        asked = req.version in (0, m.version)
        await r.send(
            WeightsHolding(
                **self.node.header(),
                version=m.version,
                manifest=offer.envelope if asked and req.with_manifest else b"",
                have=bitmap(set(range(m.num_shards)), m.num_shards),
            )
        )

    async def on_shard(self, req: ShardRequest, r: Responder) -> None:
        offer = self._offer
        if offer is None or offer.manifest.version != req.version:
            raise WireError(Reason.NOT_FOUND, f"state v{req.version} not offered here")
        m = offer.manifest
        if req.index >= m.num_shards:
            raise WireError(Reason.NOT_FOUND, f"no shard {req.index} of v{req.version}")
        acquired = False
        with trio.move_on_after(self.node.cfg.net.read_timeout / 2):
            await self._slots.acquire()
            acquired = True
        if not acquired:
            raise WireError(Reason.BUSY, "every upload slot is taken")
        try:
            start, end = m.shard_range(req.index)
            await r.send(
                ShardReply(
                    **self.node.header(), version=m.version, index=req.index, size=end - start
                )
            )
            for at in range(start, end, UPLOAD_FRAME):
                data = self.read(offer, at, min(end, at + UPLOAD_FRAME))
                await r.write(data, self.node.cfg.net.read_timeout)
            self.uploaded += end - start
        finally:
            self._slots.release()

    def read(self, offer: Offer, start: int, end: int) -> bytes:
        """The bytes we upload (one place, so a test's malicious donor can corrupt them)."""
        return offer.data[start:end]


async def ask_manifest(node: Node, donor: str, leader: str, step: int) -> WeightsHolding | None:
    """``donor``'s holding of the state at ``step``, with the manifest, once it offers it;
    ``None`` if it is past that boundary already (the caller bounds the wait)."""
    while True:
        req = WeightsQuery(**node.header(), version=step + 1, with_manifest=True)
        try:
            reply: WeightsHolding | None = await node.request(
                donor, DILOCO_STATE, req, WeightsHolding
            )
        except RemoteRefusal:
            raise
        except Exception as exc:  # a lost stream (py-libp2p raises many types): ask again
            log.info("state query to %s failed (retrying): %r", donor[-8:], exc)
            reply = None
        if reply is not None and reply.version > step + 1:
            return None
        if reply is not None and reply.version == step + 1 and reply.manifest:
            return reply
        await trio.sleep(POLL)


async def pull_state(node: Node, donor: str, leader: str, step: int) -> Pulled | None:
    """The group's state at the start of ``step`` from ``donor`` over SHARDCAST, every shard
    and the whole verified against the leader's signed manifest; ``None`` if ``donor``
    moved past that boundary meanwhile (before we had its manifest, or during the transfer:
    it no longer holds a shard we lack). ``StateTransferError`` if it cannot be had."""
    holding = await ask_manifest(node, donor, leader, step)
    if holding is None:
        return None
    try:
        m = check_manifest(holding.manifest, run_id=node.cfg.run.id, leader=leader, step=step)
        have = unbitmap(holding.have, m.num_shards)
    except WireError as exc:
        node.reject(DILOCO_STATE, donor, exc)
        raise StateTransferError(f"{donor}'s state manifest: {exc}") from exc
    buf = bytearray(m.total_size)
    pulled = Pulled(step, b"", m.sender, m.num_shards, 0)
    # as many streams to the donor as it lets one peer hold: more are refused busy
    plan = DownloadPlan(m.num_shards, max_inflight=DOWNLOAD_SLOTS, per_peer=PEER_SHARE)
    plan.update_peer(donor, have)

    async def fetch(shard: int, peer: str) -> int:
        start, end = m.shard_range(shard)
        req = ShardRequest(**node.header(), version=m.version, index=shard)
        view = memoryview(buf)[start:end]
        try:
            async with node.open_request(peer, DILOCO_SHARD, req, ShardReply) as ex:
                rep: ShardReply = ex.reply
                if (rep.version, rep.index, rep.size) != (m.version, shard, end - start):
                    raise WireError(Reason.MALFORMED, "shard reply for another shard or size")
                got = 0
                while got < len(view):
                    piece = await ex.reader.read_frame_into(
                        view[got : got + min(DATA_FRAME, len(view) - got)],  # type: ignore[arg-type]
                        node.cfg.net.read_timeout,
                    )
                    if not piece:
                        raise WireError(Reason.MALFORMED, "empty data frame")
                    got += len(piece)
        except RemoteRefusal as refusal:
            if refusal.reason == Reason.BUSY:
                raise PeerBusy(str(refusal)) from None
            if refusal.reason == Reason.NOT_FOUND:
                raise PeerLacks(str(refusal)) from None
            raise
        pulled.fetched += len(view)
        if bulk_digest(view) != m.shard_hash(shard):
            raise BadShard(f"state shard {shard} from {peer} does not match its hash")
        return len(view)

    gone: list[int] = []
    with trio.CancelScope() as scope:

        def report(outcome: str, shard: int, peer: str, err: BaseException | None) -> None:
            if outcome == "corrupt":
                node.reject(DILOCO_SHARD, peer, WireError(Reason.BAD_SHARD, f"shard {shard}"))
                pulled.banned.append(peer)
                log.warning("banned %s: a bad state shard %d", peer[-8:], shard)
                if all(p.banned for p in plan.peers.values()):
                    scope.cancel()  # nobody left to fetch from
            elif outcome == "lacks" and not any(shard in p.have for p in plan.peers.values()):
                gone.append(shard)  # the donor moved on to the next boundary meanwhile
                scope.cancel()
            elif outcome != "completed":
                log.info("state shard %d from %s: %s %r", shard, peer[-8:], outcome, err)

        await run_download(
            plan,
            fetch,
            shard_deadline=lambda s: max(
                4 * node.cfg.net.read_timeout, m.shard_length(s) / 262_144
            ),
            wakeup=Wakeup(),
            report=report,
        )
    if gone:
        return None
    if not plan.complete:
        raise StateTransferError(f"every holder of the state at step {step} served a bad shard")
    if bulk_digest(buf) != m.digest:
        raise StateTransferError("the state's shards do not hash to the manifest's digest")
    pulled.data = bytes(buf)
    return pulled
