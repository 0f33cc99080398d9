"""The trainer role as a DiLoCo group (``--diloco.enabled``, SPEC §21): who trains on which batch
(pure), the member's policy process (inner steps, pseudo-gradient, outer step, checkpoint),
in one process and over two torchrun ranks, and one real run: chain, bootstrap, two trainers
in one group (the second on two ranks), a validator and two workers as processes on
127.0.0.1 for two outer steps."""

from __future__ import annotations

import hashlib
import json

import pytest

from node.config import NodeConfig
from node.roles.decisions.grouping import Rosters, owner, share, step_ready
from tests.helpers.net import wait_until

A, B, C = "peer-a", "peer-b", "peer-c"


def keys(n: int) -> list[bytes]:
    return [hashlib.sha256(f"k{i}".encode()).digest() for i in range(n)]


def test_every_batch_has_exactly_one_owner_and_all_members_agree():
    roster = [A, B, C]
    ks = keys(300)
    owners = [owner(k, roster) for k in ks]
    assert {o: owners.count(o) for o in roster}.keys() == set(roster)
    assert all(70 <= owners.count(o) <= 130 for o in roster), owners  # about a third each
    # every member decides alone, from the same rosters: the shares partition the batches
    views = {m: Rosters({0: roster, 1: [A, B]}) for m in roster}
    for version in (0, 1):
        for k in ks:
            mine = [m for m in roster if views[m].mine(m, k, version)]
            assert len(mine) == 1
            assert mine[0] == owner(k, views[A].by_version[version])
    assert not any(views[C].mine(C, k, 1) for k in ks)  # C is not in version 1's roster
    assert not any(views[A].mine(A, k, 7) for k in ks)  # an unknown roster: nobody's
    with pytest.raises(ValueError, match="empty roster"):
        owner(ks[0], [])


def test_rosters_survive_a_restart_and_old_ones_are_forgotten(tmp_path):
    r = Rosters()
    assert r.latest() == []
    r.record(0, [A, B])
    r.record(1, [A])
    r.record(2, [A, B])
    r.forget_before(1)
    r.save(tmp_path / "r.json")
    again = Rosters.load(tmp_path / "r.json")
    assert again.by_version == {1: [A], 2: [A, B]}
    assert again.latest() == [A, B]
    assert Rosters.load(tmp_path / "none.json").by_version == {}
    assert share(2, 2) == 1 and share(3, 2) == 2 and share(1, 4) == 1 and share(4, 0) == 4


def test_a_member_waits_for_its_share_then_goes_on_only_if_the_group_has_work():
    assert step_ready(mine=1, want=1, waited=0.0, step_wait=30, theirs_new=0)
    assert not step_ready(mine=1, want=2, waited=29.9, step_wait=30, theirs_new=5)
    assert step_ready(mine=1, want=2, waited=30.0, step_wait=30, theirs_new=0)
    # nothing of its own: on with a zero pseudo-gradient only if the others have new work
    assert step_ready(mine=0, want=1, waited=31.0, step_wait=30, theirs_new=1)
    assert not step_ready(mine=0, want=1, waited=500.0, step_wait=30, theirs_new=0)


def test_a_member_with_nothing_to_train_on_does_not_make_the_others_outliers():
    """A leader whose share was empty declares a zero pseudo-gradient norm; the member that
    trained must stay in the roster (the zero is not the outlier reference), while a norm
    far above the real ones is still refused."""
    from node.diloco.membership import Membership

    m = Membership("L", min_members=2)
    alive = {"L", "F"}
    assert m.arrive("L", (0, 0), 0.0, alive, "lay", "s", 0.0) is None
    assert m.arrive("F", (0, 0), 0.0, alive, "lay", "s", 5.0) == ["L", "F"]
    m2 = Membership("L", min_members=3)
    m2.arrive("L", (0, 0), 0.0, {"L", "F", "G"}, "lay", "s", 1.0)
    m2.arrive("F", (0, 0), 0.0, {"L", "F", "G"}, "lay", "s", 0.0)
    assert m2.arrive("G", (0, 0), 0.0, {"L", "F", "G"}, "lay", "s", 100.0) == ["L", "F"]
    assert m2.rejected["norm"] == 1


