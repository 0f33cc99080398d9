"""protocol/: behaviour that survived mutation testing (bench/mutation.py) unchecked.

Each test names what it pins down: the schema helpers declare what they say (a message
class declared here, so the helpers run under test, not only at import), rejection details
(they travel to the peer in a ``Refusal`` and into the logs), the replay window's bounds and
eviction order, frame boundaries and the stream adapter, envelope size limits, rollout batch
rejections, SHARDCAST's shard ranges, manifest checks, notices and have-bitmaps, and
DiLoCo's group key.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack
import pytest
import trio
import trio.testing

from crypto.hashing import digest
from crypto.identity import Identity
from crypto.sampling import derive_seed
from crypto.toploc import proof_size
from protocol import ids
from protocol.admission import Admission, ReplayWindow
from protocol.diloco import group_key
from protocol.errors import Reason, WireError
from protocol.framing import MAX_FRAME, FrameReader, TrioStream, read_frame, write_frame
from protocol.messages import Announcement, NodeInfo, Refusal
from protocol.rollouts import RolloutBatch, pack_floats, pack_tokens
from protocol.schema import (
    FieldSpec,
    Message,
    blob,
    f64,
    listof,
    nested,
    spec,
    text,
    u64,
    unpack_limited,
)
from protocol.shardcast import (
    MAX_SHARDS,
    MIN_SHARD,
    WeightFile,
    WeightManifest,
    WeightsQuery,
    bitmap,
    check_notice,
    is_file_name,
    manifest_id,
    open_manifest,
    unbitmap,
)
from protocol.wire import ENVELOPE_OVERHEAD, max_envelope_size, open_message, seal

# --- the schema helpers ------------------------------------------------------------------


def declare():
    """A message using every field helper, declared when called (under the test)."""

    @dataclass(frozen=True)
    class Item(Message):
        TYPE = "test/item/1"
        MAX_SIZE = 256

        n: int = u64(1, 9)

    @dataclass(frozen=True)
    class Probe(Message):
        TYPE = "test/probe/1"
        MAX_SIZE = 4096

        count: int = u64()
        small: int = u64(2, 5)
        name: str = text(4, pattern="[a-z]+")
        mode: str = text(8, choices=("up", "down"))
        raw: bytes = blob(8)
        key: bytes = blob(4, exact_len=4)
        ratio: float = f64(-1.0, 1.0)
        ints: list[int] = listof(FieldSpec(int, hi=9), 2)
        items: list[Item] = listof(nested(Item), 2)
        one: Item = spec(nested(Item))
        flag: bool = spec(FieldSpec(bool))

    return Item, Probe


def good_obj():
    return {
        "count": 0,
        "small": 2,
        "name": "abcd",
        "mode": "down",
        "raw": b"12345678",
        "key": b"abcd",
        "ratio": 1.0,
        "ints": [0, 9],
        "items": [{"n": 1}, {"n": 9}],
        "one": {"n": 5},
        "flag": False,
    }


def test_schema_helpers_accept_the_edges_they_declare():
    item, probe = declare()
    assert set(probe.specs()) == set(good_obj())
    message = probe.from_obj(good_obj())
    assert message.items == [item(n=1), item(n=9)] and message.one == item(n=5)
    assert probe.decode(message.encode()) == message
    for field, value in [("small", 5), ("ratio", -1.0), ("name", "a"), ("raw", b""), ("ints", [])]:
        assert probe.from_obj({**good_obj(), field: value}).to_obj()[field] == value
    assert probe.from_obj({**good_obj(), "count": 2**64 - 1}).count == 2**64 - 1


@pytest.mark.parametrize(
    ("field", "value", "where"),
    [
        ("count", -1, "count"),
        ("count", 2**64, "count"),
        ("count", "1", "count"),
        ("small", 1, "small"),
        ("small", 6, "small"),
        ("name", "abcde", "name"),
        ("name", "AB", "name"),
        ("name", b"ab", "name"),
        ("mode", "left", "mode"),
        ("raw", b"123456789", "raw"),
        ("raw", "x", "raw"),
        ("key", b"abc", "key"),
        ("key", b"abcde", "key"),
        ("ratio", 1.5, "ratio"),
        ("ratio", -1.5, "ratio"),
        ("ratio", 1, "ratio"),
        ("ints", [1, 2, 3], "ints"),
        ("ints", [10], "ints[0]"),
        ("ints", (1,), "ints"),
        ("items", [{"n": 1}] * 3, "items"),
        ("items", [{"n": 0}], "items[0].n"),
        ("items", [{"n": 1}, {"m": 1}], "items[1]"),
        ("items", {"n": 1}, "items"),
        ("one", {"n": 10}, "one.n"),
        ("one", [1], "one"),
        ("flag", 0, "flag"),
    ],
)
def test_schema_helpers_refuse_outside_what_they_declare(field, value, where):
    _, probe = declare()
    with pytest.raises(WireError) as exc:
        probe.from_obj({**good_obj(), field: value})
    assert exc.value.reason is Reason.MALFORMED
    # the detail names the field by its path from the top-level message
    assert exc.value.detail.startswith(f"test/probe/1.{where}:"), exc.value.detail


def test_list_of_messages_detail_says_how_many_items_are_allowed():
    _, probe = declare()
    with pytest.raises(WireError) as exc:
        probe.from_obj({**good_obj(), "items": [{"n": 1}] * 3})
    assert exc.value.detail == "test/probe/1.items: more than 2 items"


# --- admission and the replay window -----------------------------------------------------

A, B = Identity.generate(), Identity.generate()


def info(seq, *, who=A, run_id="run-1", ts_ms=1_000_000):
    return NodeInfo(
        run_id=run_id,
        sender=who.peer_id,
        seq=seq,
        ts_ms=ts_ms,
        role="trainer",
        state="up",
        addrs=[],
        session=0,
        announced=0,
    )


def announcement(seq, *, who=A):
    return Announcement(
        run_id="run-1", sender=who.peer_id, seq=seq, ts_ms=1_000_000, topic="t", session=0,
        index=0, body=b"",
    )  # fmt: skip


def refused(admission, message, now_ms=1_000_000, **kw):
    with pytest.raises(WireError) as exc:
        admission.admit(message, now_ms, **kw)
    return exc.value


def test_replay_is_tracked_per_sender_and_per_message_type():
    adm = Admission("run-1")
    adm.admit(info(7), 1_000_000)
    adm.admit(info(7, who=B), 1_000_000)  # another sender, same seq
    adm.admit(announcement(7), 1_000_000)  # same sender, another channel
    err = refused(adm, info(7))
    assert (err.reason, err.detail) == (Reason.REPLAY, "seq 7 already seen or too old")


def test_admission_details_say_what_was_wrong():
    adm = Admission("run-1", max_skew_ms=1000)
    err = refused(adm, info(1, run_id="run-2"))
    assert (err.reason, err.detail) == (Reason.WRONG_RUN, "run 'run-2', expected 'run-1'")
    err = refused(adm, info(1), remote_peer=B.peer_id)
    assert (err.reason, err.detail) == (Reason.SENDER_MISMATCH, "sender is not the stream's peer")
    err = refused(adm, info(1, ts_ms=1_000_000 - 1001))
    assert (err.reason, err.detail) == (Reason.STALE, "timestamp off by -1001 ms")
    err = refused(adm, info(1, ts_ms=1_000_000 + 1001))
    assert err.detail == "timestamp off by 1001 ms"


def test_replay_window_takes_a_jump_of_any_size_in_constant_space():
    w = ReplayWindow(window=64)
    assert w.accept(("a", "t"), 1)
    assert w.accept(("a", "t"), 2**63)  # a jump far beyond the window resets it
    assert not w.accept(("a", "t"), 2**63)
    assert not w.accept(("a", "t"), 1)
    for seq in range(2**63 + 1, 2**63 + 1000):
        assert w.accept(("a", "t"), seq)
    # the state of a key is the highest seq and `window` bits, however many were accepted
    assert w._keys[("a", "t")].mask.bit_length() <= w.window


def test_replay_window_forgets_the_least_recently_used_key_first():
    w = ReplayWindow(window=8, max_keys=2)
    assert w.accept(("a", "t"), 5)
    assert w.accept(("b", "t"), 5)
    assert not w.accept(("a", "t"), 5)  # touches a: b is now the oldest
    assert w.accept(("c", "t"), 5)  # evicts b
    assert not w.accept(("a", "t"), 5)
    assert not w.accept(("c", "t"), 5)
    assert w.accept(("b", "t"), 5)  # b was forgotten


# --- frames ------------------------------------------------------------------------------


class Recorder:
    def __init__(self):
        self.written = []

    async def write(self, data):
        self.written.append(data)


class HugeBody:
    """Stands for a body of ``n`` bytes without allocating it: concatenation records the
    header it is appended to."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __radd__(self, header):
        return ("header", header)


