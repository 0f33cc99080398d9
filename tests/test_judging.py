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
    return BatchChecker(str(tiny_model_dir), "arithmetic", "strict-fp32", 1.0)


def make(model_dir, cheat, step=3):
    identity = Identity.generate()
    maker = BatchMaker(str(model_dir), "arithmetic", 2, 2, 24, 1.0, 8, cheat)
    header = dict(run_id="test-run", sender=identity.peer_id, seq=1, ts_ms=1_700_000_000_000)
    batch = RolloutBatch.decode(maker(WORKER, step, 0, header))
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
    half = BatchChecker(str(tiny_model_dir), "arithmetic", "strict-fp32", 0.5)
    passed, _, _, rollouts, _ = half(make(tiny_model_dir, "none"))
    assert passed and rollouts == 2
