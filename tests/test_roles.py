"""The roles' pure parts and plumbing: the step clock, the child process for heavy work,
the inference role's honest path and the tests' cheating role built on it
(``tests/helpers/cheating/role.py``), and the validator's refusal of settings it cannot
serve."""

from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import trio

from node.config import load_config
from node.net.metrics import Metrics
from node.roles.children.offload import Offload, OffloadError
from node.roles.decisions.clock import StepClock
from protocol.batches import BatchNotice, StepNotice
from protocol.rollouts import max_envelope_size

TRAINER = "12D3KooW" + "A" * 44


def test_only_the_trainer_moves_the_clock_and_only_forward():
    clock = StepClock(TRAINER, async_level=2)
    assert clock.window(0, 0) == "no step announced by the trainer yet"
    assert not clock.observe("12D3KooW" + "B" * 44, StepNotice(step=99, policy_version=0))
    assert clock.step is None and clock.ignored == 1
    assert clock.observe(TRAINER, StepNotice(step=10, policy_version=3))
    assert not clock.observe(TRAINER, StepNotice(step=9, policy_version=3))  # a replayed old one
    assert clock.observe(TRAINER, StepNotice(step=10, policy_version=4))  # version n published
    assert not clock.observe(TRAINER, StepNotice(step=10, policy_version=4))  # a repeat
    assert (clock.step, clock.policy_version) == (10, 4)


@pytest.mark.parametrize(
    ("step", "version", "ok"),
    [
        (10, 9, True),
        (8, 7, True),
        (10, 8, True),
        (7, 9, False),  # the step is too old
        (8, 6, False),  # the version is too old for the newest version
        (10, 7, False),  # the version is too old for its step
        (11, 9, False),  # ahead of the trainer's step
        (10, 10, False),  # ahead of the trainer's version
    ],
)
def test_the_async_window(step, version, ok):
    clock = StepClock(TRAINER, async_level=2)
    clock.observe(TRAINER, StepNotice(step=10, policy_version=9))
    assert (clock.window(step, version) is None) is ok


@dataclass(frozen=True)
class EchoSpec:
    prefix: bytes


@dataclass(frozen=True)
class Say:
    data: bytes


@dataclass(frozen=True)
class Said:
    data: bytes


class Echo:
    """A handler for the offload tests (built in the child)."""

    def __init__(self, spec: EchoSpec) -> None:
        self.prefix = spec.prefix

    def __call__(self, call: Say) -> Said:
        if call.data == b"boom":
            raise ValueError("asked to fail")
        if call.data == b"full":
            raise OSError(28, "No space left on device")
        return Said(self.prefix + call.data)


class Broken:
    def __init__(self, spec: None) -> None:
        raise RuntimeError("cannot load the model")


async def test_offload_answers_from_a_child_process_and_reports_errors():
    off = Offload(Echo, EchoSpec(prefix=b">"))
    try:
        await off.ready()
        assert await off.call(Say(b"abc")) == Said(b">abc")
        with pytest.raises(OffloadError, match="ValueError: asked to fail") as exc:
            await off.call(Say(b"boom"))
        assert not exc.value.os_error
        with pytest.raises(OffloadError, match="No space left on device") as exc:
            await off.call(Say(b"full"))
        assert exc.value.os_error  # the caller may wait for room and ask again
        assert await off.call(Say(b"again")) == Said(b">again")  # still serving after an error
    finally:
        off.close()
    assert not off._proc.is_alive()
    broken = Offload(Broken, None)
    try:
        with pytest.raises(OffloadError, match="cannot load the model"):
            await broken.ready()
    finally:
        broken.close()


class Threads:
    """Answers with the torch threads its process computes with."""

    def __init__(self, spec: None) -> None:
        pass

    def __call__(self, call: None) -> int:
        import torch

        return torch.get_num_threads()


async def test_offload_sets_the_torch_threads_of_its_child():
    for threads in (1, 3):
        off = Offload(Threads, None, threads=threads)
        try:
            await off.ready()
            assert await off.call(None) == threads
        finally:
            off.close()


async def test_offload_as_a_context_is_closed_also_when_it_fails_to_start():
    async with Offload(Echo, EchoSpec(prefix=b">")) as off:
        assert await off.call(Say(b"x")) == Said(b">x")
    assert not off._proc.is_alive()
    broken = Offload(Broken, None)
    with pytest.raises(OffloadError, match="cannot load the model"):
        async with broken:
            pass
    assert not broken._proc.is_alive()