def test_diloco_settings_and_their_errors():
    NodeConfig(
        role="trainer", diloco={"enabled": True}, trainer={"procs": 2}
    )  # a member over 2 ranks
    NodeConfig(role="trainer", diloco={"enabled": True, "quant": "fp32", "inner_steps": 3})
    with pytest.raises(ValueError, match="diloco.quant"):
        NodeConfig(diloco={"quant": "int4"})


def made_envelopes(model_dir, n=2):
    from crypto.identity import Identity
    from node.rollouts.maker import BatchMaker, MakeBatch, MakerSpec
    from protocol.rollouts import RolloutBatch
    from protocol.wire import seal

    maker = BatchMaker(
        MakerSpec(
            taskset="arithmetic",
            tasks_per_batch=4,
            group_size=4,
            max_new_tokens=12,
            temperature=1.0,
            engine_batch=16,
        )
    )
    out = []
    for i in range(n):
        identity = Identity.generate()
        header = dict(run_id="r", sender=identity.peer_id, seq=1, ts_ms=1_700_000_000_000)
        made = maker(MakeBatch(str(model_dir), "0x" + f"{i + 1:02x}" * 20, i, 0, header))
        out.append(seal(identity, RolloutBatch.decode(made.encoded)))
    return out


def spec_for(model_dir, root, step=0, **kw):
    from node.roles.children.grouppolicy import GroupSpec
    from node.training.worker import PolicySpec

    policy = PolicySpec(
        base=str(model_dir),
        checkpoints=str(root),
        step=step,
        lr=1e-3,
        seed=0,
        taskset="arithmetic",
        heldout_per_level=2,
        heldout_seed=0,
        max_new_tokens=12,
        temperature=1.0,
    )
    return GroupSpec(policy, **{"inner_steps": 2, "outer_lr": 1.0, "outer_momentum": 0.0, **kw})


def test_a_member_alone_with_outer_lr_1_trains_exactly_as_its_inner_steps(tiny_model_dir, tmp_path):
    """Outer lr 1, no momentum, alone: θ ← θ_after bit for bit, so version 1 is the policy
    after H plain GRPO steps on the same slices; the checkpoint holds it, the hash names it.
    With momentum the outer state survives a restart of the child (``v1.outer``)."""
    import torch
    from safetensors.torch import load_file

    from node.diloco.outer import params_hash
    from node.roles.children.grouppolicy import (
        GroupPolicyWorker,
        InnerSteps,
        OuterApply,
        PseudoGradient,
    )
    from node.training.grpo import GRPOConfig
    from node.training.policy import Policy
    from node.training.worker import PolicyWorker, TrainStep

    envelopes = made_envelopes(tiny_model_dir)
    member = GroupPolicyWorker(spec_for(tiny_model_dir, tmp_path / "m"))
    start = member(PseudoGradient())
    assert float(start.vector.abs().max()) == 0.0  # nothing trained yet
    stats = member(InnerSteps(0, envelopes))
    assert stats.samples > 0 and stats.tokens > 0
    delta = member(PseudoGradient())
    assert delta.state == start.state and float(delta.vector.norm()) > 0
    digest = member(OuterApply(0, delta.vector, True))

    # the same H = 2 steps in a plain policy, on the same two slices of the same samples
    plain = Policy(tiny_model_dir, GRPOConfig(lr=1e-3), seed=0)
    samples, _, _ = member.worker.samples(envelopes)
    half = (len(samples) + 1) // 2
    for part in (samples[:half], samples[half:]):
        plain.train_step(part, 1.0)
    assert digest == params_hash(plain.model.parameters())
    saved = load_file(tmp_path / "m" / "v1" / "model.safetensors")
    for name, p in plain.model.named_parameters():
        assert torch.equal(saved[name], p.detach()), name
    base = load_file(tiny_model_dir / "model.safetensors")
    assert any(not torch.equal(base[k], saved[k]) for k in base)  # it moved
    with pytest.raises(ValueError, match="outer step 0 asked"):
        member(OuterApply(0, delta.vector, True))  # a step twice is refused

    # momentum: kept in v{n}.outer and loaded by a restarted child
    m2 = GroupPolicyWorker(spec_for(tiny_model_dir, tmp_path / "n", outer_momentum=0.9))
    m2(InnerSteps(0, envelopes))
    d = m2(PseudoGradient())
    m2(OuterApply(0, d.vector, False))
    again = GroupPolicyWorker(spec_for(tiny_model_dir, tmp_path / "n", step=1, outer_momentum=0.9))
    assert again.outer.step == 1
    for x, y in zip(again.outer.momentum, m2.outer.momentum, strict=True):
        assert torch.equal(x, y)
    assert any(float(b.abs().max()) > 0 for b in again.outer.momentum)
    assert again(PseudoGradient()).state == params_hash(m2.outer.params)

    # a single trainer's step (the same samples, one optimizer step) goes on as before
    single = PolicyWorker(spec_for(tiny_model_dir, tmp_path / "s").policy)
    one = single(TrainStep(0, envelopes))
    assert (one.samples, one.tokens) == (stats.samples, stats.tokens)
    assert (tmp_path / "s" / "v1" / "model.safetensors").exists()


