"""Sparse DiLoCo pseudo-gradients without the network: the top-k 2-bit codec and its exact
sizes, its refusals, error feedback, and the all-gather that replaces the dense ring.

The exchange runs over in-memory outboxes, as in ``tests/test_diloco.py``; the group's own
``all_reduce`` (error feedback, blame) runs on stand-in groups whose pulls read each other's
outboxes.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import trio
import trio.testing

from node.config import NodeConfig
from node.diloco import codecs, quant, ring, sparse
from node.diloco.chunks import pulled_sizes
from node.diloco.group import DilocoGroup, GroupConfig
from node.diloco.sparse import BLOCK, ErrorFeedback, Sparse
from protocol.errors import WireError

# ---- the codec --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "k", "size"),
    [
        (0, 64, 0),
        (1, 64, 16 + 2 + 1),  # one entry: 12 bits of position, 2 of code, each padded
        (4096, 64, 16 + 96 + 16),  # 128 B per block at k = 64: 0.25 bits per value
        (10_000, 64, 3 * 16 + 192 * 12 // 8 + 192 * 2 // 8),  # blocks 4096, 4096, 1808
        (4097, 2, 2 * 16 + 5 + 1),  # 3 entries: 36 bits -> 5 B, 6 bits -> 1 B
        (5000, 4096, 2 * 16 + 5000 * 12 // 8 + 5000 * 2 // 8),  # everything sent
    ],
)
def test_exact_sizes(n, k, size):
    codec = Sparse(k)
    assert codec.wire_size(n) == size
    assert len(codec.encode(torch.randn(n))) == size
    assert codec.wire == f"sparse-{k}"


@pytest.mark.parametrize("n", [1, 16, 4096, 4097, 10_000])
def test_round_trip_sends_the_top_k_of_each_block_as_bucket_means(n):
    codec = Sparse(64)
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 3
    index, values = codec.decode_entries(codec.encode(x), n)
    out = codec.decode(codec.encode(x), n)
    assert torch.equal(out[index], values) and int((out != 0).sum()) == index.numel()
    for start in range(0, n, BLOCK):  # the sent positions are each block's largest
        block = x[start : start + BLOCK]
        k = min(64, block.numel())
        top = set((block.abs().topk(k).indices + start).tolist())
        assert set(index[(index >= start) & (index < start + BLOCK)].tolist()) == top
    # every code's value is the mean of the values that got it: the sum of what is sent is
    # kept, and the decoded vector is never longer than the input (the norm bound holds)
    torch.testing.assert_close(values.sum(), x[index].sum(), rtol=1e-5, atol=1e-5)
    assert float(out.norm()) <= float(x[index].norm()) * (1 + 1e-6)
    signs_kept = (torch.sign(values) == torch.sign(x[index])) | (values == 0)
    assert bool(signs_kept.all())


def test_the_four_codes_split_each_sign_at_its_mean_magnitude():
    x = torch.zeros(100)
    x[[3, 10, 50, 99]] = torch.tensor([-4.0, -1.0, 1.0, 4.0])
    x[20] = 0.5  # below the 4 largest: not sent
    assert torch.equal(Sparse(4).roundtrip(x), torch.where(x.abs() >= 1, x, 0.0))
    x[[30, 60]] = torch.tensor([-3.0, 3.0])  # each sign: 4 and 3 above the mean, 1 below
    out = Sparse(6).roundtrip(x)
    assert out[3] == out[30] == -3.5 and out[10] == -1.0
    assert out[50] == 1.0 and out[60] == out[99] == 3.5


def test_k_as_large_as_a_block_sends_every_value_at_four_levels():
    x = torch.randn(300)
    out = Sparse(BLOCK).roundtrip(x)
    assert int((out != 0).sum()) == 300 and out.unique().numel() <= 4


def test_settings_name_the_codec_and_the_roster_its_k():
    assert codecs.compressor("sparse") == Sparse(sparse.DEFAULT_K)
    assert codecs.compressor("sparse", 16) == codecs.compressor("sparse-16") == Sparse(16)
    assert codecs.compressor("int8") == quant.Int8() and codecs.compressor("fp32") == quant.Fp32()
    for bad in ("sparse-0", "sparse-4097", "int4"):
        with pytest.raises(ValueError, match="sparse k|unknown"):
            codecs.compressor(bad)
    cfg = NodeConfig(role="trainer", diloco={"enabled": True, "quant": "sparse", "sparse_k": 32})
    assert GroupConfig.of_run("L", cfg.diloco, 60.0, 60.0).encoding == "sparse-32"
    with pytest.raises(ValueError, match="sparse_k"):
        NodeConfig(diloco={"quant": "sparse", "sparse_k": 0})


def test_a_roster_names_the_sparse_encoding_with_its_k():
    from crypto.identity import Identity
    from protocol.diloco import DilocoRoster

    ident = Identity.generate()
    header = {"run_id": "test-run", "sender": ident.peer_id, "seq": 1, "ts_ms": 1}

    def roster(encoding):
        return DilocoRoster(
            **header, step=0, attempt=0, state="ready", encoding=encoding, members=[], norms=[]
        )

    for ok in ("int8", "fp32", "sparse-1", "sparse-4096"):
        assert DilocoRoster.decode(roster(ok).encode()).encoding == ok
    for bad in ("sparse", "sparse-0", "sparse-01", "bf16"):
        with pytest.raises(WireError):
            DilocoRoster.decode(roster(bad).encode())


# ---- refusals -----------------------------------------------------------------------------

N, K = 4097, 2  # two blocks (4096 values, then 1): 2 + 1 entries, 38 bytes
GOOD_TABLES = [[-2.0, -1.0, 1.0, 2.0], [-3.0, -0.5, 0.5, 3.0]]


def _payload(tables=GOOD_TABLES, pos=(5, 9, 0), codes=(0, 3, 1)) -> bytes:
    return (
        np.asarray(tables, dtype="<f4").tobytes()
        + sparse._pack(np.asarray(pos), sparse.POS_BITS)
        + sparse._pack(np.asarray(codes), sparse.CODE_BITS)
    )


def test_a_hand_made_payload_decodes():
    assert len(_payload()) == Sparse(K).wire_size(N) == 38
    out = Sparse(K).decode(_payload(), N)
    assert out[5] == -2.0 and out[9] == 2.0 and out[4096] == -0.5
    assert int((out != 0).sum()) == 3


def _with_padding_bit() -> bytes:
    data = bytearray(_payload())
    data[32 + 4] |= 0x80  # positions take 36 of the 40 bits of their 5 bytes
    return bytes(data)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (_payload()[:-1], "must be 38 B"),
        (_payload() + b"\0", "must be 38 B"),
        (_payload(pos=(9, 5, 0)), "not strictly increasing"),
        (_payload(pos=(5, 5, 0)), "not strictly increasing"),
        (_payload(pos=(5, 9, 1)), "past its block"),  # the last block holds one value
        (_payload(tables=[[-2.0, -1.0, 1.0, float("nan")], GOOD_TABLES[1]]), "non-finite"),
        (_payload(tables=[[-2.0, -1.0, 1.0, float("inf")], GOOD_TABLES[1]]), "non-finite"),
        (_payload(tables=[[2.0, -1.0, 1.0, 2.0], GOOD_TABLES[1]]), "out of its range"),
        (_payload(tables=[GOOD_TABLES[0], [-3.0, -0.5, -0.5, 3.0]]), "out of its range"),
        (_with_padding_bit(), "padding"),
    ],
    ids=[
        "short",
        "long",
        "decreasing",
        "repeated",
        "past_block",
        "nan",
        "inf",
        "code0_positive",
        "code2_negative",
        "padding",
    ],
)
def test_malformed_payloads_are_refused(data, why):
    with pytest.raises(WireError, match=why):
        Sparse(K).decode(data, N)
    with pytest.raises(WireError, match=why):
        codecs.decode(data, f"sparse-{K}", N)  # as the fuzz targets call it


def test_non_finite_values_are_not_sent():
    with pytest.raises(ValueError, match="non-finite"):
        Sparse().encode(torch.tensor([1.0, float("nan")]))


# ---- error feedback -----------------------------------------------------------------------


def test_error_feedback_carries_what_was_not_sent():
    codec, fb = Sparse(8), ErrorFeedback()
    gen = torch.Generator().manual_seed(0)
    deltas, sent = torch.zeros(9000, dtype=torch.float64), torch.zeros(9000, dtype=torch.float64)
    for step in range(6):
        delta = torch.randn(9000, generator=gen)
        vec = fb.compensate(delta)
        assert fb.holds(9000) == (step > 0)
        out = codec.roundtrip(vec)
        fb.keep(vec, out)
        deltas += delta.double()
        sent += out.double()
        assert fb.buffer is not None
        # nothing lost, only late: sent so far + what waits == every pseudo-gradient so far
        torch.testing.assert_close(sent + fb.buffer.double(), deltas, rtol=0, atol=1e-5)
    assert float(fb.buffer.norm()) > 0
    assert not fb.holds(16)  # a vector of another length (the formation's) starts afresh
    assert torch.equal(fb.compensate(torch.ones(16)), torch.ones(16))
    fb.reset()
    assert not fb.holds(9000)


# ---- the all-gather -------------------------------------------------------------------------


async def _gather(vecs, codec, norms=None, tamper=None):
    n = len(vecs)
    boxes = [ring.Outbox() for _ in range(n)]
    out = [None] * n

    async def member(i):
        async def pull(phase, rnd):
            data = await boxes[(i - 1) % n].take(phase, rnd)
            return tamper(i, phase, rnd, data) if tamper else data

        limit = ring.norm_limits(norms, i, codec.summable) if norms else None
        out[i] = await ring.all_reduce(vecs[i], i, n, codec, boxes[i], pull, limit)

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(member, i)
    return out


@pytest.mark.parametrize("k", [64, BLOCK])  # BLOCK: every position sent by all, summed
@pytest.mark.parametrize("n", [2, 3, 5])
async def test_sparse_all_gather_is_bitwise_identical_on_every_member(n, k):
    codec = Sparse(k)
    gen = torch.Generator().manual_seed(n)
    scales = torch.logspace(-3, 3, n)  # fp32 sums of such terms depend on their order
    vecs = [torch.randn(10_000, generator=gen) * s for s in scales]
    norms = [float(v.norm()) for v in vecs]
    out = await _gather(vecs, codec, norms)
    for avg, received in out:
        assert avg.view(torch.int32).equal(out[0][0].view(torch.int32))
        assert received == (n - 1) * codec.wire_size(10_000)  # every other member's payload
    expect = sum((codec.roundtrip(v) for v in vecs), torch.zeros(10_000)) / n  # roster order
    assert out[0][0].view(torch.int32).equal(expect.view(torch.int32))


@pytest.mark.parametrize("n", [2, 3])
def test_pulled_sizes_of_the_all_gather(n):
    codec = Sparse(64)
    want = {("ag", r): codec.wire_size(10_000) for r in range(n - 1)}
    want[("ag", n - 1)] = 32  # the closing round: the digest of the gathered payloads
    assert all(pulled_sizes(10_000, i, n, codec) == want for i in range(n))


async def _gather_each(vecs, codec, norms, slow=()):
    """As ``_gather``, but each member on its own, as ``DilocoGroup.all_reduce`` runs it: a
    member whose pull fails abandons the attempt (its outbox answers ``Aborted`` from then
    on) and the others go on. The members in ``slow`` pull only once every other member is
    blocked (a slow link). Each member's outcome: ``(average, received)`` or the error."""
    n = len(vecs)
    boxes = [ring.Outbox() for _ in range(n)]
    out = [None] * n

    async def member(i):
        async def pull(phase, rnd):
            if i in slow:
                await trio.testing.wait_all_tasks_blocked()
            return await boxes[(i - 1) % n].take(phase, rnd)

        limit = ring.norm_limits(norms, i, codec.summable)
        try:
            out[i] = await ring.all_reduce(vecs[i], i, n, codec, boxes[i], pull, limit)
        except (ring.BadChunk, ring.Aborted, ring.Mismatch) as exc:
            out[i] = exc
            boxes[i].abort()

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(member, i)
    return out


