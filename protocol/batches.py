"""Rollout batches between nodes: who announces what, and how a batch is fetched.

Where a rollout comes from: an inference worker seals a ``RolloutBatch``
(``protocol/rollouts.py``), keeps the envelope on disk under its work key, announces a
``BatchNotice`` on the announcement topic ``batches`` and submits the key on-chain. Where it
goes next: a validator (and later the trainer) fetches the envelope with ``/intellect/
batch/1.0.0``: one ``BatchRequest`` naming the work key, one ``BatchReply`` with the
envelope's size, then the envelope in frames of at most ``BATCH_FRAME`` bytes. The fetcher
checks the size against the notice and ``MAX_BATCH_ENVELOPE`` before reading, and that the
envelope opens as a ``RolloutBatch`` signed by the announcing worker whose work key is the
one asked for.

The trainer announces the run's clock, a ``StepNotice`` (step and policy version) on the
topic ``steps``: the step is never a worker's choice, because task assignment depends on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from crypto.hashing import DIGEST_SIZE
from protocol.messages import Header
from protocol.rollouts import ADDRESS_PATTERN, MAX_BATCH_SIZE, RolloutBatch
from protocol.schema import Message, blob, text, u64

BATCH_TOPIC = "batches"  # announcement topic of BatchNotice bodies
STEP_TOPIC = "steps"  # announcement topic of StepNotice bodies
MAX_BATCH_ENVELOPE = MAX_BATCH_SIZE + 192  # a RolloutBatch envelope (protocol.wire overhead)
BATCH_FRAME = 1 << 20  # bulk frames of the envelope, at most this many bytes each
VOUCHER_SIZE = 65  # a validator's voucher: an EIP-191 signature, r ‖ s ‖ v (ledger/vouchers.py)


@dataclass(frozen=True)
class BatchNotice(Message):
    """A worker's word that it holds a batch (the body of an announcement)."""

    TYPE = "intellect/batch-notice/1"
    MAX_SIZE = 512

    work_key: bytes = blob(DIGEST_SIZE, exact_len=DIGEST_SIZE)
    worker: str = text(42, pattern=ADDRESS_PATTERN)  # the worker's ledger address
    step: int = u64()
    policy_version: int = u64()
    units: int = u64()  # generated output tokens (what the ledger pays for, SPEC §19)
    size: int = u64(1, MAX_BATCH_ENVELOPE)  # bytes of the signed envelope

    @classmethod
    def of(cls, batch: RolloutBatch, envelope: bytes) -> BatchNotice:
        """The notice for ``batch``, sealed as ``envelope``."""
        return cls(
            work_key=batch.work_key(),
            worker=batch.worker,
            step=batch.step,
            policy_version=batch.policy_version,
            units=batch.num_tokens,
            size=len(envelope),
        )


@dataclass(frozen=True)
class StepNotice(Message):
    """The trainer's clock: the current step and the newest policy version."""

    TYPE = "intellect/step-notice/1"
    MAX_SIZE = 256

    step: int = u64()
    policy_version: int = u64()


@dataclass(frozen=True)
class BatchRequest(Header):
    """Ask a peer for the batch with ``work_key``; a validator adds its ``voucher`` (its
    account's signature of its peer id, ``ledger/vouchers.py``: served first), anyone
    else sends it empty."""

    TYPE = "intellect/batch-request/1"
    MAX_SIZE = 512

    work_key: bytes = blob(DIGEST_SIZE, exact_len=DIGEST_SIZE)
    voucher: bytes = blob(VOUCHER_SIZE, default=b"")


@dataclass(frozen=True)
class BatchReply(Header):
    """The envelope of ``size`` bytes follows in frames of at most ``BATCH_FRAME`` bytes."""

    TYPE = "intellect/batch-reply/1"
    MAX_SIZE = 512

    work_key: bytes = blob(DIGEST_SIZE, exact_len=DIGEST_SIZE)
    size: int = u64(1, MAX_BATCH_ENVELOPE)
