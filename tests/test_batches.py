"""Batch exchange messages, the worker's batch store, and the validator's schedule."""

import os

import pytest

from crypto.identity import Identity
from crypto.sampling import derive_seed
from node.roles.judging import JudgingQueue
from node.rollouts.store import BatchStore, BatchStoreError
from protocol.batches import (
    MAX_BATCH_ENVELOPE,
    BatchNotice,
    BatchReply,
    BatchRequest,
    StepNotice,
)
from protocol.errors import Reason, WireError
from protocol.rollouts import RolloutBatch, RolloutGroup, RolloutSample, pack_floats, pack_tokens
from protocol.wire import open_message, seal

WORKER = "0x" + "12" * 20
KEY = bytes(range(32))


def header(identity, seq=1):
    return dict(run_id="test-run", sender=identity.peer_id, seq=seq, ts_ms=1_700_000_000_000)


def a_batch(identity, step=3, reward=1.0):
    samples = [
        RolloutSample(
            sample=s,
            seed=derive_seed(WORKER, "t/1", step, s),
            tokens=pack_tokens([5, 6, 7]),
            logprobs=pack_floats([-0.5, -1.0, -0.25]),
            finish_reason="length",
            reward=reward,
            proofs=[bytes(6), bytes(6)],
        )
        for s in range(2)
    ]
    return RolloutBatch(
        **header(identity),
        worker=WORKER,
        step=step,
        policy_version=0,
        taskset="arithmetic",
        group_size=2,
        max_new_tokens=3,
        temperature=1.0,
        top_p=1.0,
        proof_chunk=32,
        proof_topk=2,
        groups=[RolloutGroup(index=0, task_id="t/1", prompt=pack_tokens([2, 9]), samples=samples)],
    )


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


def test_store_cleans_interrupted_writes_and_prunes(tmp_path):
    identity = Identity.generate()
    (tmp_path / "ab.tmp").write_bytes(b"half")
    store = BatchStore(tmp_path)
    assert not list(tmp_path.glob("*.tmp"))
    old = store.put(seal(identity, a_batch(identity, step=1)))
    new = store.put(seal(identity, a_batch(identity, step=2)))
    past = os.stat(tmp_path / f"{old.hex()}.batch").st_mtime - 1000
    os.utime(tmp_path / f"{old.hex()}.batch", (past, past))
    assert store.prune(older_than_s=500) == 1
    assert store.keys() == [new]


K1, K2 = (WORKER, b"\x01" * 32), (WORKER, b"\x02" * 32)


def test_a_batch_is_fetched_only_once_submitted_and_announced():
    q = JudgingQueue()
    q.noticed(K1, "peerA", now=0)
    assert q.next_fetch(0) is None  # not on-chain: nothing to judge yet
    q.submitted(K1, units=96, policy_version=0, now=1)
    assert q.next_fetch(1) == (K1, "peerA")
    assert q.next_fetch(1) is None  # in flight
    q.fetched(K1)
    assert q.next_fetch(100) is None and q.unavailable(1000) == []  # judged once, never again
    q.noticed(K1, "peerB", now=2)
    q.submitted(K1, units=96, policy_version=0, now=2)
    assert q.next_fetch(3) is None


def test_oldest_submission_first():
    q = JudgingQueue()
    for key, t in ((K2, 5.0), (K1, 1.0)):
        q.noticed(key, "p", now=t)
        q.submitted(key, units=1, policy_version=0, now=t)
    assert q.next_fetch(10)[0] == K1
    assert q.next_fetch(10)[0] == K2


def test_retries_back_off_rotate_peers_and_end_in_unavailable():
    q = JudgingQueue(fetch_deadline_s=60, retry_s=1, retry_max_s=8)
    q.submitted(K1, units=1, policy_version=0, now=0)
    q.noticed(K1, "A", now=0)
    q.noticed(K1, "B", now=0)
    tries = []
    now = 0.0
    while (got := q.next_fetch(now)) is not None or q.wake_at(now) is not None:
        if got is None:
            now = q.wake_at(now)
            if now >= 60:
                break
            continue
        tries.append((now, got[1]))
        q.fetch_failed(K1, now)
    times = [t for t, _ in tries]
    assert times[:6] == [0, 1, 3, 7, 15, 23]  # 1, 2, 4, 8, then capped at 8
    assert [p for _, p in tries[:4]] == ["A", "B", "A", "B"]
    assert q.unavailable(59.9) == []
    assert q.unavailable(60) == [K1]
    assert q.unavailable(61) == []  # reported once
    assert q.next_fetch(61) is None


def test_a_batch_nobody_announced_is_unavailable_at_the_deadline():
    q = JudgingQueue(fetch_deadline_s=30)
    q.submitted(K1, units=1, policy_version=0, now=10)
    assert q.wake_at(10) == 40
    assert q.unavailable(39) == [] and q.unavailable(40) == [K1]


def test_a_fetch_in_flight_is_not_declared_unavailable():
    q = JudgingQueue(fetch_deadline_s=30)
    q.submitted(K1, units=1, policy_version=0, now=0)
    q.noticed(K1, "A", now=0)
    assert q.next_fetch(29)
    assert q.unavailable(31) == []  # the fetch decides
    q.fetch_failed(K1, 31)
    assert q.next_fetch(40) is None  # past the deadline: no new try
    assert q.unavailable(40) == [K1]


def test_an_announcement_flood_is_bounded():
    q = JudgingQueue(max_pending=3)
    for i in range(10):
        q.noticed((WORKER, bytes([i]) * 32), "flooder", now=0)
    assert len(q.entries) == 3 and q.dropped == 7


def test_one_peers_flood_of_unsubmitted_keys_cannot_crowd_out_the_others():
    q = JudgingQueue(fetch_deadline_s=30, per_peer_unsubmitted=4)
    for i in range(50):
        q.noticed((WORKER, bytes([i]) * 32), "flooder", now=0)
    assert len(q.entries) == 4 and q.dropped == 46
    mine = (WORKER, b"\xc8" * 32)
    q.noticed(mine, "honest", now=1)  # another peer's announcement still gets in
    q.submitted(mine, 10, 0, now=1)
    assert q.next_fetch(1) == (mine, "honest")
    # a flooder's key that is submitted after all is work like any other: no longer counted
    q.submitted((WORKER, bytes([0]) * 32), 10, 0, now=2)
    q.noticed((WORKER, bytes([60]) * 32), "flooder", now=2)
    assert (WORKER, bytes([60]) * 32) in q.entries


def test_announced_keys_never_submitted_are_forgotten_after_the_fetch_deadline():
    q = JudgingQueue(fetch_deadline_s=30, per_peer_unsubmitted=2)
    q.noticed((WORKER, b"\x01" * 32), "flooder", now=0)
    q.noticed((WORKER, b"\x02" * 32), "flooder", now=0)
    q.noticed((WORKER, b"\x03" * 32), "flooder", now=10)  # over its share
    assert q.dropped == 1 and len(q.entries) == 2
    q.noticed((WORKER, b"\x03" * 32), "flooder", now=31)  # the first two expired
    assert q.expired == 2 and list(q.entries) == [(WORKER, b"\x03" * 32)]


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
