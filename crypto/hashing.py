"""Hash helpers. Messages, keys and records are content-addressed with BLAKE2b-256; bulk
bytes (weight shards and whole checkpoints, SPEC §14) with BLAKE3-256, which hashes 4 MiB
about 7x faster on this machine (6.3 GB/s against 0.92 GB/s) and so keeps hashing off a
download's critical path."""

from __future__ import annotations

import hashlib

import blake3

DIGEST_SIZE = 32


def digest(data: bytes) -> bytes:
    """32-byte BLAKE2b digest of ``data``."""
    return hashlib.blake2b(data, digest_size=DIGEST_SIZE).digest()


def hexdigest(data: bytes) -> str:
    """Hex form of :func:`digest`."""
    return digest(data).hex()


def digest_parts(*parts: bytes) -> bytes:
    """Digest of several byte strings, each length-prefixed so that no two splits collide."""
    h = hashlib.blake2b(digest_size=DIGEST_SIZE)
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.digest()


def bulk_hasher() -> blake3.blake3:
    """An incremental BLAKE3-256 hasher (``update(buffer)``, ``digest()``) for bulk bytes."""
    return blake3.blake3(max_threads=1)


def bulk_digest(data: bytes | bytearray | memoryview) -> bytes:
    """32-byte BLAKE3 digest of a bulk buffer (no copy of it)."""
    return blake3.blake3(data, max_threads=1).digest()
