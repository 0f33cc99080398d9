"""The worker's batch maker and the validator's batch checker, in this process (what the
roles run in their child processes): honest batches pass; each cheat is caught, and why."""

import dataclasses

import pytest

from crypto.identity import Identity
from node.roles.checking import BatchChecker, CheckBatch, CheckerSpec
from node.rollouts.maker import BatchMaker, MakeBatch, MakerSpec
from protocol.rollouts import RolloutBatch
from protocol.wire import seal

WORKER = "0x" + "5a" * 20
MAKER = MakerSpec(
    taskset="arithmetic",
    tasks_per_batch=2,
    group_size=2,
    max_new_tokens=24,
    temperature=1.0,
    engine_batch=8,
)
CHECKER = CheckerSpec(keep=2, taskset="arithmetic", verify_profile="strict-fp32", spot_check=1.0)


@pytest.fixture(scope="module")
def checker(tiny_model_dir):
    return Checker(tiny_model_dir, 1.0)


class Checker:
    """The validator's checker on version 0 (the model directory given)."""

    def __init__(self, model_dir, spot_check):
        self.model_dir = str(model_dir)
        self.inner = BatchChecker(dataclasses.replace(CHECKER, spot_check=spot_check))

    def __call__(self, envelope):
        return self.inner(CheckBatch(self.model_dir, 0, envelope))


def make(model_dir, cheat, step=3):
    identity = Identity.generate()
    maker = BatchMaker(MAKER)
    header = dict(run_id="test-run", sender=identity.peer_id, seq=1, ts_ms=1_700_000_000_000)
    call = MakeBatch(str(model_dir), WORKER, step, 0, header, cheat=cheat)
    batch = RolloutBatch.decode(maker(call).encoded)
    assert batch.worker == WORKER and batch.step == step and len(batch.groups) == 2
    return seal(identity, batch)


@pytest.mark.parametrize(
    ("cheat", "evidence"),
    [
        ("none", "ok"),
        ("other_weights", "toploc"),
        ("edit_token", "not drawn by the seeded sampler"),
        ("inflate_reward", "reward"),
    ],
)
def test_honest_batches_pass_and_each_cheat_is_caught(tiny_model_dir, checker, cheat, evidence):
    verdict = checker(make(tiny_model_dir, cheat))
    assert verdict.accepted is (cheat == "none"), verdict.detail
    assert verdict.reason == ("accepted" if cheat == "none" else "invalid")
    assert evidence in verdict.detail, verdict.detail
    if cheat != "inflate_reward":  # the reward check comes before any recomputation
        assert verdict.rollouts == 4


def test_spot_checks_recompute_a_share(tiny_model_dir):
    half = Checker(tiny_model_dir, 0.5)
    verdict = half(make(tiny_model_dir, "none"))
    assert verdict.accepted and verdict.rollouts == 2


def test_a_batch_is_judged_with_the_weights_of_its_own_policy_version(tiny_model_dir, tmp_path):
    """A worker on version 1 and a validator that loads version 1 agree; judged with the
    base weights instead, the same honest batch fails: the version's weights matter."""
    import shutil

    import torch

    from node.engine.models import load_model

    v1 = tmp_path / "v1"
    shutil.copytree(tiny_model_dir, v1)
    loaded = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in loaded.model.parameters():  # one "training step": a small change everywhere
            p.add_(torch.randn(p.shape, generator=g) * 0.05 * p.float().std().clamp_min(1e-3))
    loaded.model.save_pretrained(v1, safe_serialization=True)

    identity = Identity.generate()
    maker = BatchMaker(MAKER)
    header = dict(run_id="test-run", sender=identity.peer_id, seq=1, ts_ms=1_700_000_000_000)
    made = maker(MakeBatch(str(v1), WORKER, 3, 1, header))
    envelope = seal(identity, RolloutBatch.decode(made.encoded))
    checker = BatchChecker(CHECKER)
    verdict = checker(CheckBatch(str(v1), 1, envelope))
    assert verdict.accepted, verdict.detail
    verdict = checker(CheckBatch(str(tiny_model_dir), 0, envelope))
    assert not verdict.accepted and "toploc" in verdict.detail, verdict.detail
    assert sorted(checker.models) == [0, 1]  # both versions stay loaded (keep = 2)
