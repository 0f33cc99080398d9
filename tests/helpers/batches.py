"""A small signed-batch maker for tests that need a well-formed ``RolloutBatch`` without a
model (the batch store, the batch exchange, the roles)."""

from crypto.sampling import derive_seed
from protocol.rollouts import RolloutBatch, RolloutGroup, RolloutSample, pack_floats, pack_tokens

WORKER = "0x" + "12" * 20
KEY = bytes(range(32))


def header(identity, seq=1):
    return dict(run_id="test-run", sender=identity.peer_id, seq=seq, ts_ms=1_700_000_000_000)


def a_batch(identity, step=3, reward=1.0):
    samples = [
        RolloutSample(
            sample=s,
            seed=derive_seed(WORKER, "t/1", step, s),
            tokens=pack_tokens([5, 6, 7]),
            logprobs=pack_floats([-0.5, -1.0, -0.25]),
            finish_reason="length",
            reward=reward,
            proofs=[bytes(6), bytes(6)],
        )
        for s in range(2)
    ]
    return RolloutBatch(
        **header(identity),
        worker=WORKER,
        step=step,
        policy_version=0,
        taskset="arithmetic",
        group_size=2,
        max_new_tokens=3,
        temperature=1.0,
        top_p=1.0,
        proof_chunk=32,
        proof_topk=2,
        groups=[RolloutGroup(index=0, task_id="t/1", prompt=pack_tokens([2, 9]), samples=samples)],
    )


def made_by(maker, model_dir, worker, cheat="none", *, version=0, step=3):
    """What ``maker`` (a ``BatchMaker``; a ``CheatingMaker`` for a ``cheat``) makes with the
    weights in ``model_dir`` for ``worker``, signed by a new peer key: (its reply, the
    batch, the envelope)."""
    from crypto.identity import Identity
    from node.rollouts.maker import MakeBatch
    from protocol.wire import seal
    from tests.helpers.cheating.maker import CheatingBatch

    identity = Identity.generate()
    args = (str(model_dir), worker, step, version, header(identity))
    reply = maker(MakeBatch(*args) if cheat == "none" else CheatingBatch(*args, cheat=cheat))
    batch = RolloutBatch.decode(reply.encoded)
    return reply, batch, seal(identity, batch)
