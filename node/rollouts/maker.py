"""The worker's batch maker: the inference role's child process (``node/roles/offload.py``).

Where the rollout starts: the inference role (``node/roles/inference.py``) picks the step
and the policy version and calls ``MakeBatch``; here the engine (``node/engine/``: seeded
sampling, TOPLOC proofs) generates ``group_size`` samples for each assigned task
(``node/rollouts/generate.py``), the task's verifier scores them, and the batch goes back
encoded and unsigned (``protocol/rollouts.py``). Where it goes next: the role signs,
stores, announces and submits it.

``MakeBatch.cheat`` (tests and the devnet's ``--cheaters`` only, refused without
``dev_cheats``): the cheat this batch makes, from ``node/rollouts/cheats.py`` (other or
cheaper weights, other sampling, other tasks or rollouts, edits after proving); the
role's own cheats (which weights, units, keys, serving) reach here as ``none``.
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
    verify_profile: str = "gpu-bf16"  # the run's: tells a test cheat that no check can see
    device: str = "auto"  # where the engine computes (its dtype follows: engine_dtype)

    @classmethod
    def of(cls, cfg: NodeConfig) -> MakerSpec:
        return cls(
            taskset=cfg.taskset,
            tasks_per_batch=cfg.tasks_per_batch,
            group_size=cfg.group_size,
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            engine_batch=cfg.engine_batch,
            verify_profile=cfg.verify_profile,
            device=cfg.device,
        )


@dataclass(frozen=True)
class MakeBatch:
    """Generate the batch of ``step`` for ``worker`` with the policy in ``model_dir``."""

    model_dir: str
    worker: str  # lower-case 0x address
    step: int
    version: int  # the policy version of ``model_dir``
    header: dict[str, Any]  # the node's message header (run id, sender, seq, time)
    cheat: str = "none"  # tests only: the cheat this batch makes (``node/rollouts/cheats.py``)


@dataclass(frozen=True)
class MadeBatch:
    encoded: bytes  # a ``RolloutBatch``, unsigned (the node signs it)
    # the cheat asked for could not be made: no check could tell it from honest work (greedy
    # decoding of a policy so peaked that it differs from the seeded draws only at near-ties
    # within the noise, or nowhere), so this is the honest batch, and the worker makes the
    # cheat again on its next batch
    unchanged: bool = False
    seconds: float = 0.0  # generating, proving and scoring it (loading the engine excluded)


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
        self.engines: dict[tuple[str, str], tuple[Any, Any]] = {}  # (dir, weights) -> engine

    def _engine(self, model_dir: str, cheat: str) -> tuple[Any, Any]:
        """(engine, tokenizer) of the policy in ``model_dir`` (switched between batches),
        with the weights ``cheat`` uses; the newest two stay loaded."""
        from node.engine import open_engine
        from node.engine.models import engine_dtype
        from node.rollouts.cheats import WEIGHT_CHEATS, alter_weights

        weights = cheat if cheat in WEIGHT_CHEATS else "none"
        if (model_dir, weights) not in self.engines:
            engine, tokenizer = open_engine(
                model_dir,
                backend="torch",
                max_batch=self.spec.engine_batch,
                device=self.spec.device,
                dtype=engine_dtype(self.spec.verify_profile),
            )
            if weights != "none":
                alter_weights(weights, engine.model)
            self.engines[(model_dir, weights)] = (engine, tokenizer)
            while len(self.engines) > 2:
                del self.engines[next(iter(self.engines))]
        return self.engines[(model_dir, weights)]

    def __call__(self, call: MakeBatch) -> MadeBatch:
        from node.rollouts import cheats
        from node.rollouts.generate import generate_groups, to_batch

        if not isinstance(call, MakeBatch):
            raise TypeError(f"BatchMaker does not take {type(call).__name__}")
        cheat = call.cheat
        engine, tokenizer = self._engine(call.model_dir, cheat)
        worker, step = cheats.source(cheat, call.worker, call.step)
        count = self.spec.tasks_per_batch
        tasks = (
            cheats.easy_tasks(self.taskset, worker, step, count) if cheat == "easy_tasks" else None
        )

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
        groups = generate(cheats.sampled_with(cheat, self.params))
        if (worker, step) != (call.worker, call.step):
            cheats.reseed(groups, call.worker, call.step)
        if cheat != "none":
            cheats.forge(
                cheat,
                groups,
                tokenizer,
                eos=int(tokenizer.eos_token_id),
                vocab=engine.vocab_size,
                chunk=self.params.proof_chunk,
            )

        def batch_of(groups: list[Any]) -> Any:
            return to_batch(
                groups,
                **call.header,
                worker=call.worker,
                step=call.step,
                policy_version=call.version,
                taskset=self.taskset.name,
                params=cheats.claimed_params(cheat, self.params),
            )

        batch = batch_of(groups)
        if cheat == "greedy" and self._undetectable(batch, engine, tokenizer):
            honest = batch_of(generate(self.params)).encode()
            return MadeBatch(honest, unchanged=True, seconds=time.perf_counter() - started)
        return MadeBatch(batch.encode(), seconds=time.perf_counter() - started)

    def _undetectable(self, batch: Any, engine: Any, tokenizer: Any) -> bool:
        """Whether the run's verification accepts ``batch``, checked as a validator would
        (every rollout recomputed with the engine's model): a greedy batch of a policy so
        peaked that greedy decoding differs from the seeded draws only at near-ties within
        the profile's noise (or nowhere) is undetectable by design (SPEC §12.1), so the
        worker sends the honest batch and makes the cheat again later, as it does for a
        version too close to tell apart."""
        from crypto.verdict import profile
        from node.engine.calibration import model_layers
        from node.rollouts.recheck import judge_rollouts

        config = profile(self.spec.verify_profile).for_layers(model_layers(engine.model))
        samples = [(g, s) for g in batch.groups for s in g.samples]
        eos = int(tokenizer.eos_token_id)
        return bool(judge_rollouts(engine.model, eos, batch, samples, config).passed)
