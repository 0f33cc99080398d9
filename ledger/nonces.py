"""One account's nonces, from one place: kept across restarts, shared by every process
that signs for the account from the same data directory (a node and the CLI).

The journal is a JSON file beside the keystore, read and written under an exclusive
``flock`` of its own lock file. It holds the next nonce to hand out, the nonces handed out
whose send the chain refused (``free``: handed out again first, so no gap is left), and
every transaction sent and not yet confirmed: its nonce, call name, hashes (the original
and each replacement) and its newest signed bytes, so that a process that died between
sending and seeing a receipt can send it again after a restart (``unfinished``), and
nothing else ever takes its nonce.

The chain's own count is asked only when the journal has none (its first use, or after
``forget_next``: a refusal that says the chain disagrees), and then the larger of the two
is taken: a nonce the chain has seen is never handed out again.

``NonceJournal(None)`` keeps the same in memory only (tests, read-only tools).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

FORMAT = 1


class NonceJournal:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._memory: dict[str, Any] = self._empty()
        self._lock = threading.Lock()

    @staticmethod
    def _empty() -> dict[str, Any]:
        return {"format": FORMAT, "next": None, "free": [], "sent": {}}

    @contextlib.contextmanager
    def _state(self) -> Iterator[dict[str, Any]]:
        """The journal, locked against this process's threads and every other process;
        written back when the block ends without an exception."""
        with self._lock:
            if self.path is None:
                yield self._memory
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path.with_suffix(".lock"), "a+") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    state = self._load()
                    yield state
                    tmp = self.path.with_suffix(".tmp")
                    tmp.write_text(json.dumps(state))
                    os.replace(tmp, self.path)
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)

    def _load(self) -> dict[str, Any]:
        assert self.path is not None
        try:
            state: dict[str, Any] = json.loads(self.path.read_text())
        except FileNotFoundError:
            return self._empty()
        except ValueError as exc:  # never guess a nonce from a damaged journal
            raise RuntimeError(
                f"nonce journal {self.path} is damaged ({exc}): move it aside"
            ) from exc
        if state.get("format") != FORMAT:
            raise RuntimeError(f"nonce journal {self.path} has an unknown format")
        return state

    def reserve(self, chain_count: Callable[[], int]) -> int:
        """The nonce for the next transaction: a freed one first, else the next."""
        with self._state() as state:
            free: list[int] = state["free"]
            if free:
                free.sort()
                return free.pop(0)
            if state["next"] is None:
                state["next"] = int(chain_count())
            nonce = int(state["next"])
            state["next"] = nonce + 1
            return nonce

    def release(self, nonce: int) -> None:
        """The chain refused the send with ``nonce`` and did not take it: hand it out again."""
        with self._state() as state:
            if state["next"] == nonce + 1:
                state["next"] = nonce
            elif nonce not in state["free"]:
                state["free"].append(nonce)

    def forget_next(self, chain_count: int) -> None:
        """The chain has seen ``chain_count`` nonces (more than we handed out, or fewer
        free ones than we thought): continue from the larger."""
        with self._state() as state:
            state["free"] = [n for n in state["free"] if n >= chain_count]
            state["next"] = max(int(state["next"] or 0), chain_count)

    def sent(self, nonce: int, name: str, hashes: list[bytes], raw: bytes) -> None:
        with self._state() as state:
            state["sent"][str(nonce)] = {
                "name": name,
                "hashes": ["0x" + h.hex() for h in hashes],
                "raw": "0x" + raw.hex(),
            }

    def done(self, nonce: int) -> None:
        with self._state() as state:
            state["sent"].pop(str(nonce), None)

    def unfinished(self) -> list[tuple[int, str, list[bytes], bytes]]:
        """(nonce, call name, hashes, newest signed bytes) of every transaction sent and not
        known to be confirmed, oldest first."""
        with self._state() as state:
            out = [
                (
                    int(n),
                    str(e["name"]),
                    [bytes.fromhex(h[2:]) for h in e["hashes"]],
                    bytes.fromhex(e["raw"][2:]),
                )
                for n, e in state["sent"].items()
            ]
        return sorted(out)

    def next_nonce(self) -> int | None:
        with self._state() as state:
            return None if state["next"] is None else int(state["next"])
