"""The cheating matrix, one cheat at a time, in this process: the cheating worker's batch
maker (``tests/helpers/cheating/maker.py``) makes each cheat with the real engine and tiny
model (what its child process runs), the validator's checks judge it (the batch checker, what its child runs; the role's own
checks for what the role claims), and every cheat is rejected with the reason SPEC §19.1
gives while the honest batch of the same worker and step passes. ``test_matrix.py`` runs
the same cheats through real processes and the chain."""

import dataclasses
import shutil

import pytest

from crypto.identity import Identity
from node.roles.children.checking import BatchChecker, CheckBatch, CheckerSpec
from node.rollouts.maker import BatchMaker, MakeBatch, MakerSpec
from node.rollouts.store import BatchStore
from protocol.rollouts import RolloutBatch
from protocol.wire import seal
from tests.helpers.batches import made_by
from tests.helpers.cheating.catalogue import (
    CATALOGUE,
    CHEATS,
    SPLITS,
    UNPUNISHED,
    parse_cheats,
    pick,
)
from tests.helpers.cheating.maker import CheatingBatch, CheatingMaker
from tests.helpers.cheating.role import DETECTABLE_APART, MAKER_CHEATS, CheatPlan, ServedStore

WORKER = "0x" + "5a" * 20
MAKER = MakerSpec(
    taskset="arithmetic:1-5",
    tasks_per_batch=2,
    group_size=2,
    max_new_tokens=24,
    temperature=1.0,
    engine_batch=8,
    verify_profile="strict-fp32",
)
CHECKER = CheckerSpec(
    keep=3, taskset="arithmetic:1-5", verify_profile="strict-fp32", spot_check=1.0
)
HEADER = dict(run_id="test-run", seq=1, ts_ms=1_700_000_000_000)

# what catches each cheat the batch maker makes (a phrase of the checker's detail)
EVIDENCE = {
    "other_weights": "toploc",
    "int8_weights": "toploc",
    "fewer_layers": "toploc",
    "foreign_proofs": "toploc",
    "edit_token": "not drawn by the seeded sampler",
    "greedy": "not drawn by the seeded sampler",
    "other_temperature": "sampled at temperature 0.5",
    "early_stop": "toploc",
    "truncated": "implausible ending",
    "inflate_reward": "reward",
    "easy_tasks": "not the assigned task",
    "replay_step": "not the assigned task",
    "replay_other": "not the assigned task",
}


@pytest.fixture(scope="module")
def maker():
    return CheatingMaker(MAKER)


@pytest.fixture(scope="module")
def checker():
    return BatchChecker(CHECKER)


@pytest.fixture(scope="module")
def version_1(tiny_model_dir, tmp_path_factory):
    """Version 1 of the policy: the base weights after a small change everywhere (what a
    training step does)."""
    import torch

    from node.engine.models import load_model

    v1 = tmp_path_factory.mktemp("v1") / "model"
    shutil.copytree(tiny_model_dir, v1)
    loaded = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in loaded.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05 * p.float().std().clamp_min(1e-3))
    loaded.model.save_pretrained(v1, safe_serialization=True)
    return v1


def make(maker, model_dir, cheat, *, version=0, step=3):
    _, batch, envelope = made_by(maker, model_dir, WORKER, cheat, version=version, step=step)
    assert batch.worker == WORKER and batch.step == step and batch.policy_version == version
    return batch, envelope


def test_the_catalogue_names_every_cheat_the_setting_takes():
    assert tuple(CATALOGUE) + tuple(UNPUNISHED) + tuple(SPLITS) == CHEATS
    assert len(CHEATS) >= 12
    assert MAKER_CHEATS <= set(CHEATS) and set(EVIDENCE) == MAKER_CHEATS
    assert {c.reason for c in CATALOGUE.values()} == {"invalid", "mismatch", "unavailable"}


def test_the_setting_takes_names_comma_separated():
    assert parse_cheats("none") == () and parse_cheats("greedy, truncated") == (
        "greedy",
        "truncated",
    )
    with pytest.raises(ValueError, match="unknown cheat"):
        parse_cheats("greedy,teleport")
    with pytest.raises(ValueError, match="give it alone"):
        parse_cheats("other_key,greedy")
    assert [pick(("a", "b"), n) for n in range(4)] == ["a", "b", "a", "b"]
    assert pick((), 5) == "none"


def test_the_honest_batch_passes(maker, checker, tiny_model_dir):
    _, envelope = make(maker, tiny_model_dir, "none")
    verdict = checker(CheckBatch(str(tiny_model_dir), 0, envelope))
    assert verdict.accepted and verdict.rollouts == 4, verdict.detail


