"""The substitution test (``crypto.substitution``, SPEC §18.2): a batch nearer a cheaper copy
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


def test_no_position_nearer_the_suspect_is_a_p_value_of_exactly_one():
    """k = 0: certain, not a sum of terms that rounds to just below 1."""
    assert [sign_tail(0, n) for n in (2, 4, 8, 9, 10, 100, 1000)] == [1.0] * 7


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


# ---- the rule and its budget, on chosen distances ------------------------------------------


def judged_on(monkeypatch, diffs_of, prompts, claims, alpha):
    """``substitution_test`` with each claim's (position, distance difference) given."""
    from crypto import substitution

    monkeypatch.setattr(substitution, "_position_diffs", lambda *args: diffs_of)
    return substitution.substitution_test("int8", prompts, claims, [], [], GPU_BF16, alpha)


def test_the_sign_test_rejects_at_its_threshold_and_not_above_it(monkeypatch):
    """8 of 8 positions nearer the suspect: p = 2^-8, rejected at alpha = p, not below it,
    and never when the mean favours the reference."""
    from types import SimpleNamespace

    prompt, claim = [1, 2], SimpleNamespace(tokens=[3, 4, 5, 6, 7, 8, 9])  # 8 positions
    nearer = [[(p, 1.0) for p in range(8)]]
    p = sign_tail(8, 8)
    assert p == pytest.approx(2.0**-8)
    at = judged_on(monkeypatch, nearer, [prompt], [claim], alpha=p)
    assert (at.nearer, at.positions, at.p_value) == (8, 8, p)
    assert at.rejected, "p = alpha must reject"
    assert not judged_on(monkeypatch, nearer, [prompt], [claim], alpha=p / 2).rejected, (
        "rejected at alpha = p / 2"
    )
    assert not judged_on(monkeypatch, nearer, [prompt], [claim], alpha=p * 0.999).rejected
    # 7 of 8: p = 9/256
    seven = [[(p, 1.0) for p in range(7)] + [(7, -0.5)]]
    assert judged_on(monkeypatch, seven, [prompt], [claim], alpha=sign_tail(7, 8)).rejected
    assert sign_tail(7, 8) == pytest.approx(9 / 256)
    assert not judged_on(monkeypatch, seven, [prompt], [claim], alpha=8 / 256).rejected
    # many nearer the suspect by a little, a few nearer the reference by a lot: mean < 0
    tilted = [[(p, 0.1) for p in range(7)] + [(7, -5.0)]]
    result = judged_on(monkeypatch, tilted, [prompt], [claim], alpha=0.5)
    assert result.mean_diff < 0 and result.p_value <= 0.5 and not result.rejected
    # positions whose distances tie count for neither side
    ties = [[(p, 0.0) for p in range(4)] + [(p, 1.0) for p in range(4, 8)]]
    assert judged_on(monkeypatch, ties, [prompt], [claim], alpha=1).positions == 4


def test_a_position_repeated_in_a_batch_counts_once(monkeypatch):
    """Peaked samples repeat: four rollouts of the same tokens are one computation per
    position, counted once with its first distance (not four times, nor summed)."""
    from types import SimpleNamespace

    prompt, tokens = [1, 2], [3, 4, 5]  # 4 positions
    claims = [SimpleNamespace(tokens=tokens) for _ in range(4)]
    diffs = [[(0, 1.0), (1, 2.0), (2, 3.0), (3, -1.0)] for _ in claims]
    result = judged_on(monkeypatch, diffs, [prompt] * 4, claims, alpha=0.5)
    assert (result.nearer, result.positions) == (3, 4), "a repeated position counted again"
    assert result.mean_diff == pytest.approx(5.0 / 4)
    assert result.p_value == pytest.approx(5 / 16)
    # another rollout sharing the prompt and first token: positions 0-2 are the same
    # computations (the tokens up to them agree), its position 3 is a new one
    other = SimpleNamespace(tokens=[3, 9, 9])
    mixed = judged_on(
        monkeypatch,
        [diffs[0], [(0, 1.0), (1, 2.0), (2, 7.0), (3, 7.0)]],
        [prompt] * 2,
        [claims[0], other],
        alpha=0.5,
    )
    assert (mixed.nearer, mixed.positions) == (4, 5)
    assert mixed.mean_diff == pytest.approx((5.0 + 7.0) / 5)


@dataclasses.dataclass(frozen=True)
class Passed:
    passed: bool = True
    reason: str = "ok"
    substitution: tuple = ()


class FakeSuspects:
    """A validator's ``SuspectModels`` in ``dtype``, each model a name."""

    def __init__(self, dtype):
        self.dtype = dtype
        self.own = SuspectModels.precisions(self)

    def precisions(self):
        return self.own

    def reference(self, dtype):
        return f"reference {dtype}"

    def suspect(self, dtype, name):
        return f"{name} {dtype}"


def substitution_calls(monkeypatch, dtype, suspects, nearer=()):
    """The (label, reference, suspect, alpha) of each test ``with_substitution`` runs for a
    validator in ``dtype`` against ``suspects``; the labels in ``nearer`` reject."""
    from crypto import substitution
    from crypto.substitution import SubstitutionResult
    from node.engine import torch_engine

    calls = []
    monkeypatch.setattr(
        torch_engine, "recompute_batch", lambda model, prompts, outputs: [(model, None)]
    )

    def test(label, prompts, claims, reference, suspected, config, alpha):
        calls.append((label, reference[0], suspected[0], alpha))
        return SubstitutionResult(label, 1, 1, 1.0, 0.5, label in nearer)

    monkeypatch.setattr(substitution, "substitution_test", test)
    config = dataclasses.replace(GPU_BF16, suspects=suspects)
    verdict = with_substitution(Passed(), FakeSuspects(dtype), [[1]], [], ["own"], config)
    return calls, verdict


