"""Static-shape decoding, replayed from CUDA graphs, with proofs built beside it.

On a GPU the eager decode loop (``continuous.Flight``) is bound by the host: on an H200, a
22-layer 1.1B model at batch 64 launched about 830 kernels per decode step, and the
profiler counted 2.6 s of CPU time against 0.42 s of GPU time per call. This path makes a
step one launch and keeps the host out of the GPU's way:

- **Static shapes.** The batch is padded to a bucket (1, 2, 4, ... up to the slots) and
  attention reads a window of the cache rounded up to ``WINDOW`` columns, so a decode step
  has one of a few shapes. Its inputs (tokens, positions, state index, noise keys) live in
  device buffers filled by one non-blocking copy from pinned memory; the step writes keys
  and values, the state that TOPLOC commits to and the logits into buffers that outlive
  the call (``StaticDecoder``).
- **CUDA graphs.** ``Graphs`` captures each (step, bucket, window) and (sample, bucket)
  once and replays it: one launch per step instead of hundreds. Capture runs the step once
  eagerly first (lazy initialisation stays outside the graph); every captured function is
  idempotent for fixed inputs, so that run and the replay write the same values. Where
  capture is impossible (a CPU, an operation that synchronizes) it falls back to calling
  the same functions eagerly, with identical results, and says why in ``failure``.
- **Sampling on the device.** The seeded Gumbel noise is computed from int64 position keys
  (``crypto.sampling.gumbel_noise_from_keys``), so sampling is a graph too; the host reads
  each step's tokens and log-probabilities in one copy, the step's only synchronization
  (it needs them for EOS and the next inputs).
- **Proofs beside decoding** (``ProofPipeline``). A chunk's states are complete every
  ``proof_chunk`` steps; its top-k selection is queued on the stream right behind the step
  that wrote them, copied to pinned memory without waiting, and the field arithmetic runs
  in worker processes while the GPU decodes on. At the end only the last chunks remain.

Tokens, log-probabilities and proofs equal those of the same functions run eagerly (tested
on the GPU); against the dynamic-shape path (``continuous.Flight``, the CPU's) they differ
only by the kernels' rounding of other batch shapes, which verification tolerates.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch

from crypto.sampling import gumbel_noise_from_keys, position_keys, sample_tokens
from crypto.toploc import proofs_from_entries, select_top, warm_up
from node.engine.base import GenRequest, SamplingParams
from node.engine.continuous import Flight, chosen_logprobs, decode_states
from node.engine.fastpath import SlotDecoder
from node.orphans import die_with_parent

log = logging.getLogger(__name__)

WINDOW = 128  # attention reads the cache in multiples of this many columns
CACHE_ROUND = 256  # cache lengths are rounded up to this, so calls can share a decoder
PROOF_GROUP = 16  # chunks per task of the proof workers: the last ones spread over them


def bucket(n: int, slots: int) -> int:
    """The padded batch size for ``n`` active rows: the next power of two, at most
    ``slots``."""
    return min(1 << (n - 1).bit_length(), slots)


class Graphs:
    """Functions captured as CUDA graphs once per key and replayed after; called eagerly
    when disabled or when a capture fails (then for good, with the reason in
    ``failure``)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and torch.cuda.is_available()
        self.failure: str | None = None
        self.graphs: dict[Hashable, tuple[torch.cuda.CUDAGraph, Any]] = {}
        self.pool: Any = None  # one memory pool: replays never overlap

    def run(self, key: Hashable, fn: Callable[[], Any]) -> Any:
        if self.enabled:
            entry = self.graphs.get(key) or self._capture(key, fn)
            if entry is not None:
                graph, out = entry
                graph.replay()
                return out
        return fn()

    def _capture(self, key: Hashable, fn: Callable[[], Any]) -> tuple[Any, Any] | None:
        stream = torch.cuda.current_stream()
        try:
            return self._record(key, fn)
        except Exception as exc:  # noqa: BLE001 - any capture failure: run eagerly instead
            self.enabled = False
            self.failure = f"{type(exc).__name__}: {exc}"
            log.warning("CUDA graph capture failed, decoding eagerly: %s", self.failure)
            return None
        finally:  # a failed or interrupted capture can leave its own stream current
            torch.cuda.set_stream(stream)

    def _record(self, key: Hashable, fn: Callable[[], Any]) -> tuple[Any, Any]:
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # torch: unannotated
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()  # warm-up: workspaces and lazy state are made outside the graph
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            out = fn()
        self.graphs[key] = (graph, out)
        return self.graphs[key]


