"""The substitution test (``crypto.substitution``, SPEC §11.2): a batch nearer a cheaper copy
of the policy (int8 weights) than the policy is rejected, whoever made it and whatever the
validator computes in; honest batches are not."""

import copy
import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from crypto.substitution import position_keys, sign_tail
from crypto.verdict import GPU_BF16, check_batch
from node.engine.calibration import (
    build_random_llama,
    claim_of,
    fixture_batches,
    model_layers,
    recompute_all,
)
from node.roles.children.checking import BatchChecker, CheckBatch, CheckerSpec
from node.rollouts.maker import BatchMaker, MakerSpec
from node.rollouts.recheck import judge_rollouts, with_substitution
from node.rollouts.suspects import SuspectModels
from protocol.rollouts import unpack_tokens as unpack
from tests.helpers.batches import made_by
from tests.helpers.cheating.maker import CheatingMaker

FIXTURE = Path(__file__).parent / "fixtures" / "gpu_rollouts_h200.json"
WORKER = "0x" + "6b" * 20
MAKER = MakerSpec(
    taskset="arithmetic:2-3",
    tasks_per_batch=4,
    group_size=4,
    max_new_tokens=48,
    temperature=1.0,
    engine_batch=16,
    verify_profile="gpu-bf16",
)
CHECKER = CheckerSpec(keep=2, taskset="arithmetic:2-3", verify_profile="gpu-bf16", spot_check=1.0)


def test_the_sign_tail_is_the_binomial_tail():
    for n in (1, 7, 30, 200):
        for k in range(n + 2):
            exact = sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n
            assert sign_tail(k, n) == pytest.approx(exact, rel=1e-9, abs=1e-300)
    assert sign_tail(0, 0) == 1.0 and sign_tail(1, 0) == 0.0


def test_a_position_is_keyed_by_the_tokens_up_to_it():
    a = position_keys([5, 6, 7], [8, 9, 10])
    b = position_keys([5, 6, 7], [8, 11, 12])
    c = position_keys([5, 6], [7, 8, 9])
    assert len(a) == 5  # prompt + tokens[:-1]: what the validator recomputes
    assert a[:4] == b[:4] and a[4] != b[4]  # same tokens fed, same computation
    assert a[:4] == c[:4]  # the prompt/output split does not matter, the tokens do


@pytest.fixture(scope="module")
def h200():
    doc = json.loads(FIXTURE.read_text())
    base = build_random_llama(doc["config"], doc["init_seed"], doc["lm_head_scale"])
    return doc, base


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_the_h200s_int8_batches_are_nearer_int8_and_its_honest_ones_are_not(h200, precision):
    """Rollouts an H200 generated in bf16 (the shared fixture), judged on this CPU in fp32
    (tested in fp32 and in bf16) or in bf16: every int8 batch is rejected by the test, no
    honest batch is."""
    doc, base = h200
    model = copy.deepcopy(base).to(getattr(torch, precision))
    suspects = SuspectModels(model)
    config = GPU_BF16.for_layers(model_layers(model))
    for name, rejected in (("honest_batch32", False), ("int8_weights_batch16", True)):
        variant = doc["variants"][name]
        for batch in fixture_batches(variant)[:1]:
            claims = [claim_of(r, variant) for r in batch]
            prompts = [r["prompt"] for r in batch]
            recomputed = recompute_all(model, prompts, [r["tokens"] for r in batch])
            verdict = check_batch(claims, recomputed, eos_token_id=2, config=config)
            tested = with_substitution(
                dataclasses.replace(verdict, passed=True, reason="ok"),
                suspects,
                prompts,
                claims,
                [a for a, _ in recomputed],
                config,
            )
            results = tested.substitution
            assert results and results[-1].rejected == rejected, (name, results)
            assert tested.passed != rejected
            if rejected:
                assert tested.reason.startswith("substitution: nearer int8")
                assert results[-1].nearer > 0.8 * results[-1].positions
            else:
                assert all(r.nearer < 0.5 * r.positions for r in results)


def make(maker, model_dir, cheat):
    _, batch, envelope = made_by(maker, model_dir, WORKER, cheat)
    return batch, envelope


