"""The project's bytes against the spec vectors of ``tests/vectors/`` (derived from SPEC.md
by ``tests/vectors/derive.py`` without the project's code)."""

import json
import math
from pathlib import Path

import pytest
import torch
import trio
import trio.testing

from crypto.envelope import signing_bytes
from crypto.identity import Identity, peer_id_of
from crypto.sampling import (
    derive_seed,
    gumbel_noise_rows,
    position_key,
    reference_uniform,
    sample_tokens,
)
from crypto.toploc import build_proofs
from protocol import diloco, ids, shardcast
from protocol.batches import (
    BATCH_TOPIC,
    STEP_TOPIC,
    BatchNotice,
    BatchReply,
    BatchRequest,
    StepNotice,
)
from protocol.diloco import DilocoChunk, DilocoRequest, DilocoRoster
from protocol.framing import TrioStream, read_frame, write_frame
from protocol.manifest import ManifestQuery, ManifestReply, RunManifest, run_id_of
from protocol.messages import Announcement, NodeInfo, Refusal, SyncReply, SyncRequest
from protocol.rollouts import RolloutBatch
from protocol.shardcast import (
    ShardReply,
    ShardRequest,
    WeightManifest,
    WeightsHolding,
    WeightsNotice,
    WeightsQuery,
)
from protocol.wire import open_message, seal

VECTORS = Path(__file__).parent / "vectors"
CLASSES = {
    c.TYPE: c
    for c in (
        NodeInfo,
        Announcement,
        SyncRequest,
        SyncReply,
        Refusal,
        RolloutBatch,
        BatchRequest,
        BatchReply,
        WeightManifest,
        WeightsQuery,
        WeightsHolding,
        ShardRequest,
        ShardReply,
        DilocoRequest,
        DilocoRoster,
        DilocoChunk,
        RunManifest,
        ManifestQuery,
        ManifestReply,
    )
}
BODIES = {c.TYPE: c for c in (BatchNotice, StepNotice, WeightsNotice)}


def load(name):
    return json.loads((VECTORS / f"{name}.json").read_text())


def plain(v):
    if isinstance(v, dict) and set(v) == {"bin"}:
        return bytes.fromhex(v["bin"])
    if isinstance(v, list):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    return v


async def test_frames():
    for case in load("frames")["cases"]:
        body = bytes.fromhex(case["body"])
        send, recv = trio.testing.memory_stream_pair()
        await write_frame(TrioStream(send), body, 5)
        await send.aclose()
        sent = b""
        while chunk := await recv.receive_some():
            sent += chunk
        assert sent.hex() == case["frame"]
        send, recv = trio.testing.memory_stream_pair()
        await send.send_all(bytes.fromhex(case["frame"]))
        assert await read_frame(TrioStream(recv), 1 << 20, 5) == body


MESSAGES = load("messages")


def test_identity_and_peer_id():
    identity = Identity(bytes.fromhex(MESSAGES["private_key_seed"]))
    assert identity.public_bytes.hex() == MESSAGES["public_key"]
    assert identity.peer_id == MESSAGES["peer_id"] == peer_id_of(identity.public_bytes)


@pytest.mark.parametrize("case", MESSAGES["cases"], ids=lambda c: c["type"])
def test_message_encoding_signing_and_envelope(case):
    identity = Identity(bytes.fromhex(MESSAGES["private_key_seed"]))
    cls = CLASSES[case["type"]]
    message = cls.from_obj(plain(case["fields"]))
    assert message.encode().hex() == case["payload"]
    assert signing_bytes(cls.TYPE, message.encode()).hex() == case["signing_bytes"]
    assert identity.sign(bytes.fromhex(case["signing_bytes"])).hex() == case["signature"]
    assert seal(identity, message).hex() == case["envelope"]
    assert open_message(bytes.fromhex(case["envelope"]), cls) == message
    if "work_key" in case:
        assert message.work_key().hex() == case["work_key"]
    if "derived_run_id" in case:  # a run manifest: under the run id its terms hash to
        assert message.terms.digest().hex() == case["terms_digest"]
        assert run_id_of(message.terms) == case["derived_run_id"] == message.run_id


def test_every_message_type_has_a_vector():
    assert {c["type"] for c in MESSAGES["cases"]} == set(CLASSES)
    assert {b["type"] for b in MESSAGES["bodies"]} == set(BODIES)


@pytest.mark.parametrize("case", MESSAGES["bodies"], ids=lambda c: c["type"])
def test_announcement_body_encoding(case):
    """Batch and step notices: typed maps, no header (the announcement's is theirs); the
    weights notice: a plain map with no type (SPEC §14)."""
    cls = BODIES[case["type"]]
    message = cls.from_obj(plain(case["fields"]))
    body = bytes.fromhex(case["body"])
    if case["typed"]:
        assert message.encode().hex() == case["body"]
        assert cls.decode(body) == message
    else:
        assert shardcast.encode_notice(message).hex() == case["body"]
        assert shardcast.check_notice(body) == message


NAMES = load("names")


