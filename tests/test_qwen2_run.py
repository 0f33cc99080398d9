"""A Qwen2-family run through the whole loop (#53 item 4), as real processes on 127.0.0.1.

The trainer signs a run manifest naming the Qwen2-family base model (grouped-query
attention, q/k/v bias, a byte-level BPE tokenizer and ChatML chat template made here) and
the project's math file as the task set. An appointed validator and two workers join with
one command each (an account and ``--bootstrap`` only): each finds the manifest, pulls the
model and the task file over SHARDCAST, checked against it. Workers generate with prompts
rendered through the chat template and prove them with TOPLOC; the validator recomputes and
accepts their batches on-chain; the trainer takes a GRPO step on them and publishes policy
version 1 (and on), which the workers switch to.
"""

import filecmp
import re
from pathlib import Path

import pytest

from node.cli.devnet import wait_ready
from tests.helpers.joinrun import ManifestRun
from tests.helpers.net import status, wait_until

pytestmark = pytest.mark.slow

# a step waits for both batches the test asserts it used (the default 120 s step_wait let a
# loaded machine's trainer step on one)
TRAINER = ["--trainer.eval-every", "0", "--trainer.batches-per-step", "2"]
TRAINER += ["--trainer.step-wait", "600"]


def files_held(node):
    return wait_until(
        lambda: (status(node).get("run_files") or {}).get("path"),
        120,
        f"{node.name}'s run files\n{node.log_path.read_text()[-3000:]}",
    )


@pytest.mark.timeout(900)
def test_a_qwen2_run_with_joined_workers_and_validator_switches_versions(
    tmp_path, qwen2_model_dir, qwen2_tasks
):
    run = ManifestRun(
        tmp_path, qwen2_model_dir, trainer_flags=TRAINER, taskset=qwen2_tasks, validator_joins=True
    )
    try:
        validator = run.validator
        workers = []
        for name in ("worker-0", "worker-1"):
            run.fund_joiner(name)
            workers.append(run.joiner(name))
        for node in (validator, *workers):
            if node is not validator:
                wait_ready(node, timeout=300)
            got = files_held(node)
            names = sorted(p.name for p in qwen2_model_dir.iterdir() if p.is_file())
            match, mismatch, errors = filecmp.cmpfiles(
                qwen2_model_dir, f"{got}/model", names, shallow=False
            )
            assert (sorted(match), mismatch, errors) == (names, [], [])
            held = Path(got) / "taskset" / qwen2_tasks.name
            assert held.read_bytes() == qwen2_tasks.read_bytes()
            text = node.log_path.read_text()
            assert f"joining run {run.run_id} by its manifest" in text, node.name

        def trainer_version():
            return (status(run.trainer).get("trainer") or {}).get("policy_version") or 0

        wait_until(lambda: trainer_version() >= 1, 600, "the trainer's first step", 2)
        switched = re.compile(r"generating with policy version [1-9]")
        for w in workers:  # each switches from the base weights to a version the trainer made
            wait_until(
                lambda w=w: switched.search(w.log_path.read_text()),
                300,
                f"{w.name} switching to a new policy version\n{w.log_path}",
                2,
            )
        judged = status(validator)["validator"]
        assert judged["accepted"] >= 2 and judged["rejected"] == 0, judged
        trainer = status(run.trainer)["trainer"]
        assert trainer["batches_used"] >= 2 and trainer["rejected"] == 0, trainer
        for w in workers:
            assert (status(w).get("inference") or {}).get("accepted", 0) >= 1, w.name
    finally:
        run.close()
