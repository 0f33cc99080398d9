"""DiLoCo without the network: the outer step, the int8 codec, the ring, the rosters.

The ring runs here over in-memory outboxes (``tests/test_diloco_network.py`` runs it over
libp2p between processes); the membership state machine is driven with explicit times.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import trio

from node.config import NodeConfig
from node.diloco import codecs, quant, ring
from node.diloco.inner import Corpus, InnerConfig, inner_step, make_optimizer
from node.diloco.membership import Membership, Refused
from node.diloco.outer import OuterConfig, OuterState, params_hash
from node.diloco.state import StateError, load_state, pack_state, save_checkpoint
from protocol.errors import WireError
from tests.helpers.tiny_lm import tiny_llama

# ---- the outer step ------------------------------------------------------------------


def _trainer(seed: int = 0):
    model = tiny_llama(seed, layers=1, hidden=32)
    cfg = InnerConfig(batch=4, seq_len=16)
    corpus = Corpus(bytes(range(256)) * 8, seed=3, shard=0)
    return model, make_optimizer(model, cfg), corpus, cfg


def test_one_member_outer_lr_1_no_momentum_is_plain_training_bitwise():
    plain, opt_p, data_p, cfg = _trainer()
    dl, opt_d, data_d, _ = _trainer()
    start = params_hash(plain.parameters())
    outer = OuterState.of(dl, OuterConfig(lr=1.0, momentum=0.0))
    for _ in range(3):  # 3 outer steps of H = 2
        for _ in range(2):
            inner_step(plain, opt_p, data_p.batch(cfg.batch, cfg.seq_len), cfg)
            inner_step(dl, opt_d, data_d.batch(cfg.batch, cfg.seq_len), cfg)
        outer.apply(dl, outer.pseudo_gradient(dl), alone=True)
    assert params_hash(plain.parameters()) != start  # training did something
    assert params_hash(dl.parameters()) == params_hash(plain.parameters())
    assert params_hash(outer.params) == params_hash(plain.parameters())
    assert outer.step == 3


def test_outer_step_is_nesterov_sgd_on_the_pseudo_gradient():
    model = tiny_llama(0, layers=1, hidden=32)
    outer = OuterState.of(model, OuterConfig(lr=0.7, momentum=0.9))
    ref = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
    sgd = torch.optim.SGD(ref, lr=0.7, momentum=0.9, nesterov=True)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        delta = torch.randn(outer.numel, generator=gen) * 1e-2
        outer.apply(model, delta, alone=False)
        off = 0
        for p in ref:
            p.grad = delta[off : off + p.numel()].view_as(p).clone()
            off += p.numel()
        sgd.step()
    for mine, theirs, p in zip(outer.params, ref, model.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs.detach(), rtol=1e-6, atol=1e-7)
        assert torch.equal(p.detach(), mine)  # the model is set from the outer copy


def test_pseudo_gradient_is_before_minus_after():
    model, opt, data, cfg = _trainer()
    before = [p.detach().clone() for p in model.parameters()]
    outer = OuterState.of(model)
    inner_step(model, opt, data.batch(cfg.batch, cfg.seq_len), cfg)
    delta = outer.pseudo_gradient(model)
    expect = torch.cat(
        [(b - a.detach()).reshape(-1) for b, a in zip(before, model.parameters(), strict=True)]
    )
    assert torch.equal(delta, expect) and delta.abs().sum() > 0


def test_outer_config_bounds():
    with pytest.raises(ValueError, match="lr"):
        OuterConfig(lr=0)
    with pytest.raises(ValueError, match="momentum"):
        OuterConfig(momentum=1.0)


# ---- the codec -------------------------------------------------------------------------


def test_int8_range_rule_and_bucket_means():
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0)) * 3 + 1
    codes, table = quant.quantize(x)
    mu, sigma = x.mean(), (x - x.mean()).norm() / (x.numel() - 1) ** 0.5
    scale = 6 * sigma / 256
    expect = torch.clamp(torch.round((x - mu) / scale) + 128, 0, 255).to(torch.uint8)
    assert torch.equal(codes, expect)
    for code in (0, 100, 128, 255):  # the table holds each bucket's mean
        members = x[codes == code]
        if members.numel():
            torch.testing.assert_close(table[code], members.mean(), rtol=1e-5, atol=1e-6)
    out = codecs.decode(codecs.encode(x, "int8"), "int8", x.numel())
    inside = (x - mu).abs() < 3 * sigma - scale
    assert (out - x)[inside].abs().max() <= scale  # within a bucket inside ±3σ
    assert inside.float().mean() > 0.99
    assert abs(float(out.sum() - x.sum())) < 1e-2 * x.numel() ** 0.5
    assert len(codecs.encode(x, "int8")) == 1024 + x.numel()


def test_fp32_is_exact_and_constant_chunks_work():
    x = torch.randn(257)
    assert torch.equal(codecs.decode(codecs.encode(x, "fp32"), "fp32", 257), x)
    c = torch.full((10,), 0.25)
    assert torch.equal(codecs.decode(codecs.encode(c, "int8"), "int8", 10), c)


def test_decode_refuses_malformed_chunks():
    x = torch.randn(100)
    good = codecs.encode(x, "int8")
    with pytest.raises(WireError, match="must be"):
        codecs.decode(good[:-1], "int8", 100)
    nan_table = torch.full((256,), float("nan")).numpy().tobytes() + good[1024:]
    with pytest.raises(WireError, match="non-finite"):
        codecs.decode(nan_table, "int8", 100)
    with pytest.raises(WireError, match="non-finite"):
        codecs.decode(torch.full((4,), float("inf")).numpy().tobytes(), "fp32", 4)
    with pytest.raises(ValueError, match="non-finite"):
        codecs.encode(torch.tensor([1.0, float("nan")]), "int8")


# ---- the ring --------------------------------------------------------------------------


async def _ring(vecs, encoding, tamper=None):
    n = len(vecs)
    boxes = [ring.Outbox() for _ in range(n)]
    out = [None] * n

    async def member(i):
        async def pull(phase, rnd):
            data = await boxes[(i - 1) % n].take(phase, rnd)
            return tamper(i, phase, rnd, data) if tamper else data

        codec = codecs.compressor(encoding)
        out[i] = await ring.all_reduce(vecs[i], i, n, codec, boxes[i], pull)

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(member, i)
    return out


@pytest.mark.parametrize("encoding", ["int8", "fp32"])
@pytest.mark.parametrize("n", [2, 3, 5])
async def test_ring_average_is_bitwise_identical_on_every_member(encoding, n):
    gen = torch.Generator().manual_seed(n)
    vecs = [torch.randn(1003, generator=gen) for _ in range(n)]
    out = await _ring(vecs, encoding)
    for avg, _ in out:
        assert avg.view(torch.int32).equal(out[0][0].view(torch.int32))
    mean = torch.stack(vecs).mean(0)
    err = out[0][0] - mean
    if encoding == "fp32":
        assert err.abs().max() < 1e-6
    else:  # int8 at every hop: a few percent of the signal
        assert err.norm() / mean.norm() < 0.1
    per = 1003 / n * (4 if encoding == "fp32" else 1)
    assert out[0][1] == pytest.approx(2 * (n - 1) * per, rel=0.1, abs=2 * n * 1024)


async def test_ring_refuses_a_bad_chunk():
    vecs = [torch.randn(50) for _ in range(3)]

    def tamper(i, phase, rnd, data):
        return data[:-1] if i == 1 and phase == "rs" else data

    with pytest.raises(ExceptionGroup) as info:
        await _ring(vecs, "fp32", tamper)
    assert info.group_contains(ring.BadChunk, match="must be")


async def test_ring_reports_the_payload_bytes_it_pulled_and_asks_the_limit_of_each_pull():
    """Each member counts every byte it pulled (both phases) and bounds each chunk by
    ``limit(phase, round)`` of that very pull."""
    n = 3
    vecs = [torch.randn(50, generator=torch.Generator().manual_seed(i)) for i in range(n)]
    boxes = [ring.Outbox() for _ in range(n)]
    pulled = [0] * n
    asked: list[list[tuple[str, int]]] = [[] for _ in range(n)]
    out = [None] * n

    async def member(i):
        async def pull(phase, rnd):
            data = await boxes[(i - 1) % n].take(phase, rnd)
            pulled[i] += len(data)
            return data

        def limit(phase, rnd):
            asked[i].append((phase, rnd))
            return float("inf")

        out[i] = await ring.all_reduce(
            vecs[i], i, n, codecs.compressor("fp32"), boxes[i], pull, limit
        )

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(member, i)
    assert [received for _, received in out] == pulled
    # chunks of 17, 17, 16 values, fp32 (4 bytes each): reduce-scatter brings member i every
    # chunk but chunk i, the all-gather every chunk but the one it reduced, (i + 1) mod 3
    assert pulled == [4 * (33 + 33), 4 * (33 + 34), 4 * (34 + 33)]
    assert asked == [[("rs", 0), ("rs", 1), ("ag", 0), ("ag", 1)]] * n


def test_a_chunks_norm_limit_is_its_senders_partial_sum_then_the_average():
    """Member 2 of 4 pulls from 1: in reduce-scatter round r the sum of the norms of members
    1, 0, ... (r + 1 of them), in the all-gather the roster's mean, each with its slack."""
    norms = [1.0, 2.0, 4.0, 8.0]
    limit = ring.norm_limits(norms, 2)
    slack = 1 + 1e-3
    assert limit("rs", 0) == pytest.approx(2.0 * slack + 1e-6, rel=1e-12)
    assert limit("rs", 1) == pytest.approx(3.0 * slack + 1e-6, rel=1e-12)
    assert limit("rs", 2) == pytest.approx(11.0 * slack + 1e-6, rel=1e-12)
    assert limit("ag", 0) == limit("ag", 2) == pytest.approx(3.75 * slack + 1e-6, rel=1e-12)
    sparse = ring.norm_limits(norms, 2, summable=False)  # round r: member 1 - r's alone
    assert [sparse("ag", r) for r in range(3)] == pytest.approx(
        [n * slack + 1e-6 for n in (2.0, 1.0, 8.0)], rel=1e-12
    )


