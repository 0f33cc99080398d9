"""What every generation engine takes and returns.

An engine turns prompts (token ids) and per-sequence sampling seeds into output tokens,
the log-probability of each chosen token under the sampling distribution
(``log_softmax(logits / temperature)``; plain ``log_softmax(logits)`` when greedy), the
finish reason and, when asked, the TOPLOC proofs of the post-final-norm hidden states.
Sampling is the verifiable seeded Gumbel-max of ``crypto.sampling``, so a validator can
check every token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from crypto.toploc import DEFAULT_CHUNK, DEFAULT_TOPK


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    stop_at_eos: bool = True  # False generates exactly max_new_tokens (benchmarks)
    prove: bool = True
    proof_chunk: int = DEFAULT_CHUNK
    proof_topk: int = DEFAULT_TOPK

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.proof_chunk < 1:
            raise ValueError("proof_chunk must be >= 1")
        if not 1 <= self.proof_topk <= 4096:
            raise ValueError("proof_topk must be in 1..4096")


@dataclass(frozen=True)
class GenRequest:
    prompt: list[int]
    seed: int


@dataclass
class GenResult:
    prompt: list[int]
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (EOS) or "length"
    seed: int
    proofs: list[bytes] = field(default_factory=list)


class Engine(Protocol):
    name: str
    eos_token_ids: frozenset[int]
    vocab_size: int

    def generate(self, requests: list[GenRequest], params: SamplingParams) -> list[GenResult]:
        """Results in the order of ``requests``."""
        ...
