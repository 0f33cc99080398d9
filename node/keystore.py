"""The node's identity on disk: ``<data_dir>/identity.key``, 32 raw bytes, mode 0600."""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path

from crypto.identity import PRIVATE_KEY_SIZE, Identity

KEY_FILE = "identity.key"


class KeystoreError(RuntimeError):
    """The identity file is missing, malformed or readable by others."""


def key_path(data_dir: Path) -> Path:
    return data_dir / KEY_FILE


def ensure_data_dir(data_dir: Path) -> Path:
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    return data_dir


LOCK_FILE = "node.lock"


class LockHeld(RuntimeError):
    """Another process holds the lock (``holder``: its pid as it wrote it, or ``?``)."""

    def __init__(self, holder: str) -> None:
        super().__init__(f"held by pid {holder}")
        self.holder = holder


def hold_lock(path: Path) -> int:
    """An exclusive flock on ``path`` for this process, which the kernel releases when it
    exits, killed or not, with this pid written in it; returns the descriptor to keep open.
    ``LockHeld`` when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise LockHeld(holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def claim_data_dir(data_dir: Path) -> int:
    """Hold ``data_dir`` for this process (``hold_lock``); returns the descriptor to keep
    open. Two nodes on one data dir would run with one identity, one weight store and one
    admin file: the second is refused."""
    try:
        return hold_lock(data_dir / LOCK_FILE)
    except LockHeld as held:
        raise KeystoreError(
            f"another node (pid {held.holder}) runs with the data dir {data_dir}: stop it first,"
            " or give this one another --data-dir or --name"
        ) from None


def create_identity(data_dir: Path, *, force: bool = False) -> Identity:
    """Write a new identity; refuses to overwrite one unless ``force``, and then keeps the
    old one as ``identity.key.bak-<time>`` (mode 0600): it may be registered on-chain."""
    path = key_path(ensure_data_dir(data_dir))
    if path.exists():
        if not force:
            raise KeystoreError(f"{path} already exists (use --force to replace it)")
        from ledger.accounts import backup_keystore

        backup_keystore(path)
    ident = Identity.generate()
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(ident.private_bytes)
    os.replace(tmp, path)
    return ident


def load_identity(data_dir: Path) -> Identity:
    path = key_path(data_dir)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError as exc:
        raise KeystoreError(
            f"no identity at {path} (run: intellect-node keys new --data-dir {data_dir})"
        ) from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeystoreError(
            f"{path} is accessible by other users (mode {oct(mode & 0o777)}); chmod 600 it"
        )
    raw = path.read_bytes()
    if len(raw) != PRIVATE_KEY_SIZE:
        raise KeystoreError(f"{path} is not a {PRIVATE_KEY_SIZE}-byte Ed25519 key")
    return Identity(raw)


def load_or_create_identity(data_dir: Path) -> Identity:
    if key_path(data_dir).exists():
        return load_identity(data_dir)
    return create_identity(data_dir)


# secp256k1's group order: a private key is an integer in [1, n - 1]
SECP256K1_ORDER = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


def parse_private_key(text: str, source: str) -> str:
    """The EVM private key in ``text`` (64 hex digits, ``0x`` optional, surrounding blank
    space ignored) as ``0x`` and lowercase hex; ``KeystoreError`` naming ``source`` (never
    quoting what it holds) if it is no such key."""
    raw = text.strip().removeprefix("0x").removeprefix("0X")
    if len(raw) != 64 or any(c not in "0123456789abcdefABCDEF" for c in raw):
        raise KeystoreError(
            f"{source} holds no private key: expected 64 hex digits (0x optional), "
            f"got {len(text.strip())} characters"
        )
    if not 0 < int(raw, 16) < SECP256K1_ORDER:
        raise KeystoreError(f"{source} holds no private key: out of secp256k1's range")
    return "0x" + raw.lower()
