"""What this node knows of the run's weight versions: the trainer's verified manifests,
the versions held complete in the store, the downloads in progress (as shard sources),
and retention. No network here: the parts that talk to peers ask it and tell it.

A manifest is remembered only verified (the trainer's signature, this run) and inside the
retention window (newest known − ``async_level``) or still needed (``needed``: a validator's
versions of work it has still to judge); a second, different manifest for a version we know
is refused. The store keeps the newest ``async_level + 2`` versions and every needed one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from node.shardcast.store import Partial, ShardSource, WeightStore
from protocol.errors import Reason, WireError
from protocol.manifest import RUN_FILES_VERSION
from protocol.shardcast import WeightManifest, manifest_id, open_manifest

log = logging.getLogger("intellect.shardcast")


@dataclass(frozen=True)
class VersionRow:
    """One known version in ``GET /weights``."""

    version: int
    step: int
    bytes: int
    shards: int
    held: int
    complete: bool
    files: int
    path: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "step": self.step,
            "bytes": self.bytes,
            "shards": self.shards,
            "held": self.held,
            "complete": self.complete,
            "files": self.files,
            "path": self.path,
        }


@dataclass(frozen=True)
class VersionsStatus:
    trainer: str | None
    current: int
    newest_known: int
    keep: int
    held: list[int]  # complete versions, ascending
    versions: list[VersionRow]  # every known version, ascending


class VersionBook:
    """The known manifests, the store and the downloads in progress, by version."""

    def __init__(
        self,
        store: WeightStore,
        *,
        run_id: str,
        trainer: str | None,
        async_level: int,
        run_files: bool = False,
    ) -> None:
        """``run_files``: this book holds the run's files (version ``RUN_FILES_VERSION``
        only, ``runfiles.py``); any other holds weight versions, never that one."""
        self.store = store
        self.run_files = run_files
        self.run_id = run_id
        self.trainer = trainer
        self.async_level = async_level
        # one more than the window: a validator still judges work of the version just left
        self.keep = async_level + 2
        # the versions this node must keep whatever their age (set by its role): a
        # validator's versions of submitted work it has not judged yet
        self.needed: Callable[[], Collection[int]] = frozenset
        self._manifests: dict[int, tuple[WeightManifest, bytes]] = {}
        self._partials: dict[int, Partial] = {}

    # ---- what is known and held -------------------------------------------------------

    @property
    def newest_known(self) -> int:
        return max(self._manifests, default=0)

    @property
    def current(self) -> int:
        """The newest complete, verified version (0: none)."""
        return max(self.store.complete, default=0)

    @property
    def floor(self) -> int:
        """The oldest version inside the retention window."""
        return self.newest_known - self.async_level

    def outside(self, version: int) -> bool:
        """Whether ``version`` is below the retention window and not needed here."""
        return version < self.floor and version not in self.needed()

    def knows(self, version: int) -> bool:
        return version in self._manifests

    def is_complete(self, version: int) -> bool:
        return version in self.store.complete

    def complete_versions(self) -> list[int]:
        return list(self.store.complete)

    def manifest(self, version: int) -> tuple[WeightManifest, bytes] | None:
        """The verified manifest of ``version`` and its signed envelope, if known."""
        return self._manifests.get(version)

    def source(self, version: int) -> ShardSource | None:
        """Where shards of ``version`` are read from: complete, or a download in progress."""
        return self.store.complete.get(version) or self._partials.get(version)

    def model_dir(self, version: int) -> Path | None:
        """The files of a complete, verified version (a model directory); None if not held."""
        src = self.store.complete.get(version)
        return None if src is None else src.root / "files"

    # ---- learning and holding ---------------------------------------------------------

    async def load(self) -> list[int]:
        """Open the store; the versions whose partial download should be resumed."""
        partials = await trio.to_thread.run_sync(self.store.load)
        for v, src in self.store.complete.items():
            self._manifests[v] = (src.manifest, src.envelope)
        resume = []
        for v in partials:
            env = self.store.partial_manifest(v)
            try:
                m = open_manifest(env or b"", run_id=self.run_id, trainer=self.trainer)
            except WireError as err:
                log.warning("ignoring partial download of version %d: %s", v, err)
                continue
            self._manifests.setdefault(m.version, (m, env or b""))
            resume.append(m.version)
        return [v for v in resume if v not in self.store.complete]

    def accept(
        self, envelope: bytes, *, claimed: int | None = None, expect: bytes | None = None
    ) -> tuple[WeightManifest, bool]:
        """Verify a manifest (offered as version ``claimed``, with the notice's digest
        ``expect``) and remember it: the manifest and whether it is new to us. Raises
        ``WireError`` with the reason it is refused."""
        m = open_manifest(envelope, run_id=self.run_id, trainer=self.trainer)
        if (m.version == RUN_FILES_VERSION) != self.run_files:
            raise WireError(  # a genuine run-files manifest replayed as weights, or back
                Reason.MALFORMED,
                f"version {m.version} is not a "
                + ("run-files version" if self.run_files else "weight version"),
            )
        if expect is not None and manifest_id(envelope) != expect:
            raise WireError(Reason.MALFORMED, "not the manifest the notice announced")
        if claimed is not None and m.version < claimed:
            raise WireError(
                Reason.REPLAY, f"offered as version {claimed}, it is version {m.version}"
            )
        if claimed is not None and m.version != claimed:
            raise WireError(Reason.MALFORMED, f"asked for version {claimed}, got {m.version}")
        held = self._manifests.get(m.version)
        if held is not None:
            if held[1] != envelope:
                raise WireError(
                    Reason.MALFORMED, f"a second, different manifest for version {m.version}"
                )
            return m, False
        if self.outside(m.version):
            raise WireError(
                Reason.REPLAY,
                f"version {m.version} is below the retention window "
                f"({self.newest_known} - {self.async_level})",
            )
        self._manifests[m.version] = (m, envelope)
        return m, True

    def add_published(self, source: ShardSource) -> None:
        """A version this node (the trainer) just published."""
        self._manifests[source.manifest.version] = (source.manifest, source.envelope)

    async def begin(self, version: int) -> Partial:
        """Open (or resume) the download of a known version; its held shards are served."""
        m, envelope = self._manifests[version]
        partial = await trio.to_thread.run_sync(self.store.begin, m, envelope)
        self._partials[version] = partial
        return partial

    async def finish(self, partial: Partial) -> None:
        """Check the whole digest and make the version complete (``StoreError`` if not)."""
        await trio.to_thread.run_sync(self.store.finish, partial)

    async def drop(self, version: int) -> None:
        """Delete ``version`` from the store (complete or partial) and forget its manifest
        (files that are not what they should be are not kept)."""
        self._manifests.pop(version, None)
        await trio.to_thread.run_sync(self.store.drop, version)

    def end(self, version: int) -> None:
        """The download of ``version`` ended (complete or failed): serve it from the store.
        A failed one's partial is closed: its lock released, a new attempt can open it."""
        partial = self._partials.pop(version, None)
        if partial is not None:
            partial.close()

    async def retain(self, downloading: Collection[int]) -> None:
        """Delete versions beyond the newest ``keep`` or below the window; the manifests of
        versions still ``downloading`` stay known."""
        needed = frozenset(self.needed())
        dropped = await trio.to_thread.run_sync(self.store.retain, self.keep, self.floor, needed)
        for v in dropped:
            if v not in downloading:
                self._manifests.pop(v, None)
        if dropped:
            log.info("retention: deleted versions %s (keeping %d)", sorted(dropped), self.keep)

    def status(self) -> VersionsStatus:
        rows = []
        for v, (m, _env) in sorted(self._manifests.items()):
            src = self.source(v)
            complete = self.store.complete.get(v)
            rows.append(
                VersionRow(
                    version=v,
                    step=m.step,
                    bytes=m.total_size,
                    shards=m.num_shards,
                    held=len(src.held) if src else 0,
                    complete=complete is not None,
                    files=len(m.files),
                    path=str(complete.root / "files") if complete is not None else None,
                )
            )
        return VersionsStatus(
            trainer=self.trainer,
            current=self.current,
            newest_known=self.newest_known,
            keep=self.keep,
            held=sorted(self.store.complete),
            versions=rows,
        )
