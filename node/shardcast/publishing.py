"""Making versions known: the trainer signs and stores a new checkpoint as a version and
announces it (a ``WeightsNotice`` on the ``weights`` topic); every node says in the DHT
which versions it holds, once when it gets one and again every ``PROVIDE_EVERY`` seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from node.config import NodeConfig
from node.net.runtime import Node
from node.shardcast.providers import provide
from node.shardcast.store import StoreError, publish
from node.shardcast.versions import VersionBook
from protocol.manifest import RUN_FILES_VERSION
from protocol.shardcast import (
    WEIGHTS_TOPIC,
    WeightManifest,
    WeightsNotice,
    encode_notice,
    manifest_id,
)

log = logging.getLogger("intellect.shardcast")
PROVIDE_EVERY = 30.0


class Publisher:
    """Publishes the trainer's checkpoints and keeps the versions we hold provided."""

    def __init__(
        self,
        node: Node,
        cfg: NodeConfig,
        book: VersionBook,
        *,
        retain: Callable[[], Awaitable[None]],
        also: VersionBook | None = None,
    ) -> None:
        """``also``: another book whose versions are provided too (the run's files)."""
        self.node = node
        self.cfg = cfg
        self.book = book
        self.also = also
        self.retain = retain
        self._nursery: trio.Nursery | None = None

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._provide_loop)
            task_status.started()
            await trio.sleep_forever()

    async def publish(
        self, src: Path, *, version: int | None = None, step: int | None = None
    ) -> dict[str, Any]:
        """Sign and serve the checkpoint in ``src`` as a new version; announce it."""
        trainer = self.book.trainer
        if trainer != self.node.peer_id:
            raise ValueError(
                f"only the run's trainer publishes weights (trainer_peer_id is "
                f"{trainer}, this node is {self.node.peer_id})"
            )
        newest = self.book.newest_known
        version = version if version is not None else newest + 1
        if version <= newest:
            raise ValueError(f"version {version} is not newer than {newest}")
        if version >= RUN_FILES_VERSION:
            raise ValueError(f"version {version} names the run's files, not weights")
        header = self.node.header()
        try:
            source = await trio.to_thread.run_sync(
                lambda: publish(
                    self.book.store,
                    src,
                    identity=self.node.identity,
                    version=version,
                    step=step if step is not None else version,
                    shard_size=self.cfg.shardcast.shard_size,
                    seq=header["seq"],
                    ts_ms=header["ts_ms"],
                )
            )
        except (StoreError, OSError) as exc:
            raise ValueError(str(exc)) from exc
        m = source.manifest
        self.book.add_published(source)
        self._announce(m, source.envelope)
        await self.retain()
        log.info(
            "published version=%d step=%d bytes=%d shards=%d files=%d",
            version,
            m.step,
            m.total_size,
            m.num_shards,
            len(m.files),
        )
        if self._nursery is not None:
            self._nursery.start_soon(provide, self.node, self.cfg, version)
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

    async def _provide_loop(self) -> None:
        while True:
            held = self.book.complete_versions()
            held += self.also.complete_versions() if self.also is not None else []
            for v in held:
                await provide(self.node, self.cfg, v)
            await trio.sleep(PROVIDE_EVERY)
