"""Learning of new versions, and following them: which version to download, and when.

A version is learned from a ``WeightsNotice`` on the ``weights`` topic, or by asking a
few connected peers for their newest (gossip can miss a notice): after
``discovery_interval``, then at intervals that double while the polls find nothing gossip
had not brought already, up to ``POLL_BACKOFF`` × ``discovery_interval`` (a fixed 1 s
poll was 5 % of a validator's CPU in ``bench/loop.py``), and from ``discovery_interval``
again after a poll that found a missed version; its manifest is fetched from the peer that claims it and verified
(``VersionBook.accept``) before anything else. Every node but a bootstrap follows: it
downloads the newest version it learns of if it is newer than its current one, so the
current version only moves forward. A version inside the retention window (newest −
``async_level``) can also be pulled on request (``pull``), e.g. by a validator that needs
the weights a batch was generated with.
"""

from __future__ import annotations

import logging
import random

import trio

from node.config import NodeConfig
from node.net.runtime import Node
from node.shardcast.pulling import Downloads, Holders, ask_holding
from node.shardcast.versions import VersionBook
from protocol import ids
from protocol.errors import WireError
from protocol.messages import Announcement
from protocol.shardcast import WeightManifest, WeightsNotice, check_notice

log = logging.getLogger("intellect.shardcast")
POLL_PEERS = 4  # peers asked for their newest version per poll
POLL_BACKOFF = 8  # polls slow down to one per POLL_BACKOFF x discovery_interval at most
MAX_LEARNING = 4  # manifests fetched at once on notices (a poll finds any left out)


def next_poll(interval: float, base: float, missed: bool) -> float:
    """Seconds to the next poll after one that took ``interval``: ``base`` again when it
    found a version gossip had missed, else twice as long, up to ``POLL_BACKOFF`` x ``base``."""
    return base if missed else min(POLL_BACKOFF * base, 2 * interval)


class Follower:
    """Learns of versions from notices, polls and ``pull`` requests; starts downloads."""

    def __init__(
        self,
        node: Node,
        cfg: NodeConfig,
        book: VersionBook,
        downloads: Downloads,
        holders: Holders,
        *,
        follow: bool,
    ) -> None:
        self.node = node
        self.cfg = cfg
        self.book = book
        self.downloads = downloads
        self.holders = holders
        self.follow = follow
        self._learning: set[int] = set()
        # manifests asked for at once because of a notice: any peer may send notices, for
        # any versions, and each started its own request to the sender
        self._notice_slots = trio.Semaphore(MAX_LEARNING)
        self._nursery: trio.Nursery | None = None

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._poll_loop)
            task_status.started()
            await trio.sleep_forever()

    def on_notice(self, msg: Announcement) -> None:
        try:
            notice = check_notice(msg.body)
        except WireError as err:
            self.node.reject("gossip-weights", msg.sender, err)
            return
        self.holders.saw(notice.version, msg.sender)
        if notice.version > self.book.newest_known and self._nursery is not None:
            try:
                self._notice_slots.acquire_nowait()
            except trio.WouldBlock:  # a flood of notices: the version poll finds the rest
                self.node.metrics.inc("weights_notices_deferred")
                return
            self._nursery.start_soon(self._learn_noticed, msg.sender, notice.version, notice)

    async def _learn_noticed(self, peer: str, version: int, notice: WeightsNotice) -> None:
        try:
            await self._learn(peer, version, notice.manifest)
        finally:
            self._notice_slots.release()

    async def pull(self, version: int | None = None, *, now: bool = False) -> int:
        """Start (or join) the download of ``version`` (default: the newest known); see
        ``Downloads.ensure`` for ``now``."""
        if version is None:
            await self._poll_all()
            version = self.book.newest_known
            if version == 0:
                raise ValueError("no version known: no peer holds a verified manifest")
        if self.book.outside(version):
            raise ValueError(
                f"version {version} is outside the retention window "
                f"({self.book.newest_known} - {self.cfg.run.async_level})"
            )
        if not self.book.knows(version):
            for peer in self.node.known_peers():
                try:
                    holding = await ask_holding(self.node, peer, version, with_manifest=True)
                except Exception:
                    continue
                if holding.version == version and self._accept(
                    holding.manifest, peer, claimed=version
                ):
                    break
            else:
                raise ValueError(f"no peer has a verified manifest of version {version}")
        self.downloads.ensure(version, now=now)
        return version

    async def _learn(self, peer: str, version: int, expect: bytes | None) -> int | None:
        """Fetch the manifest a peer says is newer than ours; accept it if it is."""
        if version in self._learning:
            return None
        self._learning.add(version)
        try:
            holding = await ask_holding(self.node, peer, version, with_manifest=True)
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
        """``VersionBook.accept`` for a manifest ``peer`` sent; every refusal is counted
        with its reason."""
        try:
            m, new = self.book.accept(envelope, claimed=claimed, expect=expect)
        except WireError as err:
            self.node.reject(ids.WEIGHTS, peer, err)
            return None
        if new:
            self.holders.saw(m.version, peer)
            log.info("manifest accepted version=%d step=%d from=%s", m.version, m.step, peer[-8:])
        return m

    def _follow(self) -> None:
        v = self.book.newest_known
        if self.follow and v > self.book.current and not self.downloads.has_job(v):
            self.downloads.start(v)

    async def _poll_loop(self) -> None:
        """Gossip can miss a notice: ask a few known peers for their newest version, less
        often while gossip keeps up (``next_poll``)."""
        base = interval = self.cfg.net.discovery_interval
        while True:
            await trio.sleep(interval)
            missed = await self._poll_some()
            interval = next_poll(interval, base, missed)

    async def _poll_some(self) -> bool:
        """One poll of up to ``POLL_PEERS`` connected peers; True when one had a version
        newer than any known here (gossip missed it)."""
        missed = False
        # peers we are connected to: a poll must not dial (connections are bounded)
        connected = self.node.connected_peers()
        banned = self.holders.banned
        peers = [p for p in self.node.known_peers() if p in connected and p not in banned]
        for peer in random.sample(peers, min(POLL_PEERS, len(peers))):
            try:
                holding = await ask_holding(self.node, peer, 0, with_manifest=False)
            except Exception as exc:
                log.debug("poll of %s failed: %s", peer[-8:], exc)
                continue
            if holding.version > self.book.newest_known:
                missed = True
                await self._learn(peer, holding.version, None)
        return missed

    async def _poll_all(self) -> None:
        async with trio.open_nursery() as nursery:
            for peer in self.node.known_peers():
                nursery.start_soon(self._poll_one, peer)

    async def _poll_one(self, peer: str) -> None:
        with trio.move_on_after(self.cfg.net.read_timeout * 2):
            try:
                holding = await ask_holding(self.node, peer, 0, with_manifest=True)
            except Exception:
                return
            if holding.version and holding.manifest:
                self._accept(holding.manifest, peer)
