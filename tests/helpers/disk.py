"""A disk that fills, for the tests: the kernel's own refusal, no mock."""

from __future__ import annotations

import resource
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def file_size_limit(nbytes: int) -> Iterator[None]:
    """The kernel refuses to write a file past ``nbytes`` (EFBIG, "File too large"; Python
    ignores SIGXFSZ): a disk that fills, for this process, until the block ends."""
    before = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, before)