def test_an_outer_step_whose_checkpoint_failed_to_save_is_saved_again_not_taken_twice(
    tiny_model_dir, tmp_path
):
    """After the all-reduce a full disk refused checkpoint n + 1: the same ``OuterApply``
    again saves the parameters the outer step made (refused before: "outer step 0 asked,
    the policy is at 1", and the member stopped), with the hash an undisturbed member
    reports; once saved, the step is refused again."""
    from node.roles.children.grouppolicy import (
        GroupPolicyWorker,
        InnerSteps,
        OuterApply,
        PseudoGradient,
    )
    from tests.helpers.disk import file_size_limit

    envelopes = made_envelopes(tiny_model_dir)
    digests = []
    for name, disk_full_once in (("full", True), ("calm", False)):
        member = GroupPolicyWorker(spec_for(tiny_model_dir, tmp_path / name, outer_momentum=0.9))
        member(InnerSteps(0, envelopes))
        delta = member(PseudoGradient())
        if disk_full_once:
            with file_size_limit(1000), pytest.raises(OSError, match="File too large"):
                member(OuterApply(0, delta.vector, True))
            assert not (tmp_path / name / "v1").exists()
        digests.append(member(OuterApply(0, delta.vector, True)))
        assert (tmp_path / name / "v1.outer").exists()
        with pytest.raises(ValueError, match="outer step 0 asked"):
            member(OuterApply(0, delta.vector, True))
    assert digests[0] == digests[1]


def test_a_joiners_child_takes_the_leaders_state_into_both_parameter_copies(
    tiny_model_dir, tmp_path
):
    """``PackState`` on the leader's child after an outer step, ``Recover`` in a fresh one:
    the same state packed again, the model's parameters θ's, checkpoint 1 written (model,
    AdamW state, outer momentum) so that a restarted child resumes from it; another
    version's state is refused."""
    import torch

    from node.diloco.outer import params_hash
    from node.diloco.state import state_hash
    from node.roles.children.grouppolicy import (
        GroupPolicyWorker,
        OuterApply,
        PackState,
        PseudoGradient,
        Recover,
    )

    kw = {"outer_lr": 0.7, "outer_momentum": 0.9}
    leader = GroupPolicyWorker(spec_for(tiny_model_dir, tmp_path / "l", **kw))
    n = leader(PseudoGradient()).vector.numel()
    leader(OuterApply(0, torch.linspace(-1e-3, 1e-3, n), False))
    packed = leader(PackState())
    joiner = GroupPolicyWorker(spec_for(tiny_model_dir, tmp_path / "j", **kw))
    assert joiner(PseudoGradient()).state != leader(PseudoGradient()).state
    with pytest.raises(ValueError, match="a state of version 1, not 3"):
        joiner(Recover(packed, 3))
    got = joiner(Recover(packed, 1))
    assert got.state_hash == state_hash(packed) and got.version == 1
    assert got.params_hash == params_hash(leader.policy.model.parameters())
    assert joiner(PseudoGradient()).state == leader(PseudoGradient()).state  # θ too
    for x, y in zip(joiner.outer.momentum, leader.outer.momentum, strict=True):
        assert torch.equal(x, y)
    again = GroupPolicyWorker(spec_for(tiny_model_dir, tmp_path / "j", step=1, **kw))
    assert again(PackState()) == packed  # its checkpoint is the leader's state


