"""The policy being trained: a Hugging Face causal LM, its AdamW state, and checkpoints.

Where the samples come from: ``node.training.grpo`` (``samples_from_batch`` on accepted
rollout batches, or ``samples_from_groups`` in the centralized baseline). Where the
weights go next: ``Policy.save`` writes a complete model directory (what the trainer
publishes over SHARDCAST and what ``node.engine.open_engine`` loads).

One ``train_step`` is one optimizer step on all the samples given (on a GPU the forward
and backward in bfloat16 under autocast, the weights and AdamW's state in fp32): the new
log-probs are ``log_softmax(logits / temperature)`` at the sampled tokens (the engine's
convention, ``node.engine.base``), so the importance ratio compares like with like; the
samples are cut into micro-batches of ``cfg.micro_batch`` sequences whose gradients
accumulate, with the token-level loss normalized by the whole step's token count; then the
gradient norm is clipped and AdamW steps.

Beyond one process: under ``torchrun`` (``WORLD_SIZE > 1``) or with ``distributed=True``
the process group is initialized (NCCL on CUDA, gloo on CPU), every decoder layer and the
root are sharded with FSDP2 (``torch.distributed.fsdp.fully_shard``), each rank trains on
every ``world``-th sample (all ranks run the same number of micro-batches, so collectives
line up), the loss is scaled so the ranks' averaged gradients equal the single-process
gradient, and the full state dict is gathered and written by rank 0.
"""

from __future__ import annotations

import io
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from node.engine.models import load_model
from node.files import write_atomic
from node.training.grpo import GRPOConfig, TrainSample, grpo_loss

WEIGHT_FILES = (
    "*.safetensors",
    "*.safetensors.index.json",
    "config.json",
    "generation_config.json",
)
STATE_VERSION = 1


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def _env_world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