def test_ring_bounds_cover_everything():
    assert ring.bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert ring.bounds(2, 3) == [(0, 1), (1, 2), (2, 2)]


# ---- the rosters -----------------------------------------------------------------------

L, A, B, C = "leader", "a", "b", "c"


def test_first_roster_waits_for_min_members_then_leader_first():
    m = Membership(L, min_members=3, sync_timeout=10)
    assert m.arrive(A, (0, 0), 0.0, {L, A, B}) is None
    assert m.arrive(B, (0, 0), 1.0, {L, A, B}) is None
    assert m.arrive(A, (0, 0), 500.0, {L, A, B}) is None  # no deadline without the leader
    assert m.arrive(L, (0, 0), 501.0, {L, A, B}) == [L, A, B]
    assert m.arrive(B, (0, 0), 502.0, {L, A, B}) == [L, A, B]


def test_a_member_dead_during_inner_steps_is_evicted_after_the_deadline():
    m = Membership(L, min_members=3, sync_timeout=10)
    for p in (L, A, B):
        m.arrive(p, (0, 0), 0.0, {L, A, B})
    alive = {L, A, B}
    assert m.arrive(L, (1, 0), 100.0, alive) is None
    assert m.arrive(A, (1, 0), 101.0, alive) is None
    assert m.poll(109.9, alive) is None
    assert m.poll(110.0, alive) == [L, A]
    assert m.evicted[B] == 1
    with pytest.raises(Refused, match="late"):
        m.arrive(B, (1, 0), 111.0, alive)
    # a dead member that left the peer table is not waited for at all
    assert m.arrive(L, (2, 0), 200.0, {L}) == [L]


def test_a_retry_holds_the_survivors_and_joiners_come_in_at_a_boundary():
    m = Membership(L, min_members=3, resync_timeout=3)
    for p in (L, A, B):
        m.arrive(p, (0, 0), 0.0, {L, A, B})
    assert m.members == [L, A, B]
    assert m.arrive(A, (0, 1), 5.0, {L, A, B}) is None  # B died in the all-reduce
    assert m.arrive(L, (0, 1), 5.5, {L, A, B}) is None
    assert m.poll(8.4, {L, A, B}) is None  # the wait counts from the leader's arrival
    assert m.poll(8.5, {L, A, B}) == [L, A]
    with pytest.raises(Refused, match="stale"):
        m.arrive(B, (0, 0), 9.0, {L, A, B})
    assert m.resolve((0, 0)) == (0, 1)  # a slow asker is answered with the current attempt
    assert m.resolve((1, 0)) == (1, 0)
    assert m.arrive(C, (1, 0), 20.0, {L, A, C}) is None  # a joiner
    assert m.arrive(A, (1, 0), 21.0, {L, A, C}) is None
    assert m.arrive(L, (1, 0), 22.0, {L, A, C}) == [L, A, C]