def test_a_member_over_two_torchrun_ranks_is_the_member_in_one_process(tiny_model_dir, tmp_path):
    """``--diloco.enabled --trainer.procs 2``: the member's calls go to two gloo ranks that shard the
    policy with FSDP2 and keep θ and the momentum of their own rows. From the same start and
    the same group average, the outer step gives the one-process member's parameters bit for
    bit (hash, checkpoint, momentum file); the pseudo-gradient is the one-process one up to
    the order in which the ranks' gradients add; the packed state is whole, loads into a
    member in one process, and a state loaded into the ranks packs back byte for byte, also
    after the ranks are restarted from its checkpoint."""
    import torch
    from safetensors.torch import load, load_file

    from node.diloco.state import state_hash
    from node.roles.children.grouppolicy import (
        GroupPolicyWorker,
        InnerSteps,
        OuterApply,
        PackState,
        PseudoGradient,
        Recover,
    )
    from node.training.ranks import RankedPolicyWorker, RanksSpec

    envelopes = made_envelopes(tiny_model_dir)
    kw = {"outer_lr": 0.7, "outer_momentum": 0.9}
    one = GroupPolicyWorker(spec_for(tiny_model_dir, tmp_path / "one", **kw))
    two_spec = spec_for(tiny_model_dir, tmp_path / "two", **kw)
    two = RankedPolicyWorker(RanksSpec(2, two_spec, GroupPolicyWorker))
    try:
        start1, start2 = one(PseudoGradient()), two(PseudoGradient())
        assert (start2.state, start2.layout) == (start1.state, start1.layout)
        assert start2.vector.numel() == start1.vector.numel()
        assert float(start2.vector.abs().max()) == 0.0

        s1, s2 = one(InnerSteps(0, envelopes)), two(InnerSteps(0, envelopes))
        assert (s1.ranks, s2.ranks) == (1, 2)  # sharded across both ranks
        assert (s2.samples, s2.tokens) == (s1.samples, s1.tokens) and s1.samples > 0
        assert abs(s2.loss - s1.loss) <= 1e-4 * max(1.0, abs(s1.loss))
        d1, d2 = one(PseudoGradient()), two(PseudoGradient())
        assert d2.state == d1.state  # θ did not move in the inner phase
        # whole and in the same order: a rank's rows missing, doubled or misplaced would be
        # off by about a step (lr 1e-3) on most values; summation order moves few (AdamW)
        moved = float(d1.vector.abs().sum())
        assert float((d2.vector - d1.vector).abs().max()) <= 2e-4
        assert float((d2.vector - d1.vector).abs().sum()) <= 0.01 * moved

        average = (d1.vector + d2.vector) / 2  # as a group of the two would average them
        h1 = one(OuterApply(0, average, False))
        h2 = two(OuterApply(0, average, False))
        assert h2 == h1  # θ − lr·d from the same θ and average: bit for bit
        for name in ("v1/model.safetensors", "v1.outer"):
            a, b = load_file(tmp_path / "one" / name), load_file(tmp_path / "two" / name)
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name

        packed2 = two(PackState())
        t1, t2 = load(one(PackState())), load(packed2)
        assert t1.keys() == t2.keys()
        for k in t1:  # θ and b bit for bit, AdamW's moments up to the summation order
            if k.startswith(("outer.", "momentum.", "meta.")) or k.endswith(".step"):
                assert torch.equal(t1[k], t2[k]), k
            else:
                assert t1[k].shape == t2[k].shape and torch.allclose(t1[k], t2[k], atol=1e-5), k

        # the sharded state is whole: a member in one process continues from it
        joiner = GroupPolicyWorker(spec_for(tiny_model_dir, tmp_path / "j", **kw))
        got = joiner(Recover(packed2, 1))
        assert got.params_hash == h2 and got.state_hash == state_hash(packed2)

        # and a whole state loads into the ranks' rows: packed again byte for byte
        packed1 = one(PackState())
        assert packed1 != packed2
        back = two(Recover(packed1, 1))
        assert back.state_hash == state_hash(packed1) and back.params_hash == h1
    finally:
        two.close()
    restarted = RankedPolicyWorker(
        RanksSpec(2, spec_for(tiny_model_dir, tmp_path / "two", step=1, **kw), GroupPolicyWorker)
    )
    try:  # its checkpoint 1 (written by the recovery) is that state: model, AdamW, momentum
        assert restarted(PackState()) == packed1
    finally:
        restarted.close()


