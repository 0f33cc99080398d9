"""Node identity: an Ed25519 key pair and the libp2p peer id derived from it.

The peer id is computed here without py-libp2p: it is the identity multihash of the
protobuf-encoded public key (``KeyType.Ed25519 = 1``), base58btc-encoded, exactly as the
libp2p peer-id spec defines it, so that ``crypto`` stays free of networking code.
"""

from __future__ import annotations

from dataclasses import dataclass

import base58
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

PUBLIC_KEY_SIZE = 32
PRIVATE_KEY_SIZE = 32
SIGNATURE_SIZE = 64

# protobuf PublicKey{Type: Ed25519 (field 1 = 1), Data (field 2, 32 bytes)}
_PB_PREFIX = bytes([0x08, 0x01, 0x12, PUBLIC_KEY_SIZE])
# identity multihash: code 0x00, length 36
_MH_PREFIX = bytes([0x00, len(_PB_PREFIX) + PUBLIC_KEY_SIZE])


class IdentityError(ValueError):
    """A key or peer id that is malformed."""


def peer_id_bytes(public_key: bytes) -> bytes:
    """Binary libp2p peer id (identity multihash) of an Ed25519 public key."""
    if len(public_key) != PUBLIC_KEY_SIZE:
        raise IdentityError(f"Ed25519 public key must be {PUBLIC_KEY_SIZE} bytes")
    return _MH_PREFIX + _PB_PREFIX + public_key


def peer_id_of(public_key: bytes) -> str:
    """Base58 libp2p peer id (``12D3KooW…``) of an Ed25519 public key."""
    return base58.b58encode(peer_id_bytes(public_key)).decode("ascii")


def public_key_of_peer_id(peer_id: str) -> bytes:
    """The Ed25519 public key embedded in a ``12D3KooW…`` peer id."""
    try:
        raw = base58.b58decode(peer_id)
    except ValueError as exc:
        raise IdentityError(f"peer id is not base58: {peer_id!r}") from exc
    head = _MH_PREFIX + _PB_PREFIX
    if len(raw) != len(head) + PUBLIC_KEY_SIZE or not raw.startswith(head):
        raise IdentityError(f"not an Ed25519 peer id: {peer_id!r}")
    return raw[len(head) :]


def verify(public_key: bytes, signature: bytes, message: bytes) -> bool:
    """True if ``signature`` is a valid Ed25519 signature of ``message``."""
    if len(public_key) != PUBLIC_KEY_SIZE or len(signature) != SIGNATURE_SIZE:
        return False
    try:
        ed25519.Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


@dataclass(frozen=True)
class Identity:
    """An Ed25519 key pair. ``private_bytes`` is the 32-byte seed."""

    private_bytes: bytes

    def __post_init__(self) -> None:
        if len(self.private_bytes) != PRIVATE_KEY_SIZE:
            raise IdentityError(f"Ed25519 private key must be {PRIVATE_KEY_SIZE} bytes")

    @classmethod
    def generate(cls) -> Identity:
        key = ed25519.Ed25519PrivateKey.generate()
        raw = key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        return cls(raw)

    @property
    def _key(self) -> ed25519.Ed25519PrivateKey:
        return ed25519.Ed25519PrivateKey.from_private_bytes(self.private_bytes)

    @property
    def public_bytes(self) -> bytes:
        return self._key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    @property
    def peer_id(self) -> str:
        return peer_id_of(self.public_bytes)

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message)

    def __repr__(self) -> str:  # never print the private key
        return f"Identity(peer_id={self.peer_id})"
