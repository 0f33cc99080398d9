"""Derive the spec vectors from SPEC.md alone, without the project's code.

    python tests/vectors/derive.py          # rewrites the JSON files beside this script

Everything here is written from the SPEC's text with the standard library (struct,
hashlib, math) and the ``cryptography`` package for Ed25519 (RFC 8032 signatures are
deterministic): a hand-written msgpack encoder, base58btc, BLAKE2b framing, the TOPLOC
top-k / modulus / interpolation in plain Python integers, the sampler's splitmix64 hash
in plain integers. ``tests/test_vectors.py`` checks the project's implementation against
the files; a second implementation of SPEC.md can check itself against them too.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent

# ---- msgpack (https://github.com/msgpack/msgpack/blob/master/spec.md), as SPEC §5 uses it


def mp(value: object) -> bytes:
    if value is None:
        return b"\xc0"
    if value is True:
        return b"\xc3"
    if value is False:
        return b"\xc2"
    if isinstance(value, int):
        if value < 0:
            raise ValueError("the spec's integers are non-negative")
        if value < 0x80:
            return bytes([value])
        for tag, fmt, limit in ((0xCC, ">B", 1 << 8), (0xCD, ">H", 1 << 16), (0xCE, ">I", 1 << 32)):
            if value < limit:
                return bytes([tag]) + struct.pack(fmt, value)
        return b"\xcf" + struct.pack(">Q", value)
    if isinstance(value, float):
        return b"\xcb" + struct.pack(">d", value)
    if isinstance(value, str):
        raw = value.encode()
        n = len(raw)
        if n < 32:
            return bytes([0xA0 | n]) + raw
        if n < 1 << 8:
            return b"\xd9" + bytes([n]) + raw
        if n < 1 << 16:
            return b"\xda" + struct.pack(">H", n) + raw
        return b"\xdb" + struct.pack(">I", n) + raw
    if isinstance(value, bytes):
        n = len(value)
        if n < 1 << 8:
            return b"\xc4" + bytes([n]) + value
        if n < 1 << 16:
            return b"\xc5" + struct.pack(">H", n) + value
        return b"\xc6" + struct.pack(">I", n) + value
    if isinstance(value, list):
        n = len(value)
        head = bytes([0x90 | n]) if n < 16 else b"\xdc" + struct.pack(">H", n)
        return head + b"".join(mp(v) for v in value)
    if isinstance(value, dict):
        n = len(value)
        head = bytes([0x80 | n]) if n < 16 else b"\xde" + struct.pack(">H", n)
        return head + b"".join(mp(k) + mp(v) for k, v in value.items())
    raise TypeError(type(value))


# ---- identities (SPEC §3; libp2p peer ids)

B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def base58(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = ""
    while n:
        n, r = divmod(n, 58)
        out = B58[r] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def peer_id(public_key: bytes) -> str:
    """libp2p: identity multihash of the protobuf PublicKey {Type: Ed25519 (1), Data}."""
    proto = b"\x08\x01\x12\x20" + public_key
    return base58(b"\x00" + bytes([len(proto)]) + proto)


def ed25519_key(seed: bytes):  # type: ignore[no-untyped-def]
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    key = Ed25519PrivateKey.from_private_bytes(seed)
    return key, key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def signing_bytes(domain: str, payload: bytes) -> bytes:
    d = domain.encode("ascii")
    return b"intellect-node/sig/v1\x00" + bytes([len(d)]) + d + payload


def digest_parts(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=32)
    for p in parts:
        h.update(len(p).to_bytes(8, "big") + p)
    return h.digest()


# ---- the sampler (SPEC §11)

M64 = 1 << 64


def derive_seed(worker: str, task_id: str, step: int, sample: int) -> int:
    d = digest_parts(
        b"intellect-node/sampling-seed/v1",
        worker.encode(),
        task_id.encode(),
        step.to_bytes(8, "big"),
        sample.to_bytes(8, "big"),
    )
    return int.from_bytes(d[:8], "big") >> 1


def position_key(seed: int, position: int) -> int:
    d = digest_parts(
        b"intellect-node/sampling-pos/v2", seed.to_bytes(8, "big"), position.to_bytes(8, "big")
    )
    return int.from_bytes(d[:8], "big")


def uniform_numerator(seed: int, position: int, token: int) -> int:
    """u = (numerator + 0.5) / 2^53."""
    z = (position_key(seed, position) + (token + 1) * 0x9E3779B97F4A7C15) % M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % M64
    z ^= z >> 31
    return z >> 11


def gumbel(seed: int, position: int, token: int) -> float:
    u = (uniform_numerator(seed, position, token) + 0.5) / 2.0**53
    return -math.log(-math.log(u))


# ---- TOPLOC (SPEC §11)

P = 65497


def bf16_bits(x: float) -> int:
    bits = struct.unpack(">I", struct.pack(">f", x))[0]
    assert bits & 0xFFFF == 0, "vector values are exact in bf16"
    return bits >> 16


def toploc_proof(chunk: list[float], k: int = 128) -> bytes:
    """One chunk (flattened, row-major) to its 258-byte proof, in plain integers."""
    entries = [(bf16_bits(v) & 0x7FFF, i) for i, v in enumerate(chunk)]
    entries.sort(key=lambda e: (-e[0], e[1]))  # magnitude, then the lower index first
    picked = entries[: min(k, len(chunk))]
    idx = [i for _, i in picked]
    ys = [bf16_bits(chunk[i]) % P for i in idx]
    m = P
    while len({i % m for i in idx}) != len(idx):
        m -= 1
    xs = [i % m for i in idx]
    coeffs = [0] * len(xs)
    for i, (xi, yi) in enumerate(zip(xs, ys, strict=True)):  # Lagrange, expanded
        basis, denom = [1], 1
        for j, xj in enumerate(xs):
            if j != i:
                basis = [(a - xj * b) % P for a, b in zip([0, *basis], [*basis, 0], strict=True)]
                denom = denom * (xi - xj) % P
        scale = yi * pow(denom, P - 2, P) % P
        coeffs = [(c + scale * b) % P for c, b in zip(coeffs, basis, strict=True)]
    coeffs += [0] * (k - len(coeffs))
    return struct.pack(f">{1 + k}H", m, *coeffs)


def value(i: int, j: int) -> float:
    """Deterministic values exact in bf16, with many equal magnitudes (ties)."""
    return ((i * 37 + j * 101) % 255 - 127) / 8.0


# ---- the vectors


def jsonable(v: object) -> object:
    """bytes become {"bin": hex} so that the files stay JSON."""
    if isinstance(v, bytes):
        return {"bin": v.hex()}
    if isinstance(v, list):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    return v


def frames() -> dict:
    bodies = [b"", b"\x00", b"hello", bytes(range(256)) * 3]
    return {
        "spec": "SPEC §6: u32 big-endian length, then the body",
        "cases": [
            {"body": b.hex(), "frame": (struct.pack(">I", len(b)) + b).hex()} for b in bodies
        ],
    }


SEED = bytes(range(1, 33))
HEADER = {
    "run_id": "vector-run",
    "sender": "",
    "seq": 1_700_000_000_000_001,
    "ts_ms": 1_700_000_000_000,
}


def messages() -> dict:
    key, public = ed25519_key(SEED)
    sender = peer_id(public)
    head = {**HEADER, "sender": sender}
    worker = "0x" + "ab" * 20
    samples = []
    for s in range(2):
        samples.append(
            {
                "sample": s,
                "seed": derive_seed(worker, "arith/v2/d1/7", 3, s),
                "tokens": struct.pack("<3I", 5, 6 + s, 7),
                "logprobs": struct.pack("<3f", -0.5, -1.25, -0.125),
                "finish_reason": "length",
                "reward": 1.0 if s == 0 else 0.0,
                "proofs": [bytes([s, 1, 2, 3, 4, 5]), bytes([s, 9, 8, 7, 6, 5])],
            }
        )
    batch_fields = {
        "worker": worker,
        "step": 3,
        "policy_version": 2,
        "taskset": "arithmetic",
        "group_size": 2,
        "max_new_tokens": 3,
        "temperature": 1.0,
        "top_p": 0.95,
        "proof_chunk": 32,
        "proof_topk": 2,
        "groups": [
            {
                "index": 0,
                "task_id": "arith/v2/d1/7",
                "prompt": struct.pack("<4I", 2, 40, 41, 300),
                "samples": samples,
            }
        ],
    }
    table = [
        (
            "intellect/node-info/1",
            {
                "role": "inference",
                "state": "up",
                "addrs": ["/ip4/127.0.0.1/tcp/4001"],
                "session": 1_700_000_000_000_000,
                "announced": 7,
            },
        ),
        (
            "intellect/announcement/1",
            {
                "topic": "test",
                "session": 1_700_000_000_000_000,
                "index": 300,
                "body": b"\x01\x02\xff",
            },
        ),
        (
            "intellect/sync-request/1",
            {"session": 1_700_000_000_000_000, "indices": [0, 1, 200, 70000]},
        ),
        ("intellect/sync-reply/1", {"items": [b"\x82\xa1a\x01", b""]}),
        ("intellect/refusal/1", {"reason": "replay", "detail": "seq 5 already seen"}),
        ("intellect/rollout-batch/1", batch_fields),
        ("intellect/batch-request/1", {"work_key": bytes(range(32)), "voucher": bytes(65)}),
        ("intellect/batch-reply/1", {"work_key": bytes(range(32)), "size": 70_000}),
        ("intellect/weight-manifest/1", MANIFEST),
        ("intellect/weights-query/1", {"version": 7, "with_manifest": True}),
        # "manifest": the weight-manifest case's envelope, filled in below
        ("intellect/weights-holding/1", {"version": 7, "manifest": b"", "have": b"\x03"}),
        ("intellect/shard-request/1", {"version": 7, "index": 1}),
        ("intellect/shard-reply/1", {"version": 7, "index": 1, "size": 34_464}),
        (
            "intellect/diloco-request/1",
            {
                "op": "sync",
                "step": 4,
                "attempt": 1,
                "phase": "",
                "round": 0,
                "layout": "0123456789abcdef0123456789abcdef",
                "norm": 1.5,
                "state": "ab" * 32,
                "blame": "",
            },
        ),
        (
            "intellect/diloco-roster/1",
            {
                "step": 4,
                "attempt": 1,
                "state": "ready",
                "encoding": "int8",
                "members": [sender],
                "norms": [1.5],
            },
        ),
        (
            "intellect/diloco-chunk/1",
            {
                "step": 4,
                "attempt": 1,
                "phase": "rs",
                "round": 2,
                "size": 1124,
                "digest": hashlib.sha256(b"chunk").digest(),
            },
        ),
        (
            "intellect/run-manifest/1",
            {"terms": run_terms(sender), "chain_urls": ["https://rpc.example.org/"]},
        ),
        ("intellect/manifest-query/1", {}),
        # "manifest": the run-manifest case's envelope, filled in below
        ("intellect/manifest-reply/1", {"manifest": b""}),
    ]
    cases = []
    for mtype, fields in table:
        if mtype in ("intellect/weights-holding/1", "intellect/manifest-reply/1"):
            fields = {**fields, "manifest": bytes.fromhex(cases[-2]["envelope"])}
        extra = {}
        if mtype == "intellect/run-manifest/1":  # under the run id its terms hash to (§2)
            terms_digest = hashlib.blake2b(
                b"intellect/run-terms/1\x00" + mp(fields["terms"]), digest_size=32
            ).digest()
            run_id = f"{fields['terms']['name']}-{terms_digest[:16].hex()}"
            fields = {**fields}
            extra = {"terms_digest": terms_digest.hex(), "derived_run_id": run_id}
        payload = mp({"type": mtype, **head, **fields, **({"run_id": run_id} if extra else {})})
        signed = signing_bytes(mtype, payload)
        signature = key.sign(signed)
        envelope = mp({"d": mtype, "p": payload, "k": public, "s": signature})
        case = {
            "type": mtype,
            "fields": jsonable({**head, **fields, **({"run_id": run_id} if extra else {})}),
            **extra,
            "payload": payload.hex(),
            "signing_bytes": signed.hex(),
            "signature": signature.hex(),
            "envelope": envelope.hex(),
        }
        if mtype == "intellect/rollout-batch/1":  # without type, seq and ts_ms
            canonical = mp({"run_id": head["run_id"], "sender": head["sender"], **batch_fields})
            case["work_key"] = digest_parts(
                b"intellect-node/work-key/v1", mtype.encode(), canonical
            ).hex()
        cases.append(case)
    return {
        "spec": "SPEC §3 (envelope, signing bytes), §5 (messages: type, header fields, then the "
        "table's fields, in that order; smallest msgpack integer forms, bin for bytes, float64), "
        "§5 work key, §14 (SHARDCAST messages), §15 (DiLoCo messages), §2 (the run manifest: "
        "its header's run id is the one its terms hash to); bodies: the "
        "announcement bodies of §5 (batch and step notices, typed, no header) and §14 (the "
        "weights notice: no type)",
        "private_key_seed": SEED.hex(),
        "public_key": public.hex(),
        "peer_id": sender,
        "cases": cases,
        "bodies": bodies(),
    }


def run_terms(trainer: str) -> dict:
    """A run manifest's terms (SPEC §2), in the table's order; the BLAKE3 hashes are
    arbitrary 32-byte values (the encoding does not depend on them)."""
    return {
        "format": 1,
        "name": "math",
        "trainer": trainer,
        "chain_id": 31337,
        "contract": "0x" + "ab" * 20,
        "contract_block": 7,
        "model": [
            {"name": "config.json", "size": 600, "blake3": bytes(32)},
            {"name": "model.safetensors", "size": 70_000, "blake3": bytes(range(32))},
        ],
        "taskset": "arithmetic:2-3",
        "taskset_file": [],
        "verify_profile": "strict-fp32",
        "temperature": 1.0,
        "top_p": 0.95,
        "max_new_tokens": 48,
        "group_size": 4,
        "tasks_per_batch": 4,
        "async_level": 2,
    }


# a manifest of two files in two shards (64 KiB + the rest); the digests are arbitrary
# 32-byte values (the encoding does not depend on them): BLAKE3 is not in the standard library
MANIFEST = {
    "version": 7,
    "step": 6,
    "shard_size": 65_536,
    "total_size": 100_000,
    "digest": bytes(range(100, 132)),
    "files": [
        {"name": "config.json", "size": 1_000, "offset": 0},
        {"name": "model.safetensors", "size": 99_000, "offset": 1_000},
    ],
    "shard_hashes": bytes(range(64)),
}


def bodies() -> list[dict]:
    """Announcement bodies: not enveloped (the announcement is), no header."""
    table = [
        (
            "intellect/batch-notice/1",
            True,
            {
                "work_key": bytes(range(32)),
                "worker": "0x" + "ab" * 20,
                "step": 3,
                "policy_version": 2,
                "units": 6,
                "size": 70_000,
            },
        ),
        ("intellect/step-notice/1", True, {"step": 300, "policy_version": 299}),
        ("intellect/weights-notice/1", False, {"version": 7, "step": 6, "manifest": bytes(32)}),
    ]
    return [
        {
            "type": mtype,
            "typed": typed,
            "fields": jsonable(fields),
            "body": mp({"type": mtype, **fields} if typed else fields).hex(),
        }
        for mtype, typed, fields in table
    ]


def names() -> dict:
    """Protocol ids (SPEC §6, §7, §8), gossip topics (§7) and DHT keys (§8, §17) of a run."""
    run = HEADER["run_id"]
    _, public = ed25519_key(SEED)
    leader = peer_id(public)
    return {
        "spec": "SPEC §6 (protocol ids), §7 (gossipsub id, topics), §8 (kad id, DHT keys), "
        "§15 (the DiLoCo group key), §17 (the relay key); UTF-8 strings",
        "run_id": run,
        "leader": leader,
        "protocols": {
            "presence": "/intellect/presence/1.0.0",
            "sync": "/intellect/sync/1.0.0",
            "batch": "/intellect/batch/1.0.0",
            "weights": "/intellect/weights/1.0.0",
            "shardcast": "/intellect/shardcast/1.0.0",
            "diloco": "/intellect/diloco/1.0.0",
            "diloco_state": "/intellect/diloco-state/1.0.0",
            "diloco_shard": "/intellect/diloco-shard/1.0.0",
            "kad": "/intellect/kad/1.0.0",
            "gossipsub": "/meshsub/1.1.0",
        },
        "topics": {
            "presence": f"/intellect/{run}/presence/1",
            "announce": f"/intellect/{run}/announce/1",
        },
        "announcement_topics": {"batches": "batches", "steps": "steps", "weights": "weights"},
        "dht_keys": {
            **{f"role/{r}": f"/intellect/{run}/role/{r}" for r in ROLES},
            "weights/7": f"/intellect/{run}/weights/7",
            "diloco/<leader>": f"/intellect/{run}/diloco/{leader}",
            "relay": f"/intellect/{run}/relay",
        },
    }


ROLES = ("bootstrap", "inference", "validator", "trainer")  # SPEC §2


def sampler() -> dict:
    worker = "0x" + "ab" * 20
    seeds = [
        {
            "worker": worker,
            "task_id": t,
            "step": st,
            "sample": s,
            "seed": derive_seed(worker, t, st, s),
        }
        for t, st, s in (
            ("arith/v2/d1/7", 3, 0),
            ("arith/v2/d1/7", 3, 1),
            ("x", 0, 63),
            ("math/abc", 2**40, 5),
        )
    ]
    noise = []
    for seed, position, token in (
        (12345, 0, 0),
        (12345, 0, 1),
        (12345, 7, 4095),
        (2**62 + 11, 1000, 31999),
        (seeds[0]["seed"], 2, 17),
    ):
        noise.append(
            {
                "seed": seed,
                "position": position,
                "token": token,
                "position_key": position_key(seed, position),
                "uniform_numerator": uniform_numerator(seed, position, token),
                "gumbel": gumbel(seed, position, token),
            }
        )
    # one draw: argmax(logits / T + noise) over a 5-token vocabulary, T = 0.7
    logits = [1.0, 2.0, 0.5, 2.25, -1.0]
    draws = []
    for position in range(6):
        scores = [x / 0.7 + gumbel(777, position, t) for t, x in enumerate(logits)]
        draws.append(max(range(5), key=lambda t: scores[t]))
    return {
        "spec": "SPEC §11: sequence seeds, position keys, the splitmix64 draw, Gumbel noise",
        "seeds": seeds,
        "noise": noise,
        "draw": {"seed": 777, "temperature": 0.7, "logits": logits, "tokens": draws},
    }


def toploc() -> dict:
    hidden = 40
    prefill = [[value(i, j) for j in range(hidden)] for i in range(5)]
    decode = [[value(100 + i, j) for j in range(hidden)] for i in range(37)]
    chunks = [sum(prefill, [])] + [sum(decode[s : s + 32], []) for s in range(0, 37, 32)]
    wide = [value(i, j) for i in range(600) for j in range(128)]  # 76,800 entries > 65,497
    boosted_from = [0, P]  # 64 large entries at 0.. and at 65,497..: they collide mod p
    for lo in boosted_from:
        for idx in range(lo, lo + 64):
            wide[idx] = float((64 + idx % 61) * (1 - 2 * (idx % 2)))
    small = [value(3, j) for j in range(20)]  # fewer than k entries
    return {
        "spec": "SPEC §11 TOPLOC: chunks, top-k by magnitude then lower index, modulus, "
        "interpolation over GF(65497), u16 big-endian bytes",
        "value": "((i*37 + j*101) % 255 - 127) / 8 for row i, column j",
        "sequence": {
            "prefill_rows": [0, 5],
            "decode_rows": [100, 137],
            "hidden": hidden,
            "chunk_size": 32,
            "proofs": [toploc_proof(c).hex() for c in chunks],
        },
        "wide_chunk": {
            "rows": [0, 600],
            "hidden": 128,
            "boosted_from": boosted_from,
            "boosted": "flat index idx in [lo, lo + 64) holds (64 + idx % 61) * (1 - 2 * (idx % 2))",
            "proof": toploc_proof(wide).hex(),
        },
        "small_chunk": {"row": 3, "width": 20, "proof": toploc_proof(small).hex()},
    }


def main() -> None:
    for name, build in (
        ("frames", frames),
        ("messages", messages),
        ("names", names),
        ("sampler", sampler),
        ("toploc", toploc),
    ):
        (HERE / f"{name}.json").write_text(json.dumps(build(), indent=1) + "\n")
        print(f"wrote {name}.json")


if __name__ == "__main__":
    main()
