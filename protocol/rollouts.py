"""Rollout batches: what an inference worker submits for one step.

A batch holds one GRPO group per assigned task: the task id, the prompt tokens and
``group_size`` samples, each with its output tokens, the log-probability of every output
token, the reward, the finish reason, the sampling seed and the TOPLOC proofs. Token ids
travel as little-endian uint32 arrays and log-probabilities as little-endian float32
arrays (``bytes``), so a batch of thousands of tokens is a few flat buffers, not
thousands of msgpack items. Every length, count and range is checked on decode
(``RolloutBatch.check``); SPEC.md lists them.

The batch is signed like every message (``protocol.wire.seal``); its *work key* is the
BLAKE2b digest of its canonical encoding without ``seq`` and ``ts_ms``, so the same work
always has the same key (the ledger accepts each key once).

Where a batch comes from: the worker's batch maker (``node/rollouts/maker.py``, run by
``node/roles/services/inference.py``) builds it and the role signs it. Where it goes next: a
validator fetches it (``node/roles/io/exchange.py``) and judges it
(``node/roles/services/validator.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import msgpack
import numpy as np

from crypto.hashing import digest_parts
from crypto.sampling import derive_seed
from crypto.toploc import proof_size
from protocol.errors import Reason, WireError
from protocol.messages import Header
from protocol.schema import FieldSpec, Message, blob, f64, listof, nested, text, u64

MAX_GROUPS = 256  # tasks per batch
MAX_GROUP_SIZE = 64  # samples per task (GRPO group size G)
MAX_PROMPT_TOKENS = 8192
MAX_NEW_TOKENS = 16384
MAX_PROOF_TOPK = 4096
MAX_PROOFS = 1 + MAX_NEW_TOKENS  # chunk size 1 is the worst case
MAX_BATCH_SIZE = 48 * 1024 * 1024
ADDRESS_PATTERN = r"0x[0-9a-f]{40}"
FINISH_REASONS = ("stop", "length")
WORK_KEY_DOMAIN = b"intellect-node/work-key/v1"


def pack_tokens(tokens: list[int] | np.ndarray) -> bytes:
    return np.asarray(tokens, dtype="<u4").tobytes()


def unpack_tokens(data: bytes) -> list[int]:
    out: list[int] = np.frombuffer(data, dtype="<u4").astype(np.int64).tolist()
    return out


def pack_floats(values: list[float] | np.ndarray) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def unpack_floats(data: bytes) -> list[float]:
    out: list[float] = np.frombuffer(data, dtype="<f4").astype(np.float64).tolist()
    return out


def expected_proofs(num_tokens: int, chunk_size: int) -> int:
    """Proofs of one sample: the prefill chunk, then one per ``chunk_size`` decode states
    (the last output token's state is never computed)."""
    return 1 + math.ceil((num_tokens - 1) / chunk_size)


# What a container's skeleton can grow by beyond its encoding with empty blobs and lists:
# each blob, string or list header at most 5 bytes (msgpack's 32-bit forms), of which the
# skeleton's own took at least 1
_HEADER_GROWTH = 4


def max_envelope_size(units: int, proof_chunk: int, proof_topk: int) -> int:
    """The most bytes the signed envelope of a batch of ``units`` generated tokens can take
    with these proof parameters (never above ``MAX_BATCH_SIZE`` + the envelope's overhead).

    A sample of n ≥ 1 tokens holds 8n bytes of tokens and log-probabilities and
    ``expected_proofs(n, chunk)`` ≤ 2 + n / chunk proofs; a batch has at most ``units``
    samples (each has a token) and at most ``min(samples, MAX_GROUPS)`` groups, each with a
    prompt of at most ``MAX_PROMPT_TOKENS``. So the bound is fixed + groups × (a group's
    skeleton + the longest prompt) + samples × (a sample's skeleton + 2 proofs) + units × (8
    bytes + a proof / chunk): a batch whose envelope is larger cannot have ``units`` tokens
    (the validator refuses its transfer before reading it: SPEC §13). Loose for long answers
    (about 15 MiB for the devnet's 10,240 tokens, whose batches take 0.3 MiB) and tight
    where it matters: 38 KiB for one unit, where any 48 MiB used to be read and decoded.
    """
    from protocol.wire import ENVELOPE_OVERHEAD

    proof = proof_size(proof_topk) + _HEADER_GROWTH + 1
    batch, group, sample = _skeletons()
    samples = min(units, MAX_GROUPS * MAX_GROUP_SIZE)
    groups = min(samples, MAX_GROUPS)
    total = (
        batch
        + ENVELOPE_OVERHEAD
        + groups * (group + 4 * MAX_PROMPT_TOKENS)
        + samples * (sample + 2 * proof)
        + units * 8
        + math.ceil(units * proof / proof_chunk)
    )
    return min(total, MAX_BATCH_SIZE + ENVELOPE_OVERHEAD)


@cache
def _skeletons() -> tuple[int, int, int]:
    """Upper bounds of the encoded batch without groups, a group without prompt or samples,
    and a sample without tokens, log-probabilities or proofs: every scalar at its longest."""
    address, name = "0x" + "f" * 40, "x" * 128
    sample = RolloutSample(
        sample=MAX_GROUP_SIZE - 1,
        seed=2**63 - 1,
        tokens=b"",
        logprobs=b"",
        finish_reason="length",
        reward=0.5,
        proofs=[],
    )
    group = RolloutGroup(index=2**32 - 1, task_id=name, prompt=b"", samples=[])
    big = 2**64 - 1
    batch = RolloutBatch(
        run_id="r" * 64,
        sender="p" * 64,
        seq=big,
        ts_ms=big,
        worker=address,
        step=big,
        policy_version=big,
        taskset=name,
        group_size=MAX_GROUP_SIZE,
        max_new_tokens=MAX_NEW_TOKENS,
        temperature=0.7,
        top_p=0.9,
        proof_chunk=MAX_NEW_TOKENS,
        proof_topk=MAX_PROOF_TOPK,
        groups=[],
    )

    def size(m: Message, containers: int, typed: bool = False) -> int:
        body = {"type": m.TYPE, **m.to_obj()} if typed else m.to_obj()
        return len(msgpack.packb(body, use_bin_type=True)) + containers * _HEADER_GROWTH

    # the batch's payload travels as a blob inside the envelope: its header counted too
    return size(batch, 2, typed=True), size(group, 2) + 1, size(sample, 3) + 1


def _bad(where: str, detail: str) -> WireError:
    return WireError(Reason.MALFORMED, f"{where}: {detail}")


@dataclass(frozen=True)
class RolloutSample(Message):
    TYPE = "intellect/rollout-sample/1"  # nested only; never sent alone
    MAX_SIZE = MAX_BATCH_SIZE

    sample: int = u64(0, MAX_GROUP_SIZE - 1)  # index within the group
    seed: int = u64(0, 2**63 - 1)  # derive_seed(worker, task_id, step, sample)
    tokens: bytes = blob(4 * MAX_NEW_TOKENS)  # uint32 LE output token ids
    logprobs: bytes = blob(4 * MAX_NEW_TOKENS)  # float32 LE, one per output token
    finish_reason: str = text(8, choices=FINISH_REASONS)
    reward: float = f64(0.0, 1.0)
    proofs: list[bytes] = listof(FieldSpec(bytes, max_len=2 + 2 * MAX_PROOF_TOPK), MAX_PROOFS)

    @property
    def token_ids(self) -> list[int]:
        return unpack_tokens(self.tokens)

    @property
    def logprob_values(self) -> list[float]:
        return unpack_floats(self.logprobs)

    def check(self) -> None:
        n, r = divmod(len(self.tokens), 4)
        if r or n == 0:
            raise _bad("sample", "tokens must be a non-empty uint32 array")
        if len(self.logprobs) != 4 * n:
            raise _bad("sample", f"{len(self.logprobs) // 4} logprobs for {n} tokens")
        lp = np.frombuffer(self.logprobs, dtype="<f4")
        if not bool(np.all(np.isfinite(lp) & (lp <= 0))):
            raise _bad("sample", "logprobs must be finite and <= 0")


@dataclass(frozen=True)
class RolloutGroup(Message):
    TYPE = "intellect/rollout-group/1"  # nested only
    MAX_SIZE = MAX_BATCH_SIZE

    index: int = u64(0, 2**32 - 1)  # assignment index within the step
    task_id: str = text(128, pattern=r"[A-Za-z0-9._:/+=-]{1,128}")
    prompt: bytes = blob(4 * MAX_PROMPT_TOKENS)  # uint32 LE prompt token ids
    samples: list[RolloutSample] = listof(nested(RolloutSample), MAX_GROUP_SIZE)

    @property
    def prompt_ids(self) -> list[int]:
        return unpack_tokens(self.prompt)

    def check(self) -> None:
        n, r = divmod(len(self.prompt), 4)
        if r or n == 0:
            raise _bad(f"group {self.index}", "prompt must be a non-empty uint32 array")


@dataclass(frozen=True)
class RolloutBatch(Header):
    """One worker's rollouts for one step (see the module docstring)."""

    TYPE = "intellect/rollout-batch/1"
    MAX_SIZE = MAX_BATCH_SIZE

    worker: str = text(42, pattern=ADDRESS_PATTERN)  # the worker's ledger address
    step: int = u64()  # the step the tasks were assigned for
    policy_version: int = u64()  # the weights that generated the samples
    taskset: str = text(128, pattern=r"[A-Za-z0-9._:/+=-]{1,128}")
    group_size: int = u64(1, MAX_GROUP_SIZE)
    max_new_tokens: int = u64(1, MAX_NEW_TOKENS)
    temperature: float = f64(0.0, 100.0)
    top_p: float = f64(0.0, 1.0)
    proof_chunk: int = u64(1, MAX_NEW_TOKENS)
    proof_topk: int = u64(1, MAX_PROOF_TOPK)
    groups: list[RolloutGroup] = listof(nested(RolloutGroup), MAX_GROUPS)

    def check(self) -> None:
        if not self.groups:
            raise _bad("batch", "no groups")
        if self.top_p <= 0:
            raise _bad("batch", "top_p must be > 0")
        size = proof_size(self.proof_topk)
        previous = -1
        for g in self.groups:
            where = f"group {g.index}"
            if g.index <= previous:
                raise _bad(where, "group indices must be strictly increasing")
            previous = g.index
            if len(g.samples) != self.group_size:
                raise _bad(where, f"{len(g.samples)} samples, group size is {self.group_size}")
            for i, s in enumerate(g.samples):
                w = f"{where} sample {i}"
                if s.sample != i:
                    raise _bad(w, f"sample index {s.sample} out of order")
                n = len(s.tokens) // 4
                if n > self.max_new_tokens:
                    raise _bad(w, f"{n} tokens > max_new_tokens {self.max_new_tokens}")
                if s.finish_reason == "length" and n != self.max_new_tokens:
                    raise _bad(w, "finish_reason 'length' below max_new_tokens")
                want = expected_proofs(n, self.proof_chunk)
                if len(s.proofs) != want:
                    raise _bad(w, f"{len(s.proofs)} proofs, {n} tokens need {want}")
                if any(len(p) != size for p in s.proofs):
                    raise _bad(w, f"every proof must be {size} bytes")
                if s.seed != derive_seed(self.worker, g.task_id, self.step, i):
                    raise _bad(w, "seed is not derive_seed(worker, task_id, step, sample)")

    def work_key(self) -> bytes:
        """32-byte key of this work: the same rollouts always give the same key."""
        body = self.to_obj()
        del body["seq"], body["ts_ms"]
        canonical: bytes = msgpack.packb(body, use_bin_type=True)
        return digest_parts(WORK_KEY_DOMAIN, self.TYPE.encode(), canonical)

    @property
    def num_samples(self) -> int:
        return sum(len(g.samples) for g in self.groups)

    @property
    def num_tokens(self) -> int:
        return sum(len(s.tokens) // 4 for g in self.groups for s in g.samples)
