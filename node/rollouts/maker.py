"""The worker's batch maker: the inference role's child process (``node/roles/offload.py``).

Where the rollout starts: the inference role (``node/roles/inference.py``) picks the step
and the policy version and calls ``MakeBatch``; here the engine (``node/engine/``: seeded
sampling, TOPLOC proofs) generates ``group_size`` samples for each assigned task
(``node/rollouts/generate.py``), the task's verifier scores them, and the batch goes back
encoded and unsigned (``protocol/rollouts.py``). Where it goes next: the role signs,
stores, announces and submits it.

``cheat`` (tests and the devnet's ``--cheaters`` only): ``other_weights`` generates with
perturbed weights, ``edit_token`` changes one output token after proving,
``inflate_reward`` claims reward 1 for every sample (``withhold`` is the role's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from node.config import NodeConfig


@dataclass(frozen=True)
class MakerSpec:
    """What the child builds its ``BatchMaker`` from."""

    taskset: str
    tasks_per_batch: int
    group_size: int
    max_new_tokens: int
    temperature: float
    engine_batch: int  # sequences the engine generates at once
    cheat: str = "none"

    @classmethod
    def of(cls, cfg: NodeConfig) -> MakerSpec:
        return cls(
            taskset=cfg.taskset,
            tasks_per_batch=cfg.tasks_per_batch,
            group_size=cfg.group_size,
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            engine_batch=cfg.engine_batch,
            cheat=cfg.cheat,
        )


@dataclass(frozen=True)
class MakeBatch:
    """Generate the batch of ``step`` for ``worker`` with the policy in ``model_dir``."""

    model_dir: str
    worker: str  # lower-case 0x address
    step: int
    version: int  # the policy version of ``model_dir``
    header: dict[str, Any]  # the node's message header (run id, sender, seq, time)


@dataclass(frozen=True)
class MadeBatch:
    encoded: bytes  # a ``RolloutBatch``, unsigned (the node signs it)


class BatchMaker:
    """In the inference role's child process: the engine, the task set, generation, scoring."""

    def __init__(self, spec: MakerSpec) -> None:
        from node.engine.base import SamplingParams
        from node.tasks import load_taskset

        self.spec = spec
        self.taskset = load_taskset(spec.taskset)
        self.params = SamplingParams(
            max_new_tokens=spec.max_new_tokens, temperature=spec.temperature
        )
        self.engine: Any = None
        self.tokenizer: Any = None
        self.model_dir = ""

    def _load(self, model_dir: str) -> None:
        """Switch to the policy in ``model_dir`` (between batches)."""
        from node.engine import open_engine

        self.engine, self.tokenizer = open_engine(
            model_dir, backend="torch", max_batch=self.spec.engine_batch
        )
        self.model_dir = model_dir
        if self.spec.cheat == "other_weights":
            _perturb(self.engine.model)

    def __call__(self, call: MakeBatch) -> MadeBatch:
        from node.rollouts.generate import generate_groups, to_batch

        if not isinstance(call, MakeBatch):
            raise TypeError(f"BatchMaker does not take {type(call).__name__}")
        if call.model_dir != self.model_dir:
            self._load(call.model_dir)
        groups = generate_groups(
            self.engine,
            self.tokenizer,
            self.taskset,
            worker=call.worker,
            step=call.step,
            count=self.spec.tasks_per_batch,
            group_size=self.spec.group_size,
            params=self.params,
        )
        if self.spec.cheat == "inflate_reward":
            for g in groups:
                g.rewards = [1.0] * len(g.rewards)
        if (
            self.spec.cheat == "edit_token"
        ):  # after proving; the reward claimed is the edited text's
            g, r = groups[0], groups[0].results[0]
            i = len(r.tokens) // 2
            r.tokens[i] = 3 + (r.tokens[i] - 3 + 1) % (self.engine.vocab_size - 3)
            g.completions[0] = self.tokenizer.decode(r.tokens, skip_special_tokens=True)
            g.rewards[0] = g.task.reward(g.completions[0])
        batch = to_batch(
            groups,
            **call.header,
            worker=call.worker,
            step=call.step,
            policy_version=call.version,
            taskset=self.taskset.name,
            params=self.params,
        )
        return MadeBatch(batch.encode())


def _perturb(model: Any) -> None:
    """Other weights: every parameter redrawn with the same spread (a test cheat: the same
    architecture, another model)."""
    import torch

    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            spread = p.float().std().clamp_min(1e-3) if p.numel() > 1 else torch.tensor(1.0)
            p.copy_((torch.randn(p.shape, generator=g) * spread).to(p.device, p.dtype))