async def test_write_frame_takes_the_largest_length_the_header_can_say():
    out = Recorder()
    await write_frame(out, HugeBody(MAX_FRAME), 1)
    assert out.written == [("header", b"\xff\xff\xff\xff")]
    with pytest.raises(WireError) as exc:
        await write_frame(out, HugeBody(MAX_FRAME + 1), 1)
    assert exc.value.reason is Reason.OVERSIZED
    assert exc.value.detail == f"frame of {MAX_FRAME + 1} bytes cannot be encoded"


async def test_write_frame_timeout_detail_names_the_deadline(autojump_clock):
    class Stalled:
        async def write(self, data):
            await trio.sleep_forever()

    with pytest.raises(WireError) as exc:
        await write_frame(Stalled(), b"x", 2.5)
    assert (exc.value.reason, exc.value.detail) == (
        Reason.TIMEOUT,
        "write not accepted within 2.5 s",
    )


class Scripted:
    """A stream that returns the given chunks, then raises EOFError (as py-libp2p does)."""

    def __init__(self, *chunks):
        self.chunks = list(chunks)

    async def read(self, n=None):
        if not self.chunks:
            raise EOFError
        return self.chunks.pop(0)


async def test_a_stream_that_raises_eof_is_a_clean_end_or_a_truncation():
    reader = FrameReader(Scripted(b"\x00\x00\x00\x02ok"))
    assert await reader.read_frame(10, 1) == b"ok"
    with pytest.raises(EOFError):
        await reader.read_frame(10, 1)
    for sent, detail in [
        (b"\x00\x00\x00\x04ab", "stream ended after 2 of 4 bytes"),
        (b"\x00\x00\x00\x04", "stream ended after 0 of 4 bytes"),  # header, then nothing
        (b"\x00\x00", "stream ended after 2 of 4 bytes"),
    ]:
        with pytest.raises(WireError) as exc:
            await read_frame(Scripted(sent), 10, 1)
        assert (exc.value.reason, exc.value.detail) == (Reason.TRUNCATED, detail)


