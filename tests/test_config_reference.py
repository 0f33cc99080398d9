"""docs/CONFIG.md is the generator's output for the current ``NodeConfig``: a new or changed
setting fails here until the reference is regenerated."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from node.config import section_models, settings

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
    for s in settings():
        assert f"| `{s.name}` |" in text, s.path
        assert f"`{s.env}`" in text, s.path
    assert "`INTELLECT_NODE_NET__HEARTBEAT_INTERVAL`" in text
    assert "`--net.heartbeat-interval`" in text and "Was `relay_circuit_bytes`." in text


def test_a_heading_per_section_each_setting_once(reference: ModuleType) -> None:
    """The top-level keys, then one heading per section in the model's order; as many rows
    as settings."""
    text = reference.render()
    headings = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    assert headings == ["Top level", *(f"[{name}]" for name in section_models())]
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) == len(settings())


def test_flags_are_the_start_commands_own(reference: ModuleType) -> None:
    """The reference names exactly the flags the start command's parser has."""
    import argparse

    from node.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    paths = {s.path for s in settings()}
    parsed = {
        a.dest: ", ".join(a.option_strings)
        for a in sub.choices["start"]._actions
        if a.dest in paths
    }
    assert reference.start_flags() == parsed
    assert parsed["run.trainer_peer_id"] == "--run.trainer-peer-id"
    assert parsed["net.bootstrap"] == "--net.bootstrap, --bootstrap"
    assert parsed["role"] == "--role"


def test_check_mode(reference: ModuleType, tmp_path: Path) -> None:
    good, stale = tmp_path / "good.md", tmp_path / "stale.md"
    good.write_text(reference.render())
    stale.write_text(reference.render().replace("`peer_ttl`", "`peer_tt`"))
    assert reference.main(["--check", str(good)]) == 0
    assert reference.main(["--check", str(stale)]) == 1
    assert reference.main(["--check", str(tmp_path / "missing.md")]) == 1
