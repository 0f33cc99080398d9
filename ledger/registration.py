"""The registration signature: a node's Ed25519 key vouching for its ledger account.

``register(peer_key, signature)`` stores the signature on-chain, but the EVM has no Ed25519
precompile, so the contract cannot check it: every node and validator checks it here,
off-chain, before it trusts that a peer key belongs to an account (SPEC.md section 12).
The message binds the account and the chain, so a signature is never valid for another
account or on another chain.
"""

from __future__ import annotations

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ed25519

DOMAIN = b"intellect-node/ledger-registration/v1"


def registration_message(chain_id: int, account: str) -> bytes:
    """DOMAIN ‖ uint256be(chain_id) ‖ the 20 address bytes."""
    raw = bytes.fromhex(account.removeprefix("0x"))
    if len(raw) != 20:
        raise ValueError(f"not an address: {account!r}")
    if not 0 < chain_id < 2**256:
        raise ValueError(f"not a chain id: {chain_id}")
    return DOMAIN + chain_id.to_bytes(32, "big") + raw


def verify_registration(peer_key: bytes, signature: bytes, chain_id: int, account: str) -> bool:
    """True if ``signature`` is ``peer_key``'s Ed25519 signature of the registration message."""
    if len(peer_key) != 32 or len(signature) != 64:
        return False
    try:
        ed25519.Ed25519PublicKey.from_public_bytes(peer_key).verify(
            signature, registration_message(chain_id, account)
        )
    except (InvalidSignature, ValueError):
        return False
    return True