class Policy:
    def __init__(
        self,
        model_dir: Path | str,
        cfg: GRPOConfig,
        *,
        device: str = "cpu",
        seed: int = 0,
        distributed: bool | None = None,
    ) -> None:
        self.base_dir = Path(model_dir)
        self.cfg = cfg
        self.seed = seed
        self.steps = 0  # optimizer steps taken
        self.distributed = _env_world() > 1 if distributed is None else distributed
        self.ranks = Ranks()
        if self.distributed:
            self.ranks, device = _init_process_group(device)
        torch.manual_seed(seed)
        loaded = load_model(self.base_dir, dtype="float32", device=device)
        self.tokenizer = loaded.tokenizer
        self.eos_token_ids = loaded.eos_token_ids
        self.device = loaded.device
        self.model = loaded.model
        if self.distributed:
            _shard(self.model)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=cfg.lr,
            betas=cfg.betas,
            eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay,
        )

    # -- training ----------------------------------------------------------------------

    def train_step(self, samples: list[TrainSample], temperature: float) -> dict[str, float]:
        """One optimizer step on ``samples``; returns loss, grad_norm, clip_frac,
        ratio_mean, kl, tokens, samples, seconds."""
        if not samples:
            raise ValueError("no samples to train on")
        started = time.perf_counter()
        total_tokens = float(sum(len(s.tokens) for s in samples))
        mine = samples[self.ranks.rank :: self.ranks.world]
        mb = self.cfg.micro_batch
        # every rank runs the same number of forwards (FSDP's collectives must line up)
        n_micro = math.ceil(math.ceil(len(samples) / self.ranks.world) / mb)
        scale = float(self.ranks.world)  # FSDP averages gradients over ranks
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = {"loss": 0.0, "clip": 0.0, "ratio": 0.0, "kl": 0.0}
        for i in range(n_micro):
            chunk = mine[i * mb : (i + 1) * mb]
            if not chunk:
                self._idle_forward()
                continue
            new, old, adv, mask = self._logprobs(chunk, temperature)
            loss, st = grpo_loss(new, old, adv, mask, self.cfg, num_tokens=total_tokens)
            (loss * scale).backward()  # type: ignore[no-untyped-call]
            sums["loss"] += float(loss.item())
            for key, name in (("clip", "clip_frac"), ("ratio", "ratio_mean"), ("kl", "kl")):
                sums[key] += st[name] * st["tokens"]
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        self.steps += 1
        totals = self._all_reduce([sums["loss"], sums["clip"], sums["ratio"], sums["kl"]])
        return {
            "loss": totals[0],
            "grad_norm": float(grad_norm.item()),
            "clip_frac": totals[1] / total_tokens,
            "ratio_mean": totals[2] / total_tokens,
            "kl": totals[3] / total_tokens,
            "tokens": total_tokens,
            "samples": float(len(samples)),
            "seconds": time.perf_counter() - started,
        }

    @torch.no_grad()
    def loss_on(self, samples: list[TrainSample], temperature: float) -> float:
        """The GRPO loss of ``samples`` under the current weights, without a step."""
        total_tokens = float(sum(len(s.tokens) for s in samples))
        loss = 0.0
        for i in range(0, len(samples), self.cfg.micro_batch):
            new, old, adv, mask = self._logprobs(samples[i : i + self.cfg.micro_batch], temperature)
            loss += float(grpo_loss(new, old, adv, mask, self.cfg, num_tokens=total_tokens)[0])
        return loss

    @torch.no_grad()
    def logprobs(self, samples: list[TrainSample], temperature: float) -> list[list[float]]:
        """The current policy's log-prob of every sampled token (the engine's convention)."""
        out: list[list[float]] = []
        for i in range(0, len(samples), self.cfg.micro_batch):
            chunk = samples[i : i + self.cfg.micro_batch]
            new = self._logprobs(chunk, temperature)[0].cpu()
            out += [new[row, : len(s.tokens)].tolist() for row, s in enumerate(chunk)]
        return out

    def _logprobs(
        self, chunk: list[TrainSample], temperature: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """New log-probs [B, T] of the sampled tokens, the sampling log-probs [B, T], the
        advantages [B] and the completion mask [B, T] (T: the longest completion)."""
        seqs = [s.prompt + s.tokens[:-1] for s in chunk]
        width = max(len(q) for q in seqs)
        t_max = max(len(s.tokens) for s in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        attn = torch.zeros((len(chunk), width), dtype=torch.long)
        pos = torch.zeros((len(chunk), t_max), dtype=torch.long)  # where each token is chosen
        targets = torch.zeros((len(chunk), t_max), dtype=torch.long)
        old = torch.zeros((len(chunk), t_max), dtype=torch.float32)
        mask = torch.zeros((len(chunk), t_max), dtype=torch.float32)
        for row, (s, q) in enumerate(zip(chunk, seqs, strict=True)):
            n, m = len(s.prompt), len(s.tokens)
            ids[row, : len(q)] = torch.tensor(q)
            attn[row, : len(q)] = 1
            pos[row, :m] = torch.arange(n - 1, n - 1 + m)
            targets[row, :m] = torch.tensor(s.tokens)
            old[row, :m] = torch.tensor(s.logprobs, dtype=torch.float32)
            mask[row, :m] = 1
        dev = self.device
        with self._precision():
            logits = self.model(input_ids=ids.to(dev), attention_mask=attn.to(dev)).logits
        logits = logits.gather(1, pos.to(dev)[:, :, None].expand(-1, -1, logits.shape[-1]))
        logits = logits.float()
        if temperature > 0:
            logits = logits / temperature
        new = torch.log_softmax(logits, dim=-1).gather(2, targets.to(dev)[:, :, None])[:, :, 0]
        adv = torch.tensor([s.advantage for s in chunk], dtype=torch.float32, device=dev)
        return new, old.to(dev), adv, mask.to(dev)

    def _idle_forward(self) -> None:
        """A forward and backward contributing zero gradient (a rank with no samples left
        still joins the micro-batch's collectives)."""
        ids = torch.zeros((1, 1), dtype=torch.long, device=self.device)
        with self._precision():
            logits = self.model(input_ids=ids).logits
        (logits.float().sum() * 0.0).backward()

    @property
    def bf16(self) -> bool:
        """Whether the forward runs in bfloat16 autocast: on a GPU (``cfg.bf16_on_gpu``)."""
        return self.device.type == "cuda" and self.cfg.bf16_on_gpu

    def _precision(self) -> torch.autocast:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    def mean_over_ranks(self, value: float) -> float:
        """``value``'s mean over the ranks (itself in one process): a collective."""
        return self._all_reduce([value])[0] / self.ranks.world

    def _all_reduce(self, values: list[float]) -> list[float]:
        if not self.distributed:
            return values
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return [float(v) for v in t.tolist()]

    # -- checkpoints -------------------------------------------------------------------

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every weight as a full CPU tensor (a collective under FSDP: all ranks call)."""
        if not self.distributed:
            return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full: dict[str, torch.Tensor] = get_model_state_dict(self.model, options=opts)  # type: ignore[assignment]
        return full

    def save(self, out_dir: Path | str) -> Path | None:
        """Write a complete model directory (weights, config, tokenizer and the recipe file
        of the base directory) atomically: staged beside ``out_dir`` and renamed into
        place. Under FSDP every rank must call; rank 0 writes and returns the path."""
        state = self.full_state_dict()
        if not self.ranks.main:
            self._barrier()
            return None
        out = Path(out_dir)
        out.parent.mkdir(parents=True, exist_ok=True)
        stamp = time.time_ns()
        staging = out.with_name(f".{out.name}.{stamp}.partial")
        try:
            staging.mkdir()
            for f in self.base_dir.iterdir():  # tokenizer files, the recipe file
                if f.is_file() and not any(f.match(p) for p in WEIGHT_FILES):
                    shutil.copy2(f, staging / f.name)
            unwrapped = self.model
            unwrapped.save_pretrained(staging, state_dict=state, safe_serialization=True)
            _fsync_dir(staging)
            _replace_dir(staging, out)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        self._barrier()
        return out

    def save_state(self, path: Path | str) -> None:
        """Optimizer state, step count and RNG states, atomically (one file; rank 0
        writes the full optimizer state under FSDP)."""
        opt = self._optimizer_state()
        if not self.ranks.main:
            return
        blob = {
            "version": STATE_VERSION,
            "steps": self.steps,
            "optimizer": opt,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }
        buf = io.BytesIO()
        torch.save(blob, buf)
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(p, buf.getvalue())

    def load_state(self, path: Path | str) -> None:
        blob = torch.load(Path(path), map_location="cpu", weights_only=True)
        if blob.get("version") != STATE_VERSION:
            raise ValueError(f"{path}: trainer state version {blob.get('version')!r}")
        self.steps = int(blob["steps"])
        self._load_optimizer_state(blob["optimizer"])
        torch.set_rng_state(blob["torch_rng"])
        if blob["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(blob["cuda_rng"])

    def _optimizer_state(self) -> dict[str, Any]:
        if not self.distributed:
            sd: dict[str, Any] = self.optimizer.state_dict()
            return sd
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(self.model, self.optimizer, options=opts)

    def _load_optimizer_state(self, state: dict[str, Any]) -> None:
        if not self.distributed:
            self.optimizer.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
        set_optimizer_state_dict(self.model, self.optimizer, state, options=opts)

    @classmethod
    def from_checkpoint(
        cls,
        model_dir: Path | str,
        state_path: Path | str,
        cfg: GRPOConfig,
        *,
        device: str = "cpu",
        seed: int = 0,
        distributed: bool | None = None,
    ) -> Policy:
        """A policy that resumes where ``save(model_dir)`` and ``save_state(state_path)``
        left off: its next step is the step the saved policy would have taken."""
        policy = cls(model_dir, cfg, device=device, seed=seed, distributed=distributed)
        policy.load_state(state_path)
        return policy

    def _barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def _init_process_group(device: str) -> tuple[Ranks, str]:
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        dist.init_process_group(backend=backend)
    ranks = Ranks(dist.get_rank(), dist.get_world_size())
    if device.startswith("cuda"):
        local = int(os.environ.get("LOCAL_RANK", ranks.rank))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    return ranks, device


def _shard(model: Any) -> None:
    """FSDP2: each decoder layer is one unit, the root (embeddings, final norm, head)
    another."""
    from torch.distributed.fsdp import fully_shard

    base = getattr(model, model.base_model_prefix, model)
    for layer in getattr(base, "layers", []):
        fully_shard(layer)
    fully_shard(model)


def _fsync_dir(path: Path) -> None:
    for f in path.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())


def _replace_dir(staging: Path, out: Path) -> None:
    """Rename ``staging`` to ``out``; an existing ``out`` is replaced only by a complete
    directory (moved aside first, put back if the rename fails)."""
    old = out.with_name(f".{out.name}.{time.time_ns()}.old")
    if out.exists():
        out.rename(old)
    try:
        staging.rename(out)
    except BaseException:
        if old.exists() and not out.exists():
            old.rename(out)
        raise
    shutil.rmtree(old, ignore_errors=True)
