"""docs/CONFIG.md is the generator's output for the current ``NodeConfig``: a new or changed
setting fails here until the reference is regenerated."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from node.config import NodeConfig

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "CONFIG.md"
REGENERATE = ".venv/bin/python scripts/config_reference.py > docs/CONFIG.md"


@pytest.fixture(scope="module")
def reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "config_reference", ROOT / "scripts" / "config_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("config_reference", module)
    spec.loader.exec_module(module)
    return module


def test_committed_reference_is_current(reference: ModuleType) -> None:
    assert DOC.read_text() == reference.render(), f"docs/CONFIG.md is stale: {REGENERATE}"


def test_every_setting_has_a_row_with_its_env_var(reference: ModuleType) -> None:
    text = reference.render()
    for name in NodeConfig.model_fields:
        assert f"| `{name}` |" in text, name
        assert f"`INTELLECT_NODE_{name.upper()}`" in text, name


def test_groups_name_each_setting_once(reference: ModuleType) -> None:
    placed = [n for _, _, names in reference.GROUPS for n in names]
    assert len(placed) == len(set(placed)), "a setting is listed in two groups"
    rows = [line for line in reference.render().splitlines() if line.startswith("| `")]
    assert len(rows) == len(NodeConfig.model_fields)


def test_flags_are_the_start_commands_own(reference: ModuleType) -> None:
    """The reference names exactly the flags the start command's parser has."""
    import argparse

    from node.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parsed = {
        a.dest: a.option_strings[0]
        for a in sub.choices["start"]._actions
        if a.dest in NodeConfig.model_fields
    }
    assert reference.start_flags() == parsed
    assert (
        parsed["trainer_peer_id"] == "--trainer-peer-id" and parsed["spot_check"] == "--spot-check"
    )


def test_check_mode(reference: ModuleType, tmp_path: Path) -> None:
    good, stale = tmp_path / "good.md", tmp_path / "stale.md"
    good.write_text(reference.render())
    stale.write_text(reference.render().replace("`peer_ttl`", "`peer_tt`"))
    assert reference.main(["--check", str(good)]) == 0
    assert reference.main(["--check", str(stale)]) == 1
    assert reference.main(["--check", str(tmp_path / "missing.md")]) == 1