class StaticDecoder:
    """What the graphs point at, kept across ``generate`` calls: the slot decoder (its
    KV cache), the step inputs, every row's logits, the decode states and the graphs.
    Valid for one model state and one set of sampling settings (``fits``)."""

    def __init__(
        self,
        model: Any,
        *,
        slots: int,
        max_len: int,
        params: SamplingParams,
        vocab_size: int,
        graphs: bool,
        stamp: tuple[tuple[int, int], ...],
    ) -> None:
        self.dec = SlotDecoder(model, slots, max_len)
        self.slots, self.params, self.stamp = slots, params, stamp
        dev = self.dec.device
        cuda = dev.type == "cuda"
        # rows: next input token, position (= cache length), decode-state index, noise key
        self.inputs = torch.zeros((4, slots), dtype=torch.long, device=dev)
        self.staging = torch.zeros((4, slots), dtype=torch.long, pin_memory=cuda)
        self.staged = self.staging.numpy()
        self.drawn = torch.zeros(2 * slots, dtype=torch.float64, pin_memory=cuda)
        self.logits = torch.zeros((slots, vocab_size), dtype=self.dec.dtype, device=dev)
        self.states = decode_states(model, slots, params, dev)  # read only where written
        self.vocab_size = vocab_size
        self.graphs = Graphs(graphs and cuda)

    def fits(
        self, slots: int, max_len: int, params: SamplingParams, stamp: tuple[tuple[int, int], ...]
    ) -> bool:
        p, q = self.params, params
        return (
            slots == self.slots
            and max_len <= self.dec.max_len
            and stamp == self.stamp
            and (p.max_new_tokens, p.prove, p.temperature, p.top_p)
            == (q.max_new_tokens, q.prove, q.temperature, q.top_p)
        )

    def step_fn(self, b: int, window: int) -> None:
        """Decode rows ``0..b-1`` from ``inputs``; states and logits into their buffers."""
        tokens, lens, at = self.inputs[0, :b], self.inputs[1, :b], self.inputs[2, :b]
        h = self.dec.step_static(tokens, lens, window)  # [b, H]
        if self.states is not None:  # the state that chooses each row's next token
            self.states[self.dec.rows[:b], at] = h.to(torch.bfloat16)
        self.logits[:b] = self.dec.logits(h)

    def sample_fn(self, b: int) -> torch.Tensor:
        """[2, b]: each row's next token and its log-probability (float64: exact for
        both), from ``logits`` and the noise keys in ``inputs``."""
        t, top_p = self.params.temperature, self.params.top_p
        logits = self.logits[:b]
        noise = gumbel_noise_from_keys(self.inputs[3, :b], self.vocab_size)
        nxt = sample_tokens(logits.float(), noise, t, top_p)
        return torch.stack([nxt.double(), chosen_logprobs(logits, nxt, t).double()])


_workers: ProcessPoolExecutor | None = None


