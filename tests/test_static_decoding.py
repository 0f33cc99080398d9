"""The static-shape decode path (``node.engine.graphs``) on the CPU: what the GPU replays
from CUDA graphs, run eagerly. Graph capture itself is checked in tests/test_gpu.py."""

import os
import signal
from concurrent.futures import Executor, Future
from concurrent.futures.process import BrokenProcessPool

import pytest
import torch

from crypto.toploc import build_proofs_batch
from node.engine.base import SamplingParams
from node.engine.graphs import Graphs, ProofPipeline, bucket, proof_workers
from node.engine.torch_engine import TorchEngine
from tests.helpers.tiny_lm import EOS, tiny_llama
from tests.test_engine import midway_token, requests, verify_all


@pytest.fixture(scope="module")
def llama():
    return tiny_llama(0, layers=2, hidden=64)


def mixed_run(llama):
    """More sequences than rows, ending at many different steps (rows refilled, buckets
    shrinking and growing)."""
    reqs = requests([3, 11, 6, 20, 4, 9, 15, 7, 5, 12, 8, 10, 14, 6], seed=5)
    params = SamplingParams(max_new_tokens=75, temperature=1.2)
    eos = midway_token(llama, reqs, params, 4, 8)
    return reqs, params, frozenset({eos})


def same_work(ours, theirs):
    """The same tokens, endings and proofs; log-probs equal up to the rounding of other
    batch shapes."""
    return all(
        (a.tokens, a.finish_reason, a.proofs) == (b.tokens, b.finish_reason, b.proofs)
        and max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
        for a, b in zip(ours, theirs, strict=True)
    )


def test_static_steps_give_the_dynamic_paths_tokens_and_proofs(llama):
    reqs, params, eos = mixed_run(llama)
    static = TorchEngine(llama, eos_token_ids=eos, max_batch=5, static=True)
    dynamic = TorchEngine(llama, eos_token_ids=eos, max_batch=5)
    assert static.static and not dynamic.static  # the CPU default stays dynamic
    ours, theirs = static.generate(reqs, params), dynamic.generate(reqs, params)
    assert len({len(r.tokens) for r in ours}) > 3 and 75 in {len(r.tokens) for r in ours}
    # proofs come from a pipeline, chunk by chunk, yet equal the one-call proofs
    assert same_work(ours, theirs)
    verify_all(llama, ours, params, eos=next(iter(eos)))
    assert static.decoder is not None and static.decoder.graphs.enabled is False  # no CUDA


def test_attention_windows_grow_past_a_boundary_mid_sequence(llama):
    """A 100-token prompt decoded 60 tokens crosses the 128-column window (and rows of
    other lengths share its steps): still the dynamic path's tokens and proofs."""
    reqs = requests([100, 5, 40, 9], seed=8)
    params = SamplingParams(max_new_tokens=60, stop_at_eos=False)
    static = TorchEngine(llama, eos_token_ids=frozenset({EOS}), max_batch=4, static=True)
    dynamic = TorchEngine(llama, eos_token_ids=frozenset({EOS}), max_batch=4)
    ours = static.generate(reqs, params)
    assert static.decoder is not None and static.decoder.dec.max_len == 256
    assert same_work(ours, dynamic.generate(reqs, params))
    verify_all(llama, ours, params)


def test_the_decoder_is_reused_across_calls_and_rebuilt_for_new_weights():
    model = tiny_llama(0, layers=2, hidden=64)
    engine = TorchEngine(model, eos_token_ids=frozenset({EOS}), max_batch=4, static=True)
    reqs, params = requests([6, 9, 4]), SamplingParams(max_new_tokens=30)
    first = engine.generate(reqs, params)
    decoder = engine.decoder
    assert engine.generate(reqs, params) == first and engine.decoder is decoder
    model.load_state_dict(tiny_llama(1, layers=2, hidden=64).state_dict())  # in place
    after = engine.generate(reqs, params)
    assert engine.decoder is not decoder
    assert [r.tokens for r in after] != [r.tokens for r in first]
    fresh = TorchEngine(model, eos_token_ids=frozenset({EOS}), max_batch=4, static=True)
    assert after == fresh.generate(reqs, params)  # not the stale fused weights
    verify_all(model, after, params)
    decoder = engine.decoder
    engine.generate(reqs, SamplingParams(max_new_tokens=30, top_p=0.9))  # other settings
    assert engine.decoder is not decoder