def test_divergent_outsider_and_leaving_peers():
    m = Membership(L, min_members=1, admit=frozenset({A, B}))
    with pytest.raises(Refused, match="not_admitted"):
        m.arrive(C, (0, 0), 0.0, {L, C})
    assert m.refused["not_admitted"] == 1
    m.arrive(A, (0, 0), 0.0, {L, A, B}, state="s0")
    m.arrive(B, (0, 0), 0.0, {L, A, B}, state="other")
    assert m.arrive(L, (0, 0), 0.0, {L, A, B}, state="s0") == [L, A]
    with pytest.raises(Refused, match="diverged"):
        m.arrive(B, (0, 0), 1.0, {L, A, B}, state="other")
    m.leave(A)  # a graceful leave: not waited for
    assert m.arrive(L, (1, 0), 2.0, {L, A, B}) == [L]


def test_layout_mismatch_is_refused():
    m = Membership(L)
    m.arrive(L, (0, 0), 0.0, {L}, layout="aa")
    m2 = copy.deepcopy(m)
    with pytest.raises(Refused, match="layout"):
        m2.arrive(A, (1, 0), 1.0, {L, A}, layout="bb")


def test_no_peer_but_the_leader_moves_the_group_to_a_later_step():
    # an auditor's repro: one sync for step 2**63 from any peer of the run made every
    # later arrival, the leader's own included, "stale": the group halted for good
    m = Membership(L, min_members=2)
    alive = {L, A, C}
    assert m.arrive(L, (0, 0), 0.0, alive, "aa", "s0") is None
    assert m.arrive(A, (0, 0), 0.1, alive, "aa", "s0") == [L, A]
    for far in ((2**63, 0), (2, 0), (1, 1), (0, 2)):  # nobody honest can ask for these now
        with pytest.raises(Refused, match="ahead"):
            m.arrive(C, m.resolve(far), 1.0, alive, "", "junk")
    assert m.refused["ahead"] == 4
    # the next attempt and the next step are what honest members ask for: C waits
    assert m.arrive(C, (0, 1), 1.0, alive, "", "junk") is None
    assert m.arrive(C, (1, 0), 1.0, alive, "", "junk") is None
    assert m.current == (0, 0)  # only the leader moves the group
    assert m.arrive(A, (1, 0), 2.0, alive, "aa", "s1") is None  # before the leader: waits
    assert m.arrive(L, (1, 0), 3.0, alive, "aa", "s1") == [L, A]  # then counts as arrived
    assert m.current == (1, 0)
    with pytest.raises(Refused, match="diverged"):  # its early ask was counted
        m.arrive(C, (1, 0), 4.0, alive, "", "junk")


def test_before_the_leader_arrives_no_peer_picks_the_step_or_the_layout():
    m = Membership(L, min_members=2)
    alive = {L, A, B, C}
    # members resuming from a checkpoint may ask for any step before the leader did
    assert m.arrive(C, (2**63, 0), 0.0, alive, "", "junk") is None
    assert m.arrive(B, (0, 0), 0.0, alive, "bb", "s0") is None  # another layout, first
    assert m.arrive(A, (0, 0), 1.0, alive, "aa", "s0") is None
    assert m.arrive(L, (0, 0), 2.0, alive, "aa", "s0") == [L, A]  # the leader's step and layout
    with pytest.raises(Refused, match="late"):  # left out for its layout, not in sync
        m.arrive(B, (0, 0), 3.0, alive, "bb", "s0")
    with pytest.raises(Refused, match="layout"):
        m.arrive(B, (1, 0), 3.0, alive, "bb", "s0")
    with pytest.raises(Refused, match="ahead"):
        m.arrive(C, (2**63, 0), 3.0, alive, "", "junk")


def test_a_leader_that_failed_an_attempt_a_member_completed_goes_on():
    m = Membership(L, min_members=3, resync_timeout=3)
    alive = {L, A, B}
    for p in (A, B, L):
        m.arrive(p, (0, 0), 0.0, alive, state="s0")
    # A got every chunk of attempt 0 and comes for step 1; the leader and B failed it
    assert m.arrive(A, (1, 0), 5.0, alive, state="a1") is None
    assert m.arrive(L, (0, 1), 6.0, alive, state="s0") is None  # not "stale"
    assert m.arrive(B, (0, 1), 6.5, alive, state="s0") is None
    assert m.poll(8.9, alive) is None
    assert m.poll(9.0, alive) == [L, B]  # A is not waited for past resync_timeout
    assert m.arrive(B, (1, 0), 20.0, alive, state="b1") is None
    assert m.arrive(L, (1, 0), 21.0, alive, state="b1") == [L, B]
    with pytest.raises(Refused, match="diverged"):  # A averaged another attempt: it recovers
        m.arrive(A, (1, 0), 22.0, alive, state="a1")


# ---- state: checkpoints and recovery ---------------------------------------------------


def _outer_steps(model, opt, corpus, cfg, outer, k, h=2):
    for _ in range(k):
        for _ in range(h):
            inner_step(model, opt, corpus.batch(cfg.batch, cfg.seq_len), cfg)
        outer.apply(model, outer.pseudo_gradient(model), alone=True)


def test_a_checkpoint_resumes_exactly_where_training_stopped(tmp_path):
    model, opt, corpus, cfg = _trainer()
    outer = OuterState.of(model)  # lr 0.7, Nesterov 0.9: momentum matters
    _outer_steps(model, opt, corpus, cfg, outer, 3)

    model2, opt2, corpus2, _ = _trainer()
    outer2 = OuterState.of(model2)
    _outer_steps(model2, opt2, corpus2, cfg, outer2, 2)
    save_checkpoint(
        tmp_path / "state.safetensors", pack_state(model2, outer2, opt2, corpus2.position)
    )
    del model2, opt2, corpus2, outer2  # the whole group stops

    model3, opt3, corpus3, _ = _trainer(seed=5)  # a fresh process: other weights, no state
    outer3 = OuterState.of(model3)
    data = (tmp_path / "state.safetensors").read_bytes()
    corpus3.position = load_state(data, model3, outer3, opt3)
    assert outer3.step == 2 and corpus3.position == 4
    assert pack_state(model3, outer3, opt3, corpus3.position) == data  # every part taken over
    _outer_steps(model3, opt3, corpus3, cfg, outer3, 1)
    assert params_hash(model3.parameters()) == params_hash(model.parameters())
    assert pack_state(model3, outer3, opt3, corpus3.position) == pack_state(
        model, outer, opt, corpus.position
    )


def test_state_that_does_not_fit_is_refused():
    model, opt, corpus, cfg = _trainer()
    outer = OuterState.of(model)
    _outer_steps(model, opt, corpus, cfg, outer, 1)
    other = tiny_llama(0, layers=1, hidden=48)
    o_outer = OuterState.of(other)
    o_opt = make_optimizer(other, cfg)
    before = params_hash(other.parameters())
    with pytest.raises(StateError, match="outer.0"):
        load_state(pack_state(model, outer, opt, 1), other, o_outer, o_opt)
    with pytest.raises(StateError, match="safetensors"):
        load_state(b"\x00" * 64, other, o_outer, o_opt)
    outer.params[0][0] = float("nan")
    with pytest.raises(StateError, match="non-finite"):
        load_state(pack_state(model, outer, opt, 1), model, OuterState.of(model), opt)
    assert params_hash(other.parameters()) == before  # nothing changed on a refusal


