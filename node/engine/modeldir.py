"""What a model directory must hold; importable without torch (node start-up uses it)."""

from __future__ import annotations

from pathlib import Path


class ModelError(ValueError):
    """A model directory that cannot be used, with what is wrong in words."""


def check_model_dir(path: str | Path) -> Path:
    p = Path(path)
    if not p.is_dir():
        raise ModelError(f"{p}: not a directory (a model is a local Hugging Face directory)")
    if not (p / "config.json").is_file():
        raise ModelError(f"{p}: no config.json; not a Hugging Face model directory")
    if not any(p.glob("*.safetensors")):
        raise ModelError(f"{p}: no *.safetensors weights")
    if not ((p / "tokenizer.json").is_file() or (p / "tokenizer_config.json").is_file()):
        raise ModelError(f"{p}: no tokenizer (tokenizer.json or tokenizer_config.json)")
    return p
