"""The worker's batch maker and the validator's batch checker, in this process (what the
roles run in their child processes): honest batches pass; each cheat is caught, and why."""

import pytest

from crypto.identity import Identity
from node.roles.inference import BatchMaker
from node.roles.validator import BatchChecker
from protocol.rollouts import RolloutBatch
from protocol.wire import seal

WORKER = "0x" + "5a" * 20


@pytest.fixture(scope="module")
def checker(tiny_model_dir):
    return Checker(tiny_model_dir, 1.0)


class Checker:
    """The validator's checker on version 0 (the model directory given)."""

    def __init__(self, model_dir, spot_check):
        self.model_dir = str(model_dir)
        self.inner = BatchChecker(2, "arithmetic", "strict-fp32", spot_check)

    def __call__(self, envelope):
        return self.inner(self.model_dir, 0, envelope)


def make(model_dir, cheat, step=3):
    identity = Identity.generate()
    maker = BatchMaker("arithmetic", 2, 2, 24, 1.0, 8, cheat)
    header = dict(run_id="test-run", sender=identity.peer_id, seq=1, ts_ms=1_700_000_000_000)
    batch = RolloutBatch.decode(maker(str(model_dir), WORKER, step, 0, header))
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
    passed, reason, detail, rollouts, _ = checker(make(tiny_model_dir, cheat))
    assert passed is (cheat == "none"), detail
    assert evidence in detail, detail
    if cheat != "inflate_reward":  # the reward check comes before any recomputation
        assert rollouts == 4


def test_spot_checks_recompute_a_share(tiny_model_dir):
    half = Checker(tiny_model_dir, 0.5)
    passed, _, _, rollouts, _ = half(make(tiny_model_dir, "none"))
    assert passed and rollouts == 2


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
    maker = BatchMaker("arithmetic", 2, 2, 24, 1.0, 8, "none")
    header = dict(run_id="test-run", sender=identity.peer_id, seq=1, ts_ms=1_700_000_000_000)
    envelope = seal(identity, RolloutBatch.decode(maker(str(v1), WORKER, 3, 1, header)))
    checker = BatchChecker(2, "arithmetic", "strict-fp32", 1.0)
    passed, _, detail, _, _ = checker(str(v1), 1, envelope)
    assert passed, detail
    passed, _, detail, _, _ = checker(str(tiny_model_dir), 0, envelope)
    assert not passed and "toploc" in detail, detail
    assert sorted(checker.models) == [0, 1]  # both versions stay loaded (keep = 2)
