"""The project's own engine: batched generation with a KV cache on CPU or CUDA.

Requests are sorted by prompt length and cut into batches of at most ``max_batch`` (length
buckets: little padding). Each batch is left-padded and prefilled once, then decoded one
token per step with a KV cache; a sequence that ends is dropped from the batch and its
cache rows, so the remaining ones do not pay for it. Tokens come from the seeded Gumbel-max
sampler of ``crypto.sampling``. The post-final-norm hidden states (the input of the LM
head, what TOPLOC commits to) are captured by a forward hook on the model's final norm
into one preallocated buffer per batch, and proven in one ``build_proofs_batch`` call
per batch.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

from crypto.sampling import gumbel_noise_rows, sample_tokens
from crypto.toploc import build_proofs_batch
from node.engine.base import GenRequest, GenResult, SamplingParams

_NORM_NAMES = ("norm", "final_layernorm", "ln_f", "final_norm")


def final_norm(model: Any) -> torch.nn.Module:
    """The module whose output feeds the LM head (post-final-norm hidden states)."""
    base = getattr(model, model.base_model_prefix, model)
    for name in _NORM_NAMES:
        module = getattr(base, name, None)
        if isinstance(module, torch.nn.Module):
            return module
    raise ValueError(f"{type(model).__name__}: no final norm among {_NORM_NAMES}")


class _Capture:
    """Forward hook keeping the last output of the final norm."""

    def __init__(self, model: Any) -> None:
        self.value: torch.Tensor | None = None
        self._handle = final_norm(model).register_forward_hook(self._hook)

    def _hook(self, _module: Any, _inputs: Any, output: torch.Tensor) -> None:
        self.value = output

    def take(self) -> torch.Tensor:
        value, self.value = self.value, None
        if value is None:
            raise RuntimeError("the final norm did not run")
        return value

    def close(self) -> None:
        self._handle.remove()


def chosen_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p(token) under the sampling distribution, for logits [B, V] and tokens [B]."""
    scaled = logits.float() / temperature if temperature > 0 else logits.float()
    return torch.log_softmax(scaled, dim=-1).gather(1, tokens[:, None])[:, 0]


class TorchEngine:
    name = "torch"

    def __init__(self, model: Any, *, eos_token_ids: frozenset[int], max_batch: int = 32) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.model = model
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_batch = max_batch
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.device = next(model.parameters()).device
        pad = getattr(model.config, "pad_token_id", None)
        self.pad_token_id = int(pad) if isinstance(pad, int) else 0

    def generate(self, requests: list[GenRequest], params: SamplingParams) -> list[GenResult]:
        for r in requests:
            if not r.prompt:
                raise ValueError("empty prompt")
            if min(r.prompt) < 0 or max(r.prompt) >= self.vocab_size:
                raise ValueError(f"prompt token out of range 0..{self.vocab_size - 1}")
        order = sorted(range(len(requests)), key=lambda i: len(requests[i].prompt))
        results: list[GenResult | None] = [None] * len(requests)
        for start in range(0, len(order), self.max_batch):
            bucket = order[start : start + self.max_batch]
            for i, res in zip(
                bucket, self._generate_batch([requests[i] for i in bucket], params), strict=True
            ):
                results[i] = res
        return [r for r in results if r is not None]

    @torch.inference_mode()
    def _generate_batch(self, reqs: list[GenRequest], params: SamplingParams) -> list[GenResult]:
        capture = _Capture(self.model)
        try:
            return self._decode(reqs, params, capture)
        finally:
            capture.close()

    def _decode(
        self, reqs: list[GenRequest], params: SamplingParams, capture: _Capture
    ) -> list[GenResult]:
        dev, b = self.device, len(reqs)
        width = max(len(r.prompt) for r in reqs)
        ids = torch.full((b, width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((b, width), dtype=torch.long)
        for i, r in enumerate(reqs):
            ids[i, width - len(r.prompt) :] = torch.tensor(r.prompt)
            mask[i, width - len(r.prompt) :] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        hidden = capture.take()  # [B, W, H]
        prefill = [hidden[i, width - len(r.prompt) :] for i, r in enumerate(reqs)]
        states = (
            torch.empty(
                (b, params.max_new_tokens, hidden.shape[-1]), dtype=hidden.dtype, device=dev
            )
            if params.prove
            else None
        )
        tokens = torch.zeros((b, params.max_new_tokens), dtype=torch.long)
        logprobs = torch.zeros((b, params.max_new_tokens), dtype=torch.float32)
        lengths = [0] * b
        finish = ["length"] * b
        active = list(range(b))  # batch row -> request index
        logits = out.logits[:, -1]
        t, top_p = params.temperature, params.top_p
        for step in range(params.max_new_tokens):
            noise = gumbel_noise_rows(
                [reqs[i].seed for i in active], [step] * len(active), self.vocab_size, dev
            )
            nxt = sample_tokens(logits.float(), noise, t, top_p)
            lp = chosen_logprobs(logits, nxt, t).cpu()
            nxt_cpu = nxt.cpu()
            rows = torch.tensor(active)
            tokens[rows, step] = nxt_cpu
            logprobs[rows, step] = lp
            keep: list[int] = []
            for row, i in enumerate(active):
                lengths[i] = step + 1
                if params.stop_at_eos and int(nxt_cpu[row]) in self.eos_token_ids:
                    finish[i] = "stop"
                else:
                    keep.append(row)
            if not keep or step == params.max_new_tokens - 1:
                break
            if len(keep) < len(active):  # drop ended sequences from the batch and cache
                sel = torch.tensor(keep, device=dev)
                cache.batch_select_indices(sel)
                mask, positions, nxt = mask[sel], positions[sel], nxt[sel]
                active = [active[row] for row in keep]
            mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=1)
            positions = positions[:, -1:] + 1
            out = self.model(
                input_ids=nxt[:, None],
                attention_mask=mask,
                position_ids=positions,
                cache=cache,
                use_cache=True,
            )
            h = capture.take()[:, -1]  # [B_active, H]: chooses each sequence's next token
            if states is not None:
                states[torch.tensor(active, device=dev), step] = h
            logits = out.logits[:, -1]
        proofs: list[list[bytes]] = [[] for _ in reqs]
        if states is not None:
            proofs = build_proofs_batch(
                [[prefill[i], states[i, : lengths[i] - 1]] for i in range(b)],
                chunk_size=params.proof_chunk,
                topk=params.proof_topk,
            )
        return [
            GenResult(
                prompt=list(r.prompt),
                tokens=tokens[i, : lengths[i]].tolist(),
                logprobs=logprobs[i, : lengths[i]].tolist(),
                finish_reason=finish[i],
                seed=r.seed,
                proofs=proofs[i],
            )
            for i, r in enumerate(reqs)
        ]


@torch.inference_mode()
def recompute(
    model: Any, prompt: list[int], tokens: list[int]
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """A validator's one prefill pass over prompt + tokens[:-1]: (the hidden states the
    worker committed to, captured the same way, and the logits [n, V] that chose each
    output token)."""
    capture = _Capture(model)
    try:
        dev = next(model.parameters()).device
        seq = torch.tensor([prompt + tokens[:-1]], device=dev)
        out = model(input_ids=seq)
        hidden = capture.take()[0].float()
    finally:
        capture.close()
    n = len(prompt)
    logits = out.logits[0, n - 1 : n - 1 + len(tokens)].float()
    return [hidden[:n], hidden[n:]], logits