def test_the_false_slash_budget_is_shared_among_precisions_and_suspects(monkeypatch):
    budget = GPU_BF16.sampling.false_slash
    calls, verdict = substitution_calls(monkeypatch, torch.float32, ("int8", "int4"))
    assert len(calls) == 4 and verdict.passed
    assert {alpha for *_, alpha in calls} == {budget / 4}, "each test must get 1/4 of alpha"
    calls, _ = substitution_calls(monkeypatch, torch.bfloat16, ("int8", "int4"))
    assert {alpha for *_, alpha in calls} == {budget / 2}
    calls, _ = substitution_calls(monkeypatch, torch.float32, ("int8",))
    assert {alpha for *_, alpha in calls} == {budget / 2}


def test_a_validator_in_fp32_also_tests_in_bf16(monkeypatch):
    """A worker computes in its device's precision (bf16 on a GPU): a CPU validator tests
    in its own fp32 and in bf16 too, the own precision on the states it recomputed."""
    calls, verdict = substitution_calls(monkeypatch, torch.float32, ("int8",))
    assert [(label, ref, sus) for label, ref, sus, _ in calls] == [
        ("int8 (float32)", "own", "int8 torch.float32"),
        ("int8 (bfloat16)", "reference torch.bfloat16", "int8 torch.bfloat16"),
    ], "the bf16 pass was skipped"
    assert [r.suspect for r in verdict.substitution] == ["int8 (float32)", "int8 (bfloat16)"]
    calls, _ = substitution_calls(monkeypatch, torch.bfloat16, ("int8",))
    assert [label for label, *_ in calls] == ["int8 (bfloat16)"]  # bf16 once
    # nearer the suspect in bf16 only: rejected
    calls, verdict = substitution_calls(
        monkeypatch, torch.float32, ("int8",), nearer=("int8 (bfloat16)",)
    )
    assert not verdict.passed and verdict.reason.startswith("substitution: nearer int8 (bf")


def test_the_suspect_models_of_an_fp32_policy_come_in_fp32_and_bf16():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    suspects = SuspectModels(model)
    assert suspects.precisions() == [torch.float32, torch.bfloat16]
    assert suspects.reference(torch.float32) is model
    assert next(suspects.reference(torch.bfloat16).parameters()).dtype == torch.bfloat16
    assert SuspectModels(model.to(torch.bfloat16)).precisions() == [torch.bfloat16]


def test_a_batch_is_rechecked_with_its_own_sampling_settings_under_the_given_profile(
    monkeypatch,
):
    """``judge_rollouts`` turns each sample into the claim the proof check judges: its
    tokens, proofs, seed and ending, the batch's max_new_tokens, temperature and top-p,
    all judged under the profile it is given (a batch that fails is not tested further)."""
    from crypto import verdict as verdict_module
    from crypto.identity import Identity
    from node.engine import torch_engine
    from tests.helpers.batches import a_batch

    seen = {}
    monkeypatch.setattr(
        torch_engine, "recompute_batch", lambda model, prompts, outputs: [("acts", None)] * 2
    )

    def check_batch(claims, recomputed, *, eos_token_id, config):
        seen.update(claims=claims, eos=eos_token_id, config=config)
        return Passed(passed=False, reason="mismatch")

    monkeypatch.setattr(verdict_module, "check_batch", check_batch)
    batch = dataclasses.replace(a_batch(Identity.generate()), temperature=0.7, top_p=0.9)
    samples = [(g, s) for g in batch.groups for s in g.samples]
    config = dataclasses.replace(GPU_BF16, suspects=("int8",))
    verdict = judge_rollouts("model", 7, batch, samples, config, suspects=FakeSuspects(None))
    assert verdict == Passed(passed=False, reason="mismatch")
    assert seen["config"] is config and seen["eos"] == 7
    assert [
        (c.tokens, c.proofs, c.seed, c.finish_reason, c.max_new_tokens, c.temperature, c.top_p)
        for c in seen["claims"]
    ] == [
        (unpack(s.tokens), list(s.proofs), s.seed, s.finish_reason, 3, 0.7, 0.9) for _, s in samples
    ]


def test_a_position_sums_only_entries_whose_sign_and_exponent_all_three_share():
    """``_rows``: per output position (flat index // width, from the chunk's first), the
    distance to the reference minus the distance to the suspect, summed over the entries
    where the worker's value and both recomputations agree in sign and exponent (bf16
    patterns: 0x3F8m is 1 + m/128); a position with no such entry is left out."""
    import numpy as np

    from crypto.substitution import _rows, _Shared

    entries = [  # (flat index, worker, reference, suspect)
        (0, 0x3F85, 0x3F84, 0x3F80),  # position 10: 1 - 5
        (1, 0x3F85, 0x3F85, 0x4000),  # the suspect's exponent differs: not counted
        (5, 0x3F80, 0xBF82, 0x3F80),  # position 11: the reference's sign differs
        (9, 0x3F83, 0x3F81, 0x3F83),  # position 12: 2 - 0
        (10, 0x3F83, 0x3F80, 0x3F82),  # position 12: 3 - 1
    ]
    index, worker, ours, theirs = (
        np.array(col, dtype=np.int64) for col in zip(*entries, strict=True)
    )
    shared = _Shared(0, 10, 4, 0, np.zeros(1), index, ours, theirs)
    assert _rows(shared, worker) == [(10, -4.0), (12, 4.0)]
    assert _rows(shared, np.full(5, 0xC000, dtype=np.int64)) == []  # nothing agrees
