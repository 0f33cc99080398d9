"""The cheaper models a validator checks a batch against (``crypto.substitution``), built
from the policy the way a cheating worker would build them.

A worker computes in the precision of its device (bf16 on a GPU, fp32 on a CPU: the
profile admits both), and the test is sharpest in the worker's own precision: there the
honest states match the reference to a rounding, and a substitute's match the suspect
(measured, SPEC §11.2). So the validator tests in its own precision and, when that is not
bf16, in bf16 too, each at half the profile's false-slash probability.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch


def int8_per_row(model: Any) -> Any:
    """Every Linear weight fake-quantized to symmetric int8 per output row (torchao's and
    most runtimes' weight-only int8): a cheaper model."""
    from node.engine.calibration import int8_weights

    return int8_weights(model)


BUILDERS: dict[str, Callable[[Any], Any]] = {"int8": int8_per_row}


class SuspectModels:
    """For one policy version: per precision, (reference, {suspect name: model}), built on
    first use and kept."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self._built: dict[tuple[torch.dtype, str], Any] = {}

    def precisions(self) -> list[torch.dtype]:
        """The validator's own dtype, then bf16 when that is another."""
        own = next(self.model.parameters()).dtype
        return [own] if own == torch.bfloat16 else [own, torch.bfloat16]

    def reference(self, dtype: torch.dtype) -> Any:
        return self._get(dtype, "")

    def suspect(self, dtype: torch.dtype, name: str) -> Any:
        if name not in BUILDERS:
            raise ValueError(f"unknown suspect {name!r}; one of {', '.join(BUILDERS)}")
        return self._get(dtype, name)

    def _get(self, dtype: torch.dtype, name: str) -> Any:
        key = (dtype, name)
        if key not in self._built:
            if not name:
                own = next(self.model.parameters()).dtype
                self._built[key] = (
                    self.model if own == dtype else copy.deepcopy(self.model).to(dtype)
                )
            else:
                self._built[key] = BUILDERS[name](self.reference(dtype))
        return self._built[key]
