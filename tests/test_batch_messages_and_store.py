"""Batch exchange messages (their limits, and SPEC documenting them) and the worker's batch
store (restarts, damage, interrupted writes, deletion)."""

import pytest

from crypto.identity import Identity
from node.rollouts.store import BatchStore, BatchStoreError
from protocol.batches import (
    MAX_BATCH_ENVELOPE,
    BatchNotice,
    BatchReply,
    BatchRequest,
    StepNotice,
)
from protocol.errors import Reason, WireError
from protocol.wire import open_message, seal
from tests.helpers.batches import KEY, WORKER, a_batch, header


def test_messages_round_trip_and_limits():
    identity = Identity.generate()
    notice = BatchNotice(work_key=KEY, worker=WORKER, step=4, policy_version=2, units=96, size=900)
    assert BatchNotice.decode(notice.encode()) == notice
    batch = a_batch(identity)
    envelope = seal(identity, batch)
    assert BatchNotice.of(batch, envelope) == BatchNotice(
        work_key=batch.work_key(),
        worker=WORKER,
        step=3,
        policy_version=0,
        units=6,
        size=len(envelope),
    )
    step = StepNotice(step=7, policy_version=5)
    assert StepNotice.decode(step.encode()) == step
    for msg in (
        BatchRequest(**header(identity), work_key=KEY),
        BatchReply(**header(identity), work_key=KEY, size=MAX_BATCH_ENVELOPE),
    ):
        assert open_message(seal(identity, msg), type(msg)) == msg
    for bad in (
        dict(work_key=KEY[:31]),
        dict(worker="0xABC"),
        dict(size=0),
        dict(size=MAX_BATCH_ENVELOPE + 1),
    ):
        fields = dict(work_key=KEY, worker=WORKER, step=4, policy_version=2, units=1, size=9)
        with pytest.raises(WireError) as exc:
            BatchNotice(**{**fields, **bad}).encode()
        assert exc.value.reason is Reason.MALFORMED
    with pytest.raises(WireError) as exc:  # another message is not a notice
        BatchNotice.decode(step.encode())
    assert exc.value.reason is Reason.WRONG_TYPE


def test_store_survives_a_restart_and_refuses_damage(tmp_path):
    identity = Identity.generate()
    store = BatchStore(tmp_path)
    envelope = seal(identity, a_batch(identity))
    key = store.put(envelope)
    assert key == a_batch(identity).work_key()
    assert BatchStore(tmp_path).get(key) == envelope  # a new process sees it
    assert store.keys() == [key]
    assert store.get(bytes(32)) is None
    path = tmp_path / f"{key.hex()}.batch"
    path.write_bytes(envelope[:-5] + b"xxxxx")  # damaged on disk
    with pytest.raises(BatchStoreError, match="damaged"):
        store.get(key)
    other = seal(identity, a_batch(identity, reward=0.0))  # another batch under this name
    path.write_bytes(other)
    with pytest.raises(BatchStoreError, match="another batch"):
        store.get(key)
    with pytest.raises(WireError):  # only signed rollout batches go in
        store.put(b"garbage")


def test_store_cleans_interrupted_writes_and_deletes(tmp_path):
    identity = Identity.generate()
    (tmp_path / "ab.tmp").write_bytes(b"half")
    store = BatchStore(tmp_path)
    assert not list(tmp_path.glob("*.tmp"))
    old = store.put(seal(identity, a_batch(identity, step=1)))
    new = store.put(seal(identity, a_batch(identity, step=2)))
    store.delete(old)
    store.delete(old)  # already gone: nothing to do
    assert store.keys() == [new] and store.get(old) is None


def test_a_write_the_disk_refuses_leaves_the_old_file_and_no_temporary_one(tmp_path):
    """``write_atomic`` (batches, role states, checkpoint states): a full disk mid-write
    keeps what ``path`` held and removes its half-written temporary file (a checkpoint
    state's is the optimizer's size: it must not go on taking the space it ran out of)."""
    from node.files import write_atomic
    from tests.helpers.disk import file_size_limit

    path = tmp_path / "v3.state"
    write_atomic(path, b"old")
    with file_size_limit(4096), pytest.raises(OSError, match="File too large"):
        write_atomic(path, b"x" * 10_000)
    assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == [
        "v3.state"
    ]


