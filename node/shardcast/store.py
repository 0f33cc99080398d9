"""The weight store on disk: complete versions, resumable partial downloads, retention.

Layout under ``<data_dir>/weights/``::

    v00000007/manifest.sig          the trainer's signed manifest envelope
    v00000007/files/<name>          the checkpoint files, as the manifest lists them
    .partial-v00000008/manifest.sig
    .partial-v00000008/files/...    preallocated (sparse) files, shards written in place
    .partial-v00000008/done         journal: u32 big-endian shard indices, appended after
                                    each verified shard's bytes were written
    .partial-v00000008/lock         flock: one process writes a partial at a time

A version becomes visible (``vNNNNNNNN``) only complete and verified: every shard hash,
then the whole-sequence hash, then an atomic rename. A process killed at any point leaves
a partial whose journal lists only shards whose bytes were written before; on resume those
shards are read back and re-hashed locally (never fetched again), the rest are fetched.
Everything here is blocking file I/O: the service calls it through ``trio.to_thread``.

Finishing costs little beyond the last shard: the whole-sequence hash advances while shards
are written (in shard order: a shard whose turn it is is hashed from the bytes just
written, one that came ahead of its turn or was resumed is read back when its turn comes),
and each shard is flushed to disk (``fdatasync``) as it is written, so the ``fsync`` before
the rename has almost nothing left. At the end they took 0.08 s and 0.14 s of a 1.55 s
single 256 MiB pull (``bench/shardcast.py``). A shard's whole blocks are written, and read
back, past the page cache (``direct.py``): on a VM that charges each new page, the pull
had moved what the disk took through the cache, 0.62-0.92x the bare stream; since,
0.98-1.17x.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import struct
import threading
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from crypto.hashing import bulk_digest, bulk_hasher
from crypto.identity import Identity
from node.files import write_atomic
from node.shardcast.direct import DirectFiles, pwrite_all
from protocol.errors import Reason, WireError
from protocol.shardcast import MAX_FILES, WeightFile, WeightManifest, is_file_name, open_manifest
from protocol.wire import seal

MANIFEST_FILE = "manifest.sig"
JOURNAL = struct.Struct(">I")
READ_CHUNK = 1 << 20


class StoreError(RuntimeError):
    """A checkpoint that cannot be published or a store that cannot be used."""


class DiskFault(StoreError):
    """The disk refused (full, a file size limit, an I/O error): it may not next time."""


def _disk_fault(what: str, exc: OSError) -> DiskFault:
    """``exc`` as a ``DiskFault`` saying what was being done:
    ``version 3: cannot write shard 5: No space left on device``."""
    return DiskFault(f"{what}: {exc.strerror or exc}")


def version_dir_name(version: int) -> str:
    return f"v{version:08d}"


def _open_files(root: Path, manifest: WeightManifest, *, create: bool) -> list[int]:
    """A descriptor per file of ``manifest`` (created at its size if ``create``); on an
    error none is left open."""
    fds: list[int] = []
    try:
        for f in manifest.files:
            path = root / "files" / f.name
            if create:
                path.parent.mkdir(parents=True, exist_ok=True)
                fds.append(os.open(path, os.O_RDWR | os.O_CREAT, 0o644))
                if os.fstat(fds[-1]).st_size != f.size:
                    os.ftruncate(fds[-1], f.size)
            else:
                fds.append(os.open(path, os.O_RDONLY))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds


class ShardSource:
    """Reads shard bytes of one version, complete or partial (``held`` shards only).

    Reads (an upload, on the trio thread) and ``close`` (a download finishing, a retention,
    in worker threads) take turns: a descriptor closed between a read's check and its
    ``pread`` could be reused by a file opened meanwhile, and the upload would send that
    file's bytes as this shard's, for which the peer bans us."""

    def __init__(self, root: Path, manifest: WeightManifest, envelope: bytes, fds: list[int]):
        self.root = root
        self.manifest = manifest
        self.envelope = envelope
        self._fds = fds
        self._fds_lock = threading.Lock()
        self.held: set[int] = set()

    def read(self, index: int, offset: int, length: int) -> bytes:
        """``length`` bytes of shard ``index`` from ``offset`` within it."""
        start, end = self.manifest.shard_range(index)
        lo, hi = start + offset, min(start + offset + length, end)
        with self._fds_lock:
            if not self._fds:  # closed (a download that failed, a version retained) mid-upload
                raise WireError(Reason.NOT_FOUND, f"version {self.manifest.version} not held now")
            spans = self.manifest.spans(lo, hi)
            parts = [os.pread(self._fds[i], n, off) for i, off, n in spans if n]
        data = b"".join(parts)
        if len(data) != hi - lo:
            raise StoreError(f"short read of shard {index}")
        return data

    def read_shard(self, index: int) -> bytes:
        return self.read(index, 0, self.manifest.shard_length(index))

    def sync(self) -> None:
        """Flush the version's files to disk (``fsync``)."""
        with self._fds_lock:
            for fd in self._fds:
                os.fsync(fd)

    def close(self) -> None:
        """Close the files once no read is using them; a later read is refused (NOT_FOUND)."""
        with self._fds_lock:
            fds, self._fds = self._fds, []
            for fd in fds:
                os.close(fd)


