"""A run manifest's terms for tests (SPEC §2): two model files, the built-in task set."""

from __future__ import annotations

import dataclasses
from typing import Any

from protocol.manifest import FileRef, RunTerms

CONTRACT = "0x" + "ab" * 20


def run_terms(trainer: str, **changes: Any) -> RunTerms:
    """Valid terms of a run whose trainer is ``trainer``, with ``changes`` applied."""
    terms = RunTerms(
        format=1,
        name="math",
        trainer=trainer,
        chain_id=31337,
        contract=CONTRACT,
        contract_block=7,
        model=[
            FileRef(name="config.json", size=10, blake3=bytes(32)),
            FileRef(name="model.safetensors", size=1000, blake3=bytes(range(32))),
        ],
        taskset="arithmetic:2-3",
        taskset_file=[],
        verify_profile="strict-fp32",
        temperature=1.0,
        top_p=0.95,
        max_new_tokens=48,
        group_size=4,
        tasks_per_batch=4,
        async_level=2,
    )
    return dataclasses.replace(terms, **changes)
