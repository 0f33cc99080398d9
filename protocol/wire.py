"""Signed messages on the wire: a msgpack envelope around an encoded message.

Envelope (msgpack map, exactly these keys):
    d: str    signing domain = the message TYPE
    p: bytes  the encoded message
    k: bytes  signer's Ed25519 public key (32)
    s: bytes  Ed25519 signature (64) over crypto.envelope.signing_bytes(d, p)

``open_message`` is the single entry from bytes to a message: it checks the size, the
envelope shape, that the domain is one the caller accepts, the signature, the payload's
schema, and that the claimed sender is the signer. Nothing unsigned reaches role logic.
"""

from __future__ import annotations

from typing import TypeVar

import msgpack

from crypto.envelope import Envelope, SignatureError
from crypto.identity import PUBLIC_KEY_SIZE, SIGNATURE_SIZE, Identity
from protocol.errors import Reason, WireError
from protocol.messages import Header
from protocol.schema import Shape, unpack_limited

ENVELOPE_OVERHEAD = 192
MAX_DOMAIN = 64  # characters of a signing domain (a message TYPE)
M = TypeVar("M", bound=Header)


def max_envelope_size(*types: type[Header]) -> int:
    return max(t.MAX_SIZE for t in types) + ENVELOPE_OVERHEAD


def seal(identity: Identity, message: Header) -> bytes:
    """Encode and sign ``message`` as an envelope."""
    payload = message.encode()
    env = Envelope.seal(identity, message.TYPE, payload)
    out: bytes = msgpack.packb(
        {"d": message.TYPE, "p": payload, "k": env.signer, "s": env.signature},
        use_bin_type=True,
    )
    return out


def open_message(data: bytes, *accepted: type[M]) -> M:
    """Decode, verify and validate an envelope holding one of the ``accepted`` types."""
    most = max(t.MAX_SIZE for t in accepted)  # four scalars, the payload at most this long
    if len(data) > most + ENVELOPE_OVERHEAD:
        raise WireError(Reason.OVERSIZED, f"{len(data)} bytes > {most + ENVELOPE_OVERHEAD}")
    # (a payload over its type's size still decodes here: its own check says `oversized`)
    shape = Shape(map_keys=4, list_items=0, text=MAX_DOMAIN, blob=len(data), containers=1)
    obj = unpack_limited(data, most + ENVELOPE_OVERHEAD, shape) if _a_map(data) else None
    if not isinstance(obj, dict) or set(obj) != {"d", "p", "k", "s"}:
        raise WireError(Reason.MALFORMED, "envelope must be a map with keys d, p, k, s")
    domain, payload, signer, sig = obj["d"], obj["p"], obj["k"], obj["s"]
    if not (
        isinstance(domain, str)
        and isinstance(payload, bytes)
        and isinstance(signer, bytes)
        and isinstance(sig, bytes)
        and len(signer) == PUBLIC_KEY_SIZE
        and len(sig) == SIGNATURE_SIZE
    ):
        raise WireError(Reason.MALFORMED, "envelope fields have wrong types or lengths")
    by_type = {t.TYPE: t for t in accepted}
    cls = by_type.get(domain)
    if cls is None:
        raise WireError(Reason.WRONG_TYPE, f"{domain!r} not accepted here")
    env = Envelope(payload, signer, sig)
    try:
        env.open(domain)
    except SignatureError as exc:
        raise WireError(Reason.BAD_SIGNATURE, str(exc)) from exc
    message = cls.decode(payload)
    if message.sender != env.signer_peer_id:
        raise WireError(Reason.SENDER_MISMATCH, "sender is not the signer")
    return message


def _a_map(data: bytes) -> bool:
    """Whether ``data`` starts with a msgpack map header (fixmap, map 16, map 32)."""
    return bool(data) and (0x80 <= data[0] <= 0x8F or data[0] in (0xDE, 0xDF))