# ---- pseudo-gradients out of range ------------------------------------------------------


async def test_ring_refuses_a_chunk_above_the_declared_norms():
    gen = torch.Generator().manual_seed(7)
    vecs = [torch.randn(300, generator=gen) for _ in range(3)]
    norms = [float(v.norm()) for v in vecs]
    out = await _ring_limited(vecs, norms)  # honest: every chunk within the bounds
    assert out[0][0].view(torch.int32).equal(out[2][0].view(torch.int32))
    vecs[1] = vecs[1] * 1000  # member 1 cheats, declaring its true norm
    with pytest.raises(ExceptionGroup) as info:
        await _ring_limited(vecs, norms)
    assert info.group_contains(ring.BadChunk, match="above the declared")


async def _ring_limited(vecs, norms):
    n = len(vecs)
    boxes = [ring.Outbox() for _ in range(n)]
    out = [None] * n

    async def member(i):
        async def pull(phase, rnd):
            return await boxes[(i - 1) % n].take(phase, rnd)

        limit = ring.norm_limits(norms, i)
        out[i] = await ring.all_reduce(vecs[i], i, n, quant.Int8(), boxes[i], pull, limit)

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(member, i)
    return out


def test_a_norm_far_above_the_others_is_refused_for_the_step():
    m = Membership(L, min_members=4)
    alive = {L, A, B, C}
    for p, norm in ((A, 1.0), (B, 1.2), (C, 50.0)):
        m.arrive(p, (0, 0), 0.0, alive, norm=norm)
    assert m.arrive(L, (0, 0), 0.0, alive, norm=0.9) == [L, A, B]
    assert m.norms[(0, 0)] == [0.9, 1.0, 1.2]
    assert m.rejected["norm"] == 1
    with pytest.raises(Refused, match="excluded"):
        m.arrive(C, (0, 1), 1.0, alive, norm=1.0)


def test_a_blamed_member_is_refused_for_the_rest_of_the_step():
    m = Membership(L, min_members=4, resync_timeout=5)
    alive = {L, A, B, C}
    for p in (A, B, C, L):
        m.arrive(p, (0, 0), 0.0, alive, norm=1.0)
    # the ring of attempt 0 is L, A, B, C: each member pulls from its left
    m.blame(C, L, 0, 0)  # L got a bad chunk from C
    m.blame(C, L, 0, 0)  # counted once
    m.blame(L, A, 0, 0)  # the leader is never refused
    m.blame(B, "outsider", 0, 0)  # only members may blame
    assert m.rejected["chunk"] == 1
    assert m.arrive(A, (0, 1), 1.0, alive, norm=1.0) is None
    assert m.arrive(B, (0, 1), 1.0, alive, norm=1.0) is None
    assert m.arrive(L, (0, 1), 1.0, alive, norm=1.0) == [L, A, B]  # not waiting for C
    with pytest.raises(Refused, match="excluded"):
        m.arrive(C, (0, 1), 2.0, alive, norm=1.0)
    with pytest.raises(Refused, match="excluded"):  # asking for the attempt it spoiled,
        m.arrive(C, (0, 0), 2.0, alive, norm=1.0)  # it learns why, not just "stale"


def test_every_outlier_is_counted_and_two_declared_norms_are_enough_to_find_one():
    m = Membership(L, min_members=5)
    alive = {L, A, B, C, "d"}
    for p, norm in ((A, 1.0), (B, 1.1), (C, 50.0), ("d", 60.0)):
        m.arrive(p, (0, 0), 0.0, alive, norm=norm)
    assert m.arrive(L, (0, 0), 0.0, alive, norm=0.9) == [L, A, B]
    assert m.rejected["norm"] == 2
    pair = Membership(L, min_members=2)
    pair.arrive(A, (0, 0), 0.0, {L, A}, norm=100.0)
    assert pair.arrive(L, (0, 0), 0.0, {L, A}, norm=1.0) == [L]  # 100 > 10 x 1
    with pytest.raises(Refused, match="^excluded$"):  # the reason it is told, exactly
        pair.arrive(A, (0, 1), 1.0, {L, A}, norm=1.0)
    assert pair.refused == {"excluded": 1}


def test_a_member_blamed_before_it_asked_for_the_retry_is_left_out_of_it():
    m = Membership(L, min_members=3, resync_timeout=5)
    alive = {L, A, B}
    for p in (A, B, L):
        m.arrive(p, (0, 0), 0.0, alive, norm=1.0)
    assert m.arrive(L, (0, 1), 1.0, alive, norm=1.0) is None  # the retry: A, B not there yet
    m.blame(A, B, 0, 0)  # B pulled a bad chunk from A in attempt 0
    assert m.rejected["chunk"] == 1
    assert m.arrive(B, (0, 1), 1.5, alive, norm=1.0) == [L, B]


def test_the_rosters_of_the_last_two_steps_are_kept_and_older_ones_forgotten():
    m = Membership(L)
    for step in range(4):
        assert m.arrive(L, (step, 0), float(step), {L}, norm=1.0) == [L]
        kept = {(s, 0) for s in (step - 1, step) if s >= 0}
        assert set(m.rosters) == set(m.norms) == kept


# ---- wire messages ---------------------------------------------------------------------


def _header(seq=1):
    from crypto.identity import Identity

    ident = Identity.generate()
    return ident, {"run_id": "test-run", "sender": ident.peer_id, "seq": seq, "ts_ms": 1}


def test_the_largest_roster_fits_and_round_trips_signed():
    from crypto.identity import Identity
    from protocol.diloco import MAX_MEMBERS, DilocoRoster
    from protocol.wire import open_message, seal

    ident, header = _header()
    members = [Identity.generate().peer_id for _ in range(MAX_MEMBERS)]
    roster = DilocoRoster(
        **header,
        step=2**40,
        attempt=1_000_000,
        state="ready",
        encoding="int8",
        members=members,
        norms=[1e29] * MAX_MEMBERS,
    )
    back = open_message(seal(ident, roster), DilocoRoster)
    assert back.members == members and back.norms == [1e29] * MAX_MEMBERS


@pytest.mark.parametrize(
    ("field", "value"),
    [("op", "steal"), ("phase", "xx"), ("norm", float("nan")), ("blame", "not a peer id")],
)
def test_malformed_requests_are_refused(field, value):
    from protocol.diloco import DilocoRequest

    _, header = _header()
    fields = dict(op="sync", step=0, attempt=0, phase="", round=0, layout="", norm=0.0)
    fields.update(state="", blame="")
    fields[field] = value
    with pytest.raises(WireError):
        DilocoRequest.decode(DilocoRequest(**header, **fields).encode())


