"""A batch's rollouts recomputed and judged: one prefill per rollout against a model, then
``crypto.verdict.check_batch`` (TOPLOC proofs, seeded sampling, endings) under a
verification profile, then, for a batch that passes, the profile's substitution test
against each suspect (``crypto.substitution``; the models from ``node.rollouts.suspects``).
The validator's batch checker runs it (``node/roles/children/checking.py``).
"""

from __future__ import annotations

from typing import Any

from protocol.rollouts import RolloutBatch, RolloutGroup, RolloutSample, unpack_tokens


def judge_rollouts(
    model: Any,
    eos_token_id: int,
    batch: RolloutBatch,
    samples: list[tuple[RolloutGroup, RolloutSample]],
    config: Any,
    suspects: Any = None,
) -> Any:
    """The ``BatchVerdict`` on ``samples`` (each with its group) of ``batch``; with
    ``suspects`` (a ``SuspectModels`` of ``model``), a batch that passes is also tested
    against the profile's suspects."""
    from crypto.verdict import RolloutClaim

    claims = [
        RolloutClaim(
            tokens=unpack_tokens(s.tokens),
            proofs=list(s.proofs),
            seed=s.seed,
            finish_reason=s.finish_reason,
            max_new_tokens=batch.max_new_tokens,
            temperature=batch.temperature,
            top_p=batch.top_p,
        )
        for _, s in samples
    ]
    prompts = [unpack_tokens(g.prompt) for g, _ in samples]
    return judge_claims(model, eos_token_id, prompts, claims, config, suspects)


def judge_claims(
    model: Any,
    eos_token_id: int,
    prompts: list[list[int]],
    claims: list[Any],
    config: Any,
    suspects: Any = None,
) -> Any:
    """The ``BatchVerdict`` on ``claims`` (``crypto.verdict.RolloutClaim``s) made from
    ``prompts``: one prefill per rollout against ``model``, ``check_batch``, then, for a
    batch that passes and ``suspects`` given, the substitution test (``with_substitution``)."""
    from crypto.verdict import check_batch
    from node.engine.torch_engine import recompute_batch

    recomputed = recompute_batch(model, prompts, [c.tokens for c in claims])
    verdict = check_batch(claims, recomputed, eos_token_id=eos_token_id, config=config)
    if not verdict.passed or suspects is None or not config.suspects:
        return verdict
    return with_substitution(verdict, suspects, prompts, claims, [a for a, _ in recomputed], config)


def with_substitution(
    verdict: Any,
    suspects: Any,
    prompts: list[list[int]],
    claims: list[Any],
    recomputed: list[Any],
    config: Any,
) -> Any:
    """``verdict`` with the substitution test of every suspect in every precision of
    ``suspects`` (the own one reuses ``recomputed``): rejected at the first suspect the
    batch is nearer to, each test at the profile's false-slash probability shared out."""
    from dataclasses import replace

    from crypto.substitution import substitution_test
    from node.engine.torch_engine import recompute_batch

    dtypes = suspects.precisions()
    alpha = config.sampling.false_slash / (len(dtypes) * len(config.suspects))
    outputs = [c.tokens for c in claims]
    results = []
    for dtype in dtypes:
        if dtype == suspects.dtype:
            reference = recomputed
        else:
            reference = [a for a, _ in recompute_batch(suspects.reference(dtype), prompts, outputs)]
        for name in config.suspects:
            model = suspects.suspect(dtype, name)
            suspected = [a for a, _ in recompute_batch(model, prompts, outputs)]
            label = f"{name} ({str(dtype).removeprefix('torch.')})"
            result = substitution_test(label, prompts, claims, reference, suspected, config, alpha)
            results.append(result)
            if result.rejected:
                reason = f"substitution: {result.describe()}"
                return replace(verdict, passed=False, reason=reason, substitution=tuple(results))
    return replace(verdict, substitution=tuple(results))
