"""A worker's signed rollout batches on disk, by work key, until their verdicts are final.

The worker writes each sealed ``RolloutBatch`` envelope before it announces it or submits
its key on-chain, so a batch that was announced survives a crash or a SIGKILL and can
still be served to a validator after a restart. Files are written to a temporary name,
flushed to disk and renamed (never half-written under the final name); reading re-opens
the envelope and checks its work key (a damaged file is reported, not served). The worker
deletes a batch once nobody fetches it again: its verdict final and the trainer past its
window (``InferenceRole._forget_spent``).
"""

from __future__ import annotations

import re
from pathlib import Path

from node.files import write_atomic
from protocol.errors import WireError
from protocol.rollouts import RolloutBatch
from protocol.wire import open_message

SUFFIX = ".batch"


class BatchStoreError(RuntimeError):
    """A stored batch that cannot be served (damaged on disk)."""


class BatchStore:
    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in self.dir.glob("*.tmp"):  # a write that a crash interrupted
            stale.unlink(missing_ok=True)

    def _path(self, work_key: bytes) -> Path:
        if len(work_key) != 32:
            raise ValueError("a work key has 32 bytes")
        return self.dir / f"{work_key.hex()}{SUFFIX}"

    def put(self, envelope: bytes) -> bytes:
        """Store a sealed batch envelope durably; returns its work key."""
        batch = open_message(envelope, RolloutBatch)
        key = batch.work_key()
        write_atomic(self._path(key), envelope)
        return key

    def get(self, work_key: bytes) -> bytes | None:
        """The envelope stored under ``work_key``, None if there is none."""
        path = self._path(work_key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            ok = open_message(data, RolloutBatch).work_key() == work_key
        except WireError as exc:
            raise BatchStoreError(f"{path.name}: damaged: {exc}") from exc
        if not ok:
            raise BatchStoreError(f"{path.name}: holds another batch")
        return data

    def delete(self, work_key: bytes) -> None:
        self._path(work_key).unlink(missing_ok=True)

    def keys(self) -> list[bytes]:
        """The work keys stored; a file whose name is not a key (a copy, a backup) is
        ignored rather than breaking the listing."""
        names = (p.name[: -len(SUFFIX)] for p in self.dir.glob(f"*{SUFFIX}"))
        return sorted(bytes.fromhex(n) for n in names if re.fullmatch("[0-9a-f]{64}", n))