def test_a_ring_chunk_reply_may_not_declare_more_than_one_frame():
    import msgpack

    from protocol.diloco import MAX_CHUNK, DilocoChunk

    _, header = _header()

    def wire(phase, size):  # encoded by hand: encode() would refuse it first
        c = DilocoChunk(
            **header, step=0, attempt=0, phase=phase, round=0, size=size, digest=bytes(32)
        )
        return msgpack.packb({"type": DilocoChunk.TYPE, **c.to_obj()}, use_bin_type=True)

    assert DilocoChunk.decode(wire("rs", MAX_CHUNK)).size == MAX_CHUNK
    assert DilocoChunk.decode(wire("", 2**40)).size == 2**40  # a whole state, in 4 MiB frames
    for phase in ("rs", "ag"):
        with pytest.raises(WireError, match="ring chunk"):
            DilocoChunk.decode(wire(phase, MAX_CHUNK + 1))


@pytest.mark.parametrize("encoding", ["int8", "fp32"])
@pytest.mark.parametrize("n", [2, 3, 5])
async def test_pulled_sizes_are_the_lengths_the_left_neighbour_offers(encoding, n):
    from node.diloco.group import pulled_sizes

    numel, seen = 1003, {}

    def record(i, phase, rnd, data):
        seen[(i, phase, rnd)] = len(data)
        return data

    await _ring([torch.randn(numel) for _ in range(n)], encoding, record)
    for i in range(n):
        want = {(p, r): seen[(i, p, r)] for p in ("rs", "ag") for r in range(n - 1)}
        assert pulled_sizes(numel, i, n, codecs.compressor(encoding)) == want


class _FrameSource:
    """A reply's frame, recording the sizes it was asked to read up to."""

    def __init__(self, data):
        self.data, self.asked = data, []

    async def read_frame(self, max_size, deadline):
        self.asked.append(max_size)
        return self.data


def _puller_of(reply, source, sizes):
    """What ``DilocoGroup._pull_once`` uses of its group: a node whose ``chunk`` request
    is answered with ``reply`` then ``source``'s frame, and the attempt's chunk sizes."""
    from contextlib import asynccontextmanager
    from types import SimpleNamespace

    @asynccontextmanager
    async def open_request(peer, protocol, msg, reply_type):
        yield SimpleNamespace(reply=reply, reader=source)

    _, header = _header()
    node = SimpleNamespace(
        header=lambda: header,
        open_request=open_request,
        cfg=NodeConfig(net={"read_timeout": 5.0}),
    )
    return SimpleNamespace(node=node, attempts={(0, 0): SimpleNamespace(sizes=sizes)})


@pytest.mark.parametrize("declared", [2**31 - 1, 1123, 0])
async def test_a_chunk_of_another_size_is_refused_before_its_frame_is_read(declared):
    # a peer declaring 2**32 - 1 bytes made us buffer until read_timeout (768 MiB seen)
    import hashlib

    from node.diloco.group import DilocoGroup
    from protocol.diloco import DilocoChunk

    data = bytes(1124)  # int8, 100 values: 1024 + 100 bytes
    digest = hashlib.sha256(data).digest()
    _, header = _header()

    def reply(size):
        return DilocoChunk(
            **header, step=0, attempt=0, phase="rs", round=0, size=size, digest=digest
        )

    honest = _FrameSource(data)
    group = _puller_of(reply(1124), honest, {("rs", 0): 1124})
    assert await DilocoGroup._pull_once(group, "left", (0, 0), "rs", 0) == data
    assert honest.asked == [1124]
    evil = _FrameSource(data)
    group = _puller_of(reply(declared), evil, {("rs", 0): 1124})
    with pytest.raises(ring.BadChunk, match="1124 B expected"):  # the left neighbour is blamed
        await DilocoGroup._pull_once(group, "left", (0, 0), "rs", 0)
    assert evil.asked == []


@pytest.mark.parametrize("frame", [b"\x01" + bytes(1123), bytes(1000)])
async def test_a_chunk_that_is_not_the_bytes_it_declared_blames_its_sender(frame):
    # a wrong digest failed the attempt unblamed: the sender stayed in the next attempt's
    # roster and could fail every attempt of the step until step_timeout
    import hashlib

    from node.diloco.group import DilocoGroup
    from protocol.diloco import DilocoChunk

    _, header = _header()
    declared = DilocoChunk(
        **header,
        step=0,
        attempt=0,
        phase="rs",
        round=0,
        size=1124,
        digest=hashlib.sha256(bytes(1124)).digest(),
    )
    group = _puller_of(declared, _FrameSource(frame), {("rs", 0): 1124})
    with pytest.raises(ring.BadChunk, match="digest"):
        await DilocoGroup._pull_once(group, "left", (0, 0), "rs", 0)


def test_an_announced_joiner_that_never_comes_holds_a_step_only_join_timeout():
    # any peer of the run may announce a join for free: one that never came held every
    # outer step the whole sync_timeout (600 s and more on a trainer)
    m = Membership(L, min_members=2, sync_timeout=600, join_timeout=20)
    for p in (L, A):
        m.arrive(p, (0, 0), 0.0, {L, A})
    assert m.expect(C, 0) == 1  # C announces itself for step 1, and never comes
    alive = {L, A, C}
    assert m.arrive(L, (1, 0), 100.0, alive) is None
    assert m.arrive(A, (1, 0), 101.0, alive) is None
    assert m.poll(119.9, alive) is None  # an honest joiner recovering is waited for ...
    assert m.poll(120.0, alive) == [L, A]  # ... join_timeout, not sync_timeout
    with pytest.raises(Refused, match="late"):
        m.arrive(C, (1, 0), 121.0, alive)
    # a member still training is waited for sync_timeout, a joiner announced or not
    assert m.expect("d", 0) == 2
    alive = {L, A, "d"}
    assert m.arrive(L, (2, 0), 200.0, alive) is None
    assert m.poll(300.0, alive) is None
    assert m.arrive("d", (2, 0), 310.0, alive) is None  # the joiner came, A still trains
    assert m.arrive(A, (2, 0), 320.0, alive) == [L, A, "d"]