# ---- one real run -------------------------------------------------------------------------

STEPS = 2  # outer steps (policy versions)
H = 2  # inner steps per outer step


def lines_of(base, name):
    """The member's metrics lines written so far (a line still being written is not one)."""
    path = base / name / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().split("\n")[:-1] if x.strip()]


def group_env(*admitted: str, steps: int) -> dict[str, str]:
    """A two-member GRPO group's settings: the leader admits ``admitted``; ``steps`` outer
    steps (0: on until the test stops it); no held-out evaluation."""
    return {
        "INTELLECT_NODE_DILOCO__ADMIT": ",".join(admitted),
        "INTELLECT_NODE_DILOCO__ENABLED": "true",
        "INTELLECT_NODE_DILOCO__MEMBERS": "2",
        "INTELLECT_NODE_DILOCO__INNER_STEPS": str(H),
        "INTELLECT_NODE_TRAINER__STEPS": str(steps),
        "INTELLECT_NODE_TRAINER__EVAL_EVERY": "0",
    }


def grpo_run_env(*, batches_per_step: int) -> dict[str, str]:
    """The run the groups train on. Level-1 tasks, six a batch: the tiny base answers about
    half of them right, so nearly every group has mixed rewards (a GRPO signal); on levels
    2-3 a whole batch is often wrong and trains nothing."""
    return {
        "INTELLECT_NODE_RUN__ASYNC_LEVEL": "2",
        "INTELLECT_NODE_INFERENCE__MAX_UNJUDGED": "2",
        "INTELLECT_NODE_RUN__TASKSET": "arithmetic:1-1",
        "INTELLECT_NODE_RUN__TASKS_PER_BATCH": "6",
        "INTELLECT_NODE_RUN__GROUP_SIZE": "4",
        "INTELLECT_NODE_TRAINER__BATCHES_PER_STEP": str(batches_per_step),
        "INTELLECT_NODE_TRAINER__LEARNING_RATE": "0.001",
    }


