"""Writing a file so that its name never holds half of it."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("intellect.files")


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``<name>.tmp`` beside ``path``, flush it to disk, then rename it over
    ``path``. A write that fails (a full disk) leaves ``path`` as it was and removes the
    temporary file: half a checkpoint state must not go on taking the space it ran out of."""
    tmp = path.with_name(path.name + ".tmp")  # v3.state and v3.outer: two names, not v3.tmp
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


SAVE_RETRY_FIRST, SAVE_RETRY_MAX = 5.0, 300.0  # a write the disk refused: tried again
NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})  # what waiting can cure


async def saved(write: Callable[[Path], object], path: Path, *, what: str) -> None:
    """``write(path)`` in a worker thread, for a write that replaces ``path`` whole
    (``write_atomic``: trying it again is safe). One the disk has no room for (full, over
    quota, a file size limit: ``NO_ROOM``) is tried again after 5 s, doubling up to 300 s: a
    trainer waits for room instead of stopping (its restart would resume, but nothing
    restarts it). Any other ``OSError`` (permissions, a directory gone) is raised."""
    import trio

    delay = SAVE_RETRY_FIRST
    while True:
        try:
            await trio.to_thread.run_sync(write, path)
            return
        except OSError as exc:
            if exc.errno not in NO_ROOM:
                raise
            log.error("%s not saved: %s (saving it again in %.0f s)", what, exc, delay)
        await trio.sleep(delay)
        delay = min(2 * delay, SAVE_RETRY_MAX)


def file_digest(path: Path) -> tuple[int, bytes]:
    """(size, BLAKE3-256) of the file at ``path``, read in 4 MiB pieces."""
    from crypto.hashing import bulk_hasher

    h, size = bulk_hasher(), 0
    with open(path, "rb") as f:
        while piece := f.read(4 << 20):
            h.update(piece)
            size += len(piece)
    return size, h.digest()


def model_files(directory: Path) -> list[tuple[str, int, bytes]]:
    """(name, size, BLAKE3-256) of every top-level file of a model directory (its
    configuration, tokenizer, chat template and weights), sorted by name; hidden files and
    subdirectories are not the model's (SPEC §2)."""
    out = []
    for path in sorted(directory.iterdir()):
        if path.is_file() and not path.name.startswith("."):
            out.append((path.name, *file_digest(path)))
    return out
