"""A pretraining DiLoCo member's model: the child process of ``--trainer.objective pretrain`` (SPEC
§22).

Where the data comes from: the text file ``--trainer.data``, tokenized here once with the model's
tokenizer (``node/diloco/corpus.py`` cuts it into the group's shards). The child holds the
model in fp32 (``node/training/policy.py``: loading and complete model directories), its
inner AdamW, the outer copy ``θ`` and momentum ``b`` (``node/diloco/outer.py``), and the data
position. The role (``node/roles/services/pretrainer.py``) calls, per outer step n:

1. ``UseShard`` once, after the group formed (or from the role's record after a restart):
   which shard this member reads;
2. ``PretrainInner``: ``H`` AdamW steps of next-token cross-entropy (``node/diloco/inner.py``'s
   ``inner_step``) on the next ``H`` batches of the shard; the data position advances by H;
3. ``PseudoGradient`` / ``OuterApply`` as in the GRPO objective (``node/roles/children/grouppolicy.py``):
   ``Δ = θ − θ_after``; then the group's average makes the Nesterov step and checkpoint
   ``n + 1`` is written: the model directory ``v{n+1}`` (what the leader publishes) and the
   member's whole DiLoCo state ``v{n+1}.diloco`` (``node/diloco/state.py``: θ, b, AdamW,
   the outer step and the data position). A restarted child loads both: it continues
   exactly where it stopped, in the same place of its shard.

Where the weights go next: the leader publishes ``v{n+1}`` over SHARDCAST.

With ``[trainer] procs`` > 1 the same worker runs on every torchrun rank
(``node/training/ranks.py``) over the FSDP2-sharded model: rank r trains on rows r, r + N, …
of every batch, and the outer state is kept by rows as for a GRPO member
(``node/roles/children/grouppolicy.py``, ``node/diloco/shards.py``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.config import NodeConfig
from node.diloco.corpus import CorpusError, Shard, read_text, spans
from node.roles.children.grouppolicy import (
    Delta,
    OuterApply,
    PackState,
    PseudoGradient,
    Recover,
    Recovered,
)

DEFAULT_LR = 3e-4


@dataclass(frozen=True)
class PretrainSpec:
    base: str  # the base model directory (version 0; tokenizer files)
    checkpoints: str  # where ``v{n}`` and ``v{n}.diloco`` are written
    step: int  # the outer step (version) to start from
    data: str  # the text file
    lr: float
    seq_len: int
    batch: int
    inner_steps: int  # H
    outer_lr: float
    outer_momentum: float
    seed: int
    min_shards: int  # the members the group forms with at least (checked before it forms)
    device: str = "cpu"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PretrainSpec:
        return cls(**d)

    @classmethod
    def of(cls, cfg: NodeConfig, checkpoints: Path, step: int) -> PretrainSpec:
        return cls(
            base=str(cfg.run.model),
            checkpoints=str(checkpoints),
            step=step,
            data=str(cfg.trainer.data),
            lr=DEFAULT_LR if cfg.trainer.learning_rate is None else cfg.trainer.learning_rate,
            seq_len=cfg.trainer.pretrain_seq_len,
            batch=cfg.trainer.pretrain_batch,
            inner_steps=cfg.diloco.inner_steps,
            outer_lr=cfg.diloco.outer_lr,
            outer_momentum=cfg.diloco.momentum,
            seed=cfg.trainer.seed,
            min_shards=cfg.diloco.members,
            device=cfg.trainer.device,
        )


@dataclass(frozen=True)
class UseShard:
    """Read shard ``index`` of ``count``; the answer is ``ShardInfo``."""

    index: int
    count: int


@dataclass(frozen=True)
class ShardInfo:
    shard: dict[str, Any]  # Shard.as_dict(): shard, shards, tokens [lo, hi)
    text_tokens: int
    position: int


@dataclass(frozen=True)
class PretrainInner:
    """The inner phase of outer step ``step``; ``train`` False: a joiner's first outer step
    (it has no shard before the roster that admits it): nothing is read or trained, the
    data position advances by H as every member's does (a zero pseudo-gradient)."""

    step: int
    train: bool = True