@pytest.mark.parametrize("cheat", sorted(EVIDENCE))
def test_each_cheat_the_maker_makes_is_rejected_for_its_reason(
    maker, checker, tiny_model_dir, cheat
):
    honest, _ = make(maker, tiny_model_dir, "none")
    batch, envelope = make(maker, tiny_model_dir, cheat)
    assert batch.work_key() != honest.work_key()  # the cheat changed the batch
    verdict = checker(CheckBatch(str(tiny_model_dir), 0, envelope))
    assert not verdict.accepted and verdict.reason == CATALOGUE[cheat].reason == "invalid"
    assert EVIDENCE[cheat] in verdict.detail, verdict.detail


@pytest.mark.parametrize("cheat", ["stale_weights", "older_version"])
def test_older_weights_claimed_as_a_newer_version_are_rejected(
    maker, checker, tiny_model_dir, version_1, cheat
):
    """The role generates with an older version's weights (here the base model, version 0)
    and claims version 1; the validator judges with version 1's weights. The honest batch
    of version 1 passes."""
    used = CheatPlan.generation_version(cheat, 1, [0, 1], oldest=0)
    assert used == 0
    _, honest = make(maker, version_1, "none", version=1)
    assert checker(CheckBatch(str(version_1), 1, honest)).accepted
    _, envelope = make(maker, tiny_model_dir, "none", version=1)  # v0 weights, claims v1
    verdict = checker(CheckBatch(str(version_1), 1, envelope))
    assert not verdict.accepted and verdict.reason == CATALOGUE[cheat].reason
    assert "toploc" in verdict.detail, verdict.detail


def test_the_role_picks_the_weights_the_version_cheats_use():
    held = [0, 3, 4, 5]
    assert CheatPlan.generation_version("stale_weights", 5, held, oldest=3) == 0
    assert CheatPlan.generation_version("older_version", 5, held, oldest=3) == 3
    assert CheatPlan.generation_version("older_version", 5, held, oldest=4) == 4
    assert CheatPlan.generation_version("older_version", 3, held, oldest=3) == 3  # none older
    assert CheatPlan.generation_version("stale_weights", 0, [0], oldest=0) == 0  # cannot cheat
    assert CheatPlan.generation_version("greedy", 5, held, oldest=3) == 5


def test_the_role_claims_and_serves_what_its_cheats_say(tmp_path):
    plan = CheatPlan.of("inflate_units,key_mismatch,withhold")
    made = []
    for n in range(4):
        made.append(plan.next())
        plan.submitted(made[-1], bytes([n]) * 32)
    assert made == ["inflate_units", "key_mismatch", "withhold", "inflate_units"]
    versions = CheatPlan.of("older_version,greedy")
    assert versions.next() == "older_version"  # no older version held yet: made honest
    assert versions.next() == "older_version"  # so it comes again
    versions.submitted("older_version", bytes(32))
    assert versions.next() == "greedy"
    key = bytes(range(32))
    plan = CheatPlan.of("inflate_units,key_mismatch,withhold")
    assert CheatPlan.claim("inflate_units", key, 40) == (key, 80)
    assert CheatPlan.claim("none", key, 40) == (key, 40)
    forged, units = CheatPlan.claim("key_mismatch", key, 40)
    assert forged != key and len(forged) == 32 and units == 40
    served = ServedStore(BatchStore(tmp_path))
    plan.serve(served, "key_mismatch", forged, b"envelope")
    plan.serve(served, "withhold", key, b"other")
    assert served.get(forged) == b"envelope" and served.get(key) is None
    own = object()
    assert CheatPlan.of("none").registered_identity(own) is own
    assert CheatPlan.of("other_key").registered_identity(own) is not own
    assert not CheatPlan.of("none") and CheatPlan.of("greedy")
    assert CheatPlan.for_maker("inflate_units") == "none"
    assert CheatPlan.for_maker("greedy") == "greedy"


def test_a_run_at_another_temperature_accepts_its_own_batches(tiny_model_dir):
    """The temperature check compares with the run's setting, not a constant."""
    hot = BatchMaker(dataclasses.replace(MAKER, temperature=1.5))
    _, envelope = make(hot, tiny_model_dir, "none")
    judge = BatchChecker(dataclasses.replace(CHECKER, temperature=1.5))
    assert judge(CheckBatch(str(tiny_model_dir), 0, envelope)).accepted
    assert not BatchChecker(CHECKER)(CheckBatch(str(tiny_model_dir), 0, envelope)).accepted


