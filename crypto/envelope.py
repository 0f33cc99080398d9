"""Signed envelopes with domain separation.

An envelope carries a payload, the signer's Ed25519 public key and a signature over

    b"intellect-node/sig/v1\\x00" + len(domain) (1 byte) + domain + payload

The domain names the message type (``intellect/presence/1``): a signature made for one
domain never verifies under another, because the domain is inside the signed bytes and
the verifier supplies the domain it expects rather than reading it from the input.
"""

from __future__ import annotations

from dataclasses import dataclass

from crypto.identity import (
    PUBLIC_KEY_SIZE,
    SIGNATURE_SIZE,
    Identity,
    peer_id_of,
    verify,
)

_SIG_PREFIX = b"intellect-node/sig/v1\x00"
MAX_DOMAIN_LEN = 64


class SignatureError(ValueError):
    """An envelope whose signature does not verify under the expected domain."""


def signing_bytes(domain: str, payload: bytes) -> bytes:
    """The exact bytes that are signed for ``payload`` under ``domain``."""
    d = domain.encode("ascii")
    if not 0 < len(d) <= MAX_DOMAIN_LEN:
        raise ValueError(f"signing domain must be 1..{MAX_DOMAIN_LEN} ASCII bytes")
    return _SIG_PREFIX + bytes([len(d)]) + d + payload


@dataclass(frozen=True)
class Envelope:
    """A payload signed by ``signer`` (a raw Ed25519 public key)."""

    payload: bytes
    signer: bytes
    signature: bytes

    @classmethod
    def seal(cls, identity: Identity, domain: str, payload: bytes) -> Envelope:
        return cls(payload, identity.public_bytes, identity.sign(signing_bytes(domain, payload)))

    @property
    def signer_peer_id(self) -> str:
        return peer_id_of(self.signer)

    def open(self, domain: str) -> bytes:
        """Return the payload if the signature verifies under ``domain``, else raise."""
        if len(self.signer) != PUBLIC_KEY_SIZE or len(self.signature) != SIGNATURE_SIZE:
            raise SignatureError("malformed signer key or signature")
        if not verify(self.signer, self.signature, signing_bytes(domain, self.payload)):
            raise SignatureError(f"bad signature for domain {domain!r}")
        return self.payload
