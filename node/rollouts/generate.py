"""Turning assigned tasks into a rollout batch: assign, generate, score, package.

For ``step``, the worker's tasks are ``assign(taskset, worker, step, count)``; each task's
prompt is sampled ``group_size`` times (a GRPO group), sample ``i`` of task ``t`` with the
seed ``derive_seed(worker, t.task_id, step, i)``. Every completion is scored by its task's
verifier, and the batch carries everything a validator needs to re-check it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from crypto.sampling import derive_seed
from node.engine.base import Engine, GenRequest, GenResult, SamplingParams
from node.engine.models import prompt_ids
from node.tasks import Task, TaskSet, assign
from protocol.rollouts import (
    MAX_PROMPT_TOKENS,
    RolloutBatch,
    RolloutGroup,
    RolloutSample,
    pack_floats,
    pack_tokens,
)


@dataclass
class ScoredGroup:
    index: int
    task: Task
    prompt: list[int]
    results: list[GenResult]
    completions: list[str]
    rewards: list[float]


def generate_groups(
    engine: Engine,
    tokenizer: Any,
    taskset: TaskSet,
    *,
    worker: str,
    step: int,
    count: int,
    group_size: int,
    params: SamplingParams,
    tasks: list[Task] | None = None,
) -> list[ScoredGroup]:
    """``tasks``: the worker's assigned ones (``assign``) unless given."""
    tasks = assign(taskset, worker, step, count) if tasks is None else tasks
    prompts = [prompt_ids(tokenizer, t.prompt) for t in tasks]
    for t, p in zip(tasks, prompts, strict=True):
        if len(p) > MAX_PROMPT_TOKENS:
            raise ValueError(f"{t.task_id}: prompt is {len(p)} tokens > {MAX_PROMPT_TOKENS}")
    requests = [
        GenRequest(p, derive_seed(worker, t.task_id, step, i))
        for t, p in zip(tasks, prompts, strict=True)
        for i in range(group_size)
    ]
    results = engine.generate(requests, params)
    groups = []
    for n, (t, p) in enumerate(zip(tasks, prompts, strict=True)):
        rs = results[n * group_size : (n + 1) * group_size]
        texts = [tokenizer.decode(r.tokens, skip_special_tokens=True) for r in rs]
        groups.append(ScoredGroup(n, t, p, rs, texts, [t.reward(c) for c in texts]))
    return groups


def to_batch(
    groups: list[ScoredGroup],
    *,
    run_id: str,
    sender: str,
    seq: int,
    ts_ms: int,
    worker: str,
    step: int,
    policy_version: int,
    taskset: str,
    params: SamplingParams,
) -> RolloutBatch:
    if not params.prove:
        raise ValueError("a rollout batch needs proofs (params.prove)")
    return RolloutBatch(
        run_id=run_id,
        sender=sender,
        seq=seq,
        ts_ms=ts_ms,
        worker=worker.lower(),
        step=step,
        policy_version=policy_version,
        taskset=taskset,
        group_size=len(groups[0].results) if groups else 1,
        max_new_tokens=params.max_new_tokens,
        temperature=float(params.temperature),
        top_p=float(params.top_p),
        proof_chunk=params.proof_chunk,
        proof_topk=params.proof_topk,
        groups=[
            RolloutGroup(
                index=g.index,
                task_id=g.task.task_id,
                prompt=pack_tokens(g.prompt),
                samples=[
                    RolloutSample(
                        sample=i,
                        seed=r.seed,
                        tokens=pack_tokens(r.tokens),
                        logprobs=pack_floats(r.logprobs),
                        finish_reason=r.finish_reason,
                        reward=float(reward),
                        proofs=list(r.proofs),
                    )
                    for i, (r, reward) in enumerate(zip(g.results, g.rewards, strict=True))
                ],
            )
            for g in groups
        ],
    )