def test_a_greedy_batch_no_check_can_tell_from_sampling_is_not_made_and_comes_again(
    maker, checker, tiny_model_dir
):
    """Greedy decoding that no check can tell from the seeded draws (a policy so peaked
    that they differ only at near-ties within the noise, or nowhere: the matrix saw such
    batches accepted once the policy had learned level 1) is undetectable by design: the
    maker checks it as the run's validators would, sends the honest batch instead and
    says so, and the worker counts no cheat made."""
    cold = dataclasses.replace(MAKER, temperature=1e-4)
    identity = Identity.generate()
    call = MakeBatch(str(tiny_model_dir), WORKER, 3, 0, {**HEADER, "sender": identity.peer_id})
    greedy = CheatingBatch(*dataclasses.astuple(call), cheat="greedy")
    cheated = CheatingMaker(cold)(greedy)
    assert cheated.unchanged
    assert cheated.encoded == BatchMaker(cold)(call).encoded  # byte for byte the honest one
    judge = BatchChecker(dataclasses.replace(CHECKER, temperature=1e-4))
    assert judge(
        CheckBatch(str(tiny_model_dir), 0, seal(identity, RolloutBatch.decode(cheated.encoded)))
    ).accepted
    warm = maker(greedy)
    assert not warm.unchanged and not maker(call).unchanged


def moved(base, delta: float, out):
    """``base``'s weights with every one moved by ±``delta`` (as one AdamW step of learning
    rate ``delta`` moves them), saved to ``out``."""
    import torch

    from node.engine.models import load_model

    shutil.copytree(base, out)
    loaded = load_model(str(base), dtype="float32", device="cpu")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in loaded.model.parameters():
            p.add_(delta * torch.sign(torch.randn(p.shape, generator=g)))
    loaded.model.save_pretrained(out, safe_serialization=True)
    return out


def test_a_version_cheat_is_made_only_beyond_the_bound_of_what_verification_can_tell(
    tiny_model_dir, version_1, tmp_path
):
    """A training step that changed nothing (all rewards equal: no gradient) publishes the
    same weights again (0 apart), and one step at the devnet's learning rate moves them less
    than the bound where verification surely tells them apart (DETECTABLE_APART, SPEC §19.1):
    generating with the older copy is then no cheat the matrix may count."""
    from node.training.grpo import GRPOConfig
    from node.training.policy import Policy

    copy = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, copy)
    assert CheatPlan.apart(str(tiny_model_dir), str(copy)) == 0.0
    assert CheatPlan.apart(str(tiny_model_dir), str(version_1)) > DETECTABLE_APART
    # published the trainer's way (no step taken): other bytes (the tied lm_head is left
    # out of the file), the same weights. A byte comparison called this a cheat, and the
    # matrix then counted a batch honestly accepted as a stale_weights cheat undetected.
    published = Policy(tiny_model_dir, GRPOConfig()).save(tmp_path / "v5")
    assert published is not None
    assert (published / "model.safetensors").read_bytes() != (
        tiny_model_dir / "model.safetensors"
    ).read_bytes()
    assert CheatPlan.apart(str(tiny_model_dir), str(published)) == 0.0
    assert CheatPlan.apart(str(version_1), str(published)) > DETECTABLE_APART
    one_step = moved(tiny_model_dir, GRPOConfig().lr, tmp_path / "one-step")  # the devnet's lr
    assert 0 < CheatPlan.apart(str(one_step), str(tiny_model_dir)) < DETECTABLE_APART


def test_weights_at_the_bound_are_told_apart(maker, checker, tiny_model_dir, tmp_path):
    """The bound is where verification tells versions apart (measured: every weight ±3e-4,
    7.6e-3 apart, was rejected in 6 of 6 batches; ±1e-4, 2.5e-3 apart, in 2 of 3): batches
    generated with weights exactly ``DETECTABLE_APART`` away, claimed as the base, are all
    rejected. (A bound set lower than verification can tell fails here.)"""
    unit = CheatPlan.apart(str(moved(tiny_model_dir, 1e-4, tmp_path / "unit")), str(tiny_model_dir))
    at_bound = moved(tiny_model_dir, 1e-4 * DETECTABLE_APART / unit, tmp_path / "at-bound")
    assert CheatPlan.apart(str(at_bound), str(tiny_model_dir)) == pytest.approx(
        DETECTABLE_APART, rel=1e-3
    )
    for step in (3, 4, 5):
        _, envelope = make(maker, at_bound, "none", version=0, step=step)
        verdict = checker(CheckBatch(str(tiny_model_dir), 0, envelope))
        assert not verdict.accepted and "toploc" in verdict.detail, (step, verdict.detail)