async def test_a_refusal_of_the_leader_names_its_reason():
    """What the leader's ``Membership`` refused us for reaches the member's role, so a
    joiner refused ``late`` can join again (``GroupTrainerRole``)."""
    from types import SimpleNamespace

    from node.diloco.group import DilocoGroup, GroupError
    from node.net.requests import RemoteRefusal

    async def request(peer, protocol, msg, reply_type):
        raise RemoteRefusal("not_member", "refused: late")

    _, header = _header()
    node = SimpleNamespace(header=lambda: header, request=request)
    group = SimpleNamespace(leading=False, node=node, cfg=SimpleNamespace(leader="leader"))
    with pytest.raises(GroupError) as refused:
        await DilocoGroup._sync(group, 3, 0, "s" * 64, "l" * 64, 1.0, "")
    assert refused.value.why == "late"


# ---- what a member takes and whom it serves (the group's checks) ------------------------


def _roster_from(signer, sender, members, **fields):
    """A ``DilocoRoster`` (step 3, attempt 0 unless ``fields`` say otherwise) sealed by
    ``signer`` naming ``sender``, opened as ``node.request`` hands a reply over (signature
    and sender checked)."""
    from protocol.diloco import DilocoRoster
    from protocol.wire import open_message, seal

    roster = DilocoRoster(
        **{
            "run_id": "test-run",
            "sender": sender,
            "seq": 1,
            "ts_ms": 1,
            "step": 3,
            "attempt": 0,
            "state": "ready",
            "encoding": "int8",
            "members": members,
            "norms": [1.0] * len(members),
            **fields,
        }
    )
    return open_message(seal(signer, roster), DilocoRoster)


def test_a_member_takes_only_the_roster_its_leader_signed():
    # a roster signed by another peer of the run (any peer can sign one naming itself)
    # would let it pick the ring: who pulls from whom, and with which declared norms
    from types import SimpleNamespace

    from crypto.identity import Identity
    from node.diloco.group import DilocoGroup, GroupError

    leader, other, me = (Identity.generate() for _ in range(3))
    group = SimpleNamespace(
        me=me.peer_id, cfg=SimpleNamespace(leader=leader.peer_id, encoding="int8")
    )
    members = [leader.peer_id, me.peer_id]
    signed = _roster_from(leader, leader.peer_id, members)
    assert DilocoGroup._checked(group, signed, 3, 0) == members
    with pytest.raises(GroupError, match="not from the leader"):
        DilocoGroup._checked(group, _roster_from(other, other.peer_id, members), 3, 0)
    with pytest.raises(WireError, match="sender is not the signer"):  # nor in its name
        _roster_from(other, leader.peer_id, members)


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"step": 2}, "not for this attempt"),  # the roster of another step
        ({"attempt": 0}, "not for this attempt"),  # an attempt before the one we asked for
        ({"members": ["L", "other"]}, "without us"),
        ({"members": ["L", "me", "other", "me"]}, "with a peer twice"),
        ({"norms": [1.0]}, "without a norm for each member"),
        ({"encoding": "fp32"}, "we were set up for another"),
    ],
    ids=["step", "attempt", "not_us", "twice", "norms", "encoding"],
)
def test_a_member_refuses_a_roster_of_its_leader_that_does_not_fit_its_ask(fields, why):
    from types import SimpleNamespace

    from crypto.identity import Identity
    from node.diloco.group import DilocoGroup, GroupError

    ids = {name: Identity.generate() for name in ("L", "me", "other")}
    peer = {name: ident.peer_id for name, ident in ids.items()}
    fields = {k: [peer[m] for m in v] if k == "members" else v for k, v in fields.items()}
    if "members" in fields and "norms" not in fields:
        fields["norms"] = [1.0] * len(fields["members"])
    group = SimpleNamespace(me=peer["me"], cfg=SimpleNamespace(leader=peer["L"], encoding="int8"))
    fits = _roster_from(ids["L"], peer["L"], [peer["L"], peer["me"]], attempt=1)
    assert DilocoGroup._checked(group, fits, 3, 1) == [peer["L"], peer["me"]]
    members = fields.pop("members", [peer["L"], peer["me"]])
    bad = _roster_from(ids["L"], peer["L"], members, **{"attempt": 1, **fields})
    with pytest.raises(GroupError, match=why):
        DilocoGroup._checked(group, bad, 3, 1)


def _chunk_request(ident, phase="rs"):
    from protocol.diloco import DilocoRequest

    return DilocoRequest(
        run_id="test-run",
        sender=ident.peer_id,
        seq=1,
        ts_ms=1,
        op="chunk",
        step=0,
        attempt=0,
        phase=phase,
        round=0,
        layout="",
        norm=0.0,
        state="",
        blame="",
    )


async def test_a_ring_chunk_is_served_to_our_right_neighbour_in_the_roster_only():
    import hashlib
    from types import SimpleNamespace

    from crypto.identity import Identity
    from node.diloco.chunks import Attempt, serve_chunk
    from protocol.errors import Reason

    left, me, right, outsider = (Identity.generate() for _ in range(4))
    outbox = ring.Outbox()
    outbox.offer("rs", 0, b"chunk bytes")
    attempt = Attempt([left.peer_id, me.peer_id, right.peer_id], outbox, [1.0] * 3, {})
    node = SimpleNamespace(
        peer_id=me.peer_id,
        cfg=NodeConfig(net={"read_timeout": 2.0}),
        header=lambda: {"run_id": "test-run", "sender": me.peer_id, "seq": 1, "ts_ms": 1},
    )

    class Responder:
        def __init__(self):
            self.sent, self.written = [], []

        async def send(self, msg):
            self.sent.append(msg)

        async def write(self, data):
            self.written.append(data)

    for peer in (outsider, left, me):  # not in the roster; in it, but not to our right
        refused = Responder()
        with pytest.raises(WireError, match="right neighbour") as info:
            await serve_chunk(node, attempt, _chunk_request(peer), refused)
        assert info.value.reason == Reason.NOT_MEMBER
        assert refused.sent == refused.written == []
    served = Responder()
    await serve_chunk(node, attempt, _chunk_request(right), served)
    assert served.written == [b"chunk bytes"]
    assert served.sent[0].digest == hashlib.sha256(b"chunk bytes").digest()


class _OneFailedAttempt:
    """What ``DilocoGroup.all_reduce`` uses of its group: attempt 0 in the roster
    ``[a, me, b]`` whose every pull ends with ``failure``; attempt 1 alone (it returns at
    once). ``syncs``: (attempt, blamed) of each ask for a roster."""

    def __init__(self, failure):
        from types import SimpleNamespace

        self.me, self.failure, self.syncs = "me", failure, []
        self.cfg = SimpleNamespace(step_timeout=30.0, compressor=quant.Fp32())
        self.attempts, self.failures = {}, 0

    async def _sync(self, step, attempt, state, layout, norm, blame):
        self.syncs.append((attempt, blame))
        if attempt == 0:
            return ["a", "me", "b"], [1.0] * 3, 0
        return ["me"], [1.0], attempt

    def _puller(self, key, roster):
        async def pull(phase, rnd):
            if isinstance(self.failure, Exception):
                raise self.failure
            return self.failure

        return pull

    async def _attempts(self, *args):
        from node.diloco.group import DilocoGroup

        return await DilocoGroup._attempts(self, *args)


