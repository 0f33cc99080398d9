"""The cheaper models a validator checks a batch against (``crypto.substitution``), built
from the policy the way a worker substituting a cheaper model would build them.

A worker computes in the precision of its device (bf16 on a GPU, fp32 on a CPU: the
profile admits both), and the test is sharpest in the worker's own precision: there the
honest states match the reference to a rounding, and a substitute's match the suspect
(measured, SPEC §18.2). So the validator tests in its own precision and, when that is not
bf16, in bf16 too, each at half the profile's false-slash probability.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from node.engine.calibration import int8_weights

# int8: every Linear weight fake-quantized to symmetric int8 per output row (torchao's and
# most runtimes' weight-only int8)
BUILDERS: dict[str, Callable[[Any], Any]] = {"int8": int8_weights}


class SuspectModels:
    """For one policy version: per precision, (reference, {suspect name: model}), built on
    first use and kept."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.dtype: torch.dtype = next(model.parameters()).dtype  # the validator's own
        self._built: dict[tuple[torch.dtype, str], Any] = {}

    def precisions(self) -> list[torch.dtype]:
        """The validator's own dtype, then bf16 when that is another."""
        own = self.dtype
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
                self._built[key] = (
                    self.model if dtype == self.dtype else copy.deepcopy(self.model).to(dtype)
                )
            else:
                self._built[key] = BUILDERS[name](self.reference(dtype))
        return self._built[key]