async def test_a_dead_child_is_reported_as_dead_and_ctrl_c_is_left_to_the_node():
    """A call to a child that died raised the pipe's BrokenPipeError (the validator's
    ``alive()`` check never ran, a worker went on failing every 5 s for good); it is an
    ``OffloadError`` naming the exit code now. A Ctrl-C reaches the node's whole process
    group: the child ignores it (it printed a KeyboardInterrupt traceback and died), and
    the node stops it by closing the pipe."""
    import os
    import signal

    off = Offload(Echo, EchoSpec(prefix=b">"))
    try:
        await off.ready()
        os.kill(off._proc.pid, signal.SIGINT)
        assert await off.call(Say(b"still")) == Said(b">still")
        os.kill(off._proc.pid, signal.SIGKILL)
        await trio.to_thread.run_sync(off._proc.join, 10)
        with pytest.raises(OffloadError, match=r"died \(exit code -9\)"):
            await off.call(Say(b"x"))
        assert not off.alive()
    finally:
        off.close()


NODE_WITH_A_BUSY_CHILD = """
import sys, threading, time, trio
from node.roles.children.offload import Offload
from tests.test_roles import Slow

async def main():
    off = Offload(Slow, None)
    await off.ready()
    print(off._proc.pid, flush=True)
    await off.call(60.0)  # the child is busy for a minute

trio.run(main)
"""


def test_a_node_killed_outright_takes_its_busy_child_with_it(tmp_path):
    """SIGKILL runs no cleanup: a child in the middle of a call went on under init (a
    trainer's wrote its checkpoint, on a GPU it would hold the memory). It asked the
    kernel for SIGTERM when its parent dies (``node/orphans.py``)."""
    import os
    import signal
    import time

    from tests.helpers.net import wait_until
    from tests.helpers.procs import gone, parent_and_child

    with parent_and_child(NODE_WITH_A_BUSY_CHILD) as (node, child):
        time.sleep(0.5)  # into its call
        os.kill(node.pid, signal.SIGKILL)
        node.wait(10)
        wait_until(lambda: gone(child), 20, "the child to go with its node")


async def test_the_node_keeps_running_while_the_child_works():
    """A call that keeps the child busy for a second does not block the event loop."""
    off = Offload(Slow, None)
    ticks = 0
    try:
        await off.ready()

        async def tick():
            nonlocal ticks
            while True:
                await trio.sleep(0.05)
                ticks += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(tick)
            await off.call(1.0)  # Slow takes the seconds as its call
            nursery.cancel_scope.cancel()
    finally:
        off.close()
    assert ticks >= 10


class Slow:
    def __init__(self, spec: None) -> None:
        pass

    def __call__(self, seconds: float) -> None:
        import time

        end = time.perf_counter() + seconds
        while time.perf_counter() < end:  # busy, holding its own GIL
            pass


def test_the_node_has_no_setting_that_makes_it_cheat():
    """Cheating workers are the tests' own processes (``tests/helpers/cheating/``): the
    node's settings name no cheat, and the environment cannot switch one on."""
    from node.config import NodeConfig

    assert not [f for f in NodeConfig.model_fields if "cheat" in f.lower()]
    cfg = load_config(environ={"INTELLECT_NODE_CHEAT": "other_weights"})
    assert "cheat" not in cfg.model_dump_json().lower()


def test_the_window_as_the_clock_stood_at_submission():
    """A validator that judges late compares with the clock when the batch was submitted."""
    clock = StepClock(TRAINER, async_level=2)
    clock.observe(TRAINER, StepNotice(step=40, policy_version=40))
    assert clock.window(10, 10) is not None  # judged against now: too old
    assert clock.window(10, 10, at=(11, 11)) is None  # as it stood then: fine
    assert clock.window(10, 10, at=(13, 13)) is not None  # it was stale already then
    assert clock.window(10, 10, at=(None, 0)) is not None  # unknown then: judged against now
    assert clock.window(12, 11, at=(11, 11)) is None  # reached us after the worker: not ahead
    assert clock.window(41, 40, at=(11, 11)) is not None  # ahead of the trainer even now


