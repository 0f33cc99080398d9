"""The validator's batch checker: the validator role's child process (``node/roles/children/offload.py``).

Where the rollout comes from: the validator (``node/roles/services/validator.py``) fetched the
signed batch, checked who signed it and that it matches its on-chain submission, and
calls ``CheckBatch`` with the model directory of the batch's policy version. Here, the
expensive checks (4 and 5 of the validator's docstring), in this order:

4. the batch samples with the run's temperature and top-p, its tasks are the worker's
   assigned ones (SPEC §12), and every token is in the model's vocabulary (one that is not
   made the tokenizer raise: the batch went unjudged, and its worker unslashed);
5. the proofs: one prefill per rollout (``recompute_batch``) and the proof check of
   ``crypto.verdict.check_batch`` under the run's verification profile (``spot_check`` < 1
   recomputes a share of the rollouts, the same for every validator: seeded by the work
   key and the submission's block hash), then the profile's substitution test: is
   the batch nearer a cheaper copy of the policy (int8 weights) than the policy itself?
6. only then, every reward is what the task's verifier gives the completion. A verifier
   may take seconds on an answer made to be slow (math-verify's timeout is 5 s per
   answer): a fake batch of such answers held the validator a minute before its proofs
   failed it in one; now only a batch whose rollouts the model really sampled gets there.

Where it goes next: the ``Verdict`` (``node/roles/decisions/work.py``) goes back to the validator,
which posts it on-chain (``ledger/client.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from node.roles.decisions.spotcheck import spot_check_sample
from node.roles.decisions.work import Verdict
from protocol.rollouts import RolloutBatch, unpack_tokens

if TYPE_CHECKING:
    from node.config import NodeConfig


@dataclass(frozen=True)
class CheckerSpec:
    """What the child builds its ``BatchChecker`` from."""

    keep: int  # policy versions kept loaded at once
    taskset: str
    verify_profile: str
    spot_check: float  # the share of rollouts recomputed (1: all)
    temperature: float = 1.0  # the run's sampling parameters: a batch must state these
    top_p: float = 1.0
    device: str = "auto"  # where the checker recomputes (its dtype follows: engine_dtype)

    @classmethod
    def of(cls, cfg: NodeConfig) -> CheckerSpec:
        return cls(
            keep=cfg.run.async_level + 2,
            taskset=cfg.run.taskset,
            verify_profile=cfg.run.verify_profile,
            spot_check=cfg.validator.spot_check,
            temperature=cfg.run.temperature,
            top_p=cfg.run.top_p,
            device=cfg.engine.device,
        )


@dataclass(frozen=True)
class CheckBatch:
    """Check the batch in ``envelope`` (already verified by the node) against the weights
    of ``version`` in ``model_dir``."""

    model_dir: str
    version: int
    envelope: bytes
    seed: bytes = b""  # of the spot check (decisions/spotcheck.py); unused at spot_check 1


class BatchChecker:
    """In the validator's child process: the models, tokenizers and the task set."""

    def __init__(self, spec: CheckerSpec) -> None:
        from node.tasks import load_taskset

        self.spec = spec
        self.models: dict[int, tuple[str, Any, Any, Any]] = {}  # version -> (dir, model, tok, cfg)
        self.suspects: Any = None  # the suspects of the model in use only: up to 3 copies of it
        self.taskset = load_taskset(spec.taskset)

    def _use(self, model_dir: str, version: int) -> None:
        """The model of ``version`` (loaded once; the newest ``keep`` versions stay loaded)."""
        from crypto.verdict import profile
        from node.engine.calibration import model_layers
        from node.engine.models import engine_dtype, load_model
        from node.rollouts.suspects import SuspectModels

        if version not in self.models or self.models[version][0] != model_dir:
            dtype = engine_dtype(self.spec.verify_profile)
            loaded = load_model(model_dir, device=self.spec.device, dtype=dtype)
            config = profile(self.spec.verify_profile).for_layers(model_layers(loaded.model))
            self.models[version] = (model_dir, loaded.model, loaded.tokenizer, config)
            while len(self.models) > max(1, self.spec.keep):  # the oldest others first
                del self.models[min(v for v in self.models if v != version)]
        _, self.model, self.tokenizer, self.config = self.models[version]
        if self.suspects is None or self.suspects.model is not self.model:
            self.suspects = SuspectModels(self.model)  # the last version's copies are freed

    def __call__(self, call: CheckBatch) -> Verdict:
        from protocol.wire import open_message

        if not isinstance(call, CheckBatch):
            raise TypeError(f"BatchChecker does not take {type(call).__name__}")
        self._use(call.model_dir, call.version)
        batch = open_message(call.envelope, RolloutBatch)
        if why := self._check_tasks(batch):
            return Verdict.reject("invalid", why)
        verdict = self._check_proofs(batch, call.seed)
        if verdict.accepted and (why := self._check_rewards(batch)):
            return Verdict.reject(
                "invalid", why, rollouts=verdict.rollouts, seconds=verdict.seconds
            )
        return verdict

    def _check_tasks(self, batch: RolloutBatch) -> str | None:
        from node.engine.models import prompt_ids

        if batch.taskset != self.taskset.name:
            return f"task set {batch.taskset!r} is not the run's"
        if (batch.temperature, batch.top_p) != (self.spec.temperature, self.spec.top_p):
            return (
                f"sampled at temperature {batch.temperature}, top-p {batch.top_p}: the run's "
                f"are {self.spec.temperature}, {self.spec.top_p}"
            )
        # an id the tokenizer does not know (past its vocabulary, or in the embedding rows
        # past it) cannot come from an honest worker: its own reward check decodes them
        vocab = min(self.model.get_input_embeddings().num_embeddings, len(self.tokenizer))
        for n, (group, task) in enumerate(zip(batch.groups, self._tasks(batch), strict=True)):
            if group.index != n or group.task_id != task.task_id:
                return f"group {n} is not the assigned task"
            if unpack_tokens(group.prompt) != prompt_ids(self.tokenizer, task.prompt):
                return f"group {n}: prompt differs from the task's"
            for s in group.samples:
                if (top := max(unpack_tokens(s.tokens))) >= vocab:
                    return f"group {n} sample {s.sample}: token {top} is not in the vocabulary"
        return None

    def _check_rewards(self, batch: RolloutBatch) -> str | None:
        for n, (group, task) in enumerate(zip(batch.groups, self._tasks(batch), strict=True)):
            for s in group.samples:
                text = self.tokenizer.decode(unpack_tokens(s.tokens), skip_special_tokens=True)
                if (due := task.reward(text)) != s.reward:
                    return f"group {n} sample {s.sample}: reward {s.reward} claimed, {due} due"
        return None

    def _tasks(self, batch: RolloutBatch) -> list[Any]:
        from node.tasks import assign

        return list(assign(self.taskset, batch.worker, batch.step, len(batch.groups)))

    def _check_proofs(self, batch: RolloutBatch, seed: bytes) -> Verdict:
        from node.rollouts.recheck import judge_rollouts

        started = time.perf_counter()
        samples = [(g, s) for g in batch.groups for s in g.samples]
        if self.spec.spot_check < 1:  # every validator the same ones (decisions/spotcheck.py)
            drawn = spot_check_sample(self.spec.spot_check, len(samples), seed)
            samples = [samples[i] for i in drawn]
        eos = int(self.tokenizer.eos_token_id)
        evidence = judge_rollouts(self.model, eos, batch, samples, self.config, self.suspects)
        rollouts, seconds = len(samples), time.perf_counter() - started
        if evidence.passed:  # how close it came: the pooled sampling statistic and its bound
            pooled = f"sampling statistic {evidence.statistic:.1f}, bound {evidence.bound:.1f}"
            tested = "".join(f"; {t.describe()}" for t in evidence.substitution)
            detail = f"{evidence.reason}: {pooled}{tested}"
            return Verdict.accept(detail, rollouts=rollouts, seconds=seconds)
        return Verdict.reject("invalid", evidence.reason, rollouts=rollouts, seconds=seconds)