async def test_a_clean_end_between_frames_says_so():
    reader = FrameReader(Scripted())
    with pytest.raises(EOFError, match="^stream closed between frames$"):
        await reader.read_frame(10, 1)


async def test_read_timeout_detail_names_the_deadline(autojump_clock):
    class Silent:
        async def read(self, n=None):
            await trio.sleep_forever()

    with pytest.raises(WireError) as exc:
        await read_frame(Silent(), 10, 2.5)
    assert (exc.value.reason, exc.value.detail) == (
        Reason.TIMEOUT,
        "no complete frame within 2.5 s",
    )


async def test_trio_stream_reads_at_most_what_is_asked():
    a, b = trio.testing.memory_stream_pair()
    await a.send_all(b"0123456789")
    got = await TrioStream(b).read(4)
    assert got == b"0123"


# --- envelopes ---------------------------------------------------------------------------


def test_an_envelope_around_a_message_of_the_largest_size_opens():
    # 256 three-byte characters, the longest reason: the encoding comes within
    # ENVELOPE_OVERHEAD of MAX_SIZE
    big = Refusal(
        run_id="r" * 64, sender=A.peer_id, seq=2**64 - 1, ts_ms=2**64 - 1, reason="sender_mismatch",
        detail="\u20ac" * 256,
    )  # fmt: skip
    assert Refusal.MAX_SIZE - ENVELOPE_OVERHEAD < len(big.encode()) <= Refusal.MAX_SIZE
    assert max_envelope_size(Refusal, NodeInfo) == NodeInfo.MAX_SIZE + ENVELOPE_OVERHEAD
    assert open_message(seal(A, big), Refusal) == big


def envelope(**fields):
    good = {"d": NodeInfo.TYPE, "p": info(1).encode(), "k": bytes(32), "s": bytes(64)}
    return msgpack.packb({**good, **fields}, use_bin_type=True)