def test_a_batch_proven_with_other_proof_parameters_is_invalid_before_any_recomputation():
    """A worker picks its batch's proof chunk and top-k; the run's profile checks one pair.
    Another pair was found only by recomputing the whole batch (a confusing "toploc chunks
    fail"); now the cheap checks say so, and an honest batch passes them."""
    import dataclasses

    from crypto.identity import Identity
    from node.roles.services.validator import cheap_checks
    from tests.helpers.batches import WORKER, a_batch

    identity = Identity.generate()
    honest = dataclasses.replace(a_batch(identity, step=2), proof_topk=128)
    sub = SimpleNamespace(worker=WORKER, units=honest.num_tokens, policy_version=0, block=5)
    registrations = SimpleNamespace(get=lambda worker, block: (identity.public_bytes, True))
    clock = StepClock(TRAINER, async_level=2)
    clock.observe(TRAINER, StepNotice(step=2, policy_version=0))
    args = (sub, registrations, clock, None, (32, 128))
    assert cheap_checks(honest, *args) is None
    for other in ({"proof_topk": 8}, {"proof_chunk": 1}):
        verdict = cheap_checks(dataclasses.replace(honest, **other), *args)
        assert verdict is not None and verdict.reason == "invalid", other
        assert "the run's profile checks 32-token chunks, top-128" in verdict.detail


def worker_node(identity, announced: list):
    """What the inference role asks of its node in ``_work``: the announcements it makes
    go to ``announced``."""
    return SimpleNamespace(
        identity=identity,
        metrics=Metrics(),
        header=lambda: {},
        announce=lambda topic, body: announced.append(topic),
    )


@dataclass
class WorkLedger:
    """The chain as ``_work`` uses it: submissions go to ``submitted`` (key, version)."""

    submitted: list

    def submit_work(self, key, units, version):
        self.submitted.append((key, version))


def a_role(tmp_path, node, cheats=None, model=None):
    """The honest inference role, or with ``cheats`` the tests' cheating one."""
    from node.roles.services.inference import InferenceRole
    from tests.helpers.cheating.role import CheatingRole

    cfg = load_config(
        environ={
            "INTELLECT_NODE_RUN__MODEL": str(model or tmp_path),
            "INTELLECT_NODE_DATA_DIR": str(tmp_path),
        }
    ).changed({"run.trainer_peer_id": TRAINER})
    if cheats is None:
        return InferenceRole(node, cfg)
    return CheatingRole(node, cfg, cheats=cheats)


@pytest.mark.parametrize("cheats", [None, "greedy"])
@pytest.mark.parametrize("trainer_moves_on", [False, True])
async def test_a_batch_the_window_moved_past_while_it_was_generated_is_not_submitted(
    tmp_path, trainer_moves_on, cheats
):
    """A worker whose generation outlasted the async window drops the batch: submitting it
    would only get it rejected as invalid. One still inside is stored, announced, submitted.
    A cheating worker counts a cheat made only once the chain took it: the dropped one
    comes again."""
    from crypto.identity import Identity
    from node.rollouts.maker import MadeBatch, MakeBatch
    from tests.helpers.batches import a_batch

    identity = Identity.generate()
    announced, submitted = [], []

    node, ledger = worker_node(identity, announced), WorkLedger(submitted)
    role = a_role(tmp_path, node, cheats)
    role.clock.observe(TRAINER, StepNotice(step=3, policy_version=1))

    class Maker:
        async def call(self, call):
            assert isinstance(call, MakeBatch) and (call.step, call.version) == (3, 1)
            if trainer_moves_on:  # steps 4 and 5 go by while we generate step 3 with v1
                role.clock.observe(TRAINER, StepNotice(step=5, policy_version=4))
            return MadeBatch(a_batch(identity, step=3).encode())

    role.maker, role.chain.ledger = Maker(), ledger
    await role._work(3, 1, str(tmp_path))
    assert role.done_step == 3  # either way, step 3 is not worked on again
    if trainer_moves_on:
        assert (submitted, announced, role.store.keys()) == ([], [], [])
        assert role.counts.stale == 1 and role.status().as_dict()["stale"] == 1
    else:
        assert len(submitted) == 1 and submitted[0][1] == 1 and len(announced) == 1
        assert role.store.keys() == [submitted[0][0]] and role.counts.stale == 0
    if cheats and trainer_moves_on:
        assert role.plan.made == 0 and role.plan.by_key == {}
        assert role.plan.next() == "greedy"
    elif cheats:
        assert role.plan.made == 1 and role.plan.by_key == {submitted[0][0].hex(): "greedy"}