def test_spec_documents_the_batch_messages():
    import re
    from pathlib import Path

    spec = (Path(__file__).resolve().parent.parent / "SPEC.md").read_text()
    header = {"run_id", "sender", "seq", "ts_ms"}
    for cls in (BatchNotice, StepNotice, BatchRequest, BatchReply):
        section = spec.split(f"### `{cls.TYPE}`", 1)[1].split("\n#", 1)[0]
        documented = set(re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.MULTILINE))
        assert documented == set(cls.specs()) - header, cls.TYPE
        assert f"max {cls.MAX_SIZE} bytes" in section.splitlines()[0]
    assert f"{MAX_BATCH_ENVELOPE:,}" in spec


def _shaped_batch(identity, groups, group_size, lengths, prompt, chunk, topk):
    """A batch of ``groups`` × ``group_size`` samples whose token counts cycle through
    ``lengths``, every field at its longest where its length is free."""
    from crypto.sampling import derive_seed
    from protocol.rollouts import (
        RolloutBatch,
        RolloutGroup,
        RolloutSample,
        expected_proofs,
        pack_floats,
        pack_tokens,
        proof_size,
    )

    n_of = iter(lengths * (groups * group_size))
    out = []
    for g in range(groups):
        task = f"t/{g}".ljust(128, "x")
        samples = []
        for s in range(group_size):
            n = next(n_of)
            samples.append(
                RolloutSample(
                    sample=s,
                    seed=derive_seed(WORKER, task, 2**40, s),
                    tokens=pack_tokens([2**32 - 1] * n),
                    logprobs=pack_floats([-1.5] * n),
                    finish_reason="length" if n == max(lengths) else "stop",
                    reward=0.123456789,
                    proofs=[b"\xff" * proof_size(topk)] * expected_proofs(n, chunk),
                )
            )
        prompt_ids = pack_tokens([2**32 - 1] * prompt)
        out.append(RolloutGroup(index=2**31 + g, task_id=task, prompt=prompt_ids, samples=samples))
    return RolloutBatch(
        **header(identity),
        worker=WORKER,
        step=2**40,
        policy_version=2**40,
        taskset="arithmetic",
        group_size=group_size,
        max_new_tokens=max(lengths),
        temperature=0.7,
        top_p=0.9,
        proof_chunk=chunk,
        proof_topk=topk,
        groups=out,
    )


@pytest.mark.parametrize(
    ("groups", "group_size", "lengths", "prompt", "chunk", "topk"),
    [
        (1, 1, [1], 8192, 32, 128),  # one unit: the prompt and proofs dominate
        (256, 1, [1], 8192, 32, 128),  # every group's longest prompt, one token each
        (16, 16, [40, 1, 33, 2], 64, 32, 128),  # the devnet's shape, mixed lengths
        (4, 64, [1], 3, 1, 128),  # a proof per token
        (2, 4, [300, 1, 64, 65], 10, 1, 4096),  # the largest proofs, one per token
        (3, 2, [1, 1000], 10, 64, 1),
    ],
)
def test_no_batch_is_larger_than_its_units_allow(groups, group_size, lengths, prompt, chunk, topk):
    from protocol.rollouts import max_envelope_size

    identity = Identity.generate()
    batch = _shaped_batch(identity, groups, group_size, lengths, prompt, chunk, topk)
    envelope = seal(identity, batch)
    assert open_message(envelope, type(batch)).num_tokens == batch.num_tokens
    bound = max_envelope_size(batch.num_tokens, chunk, topk)
    assert len(envelope) <= bound
    if (group_size, lengths, prompt) == (1, [1], 8192):  # the largest batch of its units:
        assert bound < 1.02 * len(envelope)  # the bound is that batch, not a blanket cap
    assert max_envelope_size(1, 32, 128) < 64 * 1024 < MAX_BATCH_ENVELOPE
