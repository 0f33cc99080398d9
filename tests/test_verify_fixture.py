"""What a validator concludes about work made on a real GPU (the H200 fixture, see
``tests/fixtures/gpu_rollouts_h200.json`` and ``node/engine/calibration.py``), recomputed
here on the CPU in bf16 and in fp32 and judged in batches of 16 rollouts."""

import json
from pathlib import Path

import pytest
import torch

from crypto.verdict import GPU_BF16, check_batch
from node.engine.calibration import (
    build_random_llama,
    claim_of,
    judge_variant,
    model_layers,
    recompute_all,
    weights_sha256,
)

FIXTURE = Path(__file__).parent / "fixtures" / "gpu_rollouts_h200.json"
HONEST = ("honest_batch32", "honest_batch1")
CHEATS = ("int8_weights_batch16", "adamw_step_lr1e-4_batch16", "other_weights_batch16")


@pytest.fixture(scope="module")
def doc():
    return json.loads(FIXTURE.read_text())


@pytest.fixture(scope="module")
def models(doc):
    bf16 = build_random_llama(doc["config"], doc["init_seed"], doc["lm_head_scale"])
    assert weights_sha256(bf16) == doc["weights_sha256_bf16"]  # the recipe rebuilds it exactly
    return {
        "bf16": bf16,
        "fp32": build_random_llama(doc["config"], doc["init_seed"], doc["lm_head_scale"]).float(),
    }


@pytest.fixture(scope="module")
def verdicts(doc, models):
    """(precision, variant) -> one BatchVerdict per batch of 16 rollouts."""
    config = GPU_BF16.for_layers(model_layers(models["bf16"]))
    eos = doc["config"]["eos_token_id"]
    return {
        (precision, name): judge_variant(model, variant, config, eos_token_id=eos)
        for precision, model in models.items()
        for name, variant in doc["variants"].items()
    }


def test_the_recipe_and_the_variants(doc):
    assert set(HONEST + CHEATS) <= set(doc["variants"])
    assert len(doc["variants"]["honest_batch32"]["rollouts"]) == 48
    # the model changes under another seed, so the checksum means something
    other = build_random_llama(doc["config"], 1, doc["lm_head_scale"])
    assert weights_sha256(other) != doc["weights_sha256_bf16"]


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("name", HONEST)
def test_honest_gpu_work_is_accepted_as_batches_and_one_by_one(verdicts, precision, name):
    batches = verdicts[precision, name]
    assert len(batches) == (3 if name == "honest_batch32" else 1)
    for batch in batches:
        assert batch.passed, batch.reason
        assert batch.statistic < 0.5 * batch.bound  # and not by a hair
        for rollout in batch.rollouts:
            assert rollout.passed, rollout.describe()
            assert rollout.toploc_ok and not rollout.sampling.bad_positions


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize(
    ("name", "evidence"),
    [
        ("int8_weights_batch16", "sampling: statistic"),  # pooled evidence: no single proof
        ("adamw_step_lr1e-4_batch16", "sampling"),
        ("other_weights_batch16", "toploc"),
    ],
)
def test_cheaper_or_other_models_are_rejected(verdicts, precision, name, evidence):
    (batch,) = verdicts[precision, name]
    assert not batch.passed
    assert batch.reason.startswith(evidence), batch.reason
    assert batch.statistic > batch.bound
    assert batch.flagged  # the detail says which rollouts looked wrong


def test_int8_is_caught_only_by_pooling(verdicts):
    """Each int8 rollout alone is within the noise; the batch is not: the verdict must be
    per batch."""
    (batch,) = verdicts["bf16", "int8_weights_batch16"]
    assert all(r.passed for r in batch.rollouts)
    assert not batch.passed


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_fp16_compute_is_judged_either_way_without_errors(verdicts, precision):
    (batch,) = verdicts[precision, "fp16_compute_batch16"]
    assert batch.reason == "ok" or batch.reason.startswith("sampling")
    assert all(r.toploc_ok for r in batch.rollouts)


def test_without_the_depth_term_honest_deep_work_would_look_noisier(doc, models):
    """The noise unit grows with sqrt(layers): judged as a 1-layer model, the same honest
    rollouts use a larger share of the bound."""
    variant = doc["variants"]["honest_batch1"]
    rollouts = variant["rollouts"]
    recomputed = recompute_all(
        models["bf16"], [r["prompt"] for r in rollouts], [r["tokens"] for r in rollouts]
    )
    claims = [claim_of(r, variant) for r in rollouts]
    deep = check_batch(claims, recomputed, eos_token_id=2, config=GPU_BF16.for_layers(4))
    flat = check_batch(claims, recomputed, eos_token_id=2, config=GPU_BF16.for_layers(1))
    assert flat.margin > 1.5 * deep.margin
    assert torch.isfinite(torch.tensor(flat.statistic))
