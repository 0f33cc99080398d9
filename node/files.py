"""Writing a file so that its name never holds half of it."""

from __future__ import annotations

import os
from pathlib import Path


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
