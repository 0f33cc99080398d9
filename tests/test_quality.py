"""The project's own checks: ruff (lint + format) on everything, mypy --strict on crypto/ and protocol/."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def tool(name):
    path = BIN / name
    return str(path) if path.exists() else shutil.which(name)


def check(*cmd):
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr


def test_ruff_lint():
    check(tool("ruff"), "check", ".")


def test_ruff_format():
    check(tool("ruff"), "format", "--check", ".")


def test_mypy_strict_on_crypto_and_protocol():
    check(tool("mypy"))
