"""A member's whole DiLoCo state as bytes: for live recovery of a joiner and for checkpoints.

What a member needs to continue exactly where another stands at an outer-step boundary:
the outer parameters θ, the outer momentum b, the inner optimizer's state (AdamW's step,
exp_avg, exp_avg_sq per parameter), the outer step and the data position. It travels as a
safetensors file (``safetensors.torch.save``: a JSON header and raw tensors, nothing
executable; never pickle), tensors named ``outer.{i}``, ``momentum.{i}``,
``adam.{i}.{field}`` and ``meta.step`` / ``meta.position`` (int64), ``i`` the parameter's
index in ``model.parameters()``. ``load_state`` checks every name, shape and dtype against
the local model before it changes anything; both parameter copies (the model and θ) are
set from it. A member sharded over several processes (``node/diloco/shards.py``) packs and
loads the same whole tensors: every rank gathers its rows into them, or takes its rows.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors.torch import load, save

from node.diloco.outer import OuterState
from node.files import write_atomic

ADAM_FIELDS = ("step", "exp_avg", "exp_avg_sq")


class StateError(ValueError):
    """State bytes that do not fit this member's model."""


def pack_state(
    model: torch.nn.Module, outer: OuterState, opt: torch.optim.Optimizer, position: int
) -> bytes:
    tensors: dict[str, torch.Tensor] = {
        "meta.step": torch.tensor([outer.step], dtype=torch.int64),
        "meta.position": torch.tensor([position], dtype=torch.int64),
    }
    shards = outer.shards  # sharded: every rank gathers (a collective), rank 0's bytes count
    for i, (p, theta, buf) in enumerate(
        zip(model.parameters(), outer.params, outer.momentum, strict=True)
    ):
        tensors[f"outer.{i}"] = shards.whole(i, theta).contiguous()
        tensors[f"momentum.{i}"] = shards.whole(i, buf).contiguous()
        st = opt.state.get(p, {})
        for f in ADAM_FIELDS:
            if f in st:
                value = shards.local(st[f].detach())
                if f != "step":
                    value = shards.whole(i, value)
                tensors[f"adam.{i}.{f}"] = value.contiguous()
    return save(tensors)


def state_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load_state(
    data: bytes, model: torch.nn.Module, outer: OuterState, opt: torch.optim.Optimizer
) -> int:
    """Set the model, θ, b and the optimizer from ``data``; the data position it holds."""
    try:
        tensors = load(data)
    except Exception as exc:  # safetensors raises its own error types on bad bytes
        raise StateError(f"not a safetensors state: {exc}") from exc
    params = list(model.parameters())
    expected = {"meta.step", "meta.position"}
    for i, p in enumerate(params):
        expected |= {f"outer.{i}", f"momentum.{i}"}
        for name in (f"outer.{i}", f"momentum.{i}"):
            t = tensors.get(name)
            if t is None or t.shape != p.shape or t.dtype != torch.float32:
                raise StateError(f"{name}: missing or not fp32 {tuple(p.shape)}")
            if not bool(torch.isfinite(t).all()):
                raise StateError(f"{name}: non-finite values")
        for f in ADAM_FIELDS:
            name = f"adam.{i}.{f}"
            if name in tensors:
                expected.add(name)
                if f != "step" and tensors[name].shape != p.shape:
                    raise StateError(f"{name}: shape {tuple(tensors[name].shape)}")
    if set(tensors) != expected:
        raise StateError(f"unexpected tensors: {sorted(set(tensors) - expected)[:4]}")
    shards = outer.shards  # sharded: each rank takes its own rows of every whole tensor
    with torch.no_grad():
        for i, p in enumerate(params):
            outer.params[i].copy_(shards.part(i, tensors[f"outer.{i}"]))
            outer.momentum[i].copy_(shards.part(i, tensors[f"momentum.{i}"]))
            shards.local(p).copy_(outer.params[i].to(p.dtype))
            if f"adam.{i}.step" in tensors:
                opt.state[p] = {
                    f: (
                        tensors[f"adam.{i}.{f}"].clone()
                        if f == "step"
                        else shards.spread(i, shards.part(i, tensors[f"adam.{i}.{f}"]).clone())
                    )
                    for f in ADAM_FIELDS
                }
            else:
                opt.state.pop(p, None)
    outer.step = int(tensors["meta.step"][0])
    return int(tensors["meta.position"][0])


def save_checkpoint(path: Path, data: bytes) -> None:
    """Write a member's state atomically (a crash leaves the previous checkpoint)."""
    write_atomic(Path(path), data)
