"""`intellect-node model init` and `model rollouts` end to end (subprocesses)."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from protocol.rollouts import RolloutBatch
from protocol.wire import open_message
from tests.helpers.net import CLI

REPO = Path(__file__).resolve().parent.parent
WORKER = "0x" + "3c" * 20


def run(*args, check=True, timeout=300):
    env = {
        **os.environ,
        "INTELLECT_NODE_PASSWORD": "pw",
        "INTELLECT_NODE_CACHE": str(REPO / ".cache"),
    }
    res = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=timeout)
    if check:
        assert res.returncode == 0, res.stderr
    return res


def test_model_init_then_rollouts(tiny_model_dir, tmp_path):
    # tiny_model_dir filled the cache with the suite's recipe (QUICK): init reuses it
    out = tmp_path / "base"
    quick = ["--steps", "300", "--schedule", "0"]
    first = json.loads(run("model", "init", str(out), *quick, "--json").stdout.splitlines()[-1])
    assert first["built"] is False and first["task"] == "arithmetic"
    assert 0 < first["accuracy_greedy"] < 0.5  # a weak policy, not a useless one
    assert {p.name for p in out.iterdir()} >= {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "intellect-model.json",
    }
    again = run("model", "init", str(out), *quick)
    assert "already built" in again.stdout

    data = tmp_path / "node"
    run("keys", "new", "--data-dir", str(data))
    batch_file = tmp_path / "batch.bin"
    summary = json.loads(
        run(
            "model",
            "rollouts",
            str(out),
            "--worker",
            WORKER,
            "--step",
            "2",
            "--count",
            "3",
            "--group-size",
            "2",
            "--data-dir",
            str(data),
            "--out",
            str(batch_file),
            "--json",
        ).stdout.splitlines()[-1]
    )
    assert summary["engine"] == "torch" and summary["samples"] == 6 and summary["tokens"] > 0
    batch = open_message(batch_file.read_bytes(), RolloutBatch)
    assert batch.work_key().hex() == summary["work_key"]
    assert batch.worker == WORKER and batch.step == 2 and len(batch.groups) == 3
    human = run("model", "rollouts", str(out), "--worker", WORKER, "--count", "2").stdout
    assert "arith/d" in human and "mean_reward" in human


def test_model_init_builds_the_qwen2_family(qwen2_model_dir, qwen2_tasks, tmp_path):
    """``--family qwen2``: the Qwen2 recipe the devnet builds (``devnet --model-family
    qwen2``), from the cache its fixture filled: a Qwen2 config, a BPE tokenizer with a
    chat template; its settings refused one line each where they are not the family's."""
    from dataclasses import replace

    from node.engine.tinymodel import QWEN2

    out = tmp_path / "qwen2"
    flags = ["--family", "qwen2", "--task", str(qwen2_tasks), "--json"]
    got = json.loads(run("model", "init", str(out), *flags).stdout.splitlines()[-1])
    assert got["built"] is False and got["family"] == "qwen2"
    assert got["recipe"] == replace(QWEN2, task=str(qwen2_tasks)).digest()
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["num_key_value_heads"] == 2
    assert "<|im_start|>" in (out / "chat_template.jinja").read_text()
    assert json.loads((out / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    for flags, said in (
        (["--vocab", "600"], "model init: --vocab is the qwen2 family's"),
        (["--family", "qwen2", "--vocab", "100"], "model init: vocab must be 0 or >= 512"),
        (["--family", "qwen2", "--task", str(tmp_path / "none.jsonl")], "none.jsonl"),
    ):
        res = run("model", "init", str(tmp_path / "m"), *flags, check=False)
        assert res.returncode == 1 and said in res.stderr, res.stderr
        assert "Traceback" not in res.stderr and not (tmp_path / "m").exists()


def test_model_cli_errors(tmp_path):
    res = run("model", "rollouts", str(tmp_path / "none"), "--worker", WORKER, check=False)
    assert res.returncode == 1 and "not a directory" in res.stderr and "Traceback" not in res.stderr
    res = run("model", "rollouts", str(tmp_path), "--worker", "bob", check=False)
    assert res.returncode == 1 and "--worker" in res.stderr
    res = run("model", "init", str(tmp_path / "m"), "--task", "arithmetic:9", check=False)
    assert res.returncode == 1 and "difficulty" in res.stderr
    assert "SFT" in run("model", "init", "--help").stdout
    res = run(
        "model", "init", str(tmp_path / "m"), "--steps", "900", "--schedule", "600", check=False
    )
    assert res.returncode != 0 and "schedule must be 0 or >= steps" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "m").exists()
    # refused before a model loads or a step is generated: not a traceback after the work
    roll = ["model", "rollouts", str(tmp_path), "--worker", WORKER]
    for flags, said in (
        (["--count", "0"], "argument --count: must be 1 or more, got 0"),
        (["--group-size", "x"], "argument --group-size: not an integer: 'x'"),
        (["--step", "-5"], "argument --step: must be 0 or more, got -5"),
        (["--run-id", "Bad Id"], "argument --run-id: run id must match"),
    ):
        res = run(*roll, *flags, check=False)
        assert res.returncode == 2 and said in res.stderr, res.stderr
    res = run(*roll, "--out", str(tmp_path / "none" / "b.bin"), check=False)
    assert res.returncode == 1 and "none is not a directory" in res.stderr, res.stderr
    for hidden in ("0", "10"):
        res = run("model", "init", str(tmp_path / "m"), "--hidden", hidden, check=False)
        assert res.returncode != 0 and "hidden must be a positive multiple of 8" in res.stderr
        assert "Traceback" not in res.stderr


def test_model_init_never_replaces_what_is_not_a_model(tmp_path):
    """A directory of somebody's files, or a file, is refused and left as it was (init once
    renamed it aside and deleted it); an empty directory takes the model."""
    quick = ["--steps", "300", "--schedule", "0"]
    theirs = tmp_path / "notes"
    (theirs / "sub").mkdir(parents=True)
    (theirs / "notes.txt").write_text("mine")
    a_file = tmp_path / "hostname"
    a_file.write_text("vm\n")
    for target in (theirs, a_file):
        res = run("model", "init", str(target), *quick, check=False)
        assert res.returncode == 1, res.stdout + res.stderr
        assert "is not a model built by `intellect-node model init`" in res.stderr
        assert "Traceback" not in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hostname", "notes"]
    assert sorted(p.name for p in theirs.iterdir()) == ["notes.txt", "sub"]
    assert (theirs / "notes.txt").read_text() == "mine" and a_file.read_text() == "vm\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert json.loads(run("model", "init", str(empty), *quick, "--json").stdout.splitlines()[-1])[
        "model_dir"
    ] == str(empty)
    assert (empty / "intellect-model.json").is_file()


