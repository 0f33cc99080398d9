"""Loading a Hugging Face causal LM from a local directory, never from a hub.

A model directory holds ``config.json``, the weights (``*.safetensors``) and the
tokenizer files. Nothing is downloaded: ``local_files_only=True`` on every call, and
``HF_HUB_OFFLINE=1`` is set for the process before transformers is imported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from node.engine.modeldir import ModelError, check_model_dir  # noqa: E402

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def pick_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelError(f"device {device!r} asked for, but no CUDA device is available")
    return torch.device(device)


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 on a GPU that supports it (else float16), float32 on a CPU."""
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if dtype not in DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}; one of auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def engine_dtype(verify_profile: str) -> str:
    """The dtype a worker generates and a validator recomputes in under ``verify_profile``:
    float32 everywhere under strict-fp32 (its tolerances are fp32's), else ``auto``
    (bfloat16 on a GPU, float32 on a CPU: both within gpu-bf16's, SPEC section 18.1)."""
    return "float32" if verify_profile == "strict-fp32" else "auto"


@dataclass
class LoadedModel:
    model: Any  # a transformers PreTrainedModel with a causal LM head
    tokenizer: Any  # a transformers tokenizer
    path: Path
    device: torch.device
    dtype: torch.dtype

    @property
    def eos_token_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for source in (self.model.generation_config, self.model.config, self.tokenizer):
            eos = getattr(source, "eos_token_id", None)
            if isinstance(eos, int):
                ids.add(eos)
            elif isinstance(eos, list | tuple):
                ids.update(int(e) for e in eos)
        return frozenset(ids)


def load_model(path: str | Path, *, dtype: str = "auto", device: str = "auto") -> LoadedModel:
    """Load model and tokenizer from ``path`` (local only) in eval mode."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # transformers: unannotated

    p = check_model_dir(path)
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    try:
        tokenizer = AutoTokenizer.from_pretrained(p, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(p, local_files_only=True, dtype=dt)
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as exc:
        raise ModelError(f"{p}: cannot load: {exc}") from exc
    # transformers types .to through a decorator that loses its signature
    model = model.to(dev).eval()  # type: ignore[arg-type]
    return LoadedModel(model, tokenizer, p, dev, dt)


def prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a task prompt: the chat template when the tokenizer has one."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    return [int(i) for i in tokenizer(text)["input_ids"]]
