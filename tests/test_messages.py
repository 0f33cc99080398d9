import msgpack
import pytest

from crypto.identity import Identity
from protocol.errors import Reason, WireError
from protocol.messages import Announcement, NodeInfo, Refusal, SyncReply, SyncRequest
from protocol.wire import max_envelope_size, open_message, seal

IDENT = Identity.generate()


def info(**over):
    fields = dict(
        run_id="run-1",
        sender=IDENT.peer_id,
        seq=7,
        ts_ms=1_700_000_000_000,
        role="inference",
        state="up",
        addrs=["/ip4/127.0.0.1/tcp/4001"],
        session=1,
        announced=0,
    )
    fields.update(over)
    return NodeInfo(**fields)


def raw(msg, **over):
    body = msgpack.unpackb(msg.encode())
    body.update(over)
    return body


def reject(cls, data, reason):
    with pytest.raises(WireError) as exc:
        cls.decode(data)
    assert exc.value.reason == reason, exc.value
    return exc.value


def test_roundtrip_every_message():
    header = dict(run_id="r", sender=IDENT.peer_id, seq=1, ts_ms=2)
    msgs = [
        info(),
        Announcement(**header, topic="weights/v1", session=3, index=4, body=b"\x00" * 100),
        SyncRequest(**header, session=3, indices=[1, 2, 3]),
        SyncReply(**header, items=[b"a", b"b"]),
        Refusal(**header, reason="replay", detail="x"),
    ]
    for m in msgs:
        assert type(m).decode(m.encode()) == m
        assert open_message(seal(IDENT, m), type(m)) == m


def test_a_refusal_names_one_of_the_specs_reasons():
    """SPEC §5: a refusal's reason is one of §9's; any other string was taken."""
    header = dict(run_id="r", sender=IDENT.peer_id, seq=1, ts_ms=2)
    for reason in Reason:
        Refusal.decode(Refusal(**header, reason=reason.value, detail="").encode())
    body = raw(Refusal(**header, reason="busy", detail=""), reason="try later, maybe")
    reject(Refusal, msgpack.packb(body), Reason.MALFORMED)


def test_missing_and_unknown_fields():
    body = raw(info())
    del body["role"]
    reject(NodeInfo, msgpack.packb(body), Reason.MALFORMED)
    reject(NodeInfo, msgpack.packb(raw(info(), extra=1)), Reason.MALFORMED)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seq", -1),
        ("seq", "7"),
        ("seq", 1.5),
        ("seq", True),
        ("role", "king"),
        ("state", 3),
        ("run_id", "Has Spaces"),
        ("run_id", "x" * 65),
        ("sender", "not-a-peer-id"),
        ("addrs", "not-a-list"),
        ("addrs", ["a"] * 9),
        ("addrs", [1]),
        ("addrs", ["x" * 257]),
    ],
)
def test_wrong_types_and_ranges(field, value):
    err = reject(NodeInfo, msgpack.packb(raw(info(), **{field: value})), Reason.MALFORMED)
    assert field in str(err)


def test_encode_refuses_invalid_message():
    with pytest.raises(WireError):
        info(role="king").encode()


def test_size_limit_checked_before_decoding():
    big = b"\x91" + b"\xc4\xff" + b"\x00" * (NodeInfo.MAX_SIZE + 10)
    reject(NodeInfo, big, Reason.OVERSIZED)
    with pytest.raises(WireError) as exc:
        Announcement(
            run_id="r",
            sender=IDENT.peer_id,
            seq=1,
            ts_ms=1,
            topic="t",
            session=0,
            index=0,
            body=b"\x00" * (64 * 1024 + 1),
        ).encode()
    assert exc.value.reason == Reason.MALFORMED


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",
        b"\x93\x01\x02",
        msgpack.packb([1, 2]),
        msgpack.packb("str"),
        b"\x81\xc0\x01",
        msgpack.packb(msgpack.ExtType(5, b"x")),
    ],
)
def test_garbage_is_malformed(data):
    reject(NodeInfo, data, Reason.MALFORMED)


def test_wrong_type_tag():
    reject(NodeInfo, msgpack.packb(raw(info(), type="intellect/sync-request/1")), Reason.WRONG_TYPE)


def test_envelope_checks():
    good = seal(IDENT, info())
    env = msgpack.unpackb(good)

    def bad(reason, **over):
        e = dict(env)
        e.update(over)
        with pytest.raises(WireError) as exc:
            open_message(msgpack.packb(e), NodeInfo)
        assert exc.value.reason == reason

    bad(Reason.BAD_SIGNATURE, s=bytes(64))
    bad(Reason.BAD_SIGNATURE, p=info(seq=8).encode())
    bad(Reason.WRONG_TYPE, d=SyncRequest.TYPE)
    bad(Reason.MALFORMED, k=b"short")
    other = Identity.generate()
    # validly signed by `other`, but claiming to be IDENT
    forged = seal(other, info())
    with pytest.raises(WireError) as exc:
        open_message(forged, NodeInfo)
    assert exc.value.reason == Reason.SENDER_MISMATCH
    with pytest.raises(WireError) as exc:
        open_message(good + b"\x00" * max_envelope_size(NodeInfo), NodeInfo)
    assert exc.value.reason == Reason.OVERSIZED
    with pytest.raises(WireError) as exc:
        open_message(good + b"\x00", NodeInfo)
    assert exc.value.reason == Reason.MALFORMED