@pytest.mark.timeout(1500)  # 11.5 minutes on a 2-core machine at load 40; a deadline only
@pytest.mark.slow
@pytest.mark.parametrize("quant", ["int8", "sparse"])  # sparse: the all-gather, error feedback
def test_two_trainers_train_as_one_group_on_disjoint_batches_and_only_the_leader_publishes(
    tmp_path, tiny_model_dir, quant
):
    import torch
    from safetensors.torch import load_file

    from node.diloco.sparse import Sparse
    from node.keystore import load_or_create_identity
    from tests.test_loop import Loop, submissions

    loop = Loop(tmp_path, tiny_model_dir, step_wait=20)
    member_id = load_or_create_identity(tmp_path / "trainer-1").peer_id
    group = group_env(member_id, steps=STEPS)  # the leader admits only this member
    group["INTELLECT_NODE_DILOCO__QUANT"] = quant
    try:
        loop.env.update(grpo_run_env(batches_per_step=2))
        leader = loop.spawn("trainer", "trainer", env=group)
        # the member shards its policy over two torchrun ranks (FSDP2 inside, DiLoCo across)
        member = loop.spawn(
            "trainer-1", "trainer", env={**group, "INTELLECT_NODE_TRAINER__PROCS": "2"}
        )
        loop.validator()
        loop.worker("honest-0")
        loop.worker("honest-1")
        for node in loop.nodes.values():
            wait_until(lambda n=node: n.status() is not None, 180, f"{node.name} up")

        def done():
            for node in loop.nodes.values():
                assert node.proc.poll() is None, f"{node.name} died: {node.log_path}"
            return all(
                (loop.section(n, "trainer") or {}).get("done") for n in (leader.name, member.name)
            ) and all(
                ((loop.nodes[n].status() or {}).get("weights") or {}).get("current", 0) >= STEPS
                for n in ("validator", "honest-0", "honest-1")
            )

        wait_until(done, 1000, f"{STEPS} outer steps and every worker on version {STEPS}")
        group_status = {n: loop.section(n, "diloco") for n in ("trainer", "trainer-1")}
        on_chain = loop.client().policy_version()
        subs = submissions(loop.client())
    finally:
        loop.close()

    ids = [load_or_create_identity(tmp_path / n).peer_id for n in ("trainer", "trainer-1")]
    a, b = lines_of(tmp_path, "trainer"), lines_of(tmp_path, "trainer-1")
    numel = sum(t.numel() for t in load_file(tiny_model_dir / "model.safetensors").values())
    assert [m["step"] for m in a] == [m["step"] for m in b] == list(range(STEPS + 1))
    for x, y in zip(a[1:], b[1:], strict=True):
        # after every outer step both hold bitwise-identical parameters (one process and
        # two ranks alike); both took part
        assert (x["train_ranks"], y["train_ranks"]) == (1, 2)
        assert x["diloco"]["params_hash"] == y["diloco"]["params_hash"], (x, y)
        assert (
            sorted(x["diloco"]["roster"]) == sorted(ids)
            and x["diloco"]["roster"] == y["diloco"]["roster"]
        )
        assert x["diloco"]["leader"] and not y["diloco"]["leader"]
        assert x["diloco"]["received_bytes"] > 0  # the ring moved bytes between them
        if quant == "sparse":  # one payload of the other member's whole vector
            assert x["diloco"]["received_bytes"] == Sparse().wire_size(numel)
    for before, after, other in zip(a[1:-1], a[2:], b[2:], strict=True):
        if after["tokens_trained"] + other["tokens_trained"] > 0:  # a step that trained moved
            assert after["diloco"]["params_hash"] != before["diloco"]["params_hash"]
    # disjoint shares: no batch twice, none by both, all of them accepted on-chain
    used_a = [k for m in a for k in m["used"]]
    used_b = [k for m in b for k in m["used"]]
    assert len(used_a) == len(set(used_a)) and len(used_b) == len(set(used_b))
    assert not set(used_a) & set(used_b)
    accepted = {f"{w}:{k.hex()}" for w, k in subs}
    assert set(used_a) | set(used_b) <= accepted
    assert used_a or used_b
    assert sum(m["tokens_trained"] for m in a + b) > 0
    # every member's share is what the hash split over the roster gives it
    for mine, me in ((used_a, ids[0]), (used_b, ids[1])):
        for k in mine:
            assert owner(bytes.fromhex(k.split(":")[1]), a[1]["diloco"]["roster"]) == me
    # only the leader published: the chain holds its versions, the member never published
    assert on_chain == STEPS
    leader_log, member_log = (tmp_path / n / "node.log" for n in ("trainer", "trainer-1"))
    for v in range(1, STEPS + 1):
        assert f"policy version {v} published" in leader_log.read_text()
    assert "published" not in member_log.read_text()
    assert group_status["trainer"]["leading"] and not group_status["trainer-1"]["leading"]
    # the published weights are the member's own checkpoint bit for bit, and not the base
    base = load_file(tiny_model_dir / "model.safetensors")
    pub = load_file(tmp_path / "trainer" / "checkpoints" / f"v{STEPS}" / "model.safetensors")
    own = load_file(tmp_path / "trainer-1" / "checkpoints" / f"v{STEPS}" / "model.safetensors")
    assert set(pub) == set(own) and all(torch.equal(pub[k], own[k]) for k in pub)
    assert max((pub[k].float() - base[k].float()).abs().max().item() for k in base) > 1e-4


