"""A lean forward pass for Llama-family decoders, with a preallocated KV cache.

The engine's decode loop calls the model once per token; for small and medium models the
cost of transformers' generic forward (mask building, cache objects that grow by
concatenation, keyword plumbing) is a large part of each step. This runs the same
modules — the model's own embeddings, norms, projections, MLPs, rotary embedding and
``apply_rotary_pos_emb`` — in a straight loop, writes keys and values into one
preallocated buffer per layer, and attends with ``scaled_dot_product_attention``. It
returns the post-final-norm hidden states (what TOPLOC commits to and the LM head reads).

Used only for architectures whose forward is exactly this (``SUPPORTED``, no sliding
window); every other model runs through transformers' forward. Results agree with
transformers' forward to float rounding (tested), which the proofs' and the sampling
check's tolerances absorb.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
import torch.nn.functional as F

SUPPORTED = ("llama", "qwen2", "mistral")


def supports(model: Any) -> bool:
    cfg = model.config
    if getattr(cfg, "model_type", None) not in SUPPORTED:
        return False
    if getattr(cfg, "use_sliding_window", False) or (
        cfg.model_type == "mistral" and getattr(cfg, "sliding_window", None)
    ):
        return False
    base = getattr(model, "model", None)
    return base is not None and all(
        hasattr(base, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")
    )


FUSE_MAX_PARAMS = 2_000_000_000  # above this, fused copies cost too much memory


def _stamp(*tensors: torch.Tensor | None) -> tuple[tuple[int, int], ...]:
    """Storage and in-place version of each tensor: changes whenever the weights do."""
    return tuple((t.data_ptr(), t._version) for t in tensors if t is not None)


class _Fused:
    """Per layer, q/k/v and gate/up projections as one matrix each (fewer, larger matrix
    products), rebuilt whenever a source weight is replaced or changed in place."""

    def __init__(self, layers: Any) -> None:
        self.layers = layers
        self.stamp: tuple[tuple[int, int], ...] = ()
        self.qkv: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        self.gate_up: list[torch.Tensor] = []

    def _sources(self) -> list[torch.Tensor | None]:
        out: list[torch.Tensor | None] = []
        for layer in self.layers:
            a, m = layer.self_attn, layer.mlp
            for lin in (a.q_proj, a.k_proj, a.v_proj, m.gate_proj, m.up_proj):
                out += [lin.weight, lin.bias]
        return out

    def current(self) -> _Fused:
        stamp = _stamp(*self._sources())
        if stamp != self.stamp:
            self.qkv, self.gate_up = [], []
            for layer in self.layers:
                a, m = layer.self_attn, layer.mlp
                projs = (a.q_proj, a.k_proj, a.v_proj)
                bias = (
                    torch.cat([p.bias for p in projs])
                    if all(p.bias is not None for p in projs)
                    else None
                )
                self.qkv.append((torch.cat([p.weight for p in projs]).detach(), bias))
                self.gate_up.append(torch.cat([m.gate_proj.weight, m.up_proj.weight]).detach())
            self.stamp = stamp
        return self


def fusable(model: Any) -> bool:
    base = model.model
    try:
        for layer in base.layers:
            a, m = layer.self_attn, layer.mlp
            if sum(p.bias is not None for p in (a.q_proj, a.k_proj, a.v_proj)) not in (0, 3):
                return False
            if m.gate_proj.bias is not None or m.up_proj.bias is not None:
                return False
            if not callable(getattr(m, "act_fn", None)) or not hasattr(m, "down_proj"):
                return False
    except AttributeError:
        return False
    return sum(p.numel() for p in model.parameters()) <= FUSE_MAX_PARAMS


class FastDecoder:
    """Prefill and decode for one left-padded batch with a static KV cache."""

    def __init__(self, model: Any, batch: int, max_len: int) -> None:
        cfg = model.config
        base = model.model
        self.model = model
        self.base = base
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.rope = importlib.import_module(type(base).__module__).apply_rotary_pos_emb
        p = next(model.parameters())
        shape = (batch, self.kv_heads, max_len, self.head_dim)
        self.k = [torch.empty(shape, dtype=p.dtype, device=p.device) for _ in base.layers]
        self.v = [torch.empty(shape, dtype=p.dtype, device=p.device) for _ in base.layers]
        self.length = 0  # filled cache positions
        self.fused: _Fused | None = None
        if fusable(model):
            cached = getattr(model, "_intellect_fused", None)
            if cached is None:
                cached = _Fused(base.layers)
                model._intellect_fused = cached
            self.fused = cached.current()

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these batch rows (sequences that ended are dropped)."""
        self.k = [k[rows] for k in self.k]
        self.v = [v[rows] for v in self.v]

    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, key_valid: torch.Tensor
    ) -> torch.Tensor:
        """Hidden states [B, T, H] after the final norm for ``ids`` [B, T] at
        ``positions`` [B, T]; ``key_valid`` [B, length + T] marks non-padding keys."""
        b, t = ids.shape
        start, end = self.length, self.length + t
        x = self.base.embed_tokens(ids)
        cos, sin = self.base.rotary_emb(x, positions)
        allowed = key_valid[:, None, None, :end]  # [B, 1, 1, end]
        if t > 1:  # causal within the new tokens; a padding query still sees itself
            q_pos = torch.arange(start, end, device=ids.device)[:, None]
            k_pos = torch.arange(end, device=ids.device)[None, :]
            allowed = (allowed & (k_pos <= q_pos)) | (k_pos == q_pos)
        for i, layer in enumerate(self.base.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            if self.fused is not None:
                w, bias = self.fused.qkv[i]
                nq, nkv = self.heads * self.head_dim, self.kv_heads * self.head_dim
                q, k, v = F.linear(h, w, bias).split((nq, nkv, nkv), dim=-1)
            else:
                q, k, v = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
            q = q.view(b, t, self.heads, self.head_dim).transpose(1, 2)
            k = k.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
            v = v.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = self.rope(q, k, cos, sin)
            self.k[i][:, :, start:end] = k
            self.v[i][:, :, start:end] = v
            o = F.scaled_dot_product_attention(
                q,
                self.k[i][:, :, :end],
                self.v[i][:, :, :end],
                attn_mask=allowed,
                scale=attn.scaling,
                enable_gqa=self.heads != self.kv_heads,
            )
            x = x + attn.o_proj(o.transpose(1, 2).reshape(b, t, -1))
            h = layer.post_attention_layernorm(x)
            if self.fused is not None:
                gate, up = F.linear(h, self.fused.gate_up[i]).chunk(2, dim=-1)
                x = x + layer.mlp.down_proj(layer.mlp.act_fn(gate) * up)
            else:
                x = x + layer.mlp(h)
        self.length = end
        out: torch.Tensor = self.base.norm(x)
        return out

    def logits(self, hidden_last: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model.get_output_embeddings()(hidden_last)
        return out