def test_signature_for_one_type_never_verifies_as_another():
    header = dict(run_id="r", sender=IDENT.peer_id, seq=1, ts_ms=2)
    req = SyncRequest(**header, session=1, indices=[])
    env = msgpack.unpackb(seal(IDENT, req))
    env["d"] = SyncReply.TYPE  # relabel: the signature covered the SyncRequest domain
    with pytest.raises(WireError) as exc:
        open_message(msgpack.packb(env), SyncReply)
    assert exc.value.reason == Reason.BAD_SIGNATURE


def test_spec_documents_every_message_field():
    """SPEC.md's table for each message type names exactly the message's fields."""
    import re
    from pathlib import Path

    from protocol import messages, rollouts, shardcast

    spec = (Path(__file__).resolve().parent.parent / "SPEC.md").read_text()
    header = {"run_id", "sender", "seq", "ts_ms"}
    types = [messages.NodeInfo, messages.Announcement, messages.SyncRequest, messages.SyncReply]
    types += [messages.Refusal, rollouts.RolloutBatch]
    types += [shardcast.WeightManifest, shardcast.WeightsQuery, shardcast.WeightsHolding]
    types += [shardcast.ShardRequest, shardcast.ShardReply]
    for cls in types:
        section = spec.split(f"### `{cls.TYPE}`", 1)[1].split("\n#", 1)[0]
        documented = set(re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.MULTILINE))
        assert documented == set(cls.specs()) - header, cls.TYPE
        title = section.splitlines()[0].replace(",", "")
        assert str(cls.MAX_SIZE) in title or cls is messages.SyncReply, title
    for cls in (
        rollouts.RolloutGroup,
        rollouts.RolloutSample,
        shardcast.WeightFile,
        shardcast.WeightsNotice,
    ):
        for field in cls.specs():
            assert f"`{field}`" in spec, (cls.__name__, field)


def bomb_envelope(domain: str, payload: bytes) -> bytes:
    """A correctly signed envelope around ``payload`` (any peer can sign its own bombs)."""
    from crypto.envelope import Envelope

    env = Envelope.seal(IDENT, domain, payload)
    return msgpack.packb(
        {"d": domain, "p": payload, "k": env.signer, "s": env.signature}, use_bin_type=True
    )


def empty_maps(n: int) -> bytes:
    """A msgpack list of ``n`` empty maps: one byte each on the wire, a dict each decoded."""
    return b"\xdd" + n.to_bytes(4, "big") + b"\x80" * n


@pytest.mark.parametrize(
    "where", ["envelope", "list field", "scalar field", "list item", "nested message"]
)
def test_bytes_that_would_decode_into_a_flood_of_objects_are_refused_before_any_is_built(where):
    """A reply within its size limit made of tiny containers (a list of empty maps) was
    decoded in full before any check: 48 MiB in a batch reply became 3.7 GiB of dicts and
    11 s on the trio thread. Each map and list is now checked from its header against
    what a valid message may hold, before its entries are read."""
    import tracemalloc

    from protocol.rollouts import RolloutBatch

    n = 1 << 20
    cls, typ = RolloutBatch, RolloutBatch.TYPE
    head = {"type": typ, "run_id": "r", "sender": IDENT.peer_id, "seq": 1, "ts_ms": 1}
    packed = msgpack.packb(head, use_bin_type=True)
    fields = b"\x80" + packed[1:]  # the header's map, its length patched below
    body = {
        "envelope": None,
        "list field": ("groups", empty_maps(n)),  # more items than the field may hold
        "scalar field": ("policy_version", empty_maps(n)),  # a list where an int goes
        "list item": ("groups", b"\x91" + empty_maps(n)),  # a list where a group goes
        "nested message": ("groups", b"\x91\x81\xa7samples" + b"\x91" + empty_maps(n)),
    }[where]
    if body is None:
        data = empty_maps(n)
    else:
        name, value = body
        count = len(head) + 1
        fields = bytes([0x80 | count]) + packed[1:] + msgpack.packb(name) + value
        data = bomb_envelope(typ, fields)
    tracemalloc.start()
    try:
        with pytest.raises(WireError) as exc:
            open_message(data, cls)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert exc.value.reason == Reason.MALFORMED, exc.value
    assert peak < 4 * len(data) + (1 << 20), peak  # copies of the bytes (64 MiB as dicts)
