"""A cheating worker's batch maker: the real ``BatchMaker`` (``node/rollouts/maker.py``),
made to cheat in the ways ``catalogue.py`` names.

The cheating role (``role.py``) calls it, in the worker's child process as the honest role
calls the honest maker, with ``CheatingBatch``: a ``MakeBatch`` that names the cheat this
batch makes (``none``: honest work). It answers with a ``CheatMade``, which says whether
the cheat asked for was made: a greedy batch that no check could tell from the seeded
draws (a policy so peaked that they differ only at near-ties within the noise, or
nowhere) is undetectable by design (SPEC §19.1), so the honest batch goes instead and the
worker makes the cheat again later, as it does for a version too close to tell apart.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from node.rollouts.maker import BatchMaker, MadeBatch, MakeBatch
from tests.helpers.cheating.catalogue import WEIGHT_CHEATS

if TYPE_CHECKING:
    from node.engine.base import SamplingParams
    from node.rollouts.generate import ScoredGroup
    from node.tasks import Task, TaskSet


@dataclass(frozen=True)
class CheatingBatch(MakeBatch):
    cheat: str = "none"  # the cheat this batch makes (``catalogue.py``)


@dataclass(frozen=True)
class CheatMade(MadeBatch):
    # the cheat asked for could not be made (no check could tell it from honest work): this
    # is the honest batch, and the worker makes the cheat again on its next batch
    unchanged: bool = False


class CheatingMaker(BatchMaker):
    """``BatchMaker`` that makes the cheat each ``CheatingBatch`` names."""

    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        self.altered: dict[tuple[str, str], tuple[Any, Any]] = {}  # (dir, cheat) -> engine

    def engine_for(self, model_dir: str, cheat: str) -> tuple[Any, Any]:
        """The engine of ``model_dir`` with the weights ``cheat`` uses (the honest one's
        unless it changes them); the newest two altered ones stay loaded."""
        if cheat not in WEIGHT_CHEATS:
            return self.engine(model_dir)
        if (model_dir, cheat) not in self.altered:
            engine, tokenizer = self.open(model_dir)
            alter_weights(cheat, engine.model)
            self.altered[(model_dir, cheat)] = (engine, tokenizer)
            while len(self.altered) > 2:
                del self.altered[next(iter(self.altered))]
        return self.altered[(model_dir, cheat)]

    def __call__(self, call: MakeBatch) -> MadeBatch:
        from node.rollouts.generate import generate_groups

        cheat = call.cheat if isinstance(call, CheatingBatch) else "none"
        if cheat == "none":
            return CheatMade(**dataclasses.asdict(super().__call__(call)))
        engine, tokenizer = self.engine_for(call.model_dir, cheat)
        worker, step = source(cheat, call.worker, call.step)
        count = self.spec.tasks_per_batch
        tasks = easy_tasks(self.taskset, worker, step, count) if cheat == "easy_tasks" else None

        def generate(params: Any) -> list[Any]:
            return generate_groups(
                engine,
                tokenizer,
                self.taskset,
                worker=worker,
                step=step,
                count=count,
                group_size=self.spec.group_size,
                params=params,
                tasks=tasks,
            )

        started = time.perf_counter()
        groups = generate(sampled_with(cheat, self.params))
        if (worker, step) != (call.worker, call.step):
            reseed(groups, call.worker, call.step)
        forged = forge(
            cheat,
            groups,
            tokenizer,
            eos=int(tokenizer.eos_token_id),
            vocab=engine.vocab_size,
            chunk=self.params.proof_chunk,
        )
        batch = self.to_batch(groups, call, claimed_params(cheat, self.params))
        if not forged:  # nothing changed: the honest batch, and the cheat comes again
            return CheatMade(batch.encode(), seconds=time.perf_counter() - started, unchanged=True)
        if cheat == "greedy" and self.undetectable(batch, engine, tokenizer):
            honest = self.to_batch(generate(self.params), call, self.params).encode()
            return CheatMade(honest, seconds=time.perf_counter() - started, unchanged=True)
        return CheatMade(batch.encode(), seconds=time.perf_counter() - started)

    def undetectable(self, batch: Any, engine: Any, tokenizer: Any) -> bool:
        """Whether the run's verification accepts ``batch``, checked as a validator would
        (every rollout recomputed with the engine's model)."""
        from crypto.verdict import profile
        from node.engine.calibration import model_layers
        from node.rollouts.recheck import judge_rollouts

        config = profile(self.spec.verify_profile).for_layers(model_layers(engine.model))
        samples = [(g, s) for g in batch.groups for s in g.samples]
        eos = int(tokenizer.eos_token_id)
        return bool(judge_rollouts(engine.model, eos, batch, samples, config).passed)


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
) -> bool:
    """The edits a cheat makes after generating (and proving) with proof chunks of
    ``chunk`` decode states, in place; False when they changed nothing (the batch is the
    honest one)."""
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
        return _foreign_proofs(groups, flat)
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
    return True


def _foreign_proofs(groups: list[ScoredGroup], flat: list[tuple[ScoredGroup, int]]) -> bool:
    """Each rollout takes, chunk by chunk, the proofs of another whose proofs differ from
    its own, another prompt's first (the same index in the next group); False when no
    rollout's proofs could change. A policy that learned level 1 decodes each prompt the
    same way every time, and two groups of one batch can be the same problem (level 1 has
    100): the matrix once saw such a swap move nothing, an honest batch counted as a cheat
    that went undetected."""
    results = [g.results[i] for g, i in flat]
    shift = len(groups[0].results) if len(groups) > 1 else 1
    changed = False
    for n, (g, i) in enumerate(flat):
        own = list(g.results[i].proofs)
        donors = (results[(n + shift + k) % len(results)] for k in range(len(results)))
        for other in donors:
            swapped = [other.proofs[j] if j < len(other.proofs) else p for j, p in enumerate(own)]
            if swapped != own:
                g.results[i] = dataclasses.replace(g.results[i], proofs=swapped)
                changed = True
                break
    return changed


def _rescore(g: ScoredGroup, i: int, tokenizer: Any) -> None:
    """The completion and reward of the edited sample (the reward check must not be what
    catches an edit)."""
    g.completions[i] = tokenizer.decode(g.results[i].tokens, skip_special_tokens=True)
    g.rewards[i] = g.task.reward(g.completions[i])