@pytest.mark.parametrize("n", [2, 3, 4])
async def test_a_member_whose_payload_is_refused_does_not_finish_the_attempt(n):
    # the payloads a member gathers never cross the edge from it to its right neighbour:
    # without the closing round the cheater (whose right neighbour refuses its payload and
    # abandons the attempt) gathered all the others and finished the attempt alone, with a
    # result the group never applied
    codec = Sparse(64)
    gen = torch.Generator().manual_seed(n)
    vecs = [torch.randn(5000, generator=gen) for _ in range(n)]
    norms = [float(v.norm()) for v in vecs]
    cheater = n - 1
    vecs[cheater] = vecs[cheater] * 1000  # declaring its true norm
    out = await _gather_each(vecs, codec, norms, slow={0})  # the cheater pulls first
    assert isinstance(out[0], ring.BadChunk)  # the cheater's right neighbour found it
    assert all(isinstance(o, Exception) for o in out), out  # no one finished, the cheater too


async def test_a_member_whose_left_neighbour_gathered_other_payloads_fails():
    codec = Sparse(64)
    gen = torch.Generator().manual_seed(5)
    vecs = [torch.randn(5000, generator=gen) for _ in range(3)]
    norms = [float(v.norm()) * 2 for v in vecs]
    swapped = codec.encode(vecs[0] / 2)  # a valid payload of member 0, not the one it sent

    def tamper(i, phase, rnd, data):
        # member 2 receives member 0's payload forwarded by member 1 (round 1): swapped
        return swapped if (i, phase, rnd) == (2, "ag", 1) else data

    with pytest.raises(ExceptionGroup) as info:
        await _gather(vecs, codec, norms, tamper=tamper)
    assert info.group_contains(ring.Mismatch)
    assert ring.gathered_digest([b"a", b"b"]) != ring.gathered_digest([b"b", b"a"])