class Partial(ShardSource):
    """A download in progress; ``write`` stores one verified shard durably in the journal.

    A disk that fails it (full, a file size limit, an I/O error) raises ``StoreError``, and
    the shards journalled before stay: a later ``Partial`` of the same directory resumes
    them. One that cannot be opened leaves nothing open (its lock is released)."""

    def __init__(self, root: Path, manifest: WeightManifest, envelope: bytes) -> None:
        self._journal = -1
        self._direct: DirectFiles | None = None
        self._lock = os.open(root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(self._lock)
            raise StoreError(f"{root} is being written by another process") from exc
        super().__init__(root, manifest, envelope, [])
        try:
            self._fds = _open_files(root, manifest, create=True)
            # new bytes past the page cache where the file system allows (``direct.py``)
            self._direct = DirectFiles.open([root / "files" / f.name for f in manifest.files])
            self._journal = os.open(root / "done", os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            # the whole-sequence hash over shards [0, _hashed), advanced as shards are written
            self._whole = bulk_hasher()
            self._hashed = 0
            self._whole_lock = threading.Lock()  # writes run in several threads at once
            self.resumed = self._resume()
        except BaseException:
            self.close()
            raise

    def _resume(self) -> int:
        """Re-hash the shards the journal lists; keep those that match. Returns the count."""
        raw = os.pread(self._journal, os.fstat(self._journal).st_size, 0)
        listed = {JOURNAL.unpack_from(raw, i)[0] for i in range(0, len(raw) - len(raw) % 4, 4)}
        for index in sorted(listed):
            if index < self.manifest.num_shards:
                data = self.read_shard(index)
                if self.verify(index, data):
                    self.held.add(index)
                    self._advance(index, memoryview(data))  # a resumed prefix: read once
        # rewrite the journal with exactly what was verified (drops a torn last entry)
        os.ftruncate(self._journal, 0)
        os.write(self._journal, b"".join(JOURNAL.pack(i) for i in sorted(self.held)))
        return len(self.held)

    def verify(self, index: int, data: bytes | bytearray | memoryview) -> bool:
        if len(data) != self.manifest.shard_length(index):
            return False
        return bulk_digest(data) == self.manifest.shard_hash(index)

    def write(self, index: int, data: bytes | bytearray | memoryview) -> None:
        """Write a verified shard in place and flush it to disk, record it in the journal,
        then advance the whole-sequence hash as far as the shards held allow."""
        try:
            self._write(index, data)
        except OSError as exc:
            what = f"version {self.manifest.version}: cannot write shard {index}"
            raise _disk_fault(what, exc) from exc

    def _write(self, index: int, data: bytes | bytearray | memoryview) -> None:
        start, end = self.manifest.shard_range(index)
        view = memoryview(data)
        for i, off, n in self.manifest.spans(start, end):
            f = self.manifest.files[i]
            part = view[f.offset + off - start : f.offset + off - start + n]
            if self._direct is not None:
                self._direct.write(i, self._fds[i], part, off)
            else:
                pwrite_all(self._fds[i], part, off)
            os.fdatasync(self._fds[i])  # the edges written buffered, and the file's blocks
        os.write(self._journal, JOURNAL.pack(index))
        self.held.add(index)
        self._advance(index, view)

    def _advance(self, written: int | None = None, data: memoryview | None = None) -> None:
        """Hash the held shards that follow the hashed prefix, in order: ``data`` for shard
        ``written``, any other from the files."""
        with self._whole_lock:
            while self._hashed in self.held:
                k = self._hashed
                if k == written and data is not None:
                    self._whole.update(data)
                elif not self._read_back_direct(k):
                    self._whole.update(self.read_shard(k))
                self._hashed += 1

    def _read_back_direct(self, index: int) -> bool:
        """Hash shard ``index`` read past the page cache (a buffered read of bytes written
        direct would take them a new page each); False where that is not possible."""
        if self._direct is None or not self._direct.usable:
            return False
        spans = self.manifest.spans(*self.manifest.shard_range(index))
        for k, (i, off, n) in enumerate(spans):
            if not self._direct.read_into(i, off, n, self._whole):
                if k:  # a part is in the hash already: it cannot be read again whole
                    raise StoreError(f"shard {index}: a direct read refused halfway")
                return False
        return True

    def whole_digest(self) -> bytes:
        """The whole-sequence digest (every shard must be held)."""
        if not self.complete:
            raise StoreError(f"{len(self.held)} of {self.manifest.num_shards} shards held")
        self._advance()
        return self._whole.digest()

    @property
    def complete(self) -> bool:
        return len(self.held) == self.manifest.num_shards

    def close(self) -> None:
        super().close()
        if self._direct is not None:
            self._direct.close()
        if self._journal >= 0:
            os.close(self._journal)
            self._journal = -1
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1


@dataclass
class WeightStore:
    """All versions under ``root``; the manifests it holds were verified on load."""

    root: Path
    run_id: str
    trainer: str | None
    complete: dict[int, ShardSource] = field(default_factory=dict)
    # downloads finish and retain in worker threads, several at once: one at a time
    # changes ``complete`` (two retains once dropped the same version twice: KeyError)
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def _load(self, path: Path) -> tuple[WeightManifest, bytes]:
        envelope = (path / MANIFEST_FILE).read_bytes()
        return open_manifest(envelope, run_id=self.run_id, trainer=self.trainer), envelope

    def load(self) -> list[int]:
        """Open every complete version (ignoring dirs whose manifest does not verify) and
        return the versions with a resumable partial download."""
        partials = []
        for path in sorted(self.root.iterdir()):
            name = path.name
            try:
                if name.startswith("v") and name[1:].isdigit():
                    m, env = self._load(path)
                    if m.version == int(name[1:]) and m.version not in self.complete:
                        self.complete[m.version] = ShardSource(
                            path, m, env, _open_files(path, m, create=False)
                        )
                        self.complete[m.version].held = set(range(m.num_shards))
                elif name.startswith(".partial-v") and (path / MANIFEST_FILE).exists():
                    partials.append(int(name[len(".partial-v") :]))
            except Exception:  # a damaged or foreign directory is not ours to serve
                continue
        return partials

    def partial_manifest(self, version: int) -> bytes | None:
        path = self.root / (".partial-" + version_dir_name(version)) / MANIFEST_FILE
        return path.read_bytes() if path.exists() else None

    def begin(self, manifest: WeightManifest, envelope: bytes) -> Partial:
        """Open (or resume) the partial download of ``manifest``. Under the store's lock: a
        retention in another thread would take the new directory for an abandoned partial
        until the partial holds its lock. A disk that refuses raises ``StoreError``."""
        path = self.root / (".partial-" + version_dir_name(manifest.version))
        with self.lock:
            try:
                (path / "files").mkdir(parents=True, exist_ok=True)
                manifest_path = path / MANIFEST_FILE
                if not manifest_path.exists() or manifest_path.read_bytes() != envelope:
                    if manifest_path.exists():  # another manifest for this version: start over
                        shutil.rmtree(path)
                        (path / "files").mkdir(parents=True)
                    write_atomic(manifest_path, envelope)
                return Partial(path, manifest, envelope)
            except OSError as exc:
                raise _disk_fault(
                    f"version {manifest.version}: cannot start in {path}", exc
                ) from exc

    def finish(self, partial: Partial) -> ShardSource:
        """Check the whole digest and make the version visible (atomic rename)."""
        m = partial.manifest
        if not partial.complete:
            raise StoreError(f"version {m.version}: {len(partial.held)} of {m.num_shards} shards")
        try:
            whole = partial.whole_digest()  # reads back shards written ahead of their turn
            partial.sync()  # each shard was flushed as it was written: little is left
        except OSError as exc:
            raise _disk_fault(f"version {m.version}: cannot read back or flush", exc) from exc
        if whole != m.digest:
            raise StoreError(f"version {m.version}: whole-checkpoint digest does not match")
        # from the moment its lock is released until it is renamed, the partial would look
        # abandoned to a retention in another thread (one download's end while another's
        # finishes), which deleted it under the rename: the store's lock holds that off
        with self.lock:
            partial.close()
            final = self.root / version_dir_name(m.version)
            try:
                (partial.root / "done").unlink()
                (partial.root / "lock").unlink()
                if final.exists():
                    shutil.rmtree(final)
                os.rename(partial.root, final)
                _fsync_dir(self.root)
                src = ShardSource(final, m, partial.envelope, _open_files(final, m, create=False))
            except OSError as exc:
                raise _disk_fault(
                    f"version {m.version}: cannot make {final} complete", exc
                ) from exc
            src.held = set(range(m.num_shards))
            self.complete[m.version] = src
            return src

    def drop(self, version: int) -> None:
        """Delete ``version``, complete or partial (not one a download is writing)."""
        with self.lock:
            src = self.complete.pop(version, None)
            if src is not None:
                src.close()
            for name in (version_dir_name(version), ".partial-" + version_dir_name(version)):
                shutil.rmtree(self.root / name, ignore_errors=True)

    def retain(self, keep: int, floor: int = 0, needed: Collection[int] = frozenset()) -> list[int]:
        """Delete all but the newest ``keep`` complete versions, every version below
        ``floor`` (outside the retention window), and partial downloads older than the
        oldest kept version; never a version in ``needed`` (work made with it is still to
        be judged). Returns the deleted versions. Safe to call from several threads at
        once: each version is deleted (and returned) once."""
        with self.lock:
            return self._retain(keep, floor, frozenset(needed))

    def _retain(self, keep: int, floor: int, needed: frozenset[int]) -> list[int]:
        versions = sorted(self.complete)
        drop = [
            v
            for i, v in enumerate(versions)
            if (i < len(versions) - keep or v < floor) and v not in needed
        ]
        for v in drop:
            self.complete.pop(v).close()
            shutil.rmtree(self.root / version_dir_name(v), ignore_errors=True)
        kept = [v for v in versions if v not in drop]
        if kept:
            oldest = kept[0]
            for path in self.root.glob(".partial-v*"):
                digits = path.name[len(".partial-v") :]
                if not (digits.isascii() and digits.isdigit()):
                    continue  # not a partial this store made: not ours to delete
                v = int(digits)
                if v < oldest and not _locked(path):
                    shutil.rmtree(path, ignore_errors=True)
                    drop.append(v)
        return drop


def checkpoint_files(src: Path) -> list[tuple[str, Path]]:
    """The regular files under ``src`` as (manifest name, path), sorted by name."""
    if not src.is_dir():
        raise StoreError(f"{src} is not a directory")
    out = []
    for path in sorted(src.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        name = path.relative_to(src).as_posix()
        if not is_file_name(name):
            raise StoreError(f"cannot publish {name!r}: names may use only A-Z a-z 0-9 _ . + = -")
        out.append((name, path))
    out.sort()
    if not out:
        raise StoreError(f"{src} holds no files")
    if len(out) > MAX_FILES:
        raise StoreError(f"{src} holds {len(out)} files, at most {MAX_FILES} per version")
    return out


def publish(
    store: WeightStore,
    src: Path,
    *,
    identity: Identity,
    version: int,
    step: int,
    shard_size: int,
    seq: int,
    ts_ms: int,
) -> ShardSource:
    """Copy the checkpoint in ``src`` into the store as ``version``, signed by ``identity``
    (``publish_files`` of its files)."""
    return publish_files(
        store,
        checkpoint_files(src),
        identity=identity,
        version=version,
        step=step,
        shard_size=shard_size,
        seq=seq,
        ts_ms=ts_ms,
        where=str(src),
    )


def publish_files(
    store: WeightStore,
    files: list[tuple[str, Path]],
    *,
    identity: Identity,
    version: int,
    step: int,
    shard_size: int,
    seq: int,
    ts_ms: int,
    where: str,
) -> ShardSource:
    """Copy ``files`` ((name in the version, path), sorted by name) into the store as
    ``version``, signed by ``identity``; ``where`` names them in errors.

    One pass over the bytes: they are copied into a partial directory while the shard and
    whole hashes are computed; the signed manifest is written last, then the rename."""
    work = store.root / (".publish-" + version_dir_name(version))
    shutil.rmtree(work, ignore_errors=True)
    shard_hashes: list[bytes] = []
    whole = bulk_hasher()
    shard = bulk_hasher()
    in_shard = 0
    entries = []
    offset = 0
    for name, path in files:
        dest = work / "files" / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        size = 0
        with open(path, "rb") as fin, open(dest, "wb") as fout:
            while chunk := fin.read(READ_CHUNK):
                fout.write(chunk)
                whole.update(chunk)
                size += len(chunk)
                view = memoryview(chunk)
                while view:
                    take = min(len(view), shard_size - in_shard)
                    shard.update(view[:take])
                    in_shard += take
                    view = view[take:]
                    if in_shard == shard_size:
                        shard_hashes.append(shard.digest())
                        shard, in_shard = bulk_hasher(), 0
            fout.flush()
            os.fsync(fout.fileno())
        entries.append(WeightFile(name=name, size=size, offset=offset))
        offset += size
    if in_shard:
        shard_hashes.append(shard.digest())
    if offset == 0:
        shutil.rmtree(work, ignore_errors=True)
        raise StoreError(f"{where}: every file is empty")
    manifest = WeightManifest(
        run_id=store.run_id,
        sender=identity.peer_id,
        seq=seq,
        ts_ms=ts_ms,
        version=version,
        step=step,
        shard_size=shard_size,
        total_size=offset,
        digest=whole.digest(),
        files=entries,
        shard_hashes=b"".join(shard_hashes),
    )
    envelope = seal(identity, manifest)
    write_atomic(work / MANIFEST_FILE, envelope)
    final = store.root / version_dir_name(version)
    if final.exists():
        raise StoreError(f"version {version} already exists in {store.root}")
    os.rename(work, final)
    _fsync_dir(store.root)
    source = ShardSource(final, manifest, envelope, _open_files(final, manifest, create=False))
    source.held = set(range(manifest.num_shards))
    store.complete[version] = source
    return source


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _locked(path: Path) -> bool:
    """True if another process holds the partial's lock."""
    try:
        fd = os.open(path / "lock", os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
