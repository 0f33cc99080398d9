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
from collections.abc import Callable
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


def weights_stamp(*tensors: torch.Tensor | None) -> tuple[tuple[int, int], ...]:
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
        stamp = weights_stamp(*self._sources())
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
    return int(sum(p.numel() for p in model.parameters())) <= FUSE_MAX_PARAMS


class SlotDecoder:
    """Continuous batching: ``slots`` cache rows, each holding one sequence from column 0
    (no padding). Active sequences always occupy rows ``0..active-1``; a sequence that
    ends is replaced by the last row, and new sequences are prefilled and appended, so
    every decode step runs on a dense batch."""

    def __init__(self, model: Any, slots: int, max_len: int) -> None:
        cfg = model.config
        base = model.model
        self.model = model
        self.base = base
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.rope = importlib.import_module(type(base).__module__).apply_rotary_pos_emb
        p = next(model.parameters())
        self.dtype, self.device = p.dtype, p.device
        # decided once per model: fusable() walks every layer and parameter
        cached = getattr(model, "_intellect_fused", None)
        if cached is None:
            cached = _Fused(base.layers) if fusable(model) else False
            model._intellect_fused = cached
        self.fused = cached.current() if isinstance(cached, _Fused) else None
        self.slots, self.max_len = slots, max_len
        self.k, self.v = self._cache(slots, max_len), self._cache(slots, max_len)
        self.lens = [0] * slots  # filled columns per row
        self.active = 0
        self.rows = torch.arange(slots, device=self.device)
        self.columns = torch.arange(max_len, device=self.device)

    def _cache(self, batch: int, max_len: int) -> list[torch.Tensor]:
        shape = (batch, self.kv_heads, max_len, self.head_dim)
        # zeros, not empty: masked keys still enter attention's weighted sum (with weight
        # 0), and uninitialized memory may hold NaN, which 0 does not cancel
        return [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.base.layers]

    def _run(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        allowed: torch.Tensor,
        store: Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """Post-final-norm hidden states [B, T, H]; ``store(layer, k, v)`` puts the new
        keys and values in the cache and returns the keys and values to attend to."""
        b, t = ids.shape
        x = self.base.embed_tokens(ids)
        cos, sin = self.base.rotary_emb(x, positions)
        for i, layer in enumerate(self.base.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            if self.fused is not None:
                w, bias = self.fused.qkv[i]
                nq, nkv = self.heads * self.head_dim, self.kv_heads * self.head_dim
                q, k, v = torch.split(F.linear(h, w, bias), [nq, nkv, nkv], dim=-1)
            else:
                q, k, v = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
            q = q.view(b, t, self.heads, self.head_dim).transpose(1, 2)
            k = k.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
            v = v.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = self.rope(q, k, cos, sin)
            keys, values = store(i, k, v)
            o = F.scaled_dot_product_attention(
                q,
                keys,
                values,
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
        out: torch.Tensor = self.base.norm(x)
        return out

    def logits(self, hidden_last: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model.get_output_embeddings()(hidden_last)
        return out

    def admit(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefill ``prompts`` straight into rows ``active..`` (right-padded, so each row
        starts at column 0); returns their post-norm hidden states [n, W, H] (row r's
        prompt at ``[r, :len(prompts[r])]``) and each prompt's last-position logits [n, V]."""
        n = len(prompts)
        if self.active + n > self.slots:
            raise ValueError("more sequences than free slots")
        width = max(len(p) for p in prompts)
        if width > self.max_len:
            raise ValueError(f"prompt of {width} tokens > cache of {self.max_len}")
        ids = torch.zeros((n, width), dtype=torch.long)
        valid = torch.zeros((n, width), dtype=torch.bool)
        for r, p in enumerate(prompts):
            ids[r, : len(p)] = torch.tensor(p)
            valid[r, : len(p)] = True
        ids, valid = ids.to(self.device), valid.to(self.device)
        pos = torch.arange(width, device=self.device)
        # causal over real keys; a padding query still sees itself (no all-masked row).
        # Padding keys land in the cache past each row's length, where step() never looks.
        causal = pos[None, :] <= pos[:, None]
        allowed = (valid[:, None, None, :] & causal) | torch.eye(
            width, dtype=torch.bool, device=self.device
        )
        rows = slice(self.active, self.active + n)

        def store(i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            self.k[i][rows, :, :width] = k
            self.v[i][rows, :, :width] = v
            return k, v

        hidden = self._run(ids, pos.expand(n, width), allowed, store)
        lens = [len(p) for p in prompts]
        self.lens[rows] = lens
        self.active += n
        last = hidden[
            torch.arange(n, device=self.device), torch.tensor(lens, device=self.device) - 1
        ]
        return hidden, self.logits(last)

    def retire(self, row: int) -> int | None:
        """Free ``row``; the last active row moves into it. Returns the row that moved
        (its old index), or None."""
        last = self.active - 1
        self.active -= 1
        if row == last:
            return None
        n = self.lens[last]
        for i in range(len(self.k)):
            self.k[i][row, :, :n] = self.k[i][last, :, :n]
            self.v[i][row, :, :n] = self.v[i][last, :, :n]
        self.lens[row] = n
        return last

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """One decode step for rows ``0..active-1`` with their next input ``tokens``
        [active]; returns the post-norm hidden states [active, H]."""
        a = self.active
        lens = torch.tensor(self.lens[:a], device=self.device)
        end = max(self.lens[:a]) + 1
        if end > self.max_len:
            raise ValueError("cache full")
        rows = torch.arange(a, device=self.device)
        allowed = (torch.arange(end, device=self.device)[None, :] <= lens[:, None])[:, None, None]

        def store(i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            self.k[i][rows, :, lens] = k[:, :, 0]
            self.v[i][rows, :, lens] = v[:, :, 0]
            return self.k[i][:a, :, :end], self.v[i][:a, :, :end]

        hidden = self._run(tokens[:, None], lens[:, None], allowed, store)
        for r in range(a):
            self.lens[r] += 1
        return hidden[:, 0]

    def step_static(self, tokens: torch.Tensor, lens: torch.Tensor, window: int) -> torch.Tensor:
        """``step`` with shapes fixed by ``len(tokens)`` and ``window`` alone, reading
        everything else from device tensors: rows ``0..b-1`` take input ``tokens`` [b] at
        positions ``lens`` [b] (their keys and values go to column ``lens``), attending to
        the first ``window`` columns of the cache. No host synchronization and no shape
        that depends on the data, so a CUDA graph can capture it. Rows past the active
        ones are padding: give them a length that fits the window (their cache rows are
        free and rewritten by the next prefill). The caller advances ``lens``."""
        b = tokens.shape[0]
        rows = self.rows[:b]
        allowed = (self.columns[:window][None, :] <= lens[:, None])[:, None, None]

        def store(i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            self.k[i][rows, :, lens] = k[:, :, 0]
            self.v[i][rows, :, lens] = v[:, :, 0]
            return self.k[i][:b, :, :window], self.v[i][:b, :, :window]

        return self._run(tokens[:, None], lens[:, None], allowed, store)[:, 0]