async def test_a_cheat_whose_submission_the_chain_refused_is_not_counted_and_comes_again(
    tmp_path,
):
    """The chain refused the submission (e.g. a version gone stale under load): nobody
    judges it, so it is no cheat made (the matrix waits for what the chain saw), and the
    next batch makes it again."""
    from crypto.identity import Identity
    from ledger.client import LedgerError
    from node.rollouts.maker import MadeBatch
    from tests.helpers.batches import a_batch

    identity = Identity.generate()
    role = a_role(tmp_path, worker_node(identity, []), "inflate_units,withhold")
    role.clock.observe(TRAINER, StepNotice(step=3, policy_version=1))
    submitted = []

    class Maker:
        async def call(self, call):
            return MadeBatch(a_batch(identity, step=call.step).encode())

    class Refusing(WorkLedger):
        def submit_work(self, key, units, version):
            raise LedgerError("refused")

    role.maker, role.chain.ledger = Maker(), Refusing(submitted)
    with pytest.raises(LedgerError):
        await role._work(3, 1, str(tmp_path))
    assert role.plan.made == 0 and role.plan.by_key == {}
    assert role.plan.next() == "inflate_units"
    role.chain.ledger = WorkLedger(submitted)
    await role._work(3, 1, str(tmp_path))  # the step again: the chain took it this time
    ((key, version),) = submitted
    assert role.plan.by_key == {key.hex(): "inflate_units"} and role.plan.next() == "withhold"
    assert role.chain.pending.keys() == [key] and version == 1


@pytest.mark.parametrize("far", [False, True])
async def test_a_version_cheat_is_made_only_with_weights_verification_can_tell_apart(
    tmp_path, tiny_model_dir, far
):
    """``older_version`` generates with an older version held in the window only when their
    weights are at least ``DETECTABLE_APART`` apart (SPEC §19.1); closer, the worker makes
    the batch with the claimed version's weights, records no cheat, and cheats next time."""
    import shutil

    from crypto.identity import Identity
    from node.rollouts.maker import MadeBatch
    from tests.helpers.batches import a_batch
    from tests.helpers.cheating.maker import CheatingBatch
    from tests.test_cheats import moved

    identity = Identity.generate()
    versions = {1: moved(tiny_model_dir, 4e-4 if far else 3e-5, tmp_path / "v1")}
    versions[2] = tmp_path / "v2"
    shutil.copytree(tiny_model_dir, versions[2])
    submitted, made = [], []

    node, ledger = worker_node(identity, []), WorkLedger(submitted)

    class Weights:
        store = SimpleNamespace(complete={1: None, 2: None})

        def model_dir(self, v):
            return versions[v]

    class Maker:
        async def call(self, call):
            assert isinstance(call, CheatingBatch) and (call.step, call.version) == (3, 2)
            made.append((call.model_dir, call.cheat))
            return MadeBatch(a_batch(identity, step=3).encode())

    role = a_role(tmp_path, node, "older_version", model=tiny_model_dir)
    role.clock.observe(TRAINER, StepNotice(step=3, policy_version=2))
    role.maker, role.chain.ledger, role.weights = Maker(), ledger, Weights()
    await role._work(3, 2, str(versions[2]))
    assert len(submitted) == 1 and submitted[0][1] == 2
    if far:
        assert made == [(str(versions[1]), "none")]  # the role's cheat: the maker works honestly
        assert role.plan.by_key == {submitted[0][0].hex(): "older_version"}
    else:
        assert made == [(str(versions[2]), "none")]
        assert role.plan.made == 0 and role.plan.by_key == {}
        assert role.plan.next() == "older_version"


@pytest.mark.parametrize("chain_staleness", [2, 5, 7])
def test_a_worker_never_generates_with_a_version_the_chain_would_refuse_as_stale(
    tmp_path, chain_staleness
):
    """A worker configured with an async window (5) wider than the chain's
    ``max_staleness`` (2) used version 2 at step 7, and the chain refused the batch as stale:
    the step was lost and the run stalled (the matrix met it). The narrower window rules."""
    from node.roles.services.inference import InferenceRole

    cfg = load_config(
        environ={
            "INTELLECT_NODE_RUN__MODEL": str(tmp_path),
            "INTELLECT_NODE_DATA_DIR": str(tmp_path),
        }
    )
    role = InferenceRole(
        SimpleNamespace(metrics=Metrics()),
        cfg.changed({"run.trainer_peer_id": TRAINER, "run.async_level": 5}),
    )
    role.clock.observe(TRAINER, StepNotice(step=7, policy_version=7))
    role.adopt_window(chain_staleness)
    window = min(5, chain_staleness)
    assert role.clock.oldest_version() == 7 - window
    assert role.versions.pick(7, [2, 3, 4, 5, 6], announced=7) == 6
    assert role.versions.pick(7, [2, 3, 4], announced=7) == (None if window == 2 else 4)
    assert role.versions.pick(7, [2], announced=7) == (2 if window >= 5 else None)


