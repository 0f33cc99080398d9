"""Rollout batches: built from the real tiny model, signed, verified; malformed ones refused."""

import copy
import dataclasses

import msgpack
import numpy as np
import pytest
import torch

from crypto.identity import Identity
from crypto.sampling import derive_seed
from crypto.verdict import RolloutClaim, check_rollout
from node.engine.base import SamplingParams
from node.engine.models import load_model, prompt_ids
from node.engine.torch_engine import TorchEngine, recompute
from node.rollouts.generate import generate_groups, to_batch
from node.tasks import assign, load_taskset
from protocol.errors import Reason, WireError
from protocol.rollouts import (
    MAX_BATCH_SIZE,
    RolloutBatch,
    RolloutGroup,
    RolloutSample,
    pack_floats,
    pack_tokens,
)
from protocol.wire import open_message, seal

WORKER = "0x" + "5a" * 20
PARAMS = SamplingParams(max_new_tokens=12, temperature=1.0)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request):
    """The tiny Llama, and the Qwen2-family model (its prompts through its chat template)."""
    if request.param == "llama":
        return request.getfixturevalue("tiny_model")
    return load_model(request.getfixturevalue("qwen2_model_dir"))


@pytest.fixture(scope="module")
def made(model):
    identity = Identity.generate()
    engine = TorchEngine(model.model, eos_token_ids=model.eos_token_ids)
    taskset = load_taskset("arithmetic")
    groups = generate_groups(
        engine,
        model.tokenizer,
        taskset,
        worker=WORKER,
        step=5,
        count=6,
        group_size=4,
        params=PARAMS,
    )
    batch = to_batch(
        groups,
        run_id="test",
        sender=identity.peer_id,
        seq=1,
        ts_ms=1000,
        worker=WORKER,
        step=5,
        policy_version=3,
        taskset=taskset.name,
        params=PARAMS,
    )
    return identity, taskset, groups, batch


def test_signed_batch_round_trip(made):
    identity, _, _, batch = made
    data = seal(identity, batch)
    back = open_message(data, RolloutBatch)
    assert back == batch
    assert back.num_samples == 24 and back.group_size == 4
    assert back.num_tokens == sum(len(s.token_ids) for g in back.groups for s in g.samples)
    other = Identity.generate()
    with pytest.raises(WireError) as e:  # someone else cannot sign it as the worker's node
        open_message(seal(other, batch), RolloutBatch)
    assert e.value.reason == Reason.SENDER_MISMATCH


def test_validator_reproduces_everything(made, model):
    """What a validator does with a batch: same tasks, same seeds, rewards, proofs, sampling."""
    _, taskset, _, batch = made
    tasks = assign(taskset, batch.worker, batch.step, len(batch.groups))
    tok = model.tokenizer
    for g, task in zip(batch.groups, tasks, strict=True):
        assert g.task_id == task.task_id
        assert g.prompt_ids == prompt_ids(tok, task.prompt)
        for s in g.samples:
            assert s.seed == derive_seed(batch.worker, g.task_id, batch.step, s.sample)
            text = tok.decode(s.token_ids, skip_special_tokens=True)
            assert s.reward == task.reward(text)
            acts, logits = recompute(model.model, g.prompt_ids, s.token_ids)
            claim = RolloutClaim(
                s.token_ids,
                s.proofs,
                s.seed,
                s.finish_reason,
                batch.max_new_tokens,
                batch.temperature,
                batch.top_p,
            )
            assert check_rollout(claim, acts, logits, eos_token_id=tok.eos_token_id).passed
            lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(s.token_ids)[:, None])[:, 0]
            assert np.allclose(s.logprob_values, lp.numpy(), atol=1e-4)


def test_work_key(made):
    _, _, _, batch = made
    key = batch.work_key()
    assert len(key) == 32
    assert dataclasses.replace(batch, seq=99, ts_ms=5).work_key() == key  # same work, same key
    assert dataclasses.replace(batch, policy_version=4).work_key() != key
    g0 = batch.groups[0]
    s0 = g0.samples[0]
    edited = dataclasses.replace(s0, reward=1.0 - s0.reward)
    g_edit = dataclasses.replace(g0, samples=[edited, *g0.samples[1:]])
    assert dataclasses.replace(batch, groups=[g_edit, *batch.groups[1:]]).work_key() != key


def raw(batch):
    return {"type": RolloutBatch.TYPE, **batch.to_obj()}


def refused(obj, match):
    with pytest.raises(WireError, match=match) as e:
        RolloutBatch.decode(msgpack.packb(obj, use_bin_type=True))
    assert e.value.reason == Reason.MALFORMED
    return e


