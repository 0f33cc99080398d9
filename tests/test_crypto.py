import pytest
from libp2p.crypto.ed25519 import Ed25519PublicKey
from libp2p.peer.id import ID

from crypto.envelope import Envelope, SignatureError, signing_bytes
from crypto.hashing import digest, digest_parts
from crypto.identity import Identity, IdentityError, peer_id_of, public_key_of_peer_id, verify


def test_peer_id_matches_libp2p():
    for _ in range(5):
        ident = Identity.generate()
        expected = ID.from_pubkey(Ed25519PublicKey.from_bytes(ident.public_bytes)).to_base58()
        assert ident.peer_id == expected
        assert ident.peer_id.startswith("12D3KooW")
        assert public_key_of_peer_id(ident.peer_id) == ident.public_bytes


def test_peer_id_rejects_garbage():
    with pytest.raises(IdentityError):
        public_key_of_peer_id("QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N")  # an RSA/sha256 id
    with pytest.raises(IdentityError):
        public_key_of_peer_id("0OIl")  # not base58
    with pytest.raises(IdentityError):
        peer_id_of(b"short")


def test_identity_from_seed_is_deterministic_and_repr_hides_key():
    a = Identity.generate()
    b = Identity(a.private_bytes)
    assert a.peer_id == b.peer_id
    assert a.private_bytes.hex() not in repr(a)
    with pytest.raises(IdentityError):
        Identity(b"\x00" * 31)


def test_envelope_roundtrip_and_domain_separation():
    ident = Identity.generate()
    env = Envelope.seal(ident, "intellect/a/1", b"payload")
    assert env.open("intellect/a/1") == b"payload"
    assert env.signer_peer_id == ident.peer_id
    with pytest.raises(SignatureError):
        env.open("intellect/b/1")


def test_envelope_rejects_tampering():
    ident, other = Identity.generate(), Identity.generate()
    env = Envelope.seal(ident, "d", b"payload")
    with pytest.raises(SignatureError):
        Envelope(b"payloaD", env.signer, env.signature).open("d")
    with pytest.raises(SignatureError):
        Envelope(env.payload, other.public_bytes, env.signature).open("d")
    bad_sig = bytes([env.signature[0] ^ 1]) + env.signature[1:]
    with pytest.raises(SignatureError):
        Envelope(env.payload, env.signer, bad_sig).open("d")
    with pytest.raises(SignatureError):
        Envelope(env.payload, env.signer, b"\x00" * 10).open("d")


def test_domain_boundary_cannot_be_shifted():
    # "ab" + payload "c..." must not sign the same bytes as domain "a" + payload "bc..."
    assert signing_bytes("ab", b"c") != signing_bytes("a", b"bc")
    with pytest.raises(ValueError, match="domain"):
        signing_bytes("", b"x")
    assert not verify(b"\x00" * 32, b"\x00" * 64, b"m")


def test_hashes():
    assert len(digest(b"x")) == 32
    assert digest(b"x") != digest(b"y")
    assert digest_parts(b"ab", b"c") != digest_parts(b"a", b"bc")
