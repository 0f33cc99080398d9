"""The trainer's step under torchrun with FSDP2 (two CPU processes, gloo) equals the
single-process step, and a sharded policy resumes exactly from what rank 0 saved."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_fsdp2_step_matches_single_process(tiny_model_dir, tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed next to this interpreter")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            str(torchrun),
            "--nproc-per-node",
            "2",
            "--master-port",
            str(_free_port()),
            "-m",
            "node.training.fsdp_check",
            "--model",
            str(tiny_model_dir),
            "--workdir",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "fsdp-check ok" in out, out[-4000:]
    assert (tmp_path / "v1" / "model.safetensors").is_file()
