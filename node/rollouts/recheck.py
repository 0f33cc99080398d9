"""A batch's rollouts recomputed and judged: one prefill per rollout against a model, then
``crypto.verdict.check_batch`` (TOPLOC proofs, seeded sampling, endings) under a
verification profile. The validator's batch checker runs it (``node/roles/checking.py``),
and so does a worker told to make the test-only ``greedy`` cheat, to learn whether any
check could tell it apart (``node/rollouts/maker.py``).
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
) -> Any:
    """The ``BatchVerdict`` on ``samples`` (each with its group) of ``batch``."""
    from crypto.verdict import RolloutClaim, check_batch
    from node.engine.torch_engine import recompute_batch

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
    recomputed = recompute_batch(
        model, [unpack_tokens(g.prompt) for g, _ in samples], [c.tokens for c in claims]
    )
    return check_batch(claims, recomputed, eos_token_id=eos_token_id, config=config)