def validator_role(tmp_path):
    """A validator role of this run (no node, no chain: its decisions only)."""
    from node.roles.services.validator import ValidatorRole

    cfg = load_config(
        environ={
            "INTELLECT_NODE_RUN__MODEL": str(tmp_path),
            "INTELLECT_NODE_DATA_DIR": str(tmp_path),
        }
    )
    return ValidatorRole(None, cfg.changed({"run.trainer_peer_id": TRAINER}))


def test_a_validator_keeps_the_weights_of_work_it_has_not_judged_yet(tmp_path):
    """``needed_versions``: the on-chain versions of submissions still to judge and the
    version of the batch being judged, whatever the window (SHARDCAST keeps them)."""
    role = validator_role(tmp_path)
    old, new = ("0x" + "12" * 20, b"\x01" * 32), ("0x" + "12" * 20, b"\x02" * 32)
    role.queue.submitted(old, 10, 2, now=0.0, holder="peerA")
    role.queue.submitted(new, 10, 9, now=1.0, holder="peerA")
    assert role.needed_versions() == {2, 9}
    role.queue.fetched(old)  # fetched: being judged now
    role.judging = 2
    assert role.needed_versions() == {2, 9}
    role.queue.judged(old)
    role.judging = None
    assert role.needed_versions() == {9}


async def test_a_batch_a_validator_cannot_judge_now_is_judged_later_not_dropped(
    tmp_path, monkeypatch
):
    """Without the weights of the batch's version, or when the batch checker fails a call,
    the batch goes back to the queue (``check_failed``) instead of being dropped without a
    verdict; a checker process that died ends the role (every batch would fail so)."""
    import node.roles.services.validator as validator_module
    from node.roles.decisions.work import Verdict

    role = validator_role(tmp_path)
    key = ("0x" + "12" * 20, b"\x01" * 32)
    batch = SimpleNamespace(policy_version=4)

    async def fetch_batch(node, peer, work_key, expected_size=None, max_size=None, voucher=b""):
        return batch, b"envelope"

    weights = {"dir": None}

    async def weights_of(version, base, store):
        return weights["dir"]

    class Checker:
        def __init__(self):
            self.fail, self.dead = None, False

        async def call(self, call):
            if self.fail:
                raise OffloadError(self.fail)
            return Verdict.accept()

        def alive(self):
            return not self.dead

    posted = []

    async def post(k, verdict):
        posted.append((k, verdict.reason))

    monkeypatch.setattr(validator_module, "fetch_batch", fetch_batch)
    monkeypatch.setattr(validator_module, "weights_of", weights_of)
    monkeypatch.setattr(validator_module, "cheap_checks", lambda *args: None)
    role.checker, role._post = Checker(), post
    role.submissions[key] = SimpleNamespace(policy_version=4, units=10, block_hash=b"")
    role.queue.submitted(key, 10, 4, now=trio.current_time(), holder="peerA")

    async def fetch_and_judge():
        got = role.queue.next_fetch(trio.current_time() + 10_000)
        assert got == (key, "peerA")
        async with trio.open_nursery() as role.posts:  # its post done when it closes
            await role._judge(got[0], *await role._fetch(*got))

    await fetch_and_judge()  # no weights of version 4 here
    assert posted == [] and role.queue.entries[key].check_failures == 1
    assert role.needed_versions() == {4}
    weights["dir"] = str(tmp_path)
    role.checker.fail = "RuntimeError: out of memory"
    await fetch_and_judge()  # the checker failed the call
    assert posted == [] and role.queue.entries[key].check_failures == 2
    role.checker.fail = None
    await fetch_and_judge()
    assert posted == [(key, "accepted")] and role.queue.waiting() == 0
    role.queue.submitted(key, 10, 4, now=0.0, holder="peerA")
    assert role.queue.next_fetch(10_000) is None  # judged once only

    other = ("0x" + "12" * 20, b"\x02" * 32)
    role.submissions[other] = SimpleNamespace(policy_version=4, units=10, block_hash=b"")
    role.queue.submitted(other, 10, 4, now=trio.current_time(), holder="peerA")
    role.checker.fail, role.checker.dead = "the worker process died (exit code -9)", True
    got = role.queue.next_fetch(trio.current_time())
    with pytest.raises(OffloadError, match="died"):
        await role._judge(got[0], *await role._fetch(*got))


