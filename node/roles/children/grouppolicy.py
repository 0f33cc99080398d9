"""A DiLoCo member's policy: the trainer role's child process with ``--diloco.enabled`` (SPEC §15).

The same ``PolicyWorker`` (``node/training/worker.py``) as without DiLoCo, plus the outer
copy of the parameters (``node/diloco/outer.py``: ``θ`` in fp32 and the Nesterov momentum
``b``), and three calls the group role (``node/roles/services/grouptrainer.py``) makes per outer step:

1. ``InnerSteps``: the member's accepted batches of the step become GRPO samples, cut into
   ``H`` contiguous slices (fewer if there are fewer samples), one AdamW step on each: the
   inner phase. No checkpoint is written.
2. ``PseudoGradient``: ``Δ = θ − θ_after`` (flat fp32), the hash of ``θ`` (the leader
   admits only members that start from its own) and the parameter layout.
3. ``OuterApply``: the group's averaged ``Δ`` (from the ring all-reduce) makes one outer
   step on ``θ``; the model's parameters are set from it and checkpoint ``step + 1`` is
   written: the model directory, the inner optimizer's state, and the outer momentum
   (``v{n}.outer``, safetensors) so that a restarted group resumes exactly.

The policy is kept in fp32 (``Policy`` loads it so), so the model's parameters are ``θ``
bit for bit after each outer step, and equal on every member. The pipe to the role carries
only this process's own tensors, never anything from the network.

A member with ``[trainer] procs`` > 1: the same worker on every torchrun rank
(``node/training/ranks.py``, which forwards the role's calls and returns rank 0's answers),
over the FSDP2-sharded policy. Each rank trains on its share of every inner step's samples
and keeps ``θ`` and ``b`` of its own rows of each parameter (``node/diloco/shards.py``):
``PseudoGradient`` gathers the whole ``Δ``, ``OuterApply`` steps each rank's rows of the
whole average, the momentum file and ``PackState`` are whole, ``Recover`` cuts them to the
rows. So the role, the ring and a joiner see the same tensors as from one process.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.diloco.outer import OuterConfig, OuterState, layout_of, params_hash
from node.diloco.state import load_state, pack_state, state_hash
from node.files import write_atomic
from node.training.worker import Evaluate, PolicySpec, PolicyWorker, StepStats, TrainStep


@dataclass(frozen=True)
class GroupSpec:
    policy: PolicySpec
    inner_steps: int  # H
    outer_lr: float
    outer_momentum: float

    @property
    def device(self) -> str:
        return self.policy.device

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GroupSpec:
        return cls(**{**d, "policy": PolicySpec.from_dict(d["policy"])})


@dataclass(frozen=True)
class InnerSteps:
    """The inner phase of outer step ``step`` on the member's batches."""

    step: int
    envelopes: list[bytes]


@dataclass(frozen=True)
class PseudoGradient:
    """``Δ`` of the inner phase just taken."""


@dataclass(frozen=True)
class Delta:
    vector: Any  # torch.Tensor, flat fp32
    state: str  # params_hash of θ (the parameters the step started from)
    layout: str


@dataclass(frozen=True)
class OuterApply:
    """The outer step of ``step`` with the group's average; writes checkpoint ``step + 1``."""

    step: int
    average: Any  # torch.Tensor, flat fp32
    alone: bool  # the average is this member's own (a group of one)


@dataclass(frozen=True)
class PackState:
    """The member's whole DiLoCo state (``node/diloco/state.py``) as bytes: what the leader
    offers joiners at the boundary it stands at."""


@dataclass(frozen=True)
class Recover:
    """Continue from a peer's state (a joiner, ``node/roles/io/joining.py``): load ``data``
    into both parameter copies (the model and ``θ``), the momentum and the inner optimizer;
    it must be the state of policy version ``version``, whose checkpoint is then written."""

    data: bytes
    version: int


@dataclass(frozen=True)
class Recovered:
    version: int
    state_hash: str  # sha256 of the state packed again after loading (the donor's if whole)
    params_hash: str  # of the model's parameters after loading (θ's if both copies were set)
    position: int  # the data position the state held


def momentum_path(checkpoints: Path, version: int) -> Path:
    return checkpoints / f"v{version}.outer"