@pytest.mark.parametrize(
    ("failure", "blamed"),
    [
        (b"\x00" * 7, "a"),  # does not decode: from our left neighbour, the one we pull from
        (ConnectionError("stream reset"), ""),  # a dead or slow peer: nobody is blamed
    ],
    ids=["bad_chunk", "dead_peer"],
)
async def test_a_failed_ring_attempt_blames_the_left_neighbour_for_a_bad_chunk_only(
    failure, blamed
):
    from node.diloco.group import DilocoGroup

    group = _OneFailedAttempt(failure)
    out = await DilocoGroup.all_reduce(group, 0, torch.ones(12), "s" * 64, "l" * 64)
    assert group.syncs == [(0, ""), (1, blamed)]
    assert out.attempts == 2 and out.roster == ["me"] and group.failures == 1


async def test_a_member_whose_leader_never_answers_ends_the_step_with_a_group_error(
    autojump_clock, caplog
):
    """A leader gone (its run over, its machine down) is asked again every poll until
    ``step_timeout``; then the step ends with a ``GroupError`` that says so, which the
    roles handle, not a bare ``TooSlowError`` that ends the node."""
    from types import SimpleNamespace

    from node.diloco.group import DilocoGroup, GroupError

    caplog.set_level(logging.DEBUG, logger="intellect.diloco")
    asks = []

    async def request(peer, protocol, msg, reply_type):
        asks.append(trio.current_time())
        raise ConnectionError("failed to dial the leader")

    _, header = _header()
    node = SimpleNamespace(header=lambda: header, request=request)
    cfg = SimpleNamespace(leader="leader", step_timeout=5.0, poll_interval=0.1)
    cfg.compressor = quant.Fp32()
    group = SimpleNamespace(leading=False, node=node, cfg=cfg, failures=0, feedback=None)
    group._sync = lambda *a: DilocoGroup._sync(group, *a)
    group._checked = lambda *a: DilocoGroup._checked(group, *a)
    group._attempts = lambda *a: DilocoGroup._attempts(group, *a)
    with pytest.raises(GroupError, match=r"step 3 not done within step_timeout \(5 s\)"):
        await DilocoGroup.all_reduce(group, 3, torch.ones(12), "s" * 64, "l" * 64)
    assert trio.current_time() == pytest.approx(5.0)
    assert len(asks) >= 40  # asked again every poll, up to the end
    said = [r for r in caplog.records if "sync with the leader failed" in r.getMessage()]
    assert len(said) == len(asks)  # every failure is logged, but only the first at INFO
    assert [r.getMessage()[:36] for r in said if r.levelname == "INFO"] == [
        "sync with the leader failed (1 in a "
    ]


# ---- more of the rosters' and the group's checks -------------------------------------


def test_a_peer_not_admitted_cannot_announce_a_join_either():
    # an announced joiner holds the next roster up to join_timeout: a peer the leader does
    # not admit would hold every step that long for free
    m = Membership(L, min_members=2, admit=frozenset({A}))
    with pytest.raises(Refused, match="not_admitted"):
        m.expect(C, 0)
    assert m.joining == {} and m.expect(A, 0) == 0


def test_the_leaders_own_norm_is_never_an_outlier():
    m = Membership(L, min_members=3)
    alive = {L, A, B}
    m.arrive(A, (0, 0), 0.0, alive, norm=1.0)
    m.arrive(B, (0, 0), 0.0, alive, norm=1.1)
    assert m.arrive(L, (0, 0), 0.0, alive, norm=500.0) == [L, A, B]
    assert m.rejected["norm"] == 0


def test_a_member_can_blame_only_its_left_neighbour_in_the_attempt_that_failed():
    """A member pulls only from its left neighbour, so that is the only peer its bad chunk
    can have come from: a blame of anyone else would let one member have any honest one
    refused for the step. Nor does a blame count for an attempt with no roster."""
    m = Membership(L, min_members=4, resync_timeout=5)
    alive = {L, A, B, C}
    for p in (A, B, C, L):
        m.arrive(p, (0, 0), 0.0, alive, norm=1.0)
    assert m.rosters[(0, 0)] == [L, A, B, C]
    m.blame(C, A, 0, 0)  # A's left neighbour is L, not C
    m.blame(A, C, 0, 0)  # nor is C's: B is
    m.blame(A, B, 0, 1)  # attempt 1 never formed
    assert m.rejected["chunk"] == 0 and m.excluded.get(0, set()) == set()
    m.blame(A, B, 0, 0)  # B's left neighbour is A
    assert m.rejected["chunk"] == 1 and m.excluded[0] == {A}


def test_a_blamed_member_that_asked_early_for_the_retry_is_left_out_of_it():
    # the member that sent the bad chunk may ask for the next attempt before the leader
    # opens it (it saw the attempt fail too); the blame comes after it
    m = Membership(L, min_members=3, resync_timeout=5)
    alive = {L, A, B}
    for p in (A, B, L):
        m.arrive(p, (0, 0), 0.0, alive, norm=1.0)
    assert m.arrive(B, (0, 1), 1.0, alive, norm=1.0) is None  # waits: not opened yet
    m.blame(B, L, 0, 0)  # the leader pulled a bad chunk from B (its left neighbour)
    assert m.arrive(A, (0, 1), 1.0, alive, norm=1.0) is None
    assert m.arrive(L, (0, 1), 1.0, alive, norm=1.0) == [L, A]


def test_only_transient_stream_failures_are_pulled_again():
    from node.diloco.group import _transient
    from node.net.requests import RemoteRefusal
    from protocol.errors import Reason

    assert _transient(ConnectionError("reset"))
    assert _transient(WireError(Reason.TRUNCATED, "closed")) and _transient(
        WireError(Reason.TIMEOUT, "slow")
    )
    assert not _transient(ring.BadChunk("does not decode"))  # blamed at once, not pulled again
    assert not _transient(RemoteRefusal("not_member", "no"))
    assert not _transient(WireError(Reason.MALFORMED, "a chunk for another round"))


async def test_a_chunk_reply_for_another_round_is_refused():
    import hashlib

    from node.diloco.group import DilocoGroup
    from protocol.diloco import DilocoChunk

    data = bytes(1124)
    _, header = _header()
    reply = DilocoChunk(
        **header,
        step=0,
        attempt=0,
        phase="rs",
        round=1,  # asked: round 0 (the same size: the frame would have been taken)
        size=1124,
        digest=hashlib.sha256(data).digest(),
    )
    source = _FrameSource(data)
    group = _puller_of(reply, source, {("rs", 0): 1124})
    with pytest.raises(WireError, match="another round"):
        await DilocoGroup._pull_once(group, "left", (0, 0), "rs", 0)
    assert source.asked == []


