"""Honest work and cheats below top-p 1, on a real model (SPEC §18.1, boundary events).

A random-init Llama of the ``wide`` calibration shape (vocabulary 8,192: a nucleus of
hundreds of tokens at its boundary) generates in bf16 with the project's engine at every
setting of ``TOP_P_SETTINGS``; validators recompute in bf16 and in fp32 on this CPU and
judge batches of 16. ``bench/verify.py`` runs the same at 64 batches per setting on seeds
these tests never use (the calibration set); here one batch per setting, and the cheats
of the verification matrix at the two extreme settings. The quick tier takes the honest
work at the two extremes and the cheats at the last; the slow tier the rest.
"""

import pytest
import torch

from crypto.toploc import build_proofs
from crypto.verdict import GPU_BF16, RolloutClaim, check_batch
from node.engine.calibration import (
    TOP_P_SETTINGS,
    build_random_llama,
    claim_of,
    edited_variant,
    generate_variant,
    judge_variant,
    model_layers,
    random_prompts,
    recompute_all,
    shape_recipe,
    variant_model,
)
from node.rollouts.recheck import judge_claims
from node.rollouts.suspects import SuspectModels
from tests.helpers.boundary import boundary_drops

RECIPE = shape_recipe("wide")
EOS = RECIPE["config"]["eos_token_id"]
NEW_TOKENS = 48
FIRST_SEED = 31_000  # the calibration set (bench/verify.py) uses others


@pytest.fixture(scope="module")
def models():
    bf16 = build_random_llama(RECIPE["config"], 0, RECIPE["lm_head_scale"])
    fp32 = build_random_llama(RECIPE["config"], 0, RECIPE["lm_head_scale"]).float()
    return {"bf16": bf16, "fp32": fp32}


@pytest.fixture(scope="module")
def config(models):
    return GPU_BF16.for_layers(model_layers(models["bf16"]))


def prompts(n=16, seed=7):
    return random_prompts(n, RECIPE["config"]["vocab_size"], seed=seed)


def made(model, temperature, top_p, *, claimed=None):
    return generate_variant(
        model,
        prompts(),
        batch=16,
        new_tokens=NEW_TOKENS,
        temperature=temperature,
        top_p=top_p,
        first_seed=FIRST_SEED,
        claimed=claimed,
    )


def settings(*quick):
    """``TOP_P_SETTINGS`` as parameters, those at the indexes ``quick`` in the quick tier and
    the others in the slow one (docs/testing.md)."""
    return [
        s if i in quick or i - len(TOP_P_SETTINGS) in quick else pytest.param(*s, marks=SLOW)
        for i, s in enumerate(TOP_P_SETTINGS)
    ]


SLOW = pytest.mark.slow


@pytest.mark.parametrize(("temperature", "top_p"), settings(0, -1))
def test_honest_bf16_work_below_top_p_one_is_accepted_in_bf16_and_fp32(
    models, config, temperature, top_p
):
    honest = made(models["bf16"], temperature, top_p)
    for precision, model in models.items():
        (verdict,) = judge_variant(model, honest, config, eos_token_id=EOS)
        assert verdict.passed, f"{precision}: {verdict.reason}"
        assert verdict.margin < 0.5 and verdict.boundary <= verdict.boundary_bound
        # the count honest noise may reach is there, and the statistic's budget is halved
        assert verdict.boundary_bound > 0


def as_validator(model, variant, config):
    """The validator's verdict on the variant's one batch (``judge_claims``)."""
    claims = [claim_of(r, variant) for r in variant["rollouts"]]
    prompts_ = [r["prompt"] for r in variant["rollouts"]]
    return judge_claims(model, EOS, prompts_, claims, config, SuspectModels(model))


CHEATS = {
    # name: (model variant, sampled with, from the run's (t, p)), evidence that catches it
    "int8_weights": ("int8_weights", lambda t, p: (t, p), "substitution"),
    "other_weights": ("other_weights", lambda t, p: (t, p), "toploc"),
    "adamw_step": ("adamw_step", lambda t, p: (t, p), ""),
    "greedy": (None, lambda t, p: (0.0, p), "sampling"),
    "half_temperature": (None, lambda t, p: (t / 2, p), "sampling"),
    "no_top_p": (None, lambda t, p: (t, 1.0), "sampling"),
    "edited_token": (None, lambda t, p: (t, p), "sampling"),
}


@pytest.mark.parametrize(
    ("temperature", "top_p"), [pytest.param(*TOP_P_SETTINGS[0], marks=SLOW), TOP_P_SETTINGS[-1]]
)
@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_every_cheat_is_still_rejected_below_top_p_one(models, config, cheat, temperature, top_p):
    variant, sampled, evidence = CHEATS[cheat]
    base = models["bf16"]
    worker = (
        variant_model(f"{variant}_batch16", base, RECIPE, torch.device("cpu")) if variant else base
    )
    work = made(worker, *sampled(temperature, top_p), claimed=(temperature, top_p))
    if cheat == "edited_token":
        work = edited_variant(work, RECIPE["config"]["vocab_size"])
    verdict = as_validator(base, work, config)
    assert not verdict.passed, cheat
    assert verdict.reason.startswith(evidence), verdict.reason


def test_an_honest_boundary_flip_in_real_work_is_one_event_not_a_rejection(models, config):
    """Real logits at top-p 0.9: where our winner among the tokens surely in at κ units is
    a token of uncertain membership at 2κ, an honest worker whose noise moved it out of
    its nucleus draws the next token of its nucleus. Its rollout ends there (the claim is
    that prefix, proven from honest states), and the batch passes with one event."""
    t, p = 1.0, 0.9
    honest = made(models["bf16"], t, p)
    claims = [claim_of(r, honest) for r in honest["rollouts"]]
    prompts_ = [r["prompt"] for r in honest["rollouts"]]
    recomputed = recompute_all(models["fp32"], prompts_, [c.tokens for c in claims])
    drops = [
        boundary_drops(logits, claim.seed, config.sampling, t, p)
        for claim, (_, logits) in zip(claims, recomputed, strict=True)
    ]
    i = next((i for i, d in enumerate(drops) if d), None)
    assert i is not None, "no boundary token wins anywhere in the batch"
    k = min(drops[i])
    y = drops[i][k]
    tokens = claims[i].tokens[:k] + [y]
    states = recompute_all(models["bf16"], [prompts_[i]], [tokens])[0][0]
    claims[i] = RolloutClaim(tokens, build_proofs(states), claims[i].seed, "length", k + 1, t, p)
    recomputed[i] = recompute_all(models["fp32"], [prompts_[i]], [tokens])[0]
    verdict = check_batch(claims, recomputed, eos_token_id=EOS, config=config)
    assert verdict.passed, verdict.reason
    assert verdict.rollouts[i].sampling.boundary_positions == [k] and verdict.boundary == 1