class _Held:
    """A store that holds every key (``ServedStore`` only reads it)."""

    def get(self, work_key: bytes) -> bytes:
        return b"body:" + work_key


def test_serve_some_serves_the_trainer_and_the_first_other_asker_only():
    served = ServedStore(_Held(), trainer="trainer")
    plan = CheatPlan.of("serve_some")
    key, other = bytes(32), bytes([1]) * 32
    plan.serve(served, plan.next(), key, b"unused")
    plan.submitted("serve_some", key)
    assert served.get(key, "validator-a") == b"body:" + key  # the first other asker
    assert served.get(key, "validator-b") is None  # anyone else: not found
    assert served.get(key, "validator-a") == b"body:" + key  # the first one again
    assert served.get(key, "trainer") == b"body:" + key  # the trainer, always
    assert served.get(other, "validator-b") == b"body:" + other  # an honest batch: everyone
    assert served.refused == 1 and plan.by_key == {key.hex(): "serve_some"}


def test_a_split_serves_one_validator_first_and_everyone_once_it_says_so():
    """``rotate_split``: nobody but the trainer while the key is rotated (``hold``), then
    the first validator that asks and only it (``one``), then everyone (``all``); made once,
    later batches are honest. ``ahead_split``: the next step's batch, served to the first
    that asks from the start."""
    served = ServedStore(_Held(), trainer="trainer")
    plan = CheatPlan.of("rotate_split")
    key = bytes(32)
    body = b"body:" + key
    plan.serve(served, plan.next(), key, b"unused")
    plan.submitted("rotate_split", key)
    assert served.get(key, "validator-a") is None  # held
    assert served.get(key, "trainer") == body
    served.splits[key].phase = "one"
    assert served.get(key, "validator-b") == body  # the first to ask now
    assert served.get(key, "validator-a") is None
    assert served.get(key, "validator-b") == body
    served.splits[key].phase = "all"
    assert served.get(key, "validator-a") == body and served.get(key, "validator-c") == body
    assert served.refused == 2
    assert served.splits[key].record() == {
        "phase": "all",
        "first": "validator-b",
        "done": ["served the first"],
    }
    assert plan.next() == "none" and plan.by_key == {key.hex(): "rotate_split"}  # made once
    ahead = CheatPlan.of("ahead_split")
    cheat = ahead.next()
    assert CheatPlan.batch_step(cheat, 4) == 5 and CheatPlan.batch_step("none", 4) == 4
    other = bytes([2]) * 32
    ahead.serve(served, cheat, other, b"unused")
    assert served.get(other, "validator-c") == b"body:" + other  # the first, at once
    assert served.get(other, "validator-a") is None


def test_a_proof_swap_that_moves_nothing_is_not_made_and_comes_again(tmp_path, tiny_model_dir):
    """Two groups of one batch on the same problem, decoded the same way (a peaked policy:
    here one problem and a near-zero temperature): swapping their proofs changes nothing,
    so the batch is the honest one byte for byte and the worker counts no cheat made (the
    matrix once counted such a batch as a foreign-proofs cheat that went undetected). With
    two problems the swap is made and every rollout carries another's proofs."""
    one = tmp_path / "one.jsonl"
    one.write_text('{"problem": "What is 2+3?", "answer": "5"}\n')
    cold = dataclasses.replace(MAKER, temperature=1e-4, taskset=str(one))
    identity = Identity.generate()
    call = MakeBatch(str(tiny_model_dir), WORKER, 3, 0, {**HEADER, "sender": identity.peer_id})
    swap = CheatingBatch(*dataclasses.astuple(call), cheat="foreign_proofs")
    cheated = CheatingMaker(cold)(swap)
    assert cheated.unchanged
    assert cheated.encoded == BatchMaker(cold)(call).encoded

    warm = CheatingMaker(MAKER)(swap)
    honest = RolloutBatch.decode(BatchMaker(MAKER)(call).encoded)
    forged = RolloutBatch.decode(warm.encoded)
    assert not warm.unchanged
    pairs = [
        (h, f)
        for hg, fg in zip(honest.groups, forged.groups, strict=True)
        for h, f in zip(hg.samples, fg.samples, strict=True)
    ]
    assert all(h.tokens == f.tokens and h.proofs != f.proofs for h, f in pairs)