def test_an_int8_worker_on_the_trained_policy_is_caught_only_by_the_substitution_test(
    base_model_dir,
):
    """The devnet's trained policy under gpu-bf16: its int8 batch passes every other check
    (its states and draws are within the profile's noise), and the batch checker rejects it
    as nearer int8; the honest batch of the same worker and step is accepted."""
    maker, checker = CheatingMaker(MAKER), BatchChecker(CHECKER)
    honest, honest_envelope = make(maker, base_model_dir, "none")
    cheat, cheat_envelope = make(maker, base_model_dir, "int8_weights")
    assert [s.tokens for g in cheat.groups for s in g.samples] != [
        s.tokens for g in honest.groups for s in g.samples
    ] or cheat.groups[0].samples[0].proofs != honest.groups[0].samples[0].proofs

    accepted = checker(CheckBatch(str(base_model_dir), 0, honest_envelope))
    assert accepted.accepted, accepted.detail
    assert "nearer int8 (float32) than the policy" in accepted.detail

    rejected = checker(CheckBatch(str(base_model_dir), 0, cheat_envelope))
    assert not rejected.accepted and rejected.reason == "invalid"
    assert rejected.detail.startswith("substitution: nearer int8 (float32)"), rejected.detail

    # without the test, nothing else sees it
    samples = [(g, s) for g in cheat.groups for s in g.samples]
    eos = int(checker.tokenizer.eos_token_id)
    assert judge_rollouts(checker.model, eos, cheat, samples, checker.config).passed


def test_a_worker_that_prefills_with_the_policy_and_decodes_with_int8_is_caught(
    base_model_dir,
):
    """The prompt is one cheap prefill a cheater can afford with the policy; only its
    decoding (what int8 saves) runs the copy. Counting the prompt's positions diluted the
    evidence below the rejection rate; output positions alone carry it."""
    from crypto.toploc import build_proofs
    from crypto.verdict import RolloutClaim
    from node.engine.torch_engine import recompute_batch

    maker, checker = BatchMaker(MAKER), BatchChecker(CHECKER)
    honest, _ = make(maker, base_model_dir, "none")
    checker._use(str(base_model_dir), 0)
    policy, config = checker.model, checker.config
    cheap = checker.suspects.suspect(policy.dtype, "int8")
    prompts, claims = [], []
    with torch.no_grad():
        for group in honest.groups:
            prompt = list(unpack(group.prompt))
            for sample in group.samples:
                tokens = list(unpack(sample.tokens))
                out = policy.base_model(input_ids=torch.tensor([prompt]), use_cache=True)
                acts = [out[0][0].float()]
                if len(tokens) > 1:
                    fed = torch.tensor([tokens[:-1]])
                    acts.append(cheap.base_model(input_ids=fed, cache=out.past_key_values)[0][0])
                proofs = build_proofs(acts, chunk_size=config.chunk_size, topk=config.topk)
                prompts.append(prompt)
                claims.append(
                    RolloutClaim(tokens, proofs, sample.seed, sample.finish_reason, 48, 1.0)
                )
    recomputed = recompute_batch(policy, prompts, [c.tokens for c in claims])
    eos = int(checker.tokenizer.eos_token_id)
    verdict = check_batch(claims, recomputed, eos_token_id=eos, config=config)
    assert verdict.passed, verdict.reason  # nothing else sees it
    tested = with_substitution(
        verdict, checker.suspects, prompts, claims, [a for a, _ in recomputed], config
    )
    assert not tested.passed and tested.reason.startswith("substitution: nearer int8"), (
        tested.substitution
    )


def test_the_checker_keeps_a_version_older_than_those_it_holds(tiny_model_dir):
    checker = BatchChecker(dataclasses.replace(CHECKER, keep=2))
    for version in (5, 6, 3):
        checker._use(str(tiny_model_dir), version)
        assert checker.model is checker.models[version][1]
    assert sorted(checker.models) == [3, 6]


def test_the_checker_keeps_the_copies_of_the_version_in_use_only(tiny_model_dir):
    """A CPU validator's copies (int8 in fp32, bf16 and int8 in bf16) are about 3x the
    model: they are kept for one version, not for every version the checker holds."""
    import gc
    import weakref

    checker = BatchChecker(dataclasses.replace(CHECKER, keep=3))
    checker._use(str(tiny_model_dir), 1)
    first = checker.suspects
    copy_of_1 = weakref.ref(first.suspect(torch.bfloat16, "int8"))
    checker._use(str(tiny_model_dir), 1)
    assert checker.suspects is first  # the same version: nothing rebuilt
    checker._use(str(tiny_model_dir), 2)
    assert checker.suspects is not first and checker.suspects.model is checker.model
    del first
    gc.collect()
    assert copy_of_1() is None and 1 in checker.models  # the model is kept, its copies not
