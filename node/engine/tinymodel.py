"""The base policy for a task set, built offline: tokenizer, Llama, SFT stopped mid-way.

``build_tiny_model`` makes a character-level tokenizer (every printable ASCII character
and newline is one token), a small Llama-architecture model, and trains it on
``prompt + solution + <eos>`` from the task set (the task's worked solution ending in
``\\boxed{answer}``; loss on the solution only). It is saved as a Hugging Face directory
(safetensors, config, tokenizer) with an ``intellect-model.json`` recipe file; a build
whose recipe matches an existing directory is not repeated, and built models are cached
under ``cache_dir`` by recipe digest so each is built once per machine.

The default recipe puts the policy where RL can improve it (issue #27; INTELLECT-2 started
from a model that already solved its tasks some of the time). It follows a 1500-step
one-cycle schedule on arithmetic levels 1-3 and stops after 750 steps, while the skill is
still latent. The run then trains on levels 2-3 (``arithmetic:2-3``; level 1 is dropped
because the base solves it more than 80% of the time, as INTELLECT-2 kept only tasks solved
10-80% of the time). Measured on the held-out set of levels 2-3 (50 tasks per level,
``HeldOut.sample_stats``, 32 draws per task at T = 1) along that schedule:

    SFT step              550    650    700    725    750    775    800    850   1200
    greedy              0.06   0.17   0.21   0.25   0.29   0.46   0.42   0.52   0.89
    sampled             0.04   0.10   0.16   0.19   0.22   0.34   0.33   0.41   0.82
    pass@16             0.39   0.61   0.69   0.67   0.77   0.83   0.76   0.89   0.99

At step 750 the greedy answer is right on 0.29 of the tasks and a sample on 0.22, yet 16
samples hold a right one on 0.77 of them. The right answers are concentrated on tasks,
not spread like lucky guesses: pass@16 per level is 0.75 / 0.79 against 0.94 / 0.99 if the
same accuracy were spread evenly, and the best task is right in 75% / 91% of draws. Earlier
in the schedule the right answers on level 2 were lucky guesses (step 550: pass@16 0.35
against 0.39 evenly, best task 16%). Later the policy is no longer weak (step 850:
greedy 0.52; step 1200: 0.89). With level 1 kept, the policy is weak only while level 2
is near zero: at step 650, levels 1-3 read greedy 0.43, sampled 0.37, pass@16 0.74 with
level 1 at 0.90 sampled and level 2 at 0.07, and GRPO lifted that mix by 8 points in 80
steps against 17 in 40 on levels 2-3 from step 750 (``node.training.central``).

A recipe of family ``qwen2`` (``QWEN2``) builds a model of a real family instead: a
Qwen2 (grouped-query attention, q/k/v bias) with a byte-level BPE tokenizer and ChatML chat
template trained on the task set's text (``node/engine/qwen2.py``), SFT-trained by the same
loop on the chat-formatted prompt. Its digest names a task set file by its bytes; a Llama
recipe's digest is what it was before the family existed.

A full 300-step schedule (``QUICK``, the default before) leaves levels 2 and 3 at 0.025 and
0.019 sampled, spread like lucky guesses. The build takes about 160 s on the 2-core CPU machine,
0.21 s per SFT step.
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
from typing import TYPE_CHECKING, Any

from crypto.hashing import digest
from node.engine import qwen2
from node.tasks import TaskSet, builtin_taskset, load_taskset

if TYPE_CHECKING:  # torch loads inside the build: ``model init --help`` reads Recipe
    import torch

RECIPE_FILE = "intellect-model.json"
FAMILIES = ("llama", "qwen2")
DEFAULT_VOCAB = 1024  # qwen2: 256 bytes, 3 specials and up to 765 merges
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
    intermediate: int = 0  # the MLP's width (0: 3 x hidden)
    steps: int = 750  # SFT steps taken
    schedule: int = 1500  # the one-cycle learning-rate schedule's length (0: ``steps``)
    batch: int = 64
    lr: float = 3e-3
    seed: int = 0
    version: int = 3  # bump when the build changes
    family: str = "llama"  # the architecture: llama (character tokenizer) or qwen2 (BPE)
    vocab: int = 0  # qwen2: the BPE tokenizer's vocabulary (0: DEFAULT_VOCAB)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family {self.family!r}: one of {', '.join(FAMILIES)}")
        if self.vocab and self.family == "llama":
            raise ValueError("vocab is the qwen2 family's (llama's tokenizer is by character)")
        if self.vocab and self.vocab < 512:
            raise ValueError("vocab must be 0 or >= 512 (256 bytes, the specials, the merges)")
        if self.kv_heads < 1 or self.heads % self.kv_heads:
            raise ValueError("kv_heads must divide heads (grouped-query attention)")
        if self.steps < 1:
            raise ValueError("steps must be >= 1")
        if self.schedule and self.schedule < self.steps:
            raise ValueError("schedule must be 0 or >= steps (the build stops within it)")
        if self.layers < 1:
            raise ValueError("layers must be >= 1")
        if self.hidden < 2 * self.heads or self.hidden % (2 * self.heads):
            raise ValueError(f"hidden must be a positive multiple of {2 * self.heads} (2 x heads)")

    @property
    def schedule_steps(self) -> int:
        return self.schedule or self.steps

    @property
    def mlp(self) -> int:
        return self.intermediate or 3 * self.hidden

    @property
    def vocab_size(self) -> int:
        return self.vocab or DEFAULT_VOCAB

    def digest(self) -> str:
        """The recipe's name in the cache. A Llama recipe's is what it was before the fields
        ``intermediate`` (when 0), ``family`` and ``vocab`` were added. A qwen2 recipe with
        a task set file names the file by its bytes, not its path: the same problems
        written to another place are the same build (a Llama recipe names it by path, as
        before, which keeps every cached Llama's digest)."""
        fields = asdict(self)
        if not fields["intermediate"]:  # the recipes from before the field keep their digest
            del fields["intermediate"]
        if self.family == "llama":
            del fields["family"], fields["vocab"]
        elif not builtin_taskset(self.task):
            fields["task"] = "file:" + digest(Path(self.task).read_bytes()).hex()
        return digest(json.dumps(fields, sort_keys=True).encode()).hex()[:16]


# Model shapes ``model init --shape`` builds besides the tiny default: TinyLlama-1.1B's
# (22 layers, hidden 2048, MLP 5632, 32 heads of 64, 4 KV heads) with this tokenizer's
# vocabulary, for runs whose GPU cost is a real model's (issue #32); its SFT wants a GPU.
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {},
    "1.1b": {
        "hidden": 2048,
        "layers": 22,
        "heads": 32,
        "kv_heads": 4,
        "intermediate": 5632,
        "max_positions": 2048,
    },
}


