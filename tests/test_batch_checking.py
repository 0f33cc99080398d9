"""The worker's batch maker and the validator's batch checker, in this process (what the
roles run in their child processes): honest batches pass; each cheat is caught, and why."""

import dataclasses
import re

import pytest

from crypto.identity import Identity
from node.roles.children.checking import BatchChecker, CheckBatch, CheckerSpec
from node.rollouts.maker import BatchMaker, MakerSpec
from protocol.rollouts import RolloutBatch
from protocol.wire import seal
from tests.helpers.batches import made_by
from tests.helpers.cheating.maker import CheatingMaker

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
    maker = BatchMaker(MAKER) if cheat == "none" else CheatingMaker(MAKER)
    made, batch, envelope = made_by(maker, model_dir, WORKER, cheat, step=step)
    assert made.seconds > 0  # generating it: the status's generation_s adds these up
    assert batch.worker == WORKER and batch.step == step and len(batch.groups) == 2
    return envelope


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
    if cheat == "none":  # how close an accepted batch came to the bound, in its detail
        assert re.search(r"sampling statistic \d+\.\d, bound \d+\.\d", verdict.detail)
    assert verdict.rollouts == 4  # the reward check comes after the proofs'


def resealed(envelope, edit):
    """The batch in ``envelope`` changed by ``edit`` and signed again (its own worker)."""
    from protocol.wire import open_message

    identity = Identity.generate()
    batch = edit(open_message(envelope, RolloutBatch))
    return seal(identity, dataclasses.replace(batch, sender=identity.peer_id))


def test_a_token_outside_the_vocabulary_is_invalid_not_an_error(tiny_model_dir, checker):
    """The tokenizer raised on an id past its vocabulary: the check failed, the batch was
    given up unjudged after three tries, and its worker was never slashed."""
    from protocol.rollouts import pack_tokens, unpack_tokens

    def out_of_vocabulary(batch):
        g = batch.groups[0]
        s = g.samples[0]
        ids = unpack_tokens(s.tokens)
        bad = dataclasses.replace(s, tokens=pack_tokens([*ids[:-1], 2**32 - 1]))
        group = dataclasses.replace(g, samples=[bad, *g.samples[1:]])
        return dataclasses.replace(batch, groups=[group, *batch.groups[1:]])

    verdict = checker(resealed(make(tiny_model_dir, "none"), out_of_vocabulary))
    assert not verdict.accepted and verdict.reason == "invalid", verdict
    assert "token 4294967295 is not in the vocabulary" in verdict.detail
    assert verdict.rollouts == 0  # refused before any prefill


def test_rewards_are_verified_only_for_rollouts_whose_proofs_hold(
    tiny_model_dir, checker, monkeypatch
):
    """A verifier can be made slow (math-verify: 5 s per answer built to time out): a fake
    batch full of such answers held the validator a minute before its proofs failed it.
    The rewards of a batch whose proofs fail are never verified."""
    from node.tasks.task import Task

    calls = []
    reward = Task.reward

    def counted(self, text):
        calls.append(text)
        return reward(self, text)

    cheat, honest = make(tiny_model_dir, "other_weights"), make(tiny_model_dir, "none")
    monkeypatch.setattr(Task, "reward", counted)
    verdict = checker(cheat)
    assert not verdict.accepted and "toploc" in verdict.detail and calls == []
    assert checker(honest).accepted
    assert len(calls) == 4  # every sample's reward, once its proofs held


def test_a_run_below_top_p_one_samples_and_checks_with_its_own_top_p(tiny_model_dir):
    """The run's ``top_p`` reaches the worker's sampler and the validator's expectation:
    a batch sampled at top-p 0.9 is accepted by a checker of that run and invalid for a
    run at top-p 1 (and the reverse)."""
    from node.config import NodeConfig

    cfg = NodeConfig(run={"top_p": 0.9, "temperature": 0.8, "taskset": "arithmetic"})
    assert MakerSpec.of(cfg).top_p == 0.9 and CheckerSpec.of(cfg).top_p == 0.9
    spec = dataclasses.replace(MAKER, temperature=0.8, top_p=0.9)
    _, batch, envelope = made_by(BatchMaker(spec), tiny_model_dir, WORKER)
    assert (batch.temperature, batch.top_p) == (0.8, 0.9)
    run = dataclasses.replace(CHECKER, temperature=0.8, top_p=0.9)
    own = BatchChecker(run)(CheckBatch(str(tiny_model_dir), 0, envelope))
    assert own.accepted, own.detail
    other = BatchChecker(dataclasses.replace(run, top_p=1.0))(
        CheckBatch(str(tiny_model_dir), 0, envelope)
    )
    assert not other.accepted and other.reason == "invalid"
    assert "top-p 0.9" in other.detail, other.detail


def test_validators_checking_a_share_agree_on_a_batch_with_one_faked_rollout(tiny_model_dir):
    """With ``spot_check`` 0.5 two validators (two checkers) judge a batch with one edited
    rollout of four: for each submission's seed they both accept or both reject (drawn
    alike: SPEC §18), and over seeds both happen (the draw follows the seed)."""
    from node.roles.decisions.spotcheck import spot_check_seed

    first = BatchChecker(dataclasses.replace(CHECKER, spot_check=0.5))
    second = BatchChecker(dataclasses.replace(CHECKER, spot_check=0.5))
    envelope = make(tiny_model_dir, "edit_token")
    outcomes = set()
    for block in range(6):
        seed = spot_check_seed(b"k" * 32, bytes([block]) * 32)
        a = first(CheckBatch(str(tiny_model_dir), 0, envelope, seed))
        b = second(CheckBatch(str(tiny_model_dir), 0, envelope, seed))
        assert (a.accepted, a.rollouts) == (b.accepted, b.rollouts) == (a.accepted, 2)
        outcomes.add(a.accepted)
    assert outcomes == {True, False}