def test_a_failed_call_leaves_no_half_written_decoder(llama, monkeypatch):
    engine = TorchEngine(llama, eos_token_ids=frozenset({EOS}), max_batch=4, static=True)
    reqs, params = requests([6, 9, 4]), SamplingParams(max_new_tokens=30)
    good = engine.generate(reqs, params)
    from node.engine import graphs

    calls = []

    def interrupted(self):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return original(self)

    original = graphs.StaticFlight.step
    monkeypatch.setattr(graphs.StaticFlight, "step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        engine.generate(reqs, params)
    assert engine.decoder is None
    monkeypatch.setattr(graphs.StaticFlight, "step", original)
    assert engine.generate(reqs, params) == good


def test_proof_workers_give_the_same_proofs(llama):
    """The pipeline with worker processes (the GPU default) against proofs in one call."""
    reqs, params, eos = mixed_run(llama)
    engine = TorchEngine(llama, eos_token_ids=eos, max_batch=5, static=True, proof_processes=True)
    results = engine.generate(reqs, params)
    plain = TorchEngine(llama, eos_token_ids=eos, max_batch=5).generate(reqs, params)
    assert [r.proofs for r in results] == [r.proofs for r in plain]
    pool = proof_workers()
    assert pool is proof_workers()  # one pool per process
    for pid in list(pool._processes):  # Ctrl-C reaches the workers too: they leave it
        os.kill(pid, signal.SIGINT)
    assert engine.generate(reqs, params) == results and proof_workers() is pool
    os.kill(next(iter(pool._processes)), signal.SIGKILL)  # a worker dies
    pool._processes[next(iter(pool._processes))].join(timeout=30)
    assert engine.generate(reqs, params) == results  # its work redone in this process
    assert proof_workers() is not pool  # and the next call gets a new pool
    assert engine.generate(reqs, params) == results


class DyingWorkers(Executor):
    """Proof workers that die: the first task's worker mid-task, then the whole pool."""

    def __init__(self):
        self.tasks = 0

    def submit(self, fn, /, *args, **kwargs):
        self.tasks += 1
        if self.tasks > 1:
            raise BrokenProcessPool("the pool is gone")
        task = Future()
        task.set_exception(BrokenProcessPool("a worker died mid-task"))
        return task


def test_proof_workers_that_cannot_start_leave_the_proving_to_this_process(llama, monkeypatch):
    from node.engine import torch_engine

    def unavailable():
        raise BrokenProcessPool("a worker died while starting")

    monkeypatch.setattr(torch_engine, "proof_workers", unavailable)
    reqs, params = requests([6, 9, 4]), SamplingParams(max_new_tokens=40)
    engine = TorchEngine(
        llama, eos_token_ids=frozenset({EOS}), max_batch=4, static=True, proof_processes=True
    )
    plain = TorchEngine(llama, eos_token_ids=frozenset({EOS}), max_batch=4)
    assert same_work(engine.generate(reqs, params), plain.generate(reqs, params))


@pytest.mark.parametrize("workers", [None, DyingWorkers], ids=["inline", "dying-workers"])
def test_pipeline_proofs_equal_batch_proofs_in_any_order(workers):
    """Chunks handed in out of order and in mixed groups give the one-call proofs, also
    when the worker processes die (their groups are redone in this process)."""
    torch.manual_seed(3)
    prefill = [torch.randn(n, 96) for n in (5, 40, 2)]
    decode = [torch.randn(n, 96) for n in (70, 33, 1)]
    executor = workers() if workers else None
    pipeline = ProofPipeline(topk=128, executor=executor)
    # handed in out of order and in mixed groups, as chunks complete
    pipeline.submit([(1, 1), (0, 0)], [decode[1][:32], prefill[0]])
    pipeline.submit([(0, 3), (2, 0), (1, 0)], [decode[0][64:], prefill[2], prefill[1]])
    pipeline.submit([(0, 1), (0, 2), (1, 2)], [decode[0][:32], decode[0][32:64], decode[1][32:]])
    pipeline.submit([(2, 1)], [decode[2]])
    done = pipeline.finish()
    expected = build_proofs_batch([[p, d] for p, d in zip(prefill, decode, strict=True)])
    for i, proofs in enumerate(expected):
        assert [done[(i, c)] for c in range(len(proofs))] == proofs
    assert executor is None or executor.tasks == 2


def test_buckets_and_disabled_graphs():
    assert [bucket(n, 64) for n in (1, 2, 3, 5, 16, 17, 64)] == [1, 2, 4, 8, 16, 32, 64]
    assert bucket(40, 48) == 48 and bucket(1, 1) == 1
    graphs = Graphs(enabled=not torch.cuda.is_available())  # on a CPU: never enabled
    assert graphs.run("k", lambda: 7) == 7 and graphs.graphs == {}


def _ended(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie has ended
    except FileNotFoundError:
        return True


def test_a_daemonic_model_process_starts_proof_workers_that_die_with_it():
    """The engine runs in the node's model process, a daemonic child, to which
    multiprocessing refuses children: on a GPU (proof workers by default) every batch
    failed with "daemonic processes are not allowed to have children". Its workers start,
    and when it is killed outright they end too (PR_SET_PDEATHSIG)."""
    import multiprocessing
    import os
    import signal
    import time

    from tests.helpers.daemonic import start_proof_workers

    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=start_proof_workers, args=(theirs,), daemon=True)
    child.start()
    try:
        assert ours.poll(120), "the child sent nothing"
        pids = ours.recv()
        assert isinstance(pids, list) and pids, pids
        assert not any(_ended(p) for p in pids)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join(30)
    deadline = time.monotonic() + 30
    while not all(_ended(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_ended(p) for p in pids), "proof workers outlived their process"