def proof_workers() -> Executor:
    """Worker processes for the field arithmetic of proofs (numpy, no GPU), shared by
    every engine of this process (a new pool if a worker died). All of them start here,
    and each has made its table of inverses before decoding needs it: a worker spawned
    mid-generation would cost that generation seconds."""
    global _workers
    if _workers is None or getattr(_workers, "_broken", False):
        count = max(1, min(4, (os.cpu_count() or 2) // 4))
        with _children_allowed():
            _workers = ProcessPoolExecutor(
                count,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_proof_worker,
                initargs=(os.getpid(),),
            )
            for task in [_workers.submit(warm_up) for _ in range(count)]:
                task.result()
    return _workers


@contextmanager
def _children_allowed() -> Iterator[None]:
    """multiprocessing refuses children to a daemonic process ("daemonic processes are not
    allowed to have children", an AssertionError), and the engine runs in one: the node's
    model process (``node.roles.children.offload``), which the node ends when it exits. Its proof
    workers start with the flag lifted; each dies with it (``_proof_worker``)."""
    config = multiprocessing.current_process()._config  # type: ignore[attr-defined]
    daemonic = config.get("daemon", False)
    config["daemon"] = False
    try:
        yield
    finally:
        config["daemon"] = daemonic


def _proof_worker(parent: int) -> None:
    """In a proof worker: Ctrl-C in the terminal reaches the whole process group; the node
    handles it, and the pool's workers end when the node exits (concurrent.futures joins
    them), not mid-task with a trace each. The process that started the pool may be ended
    without joining it (the node's model process is): the worker dies with it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent)


class ProofPipeline:
    """Proofs of chunks handed in as their states are complete: the top-k selection is
    queued on the chunks' device at once (``select_top``, no waiting), its result copied
    to the host without blocking, and the field arithmetic (``proofs_from_entries``) done
    by ``executor`` (inline when None) once the copy has landed. ``finish`` returns every
    proof by the key it was handed in with."""

    def __init__(self, topk: int, executor: Executor | None = None) -> None:
        self.topk, self.executor = topk, executor
        self.copying: list[tuple[Any, list[Hashable], torch.Tensor, torch.Tensor]] = []
        self.running: list[tuple[list[Hashable], list[Any], Future[list[bytes]]]] = []
        self.proofs: dict[Hashable, bytes] = {}

    def submit(self, keys: Sequence[Hashable], chunks: list[torch.Tensor]) -> None:
        for members, idx, bits in select_top(chunks, self.topk):
            event = None
            if idx.is_cuda:
                idx, bits = idx.to("cpu", non_blocking=True), bits.to("cpu", non_blocking=True)
                event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # torch: unannotated
                event.record()
            self.copying.append((event, [keys[m] for m in members], idx, bits))

    def poll(self, wait: bool = False) -> None:
        """Hand the selections whose copy has landed (all of them, with ``wait``) to the
        arithmetic. With ``wait`` (decoding is over, nothing is left to overlap) this
        process computes the last group itself while the workers take the others."""
        pending, groups = [], []
        for item in self.copying:
            event, keys, idx, bits = item
            if event is not None and not event.query():
                if not wait:
                    pending.append(item)
                    continue
                event.synchronize()
            entries = list(zip(idx.numpy(), bits.numpy(), strict=True))
            for s in range(0, len(keys), PROOF_GROUP):
                groups.append((keys[s : s + PROOF_GROUP], entries[s : s + PROOF_GROUP]))
        self.copying = pending
        mine = groups.pop() if wait and groups else None
        for keys, part in groups:
            task = None
            if self.executor is not None:
                try:
                    task = self.executor.submit(proofs_from_entries, part, self.topk)
                except BrokenProcessPool:  # a worker died: this process does the rest
                    self.executor = None
            if task is None:
                self._store(keys, proofs_from_entries(part, self.topk))
            else:
                self.running.append((keys, part, task))
        if mine is not None:
            self._store(mine[0], proofs_from_entries(mine[1], self.topk))

    def finish(self) -> dict[Hashable, bytes]:
        self.poll(wait=True)
        for keys, part, task in self.running:
            try:
                proofs = task.result()
            except BrokenProcessPool:  # its worker died: nothing is lost, redo it here
                proofs = proofs_from_entries(part, self.topk)
            self._store(keys, proofs)
        self.running = []
        return self.proofs

    def _store(self, keys: list[Hashable], proofs: list[bytes]) -> None:
        self.proofs.update(zip(keys, proofs, strict=True))


class StaticFlight(Flight):
    """``Flight`` on a ``StaticDecoder``: the same admission, sampling order and
    retirement, with each decode step and each draw one (replayed) call on fixed shapes,
    and proofs handed to a ``ProofPipeline`` chunk by chunk."""

    def __init__(
        self,
        static: StaticDecoder,
        reqs: list[GenRequest],
        params: SamplingParams,
        *,
        slots: int,
        eos_token_ids: frozenset[int],
        pipeline: ProofPipeline | None,
    ) -> None:
        dec = static.dec
        dec.active, dec.lens = 0, [0] * dec.slots
        self.static, self.pipeline = static, pipeline
        slots = min(slots, len(reqs), static.slots)
        self._start(dec, static.states, reqs, params, slots, eos_token_ids, static.vocab_size)
        self.logits = self._no_logits()
        self.chunk = params.proof_chunk

    def _admitted(
        self, batch: list[int], first: int, hidden: torch.Tensor, logits: torch.Tensor
    ) -> None:
        self.static.logits[first : first + len(batch)] = logits
        if self.pipeline is not None:  # each prompt is one chunk
            chunks = [hidden[r, : len(self.reqs[i].prompt)] for r, i in enumerate(batch)]
            self.pipeline.submit([(i, 0) for i in batch], chunks)

    def _draw(self) -> tuple[list[int], list[float]]:
        s, a = self.static, self.dec.active
        b = bucket(a, s.slots)
        keys = position_keys(
            [self.reqs[i].seed for i in self.owner], [len(self.tokens[i]) for i in self.owner]
        )
        s.staged[3, :a], s.staged[3, a:b] = keys, 0
        s.inputs[3].copy_(s.staging[3], non_blocking=True)  # whole rows: pinned, contiguous
        out = s.graphs.run(("sample", b), partial(s.sample_fn, b))
        drawn = s.drawn[: 2 * b].view(2, b)  # contiguous on both sides: one plain copy
        drawn.copy_(out, non_blocking=True)
        if self.pipeline is not None:
            self.pipeline.poll()  # while the GPU decodes
        if drawn.is_pinned():
            torch.cuda.current_stream().synchronize()
        nxt, lp = drawn[:, :a].tolist()
        return [int(t) for t in nxt], lp

    def _retiring(self, ended: list[int]) -> None:
        """The last, partial chunk of each ending sequence, before its row is reused."""
        if self.pipeline is None or self.states is None:
            return
        keys, chunks = [], []
        for row in ended:
            i = self.owner[row]
            n = len(self.tokens[i]) - 1  # decode states
            done = n // self.chunk  # full chunks, handed in as they completed
            if n > done * self.chunk:
                keys.append((i, 1 + done))
                chunks.append(self.states[row, done * self.chunk : n])
        if chunks:
            self.pipeline.submit(keys, chunks)

    def step(self) -> None:
        s, dec, a = self.static, self.dec, self.dec.active
        b = bucket(a, s.slots)
        end = max(dec.lens[:a]) + 1
        if end > dec.max_len:
            raise ValueError("cache full")
        window = min(dec.max_len, -(-end // WINDOW) * WINDOW)
        at = [len(self.tokens[i]) - 1 for i in self.owner]
        s.staged[0, :a], s.staged[1, :a], s.staged[2, :a] = self.next, dec.lens[:a], at
        s.staged[:3, a:b] = 0
        s.inputs[:3].copy_(s.staging[:3], non_blocking=True)
        s.graphs.run(("step", b, window), partial(s.step_fn, b, window))
        for r in range(a):
            dec.lens[r] += 1
        if self.pipeline is not None and self.states is not None:
            full = [r for r in range(a) if (at[r] + 1) % self.chunk == 0]
            if full:  # these rows just completed a chunk of decode states
                self.pipeline.submit(
                    [(self.owner[r], 1 + at[r] // self.chunk) for r in full],
                    [self.states[r, at[r] + 1 - self.chunk : at[r] + 1] for r in full],
                )

    def proofs(self) -> list[list[bytes]]:
        """Every request's proofs in chunk order (prefill first)."""
        if self.pipeline is None:
            return [[] for _ in self.reqs]
        done = self.pipeline.finish()
        out = []
        for i in range(len(self.reqs)):
            n = len(self.tokens[i]) - 1
            chunks = 1 + -(-n // self.chunk)
            out.append([done[(i, c)] for c in range(chunks)])
        return out