@pytest.mark.parametrize(
    ("data", "detail"),
    [
        (msgpack.packb([1, 2]), "envelope must be a map with keys d, p, k, s"),
        (msgpack.packb({"d": "x"}), "envelope must be a map with keys d, p, k, s"),
        (envelope(k=bytes(31)), "envelope fields have wrong types or lengths"),
        (envelope(p="text"), "envelope fields have wrong types or lengths"),
    ],
)
def test_malformed_envelope_details(data, detail):
    with pytest.raises(WireError) as exc:
        open_message(data, NodeInfo)
    assert (exc.value.reason, exc.value.detail) == (Reason.MALFORMED, detail)


@pytest.mark.parametrize(
    ("fields", "detail"),
    [
        ({"e": 1}, "not valid msgpack: 5 exceeds max_map_len(4)"),
        ({f"x{i}": i for i in range(11)}, "not valid msgpack: 15 exceeds max_map_len(4)"),
        ({"d": [1]}, "not valid msgpack: 1 exceeds max_array_len(0)"),
        ({"d": []}, "more than 1 maps and lists"),
        ({"d": {}}, "more than 1 maps and lists"),
    ],
)
def test_an_envelope_beyond_its_shape_is_refused_while_it_decodes(fields, detail):
    """Five keys, a list, a second container: refused by the decoder as they are met (a
    15-key fixmap too: the last fixmap header), not built and then found wrong."""
    with pytest.raises(WireError) as exc:
        open_message(envelope(**fields), NodeInfo)
    assert (exc.value.reason, exc.value.detail) == (Reason.MALFORMED, detail)


def test_an_oversized_envelope_names_its_size_and_the_limit():
    most = NodeInfo.MAX_SIZE + ENVELOPE_OVERHEAD
    with pytest.raises(WireError) as exc:
        open_message(bytes(most + 1), NodeInfo)
    assert (exc.value.reason, exc.value.detail) == (
        Reason.OVERSIZED,
        f"{most + 1} bytes > {most}",
    )


def test_a_message_with_an_unknown_field_is_malformed_and_names_it():
    obj = {**info(1).to_obj(), "zz": 1}
    with pytest.raises(WireError) as exc:
        NodeInfo.from_obj(obj)
    assert (exc.value.reason, exc.value.detail) == (
        Reason.MALFORMED,
        "intellect/node-info/1: unknown fields ['zz']",
    )


def test_unpack_limited_gives_lists_and_names_an_oversize():
    assert unpack_limited(msgpack.packb([1, [2]]), 100) == [1, [2]]  # lists, not tuples
    with pytest.raises(WireError) as exc:
        unpack_limited(bytes(101), 100)
    assert (exc.value.reason, exc.value.detail) == (Reason.OVERSIZED, "101 bytes > 100")


# --- names -------------------------------------------------------------------------------


def test_topics_and_dht_keys_are_the_spec_strings():
    assert ids.presence_topic("run-1") == "/intellect/run-1/presence/1"
    assert ids.announce_topic("run-1") == "/intellect/run-1/announce/1"
    assert ids.role_key("run-1", "validator") == "/intellect/run-1/role/validator"
    assert ids.weights_key("run-1", 3) == "/intellect/run-1/weights/3"
    for bad in ("Run", "", "-x", "a" * 65):
        with pytest.raises(ValueError, match="run id must match") as exc:
            ids.presence_topic(bad)
        assert repr(bad) in str(exc.value)
        for make in (ids.announce_topic, lambda r: ids.role_key(r, "trainer")):
            with pytest.raises(ValueError, match="run id"):
                make(bad)
        with pytest.raises(ValueError, match="run id"):
            ids.weights_key(bad, 1)
    with pytest.raises(ValueError, match="unknown role 'miner'"):
        ids.role_key("run-1", "miner")


# --- error values, envelopes' rejection details, decoding -------------------------------


def test_wire_error_without_detail_is_its_reason():
    err = WireError(Reason.BUSY)
    assert (str(err), err.reason, err.detail) == ("busy", Reason.BUSY, "")
    err = WireError(Reason.BUSY, "all 4 slots taken")
    assert (str(err), err.detail) == ("busy: all 4 slots taken", "all 4 slots taken")


