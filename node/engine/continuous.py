"""Continuous batching over the lean Llama-family forward (``fastpath.SlotDecoder``).

Up to ``slots`` sequences are in flight. Each step samples the next token of every active
row, retires the rows whose sequence ended (the last row moves into the freed one, so the
batch stays dense), and runs one decode step. Waiting requests are prefilled into free
rows, longest prompts last, when a quarter of the rows is free or none is busy: one prefill
for several newcomers instead of one per freed row.

Per row the decode states (post-final-norm hidden states; bf16, which is what TOPLOC
rounds to) are kept in one buffer ``[slots, max_new_tokens, hidden]``; a retiring
sequence takes a copy of its rows, and all sequences are proven together at the end.
"""

from __future__ import annotations

from typing import Any

import torch

from crypto.sampling import gumbel_noise_rows, sample_tokens
from node.engine.base import GenRequest, SamplingParams
from node.engine.fastpath import SlotDecoder


def chosen_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p(token) under the sampling distribution, for logits [B, V] and tokens [B]."""
    scaled = logits.float() / temperature if temperature > 0 else logits.float()
    return torch.log_softmax(scaled, dim=-1).gather(1, tokens[:, None])[:, 0]


def decode_states(
    model: Any, slots: int, params: SamplingParams, device: torch.device
) -> torch.Tensor | None:
    """Each row's decode states ``[slots, max_new_tokens, hidden]`` (bf16, what TOPLOC
    rounds to), or None when nothing is proven."""
    if not params.prove:
        return None
    shape = (slots, params.max_new_tokens, model.config.hidden_size)
    return torch.empty(shape, dtype=torch.bfloat16, device=device)


class Flight:
    """The sequences of one ``generate`` call and the rows they occupy."""

    def __init__(
        self,
        model: Any,
        reqs: list[GenRequest],
        params: SamplingParams,
        *,
        slots: int,
        eos_token_ids: frozenset[int],
        vocab_size: int,
    ) -> None:
        slots = min(slots, len(reqs))
        longest = max(len(r.prompt) for r in reqs)
        dec = SlotDecoder(model, slots, longest + params.max_new_tokens)
        states = decode_states(model, slots, params, dec.device)
        self._start(dec, states, reqs, params, slots, eos_token_ids, vocab_size)
        self.logits = self._no_logits()  # [active, V]: each row's next-token logits

    def _start(
        self,
        dec: SlotDecoder,
        states: torch.Tensor | None,
        reqs: list[GenRequest],
        params: SamplingParams,
        slots: int,
        eos_token_ids: frozenset[int],
        vocab_size: int,
    ) -> None:
        self.reqs, self.params, self.eos = reqs, params, eos_token_ids
        self.dec, self.states, self.slots = dec, states, slots
        self.device, self.vocab_size = dec.device, vocab_size
        self.waiting = sorted(range(len(reqs)), key=lambda i: len(reqs[i].prompt), reverse=True)
        self.owner: list[int] = []  # row -> request index
        self.tokens: list[list[int]] = [[] for _ in reqs]
        self.logprobs: list[list[float]] = [[] for _ in reqs]
        self.finish = ["length"] * len(reqs)
        self.prefill: list[torch.Tensor | None] = [None] * len(reqs)
        self.decode: list[torch.Tensor | None] = [None] * len(reqs)
        self.next: list[int] = []  # each row's last sampled token

    def _no_logits(self) -> torch.Tensor:
        return torch.empty((0, self.vocab_size), device=self.device, dtype=self.dec.dtype)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.dec.active)

    def admit(self) -> None:
        """Prefill waiting requests into free rows, when enough rows are free."""
        free = self.slots - self.dec.active
        if not self.waiting or (free < max(1, self.slots // 4) and self.dec.active):
            return
        batch = [self.waiting.pop() for _ in range(min(free, len(self.waiting)))]
        first = self.dec.active
        hidden, logits = self.dec.admit([self.reqs[i].prompt for i in batch])  # [n, W, H]
        self.owner += batch
        self._admitted(batch, first, hidden, logits)

    def _admitted(
        self, batch: list[int], first: int, hidden: torch.Tensor, logits: torch.Tensor
    ) -> None:
        """Rows ``first..`` now hold ``batch``: keep their prefill states and logits."""
        for r, i in enumerate(batch):
            self.prefill[i] = hidden[r, : len(self.reqs[i].prompt)]
        self.logits = torch.cat([self.logits, logits])

    def _draw(self) -> tuple[list[int], list[float]]:
        """Every active row's next token and its log-probability."""
        p = self.params
        noise = gumbel_noise_rows(
            [self.reqs[i].seed for i in self.owner],
            [len(self.tokens[i]) for i in self.owner],
            self.vocab_size,
            self.device,
        )
        nxt = sample_tokens(self.logits.float(), noise, p.temperature, p.top_p)
        return nxt.tolist(), chosen_logprobs(self.logits, nxt, p.temperature).tolist()

    def sample(self) -> list[int]:
        """Draw every active row's next token; the rows whose sequence ended."""
        p = self.params
        self.next, lp = self._draw()
        ended = []
        for row, i in enumerate(self.owner):
            self.tokens[i].append(self.next[row])
            self.logprobs[i].append(lp[row])
            if p.stop_at_eos and self.next[row] in self.eos:
                self.finish[i] = "stop"
                ended.append(row)
            elif len(self.tokens[i]) == p.max_new_tokens:
                ended.append(row)
        return ended

    def retire(self, ended: list[int]) -> None:
        self._retiring(ended)
        for row in sorted(ended, reverse=True):  # highest first: moves stay valid
            moved = self.dec.retire(row)
            if moved is not None:
                self.owner[row], self.next[row] = self.owner[moved], self.next[moved]
                if self.states is not None:
                    k = len(self.tokens[self.owner[row]]) - 1
                    self.states[row, :k] = self.states[moved, :k]
            self.owner.pop()
            self.next.pop()
        if not self.dec.active:
            self.logits = self._no_logits()

    def _retiring(self, ended: list[int]) -> None:
        """Before rows ``ended`` are freed (and overwritten): keep their decode states."""
        if self.states is None:
            return
        for row in ended:  # n tokens were chosen by n - 1 decode states
            i = self.owner[row]
            self.decode[i] = self.states[row, : len(self.tokens[i]) - 1].clone()

    def step(self) -> None:
        """One decode step for every active row."""
        a = self.dec.active
        h = self.dec.step(torch.tensor(self.next, device=self.device))  # [a, H]
        if self.states is not None:  # the state that chooses each row's next token
            idx = torch.tensor([len(self.tokens[i]) - 1 for i in self.owner], device=self.device)
            self.states[torch.arange(a, device=self.device), idx] = h.to(torch.bfloat16)
        self.logits = self.dec.logits(h)

    def run(self) -> None:
        while self.busy:
            self.admit()
            self.retire(self.sample())
            if self.dec.active:
                self.step()

    def activations(self) -> list[list[torch.Tensor]]:
        """Per request: [prefill states [L, H], decode states [n - 1, H]] for TOPLOC."""
        out = []
        for p, d in zip(self.prefill, self.decode, strict=True):
            assert p is not None and d is not None
            out.append([p, d])
        return out
