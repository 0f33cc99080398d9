"""The test-only cheats a worker can be told to make (``cheat``, refused without
``dev_cheats``): the catalogue, and what each one changes in the batch maker.

Each cheat is a shortcut a worker could take for profit, not a random corruption; the
validators must reject every one on-chain with the reason in ``CATALOGUE`` (SPEC §12.1 has
the matrix: what each one saves, which check catches it). A worker may be given several,
comma-separated (``node.config.parse_cheats``): its batches make them in turn, one each,
then start over (``pick``), so one cheating process exercises several cheats in one run; a
version cheat that cannot be made yet (no older version held, or only one with the same
weights) leaves its batch honest and is tried again on the next. Where a cheat acts:

- in the batch maker (``node/rollouts/maker.py``, the child process), here: other weights
  (``WEIGHT_CHEATS``, applied to the engine's model once per policy version), other
  sampling parameters, other tasks or another batch's rollouts, or edits after proving;
- in the inference role (``node/roles/cheating.py``): which weights generate the batch,
  the units and the work key submitted, the key the batch is signed with, and serving.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from node.engine.base import SamplingParams
    from node.rollouts.generate import ScoredGroup
    from node.tasks import Task, TaskSet


@dataclass(frozen=True)
class Cheat:
    family: str  # cheaper compute, forged evidence, inflated claim, availability
    reason: str  # the ledger's reason a validator rejects it with (SPEC §12)
    what: str  # what the worker does, and what it hopes to gain


CATALOGUE: dict[str, Cheat] = {
    "other_weights": Cheat(
        "compute",
        "invalid",
        "generates with another model of the same shape (every weight redrawn)",
    ),
    "int8_weights": Cheat(
        "compute", "invalid", "generates with the policy's weights quantized to int8 per row"
    ),
    "fewer_layers": Cheat(
        "compute", "invalid", "generates with the policy's last decoder layer dropped"
    ),
    "stale_weights": Cheat(
        "compute",
        "invalid",
        "generates with the oldest version it holds (the base model), claims the newest",
    ),
    "older_version": Cheat(
        "compute",
        "invalid",
        "generates with the oldest version inside the window, claims the newest it holds",
    ),
    "foreign_proofs": Cheat(
        "evidence", "invalid", "each rollout carries the proofs of another prompt's rollout"
    ),
    "edit_token": Cheat("evidence", "invalid", "changes one output token after proving"),
    "greedy": Cheat(
        "evidence", "invalid", "decodes greedily, claims the run's sampling temperature"
    ),
    "other_temperature": Cheat(
        "evidence", "invalid", "samples at half the run's temperature (higher rewards)"
    ),
    "early_stop": Cheat(
        "evidence", "invalid", "stops its longest rollout half-way and claims EOS there"
    ),
    "truncated": Cheat(
        "evidence", "invalid", "cuts its longest rollout in half and claims it complete"
    ),
    "inflate_reward": Cheat("claims", "invalid", "claims reward 1 for every sample"),
    "inflate_units": Cheat("claims", "mismatch", "submits twice its batch's tokens as units"),
    "easy_tasks": Cheat(
        "claims", "invalid", "does the easiest of 8 other steps' tasks instead of its own"
    ),
    "replay_step": Cheat(
        "claims", "invalid", "sends the rollouts of an earlier step as this step's"
    ),
    "replay_other": Cheat(
        "claims", "invalid", "sends another worker's rollouts (its tasks) as its own"
    ),
    "key_mismatch": Cheat(
        "claims",
        "unavailable",
        "submits a work key before the work, serves a batch that does not hash to it",
    ),
    "other_key": Cheat(
        "claims", "invalid", "signs its batches with a peer key it did not register"
    ),
    "withhold": Cheat("availability", "unavailable", "submits and announces, never serves"),
}
# Shortcuts no validator can punish (SPEC §12.1, "Availability"): the batch is real work, so
# those who fetch it accept it, and the others' ``unavailable`` votes are unbonded, one each,
# below the quorum that would overturn the accept. What it saves is upload bandwidth alone.
UNPUNISHED: dict[str, Cheat] = {
    "serve_some": Cheat(
        "availability",
        "none",
        "serves each batch to the run's trainer and the first other peer that asks, nobody else",
    ),
}
WEIGHT_CHEATS = ("other_weights", "int8_weights", "fewer_layers")


def pick(cheats: tuple[str, ...], batch_number: int) -> str:
    """The ``batch_number``-th cheat made (0-based), in turn."""
    return cheats[batch_number % len(cheats)] if cheats else "none"


# ---- in the batch maker ------------------------------------------------------------------


def alter_weights(cheat: str, model: Any) -> None:
    """Make ``model`` (the engine's, in place) the cheaper or other model ``cheat`` uses."""
    import torch

    with torch.no_grad():
        if cheat == "other_weights":  # the same architecture, another model
            g = torch.Generator().manual_seed(1)
            for p in model.parameters():
                # a number, not a tensor: on a GPU the CPU draw times a CUDA scalar tensor
                # failed ("Expected all tensors to be on the same device"), every batch
                spread = max(float(p.float().std()), 1e-3) if p.numel() > 1 else 1.0
                p.copy_((torch.randn(p.shape, generator=g) * spread).to(p.device, p.dtype))
        elif cheat == "int8_weights":  # fake-quantized per output row, as int8 inference does
            for module in model.modules():
                if isinstance(module, torch.nn.Linear):
                    w = module.weight.float()
                    scale = w.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127
                    q = (w / scale).round().clamp(-127, 127) * scale
                    module.weight.copy_(q.to(module.weight.dtype))
        elif cheat == "fewer_layers":  # a shallower network: less compute per token
            layers = model.model.layers
            if len(layers) < 2:
                raise ValueError("fewer_layers needs a model with at least 2 layers")
            model.model.layers = torch.nn.ModuleList(list(layers)[:-1])
            model.config.num_hidden_layers = len(layers) - 1
        else:
            raise ValueError(f"{cheat!r} does not change the weights")


def sampled_with(cheat: str, run: SamplingParams) -> SamplingParams:
    """The sampling parameters the cheat really generates with."""
    if cheat == "greedy":
        return dataclasses.replace(run, temperature=0.0)
    if cheat == "other_temperature":
        return dataclasses.replace(run, temperature=run.temperature / 2)
    return run


def claimed_params(cheat: str, run: SamplingParams) -> SamplingParams:
    """The sampling parameters the batch states (greedy claims the run's; the other
    temperature is stated as what it is: the validator compares it with the run's)."""
    return sampled_with(cheat, run) if cheat == "other_temperature" else run


def source(cheat: str, worker: str, step: int) -> tuple[str, int]:
    """(worker, step) whose rollouts the cheat sends as ``worker``'s for ``step``."""
    if cheat == "replay_step":
        return worker, step - 1 if step > 0 else step + 1
    if cheat == "replay_other":  # the address beside ours: another worker's batch
        last = int(worker[-2:], 16) ^ 0x01
        return f"{worker[:-2]}{last:02x}", step
    return worker, step


def easy_tasks(taskset: TaskSet, worker: str, step: int, count: int) -> list[Task]:
    """The easiest task among 8 other steps' tasks at each index (cherry-picking)."""
    from node.tasks import assign

    options = [assign(taskset, worker, step + 1 + j, count) for j in range(8)]
    return [min((o[i] for o in options), key=lambda t: t.difficulty) for i in range(count)]


def reseed(groups: list[ScoredGroup], worker: str, step: int) -> None:
    """Claim ``groups`` as ``worker``'s for ``step``: the seeds it would have used (the
    decoder refuses others), the tokens left as they were drawn."""
    from crypto.sampling import derive_seed

    for g in groups:
        g.results = [
            dataclasses.replace(r, seed=derive_seed(worker, g.task.task_id, step, i))
            for i, r in enumerate(g.results)
        ]


def forge(
    cheat: str, groups: list[ScoredGroup], tokenizer: Any, *, eos: int, vocab: int, chunk: int
) -> None:
    """The edits a cheat makes after generating (and proving) with proof chunks of
    ``chunk`` decode states, in place."""
    from protocol.rollouts import expected_proofs

    flat = [(g, i) for g in groups for i in range(len(g.results))]
    if cheat == "inflate_reward":
        for g in groups:
            g.rewards = [1.0] * len(g.rewards)
    elif cheat == "edit_token":  # after proving; the reward claimed is the edited text's
        g, r = groups[0], groups[0].results[0]
        i = len(r.tokens) // 2
        r.tokens[i] = 3 + (r.tokens[i] - 3 + 1) % (vocab - 3)
        _rescore(g, 0, tokenizer)
    elif cheat == "foreign_proofs":  # another prompt's rollout, chunk by chunk
        results = [g.results[i] for g, i in flat]
        shift = len(groups[0].results) if len(groups) > 1 else 1
        for n, (g, i) in enumerate(flat):
            other = results[(n + shift) % len(results)]
            own = list(g.results[i].proofs)
            swapped = [other.proofs[j] if j < len(other.proofs) else p for j, p in enumerate(own)]
            g.results[i] = dataclasses.replace(g.results[i], proofs=swapped)
    elif cheat in ("early_stop", "truncated"):
        g, i = max(flat, key=lambda gi: len(gi[0].results[gi[1]].tokens))
        r = g.results[i]
        if len(r.tokens) < 3:
            raise ValueError(f"{cheat}: no rollout long enough to cut")
        kept = r.tokens[: len(r.tokens) // 2] + ([eos] if cheat == "early_stop" else [])
        g.results[i] = dataclasses.replace(
            r,
            tokens=kept,
            logprobs=r.logprobs[: len(kept)],
            finish_reason="stop",
            proofs=r.proofs[: expected_proofs(len(kept), chunk)],
        )
        _rescore(g, i, tokenizer)


def _rescore(g: ScoredGroup, i: int, tokenizer: Any) -> None:
    """The completion and reward of the edited sample (the reward check must not be what
    catches an edit)."""
    g.completions[i] = tokenizer.decode(g.results[i].tokens, skip_special_tokens=True)
    g.rewards[i] = g.task.reward(g.completions[i])