def test_ctrl_c_during_init_leaves_no_half_built_model(tmp_path):
    import signal
    import time

    scratch = tmp_path / "tmp"  # the build's staging directory appears here
    scratch.mkdir()
    env = {**os.environ, "INTELLECT_NODE_CACHE": str(tmp_path / "cache"), "TMPDIR": str(scratch)}
    out = tmp_path / "m"
    proc = subprocess.Popen(
        [*CLI, "model", "init", str(out), "--steps", "3000", "--schedule", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as a terminal would start it: a suite run as a background job of a shell
        # without job control has SIGINT ignored, and children inherit that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        # the tokenizer is written to the staging directory just before the SFT loop
        deadline = time.monotonic() + 120
        while not any(scratch.glob("intellect-model-*/tokenizer.json")):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "model init never started its SFT loop"
            time.sleep(0.1)
        time.sleep(1)  # a few SFT steps in
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"model init ran on after Ctrl-C; its stderr:\n{err}")
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert not out.exists()  # nothing half-written where the model would be
    assert not any((tmp_path / "cache").rglob("*.safetensors"))  # nor in the cache


def test_model_calibrate_measures_a_profile_on_this_machine(tiny_model_dir):
    common = ["--rollouts", "16", "--batch", "8", "--new-tokens", "32"]
    bf16 = ["--dtype", "bfloat16", "--validator-dtype", "float32"]
    report = json.loads(
        run("model", "calibrate", str(tiny_model_dir), *common, *bf16, "--json").stdout
    )
    assert report["fits"] is True and report["profile"] == "gpu-bf16"
    assert report["worker"] == "cpu/bfloat16" and report["validator"] == "cpu/float32"
    assert report["rollouts"] == 16 and report["batches"] == report["batches_accepted"] == 1
    assert report["sigma_measured"] <= report["sigma_profile"]
    assert report["logprob_diff_units_rms"] > 0  # a bf16 worker really differs from fp32
    assert report["gap_units_max"] <= report["kappa_profile"]
    # a bf16 worker does not fit the fp32 profile: its states are not fp32-exact
    strict = run(
        "model",
        "calibrate",
        str(tiny_model_dir),
        *common,
        *bf16,
        "--profile",
        "strict-fp32",
        check=False,
    )
    assert strict.returncode == 1 and "DOES NOT FIT" in strict.stdout, strict.stdout
    # everyone in fp32 fits it exactly
    exact = json.loads(
        run(
            "model",
            "calibrate",
            str(tiny_model_dir),
            *common,
            "--profile",
            "strict-fp32",
            "--json",
        ).stdout
    )
    assert exact["fits"] and exact["sigma_measured"] == 0 and exact["toploc_mean_max"] == 0
    bad = run("model", "calibrate", str(tiny_model_dir), "--profile", "nope", check=False)
    assert bad.returncode == 1 and "unknown verification profile" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_an_interrupted_copy_never_leaves_a_half_written_model(
    tiny_model_dir, tmp_path, monkeypatch
):
    """Ctrl-C while the model's files are being written (the cache copy, or the copy into
    OUT_DIR): the destination holds either nothing or the complete earlier model, and no
    staging is left behind."""
    import shutil as real_shutil

    from node.engine import tinymodel

    copytree = real_shutil.copytree

    def interrupted_copytree(src, dst, **kw):
        written = []

        def copy_one(a, b):
            if written:  # the first file is written, the second never
                raise KeyboardInterrupt
            written.append(real_shutil.copy2(a, b))

        return copytree(src, dst, copy_function=copy_one)

    fresh = tmp_path / "fresh"
    monkeypatch.setattr(tinymodel.shutil, "copytree", interrupted_copytree)
    with pytest.raises(KeyboardInterrupt):
        tinymodel._copy(tiny_model_dir, fresh)
    assert not fresh.exists()
    assert list(tmp_path.iterdir()) == []  # no staging debris

    earlier = tmp_path / "earlier"
    copytree(tiny_model_dir, earlier)
    before = sorted(p.name for p in earlier.iterdir())
    with pytest.raises(KeyboardInterrupt):
        tinymodel._copy(tiny_model_dir, earlier)
    assert sorted(p.name for p in earlier.iterdir()) == before  # still the whole model
    assert [p.name for p in tmp_path.iterdir()] == ["earlier"]
    monkeypatch.undo()
    tinymodel._copy(tiny_model_dir, earlier)  # and an uninterrupted copy replaces it
    assert sorted(p.name for p in earlier.iterdir()) == before
    assert [p.name for p in tmp_path.iterdir()] == ["earlier"]