def test_protocol_ids_topics_and_dht_keys():
    run, leader = NAMES["run_id"], NAMES["leader"]
    assert NAMES["protocols"] == {
        "presence": ids.PRESENCE,
        "sync": ids.SYNC,
        "batch": ids.BATCH,
        "weights": ids.WEIGHTS,
        "shardcast": ids.SHARDCAST,
        "diloco": diloco.DILOCO,
        "diloco_state": diloco.DILOCO_STATE,
        "diloco_shard": diloco.DILOCO_SHARD,
        "kad": ids.KAD,
        "gossipsub": ids.GOSSIPSUB,
    }
    assert NAMES["topics"] == {
        "presence": ids.presence_topic(run),
        "announce": ids.announce_topic(run),
    }
    assert NAMES["announcement_topics"] == {
        "batches": BATCH_TOPIC,
        "steps": STEP_TOPIC,
        "weights": shardcast.WEIGHTS_TOPIC,
    }
    assert NAMES["dht_keys"] == {
        **{f"role/{r}": ids.role_key(run, r) for r in ids.ROLES},
        "weights/7": ids.weights_key(run, 7),
        "diloco/<leader>": diloco.group_key(run, leader),
        "relay": ids.relay_key(run),
    }


SAMPLER = load("sampler")


def test_sequence_seeds():
    for s in SAMPLER["seeds"]:
        assert derive_seed(s["worker"], s["task_id"], s["step"], s["sample"]) == s["seed"]


def test_noise():
    for n in SAMPLER["noise"]:
        assert position_key(n["seed"], n["position"]) == n["position_key"]
        assert (
            reference_uniform(n["seed"], n["position"], n["token"])
            == (n["uniform_numerator"] + 0.5) / 2.0**53
        )
        row = gumbel_noise_rows([n["seed"]], [n["position"]], n["token"] + 1)[0]
        assert math.isclose(float(row[n["token"]]), n["gumbel"], rel_tol=1e-14, abs_tol=1e-14)


def test_a_draw():
    d = SAMPLER["draw"]
    logits = torch.tensor([d["logits"]] * len(d["tokens"]))
    noise = gumbel_noise_rows([d["seed"]] * len(d["tokens"]), list(range(len(d["tokens"]))), 5)
    assert sample_tokens(logits, noise, d["temperature"]).tolist() == d["tokens"]


TOPLOC = load("toploc")


def rows(lo, hi, width):
    return torch.tensor(
        [[((i * 37 + j * 101) % 255 - 127) / 8.0 for j in range(width)] for i in range(lo, hi)]
    )


def test_toploc_proof_bytes_of_a_sequence():
    seq = TOPLOC["sequence"]
    prefill = rows(*seq["prefill_rows"], seq["hidden"])
    decode = rows(*seq["decode_rows"], seq["hidden"])
    proofs = build_proofs([prefill, decode], chunk_size=seq["chunk_size"])
    assert [p.hex() for p in proofs] == seq["proofs"]
    # one decode state per step, as an engine without a buffer passes them: same bytes
    steps = [prefill, *decode.unbind(0)]
    assert [p.hex() for p in build_proofs(steps, chunk_size=seq["chunk_size"])] == seq["proofs"]


def test_toploc_proof_of_a_chunk_wider_than_the_field():
    wide = TOPLOC["wide_chunk"]
    chunk = rows(*wide["rows"], wide["hidden"]).flatten()
    for lo in wide["boosted_from"]:  # the largest entries, at indices that collide mod p
        idx = torch.arange(lo, lo + 64)
        chunk[idx] = ((64 + idx % 61) * (1 - 2 * (idx % 2))).float()
    (proof,) = build_proofs([chunk.reshape(-1, wide["hidden"])])
    assert proof.hex() == wide["proof"]
    assert int.from_bytes(proof[:2], "big") < 65497  # a modulus below p was needed


def test_toploc_proof_of_a_chunk_smaller_than_k():
    small = TOPLOC["small_chunk"]
    (proof,) = build_proofs([rows(small["row"], small["row"] + 1, small["width"])])
    assert proof.hex() == small["proof"]


def test_the_files_are_what_the_derivation_writes(tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("derive", VECTORS / "derive.py")
    derive = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(derive)
    monkeypatch.setattr(derive, "HERE", tmp_path)
    derive.main()
    for name in ("frames", "messages", "names", "sampler", "toploc"):
        assert (tmp_path / f"{name}.json").read_text() == (VECTORS / f"{name}.json").read_text()


def test_the_vector_proofs_verify_against_their_own_states():
    """Verification reduces indices mod m too: the wide chunk's proof (m < p) verifies
    exactly, and fails against other states."""
    from crypto.toploc import STRICT_FP32, verify_proofs

    wide = TOPLOC["wide_chunk"]
    chunk = rows(*wide["rows"], wide["hidden"]).flatten()
    for lo in wide["boosted_from"]:
        idx = torch.arange(lo, lo + 64)
        chunk[idx] = ((64 + idx % 61) * (1 - 2 * (idx % 2))).float()
    states = chunk.reshape(-1, wide["hidden"])
    proof = bytes.fromhex(wide["proof"])
    (ok,) = verify_proofs([states], [proof], thresholds=STRICT_FP32)
    assert ok.passed and ok.exp_mismatches == 0 and ok.mant_err_mean == 0
    (bad,) = verify_proofs([states * 1.5], [proof], thresholds=STRICT_FP32)
    assert not bad.passed
