"""Hash helpers. One hash function for everything content-addressed: BLAKE2b-256."""

from __future__ import annotations

import hashlib

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
