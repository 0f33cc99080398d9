"""A tiny base policy for a task set, built offline: tokenizer, Llama, brief SFT.

``build_tiny_model`` makes a character-level tokenizer (every printable ASCII character
and newline is one token), a small Llama-architecture model, and trains it for a few
hundred steps on ``prompt + solution + <eos>`` from the task set (the task's worked
solution ending in ``\\boxed{answer}``; loss on the solution only). The result is a
weak policy — right on some easy problems, wrong on most — which is what GRPO needs to
have something to improve. It is saved as a Hugging Face directory
(safetensors, config, tokenizer) with an ``intellect-model.json`` recipe file; a build
whose recipe matches an existing directory is not repeated, and built models are cached
under ``cache_dir`` by recipe digest so each is built once per machine.
"""

from __future__ import annotations

import json
import os
import shutil
import string
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from crypto.hashing import digest
from node.tasks import TaskSet, load_taskset

RECIPE_FILE = "intellect-model.json"
SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>")
CHARS = string.digits + string.ascii_letters + string.punctuation + " \n"


@dataclass(frozen=True)
class Recipe:
    task: str = "arithmetic"
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    max_positions: int = 512
    steps: int = 300
    batch: int = 64
    lr: float = 3e-3
    seed: int = 0
    version: int = 2  # bump when the build changes

    def digest(self) -> str:
        return digest(json.dumps(asdict(self), sort_keys=True).encode()).hex()[:16]


def default_cache_dir() -> Path:
    """Where built models are cached: ``$INTELLECT_NODE_CACHE/models``, else the XDG cache."""
    env = os.environ.get("INTELLECT_NODE_CACHE")
    if env:
        return Path(env).expanduser() / "models"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "intellect-node" / "models"


def build_tokenizer(out_dir: Path) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + tuple(CHARS))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
    )
    fast.save_pretrained(out_dir)


def _examples(
    taskset: TaskSet, tokenizer: object, n: int, key0: int
) -> list[tuple[list[int], int]]:
    """(token ids of prompt + answer + eos, prompt length) for n tasks."""
    out = []
    for k in range(n):
        task = taskset.task(key0 + k)
        prompt = tokenizer(task.prompt)["input_ids"]  # type: ignore[operator]
        target = task.solution or f" \\boxed{{{task.answer}}}"
        answer = tokenizer(target, add_special_tokens=False)["input_ids"]  # type: ignore[operator]
        out.append((prompt + answer + [SPECIALS.index("<eos>")], len(prompt)))
    return out


def build_tiny_model(
    out_dir: str | Path,
    recipe: Recipe | None = None,
    *,
    cache_dir: str | Path | None = None,
    progress: Callable[[int, int, float], None] | None = None,
) -> tuple[Path, bool]:
    """Build (or reuse) the model; returns (its directory, whether it was built now)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    r = recipe or Recipe()
    out = Path(out_dir)
    if _matches(out, r):
        return out, False
    cached = Path(cache_dir) / r.digest() if cache_dir else None
    if cached is not None and _matches(cached, r):
        _copy(cached, out)
        return out, False
    taskset = load_taskset(r.task)
    with tempfile.TemporaryDirectory(prefix="intellect-model-") as tmp:
        work = Path(tmp)
        build_tokenizer(work)
        tokenizer = AutoTokenizer.from_pretrained(work, local_files_only=True)
        torch.manual_seed(r.seed)
        cfg = LlamaConfig(
            vocab_size=len(SPECIALS) + len(CHARS),
            hidden_size=r.hidden,
            intermediate_size=3 * r.hidden,
            num_hidden_layers=r.layers,
            num_attention_heads=r.heads,
            num_key_value_heads=r.kv_heads,
            max_position_embeddings=r.max_positions,
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=2,
            tie_word_embeddings=True,
        )
        model = LlamaForCausalLM(cfg)
        _train(model, taskset, tokenizer, r, progress)
        model.eval().save_pretrained(work, safe_serialization=True)
        (work / RECIPE_FILE).write_text(
            json.dumps({"recipe": asdict(r), "digest": r.digest()}, indent=2) + "\n"
        )
        if cached is not None:
            _copy(work, cached)
        _copy(work, out)
    return out, True


def _train(
    model: torch.nn.Module,
    taskset: TaskSet,
    tokenizer: object,
    r: Recipe,
    progress: Callable[[int, int, float], None] | None,
) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=r.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=r.lr, total_steps=r.steps)
    model.train()
    for step in range(r.steps):
        batch = _examples(taskset, tokenizer, r.batch, key0=(r.seed << 32) + step * r.batch)
        width = max(len(ids) for ids, _ in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (seq, n_prompt) in enumerate(batch):
            ids[i, : len(seq)] = torch.tensor(seq)
            mask[i, : len(seq)] = 1
            labels[i, n_prompt : len(seq)] = torch.tensor(seq[n_prompt:])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if progress is not None:
            progress(step + 1, r.steps, loss.item())


def _matches(path: Path, r: Recipe) -> bool:
    try:
        meta = json.loads((path / RECIPE_FILE).read_text())
    except (OSError, ValueError):
        return False
    return bool(meta.get("digest") == r.digest() and any(path.glob("*.safetensors")))


def _copy(src: Path, dst: Path) -> None:
    """Copy a model directory so that ``dst`` never holds a half-written model: staged
    beside it and renamed into place; an interrupted copy leaves no staging behind, and an
    earlier model at ``dst`` is replaced only by a complete one."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    stamp = time.time_ns()
    staging = dst.with_name(f".{dst.name}.{stamp}.partial")
    old = dst.with_name(f".{dst.name}.{stamp}.old")
    try:
        shutil.copytree(src, staging)
        if dst.exists():
            dst.rename(old)
        staging.rename(dst)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if old.exists() and not dst.exists():
            old.rename(dst)  # put the earlier model back
        raise
    shutil.rmtree(old, ignore_errors=True)


def evaluate(model_dir: str | Path, task: str, *, count: int = 64, seed: int = 12345) -> float:
    """Greedy accuracy of the model on ``count`` tasks drawn from ``task``."""
    from node.engine.base import GenRequest, SamplingParams
    from node.engine.models import load_model, prompt_ids
    from node.engine.torch_engine import TorchEngine

    loaded = load_model(model_dir)
    engine = TorchEngine(loaded.model, eos_token_ids=loaded.eos_token_ids)
    taskset = load_taskset(task)
    tasks = [taskset.task((seed << 20) + i) for i in range(count)]
    results = engine.generate(
        [GenRequest(prompt_ids(loaded.tokenizer, t.prompt), i) for i, t in enumerate(tasks)],
        SamplingParams(max_new_tokens=48, temperature=0.0, prove=False),
    )
    rewards = [
        t.reward(loaded.tokenizer.decode(r.tokens, skip_special_tokens=True))
        for t, r in zip(tasks, results, strict=True)
    ]
    return sum(rewards) / count
