"""Generation engines: the project's torch engine (CPU or CUDA) and vLLM (GPU).

``open_engine`` picks one: ``auto`` is vLLM when it is installed and a GPU is present,
else the torch engine. Both implement ``node.engine.base.Engine``.
"""

from __future__ import annotations

from typing import Any

BACKENDS = ("auto", "torch", "vllm")


def open_engine(
    model_dir: str,
    *,
    backend: str = "auto",
    dtype: str = "auto",
    device: str = "auto",
    max_batch: int = 32,
) -> tuple[Any, Any]:
    """(engine, tokenizer) for the model in ``model_dir``."""
    from node.engine.vllm_engine import vllm_available

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "vllm" or (backend == "auto" and vllm_available()):
        if not vllm_available():
            raise ValueError(
                "the vllm backend needs vLLM (pip install 'intellect-node[gpu]') and a GPU"
            )
        from node.engine.vllm_engine import VLLMEngine

        engine = VLLMEngine(model_dir, dtype=dtype, max_batch=max_batch)
        return engine, engine.loaded.tokenizer
    from node.engine.models import load_model
    from node.engine.torch_engine import TorchEngine

    loaded = load_model(model_dir, dtype=dtype, device=device)
    torch_engine = TorchEngine(
        loaded.model, eos_token_ids=loaded.eos_token_ids, max_batch=max_batch
    )
    return torch_engine, loaded.tokenizer
