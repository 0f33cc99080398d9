"""The worker's batch maker: the inference role's child process (``node/roles/children/offload.py``).

Where the rollout starts: the inference role (``node/roles/services/inference.py``) picks the step
and the policy version and calls ``MakeBatch``; here the engine (``node/engine/``: seeded
sampling, TOPLOC proofs) generates ``group_size`` samples for each assigned task
(``node/rollouts/generate.py``), the task's verifier scores them, and the batch goes back
encoded and unsigned (``protocol/rollouts.py``). Where it goes next: the role signs,
stores, announces and submits it.
"""

from __future__ import annotations

import time
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
    verify_profile: str = "gpu-bf16"  # the run's: the engine computes in its dtype
    device: str = "auto"  # where the engine computes (its dtype follows: engine_dtype)
    top_p: float = 1.0  # the run's nucleus

    @classmethod
    def of(cls, cfg: NodeConfig) -> MakerSpec:
        return cls(
            taskset=cfg.run.taskset,
            tasks_per_batch=cfg.run.tasks_per_batch,
            group_size=cfg.run.group_size,
            max_new_tokens=cfg.run.max_new_tokens,
            temperature=cfg.run.temperature,
            engine_batch=cfg.engine.batch,
            verify_profile=cfg.run.verify_profile,
            device=cfg.engine.device,
            top_p=cfg.run.top_p,
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
    seconds: float = 0.0  # generating, proving and scoring it (loading the engine excluded)


class BatchMaker:
    """In the inference role's child process: the engine, the task set, generation, scoring."""

    def __init__(self, spec: MakerSpec) -> None:
        from node.engine.base import SamplingParams
        from node.tasks import load_taskset

        self.spec = spec
        self.taskset = load_taskset(spec.taskset)
        self.params = SamplingParams(
            max_new_tokens=spec.max_new_tokens, temperature=spec.temperature, top_p=spec.top_p
        )
        self.engines: dict[str, tuple[Any, Any]] = {}  # model dir -> (engine, tokenizer)

    def open(self, model_dir: str) -> tuple[Any, Any]:
        """A new (engine, tokenizer) of the policy in ``model_dir``, on the spec's device in
        the dtype of the run's verification profile."""
        from node.engine import open_engine
        from node.engine.models import engine_dtype

        engine, tokenizer = open_engine(
            model_dir,
            backend="torch",
            max_batch=self.spec.engine_batch,
            device=self.spec.device,
            dtype=engine_dtype(self.spec.verify_profile),
        )
        return engine, tokenizer

    def engine(self, model_dir: str) -> tuple[Any, Any]:
        """(engine, tokenizer) of the policy in ``model_dir`` (switched between batches);
        the newest two stay loaded."""
        if model_dir not in self.engines:
            self.engines[model_dir] = self.open(model_dir)
            while len(self.engines) > 2:
                del self.engines[next(iter(self.engines))]
        return self.engines[model_dir]

    def __call__(self, call: MakeBatch) -> MadeBatch:
        from node.rollouts.generate import generate_groups

        if not isinstance(call, MakeBatch):
            raise TypeError(f"BatchMaker does not take {type(call).__name__}")
        engine, tokenizer = self.engine(call.model_dir)
        started = time.perf_counter()
        groups = generate_groups(
            engine,
            tokenizer,
            self.taskset,
            worker=call.worker,
            step=call.step,
            count=self.spec.tasks_per_batch,
            group_size=self.spec.group_size,
            params=self.params,
        )
        batch = self.to_batch(groups, call, self.params)
        return MadeBatch(batch.encode(), seconds=time.perf_counter() - started)

    def to_batch(self, groups: list[Any], call: MakeBatch, params: Any) -> Any:
        """The unsigned ``RolloutBatch`` of ``groups`` for ``call``'s worker, step and
        policy version, stating the sampling ``params``."""
        from node.rollouts.generate import to_batch

        return to_batch(
            groups,
            **call.header,
            worker=call.worker,
            step=call.step,
            policy_version=call.version,
            taskset=self.taskset.name,
            params=params,
        )
