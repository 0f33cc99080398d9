"""The validator's cheap checks (``node/roles/services/validator.py`` ``cheap_checks``, checks 1-3):
each refuses the batch that breaks it, whatever the ledger contract also enforces."""

import dataclasses
from types import SimpleNamespace

import pytest

from crypto.identity import Identity
from node.roles.decisions.clock import StepClock
from node.roles.decisions.work import Later
from node.roles.services.validator import cheap_checks
from protocol.batches import StepNotice
from tests.helpers.batches import WORKER, a_batch

TRAINER = "12D3KooW" + "A" * 44
PROOFS = (32, 2)  # a_batch's chunk size and top-k


@pytest.fixture
def worker():
    return Identity.generate()


def batch_of(worker, step=3):
    """A batch of ``step`` made with policy version ``step - 1`` (inside the window)."""
    return dataclasses.replace(a_batch(worker, step=step), policy_version=step - 1)


def judged(batch, worker_key, *, units=None, version=None, valid=True, clock_step=3, at=None):
    """``cheap_checks`` of ``batch`` as submitted by ``WORKER`` with ``units`` and policy
    ``version`` (default: the batch's), ``WORKER`` registered with ``worker_key``, the
    trainer at ``clock_step``."""
    sub = SimpleNamespace(
        worker=WORKER,
        units=batch.num_tokens if units is None else units,
        policy_version=batch.policy_version if version is None else version,
        block=5,
    )
    # the registration as of the submission's block; the chain's answer for an address
    # (or a block) nobody registered at: no key, not valid
    registered = {(WORKER, 5): (worker_key, valid)}
    registrations = SimpleNamespace(
        get=lambda address, block: registered.get((address, block), (bytes(32), False))
    )
    clock = StepClock(TRAINER, async_level=2)
    clock.observe(TRAINER, StepNotice(step=clock_step, policy_version=clock_step - 1))
    return cheap_checks(batch, sub, registrations, clock, at, PROOFS)


def test_an_honest_batch_passes_the_cheap_checks(worker):
    assert judged(batch_of(worker), worker.public_bytes) is None


@pytest.mark.parametrize("extra", [1, 1000, -1])
def test_a_batch_whose_units_are_not_its_tokens_is_a_mismatch(worker, extra):
    """A worker paid by ``units`` claims more than it generated (or fewer): refused."""
    batch = batch_of(worker)
    verdict = judged(batch, worker.public_bytes, units=batch.num_tokens + extra)
    assert verdict is not None, f"units {batch.num_tokens + extra} for {batch.num_tokens} tokens"
    assert verdict.reason == "mismatch"
    assert f"units {batch.num_tokens + extra} on-chain" in verdict.detail


# the trainer at step 6 with version 5, async level 2; each case breaks one bound only
@pytest.mark.parametrize(
    ("step", "version", "why"),
    [
        (3, 5, "step 3 is older than 6 - 2"),
        (6, 3, "policy version 3 is older than step 6 - 2"),
        (4, 2, "policy version 2 is older than the window allows"),
    ],
)
def test_a_batch_outside_the_step_window_is_invalid(worker, step, version, why):
    batch = dataclasses.replace(batch_of(worker, step=step), policy_version=version)
    verdict = judged(batch, worker.public_bytes, clock_step=6)
    assert verdict is not None, f"step {step} / version {version} accepted at step 6 / version 5"
    assert verdict.reason == "invalid"
    assert why in verdict.detail


@pytest.mark.parametrize(("step", "version"), [(7, 5), (6, 6), (9, 8)])
def test_a_batch_ahead_of_the_trainer_is_judged_later_never_rejected(worker, step, version):
    """Ahead of the step this validator knows is a matter of when (the worker may have been
    told first, or served this validator before the announcement): no verdict now, the
    batch is judged again later (issue #54: a bonded reject for it was overturned)."""
    batch = dataclasses.replace(batch_of(worker, step=step), policy_version=version)
    later = judged(batch, worker.public_bytes, clock_step=6)
    assert isinstance(later, Later), later
    assert "ahead of the trainer" in later.why
    told = max(step, version + 1)  # the trainer announced the step since
    assert judged(batch, worker.public_bytes, clock_step=told) is None


@pytest.mark.parametrize(("step", "version"), [(4, 5), (6, 5), (6, 4), (4, 3)])
def test_a_batch_at_the_edges_of_the_window_passes(worker, step, version):
    batch = dataclasses.replace(batch_of(worker, step=step), policy_version=version)
    assert judged(batch, worker.public_bytes, clock_step=6) is None