async def test_a_payload_above_its_senders_declared_norm_is_refused():
    codec = Sparse(64)
    gen = torch.Generator().manual_seed(7)
    vecs = [torch.randn(5000, generator=gen) for _ in range(3)]
    norms = [float(v.norm()) for v in vecs]
    vecs[1] = vecs[1] * 1000  # member 1 cheats, declaring its true norm
    with pytest.raises(ExceptionGroup) as info:
        await _gather(vecs, codec, norms)
    assert info.group_contains(ring.BadChunk, match="above the declared")


def test_a_forwarded_payload_is_bounded_by_its_owners_norm_alone():
    # round r brings member (rank - 1 - r)'s payload, forwarded unchanged: its own declared
    # norm bounds it, not a sum or the mean of the group's
    norms = [1.0, 20.0, 300.0, 4000.0]
    for rank in range(4):
        limit = ring.norm_limits(norms, rank, summable=False)
        for r in range(3):
            assert limit("ag", r) == pytest.approx(norms[(rank - 1 - r) % 4] * (1 + 1e-3))


async def test_an_out_of_range_payload_fails_the_all_gather():
    codec = Sparse(K)

    def tamper(i, phase, rnd, data):
        return _payload(pos=(9, 5, 0)) if i == 1 else data

    with pytest.raises(ExceptionGroup) as info:
        await _gather([torch.randn(N) for _ in range(3)], codec, tamper=tamper)
    assert info.group_contains(ring.BadChunk, match="not strictly increasing")


