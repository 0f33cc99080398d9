"""The trainer's sections: ``[trainer]`` (its steps, optimizer, held-out evaluation and
pretraining) and ``[diloco]`` (its DiLoCo group, SPEC §15)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Self

from pydantic import Field, field_validator, model_validator

from node.config.section import PeerIds, Section, split_commas


class TrainerConfig(Section):
    """The trainer role: its steps, optimizer, held-out evaluation and objective."""

    steps: int = Field(
        0,
        ge=0,
        description="Stop after this many training steps (0: never).",
        json_schema_extra={"was": "train_steps"},
    )
    batches_per_step: int = Field(
        2, ge=1, le=4096, description="Accepted batches one training step waits for."
    )
    step_wait: float = Field(
        120.0,
        ge=0.5,
        le=86400,
        description="Seconds after which a step trains on the accepted batches it has (at "
        "least one) instead of waiting for batches_per_step.",
    )
    learning_rate: float | None = Field(
        None, gt=0, le=1, description="AdamW learning rate (default: GRPO's default)."
    )
    procs: int = Field(
        1,
        ge=1,
        le=64,
        description="Processes its GRPO step runs in; above 1, torchrun ranks that shard the "
        "policy with FSDP2 (with device cuda, one per GPU of this machine). A DiLoCo member "
        "too (FSDP2 inside it, DiLoCo across members; with objective pretrain, "
        "pretrain_batch must be a multiple of it).",
        json_schema_extra={"was": "train_procs"},
    )
    device: Literal["cpu", "cuda"] = Field(
        "cpu",
        description="Where the policy trains (cuda: NCCL between the ranks).",
        json_schema_extra={"was": "train_device"},
    )
    seed: int = Field(0, ge=0, description="The seed of its optimizer (torch RNG).")
    eval_every: int = Field(
        1, ge=0, le=100_000, description="Held-out evaluation every this many steps (0: never)."
    )
    heldout_per_level: int = Field(
        32, ge=1, le=10_000, description="Held-out tasks per difficulty level."
    )
    heldout_draws: int = Field(
        8,
        ge=1,
        le=1024,
        description="Seeded draws per held-out task at the run's temperature: the sampled "
        "accuracy (their mean reward, the headline figure) and pass@k with k this many; "
        "greedy accuracy is reported beside them.",
    )
    heldout_seed: int = Field(
        0,
        ge=0,
        description="The seed that draws the held-out task set (the same set for every run "
        "that compares against another).",
    )
    objective: Literal["grpo", "pretrain"] = Field(
        "grpo",
        description="What it trains on: grpo (the run's accepted rollouts) or pretrain "
        "(next-token loss on the text file data, in a DiLoCo group: needs [diloco] enabled; "
        "SPEC §22).",
    )
    data: Path | None = Field(
        None,
        description="Pretrain: the UTF-8 text file to pretrain on (tokenized with the model's "
        "tokenizer; each member of the group reads its own contiguous shard).",
        json_schema_extra={"metavar": "PATH"},
    )
    pretrain_seq_len: int = Field(
        64, ge=2, le=1_000_000, description="Pretrain: tokens per training sequence."
    )
    pretrain_batch: int = Field(
        8,
        ge=1,
        le=4096,
        description="Pretrain: sequences per inner step (its AdamW learning rate is "
        "learning_rate, default 3e-4 with this objective).",
    )

    @model_validator(mode="after")
    def _pretrain_batch_splits_over_the_ranks(self) -> Self:
        if self.objective == "pretrain" and self.pretrain_batch % self.procs:
            raise ValueError(
                f"pretrain_batch {self.pretrain_batch} does not split over procs "
                f"{self.procs}: each rank trains on pretrain_batch / procs sequences of "
                "every inner step; make it a multiple"
            )
        return self

    @model_validator(mode="after")
    def _pretrain_needs_data(self) -> Self:
        if self.objective == "pretrain" and self.data is None:
            raise ValueError(
                "objective pretrain needs the text to train on: data = PATH (--trainer.data)"
            )
        if self.data is not None and self.objective != "pretrain":
            raise ValueError("data is the pretraining corpus: it needs objective = pretrain")
        return self


class DilocoConfig(Section):
    """The trainer's DiLoCo group (SPEC §21): each member takes inner steps on its share of
    the accepted batches (or, pretraining, of its text), the group averages every
    inner_steps; the member [run] trainer_peer_id names leads and publishes."""

    enabled: bool = Field(
        False,
        description="Train in a DiLoCo group with the run's other trainers. A trainer started "
        "after its group formed (with an empty data_dir) joins it: it recovers the leader's "
        "state and is admitted at the next outer step.",
        json_schema_extra={"was": "diloco"},
    )
    inner_steps: int = Field(
        4,
        ge=1,
        le=10_000,
        description="Inner steps (H) per outer step: GRPO steps, each on its own slice of the "
        "member's samples of the step, or (objective pretrain) AdamW steps on the next "
        "batches of its shard.",
        json_schema_extra={"was": "diloco_inner_steps"},
    )
    outer_lr: float = Field(
        0.7,
        gt=0,
        le=10,
        description="The outer (Nesterov SGD) learning rate.",
        json_schema_extra={"was": "diloco_outer_lr"},
    )
    momentum: float = Field(
        0.9,
        ge=0,
        le=0.99,
        description="The outer Nesterov momentum (0: none).",
        json_schema_extra={"was": "diloco_momentum"},
    )
    quant: Literal["int8", "fp32", "sparse"] = Field(
        "int8",
        description="Encoding of pseudo-gradients in the all-reduce (sparse: top-k of every "
        "4096 values at 2 bits, with error feedback).",
        json_schema_extra={"was": "diloco_quant"},
    )
    sparse_k: int = Field(
        384,
        ge=1,
        le=4096,
        description="quant sparse: values sent of every block of 4096 (the group must agree).",
    )
    members: int = Field(
        1,
        ge=1,
        le=64,
        description="Leader: members the group's first roster waits for.",
        json_schema_extra={"was": "diloco_members"},
    )
    join_timeout: float = Field(
        120.0,
        ge=1,
        le=86_400,
        description="Leader: seconds an outer step waits, once every member is there, for "
        "trainers that announced they are joining (they recover the group's state first: set "
        "it above that transfer's time; a joiner later than this comes in at a later step).",
        json_schema_extra={"was": "diloco_join_timeout"},
    )
    admit: PeerIds = Field(
        default_factory=list,
        description="Leader: peer ids of the members it admits to the group (comma-separated "
        "in the environment; empty: any trainer of the run).",
        json_schema_extra={"metavar": "PEER_ID", "was": "diloco_admit"},
    )

    @field_validator("admit", mode="before")
    @classmethod
    def _admit_commas(cls, v: Any) -> Any:
        return split_commas(v)