@pytest.mark.timeout(2400)  # a deadline only: 12 minutes on a 2-core machine at load 20
@pytest.mark.slow
def test_a_trainer_started_later_joins_the_running_group_and_trains_its_share(
    tmp_path, tiny_model_dir
):
    """Two trainers train as a group; once it took an outer step a third trainer process
    starts knowing only the bootstrap node: it finds the leader in the DHT, recovers
    version s − 1's whole state over SHARDCAST (the leader's state hash, the leader's
    parameters in its model), is admitted at outer step s, holds the same parameters as
    the others after every step, and from version s on trains its own share: no batch is
    trained on twice or by two members."""
    from node.keystore import load_or_create_identity
    from tests.test_loop import Loop

    names = ("trainer", "trainer-1", "trainer-2")
    loop = Loop(tmp_path, tiny_model_dir, step_wait=20)
    ids = {n: load_or_create_identity(tmp_path / n).peer_id for n in names}
    group = group_env(ids["trainer-1"], ids["trainer-2"], steps=0)  # on until stopped
    try:
        loop.env.update(grpo_run_env(batches_per_step=3))
        loop.spawn("trainer", "trainer", env=group)
        loop.spawn("trainer-1", "trainer", env=group)
        loop.validator()
        loop.worker("honest-0")
        loop.worker("honest-1")

        def alive():
            for node in loop.nodes.values():
                assert node.proc.poll() is None, f"{node.name} died: {node.log_path}"

        def step_of(name):
            alive()
            return (loop.section(name, "trainer") or {}).get("step", 0)

        wait_until(lambda: step_of("trainer") >= 1, 900, "the group's first outer step")
        loop.spawn("trainer-2", "trainer", env=group)  # it knows only the bootstrap node

        def joined_and_two_more():
            alive()
            path = tmp_path / "trainer-2" / "metrics.jsonl"
            got = lines_of(tmp_path, "trainer-2") if path.exists() else []
            # the recovery, two outer steps, and one in which it trained on its own batches
            trained = [x["step"] for x in got[2:] if x["used"]]
            if len(got) < 3 or not trained:
                return False
            return min(lines_of(tmp_path, n)[-1]["step"] for n in names[:2]) >= trained[0]

        wait_until(joined_and_two_more, 1200, "the joiner's recovery and its own batches")
        # the members train on while the chain is read: their lines first, so that every
        # batch they name was submitted before the chain's events are read
        lines = {n: {x["step"]: x for x in lines_of(tmp_path, n)} for n in names}
        subs = {k: int(v) for k, v in submission_versions(loop.client()).items()}
    finally:
        loop.close()

    first = min(lines["trainer-2"])
    s = first + 1
    rec = lines["trainer-2"][first]["diloco"]["recovered"]
    lead = lines["trainer"]
    assert first >= 1 and rec["version"] == first and rec["from"] == ids["trainer"]
    assert rec["via"] == "shardcast" and rec["bytes"] > 0
    # its state is the leader's exactly (θ, momentum, AdamW, step), its model holds θ
    assert rec["donor_state_hash"] == rec["state_hash"] == lead[first]["diloco"]["state_hash"]
    assert rec["params_hash"] == lead[first]["diloco"]["params_hash"]
    common = set(lead) & set(lines["trainer-1"])
    joined = {k: v for k, v in lines["trainer-2"].items() if k > first and k in common}
    assert sorted(joined)[:2] == [s, s + 1]
    for k, mine in joined.items():  # admitted at step s; identical after every step
        assert sorted(mine["diloco"]["roster"]) == sorted(ids.values())
        for n in names:
            assert lines[n][k]["diloco"]["params_hash"] == mine["diloco"]["params_hash"], (n, k)
            assert lines[n][k]["diloco"]["roster"] == mine["diloco"]["roster"]
    for k in range(1, s):
        assert sorted(lead[k]["diloco"]["roster"]) == sorted([ids["trainer"], ids["trainer-1"]])
    assert joined[s]["used"] == []  # version s − 1's batches were split without it

    # disjoint shares: no batch twice, none by two members; each owned over the roster of
    # the version it was made with (from s on, the roster that admitted the joiner)
    roster_of = {k: lead[k]["diloco"]["roster"] for k in lead if k >= 1}
    used = {n: [k for x in lines[n].values() for k in x.get("used", [])] for n in names}
    everything = [k for n in names for k in used[n]]
    assert len(everything) == len(set(everything))
    for n in names:
        for text in used[n]:
            worker, key = text.split(":")
            version = subs[(worker.lower(), bytes.fromhex(key))]
            if version >= 1:
                assert owner(bytes.fromhex(key), roster_of[version]) == ids[n], (n, version)
    assert used["trainer-2"] and all(
        subs[(w.lower(), bytes.fromhex(k))] >= s
        for w, k in (t.split(":") for t in used["trainer-2"])
    )