# ---- the group's all_reduce: error feedback and blame -------------------------------------


class _InMemoryGroup:
    """What ``DilocoGroup.all_reduce`` uses of its group, for one member of ``peers``: the
    roster is all of them, each pull reads the left neighbour's outbox."""

    _attempts = DilocoGroup._attempts  # the real attempts loop, on these fakes

    def __init__(self, peers, me, codec):
        self.peers, self.me = peers, me
        self.cfg = SimpleNamespace(step_timeout=30.0, compressor=codec)
        self.attempts, self.failures, self.feedback = {}, 0, ErrorFeedback()
        self.declared = {}

    async def _sync(self, step, attempt, state, layout, norm, blame):
        board = self.peers["norms"].setdefault(step, {})
        board[self.me] = norm
        roster = self.peers["roster"]
        await trio.testing.wait_all_tasks_blocked()  # every member declared its norm
        return roster, [board[p] for p in roster], attempt

    def _puller(self, key, roster):
        left = self.peers[roster[(roster.index(self.me) - 1) % len(roster)]]

        async def pull(phase, rnd):
            if key not in left.attempts:  # its attempt starts once all are blocked
                await trio.testing.wait_all_tasks_blocked()
            return await left.attempts[key].outbox.take(phase, rnd)

        return pull


async def test_a_sparse_group_loses_nothing_over_outer_steps_and_agrees_bitwise():
    codec, n, numel = Sparse(16), 3, 9000
    peers = {"roster": [f"m{i}" for i in range(n)], "norms": {}}
    members = [_InMemoryGroup(peers, p, codec) for p in peers["roster"]]
    for m in members:
        peers[m.me] = m
    gen = torch.Generator().manual_seed(3)
    total_delta = torch.zeros(numel, dtype=torch.float64)
    total_avg = torch.zeros(numel, dtype=torch.float64)
    for step in range(4):
        deltas = [torch.randn(numel, generator=gen) for _ in range(n)]
        out = [None] * n

        async def member(i, step=step, deltas=deltas, out=out):
            vec = deltas[i]
            out[i] = await DilocoGroup.all_reduce(members[i], step, vec, "s" * 64, "l" * 64)

        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(member, i)
        for red in out:
            assert red.average.view(torch.int32).equal(out[0].average.view(torch.int32))
            assert red.compensated == (step > 0) and not red.alone
        total_delta += torch.stack(deltas).double().sum(0)
        total_avg += out[0].average.double() * n
    held = sum(m.feedback.buffer.double() for m in members)
    # what the group applied + what its members still hold == all their pseudo-gradients
    torch.testing.assert_close(total_avg + held, total_delta, rtol=0, atol=1e-4)
    assert float(held.norm()) > 0.1 * float(total_delta.norm())  # most is held, not lost