def sample0(obj):
    return obj["groups"][0]["samples"][0]


def test_malformed_batches_are_refused(made):
    _, _, _, batch = made
    base = raw(batch)
    RolloutBatch.decode(msgpack.packb(base, use_bin_type=True))  # the unmodified one decodes

    def case(edit, match):
        obj = copy.deepcopy(base)
        edit(obj)
        refused(obj, match)

    case(lambda o: sample0(o).update(logprobs=sample0(o)["logprobs"][:-4]), "logprobs for")
    case(lambda o: sample0(o).update(tokens=sample0(o)["tokens"] + b"\x00"), "uint32")
    case(lambda o: sample0(o).update(tokens=b""), "non-empty")
    case(lambda o: sample0(o).update(proofs=sample0(o)["proofs"][:-1]), "proofs")
    case(lambda o: sample0(o).update(proofs=[]), "proofs")
    case(lambda o: sample0(o).update(proofs=[p[:-1] for p in sample0(o)["proofs"]]), "bytes")
    case(
        lambda o: sample0(o).update(
            logprobs=pack_floats([float("nan")] * (len(sample0(o)["tokens"]) // 4))
        ),
        "finite",
    )
    case(
        lambda o: sample0(o).update(logprobs=pack_floats([0.5] * (len(sample0(o)["tokens"]) // 4))),
        "<= 0",
    )
    case(lambda o: sample0(o).update(reward=1.5), "reward")
    case(lambda o: sample0(o).update(reward=1), "float")
    case(lambda o: sample0(o).update(finish_reason="eos"), "finish_reason")
    case(lambda o: sample0(o).update(seed=sample0(o)["seed"] ^ 1), "seed")
    case(lambda o: sample0(o).update(sample=1), "sample index")
    case(lambda o: sample0(o).pop("proofs"), "missing fields")
    case(lambda o: sample0(o).update(extra=1), r"samples\[0\]: 8 fields, at most 7")
    case(lambda o: o["groups"][0]["samples"].pop(), "group size")
    case(lambda o: o["groups"][0].update(prompt=b""), "prompt")
    case(lambda o: o["groups"].reverse(), "increasing")
    case(lambda o: o.update(groups=[]), "no groups")
    case(lambda o: o.update(groups="x"), "list")
    case(lambda o: o["groups"].__setitem__(0, [1, 2]), "map")
    case(lambda o: o.update(max_new_tokens=1), "max_new_tokens")
    case(lambda o: o.update(worker="0xABC"), "worker")
    case(lambda o: o.update(top_p=0.0), "top_p")
    case(lambda o: o.update(temperature=float("inf")), "finite")

    # a 'length' ending must use the whole budget
    obj = copy.deepcopy(base)
    budget = obj["max_new_tokens"]
    short = next(
        x
        for g in obj["groups"]
        for x in g["samples"]
        if x["finish_reason"] == "stop" and len(x["tokens"]) // 4 < budget
    )
    short["finish_reason"] = "length"
    refused(obj, "below max_new_tokens")


def test_garbage_and_oversized_batches(made):
    identity, _, _, batch = made
    for junk in (b"", b"\xc1", b"\x92\x01\x02", np.random.default_rng(0).bytes(5000)):
        with pytest.raises(WireError):
            RolloutBatch.decode(junk)
        with pytest.raises(WireError):
            open_message(junk, RolloutBatch)
    with pytest.raises(WireError) as e:
        RolloutBatch.decode(b"\x00" * (MAX_BATCH_SIZE + 1))
    assert e.value.reason == Reason.OVERSIZED
    # a batch whose fields are each within limits but whose whole is not cannot be encoded
    n = 16384
    huge = dataclasses.replace(
        batch,
        max_new_tokens=n,
        proof_chunk=n,
        groups=[
            RolloutGroup(
                index=i,
                task_id=f"t{i}",
                prompt=pack_tokens([7]),
                samples=[
                    RolloutSample(
                        sample=j,
                        seed=derive_seed(batch.worker, f"t{i}", batch.step, j),
                        tokens=pack_tokens([9] * n),
                        logprobs=pack_floats([-1.0] * n),
                        finish_reason="length",
                        reward=0.0,
                        proofs=[bytes(258)] * 2,
                    )
                    for j in range(batch.group_size)
                ],
            )
            for i in range(100)
        ],
    )
    with pytest.raises(WireError) as e:
        huge.encode()
    assert e.value.reason == Reason.OVERSIZED
    # a tampered signed envelope is refused before any rollout logic
    data = bytearray(seal(identity, batch))
    data[len(data) // 2] ^= 0xFF
    with pytest.raises(WireError):
        open_message(bytes(data), RolloutBatch)