def test_staleness_is_judged_against_the_clock_at_submission(worker):
    """A validator judging late does not count its delay against the worker."""
    batch = batch_of(worker, step=3)
    assert judged(batch, worker.public_bytes, clock_step=6, at=(4, 3)) is None
    assert judged(batch, worker.public_bytes, clock_step=6, at=(6, 5)) is not None


def test_a_batch_signed_by_another_peer_than_the_registered_one_is_invalid(worker):
    other = Identity.generate()
    verdict = judged(batch_of(worker), other.public_bytes)
    assert verdict is not None, "a batch signed by a peer the worker did not register passed"
    assert verdict.reason == "invalid"
    assert "registered peer key" in verdict.detail
    assert verdict.detail == "not signed by the worker's registered peer key"


def test_a_batch_of_a_worker_whose_registration_signature_is_invalid_is_invalid(worker):
    """The EVM cannot check the registration's Ed25519 signature: the node does."""
    verdict = judged(batch_of(worker), worker.public_bytes, valid=False)
    assert verdict is not None, "a batch of an invalid registration passed"
    assert verdict.reason == "invalid"
    assert "registered peer key" in verdict.detail
    assert verdict.detail == "not signed by the worker's registered peer key"


def test_a_batch_of_an_unregistered_worker_is_invalid(worker):
    verdict = judged(batch_of(worker), bytes(32), valid=False)
    assert verdict is not None and verdict.reason == "invalid"


def test_a_batch_naming_another_worker_is_a_mismatch(worker):
    batch = dataclasses.replace(batch_of(worker), worker="0x" + "34" * 20)
    verdict = judged(batch, worker.public_bytes)
    assert verdict is not None and verdict.reason == "mismatch"
    assert "another worker" in verdict.detail
    assert verdict.detail == "the batch names another worker"


def test_checks_before_the_role_read_its_registrations_fail_loudly(worker):
    """A programming error, not a verdict: no batch is judged without the chain's word."""
    batch = batch_of(worker)
    sub = SimpleNamespace(worker=WORKER, units=batch.num_tokens, policy_version=1)
    clock = StepClock(TRAINER, async_level=2)
    with pytest.raises(AssertionError) as exc:
        cheap_checks(batch, sub, None, clock, None, PROOFS)
    assert str(exc.value) == "the role reads registrations once it is set up"


def test_a_batch_of_another_policy_version_than_submitted_is_a_mismatch(worker):
    """Both versions inside the window: the batch must still be the one submitted."""
    batch = batch_of(worker)  # step 3, version 2
    verdict = judged(batch, worker.public_bytes, version=1)
    assert verdict is not None, "a batch of version 2 passed for a submission of version 1"
    assert verdict.reason == "mismatch"
    assert verdict.detail == "policy version differs from the submission"


@pytest.mark.parametrize(("chunk", "topk"), [(16, 2), (32, 4), (64, 1)])
def test_a_batch_whose_proofs_are_not_the_profiles_is_invalid(worker, chunk, topk):
    """Proofs of another chunk size or top-k than the run's profile checks: refused before
    any prefill, whatever they prove."""
    batch = dataclasses.replace(batch_of(worker), proof_chunk=chunk, proof_topk=topk)
    verdict = judged(batch, worker.public_bytes)
    assert verdict is not None, f"proofs of {chunk}-token chunks, top-{topk} passed"
    assert verdict.reason == "invalid"
    assert verdict.detail == (
        f"proofs of {chunk}-token chunks, top-{topk}: the run's profile checks 32-token"
        " chunks, top-2"
    )
    assert not verdict.accepted


def test_a_batch_is_fetched_from_the_peer_registered_when_it_was_submitted():
    """A worker that rotated its peer key after submitting (issue #54's split) is fetched
    from, first, the peer registered at the submission's block: the rotated-to key's peer
    may not exist, and asking it first held validators back for a minute."""
    from crypto.identity import Identity
    from node.roles.io.docket import registered_peer

    before, after = Identity.generate(), Identity.generate()

    class Registrations:  # the validator's cache: rotated at block 11
        def get(self, worker, block=None):
            key = before if block is not None and block <= 10 else after
            return key.public_bytes, True

    assert registered_peer(Registrations(), "0xw", 10) == before.peer_id
    assert registered_peer(Registrations(), "0xw") == after.peer_id