async def test_a_member_alone_takes_all_of_its_vector_and_keeps_nothing():
    peers = {"roster": ["me"], "norms": {}}
    group = peers["me"] = _InMemoryGroup(peers, "me", Sparse(4))
    delta = torch.randn(1000)
    red = await DilocoGroup.all_reduce(group, 0, delta, "s" * 64, "l" * 64)
    assert torch.equal(red.average, delta) and red.alone
    assert group.feedback.buffer is not None and not bool(group.feedback.buffer.any())


async def test_a_member_alone_with_an_unsent_remainder_is_not_a_group_of_one():
    # OuterState.apply's "alone" form takes the average as θ − θ_after: with a remainder of
    # earlier steps added it is not, so the outer step must take the group's form
    peers = {"roster": ["m0", "m1"], "norms": {}}
    m0 = peers["m0"] = _InMemoryGroup(peers, "m0", Sparse(4))
    m1 = peers["m1"] = _InMemoryGroup(peers, "m1", Sparse(4))
    async with trio.open_nursery() as nursery:
        for m in (m0, m1):
            nursery.start_soon(DilocoGroup.all_reduce, m, 0, torch.randn(1000), "s", "l")
    held = m0.feedback.buffer.clone()
    peers["roster"] = ["m0"]  # m1 left
    delta = torch.randn(1000)
    red = await DilocoGroup.all_reduce(m0, 1, delta, "s" * 64, "l" * 64)
    assert red.compensated and not red.alone
    assert torch.equal(red.average, delta + held) and not bool(m0.feedback.buffer.any())


class _BadLeftNeighbour(_InMemoryGroup):
    """Attempt 0: the roster ``[a, me, b]`` whose left neighbour ``a`` sends ``payload``;
    attempt 1: alone. ``syncs``: (attempt, blamed) of each ask."""

    def __init__(self, payload):
        super().__init__({}, "me", Sparse(K))
        self.payload, self.syncs = payload, []

    async def _sync(self, step, attempt, state, layout, norm, blame):
        self.syncs.append((attempt, blame))
        if attempt == 0:
            return ["a", "me", "b"], [1e6] * 3, 0
        return ["me"], [1.0], attempt

    def _puller(self, key, roster):
        async def pull(phase, rnd):
            return self.payload

        return pull


