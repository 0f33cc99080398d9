"""A download's shard bytes written and read back past the page cache (``O_DIRECT``).

A downloader writes every byte of a version once and, until the version is complete, reads
back only the shards that arrived ahead of their turn in the whole-sequence hash. Through
the page cache each new byte first costs the kernel a new page, and on a VM whose free
memory goes back to the host (``virtio_balloon``) that is 3-4 s of CPU per GB: the pull
moved about what the disk took (190-270 MB/s) while the stream moved 290-330. Past the page
cache the same 256 MiB went at 1.7-1.9 GB/s for 0.02 s of CPU (docs/benchmarks.md).

``O_DIRECT`` wants the buffer's address, the file offset and the length aligned to the
device's block (``ALIGN`` covers 512 and 4096): a span's aligned middle is copied into a
page-aligned buffer the thread keeps and written direct; its unaligned head and tail (a
file that does not start on a block, as the checkpoint's second file) go through the page
cache, on the other descriptor, as before. No page is written both ways: the edges are the
partial pages, the middle the whole ones. A file system that refuses ``O_DIRECT`` (at open
or at the first write) gets the page cache for everything, as before.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ALIGN = 4096
REFUSED = (errno.EINVAL, errno.EOPNOTSUPP)  # what a file system without O_DIRECT answers


def pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (``pwrite`` may write less than asked)."""
    done = 0
    while done < len(data):
        wrote = os.pwrite(fd, data[done:], offset + done)
        if wrote <= 0:
            raise OSError(errno.EIO, f"wrote {wrote} bytes")
        done += wrote


def _up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _down(n: int) -> int:
    return n // ALIGN * ALIGN


class DirectFiles:
    """``O_DIRECT`` descriptors of a download's files, beside its buffered ones."""

    def __init__(self, fds: list[int]) -> None:
        self._fds = fds
        self._on = True  # False once the file system refused: the descriptors stay open
        # until ``close`` (another thread's write may be using one)
        self._local = threading.local()  # writes run in several threads: a buffer each

    @classmethod
    def open(cls, paths: list[Path]) -> DirectFiles | None:
        """The files opened for direct I/O, or None where the file system refuses it."""
        fds: list[int] = []
        try:
            for path in paths:
                fds.append(os.open(path, os.O_RDWR | os.O_DIRECT))
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            if exc.errno in REFUSED:
                log.debug("no O_DIRECT under %s: %s", paths[0].parent if paths else "?", exc)
                return None
            raise
        return cls(fds)

    @property
    def usable(self) -> bool:
        return self._on and bool(self._fds)

    def _buffer(self, n: int) -> memoryview:
        """A page-aligned buffer of at least ``n`` bytes, this thread's, kept for reuse (a
        new one would cost its pages' first touch again)."""
        mm: Any = getattr(self._local, "mm", None)
        if mm is None or len(mm) < n:
            mm = mmap.mmap(-1, _up(n))
            self._local.mm = mm
        return memoryview(mm)

    def _refused(self, exc: OSError) -> None:
        log.info("the file system refused direct I/O (%s): the page cache from now on", exc)
        self._on = False

    def write(self, i: int, fd: int, data: memoryview, offset: int) -> None:
        """``data`` at ``offset`` of file ``i``: the whole blocks direct, the edges through
        ``fd`` (the file's buffered descriptor)."""
        lo, hi = _up(offset), _down(offset + len(data))
        if not self.usable or hi <= lo:
            pwrite_all(fd, data, offset)
            return
        pwrite_all(fd, data[: lo - offset], offset)
        buf = self._buffer(hi - lo)[: hi - lo]
        buf[:] = data[lo - offset : hi - offset]
        try:
            pwrite_all(self._fds[i], buf, lo)
        except OSError as exc:
            if exc.errno not in REFUSED:
                raise
            self._refused(exc)
            pwrite_all(fd, data[lo - offset : hi - offset], lo)
        pwrite_all(fd, data[hi - offset :], hi)

    def read_into(self, i: int, offset: int, n: int, hasher: Any) -> bool:
        """Feed ``n`` bytes of file ``i`` from ``offset`` to ``hasher.update``, read direct
        (the enclosing blocks); False where direct reads are not possible here."""
        if not self.usable:
            return False
        lo, hi = _down(offset), _up(offset + n)
        buf = self._buffer(hi - lo)
        need, got = offset + n - lo, 0
        try:
            while got < need:  # a read past the end of the file stops short: enough
                r = os.preadv(self._fds[i], [buf[got : hi - lo]], lo + got)
                if r <= 0 or (got + r < need and (got + r) % ALIGN):
                    raise OSError(errno.EIO, f"short direct read: {got + r} of {need} bytes")
                got += r
        except OSError as exc:
            if exc.errno not in REFUSED:
                raise
            self._refused(exc)
            return False
        hasher.update(buf[offset - lo : offset - lo + n])
        return True

    def close(self) -> None:
        """Close the descriptors (no write or read may be using them)."""
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)