# The test suite's base policy: a full 300-step schedule (the default before the
# regime above was measured), built in about a minute; greedy accuracy on levels 1-3 ~0.3,
# level 1 mostly right, levels 2-3 rarely. ``model init --steps 300 --schedule 0``.
QUICK = Recipe(steps=300, schedule=0)

# The Qwen2-family base (``model init --family qwen2 --task FILE``, ``devnet --model-family
# qwen2``): grouped-query attention (4 heads, 2 KV heads), q/k/v bias, a byte-level BPE of
# at most 1024 entries trained on the task file; a short SFT (about 30 s on 2 cores). It
# proves the path, not the skill: its held-out accuracy is low.
QWEN2 = Recipe(
    family="qwen2", hidden=64, layers=2, heads=4, kv_heads=2, steps=100, schedule=0, batch=32
)


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
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # transformers: unannotated
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
    )
    fast.save_pretrained(out_dir)


def _examples(taskset: TaskSet, tokenizer: Any, n: int, key0: int) -> list[tuple[list[int], int]]:
    """(token ids of prompt + answer + eos, prompt length) for n tasks; the prompt as the
    nodes build it (``prompt_ids``: through the chat template when there is one)."""
    from node.engine.models import prompt_ids

    out = []
    for k in range(n):
        task = taskset.task(key0 + k)
        prompt = prompt_ids(tokenizer, task.prompt)
        target = task.solution or f" \\boxed{{{task.answer}}}"
        answer = tokenizer(target, add_special_tokens=False)["input_ids"]
        out.append((prompt + answer + [int(tokenizer.eos_token_id)], len(prompt)))
    return out


