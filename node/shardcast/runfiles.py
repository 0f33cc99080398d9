"""The run's files over SHARDCAST: what a node needs besides the weight versions to work
for a run, from the swarm (SPEC §2, §15).

The run manifest names the model's files (configuration, tokenizer files, chat template,
the base weights: policy version 0) and, for a file task set, the task file, each by size
and BLAKE3-256 (``protocol/manifest.py``). They travel as one more SHARDCAST content of
the run, version ``RUN_FILES_VERSION`` (2^48 − 1), through the same manifest, holdings
query, shard exchange, plan, store and journal as a weight version: the trainer signs a
``WeightManifest`` of them (``model/<name>``, ``taskset/<name>``) when it starts
(``RunFiles.publish``), and every node that pulled them serves them, so a later joiner
takes shards from every holder and from the trainer (the origin) only what nobody else
has (``schedule.py``'s origin shares).

A node that joined by the manifest without a model of its own pulls them before its role
starts (``RunFiles.pull``): it asks its peers for the run-files manifest (one that is not
the trainer's bans the peer that served it), checks that its files are the terms' (names
and sizes), that the disk has room, pulls (each shard verified on arrival, journalled: a
pull stopped by Ctrl-C resumes with the shards it verified), then checks every file
against the terms' BLAKE3 before the node uses it; a version that fails is deleted, never
kept. They stay in ``<data_dir>/run-files/`` (``files_dir``) and are served from there.
Nothing here stakes: the role starts after.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from node.config import NodeConfig
from node.files import file_digest
from node.net.runtime import Node
from node.shardcast.providers import keep_finding, provide
from node.shardcast.pulling import MAX_QUERY_PEERS, Downloads, Holders, ask_holding
from node.shardcast.store import StoreError, WeightStore, publish_files, version_dir_name
from node.shardcast.versions import VersionBook
from protocol import ids
from protocol.errors import WireError
from protocol.manifest import RUN_FILES_TASKSET, RUN_FILES_VERSION, RunTerms, run_files_of
from protocol.shardcast import WeightManifest

log = logging.getLogger("intellect.shardcast")
FIND_EVERY = 1.0  # seconds between rounds of asking peers for the run-files manifest
PROGRESS_EVERY = 2.0  # seconds between progress lines
MiB = 1024 * 1024


class RunFilesError(RuntimeError):
    """The run's files cannot be had or are not the manifest's: the one line the node
    stops with (before its role starts, so before any stake)."""


def differences(m: WeightManifest, terms: RunTerms) -> list[str]:
    """One line per way the run-files manifest's files differ from the terms' (name, size)."""
    want = {name: ref.size for name, ref in run_files_of(terms)}
    have = {f.name: f.size for f in m.files}
    lines = []
    for name in sorted(set(want) | set(have)):
        if name not in have:
            lines.append(f"{name} is missing from the trainer's run files")
        elif name not in want:
            lines.append(f"{name} is not one of the run manifest's files")
        elif have[name] != want[name]:
            lines.append(f"{name} has {have[name]} bytes, the run manifest {want[name]}")
    return lines


def check_files(files: Path, terms: RunTerms) -> list[str]:
    """One line per file under ``files`` whose size or BLAKE3 is not the terms' (blocking)."""
    lines = []
    for name, ref in run_files_of(terms):
        try:
            size, blake3 = file_digest(files / name)
        except OSError as exc:
            lines.append(f"{name}: {exc.strerror or exc}")
            continue
        if (size, blake3) != (ref.size, ref.blake3):
            lines.append(
                f"{name} has BLAKE3 {blake3.hex()[:16]}… ({size} bytes), the run manifest "
                f"{ref.blake3.hex()[:16]}… ({ref.size} bytes)"
            )
    return lines


def sources(terms: RunTerms, model: Path, taskset: Path | None) -> list[tuple[str, Path]]:
    """The trainer's files of the run-files version: (name there, path here), sorted by
    name; ``model`` is its model directory, ``taskset`` its task set file."""
    out = []
    for name, ref in run_files_of(terms):
        if not name.startswith(RUN_FILES_TASKSET + "/"):
            out.append((name, model / ref.name))
        elif taskset is None:
            raise RunFilesError(f"the run's task set is the file {ref.name}: none given")
        else:
            out.append((name, taskset))
    return out


def room_line(need: int, free: int, where: Path) -> str | None:
    """The line a node stops with when ``need`` bytes do not fit in ``free`` (None: they do)."""
    if need <= free:
        return None
    return (
        f"the run's files need {need / MiB:.1f} MiB and {where} has {free / MiB:.1f} MiB free: "
        "nothing pulled, no stake locked (free space or pass --data-dir on a larger disk)"
    )


def memory_line(need: int, available: int | None) -> str | None:
    """The line a node stops with when the base weights (``need`` bytes) do not fit in the
    memory ``available`` (None: unknown, or they fit)."""
    if available is None or need <= available:
        return None
    return (
        f"the run's base weights take {need / MiB:.1f} MiB and this machine has "
        f"{available / MiB:.1f} MiB of memory available: no stake locked"
    )