def submission_versions(client):
    """(worker, key) -> the policy version of every WorkSubmitted event so far."""
    return {
        (str(e["args"]["worker"]).lower(), bytes(e["args"]["key"])): e["args"]["policy_version"]
        for e in client.contract.events.WorkSubmitted.get_logs(from_block=0)
    }


async def test_a_joiner_late_for_its_first_step_joins_again_and_a_member_late_stops(
    tmp_path, monkeypatch
):
    """The leader waits ``diloco_join_timeout`` for an announced joiner once its members are
    there: one that recovered for longer is refused ``late`` at its first outer step. It
    has taken nothing of its own yet (its first step trains on no batch), so it joins the
    group again, at the boundary the leader names now. A member of the roster refused
    ``late`` (it was evicted) still stops, and so does any other refusal."""
    from types import SimpleNamespace

    from crypto.identity import Identity
    from node.config import load_config
    from node.diloco.group import GroupError
    from node.net.metrics import Metrics
    from node.roles.io.joining import Joined
    from node.roles.services import grouptrainer

    me, leader = Identity.generate().peer_id, Identity.generate().peer_id
    node = SimpleNamespace(
        peer_id=me,
        cfg=SimpleNamespace(run=SimpleNamespace(id="r")),
        metrics=Metrics(),
        announce=print,
    )
    cfg = load_config(
        environ={
            "INTELLECT_NODE_RUN__MODEL": str(tmp_path),
            "INTELLECT_NODE_DATA_DIR": str(tmp_path),
        }
    ).changed({"run.trainer_peer_id": leader, "diloco.enabled": True})
    role = grouptrainer.GroupTrainerRole(node, cfg, weights=object())
    role.state.step = 4
    role.rosters.record(4, [leader, "b"])  # joined at version 4: its roster is not ours
    refusal, joins = ["late"], []

    async def refused(self):
        raise GroupError("the leader refused us: not_member: refused: x", refusal[0])

    async def join(group, policy):
        joins.append(role.step)
        return Joined(version=6, roster=[leader, "b"], record={"via": "shardcast"})

    monkeypatch.setattr(grouptrainer.TrainerRole, "_train_one", refused)
    monkeypatch.setattr(grouptrainer, "join", join)
    await role._train_one()
    assert joins == [4] and role.step == 6 and role.rosters.by_version[6] == [leader, "b"]
    refusal[0] = "stale"  # the group moved on to its next step meanwhile: the same
    await role._train_one()
    assert joins == [4, 6]
    refusal[0] = "excluded"  # any other refusal: the trainer stops, as before
    with pytest.raises(GroupError):
        await role._train_one()
    role.rosters.record(6, [leader, me, "b"])  # a member of the roster refused late
    refusal[0] = "late"
    with pytest.raises(GroupError):
        await role._train_one()
    assert joins == [4, 6]