class _Replies:
    """A responder that records what it was given."""

    def __init__(self):
        self.sent, self.written = [], []

    async def send(self, msg):
        self.sent.append(msg)

    async def write(self, data):
        self.written.append(data)


def _leader_group(leading, roster):
    """What ``DilocoGroup._handle`` uses of a group: its node (the first peer of
    ``roster``), and a ``Membership`` whose roster of step 0 attempt 0 is ``roster``."""
    from types import SimpleNamespace

    from node.diloco.group import DilocoGroup

    ident, header = roster[0], {"run_id": "test-run", "seq": 1, "ts_ms": 1}
    node = SimpleNamespace(
        peer_id=ident.peer_id,
        header=lambda: {**header, "sender": ident.peer_id},
        known_peers=lambda: [i.peer_id for i in roster],
    )
    peers = [i.peer_id for i in roster]
    membership = Membership(peers[0], min_members=len(peers))
    for p in peers:
        membership.arrive(p, (0, 0), 0.0, set(peers), norm=1.0)
    group = SimpleNamespace(
        node=node,
        me=ident.peer_id,
        leading=leading,
        membership=membership,
        cfg=SimpleNamespace(leader=peers[0], encoding="int8"),
    )
    group._arrive = lambda *args: DilocoGroup._arrive(group, *args)
    return group


def _sync_request(ident, attempt=1, blame=""):
    from protocol.diloco import DilocoRequest

    return DilocoRequest(
        run_id="test-run",
        sender=ident.peer_id,
        seq=1,
        ts_ms=1,
        op="sync",
        step=0,
        attempt=attempt,
        phase="",
        round=0,
        layout="",
        norm=1.0,
        state="",
        blame=blame,
    )


async def test_only_the_leader_answers_a_sync_and_only_members_may_blame():
    from crypto.identity import Identity
    from node.diloco.group import DilocoGroup
    from protocol.errors import Reason

    lead, a, b, c, outsider = (Identity.generate() for _ in range(5))
    member = _leader_group(False, [a, lead, b, c])  # a, not the leader, is asked
    with pytest.raises(WireError, match="not the group's leader") as info:
        await DilocoGroup._handle(member, _sync_request(b), _Replies())
    assert info.value.reason == Reason.NOT_FOUND and member.membership.current == (0, 0)

    group = _leader_group(True, [lead, a, b, c])
    await DilocoGroup._handle(group, _sync_request(outsider, blame=c.peer_id), _Replies())
    assert group.membership.excluded == {} and group.membership.rejected["chunk"] == 0
    ring = group.membership.rosters[(0, 0)]  # the leader first
    assert ring[0] == lead.peer_id
    accuser = next(i for i in (a, b, c) if i.peer_id == ring[2])
    await DilocoGroup._handle(group, _sync_request(accuser, blame=ring[3]), _Replies())
    assert group.membership.excluded == {}  # it pulled nothing from that one
    replies = _Replies()  # a member got a bad chunk from its left neighbour
    await DilocoGroup._handle(group, _sync_request(accuser, blame=ring[1]), replies)
    assert group.membership.excluded == {0: {ring[1]}}
    assert replies.sent[0].state == "wait"


async def test_a_joiner_takes_a_join_answer_only_from_the_leader():
    from types import SimpleNamespace

    from crypto.identity import Identity
    from node.diloco.recovery import JoinRefused, ask_join

    leader, other, me = (Identity.generate() for _ in range(3))
    answer = {}

    async def request(peer, protocol, msg, reply_type):
        return answer["reply"]

    node = SimpleNamespace(
        header=lambda: {"run_id": "test-run", "sender": me.peer_id, "seq": 1, "ts_ms": 1},
        request=request,
    )
    answer["reply"] = _roster_from(leader, leader.peer_id, [leader.peer_id], step=4)
    assert (await ask_join(node, leader.peer_id)).step == 4
    answer["reply"] = _roster_from(other, other.peer_id, [other.peer_id], step=4)
    with pytest.raises(JoinRefused, match="not from the leader"):
        await ask_join(node, leader.peer_id)


async def test_a_member_serves_the_state_of_the_step_asked_for_only():
    from types import SimpleNamespace

    from crypto.identity import Identity
    from node.diloco.recovery import request, serve_state
    from protocol.errors import Reason

    me = Identity.generate()
    node = SimpleNamespace(
        header=lambda: {"run_id": "test-run", "sender": me.peer_id, "seq": 1, "ts_ms": 1}
    )
    snapshot = (5, b"state at 5")
    for step, reason in ((6, Reason.BUSY), (4, Reason.NOT_FOUND)):
        with pytest.raises(WireError) as info:
            await serve_state(node, snapshot, request(node, "state", step), _Replies())
        assert info.value.reason == reason
    served = _Replies()
    await serve_state(node, snapshot, request(node, "state", 5), served)
    assert served.sent[0].step == 5 and b"".join(served.written) == b"state at 5"


async def test_a_joiner_loads_only_state_bytes_that_match_their_digest_and_step(
    autojump_clock,
):
    import hashlib
    from contextlib import asynccontextmanager
    from types import SimpleNamespace

    from crypto.identity import Identity
    from node.diloco.recovery import fetch_state
    from protocol.diloco import DilocoChunk

    donor = Identity.generate()
    good = b"the state at step 5"
    replies = [  # (declared step, declared digest, bytes sent)
        (5, hashlib.sha256(good).digest(), b"another state at 5!"),  # not its digest
        (4, hashlib.sha256(b"the state at step 4").digest(), b"the state at step 4"),
        (5, hashlib.sha256(good).digest(), good),
    ]

    @asynccontextmanager
    async def open_request(peer, protocol, msg, reply_type):
        step, digest, data = replies.pop(0)
        reply = DilocoChunk(
            run_id="test-run",
            sender=donor.peer_id,
            seq=1,
            ts_ms=1,
            step=step,
            attempt=0,
            phase="",
            round=0,
            size=len(data),
            digest=digest,
        )
        yield SimpleNamespace(reply=reply, reader=_FrameSource(data))

    node = SimpleNamespace(
        header=lambda: {"run_id": "test-run", "sender": donor.peer_id, "seq": 1, "ts_ms": 1},
        open_request=open_request,
        cfg=NodeConfig(net={"read_timeout": 5.0}),
    )
    with trio.fail_after(3600):  # virtual time: a fetch that retries forever fails here
        assert await fetch_state(node, donor.peer_id, 5) == good
    assert replies == []  # the two bad transfers were asked again, not loaded