def available_memory() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def weights_bytes(terms: RunTerms) -> int:
    """The bytes of the model's weight files (what loading it holds in memory at least)."""
    return sum(f.size for f in terms.model if f.name.endswith((".safetensors", ".bin", ".pt")))


def _on_disk(path: Path) -> int:
    """Bytes ``path``'s files take on disk now (a partial's sparse files: what is written)."""
    total = 0
    for p in path.rglob("*"):
        try:
            if p.is_file():
                total += p.stat().st_blocks * 512
        except OSError:
            continue
    return total


class RunFiles:
    """The run's files: this node's book of them (served beside the weight versions by
    ``ShardServer``), their download, the trainer's publishing and a joiner's pull."""

    def __init__(self, node: Node, cfg: NodeConfig, holders: Holders, trainer: str | None):
        self.node, self.cfg, self.holders, self.trainer = node, cfg, holders, trainer
        store = WeightStore(cfg.resolved_data_dir / "run-files", cfg.run.id, trainer)
        self.book = VersionBook(
            store, run_id=cfg.run.id, trainer=trainer, async_level=0, run_files=True
        )
        self.downloads = Downloads(node, cfg, self.book, holders)

    @property
    def files_dir(self) -> Path | None:
        """Where the run's files lie, once held complete (``model/``, ``taskset/``)."""
        return self.book.model_dir(RUN_FILES_VERSION)

    def status(self) -> dict[str, Any]:
        """``/status``'s ``run_files``: held or not, where, and the pull's figures."""
        job = self.downloads.status().jobs.get(str(RUN_FILES_VERSION))
        files = self.files_dir
        return {"held": files is not None, "path": str(files) if files else None, "pull": job}

    async def _drop_other_runs(self) -> None:
        """Delete a complete run-files version on disk that the book did not open: another
        run's, left by a run that changed (a new run, SPEC §2), whose directory would
        refuse this run's."""
        left = self.book.store.root / version_dir_name(RUN_FILES_VERSION)
        if self.files_dir is None and left.exists():
            log.info("deleting the run files of another run in %s", left)
            await self.book.drop(RUN_FILES_VERSION)

    # ---- the trainer ------------------------------------------------------------------

    async def publish(self, terms: RunTerms, model: Path, taskset: Path | None) -> Path:
        """Sign and serve the files ``terms`` name, from the model directory ``model`` and
        the task file ``taskset``; files published before that are still the terms' are
        kept as they are."""
        held = self.files_dir
        if held is not None:
            if not await trio.to_thread.run_sync(check_files, held, terms):
                return held
            await self.book.drop(RUN_FILES_VERSION)
        await self._drop_other_runs()
        files = sources(terms, model, taskset)
        header = self.node.header()
        try:
            source = await trio.to_thread.run_sync(
                lambda: publish_files(
                    self.book.store,
                    files,
                    identity=self.node.identity,
                    version=RUN_FILES_VERSION,
                    step=0,
                    shard_size=self.cfg.shardcast.shard_size,
                    seq=header["seq"],
                    ts_ms=header["ts_ms"],
                    where=str(model),
                )
            )
        except (StoreError, OSError) as exc:  # a full disk, a file gone since it was hashed
            raise RunFilesError(f"cannot serve the run's files: {exc}") from exc
        self.book.add_published(source)
        root = source.root / "files"
        problems = await trio.to_thread.run_sync(check_files, root, terms)
        if problems:  # the model directory changed since the manifest was signed
            await self.book.drop(RUN_FILES_VERSION)
            raise RunFilesError("the run's files changed: " + "; ".join(problems))
        m = source.manifest
        log.info(
            "serving the run's files: %d files, %d bytes, %d shards",
            len(m.files),
            m.total_size,
            m.num_shards,
        )
        return root

    # ---- a node that joined -----------------------------------------------------------

    async def pull(
        self, terms: RunTerms, report: Callable[[str], None], *, patience: float
    ) -> Path:
        """The run's files from the swarm, checked against ``terms`` (see the module
        docstring); ``report`` is given the progress lines. ``RunFilesError`` if they
        cannot be had within ``patience`` seconds, do not fit, or are not the terms'."""
        held = self.files_dir
        if held is not None:
            if not await trio.to_thread.run_sync(check_files, held, terms):
                return held
            report("the run's files held here are not the manifest's: pulling them again")
            await self.book.drop(RUN_FILES_VERSION)
        await self._drop_other_runs()
        with trio.move_on_after(patience) as waited:
            if self.book.manifest(RUN_FILES_VERSION) is None:
                await self._find_manifest(report)
        if waited.cancelled_caught:
            raise RunFilesError(
                f"no peer served the run's files within {patience:.0f} s (the trainer and the "
                "nodes that joined before serve them)"
            )
        known = self.book.manifest(RUN_FILES_VERSION)
        assert known is not None
        m = known[0]
        lines = differences(m, terms)
        if lines:
            raise RunFilesError(
                "the trainer's run files are not its manifest's: " + "; ".join(lines)
            )
        self._check_room(m)
        self.downloads.ensure(RUN_FILES_VERSION, now=True)
        await self._follow(m, report)
        root = self.files_dir
        assert root is not None
        problems = await trio.to_thread.run_sync(check_files, root, terms)
        if problems:
            await self.book.drop(RUN_FILES_VERSION)
            raise RunFilesError(
                "the run's files pulled do not match its manifest: " + "; ".join(problems)
            )
        return root

    async def _find_manifest(self, report: Callable[[str], None]) -> None:
        """Ask the peers we know, every ``FIND_EVERY`` seconds, what they hold of the run's
        files (every holder is remembered for the pull), until one served the trainer's
        signed run-files manifest, and one round more; one that serves another is banned.
        Meanwhile we say in the DHT that we pull them and look up who else does: joiners
        that start together find each other before any of them pulls, and split the
        trainer's shards between them (``schedule.py``)."""
        providers: set[str] = set()
        node, cfg, version = self.node, self.cfg, RUN_FILES_VERSION
        async with trio.open_nursery() as beside:
            beside.start_soon(provide, node, cfg, version)
            beside.start_soon(keep_finding, node, cfg, version, providers, FIND_EVERY)
            await self._rounds(report, providers)
            beside.cancel_scope.cancel()

    async def _rounds(self, report: Callable[[str], None], providers: set[str]) -> None:
        said = asked_again = False
        while True:
            me, banned = self.node.peer_id, self.holders.banned
            known = self.node.connected_peers() | set(self.node.known_peers()) | providers
            async with trio.open_nursery() as nursery:
                for peer in sorted(known - banned - {me})[:MAX_QUERY_PEERS]:
                    nursery.start_soon(self._ask, peer)
            if self.book.manifest(RUN_FILES_VERSION) is not None:
                # once more before the pull is planned, so that a peer slow to answer (or to
                # be dialled: a bootstrap peer) is not left out: a pull of a small model ends
                # in a tenth of a second, before the next holdings round (tests/test_join.py
                # once pulled from the trainer alone, its earlier joiner never asked)
                if asked_again:
                    return
                asked_again = True
                await trio.sleep(FIND_EVERY)
                continue
            if not said:
                report("waiting for a peer that serves the run's files")
                said = True
            await trio.sleep(FIND_EVERY)

    async def _ask(self, peer: str) -> None:
        try:
            with trio.fail_after(self.cfg.net.read_timeout):
                holding = await ask_holding(self.node, peer, RUN_FILES_VERSION, with_manifest=True)
        except WireError as err:
            self.node.reject(ids.WEIGHTS, peer, err)
            return
        except Exception as exc:  # not reachable, not serving: another round
            log.debug("asking %s for the run's files failed: %r", peer[-8:], exc)
            return
        if holding.version != RUN_FILES_VERSION or not holding.manifest:
            return
        try:
            self.book.accept(holding.manifest, claimed=RUN_FILES_VERSION)
        except WireError as err:
            self.holders.ban(peer, f"served a run-files manifest that fails its check: {err}")
            self.node.reject(ids.WEIGHTS, peer, err)
            log.warning("banned peer=%s: its run-files manifest fails its check: %s", peer, err)
            return
        self.holders.saw(RUN_FILES_VERSION, peer)

    def _check_room(self, m: WeightManifest) -> None:
        root = self.book.store.root
        partial = root / (".partial-" + version_dir_name(RUN_FILES_VERSION))
        need = m.total_size - (_on_disk(partial) if partial.exists() else 0)
        line = room_line(need, shutil.disk_usage(root).free, root)
        if line is not None:
            raise RunFilesError(line)

    async def _follow(self, m: WeightManifest, report: Callable[[str], None]) -> None:
        """Until the pull is complete: a progress line every ``PROGRESS_EVERY`` seconds;
        ``RunFilesError`` if it fails."""
        last = -1.0
        while True:
            job = self.downloads.status().jobs.get(str(RUN_FILES_VERSION), {})
            state = job.get("state", "downloading")
            if state == "complete" and self.files_dir is not None:
                report(_progress(job, m, done=True))
                return
            if state == "failed":
                raise RunFilesError(f"pulling the run's files failed: {job.get('error')}")
            now = trio.current_time()
            if now - last >= PROGRESS_EVERY:
                report(_progress(job, m, done=False))
                last = now
            await trio.sleep(0.2)


def _progress(job: dict[str, Any], m: WeightManifest, *, done: bool) -> str:
    peers = [p for p, v in job.get("peers", {}).items() if v.get("bytes")]
    got = job.get("done_bytes", 0)
    head = "pulled the run's files" if done else "pulling the run's files"
    return (
        f"{head}: {got / MiB:.1f} of {m.total_size / MiB:.1f} MiB "
        f"({job.get('done_shards', 0)}/{m.num_shards} shards) from {len(peers)} peers"
        + (
            f", {job.get('resumed_shards')} shards kept from before"
            if job.get("resumed_shards")
            else ""
        )
    )