@pytest.mark.parametrize(
    "payload",
    [
        _payload(pos=(5, 9, 1)),
        _payload(tables=[[2.0, -1.0, 1.0, 2.0], GOOD_TABLES[1]]),
        _payload(tables=[[-1e9, -1.0, 1.0, 2.0], GOOD_TABLES[1]]),  # above its declared norm
    ],
    ids=["position", "code_range", "norm"],
)
async def test_a_member_sending_out_of_range_values_is_blamed(payload):
    group = _BadLeftNeighbour(payload)
    out = await DilocoGroup.all_reduce(group, 0, torch.ones(N), "s" * 64, "l" * 64)
    assert group.syncs == [(0, ""), (1, "a")]  # the next ask names the left neighbour
    assert out.attempts == 2 and group.failures == 1


# ---- the remainder across a restart (node/roles/io/rounds.py) ------------------------------


def _holder(codec):
    return SimpleNamespace(cfg=SimpleNamespace(compressor=codec), feedback=ErrorFeedback())


async def test_a_restart_takes_back_the_remainder_written_with_its_checkpoint(tmp_path):
    from node.roles.decisions.workbook import prune_checkpoints
    from node.roles.io.rounds import feedback_path, keep_feedback, resume_feedback

    group = _holder(Sparse())
    group.feedback.buffer = torch.randn(100)
    await keep_feedback(group, tmp_path, 3)
    again = _holder(Sparse())
    assert resume_feedback(again, tmp_path, 3)
    assert torch.equal(again.feedback.buffer, group.feedback.buffer)
    other = _holder(Sparse())
    assert not resume_feedback(other, tmp_path, 2)  # another checkpoint's: from zero
    assert other.feedback.buffer is None
    feedback_path(tmp_path, 4).write_bytes(b"not safetensors")
    assert not resume_feedback(other, tmp_path, 4)
    group.feedback.buffer = torch.full((5,), float("nan"))
    await keep_feedback(group, tmp_path, 5)
    assert not resume_feedback(other, tmp_path, 5) and other.feedback.buffer is None
    dense = _holder(quant.Int8())
    dense.feedback.buffer = torch.ones(3)
    await keep_feedback(dense, tmp_path, 6)  # no error feedback: nothing written
    assert not feedback_path(tmp_path, 6).exists()
    prune_checkpoints(tmp_path, 10, 2)  # pruned with its checkpoint
    assert not feedback_path(tmp_path, 3).exists()


async def test_a_joiners_recovery_starts_the_remainder_at_zero():
    from node.roles.children.grouppolicy import Recovered
    from node.roles.io.joining import join

    group = _holder(Sparse())
    group.feedback.buffer = torch.ones(10)  # held back for a state the joiner leaves

    async def pull_state(step):
        return SimpleNamespace(data=b"state", signer="L", shards=1, via="shardcast")

    async def call(request):
        return Recovered(request.version, "s" * 64, "p" * 64, 0)

    group.pull_state = pull_state
    reply = SimpleNamespace(state="ready", step=3, members=["L"])
    joined = await join(group, SimpleNamespace(call=call), reply)
    assert joined.version == 2 and group.feedback.buffer is None


async def test_a_library_member_joining_starts_the_remainder_at_zero():
    from node.diloco.member import Member

    group = _holder(Sparse())
    group.cfg.leader = "L"
    group.feedback.buffer = torch.ones(10)

    async def find_leader():
        return {"L"}

    async def announce_join(at_least):
        return 3

    async def pull_state(step):
        return SimpleNamespace(data=b"state")

    group.find_leader, group.announce_join, group.pull_state = (
        find_leader,
        announce_join,
        pull_state,
    )
    me = SimpleNamespace(group=group, restore=lambda data: None, packed=lambda: b"packed")
    step, _ = await Member.join(me)
    assert step == 3 and group.feedback.buffer is None