async def test_a_batch_ahead_of_the_validators_clock_gets_no_verdict_until_it_catches_up(
    tmp_path, monkeypatch
):
    """A batch the cheap checks find ahead of the trainer's step as this validator knows it
    (``Later``) is not rejected (a bonded reject, overturned by validators told of the step
    first: issue #54): nothing is posted, and it is judged again, on its merits, later."""
    import node.roles.services.validator as validator_module
    from node.roles.decisions.work import Later, Verdict

    role = validator_role(tmp_path)
    key = ("0x" + "12" * 20, b"\x01" * 32)
    batch = SimpleNamespace(policy_version=4)

    async def fetch_batch(node, peer, work_key, expected_size=None, max_size=None, voucher=b""):
        return batch, b"envelope"

    async def weights_of(version, base, store):
        return str(tmp_path)

    class Checker:
        async def call(self, call):
            return Verdict.accept()

    posted, told = [], {"step": False}

    async def post(k, verdict):
        posted.append((k, verdict.reason))

    def cheap_checks(*args):
        return None if told["step"] else Later("step 5 / version 4 is ahead of the trainer's")

    monkeypatch.setattr(validator_module, "fetch_batch", fetch_batch)
    monkeypatch.setattr(validator_module, "weights_of", weights_of)
    monkeypatch.setattr(validator_module, "cheap_checks", cheap_checks)
    role.checker, role._post = Checker(), post
    role.submissions[key] = SimpleNamespace(policy_version=4, units=10, block_hash=b"")
    role.queue.submitted(key, 10, 4, now=trio.current_time(), holder="peerA")

    async def fetch_and_judge():
        got = role.queue.next_fetch(trio.current_time() + 10_000)
        assert got == (key, "peerA")
        async with trio.open_nursery() as role.posts:  # its post done when it closes
            await role._judge(got[0], *await role._fetch(*got))

    await fetch_and_judge()
    assert posted == [] and role.queue.entries[key].check_failures == 1
    told["step"] = True
    await fetch_and_judge()
    assert posted == [(key, "accepted")]


async def test_a_body_served_under_a_key_it_does_not_hash_to_is_a_failed_fetch(
    tmp_path, monkeypatch
):
    """``key_mismatch``: the worker's signed body does not hash to the submitted key. It
    was rejected at once as ``mismatch``, a bonded reject: a worker that served one
    validator such a body and the others the real batch had the others accept, overturn it
    and burn that validator's bond, at no cost to itself. The chain cannot check the
    signature, so it is now a failed fetch: asked again, and ``unavailable`` (unbonded)
    if nobody ever serves the matching batch."""
    import node.roles.services.validator as validator_module
    from protocol.errors import Reason, WireError

    role = validator_role(tmp_path)
    key = ("0x" + "12" * 20, b"\x01" * 32)

    async def fetch_batch(node, peer, work_key, expected_size=None, max_size=None, voucher=b""):
        # what fetch_batch raises for it (tests/test_batch_exchange.py, "other_batch")
        raise WireError(Reason.MALFORMED, "the batch does not hash to its work key")

    posted = []

    async def post(k, verdict):
        posted.append((k, verdict.reason))

    monkeypatch.setattr(validator_module, "fetch_batch", fetch_batch)
    role._post = post
    role.submissions[key] = SimpleNamespace(policy_version=0, units=6, block_hash=b"")
    role.queue.submitted(key, 6, 0, now=0.0, holder="worker-peer")
    got = role.queue.next_fetch(0.0)
    assert await role._fetch(*got) is None
    assert posted == [] and role.fetch_failures == 1
    assert role.queue.entries[key].attempts == 1  # asked again after its back-off
    assert role.queue.next_fetch(1e6) == (key, "worker-peer")