def test_open_message_details_for_type_signature_and_sender():
    sealed = seal(A, info(1))
    with pytest.raises(WireError) as exc:
        open_message(sealed, Announcement)
    assert (exc.value.reason, exc.value.detail) == (
        Reason.WRONG_TYPE,
        "'intellect/node-info/1' not accepted here",
    )
    obj = msgpack.unpackb(sealed)
    forged = msgpack.packb({**obj, "s": bytes(64)}, use_bin_type=True)
    with pytest.raises(WireError) as exc:
        open_message(forged, NodeInfo)
    assert (exc.value.reason, exc.value.detail) == (
        Reason.BAD_SIGNATURE,
        "bad signature for domain 'intellect/node-info/1'",
    )
    with pytest.raises(WireError) as exc:
        open_message(seal(B, info(1)), NodeInfo)  # claims A, signed by B
    assert (exc.value.reason, exc.value.detail) == (
        Reason.SENDER_MISMATCH,
        "sender is not the signer",
    )


def test_decoding_refuses_ext_types_and_non_maps_and_encoding_refuses_oversize():
    with pytest.raises(WireError) as exc:
        unpack_limited(msgpack.packb(msgpack.ExtType(5, b"x")), 100)
    assert (exc.value.reason, exc.value.detail) == (
        Reason.MALFORMED,
        "msgpack ext type 5 not allowed",
    )
    with pytest.raises(WireError) as exc:
        NodeInfo.decode(msgpack.packb([1, 2]))
    assert (exc.value.reason, exc.value.detail) == (
        Reason.MALFORMED,
        "intellect/node-info/1: expected a map",
    )
    huge = Refusal(
        run_id="r", sender=A.peer_id, seq=1, ts_ms=1, reason="busy", detail="\U0001f600" * 256
    )
    with pytest.raises(WireError) as exc:
        huge.encode()
    assert exc.value.reason is Reason.OVERSIZED
    assert (
        exc.value.detail
        == f"intellect/refusal/1: {len(msgpack.packb({'type': Refusal.TYPE, **huge.to_obj()}))} bytes > 1024"
    )


def test_bool_fields_take_only_bools():
    query = WeightsQuery(
        run_id="r", sender=A.peer_id, seq=1, ts_ms=1, version=0, with_manifest=True
    )
    assert WeightsQuery.decode(query.encode()) == query
    obj = {**query.to_obj(), "with_manifest": 1}
    with pytest.raises(WireError) as exc:
        WeightsQuery.from_obj(obj)
    assert (exc.value.reason, exc.value.detail) == (
        Reason.MALFORMED,
        "intellect/weights-query/1.with_manifest: expected bool",
    )


# --- rollout batches: what a refused worker is told ----------------------------------------

WORKER = "0x" + "ab" * 20


def rollout_batch(**sample_fields):
    sample = {
        "sample": 0,
        "seed": derive_seed(WORKER, "t1", 3, 0),
        "tokens": pack_tokens([5]),
        "logprobs": pack_floats([-0.5]),
        "finish_reason": "stop",
        "reward": 1.0,
        "proofs": [bytes(proof_size(1))],
        **sample_fields,
    }
    return {
        "run_id": "r", "sender": A.peer_id, "seq": 1, "ts_ms": 1, "worker": WORKER, "step": 3,
        "policy_version": 1, "taskset": "ts", "group_size": 1, "max_new_tokens": 4,
        "temperature": 1.0, "top_p": 1.0, "proof_chunk": 32, "proof_topk": 1,
        "groups": [{"index": 0, "task_id": "t1", "prompt": pack_tokens([1, 2]), "samples": [sample]}],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        ({"tokens": b""}, "sample: tokens must be a non-empty uint32 array"),
        ({"logprobs": pack_floats([-0.5, -0.5])}, "sample: 2 logprobs for 1 tokens"),
        ({"logprobs": pack_floats([0.5])}, "sample: logprobs must be finite and <= 0"),
        ({"seed": 1}, "group 0 sample 0: seed is not derive_seed(worker, task_id, step, sample)"),
        ("top_p", "batch: top_p must be > 0"),
    ],
)
def test_rollout_batch_rejection_details(change, detail):
    obj = rollout_batch(**change) if isinstance(change, dict) else {**rollout_batch(), "top_p": 0.0}
    assert RolloutBatch.from_obj(rollout_batch()).num_tokens == 1
    with pytest.raises(WireError) as exc:
        RolloutBatch.from_obj(obj)
    assert (exc.value.reason, exc.value.detail) == (Reason.MALFORMED, detail)


