"""The trainer's policy worker: the trainer role's child process (``node/roles/children/offload.py``).

Where the rollouts come from: the trainer role (``node/roles/services/trainer.py``) fetched the
batches the chain accepted and calls ``TrainStep`` with their envelopes. Here they become
GRPO samples (``node/training/grpo.py``; held-out tasks and batches sampled at another
temperature are left out) and one optimizer step of the policy (``node/training/policy.py``),
then checkpoint ``step + 1`` is written (weights, then optimizer state). Where they go
next: the role publishes the checkpoint as policy version ``step + 1`` over SHARDCAST.
``Evaluate`` scores a checkpoint on the held-out set (``node/training/heldout.py``).

With ``[trainer] procs`` > 1 the same worker runs on every torchrun rank, driven by
``RankedPolicyWorker`` (``node/training/ranks.py``), which takes the same calls.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from protocol.rollouts import RolloutBatch
from protocol.wire import open_message

if TYPE_CHECKING:
    from node.config import NodeConfig


@dataclass(frozen=True)
class PolicySpec:
    """What the child builds its ``PolicyWorker`` from (JSON-able: torchrun's ranks get it
    on their command line)."""

    base: str  # the base model directory (version 0; tokenizer and recipe files)
    checkpoints: str  # where checkpoint ``v{n}`` and its state ``v{n}.state`` are written
    step: int  # the policy version to start from (0: the base model)
    lr: float | None
    seed: int
    taskset: str
    heldout_per_level: int
    heldout_seed: int
    max_new_tokens: int
    temperature: float
    device: str = "cpu"
    heldout_draws: int = 8

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PolicySpec:
        return cls(**d)

    @classmethod
    def of(cls, cfg: NodeConfig, checkpoints: Path, step: int) -> PolicySpec:
        return cls(
            base=str(cfg.run.model),
            checkpoints=str(checkpoints),
            step=step,
            lr=cfg.trainer.learning_rate,
            seed=cfg.trainer.seed,
            taskset=cfg.run.taskset,
            heldout_per_level=cfg.trainer.heldout_per_level,
            heldout_seed=cfg.trainer.heldout_seed,
            max_new_tokens=cfg.run.max_new_tokens,
            temperature=cfg.run.temperature,
            device=cfg.trainer.device,
            heldout_draws=cfg.trainer.heldout_draws,
        )


@dataclass(frozen=True)
class TrainStep:
    """One GRPO step of policy version ``step`` on these batches; writes ``step + 1``."""

    step: int
    envelopes: list[bytes]


@dataclass(frozen=True)
class StepStats:
    """What one step did (None: no samples, no optimizer step)."""

    samples: int = 0
    tokens: int = 0
    loss: float | None = None
    grad_norm: float | None = None
    clip_frac: float | None = None
    ratio_mean: float | None = None
    kl: float | None = None
    seconds: float | None = None
    reward_mean: float | None = None
    skipped_batches: int = 0  # sampled at another temperature
    ranks: int | None = None  # processes the step was sharded across
    dropped_heldout_groups: int = 0  # so far: groups of held-out tasks left out


@dataclass(frozen=True)
class Evaluate:
    """The held-out evaluation of the checkpoint in ``model_dir``."""

    model_dir: str


@dataclass(frozen=True)
class HeldOutScores:
    """Per level and ``"all"`` (``HeldOut.evaluate``): ``sampled`` (the mean reward of
    ``draws`` draws per task at the run's temperature: the headline figure), ``greedy``,
    and ``pass_at_k`` with k = ``draws``."""

    sampled: dict[str, float]
    greedy: dict[str, float]
    pass_at_k: dict[str, float]
    draws: int

    def fields(self) -> dict[str, Any]:
        """Its fields of the step's ``metrics.jsonl`` line."""
        from node.training.heldout import metrics_fields

        scores = {"sampled": self.sampled, "greedy": self.greedy, "pass_at_k": self.pass_at_k}
        return metrics_fields(scores, self.draws)


class PolicyWorker:
    """In the trainer role's child process (or on each torchrun rank): the policy, its
    optimizer, the held-out set."""

    SPEC = PolicySpec
    CALLS: tuple[type, ...] = (TrainStep, Evaluate)

    def __init__(self, spec: PolicySpec, *, distributed: bool = False) -> None:
        import torch

        from node.tasks import load_taskset
        from node.training.grpo import GRPOConfig
        from node.training.heldout import HeldOut
        from node.training.policy import Policy

        torch.manual_seed(spec.seed)
        self.spec = spec
        self.cfg = GRPOConfig() if spec.lr is None else GRPOConfig(lr=spec.lr)
        self.root = Path(spec.checkpoints)
        self.taskset = load_taskset(spec.taskset)
        self.heldout = HeldOut(
            spec.taskset, per_level=spec.heldout_per_level, seed=spec.heldout_seed
        )
        step = spec.step
        if step == 0:
            self.policy = Policy(
                spec.base, self.cfg, seed=spec.seed, device=spec.device, distributed=distributed
            )
        else:
            self.policy = Policy.from_checkpoint(
                self.root / f"v{step}",
                self.root / f"v{step}.state",
                self.cfg,
                seed=spec.seed,
                device=spec.device,
                distributed=distributed,
            )
            self.policy.base_dir = Path(spec.base)  # tokenizer and recipe files come from the base
        self.dropped_heldout = 0
        self.stepped: tuple[int, StepStats] | None = None  # the step taken last, in memory

    def __call__(self, call: TrainStep | Evaluate) -> StepStats | HeldOutScores:
        if isinstance(call, TrainStep):
            return self.train(call)
        if isinstance(call, Evaluate):
            return self.evaluate(call)
        raise TypeError(f"PolicyWorker does not take {type(call).__name__}")

    def samples(self, envelopes: list[bytes]) -> tuple[list[Any], list[float], int]:
        """The GRPO samples of the batches, their rewards, and the batches skipped (sampled
        at another temperature); held-out tasks are left out."""
        from node.training.grpo import samples_from_batch

        samples = []
        rewards: list[float] = []
        skipped = 0
        for envelope in envelopes:
            batch = open_message(envelope, RolloutBatch)
            if abs(batch.temperature - self.spec.temperature) > 1e-9:
                skipped += 1  # another temperature: its log-probs are not comparable
                continue
            held_out = self.heldout.batch_filter(batch, self.taskset)
            kept = [g for g in batch.groups if not held_out(g)]
            self.dropped_heldout += len(batch.groups) - len(kept)
            rewards += [s.reward for g in kept for s in g.samples]
            samples += samples_from_batch(dataclasses.replace(batch, groups=kept))
        return samples, rewards, skipped

    def train(self, call: TrainStep) -> StepStats:
        """One GRPO step on the batches; checkpoint ``step + 1`` (weights, then state).

        The same call again after the checkpoint failed to save (an ``OSError``: a full
        disk) only saves: the weights in memory already took the step, and taking it
        twice would train twice on the same batches."""
        if self.stepped is None or self.stepped[0] != call.step:
            self.stepped = (call.step, self._step(call))
        self.policy.save(self.root / f"v{call.step + 1}")
        self.policy.save_state(self.root / f"v{call.step + 1}.state")
        return self.stepped[1]

    def _step(self, call: TrainStep) -> StepStats:
        samples, rewards, skipped = self.samples(call.envelopes)
        temperature = self.spec.temperature
        stepped: dict[str, Any] = {}
        if samples:
            stepped = dict(self.policy.train_step(samples, temperature))
            stepped["samples"] = int(stepped["samples"])
            stepped["tokens"] = int(stepped["tokens"])
        return StepStats(
            **stepped,
            reward_mean=sum(rewards) / len(rewards) if rewards else None,
            skipped_batches=skipped,
            ranks=self.policy.ranks.world,
            dropped_heldout_groups=self.dropped_heldout,
        )

    def evaluate(self, call: Evaluate) -> HeldOutScores:
        scores = self.heldout.evaluate_dir(
            call.model_dir,
            draws=self.spec.heldout_draws,
            temperature=self.spec.temperature,
            max_new_tokens=self.spec.max_new_tokens,
        )
        return HeldOutScores(**scores, draws=self.spec.heldout_draws)
