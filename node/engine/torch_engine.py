"""The project's own engine: batched generation with a KV cache on CPU or CUDA.

Llama-family models (``fastpath.supports``) get continuous batching on a lean forward
with a preallocated cache (``node.engine.continuous``). Other causal LMs run through
transformers' forward with a ``DynamicCache``: requests sorted by prompt length and cut
into batches of at most ``max_batch`` (length buckets: little padding), each left-padded,
prefilled once and decoded one token per step; a sequence that ends is dropped from the
batch and its cache rows. Either way tokens come from the seeded Gumbel-max sampler of
``crypto.sampling``, the log-probability of each chosen token is kept, and the
post-final-norm hidden states (the LM head's input, what TOPLOC commits to) are captured
and proven in one ``build_proofs_batch`` call per ``generate``.

On CUDA, Llama-family models decode on fixed shapes replayed from CUDA graphs and are
proven chunk by chunk while decoding (``node.engine.graphs``); the engine then keeps a KV
cache of ``max_batch`` rows and its graphs between calls, rebuilt when the weights or the
sampling settings change.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Executor
from concurrent.futures.process import BrokenProcessPool
from contextlib import nullcontext
from typing import Any

import torch
from transformers import DynamicCache

from crypto.sampling import gumbel_noise_rows, sample_tokens
from crypto.toploc import build_proofs_batch
from node.engine.base import GenRequest, GenResult, SamplingParams
from node.engine.continuous import Flight, chosen_logprobs
from node.engine.fastpath import supports, weights_stamp
from node.engine.graphs import (
    CACHE_ROUND,
    ProofPipeline,
    StaticDecoder,
    StaticFlight,
    proof_workers,
)

log = logging.getLogger(__name__)

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


class _HFStepper:
    """transformers' own forward with a ``DynamicCache`` (any causal LM)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.cache = DynamicCache()
        self.capture = _Capture(model)

    def run(
        self, ids: torch.Tensor, positions: torch.Tensor, key_valid: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(
            input_ids=ids,
            attention_mask=key_valid.long(),
            position_ids=positions,
            cache=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return self.capture.take(), out.logits[:, -1]

    def select(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)

    def close(self) -> None:
        self.capture.close()


class TorchEngine:
    name = "torch"

    def __init__(
        self,
        model: Any,
        *,
        eos_token_ids: frozenset[int],
        max_batch: int = 32,
        fast: bool = True,
        static: bool | None = None,
        graphs: bool = True,
        proof_processes: bool | None = None,
    ) -> None:
        """``fast``: use the lean forward of ``fastpath`` when the architecture allows.
        ``static``: decode on fixed shapes (``node.engine.graphs``; default: on CUDA),
        replayed from CUDA graphs when ``graphs`` and the device allow. ``proof_processes``:
        on the static path, build proofs in worker processes while decoding (default: on
        CUDA), else in this process."""
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.model = model
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_batch = max_batch
        self.fast = fast and supports(model)
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        pad = getattr(model.config, "pad_token_id", None)
        self.pad_token_id = int(pad) if isinstance(pad, int) else 0
        self.proof_seconds = 0.0  # time spent building proofs, since construction
        cuda = self.device.type == "cuda"
        self.static = self.fast and (cuda if static is None else static)
        self.graphs = graphs
        self.proof_processes = cuda if proof_processes is None else proof_processes
        self.decoder: StaticDecoder | None = None  # kept across calls: its graphs too

    def _prove(
        self, activations: list[list[torch.Tensor]], params: SamplingParams
    ) -> list[list[bytes]]:
        started = time.perf_counter()
        try:
            return build_proofs_batch(
                activations, chunk_size=params.proof_chunk, topk=params.proof_topk
            )
        finally:
            self.proof_seconds += time.perf_counter() - started

    def generate(self, requests: list[GenRequest], params: SamplingParams) -> list[GenResult]:
        for r in requests:
            if not r.prompt:
                raise ValueError("empty prompt")
            if min(r.prompt) < 0 or max(r.prompt) >= self.vocab_size:
                raise ValueError(f"prompt token out of range 0..{self.vocab_size - 1}")
        if self.fast:
            return self._continuous(requests, params)
        order = sorted(range(len(requests)), key=lambda i: len(requests[i].prompt))
        results: list[GenResult | None] = [None] * len(requests)
        for start in range(0, len(order), self.max_batch):
            bucket = order[start : start + self.max_batch]
            for i, res in zip(
                bucket, self._generate_batch([requests[i] for i in bucket], params), strict=True
            ):
                results[i] = res
        return [r for r in results if r is not None]

    @property
    def graph_failure(self) -> str | None:
        """Why CUDA graph capture was given up for the current decoder, if it was."""
        return self.decoder.graphs.failure if self.decoder is not None else None

    def _static_decoder(self, reqs: list[GenRequest], params: SamplingParams) -> StaticDecoder:
        need = max(len(r.prompt) for r in reqs) + params.max_new_tokens
        max_len = -(-need // CACHE_ROUND) * CACHE_ROUND
        stamp = weights_stamp(*self.model.parameters())  # new weights: new graphs
        if self.decoder is None or not self.decoder.fits(self.max_batch, max_len, params, stamp):
            self.decoder = None  # its buffers and graphs go before the new ones are made
            self.decoder = StaticDecoder(
                self.model,
                slots=self.max_batch,
                max_len=max_len,
                params=params,
                vocab_size=self.vocab_size,
                graphs=self.graphs,
                stamp=stamp,
            )
        return self.decoder

    def _proof_executor(self) -> Executor | None:
        """The proof workers, or None (this process proves) when not wanted or when they
        cannot be started here."""
        if not self.proof_processes:
            return None
        try:
            return proof_workers()
        except (BrokenProcessPool, OSError) as exc:
            log.warning("proof workers unavailable, proving in this process: %s", exc)
            return None

    def _static(self, reqs: list[GenRequest], params: SamplingParams) -> list[GenResult]:
        """Continuous batching on fixed shapes (``node.engine.graphs``), proofs built
        beside decoding."""
        pipeline = None
        if params.prove:
            pipeline = ProofPipeline(params.proof_topk, self._proof_executor())
        # streams, events and graphs are those of the model's device, current or not
        on_device = torch.cuda.device(self.device) if self.device.type == "cuda" else nullcontext()
        with on_device:
            flight = StaticFlight(
                self._static_decoder(reqs, params),
                reqs,
                params,
                slots=self.max_batch,
                eos_token_ids=self.eos_token_ids,
                pipeline=pipeline,
            )
            try:
                flight.run()
            except BaseException:
                self.decoder = None  # its rows may be half-written: start clean next time
                raise
            started = time.perf_counter()
            proofs = flight.proofs()  # what is left of them once decoding is done
            self.proof_seconds += time.perf_counter() - started
        return _results(reqs, flight, proofs)

    @torch.inference_mode()
    def _continuous(self, reqs: list[GenRequest], params: SamplingParams) -> list[GenResult]:
        """Continuous batching on the lean forward (``node.engine.continuous``)."""
        if self.static:
            return self._static(reqs, params)
        flight = Flight(
            self.model,
            reqs,
            params,
            slots=self.max_batch,
            eos_token_ids=self.eos_token_ids,
            vocab_size=self.vocab_size,
        )
        flight.run()
        proofs = self._prove(flight.activations(), params) if params.prove else [[] for _ in reqs]
        return _results(reqs, flight, proofs)

    @torch.inference_mode()
    def _generate_batch(self, reqs: list[GenRequest], params: SamplingParams) -> list[GenResult]:
        """One length bucket through transformers' forward (architectures without the
        lean path)."""
        width = max(len(r.prompt) for r in reqs)
        stepper = _HFStepper(self.model)
        try:
            return self._decode(reqs, params, stepper, width)
        finally:
            stepper.close()

    def _decode(
        self,
        reqs: list[GenRequest],
        params: SamplingParams,
        stepper: _HFStepper,
        width: int,
    ) -> list[GenResult]:
        dev, b = self.device, len(reqs)
        ids = torch.full((b, width), self.pad_token_id, dtype=torch.long)
        valid = torch.zeros((b, width), dtype=torch.bool)
        for i, r in enumerate(reqs):
            ids[i, width - len(r.prompt) :] = torch.tensor(r.prompt)
            valid[i, width - len(r.prompt) :] = True
        ids, valid = ids.to(dev), valid.to(dev)
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        hidden, logits = stepper.run(ids, positions, valid)  # hidden [B, W, H]
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
                stepper.select(sel)
                valid, positions, nxt = valid[sel], positions[sel], nxt[sel]
                active = [active[row] for row in keep]
            valid = torch.cat([valid, valid.new_ones((len(active), 1))], dim=1)
            positions = positions[:, -1:] + 1
            h, logits = stepper.run(nxt[:, None], positions, valid)
            if states is not None:  # the state that chooses each sequence's next token
                states[torch.tensor(active, device=dev), step] = h[:, -1]
        proofs: list[list[bytes]] = [[] for _ in reqs]
        if states is not None:
            proofs = self._prove(
                [[prefill[i], states[i, : lengths[i] - 1]] for i in range(b)], params
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


def _results(reqs: list[GenRequest], flight: Flight, proofs: list[list[bytes]]) -> list[GenResult]:
    """One result per request of a finished flight, in request order."""
    return [
        GenResult(
            list(r.prompt),
            flight.tokens[i],
            flight.logprobs[i],
            flight.finish[i],
            r.seed,
            proofs[i],
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


@torch.inference_mode()
def recompute_batch(
    model: Any,
    prompts: list[list[int]],
    outputs: list[list[int]],
    *,
    max_tokens: int = 8192,
) -> list[tuple[list[torch.Tensor], torch.Tensor]]:
    """``recompute`` for many rollouts at once (a validator judging a batch): sequences
    sorted by length, right-padded into forwards of at most ``max_tokens`` positions, the
    LM head applied only to the positions that chose output tokens. Right padding leaves
    every real position's computation causal and unchanged up to the kernels' rounding,
    which the verification profile's noise model covers. Results in input order.

    Llama-family models (``fastpath.supports``: logits = LM head of the final norm's
    output) take the batched path; any other model is recomputed one rollout at a time.
    """
    if len(prompts) != len(outputs):
        raise ValueError("one output per prompt")
    if not supports(model):
        return [recompute(model, p, t) for p, t in zip(prompts, outputs, strict=True)]
    dev = next(model.parameters()).device
    head = model.get_output_embeddings()
    seqs = [p + t[:-1] for p, t in zip(prompts, outputs, strict=True)]
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    results: list[tuple[list[torch.Tensor], torch.Tensor] | None] = [None] * len(seqs)
    start = 0
    while start < len(order):
        width = len(seqs[order[start]])
        end = start + 1
        while end < len(order) and (end - start + 1) * len(seqs[order[end]]) <= max_tokens:
            end += 1
        group = order[start:end]
        width = len(seqs[group[-1]])
        ids = torch.zeros((len(group), width), dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        for row, i in enumerate(group):
            ids[row, : len(seqs[i])] = torch.tensor(seqs[i])
            mask[row, : len(seqs[i])] = 1
        hidden = model.base_model(input_ids=ids.to(dev), attention_mask=mask.to(dev))[0]
        for row, i in enumerate(group):
            n, m = len(prompts[i]), len(outputs[i])
            states = hidden[row, : n + m - 1]
            logits = head(states[n - 1 : n - 1 + m]).float()
            results[i] = ([states[:n].float(), states[n:].float()], logits)
        start = end
    return [r for r in results if r is not None]