class GroupPolicyWorker:
    """``PolicyWorker`` and the outer state, in the role's child process (or on each
    torchrun rank, over a sharded policy)."""

    SPEC = GroupSpec
    CALLS: tuple[type, ...] = (
        InnerSteps,
        PseudoGradient,
        OuterApply,
        PackState,
        Recover,
        Evaluate,
        TrainStep,
    )

    def __init__(self, spec: GroupSpec, *, distributed: bool = False) -> None:
        from safetensors.torch import load_file

        self.spec = spec
        self.worker = PolicyWorker(spec.policy, distributed=distributed)
        self.policy = self.worker.policy
        cfg = OuterConfig(spec.outer_lr, spec.outer_momentum)
        self.outer = OuterState.of(self.policy.model, cfg)
        self.outer.step = spec.policy.step
        self.unsaved: int | None = None  # an outer step taken whose checkpoint is not saved
        saved = momentum_path(Path(spec.policy.checkpoints), spec.policy.step)
        if spec.policy.step > 0 and saved.exists():
            tensors = load_file(saved)
            for i, buf in enumerate(self.outer.momentum):
                buf.copy_(self.outer.shards.part(i, tensors[f"momentum.{i}"]))

    def __call__(self, call: Any) -> Any:
        if isinstance(call, InnerSteps):
            return self.inner(call)
        if isinstance(call, PseudoGradient):
            model = self.policy.model
            vector = self.outer.pseudo_gradient(model)
            return Delta(vector, params_hash(self.outer.whole_params()), layout_of(model))
        if isinstance(call, OuterApply):
            return self.apply(call)
        if isinstance(call, PackState):
            return pack_state(self.policy.model, self.outer, self.policy.optimizer, 0)
        if isinstance(call, Recover):
            return self.recover(call)
        if isinstance(call, (Evaluate, TrainStep)):
            return self.worker(call)
        raise TypeError(f"GroupPolicyWorker does not take {type(call).__name__}")

    def inner(self, call: InnerSteps) -> StepStats:
        """Up to ``H`` AdamW steps, each on its own contiguous slice of the samples."""
        samples, rewards, skipped = self.worker.samples(call.envelopes)
        h = min(self.spec.inner_steps, len(samples))
        base, extra = divmod(len(samples), h) if h else (0, 0)
        steps: list[dict[str, float]] = []
        start = 0
        for i in range(h):
            end = start + base + (1 if i < extra else 0)
            steps.append(self.policy.train_step(samples[start:end], self.spec.policy.temperature))
            start = end
        mean = (lambda k: sum(s[k] for s in steps) / len(steps)) if steps else (lambda k: None)
        return StepStats(
            samples=len(samples),
            tokens=int(sum(s["tokens"] for s in steps)),
            loss=mean("loss"),
            grad_norm=mean("grad_norm"),
            clip_frac=mean("clip_frac"),
            ratio_mean=mean("ratio_mean"),
            kl=mean("kl"),
            seconds=sum(s["seconds"] for s in steps) if steps else None,
            reward_mean=sum(rewards) / len(rewards) if rewards else None,
            skipped_batches=skipped,
            ranks=self.policy.ranks.world,
            dropped_heldout_groups=self.worker.dropped_heldout,
        )

    def recover(self, call: Recover) -> Recovered:
        """A joiner's state from the leader: loaded, checked, written as checkpoint
        ``call.version`` (a restart resumes from it as from its own)."""
        position = load_state(call.data, self.policy.model, self.outer, self.policy.optimizer)
        if self.outer.step != call.version:
            raise ValueError(f"a state of version {self.outer.step}, not {call.version}")
        self._save(call.version)
        packed = pack_state(self.policy.model, self.outer, self.policy.optimizer, position)
        model_hash = params_hash(self.outer.shards.model_wholes(self.policy.model))
        return Recovered(call.version, state_hash(packed), model_hash, position)

    def apply(self, call: OuterApply) -> str:
        """The outer step; checkpoint ``step + 1``; the hash of the new parameters. The
        same call again after the checkpoint failed to save (an ``OSError``: a full disk)
        only saves: the parameters already took the step."""
        if self.unsaved != call.step + 1:
            if self.outer.step != call.step:
                raise ValueError(
                    f"outer step {call.step} asked, the policy is at {self.outer.step}"
                )
            self.outer.apply(self.policy.model, call.average, alone=call.alone)
            self.unsaved = call.step + 1
        self._save(call.step + 1)
        self.unsaved = None
        return params_hash(self.outer.shards.model_wholes(self.policy.model))

    def _save(self, version: int) -> None:
        """Checkpoint ``version``: the model directory, the inner optimizer's state and the
        outer momentum (``v{n}.outer``)."""
        from safetensors.torch import save

        root = Path(self.spec.policy.checkpoints)
        self.policy.save(root / f"v{version}")
        self.policy.save_state(root / f"v{version}.state")
        whole = self.outer.whole_momentum()  # every rank gathers; rank 0 writes
        if self.policy.ranks.main:
            momentum = {f"momentum.{i}": b.contiguous() for i, b in enumerate(whole)}
            write_atomic(momentum_path(root, version), save(momentum))
