"""Where the nodes compute: the ``device`` setting of the engine and the batch checker, the
devnet's ``--device`` and ``--validator-devices``, the trainer's precision, the 1.1B model
shape, the validator's per-worker tally and the GPU devnet bench's arithmetic.

The GPU itself is not here (tests/test_gpu.py, ``-m gpu``): on this machine a node asked for
CUDA must refuse at once and in one line, which shows the setting reaches the code that
loads the model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from node.cli.devnet import DEVNET_WORK, check_devices, devices_env, work_settings
from node.roles.decisions.status import WorkerTally

REPO = Path(__file__).resolve().parent.parent
NO_GPU = not torch.cuda.is_available()


def test_a_gpu_devnet_is_a_gpu_bf16_run_with_each_validator_on_its_own_device():
    common, own = devices_env("cuda", ["cuda", "cpu"], ["validator-0", "validator-1"])
    assert common == {
        "INTELLECT_NODE_ENGINE__DEVICE": "cuda",
        "INTELLECT_NODE_TRAINER__DEVICE": "cuda",
        "INTELLECT_NODE_RUN__VERIFY_PROFILE": "gpu-bf16",
    }
    assert own["validator-0"] == {"INTELLECT_NODE_ENGINE__DEVICE": "cuda"}
    # the CPU validator of a GPU run takes the cores the GPU nodes leave
    assert own["validator-1"] == {
        "INTELLECT_NODE_ENGINE__DEVICE": "cpu",
        "INTELLECT_NODE_ENGINE__TORCH_THREADS": "0",
    }


def test_a_cpu_devnet_stays_strict_fp32():
    common, own = devices_env("cpu", ["cpu"], ["validator"])
    assert "INTELLECT_NODE_RUN__VERIFY_PROFILE" not in common
    assert work_settings(common, environ={})["INTELLECT_NODE_RUN__VERIFY_PROFILE"] == "strict-fp32"
    assert own == {"validator": {"INTELLECT_NODE_ENGINE__DEVICE": "cpu"}}
    # one GPU validator makes it a gpu-bf16 run: a CPU worker's fp32 is within that profile
    common, own = devices_env("cpu", ["cuda", "cpu"], ["validator-0", "validator-1"])
    assert work_settings(common, environ={})["INTELLECT_NODE_RUN__VERIFY_PROFILE"] == "gpu-bf16"
    # the CPU validator shares the cores with CPU workers and trainer: one thread, as they
    assert own["validator-1"] == {"INTELLECT_NODE_ENGINE__DEVICE": "cpu"}


def test_the_devnets_work_settings_yield_to_the_environment():
    common, _ = devices_env("cuda", ["cuda"], ["validator"])
    env = {
        "INTELLECT_NODE_RUN__TASKS_PER_BATCH": "8",
        "INTELLECT_NODE_RUN__VERIFY_PROFILE": "paper",
    }
    got = work_settings(common, environ=env)
    assert got["INTELLECT_NODE_RUN__TASKS_PER_BATCH"] == "8"
    assert got["INTELLECT_NODE_RUN__VERIFY_PROFILE"] == "paper"  # the user's, over the device's
    assert got["INTELLECT_NODE_RUN__GROUP_SIZE"] == DEVNET_WORK["INTELLECT_NODE_RUN__GROUP_SIZE"]


@pytest.mark.parametrize(
    ("device", "listed", "message"),
    [
        ("tpu", ["cpu"], "device 'tpu'"),
        ("cpu", ["gpu"], "device 'gpu'"),
        ("cuda", ["cuda"], "2 validators"),
    ],
)
def test_wrong_devices_are_refused(device, listed, message):
    with pytest.raises(ValueError, match=message):
        devices_env(device, listed, ["validator-0", "validator-1"] if message[0] == "2" else ["v"])


@pytest.mark.skipif(not NO_GPU, reason="asserts the refusal on a machine without a GPU")
def test_a_gpu_asked_for_on_a_machine_without_one_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(ValueError, match="no CUDA device is available"):
        check_devices(["cpu", "cpu", "cuda"])
    check_devices(["cpu", "cpu"])  # nothing asked: nothing said
    base = tmp_path / "net"
    run = subprocess.run(
        [sys.executable, "-m", "node.cli", "devnet", "--device", "cuda", "--base-dir", str(base)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert run.returncode == 1, run.stderr
    assert run.stderr.strip().splitlines() == [  # as a node says it (the next test)
        "intellect-node: error: device 'cuda' asked for, but no CUDA device is available "
        "(--device or --validator-devices cuda)"
    ]
    assert not base.exists()  # no chain, no accounts, no model


@pytest.mark.skipif(not NO_GPU, reason="asserts the refusal on a machine without a GPU")
@pytest.mark.parametrize(
    "flags",
    [
        ["--role", "validator", "--engine.device", "cuda"],
        ["--role", "trainer", "--trainer.device", "cuda"],
    ],
)
def test_a_node_asked_for_a_gpu_it_does_not_have_says_so_in_one_line(tmp_path, flags):
    run = subprocess.run(
        [sys.executable, "-m", "node.cli", "start", *flags, "--data-dir", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert run.returncode == 1
    assert run.stderr.strip() == (
        "intellect-node: error: device 'cuda' asked for, but no CUDA device is available"
    )


def test_the_device_setting_reaches_the_engine_and_the_checker():
    from node.config import NodeConfig
    from node.roles.children.checking import CheckerSpec
    from node.rollouts.maker import MakerSpec

    cfg = NodeConfig(role="validator", engine={"device": "cpu"})
    assert MakerSpec.of(cfg).device == "cpu" and CheckerSpec.of(cfg).device == "cpu"
    assert MakerSpec.of(NodeConfig(role="inference")).device == "auto"
    with pytest.raises(ValueError, match="device"):
        NodeConfig(role="inference", engine={"device": "gpu"})


@pytest.mark.skipif(not NO_GPU, reason="asserts the refusal on a machine without a GPU")
def test_a_maker_and_a_checker_load_their_model_where_the_setting_says(tiny_model_dir):
    """On this machine a CUDA maker or checker fails to load: the setting reached
    ``load_model`` (with ``auto`` both would have loaded on the CPU)."""
    from node.engine.modeldir import ModelError
    from node.roles.children.checking import BatchChecker, CheckerSpec
    from node.rollouts.maker import BatchMaker, MakerSpec

    spec = CheckerSpec(keep=2, taskset="arithmetic", verify_profile="gpu-bf16", spot_check=1.0)
    BatchChecker(spec)._use(str(tiny_model_dir), 0)  # auto: the CPU here
    with pytest.raises(ModelError, match="no CUDA device"):
        BatchChecker(CheckerSpec(**{**asdict(spec), "device": "cuda"}))._use(str(tiny_model_dir), 0)
    maker = BatchMaker(MakerSpec("arithmetic", 1, 2, 4, 1.0, 4, device="cuda"))
    with pytest.raises(ModelError, match="no CUDA device"):
        maker.engine(str(tiny_model_dir))


def test_strict_fp32_computes_in_fp32_wherever_it_runs():
    from node.engine.models import engine_dtype, pick_dtype

    assert engine_dtype("strict-fp32") == "float32"
    for profile in ("gpu-bf16", "paper"):
        assert engine_dtype(profile) == "auto"
    # what auto means: bf16 on a GPU (where supported), fp32 on a CPU
    assert pick_dtype(engine_dtype("gpu-bf16"), torch.device("cpu")) == torch.float32


def test_the_trainer_forward_is_bf16_only_on_a_gpu(tiny_model_dir):
    from node.training.grpo import GRPOConfig
    from node.training.policy import Policy

    policy = Policy(tiny_model_dir, GRPOConfig())
    with policy._precision():
        assert not torch.is_autocast_enabled("cpu")  # the CPU trains in fp32 throughout
    assert not policy.bf16
    policy.device = torch.device("cuda")  # what a GPU trainer decides (no GPU used)
    assert policy.bf16
    policy.cfg = GRPOConfig(bf16_on_gpu=False)  # fsdp_check's: sharding must change no bit
    assert not policy.bf16


def test_a_validator_tallies_its_verdicts_per_worker_for_the_latest_workers():
    tally = WorkerTally(limit=2)
    for worker, reason in [("a", "accepted"), ("b", "invalid"), ("a", "accepted"), ("a", "x")]:
        tally.add(worker, reason)
    assert tally.as_dict() == {"b": {"invalid": 1}, "a": {"accepted": 2, "x": 1}}
    tally.add("c", "accepted")  # b was judged longest ago: it goes
    assert list(tally.as_dict()) == ["a", "c"]
    tally.as_dict()["a"]["accepted"] = 99  # a copy
    assert tally.as_dict()["a"]["accepted"] == 2


async def test_the_validators_status_counts_each_posted_verdict_by_worker(tmp_path):
    from node.roles.decisions.work import Verdict
    from tests.test_roles import validator_role

    role = validator_role(tmp_path)

    class Ledger:
        def send_vote(self, worker, work_key, accept, reason="invalid"):
            return (worker, work_key, accept, reason)

        def wait(self, sent):
            pass

    role.votes.ledger = Ledger()
    role.node = type("N", (), {"metrics": type("M", (), {"inc": lambda *a, **k: None})()})()
    honest, cheater = "0x" + "11" * 20, "0x" + "22" * 20
    await role._post((honest, bytes(32)), Verdict.accept())
    await role._post((cheater, bytes(32)), Verdict.reject("invalid", "other weights"))
    await role._post((honest, bytes([1]) * 32), Verdict.accept())
    assert role.status().as_dict()["by_worker"] == {
        cheater: {"invalid": 1},
        honest: {"accepted": 2},
    }


def test_the_tiny_recipes_keep_their_digest_and_the_11b_shape_is_tinyllamas(tmp_path):
    from crypto.hashing import digest
    from node.engine.tinymodel import SHAPES, Recipe, build_tiny_model

    r = Recipe()
    older = ("intermediate", "family", "vocab")  # fields added since: a Llama recipe omits them
    before = {k: v for k, v in asdict(r).items() if k not in older}  # the older recipe
    assert r.digest() == digest(json.dumps(before, sort_keys=True).encode()).hex()[:16]
    big = Recipe(**SHAPES["1.1b"])
    assert (big.hidden, big.layers, big.heads, big.kv_heads, big.mlp) == (2048, 22, 32, 4, 5632)
    assert big.digest() != Recipe(**{**SHAPES["1.1b"], "intermediate": 0}).digest()
    out, built = build_tiny_model(
        tmp_path / "m", Recipe(hidden=32, layers=1, intermediate=40, steps=1, schedule=0)
    )
    config = json.loads((out / "config.json").read_text())
    assert built and config["intermediate_size"] == 40 and config["hidden_size"] == 32


def test_model_init_refuses_a_shape_with_its_own_sizes_and_a_gpu_it_lacks(tmp_path):
    def init(*flags):
        return subprocess.run(
            [sys.executable, "-m", "node.cli", "model", "init", str(tmp_path / "m"), *flags],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )

    run = init("--shape", "1.1b", "--layers", "2")
    assert run.returncode != 0 and "--shape 1.1b sets the hidden size and layers" in run.stderr
    run = init("--lr", "-1")
    assert run.returncode != 0 and "--lr must be > 0" in run.stderr
    if NO_GPU:
        run = init("--device", "cuda")
        assert run.returncode == 1 and "no CUDA device is available" in run.stderr
    assert not (tmp_path / "m").exists()


def _status(address, cheats=None, **section):
    """A worker's status; with ``cheats``, a cheating worker's (its ``cheating`` section)."""
    cheating = {"cheating": {"cheats": cheats, "made": {}}} if cheats else {}
    return {"inference": {"address": address, **section}, **cheating}


def test_the_gpu_devnet_bench_sums_each_role_and_each_validators_verdicts(tmp_path):
    from bench.gpu_devnet import RUN_FILE, summarize

    honest, cheater = "0xAA", "0xbb"
    statuses = {
        "inference-0": _status(honest, tokens=1000, tokens_per_s=500.0, generated=4, submitted=4),
        "inference-1": _status(
            cheater, cheats="int8_weights", tokens=900, tokens_per_s=10.0, generated=3, submitted=3
        ),
        "validator-0": {
            "validator": {
                "judged": 6,
                "judge_seconds": 0.3,
                "by_worker": {"0xaa": {"accepted": 4}, "0xbb": {"invalid": 1, "unavailable": 1}},
            }
        },
        "validator-1": {
            "validator": {
                "judged": 5,
                "judge_seconds": 5.0,
                "by_worker": {"0xaa": {"accepted": 3}, "0xbb": {"accepted": 1, "invalid": 1}},
            }
        },
        "trainer": {"trainer": {}},
    }
    (tmp_path / "statuses.json").write_text(json.dumps(statuses))
    lines = [
        {"step": 0, "seconds": 100.0, "train_seconds": None},
        {"step": 1, "seconds": 3.0, "train_seconds": 1.0},
        {"step": 2, "seconds": 5.0, "train_seconds": None},
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (tmp_path / RUN_FILE).write_text(
        json.dumps({"validator_devices": {"validator-0": "cuda", "validator-1": "cpu"}})
    )
    got = summarize(tmp_path)
    assert got["worker_batch_s"] == 0.5  # 1000 tokens at 500/s over 4 batches; cheater apart
    assert got["worker_tokens_per_s"] == 500.0
    assert (got["steps"], got["trainer_step_s"], got["trainer_train_s"]) == (2, 4.0, 1.0)
    assert (got["honest_submitted"], got["cheats_submitted"]) == (4, 3)
    v0, v1 = got["validators"]["validator-0"], got["validators"]["validator-1"]
    assert (v0["device"], v0["batch_s"], v0["ratio"]) == ("cuda", 0.05, 0.1)
    assert (v0["honest_accepted"], v0["honest_judged"]) == (4, 4)
    assert (v0["cheats_rejected"], v0["cheats_judged"]) == (1, 2)  # unserved is no catch
    assert (v1["device"], v1["batch_s"], v1["ratio"]) == ("cpu", 1.0, 2.0)
    assert (v1["honest_accepted"], v1["cheats_rejected"], v1["cheats_judged"]) == (3, 1, 2)


def test_a_workers_status_adds_up_the_seconds_its_batch_maker_spent_generating():
    from node.roles.services.inference import WorkerCounts

    counts = WorkerCounts()
    counts.made(100, seconds=5.0, generation=1.5)  # the first batch loaded the model too
    counts.made(50, seconds=1.0, generation=0.75)
    assert (counts.generated, counts.tokens, counts.seconds, counts.generation) == (
        2,
        150,
        6.0,
        2.25,
    )


@pytest.mark.parametrize(("profile", "dtype"), [("strict-fp32", "float32"), ("gpu-bf16", "auto")])
def test_the_profile_picks_the_dtype_the_maker_and_the_checker_load_with(
    monkeypatch, tiny_model_dir, profile, dtype
):
    from node import engine
    from node.engine import models
    from node.roles.children.checking import BatchChecker, CheckerSpec
    from node.rollouts.maker import BatchMaker, MakerSpec

    asked = []
    real_load, real_open = models.load_model, engine.open_engine

    def load(path, **kw):
        asked.append(("load_model", kw["dtype"]))
        return real_load(path, **kw)

    def open_(path, **kw):
        asked.append(("open_engine", kw["dtype"]))
        return real_open(path, **kw)

    monkeypatch.setattr(models, "load_model", load)
    monkeypatch.setattr(engine, "open_engine", open_)
    spec = CheckerSpec(keep=2, taskset="arithmetic", verify_profile=profile, spot_check=1.0)
    BatchChecker(spec)._use(str(tiny_model_dir), 0)
    BatchMaker(MakerSpec("arithmetic", 1, 2, 4, 1.0, 4, verify_profile=profile)).engine(
        str(tiny_model_dir)
    )
    # the checker loads; the maker opens an engine (which loads with what it was given)
    assert asked[0] == ("load_model", dtype) and ("open_engine", dtype) in asked
    assert {d for _, d in asked} == {dtype}
