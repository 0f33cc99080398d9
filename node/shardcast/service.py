"""SHARDCAST, the service: publish, announce, find, download, verify, relay and retain
checkpoint versions over the node's libp2p runtime (its public API only).

This module is the composition root: it builds the parts, registers their protocols and
topic on the runtime, starts them, and answers the other code of the node (roles, the
admin routes). Each part is one file with one job, and they talk through constructor
arguments and public methods only:

- ``versions.py``, ``VersionBook``: what versions are known (verified manifests), held
  (the store) and in progress; retention of the newest ``async_level + 2``;
- ``serving.py``, ``ShardServer``: answers ``/intellect/weights/1.0.0`` (what we hold) and
  ``/intellect/shardcast/1.0.0`` (a shard's bytes), upload slots and pacing;
- ``pulling.py``, ``Downloads``: one download job per version: refresh of holders, DHT
  lookups, the transfer loop (``transfer.run_download`` driving ``schedule.DownloadPlan``),
  verification and resume (``store.Partial``);
- ``following.py``, ``Follower``: learns of versions (notices on the ``weights`` topic,
  polls) and decides what to download (the newest, or one asked for with ``pull``);
- ``publishing.py``, ``Publisher``: the trainer's new versions, their announcement, and
  the DHT provider records of what we hold (``providers.py``);
- ``status.py``, ``WeightsStatus``: ``GET /weights`` and the ``/status`` section;
- ``runfiles.py``, ``RunFiles``: the run's files (the manifest's model and task file) as
  SHARDCAST version ``RUN_FILES_VERSION``: the trainer's published, a joiner's pulled.

Peers caught serving a bad shard or a forged manifest go on the node's ban list
(``node/net/bans.py``, kept in the data dir), which every download consults.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import trio

from node.config import NodeConfig
from node.net.bans import load_bans, save_bans
from node.net.requests import Responder
from node.net.runtime import Node
from node.shardcast.following import Follower
from node.shardcast.publishing import Publisher
from node.shardcast.pulling import Downloads, Holders
from node.shardcast.runfiles import RunFiles
from node.shardcast.serving import ShardServer
from node.shardcast.status import WeightsStatus
from node.shardcast.store import ShardSource, WeightStore
from node.shardcast.versions import VersionBook
from protocol import ids
from protocol.shardcast import WEIGHTS_TOPIC, ShardRequest, WeightsQuery

log = logging.getLogger("intellect.shardcast")


class WeightService:
    def __init__(self, node: Node, cfg: NodeConfig) -> None:
        self.node = node
        self.cfg = cfg
        self.trainer = cfg.run.trainer_peer_id or (node.peer_id if cfg.role == "trainer" else None)
        self.follow = (
            cfg.shardcast.follow_weights
            if cfg.shardcast.follow_weights is not None
            else cfg.role != "bootstrap"
        )
        store = WeightStore(cfg.resolved_data_dir / "weights", cfg.run.id, self.trainer)
        self.book = VersionBook(
            store, run_id=cfg.run.id, trainer=self.trainer, async_level=cfg.run.async_level
        )
        data_dir = cfg.resolved_data_dir
        self.bans = load_bans(data_dir, time.time())  # those a joining node made too
        holders = Holders(self.bans, on_ban=lambda: save_bans(data_dir, self.bans, time.time()))
        self.downloads = Downloads(node, cfg, self.book, holders)
        self.follower = Follower(node, cfg, self.book, self.downloads, holders, follow=self.follow)
        self.run_files = RunFiles(node, cfg, holders, self.trainer)
        self.server = ShardServer(
            node,
            cfg,
            self.book,
            read=self.read_shard_bytes,
            run_files=self.run_files.book,
            asked=holders.saw,
        )
        self.publisher = Publisher(
            node, cfg, self.book, retain=self.downloads.retain, also=self.run_files.book
        )

    # ---- what the node's other code reads ---------------------------------------------

    @property
    def store(self) -> WeightStore:
        return self.book.store

    @property
    def keep(self) -> int:
        return self.book.keep

    @property
    def newest_known(self) -> int:
        return self.book.newest_known

    @property
    def current(self) -> int:
        """The newest complete, verified version (0: none)."""
        return self.book.current

    def model_dir(self, version: int) -> Path | None:
        """The files of a complete, verified version (a model directory); None if not held."""
        return self.book.model_dir(version)

    def keep_needed(self, needed: Callable[[], Collection[int]]) -> None:
        """Keep (and still fetch) every version ``needed()`` names, however old: the
        validator's versions of submitted work it has not judged yet (a batch it gets to
        late is judged with the weights it was made with, not left unjudged)."""
        self.book.needed = needed

    def weights_status(self) -> WeightsStatus:
        return WeightsStatus(self.book.status(), self.downloads.status(), self.server.status())

    def status(self) -> dict[str, Any]:
        """``GET /weights``."""
        return self.weights_status().view()

    def summary(self) -> dict[str, Any]:
        """The short form in the node's ``/status`` (``GET /weights`` has everything)."""
        return self.weights_status().summary()

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
            # asked by a person (``weights pull``): a download its disk failed starts now
            return {"version": await self.pull(_opt_int(args.get("version")), now=True)}

        return {
            ("GET", "/weights"): get,
            ("POST", "/weights/publish"): do_publish,
            ("POST", "/weights/pull"): do_pull,
        }

    # ---- lifecycle --------------------------------------------------------------------

    async def serve(
        self, *, task_status: trio.TaskStatus[WeightService] = trio.TASK_STATUS_IGNORED
    ) -> None:
        resume = await self.book.load()
        await self.run_files.book.load()  # a pull of them resumes when the node asks for it
        if not self.trainer:
            log.warning("no trainer_peer_id configured: weight manifests will be refused")
        self.node.add_status("weights", self.summary)
        self.node.add_status("run_files", self.run_files.status)
        self.node.add_status("bans", lambda: self.bans.view(time.time()))
        self.node.serve_requests(ids.WEIGHTS, WeightsQuery, self._on_query)
        self.node.serve_requests(
            ids.SHARDCAST,
            ShardRequest,
            self.server.on_shard,
            deadline=3600,
            per_peer=max(
                1, self.cfg.shardcast.upload_slots // 2
            ),  # one peer never holds every slot
        )
        self.node.subscribe(WEIGHTS_TOPIC, self.follower.on_notice)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.downloads.serve)
            await nursery.start(self.run_files.downloads.serve)
            for v in resume:
                log.info("resuming the download of version %d", v)
                self.downloads.start(v)
            await nursery.start(self.follower.serve)
            await nursery.start(self.publisher.serve)
            log.info(
                "shardcast up current=%d trainer=%s keep=%d",
                self.current,
                (self.trainer or "none")[-8:],
                self.keep,
            )
            task_status.started(self)
            await trio.sleep_forever()

    # ---- what the node's other code asks ----------------------------------------------

    async def publish(
        self, src: Path, *, version: int | None = None, step: int | None = None
    ) -> dict[str, Any]:
        """Sign and serve the checkpoint in ``src`` as a new version; announce it."""
        return await self.publisher.publish(src, version=version, step=step)

    async def pull(self, version: int | None = None, *, now: bool = False) -> int:
        """Start (or join) the download of ``version`` (default: the newest known); one its
        own disk failed starts again when its wait is over, or at once with ``now``."""
        return await self.follower.pull(version, now=now)

    # ---- the seams a test's malicious node overrides (tests/helpers/evil_node.py) --------------

    async def _on_query(self, req: WeightsQuery, r: Responder) -> None:
        await self.server.on_query(req, r)

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