# --- SHARDCAST codecs ----------------------------------------------------------------------


def weight_manifest(run_id="run-1", signer=A, total=MIN_SHARD + 1):
    shards = -(-total // MIN_SHARD)
    return WeightManifest(
        run_id=run_id, sender=signer.peer_id, seq=1, ts_ms=1, version=1, step=0,
        shard_size=MIN_SHARD, total_size=total, digest=bytes(32),
        files=[WeightFile(name="model.safetensors", size=total, offset=0)],
        shard_hashes=bytes(32 * shards),
    )  # fmt: skip


def test_shard_ranges_end_at_the_last_shard():
    m = weight_manifest()
    assert m.num_shards == 2
    assert m.shard_range(1) == (MIN_SHARD, MIN_SHARD + 1)
    for index in (2, -1):
        with pytest.raises(IndexError) as exc:
            m.shard_range(index)
        assert str(exc.value) == f"shard {index} of 2"


def test_open_manifest_details_and_manifest_id():
    env = seal(A, weight_manifest(run_id="other"))
    assert manifest_id(env) == digest(env)
    with pytest.raises(WireError) as exc:
        open_manifest(env, run_id="run-1", trainer=A.peer_id)
    assert (exc.value.reason, exc.value.detail) == (Reason.WRONG_RUN, "manifest of run 'other'")
    with pytest.raises(WireError) as exc:
        open_manifest(seal(A, weight_manifest()), run_id="run-1", trainer=None)
    assert (exc.value.reason, exc.value.detail) == (
        Reason.BAD_SIGNATURE,
        "no trainer_peer_id configured: no trust root",
    )


def test_notice_decoding_names_the_notice_in_its_detail():
    bad = msgpack.packb({"version": 0, "step": 1, "manifest": bytes(32)})
    with pytest.raises(WireError) as exc:
        check_notice(bad)
    assert exc.value.detail.startswith("weights notice.version: 0 not in"), exc.value.detail
    too_many = msgpack.packb({"version": 1, "step": 1, "manifest": bytes(32), "extra": 1})
    with pytest.raises(WireError) as exc:
        check_notice(too_many)
    assert exc.value.detail == "weights notice: 4 fields, at most 3"


def test_the_diloco_group_key_without_a_leader_is_the_runs_and_a_bad_leader_is_named():
    leader = Identity(bytes(range(32))).peer_id
    assert group_key("run-1") == "/intellect/run-1/diloco"
    assert group_key("run-1", "") == "/intellect/run-1/diloco"
    assert group_key("run-1", leader) == f"/intellect/run-1/diloco/{leader}"
    with pytest.raises(ValueError, match="^not a peer id: 'not/a peer'$"):
        group_key("run-1", "not/a peer")


@pytest.mark.parametrize("n", [1, 8, 9, 10, 17, 20])
def test_have_bitmap_round_trips_any_shard_count(n):
    held = {i for i in range(n) if i % 3 == 0 or i == n - 1}
    data = bitmap(held, n)
    assert len(data) == (n + 7) // 8
    assert unbitmap(data, n) == held
    with pytest.raises(WireError):
        unbitmap(data + b"\x00", n)


def test_manifest_checks_say_what_does_not_add_up():
    def refused(**over):
        obj = {**weight_manifest().to_obj(), **over}
        with pytest.raises(WireError) as exc:
            WeightManifest.from_obj(obj)
        assert exc.value.reason is Reason.MALFORMED
        return exc.value.detail

    assert refused(files=[]) == "manifest lists no files"
    nested = [
        {"name": "x/y", "size": 1, "offset": 0},
        {"name": "x/y/z", "size": MIN_SHARD, "offset": 1},
    ]
    assert refused(files=nested) == "'x/y/z' lies under another file"
    total = MAX_SHARDS * MIN_SHARD + 1
    too_many = refused(total_size=total, files=[{"name": "w", "size": total, "offset": 0}])
    assert too_many == f"{MAX_SHARDS + 1} shards > {MAX_SHARDS}"


def test_file_names_have_no_dot_segments():
    assert is_file_name("tokenizer/tokenizer.json") and is_file_name("a..b/.c")
    for bad in ("a/../b", "..", "a/.", "./a", "/a", "a//b", ""):
        assert not is_file_name(bad), bad
