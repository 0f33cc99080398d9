"""The uploads side of SHARDCAST: answer what we hold of a version and serve its shards.

- ``/intellect/weights/1.0.0`` (``WeightsQuery``): what we hold of a version (or our
  newest), with the trainer's manifest if asked;
- ``/intellect/shardcast/1.0.0`` (``ShardRequest``): one shard's bytes, from a complete
  version or from a download in progress (every holder relays), at most ``upload_slots``
  at once (a request waits ``read_timeout / 2`` for a slot, then is refused ``busy``),
  paced by ``upload_rate``. Memory: one frame per upload.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import trio
from libp2p.stream_muxer.yamux.yamux import HEADER_SIZE as YAMUX_HEADER

from node.config import NodeConfig
from node.net.host import YAMUX_FRAME
from node.net.requests import Responder
from node.net.runtime import Node
from node.shardcast.store import ShardSource
from node.shardcast.transfer import ByteBucket
from node.shardcast.versions import VersionBook
from protocol.errors import Reason, WireError
from protocol.framing import HEADER as FRAME_HEADER
from protocol.manifest import RUN_FILES_VERSION
from protocol.shardcast import (
    DATA_FRAME,
    ShardReply,
    ShardRequest,
    WeightsHolding,
    WeightsQuery,
    bitmap,
)

MIN_FRAME = 64 * 1024
# an upload frame's bytes plus our 4-byte frame length and yamux's 12-byte header fill one
# yamux frame of the node's host (node/net/host.py: YAMUX_FRAME)
UPLOAD_FRAME = min(DATA_FRAME, YAMUX_FRAME - FRAME_HEADER.size - YAMUX_HEADER)

ReadShard = Callable[[ShardSource, int, int, int], bytes]  # (source, index, offset, n)


@dataclass(frozen=True)
class UploadStatus:
    active: int  # uploads in progress now
    bytes: int  # shard bytes uploaded since start


def upload_frame(rate_Bps: float, slots: int) -> int:
    """The bytes written per frame: a yamux frame, smaller when the rate is capped so the
    ``slots`` uploads share the bucket in turns of about a quarter of a second."""
    if not rate_Bps:
        return UPLOAD_FRAME
    return int(min(UPLOAD_FRAME, max(MIN_FRAME, rate_Bps / (4 * slots))))


class ShardServer:
    """Answers ``WeightsQuery`` and ``ShardRequest`` from what ``book`` holds."""

    def __init__(
        self,
        node: Node,
        cfg: NodeConfig,
        book: VersionBook,
        *,
        read: ReadShard,
        run_files: VersionBook | None = None,
        asked: Callable[[int, str], None] | None = None,
    ) -> None:
        """``run_files``: the book of the run's files (``runfiles.py``), served as version
        ``RUN_FILES_VERSION`` beside the weight versions of ``book``. ``asked(version,
        peer)``: a peer asked what we hold of a version we are downloading ourselves (it is
        most likely pulling it too: our download asks it for its shards from then on)."""
        self.node = node
        self.asked = asked
        self.cfg = cfg
        self.book = book
        self.run_files = run_files
        self.read = read
        self._slots = trio.Semaphore(cfg.shardcast.upload_slots)
        rate = cfg.shardcast.upload_rate * 1e6
        self._bucket = ByteBucket(rate, burst=max(rate / 10, DATA_FRAME)) if rate else None
        self._frame = upload_frame(rate, cfg.shardcast.upload_slots)
        self._uploaded = 0
        self._active = 0

    def status(self) -> UploadStatus:
        return UploadStatus(active=self._active, bytes=self._uploaded)

    def book_of(self, version: int) -> VersionBook:
        """The book that holds ``version``: the run's files, or the weight versions."""
        if version == RUN_FILES_VERSION and self.run_files is not None:
            return self.run_files
        return self.book

    async def on_query(self, req: WeightsQuery, r: Responder) -> None:
        version = req.version or self.book.newest_known
        book = self.book_of(version)
        known = book.manifest(version)
        if known is None:
            await r.send(WeightsHolding(**self.node.header(), version=0, manifest=b"", have=b""))
            return
        m, envelope = known
        src = book.source(version)
        if self.asked is not None and not book.is_complete(version):
            self.asked(version, r.peer)
        await r.send(
            WeightsHolding(
                **self.node.header(),
                version=version,
                manifest=envelope if req.with_manifest else b"",
                have=bitmap(set(src.held) if src else set(), m.num_shards),
            )
        )

    async def on_shard(self, req: ShardRequest, r: Responder) -> None:
        src = self.book_of(req.version).source(req.version)
        if src is None or req.index not in src.held:
            raise WireError(Reason.NOT_FOUND, f"shard {req.index} of v{req.version} not held")
        # wait in line for a slot a while (a refusal would only bring the request back)
        acquired = False
        with trio.move_on_after(self.cfg.net.read_timeout / 2):
            await self._slots.acquire()
            acquired = True
        if not acquired:
            raise WireError(Reason.BUSY, "every upload slot is taken")
        self._active += 1
        try:
            length = src.manifest.shard_length(req.index)
            await r.send(
                ShardReply(**self.node.header(), version=req.version, index=req.index, size=length)
            )
            for offset in range(0, length, self._frame):
                n = min(self._frame, length - offset)
                data = self.read(src, req.index, offset, n)
                if self._bucket is not None:
                    await self._bucket.spend(n)
                await r.write(data, self.cfg.net.read_timeout)
                self._uploaded += n
                self.node.metrics.inc("shardcast_bytes", n, direction="out")
            self.node.metrics.inc("shardcast_uploads")
        finally:
            self._active -= 1
            self._slots.release()
