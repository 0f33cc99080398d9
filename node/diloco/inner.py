"""The inner phase of a DiLoCo member: ``H`` AdamW steps of next-token pretraining.

Tokens are the bytes of a text corpus (the tiny models here have a 256-token vocabulary,
so byte ``b`` is token ``b``). Member ``m`` of a group with ``k`` data shards reads windows
whose starts come from a generator seeded by ``(seed, m)`` and advanced once per batch, so
``position`` (the batches consumed) is the whole data state: a member recovered from a peer
resumes exactly where that peer's stream stands. The GRPO objective of the trainer role
feeds the same outer step through ``node.training``; this is the pretraining objective that
INTELLECT-1 ran and that the tests and ``bench/diloco.py`` use.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class InnerConfig:
    lr: float = 3e-3
    batch: int = 8  # sequences per inner step
    seq_len: int = 64  # tokens per sequence
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0


class Corpus:
    """A byte corpus and the data stream of one shard (``shard`` of the run's seed)."""

    def __init__(self, data: bytes, *, seed: int, shard: int) -> None:
        if len(data) < 2:
            raise ValueError("corpus needs at least 2 bytes")
        self.tokens = torch.tensor(list(data), dtype=torch.long)
        self.seed, self.shard = seed, shard
        self.position = 0  # batches consumed

    @classmethod
    def from_path(cls, path: Path, *, seed: int, shard: int) -> Corpus:
        return cls(Path(path).read_bytes(), seed=seed, shard=shard)

    def batch(self, n: int, seq_len: int) -> torch.Tensor:
        """The next batch ``[n, seq_len + 1]`` of this shard's stream."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.shard * 7919 + self.position)
        span = min(seq_len + 1, len(self.tokens))
        starts = torch.randint(0, len(self.tokens) - span + 1, (n,), generator=g)
        self.position += 1
        return torch.stack([self.tokens[s : s + span] for s in starts.tolist()])


def make_optimizer(model: torch.nn.Module, cfg: InnerConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)


def inner_step(
    model: torch.nn.Module, opt: torch.optim.Optimizer, batch: torch.Tensor, cfg: InnerConfig
) -> float:
    """One AdamW step of next-token cross-entropy on ``batch`` ``[n, T+1]``; the loss."""
    model.train()
    logits = model(input_ids=batch[:, :-1]).logits  # [n, T, vocab]
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), batch[:, 1:].reshape(-1)
    )
    opt.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    opt.step()
    model.eval()
    return float(loss.item())


@torch.no_grad()
def eval_loss(model: torch.nn.Module, batch: torch.Tensor) -> float:
    logits = model(input_ids=batch[:, :-1]).logits
    return float(
        torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), batch[:, 1:].reshape(-1)
        )
    )
