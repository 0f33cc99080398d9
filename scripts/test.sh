#!/usr/bin/env bash
# Every test but the GPU tier (docs/testing.md): the quick tier on two pytest-xdist workers,
# each test file on one, then the slow tier one test at a time (each of its tests starts
# many processes or trains a model, and two at once would only fight over the cores).
# CI runs this (.ci/run); while working, the quick tier alone is the first command below.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest -q -n 2 --dist loadfile "$@"
.venv/bin/python -m pytest -q -m slow "$@"