def build_tiny_model(
    out_dir: str | Path,
    recipe: Recipe | None = None,
    *,
    cache_dir: str | Path | None = None,
    progress: Callable[[int, int, float], None] | None = None,
    device: str = "cpu",
) -> tuple[Path, bool]:
    """Build (or reuse) the model; returns (its directory, whether it was built now).
    ``out_dir`` must be absent, an empty directory or a model built here (replaced by the
    new one): anything else is refused (``FileExistsError``), never deleted. ``device``:
    where the SFT runs (on a GPU in bfloat16 autocast, the weights fp32; the numbers
    differ from a CPU build's, the recipe does not, so a GPU build neither reads nor fills
    the cache, which holds the CPU's)."""
    check_replaceable(Path(out_dir))
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM, Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # transformers: unannotated

    r = recipe or Recipe()
    out = Path(out_dir)
    if is_built(out, r):
        return out, False
    # a GPU's build is other numbers under the same recipe: only CPU builds are cached
    cached = cache_path(cache_dir, r) if cache_dir and device == "cpu" else None
    if cached is not None and is_built(cached, r):
        _copy(cached, out)
        return out, False
    taskset = load_taskset(r.task)
    with tempfile.TemporaryDirectory(prefix="intellect-model-") as tmp:
        work = Path(tmp)
        if r.family == "qwen2":
            qwen2.build_tokenizer(work, taskset, r.vocab_size)
        else:
            build_tokenizer(work)
        tokenizer = AutoTokenizer.from_pretrained(work, local_files_only=True)
        torch.manual_seed(r.seed)
        model: Any
        with torch.device(device):  # made where it trains (a 1.1B init is slow on a CPU)
            if r.family == "qwen2":
                cfg = qwen2.config(
                    tokenizer,
                    hidden=r.hidden,
                    mlp=r.mlp,
                    layers=r.layers,
                    heads=r.heads,
                    kv_heads=r.kv_heads,
                    max_positions=r.max_positions,
                )
                model = Qwen2ForCausalLM(cfg)
            else:
                model = LlamaForCausalLM(llama_config(r))
        _train(model, taskset, tokenizer, r, progress)
        model.cpu().eval().save_pretrained(work, safe_serialization=True)
        (work / RECIPE_FILE).write_text(
            json.dumps({"recipe": asdict(r), "digest": r.digest()}, indent=2) + "\n"
        )
        if cached is not None:
            _copy(work, cached)
        _copy(work, out)
    return out, True


def llama_config(r: Recipe) -> Any:
    """The ``LlamaConfig`` of recipe ``r`` for the character tokenizer."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(SPECIALS) + len(CHARS),
        hidden_size=r.hidden,
        intermediate_size=r.mlp,
        num_hidden_layers=r.layers,
        num_attention_heads=r.heads,
        num_key_value_heads=r.kv_heads,
        max_position_embeddings=r.max_positions,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        tie_word_embeddings=True,
    )


def _train(
    model: torch.nn.Module,
    taskset: TaskSet,
    tokenizer: object,
    r: Recipe,
    progress: Callable[[int, int, float], None] | None,
) -> None:
    import torch

    dev = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=r.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=r.lr, total_steps=r.schedule_steps)
    model.train()
    bf16 = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")
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
        with bf16:
            loss = model(
                input_ids=ids.to(dev), attention_mask=mask.to(dev), labels=labels.to(dev)
            ).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if progress is not None:
            progress(step + 1, r.steps, loss.item())


def cache_path(cache_dir: str | Path, r: Recipe) -> Path:
    """Where recipe ``r``'s model lies in the cache ``cache_dir``."""
    return Path(cache_dir) / r.digest()


def is_built(path: Path, r: Recipe) -> bool:
    """Whether ``path`` holds a complete model built by recipe ``r``."""
    try:
        meta = json.loads((path / RECIPE_FILE).read_text())
    except (OSError, ValueError):
        return False
    return bool(meta.get("digest") == r.digest() and any(path.glob("*.safetensors")))


def check_replaceable(out: Path) -> None:
    """Refuse ``out`` unless a model may go there: absent, an empty directory, or a model
    directory this module built (its ``intellect-model.json``)."""
    if not out.exists() and not out.is_symlink():
        return
    if out.is_dir() and not out.is_symlink():
        if (out / RECIPE_FILE).is_file() or not any(out.iterdir()):
            return
    raise FileExistsError(
        f"{out} exists and is not a model built by `intellect-node model init`: not replacing"
        " it (give a new or empty directory)"
    )


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