@dataclass(frozen=True)
class InnerStats:
    loss: float | None  # mean next-token loss over the H inner steps (None: none taken)
    tokens: int  # target tokens trained on
    position: int  # batches of the shard consumed after the phase
    read: list[list[int]]  # the token ranges [a, b) of the text the phase read
    seconds: float


def group_layout(params_layout: str, text_digest: str) -> str:
    """The layout a pretraining member declares to the leader: the parameters' and the
    tokenized text's together, so a member with another text (or tokenizer) is refused."""
    return hashlib.sha256(f"{params_layout}|text:{text_digest}".encode()).hexdigest()[:32]


def state_path(checkpoints: Path, version: int) -> Path:
    return checkpoints / f"v{version}.diloco"


class PretrainWorker:
    """The model, its optimizers and its place in the text, in the role's child process (or
    on each torchrun rank, over a sharded model: see the module docstring)."""

    SPEC = PretrainSpec
    CALLS: tuple[type, ...] = (
        UseShard,
        PretrainInner,
        PseudoGradient,
        OuterApply,
        PackState,
        Recover,
    )

    def __init__(self, spec: PretrainSpec, *, distributed: bool = False) -> None:
        import torch

        from node.diloco.inner import InnerConfig
        from node.diloco.outer import OuterConfig, OuterState
        from node.diloco.state import load_state
        from node.training.grpo import GRPOConfig
        from node.training.policy import Policy

        torch.manual_seed(spec.seed)
        self.spec = spec
        self.root = Path(spec.checkpoints)
        self.inner_cfg = InnerConfig(lr=spec.lr, batch=spec.batch, seq_len=spec.seq_len)
        start = Path(spec.base) if spec.step == 0 else self.root / f"v{spec.step}"
        self.policy = Policy(
            start,
            GRPOConfig(lr=spec.lr),
            device=spec.device,
            seed=spec.seed,
            distributed=distributed,
        )
        if spec.batch % self.policy.ranks.world:
            raise ValueError(
                f"a batch of {spec.batch} sequences does not split over "
                f"{self.policy.ranks.world} ranks"
            )
        self.policy.base_dir = Path(spec.base)  # tokenizer files come from the base
        self.model = self.policy.model
        self.outer = OuterState.of(self.model, OuterConfig(spec.outer_lr, spec.outer_momentum))
        self.position = 0
        if spec.step > 0:
            saved = state_path(self.root, spec.step)
            if not saved.exists():
                raise CorpusError(f"checkpoint {spec.step} has no DiLoCo state ({saved})")
            self.position = load_state(saved.read_bytes(), self.model, self.outer, self.opt)
            if self.outer.step != spec.step:
                raise ValueError(f"{saved} is the state of outer step {self.outer.step}")
        ids = self.policy.tokenizer(read_text(Path(spec.data)), add_special_tokens=False)
        self.tokens = torch.tensor(ids["input_ids"], dtype=torch.long)
        self.text_digest = hashlib.sha256(self.tokens.numpy().astype("<i8").tobytes()).hexdigest()
        Shard.of(len(self.tokens), 0, spec.min_shards, spec.seq_len, spec.batch)  # the smallest
        self.shard: Shard | None = None

    @property
    def opt(self) -> Any:
        return self.policy.optimizer

    def __call__(self, call: Any) -> Any:
        if isinstance(call, UseShard):
            spec = self.spec
            self.shard = Shard.of(
                len(self.tokens), call.index, call.count, spec.seq_len, spec.batch
            )
            return ShardInfo(self.shard.as_dict(), len(self.tokens), self.position)
        if isinstance(call, PretrainInner):
            return self.inner(call)
        if isinstance(call, PseudoGradient):
            from node.diloco.outer import layout_of, params_hash

            vector = self.outer.pseudo_gradient(self.model)
            return Delta(
                vector,
                params_hash(self.outer.whole_params()),
                group_layout(layout_of(self.model), self.text_digest),
            )
        if isinstance(call, OuterApply):
            return self.apply(call)
        if isinstance(call, PackState):
            from node.diloco.state import pack_state

            return pack_state(self.model, self.outer, self.opt, self.position)
        if isinstance(call, Recover):
            return self.recover(call)
        raise TypeError(f"PretrainWorker does not take {type(call).__name__}")

    def batch(self, starts: list[int]) -> Any:
        """The sequences at ``starts`` this rank trains on: ``[B / ranks, T + 1]`` token ids
        (rank r takes every ranks-th row from row r; all of them in one process)."""
        import torch

        t = self.spec.seq_len + 1
        ranks = self.policy.ranks
        rows = [self.tokens[s : s + t] for s in starts[ranks.rank :: ranks.world]]
        return torch.stack(rows).to(self.policy.device)

    def inner(self, call: PretrainInner) -> InnerStats:
        import time

        from node.diloco.inner import inner_step

        if call.step != self.outer.step:
            raise ValueError(
                f"inner phase of step {call.step} asked, the model is at {self.outer.step}"
            )
        if not call.train:
            self.position += self.spec.inner_steps
            return InnerStats(None, 0, self.position, [], 0.0)
        if self.shard is None:
            raise ValueError("no shard chosen yet (UseShard)")
        began, first = time.perf_counter(), self.position
        losses: list[float] = []
        used: list[int] = []  # the starts of every sequence trained on
        for _ in range(self.spec.inner_steps):
            starts = self.shard.starts(self.position)
            loss = inner_step(self.model, self.opt, self.batch(starts), self.inner_cfg)
            losses.append(self.policy.mean_over_ranks(loss))
            used += starts
            self.position += 1
        return InnerStats(
            loss=sum(losses) / len(losses),
            tokens=self.shard.tokens_seen(self.position - first),
            position=self.position,
            read=spans(used, self.spec.seq_len),  # from the starts it used, not recomputed
            seconds=time.perf_counter() - began,
        )

    def recover(self, call: Recover) -> Recovered:
        """A joiner's state from the leader (θ, b, AdamW, step, data position): loaded into
        both parameter copies, checked, written as checkpoint ``call.version``."""
        from node.diloco.outer import params_hash
        from node.diloco.state import load_state, state_hash

        position = load_state(call.data, self.model, self.outer, self.opt)
        if self.outer.step != call.version:
            raise ValueError(f"a state of version {self.outer.step}, not {call.version}")
        self.position = position
        packed = self._save(call.version)
        model_hash = params_hash(self.outer.shards.model_wholes(self.model))
        return Recovered(call.version, state_hash(packed), model_hash, self.position)

    def apply(self, call: OuterApply) -> str:
        """The outer step; checkpoint ``step + 1`` (model directory and state); the hash of
        the new parameters."""
        from node.diloco.outer import params_hash

        if self.outer.step != call.step:
            raise ValueError(f"outer step {call.step} asked, the model is at {self.outer.step}")
        self.outer.apply(self.model, call.average, alone=call.alone)
        self._save(call.step + 1)
        return params_hash(self.outer.shards.model_wholes(self.model))

    def _save(self, version: int) -> bytes:
        """Checkpoint ``version``: the model directory and the whole DiLoCo state (every
        rank gathers, rank 0 writes); the packed state."""
        from node.diloco.state import pack_state, save_checkpoint

        self.policy.save(self.root / f"v{version}")
        packed = pack_state(self.model, self.outer, self.opt, self.position)
        if self.policy.ranks.main:
            save_checkpoint(state_path(self.root, version), packed)
        return packed