async def test_a_timed_out_fetch_leaves_the_connection_to_other_fetches_from_its_peer(
    tmp_path, monkeypatch, autojump_clock
):
    """A fetch that timed out drops its connection (a stuck one is dialled afresh); with
    fetches side by side, one peer (an announcer, or one node registered for several
    worker addresses) may serve several at once: theirs must not die with it."""
    import node.roles.services.validator as validator_module
    from protocol.errors import Reason, WireError

    role = validator_role(tmp_path)
    dropped = []

    async def disconnect(peer):
        dropped.append(peer)

    async def fetch_batch(node, peer, work_key, expected_size=None, max_size=None, voucher=b""):
        await trio.sleep(10 if work_key[0] != 2 else 100)
        if work_key[0] != 2:
            raise WireError(Reason.TIMEOUT, "no whole batch within the deadline")
        return SimpleNamespace(policy_version=0), b"envelope"

    monkeypatch.setattr(validator_module, "fetch_batch", fetch_batch)
    role.node = SimpleNamespace(disconnect=disconnect)
    for n in (1, 2, 3):
        key = ("0x" + f"{n:02x}" * 20, bytes([n]) * 32)
        role.submissions[key] = SimpleNamespace(policy_version=0, units=6, block_hash=b"")
        role.queue.submitted(key, 6, 0, now=float(n), holder="shared-peer")
    first, second = role.queue.next_fetch(5.0), role.queue.next_fetch(5.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(role._fetch, *first)
        nursery.start_soon(role._fetch, *second)
    assert dropped == []  # the first timed out while the second still used the connection
    assert await role._fetch(*role.queue.next_fetch(200.0)) is None  # alone: dropped
    assert dropped == ["shared-peer"] and not role.fetching_from


def serving_validator(tmp_path, monkeypatch, slow: dict[bytes, float]):
    """A validator role whose loop runs without a network or a chain: a fetch of a key in
    ``slow`` takes that many seconds (a batch sent at the slowest rate its deadline allows),
    any other is at once; every batch is accepted. Returns the role and its event log:
    ("fetch", key byte, when) as a fetch starts, ("post", key byte, when) as it is posted."""
    import node.roles.services.validator as validator_module
    from node.roles.decisions.work import Verdict

    role = validator_role(tmp_path)
    role.node = SimpleNamespace(subscribe=lambda *a: None, add_status=lambda *a: None)
    role.clock.step = 0
    log = []

    async def fetch_batch(node, peer, work_key, expected_size=None, max_size=None, voucher=b""):
        log.append(("fetch", work_key[0], trio.current_time()))
        await trio.sleep(slow.get(work_key, 0.0))
        return SimpleNamespace(policy_version=0), b"envelope"

    async def post(key, verdict):
        log.append(("post", key[1][0], trio.current_time()))

    async def checker_call(call):
        await trio.sleep(1.0)  # one batch judged at a time, a second each
        return Verdict.accept()

    async def nothing_new():
        return False

    async def inline(fn, *args):  # a worker thread would let the virtual clock jump
        return fn(*args)

    monkeypatch.setattr(validator_module, "fetch_batch", fetch_batch)
    monkeypatch.setattr(validator_module, "cheap_checks", lambda *args: None)
    monkeypatch.setattr(trio.to_thread, "run_sync", inline)
    role.checker, role._post, role._read_chain = (
        SimpleNamespace(call=checker_call),
        post,
        nothing_new,
    )
    return role, log


def submit(role, worker: str, n: int, at: float) -> None:
    key = (worker, bytes([n]) * 32)
    role.submissions[key] = SimpleNamespace(policy_version=0, units=10, block_hash=b"")
    role.queue.submitted(key, 10, 0, now=at, holder=f"peer-{worker[-2:]}")


async def test_a_slow_worker_holds_one_fetch_while_the_others_batches_are_judged(
    tmp_path, monkeypatch, autojump_clock
):
    """Fetches ran one at a time: a worker that sends its batch at the slowest rate the
    deadline allows (here 100 s) held the validator's only fetch, and every other worker's
    batch waited behind it. Now up to ``FETCHES`` run at once, one per worker: the slow
    worker's second batch waits for its first, nobody else's does, and the next batch is
    fetched while one is judged."""
    slow = ("0x" + "aa" * 20, [1, 2])
    role, log = serving_validator(tmp_path, monkeypatch, {bytes([1]) * 32: 100.0})
    for n in slow[1]:
        submit(role, slow[0], n, at=0.0)  # the oldest submissions: fetched first
    for n in (3, 4, 5):
        submit(role, "0x" + f"{n:02x}" * 20, n, at=1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(role._serve)
        await trio.sleep(250)
        nursery.cancel_scope.cancel()
    when = {(kind, n): t for kind, n, t in log}
    assert {n for kind, n, _ in log if kind == "post"} == {1, 2, 3, 4, 5}, log
    assert all(when[("fetch", n)] < 1.0 for n in (1, 3, 4, 5))  # at once, side by side
    assert max(when[("post", n)] for n in (3, 4, 5)) < 10  # judged one after the other
    assert when[("fetch", 2)] >= 100  # the slow worker's second batch: after its first
    assert when[("post", 1)] >= 100


async def test_at_most_fetches_batches_are_fetched_at_once(tmp_path, monkeypatch, autojump_clock):
    from node.roles.services.validator import FETCHES

    slow = {bytes([n]) * 32: 50.0 for n in range(1, FETCHES + 1)}
    role, log = serving_validator(tmp_path, monkeypatch, slow)
    for n in range(1, FETCHES + 2):  # one worker each; the last one's batch is quick
        submit(role, "0x" + f"{n:02x}" * 20, n, at=float(n))
    async with trio.open_nursery() as nursery:
        await nursery.start(role._serve)
        await trio.sleep(100)
        nursery.cancel_scope.cancel()
    when = {(kind, n): t for kind, n, t in log}
    assert all(when[("fetch", n)] < 1.0 for n in range(1, FETCHES + 1))
    assert when[("fetch", FETCHES + 1)] >= 50  # no slot until a slow one ended
    assert role.fetches == 0


async def test_a_fetch_expects_the_size_its_own_peer_announced(
    tmp_path, monkeypatch, autojump_clock
):
    """The first notice of a key set the size every fetch of it expected, whoever sent
    it: a spoofed notice (size 1) made every fetch from the real worker fail as
    oversized, and the honest batch ended unavailable. A fetch from a peer expects what
    that peer announced; the worker's registered peer is asked first."""
    import dataclasses

    import node.roles.services.validator as validator_module
    from protocol.errors import Reason, WireError

    role = validator_role(tmp_path)
    key = ("0x" + "12" * 20, b"\x01" * 32)
    expected = []

    async def fetch_batch(node, peer, work_key, expected_size=None, max_size=None, voucher=b""):
        expected.append((peer, expected_size, max_size))
        raise WireError(Reason.OVERSIZED, "stop here")

    def notice(size):
        return BatchNotice(
            work_key=key[1], worker=key[0], step=0, policy_version=0, units=1, size=size
        )

    monkeypatch.setattr(validator_module, "fetch_batch", fetch_batch)
    role.on_notice("spoofer", notice(1))  # first, before the worker's own
    role.on_notice("worker-peer", notice(5000))
    role.submissions[key] = SimpleNamespace(policy_version=0, units=1, block_hash=b"")
    role.queue.submitted(key, 1, 0, now=trio.current_time(), holder="worker-peer")
    got = role.queue.next_fetch(trio.current_time())
    assert got == (key, "worker-peer")
    assert await role._fetch(*got) is None
    # and at most what one submitted unit allows, with the run's proof parameters
    assert expected == [("worker-peer", 5000, max_envelope_size(1, 32, 128))]
    for i in range(2, 200):  # notices of keys never submitted: forgotten with their keys
        role.on_notice(f"peer-{i}", dataclasses.replace(notice(7), work_key=bytes([i]) * 32))
    assert len(role.notices) == 200  # with the spoofer's, announced while it could be asked
    await trio.sleep(role.queue.fetch_deadline_s + 1)  # they expire unsubmitted
    role.on_notice("peer-late", dataclasses.replace(notice(7), work_key=b"\xfe" * 32))
    late = ((key[0], b"\xfe" * 32), "peer-late")
    assert set(role.notices) == {(key, "worker-peer"), (key, "spoofer"), late}


async def test_a_validator_reads_the_chain_at_once_after_a_notice_and_less_often_when_idle(
    tmp_path, autojump_clock
):
    """Its chain reads (``_read_chain``) back off 0.25 → 0.5 → 1 → 2 → 4 s while nothing new
    is submitted, a batch notice brings the next read forward to now, and a read that finds
    work starts again at 0.25 s."""
    role = validator_role(tmp_path)
    reads, found = [], {5}  # the 6th read finds a submission

    async def read_chain():
        reads.append(round(trio.current_time(), 3))
        return len(reads) - 1 in found

    role._read_chain = read_chain
    async with trio.open_nursery() as nursery:
        nursery.start_soon(role._watch_chain)
        await trio.sleep(10.2)
        notice = BatchNotice(
            work_key=b"\x01" * 32,
            worker="0x" + "12" * 20,
            step=0,
            policy_version=0,
            units=1,
            size=1,
        )
        role.on_notice("peerA", notice)  # not submitted yet: its submission is on its way
        await trio.sleep(0.8)
        for _ in range(100):  # a flood of notices: still at most one read per 0.25 s
            role.on_notice("peerA", notice)
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert reads[:8] == [0, 0.5, 1.5, 3.5, 7.5, 10.2, 10.45, 10.95]
    assert reads[8:] == [11.2, 11.45, 11.7, 11.95], reads


def test_a_part_held_only_once_started_is_refused_before_and_held_after():
    """``Started``: the ledger and the child process a role opens when it starts; read
    before, a clear error (not an AttributeError on None far from the cause)."""
    from node.roles.io.chain import ChainSetupError
    from node.roles.io.votes import Votes

    votes = Votes()
    with pytest.raises(ChainSetupError, match="opened when the role starts"):
        votes.ledger  # noqa: B018
    double = object()
    votes.ledger = double
    assert votes.ledger is double and votes._ledger is double
