"""The Qwen2-family base model (#53 item 4): its byte-level BPE tokenizer and chat
template, grouped-query attention and q/k/v bias in what is saved, the build cached by
recipe (a task file by its bytes; every Llama recipe's digest as before), the project's
math file, TOPLOC and sampling proofs made on it that verify, and the devnet's flag."""

import dataclasses
import filecmp
import json
import subprocess
import sys

import pytest
import torch

from crypto.sampling import derive_seed
from crypto.verdict import RolloutClaim, check_rollout
from node.engine.base import SamplingParams
from node.engine.models import load_model, prompt_ids
from node.engine.qwen2 import END_OF_TEXT, IM_END, IM_START
from node.engine.tinymodel import (
    QUICK,
    QWEN2,
    SHAPES,
    Recipe,
    build_tiny_model,
    build_tokenizer,
    cache_path,
    is_built,
)
from node.engine.torch_engine import TorchEngine, recompute
from node.rollouts.generate import generate_groups
from node.tasks import load_taskset
from node.tasks.mathfile import MathFileTasks
from node.tasks.problems import rows, write_problems
from tests.conftest import CACHE

WORKER = "0x" + "3c" * 20
TEXTS = [
    "Compute 7 × 8.",
    "Un train roule à 60 km/h. Combien de km parcourt-il en 3 heures ?",
    "never seen: 日本語, ümlaut, emoji 🚀, tab\tand\nnewline, NUL \x00 and  two  spaces",
    " leading space and trailing  ",
]


@pytest.fixture(scope="module")
def qwen2(qwen2_model_dir):
    return load_model(qwen2_model_dir)


def test_the_tokenizer_is_a_byte_level_bpe_that_round_trips_any_text(
    qwen2_model_dir, qwen2, qwen2_tasks
):
    tok = qwen2.tokenizer
    saved = json.loads((qwen2_model_dir / "tokenizer.json").read_text())
    assert saved["model"]["type"] == "BPE"
    assert saved["pre_tokenizer"]["type"] == "ByteLevel"
    assert saved["decoder"]["type"] == "ByteLevel"
    assert 200 <= len(saved["model"]["merges"]) <= 1024 - 256 - 3  # learned from the tasks
    for text in TEXTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
        assert tok.unk_token_id is None or tok.unk_token_id not in ids
    # the merges are the task text's: a prompt takes far fewer tokens than its bytes
    prompt = load_taskset(str(qwen2_tasks)).task(0).prompt
    assert len(tok(prompt)["input_ids"]) < len(prompt.encode()) / 2


def test_the_chat_template_renders_chatml_and_prompts_go_through_it(qwen2, qwen2_tasks):
    tok = qwen2.tokenizer
    cfg = json.loads((qwen2.path / "tokenizer_config.json").read_text())
    assert (cfg["eos_token"], cfg["pad_token"]) == (IM_END, END_OF_TEXT)
    text = "Compute 7 × 8."
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    assert rendered == f"{IM_START}user\n{text}{IM_END}\n{IM_START}assistant\n"
    ids = prompt_ids(tok, text)
    assert ids == tok(rendered, add_special_tokens=False)["input_ids"]
    start, end = tok.convert_tokens_to_ids([IM_START, IM_END])
    assert ids.count(start) == 2 and ids.count(end) == 1  # each special is one token
    assert ids[0] == start and tok.decode(ids) == rendered
    # the task's prompt is what the worker and the validator both build (checking.py)
    task = MathFileTasks(qwen2_tasks).task(5)
    assert tok.decode(prompt_ids(tok, task.prompt)).startswith(f"{IM_START}user\n{task.prompt}")


def test_a_model_without_a_chat_template_keeps_the_plain_prompt(tmp_path):
    """The tiny Llama's character tokenizer: ``<bos>`` and one id per character, as ever."""
    from transformers import AutoTokenizer

    build_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert not getattr(tok, "chat_template", None)
    text = "1+2=?\nAnswer:"
    assert prompt_ids(tok, text) == tok(text)["input_ids"]
    assert prompt_ids(tok, text) == [tok.bos_token_id, *tok.convert_tokens_to_ids(list(text))]


def test_grouped_query_attention_and_qkv_bias_are_on_in_what_is_saved(qwen2_model_dir, qwen2):
    cfg = json.loads((qwen2_model_dir / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert 1 <= cfg["num_key_value_heads"] < cfg["num_attention_heads"]
    assert cfg["use_sliding_window"] is False
    tok = qwen2.tokenizer
    assert cfg["eos_token_id"] == tok.convert_tokens_to_ids(IM_END) == tok.eos_token_id
    assert qwen2.eos_token_ids == {tok.eos_token_id}
    head = cfg["hidden_size"] // cfg["num_attention_heads"]
    for layer in qwen2.model.model.layers:
        a = layer.self_attn
        assert a.k_proj.weight.shape[0] == cfg["num_key_value_heads"] * head
        for proj in (a.q_proj, a.k_proj, a.v_proj):
            assert proj.bias is not None and proj.bias.abs().sum() > 0  # trained, not zero
        assert a.o_proj.bias is None


def test_the_build_is_cached_by_recipe_and_a_task_file_by_its_bytes(
    qwen2_model_dir, qwen2_tasks, tmp_path
):
    recipe = dataclasses.replace(QWEN2, task=str(qwen2_tasks))
    assert is_built(qwen2_model_dir, recipe)
    assert is_built(cache_path(CACHE, recipe), recipe)
    # the same problems written elsewhere: the same recipe digest, taken from the cache
    elsewhere = write_problems(tmp_path / "other" / "tasks.jsonl")
    again = dataclasses.replace(QWEN2, task=str(elsewhere))
    assert again.digest() == recipe.digest()
    out, built = build_tiny_model(tmp_path / "copy", again, cache_dir=CACHE)
    assert not built
    names = sorted(p.name for p in qwen2_model_dir.iterdir())
    assert filecmp.cmpfiles(qwen2_model_dir, out, names, shallow=False)[0] == names
    # other problems, or another build of the same: another model
    (tmp_path / "fewer.jsonl").write_text(qwen2_tasks.read_text().split("\n", 1)[1])
    assert dataclasses.replace(again, task=str(tmp_path / "fewer.jsonl")).digest() != again.digest()
    assert dataclasses.replace(again, steps=99).digest() != again.digest()
    assert dataclasses.replace(again, vocab=512).digest() != again.digest()
    assert dataclasses.replace(again, family="llama").digest() != again.digest()


def test_every_llama_recipe_keeps_its_digest():
    """The cached Llamas (the suite's, the devnet's, TinyLlama's shape, a file task named
    by its path) keep their names: a change would rebuild each of them."""
    assert QUICK.digest() == "4c1aaa09a2b399bf"
    assert Recipe().digest() == "6762d63c05b329a7"
    assert Recipe(**SHAPES["1.1b"]).digest() == "d3039d00ade67517"
    assert Recipe(task="x.jsonl").digest() == "6f118577ebef1059"


def test_recipes_of_the_families_are_checked():
    with pytest.raises(ValueError, match="family 'gpt2'"):
        Recipe(family="gpt2")
    with pytest.raises(ValueError, match="vocab is the qwen2"):
        Recipe(vocab=2048)
    with pytest.raises(ValueError, match="kv_heads must divide"):
        dataclasses.replace(QWEN2, kv_heads=3)


def test_the_projects_math_file_is_fixed_and_reads_whole(tmp_path, qwen2_tasks):
    again = write_problems(tmp_path / "p.jsonl")
    assert again.read_bytes() == qwen2_tasks.read_bytes()  # same count and seed, same bytes
    assert write_problems(tmp_path / "q.jsonl", seed=1).read_bytes() != again.read_bytes()
    tasks = MathFileTasks(again)
    assert (len(tasks), tasks.skipped) == (len(rows()), 0)
    assert {t.difficulty for t in tasks.tasks} == {1, 2, 3}
    assert any(not t.prompt.isascii() for t in tasks.tasks)
    assert "×".encode() in again.read_bytes()  # written as UTF-8, not escaped
    for t in tasks.tasks:
        assert t.reward(t.solution) == 1.0 and t.reward(f"\\boxed{{{int(t.answer) + 1}}}") == 0


def test_toploc_and_sampling_proofs_made_on_qwen2_verify_and_a_forgery_fails(qwen2, qwen2_tasks):
    tok = qwen2.tokenizer
    engine = TorchEngine(qwen2.model, eos_token_ids=qwen2.eos_token_ids)
    taskset = load_taskset(str(qwen2_tasks))
    params = SamplingParams(max_new_tokens=40, temperature=1.0)
    groups = generate_groups(
        engine, tok, taskset, worker=WORKER, step=3, count=3, group_size=2, params=params
    )
    checked = 0
    for g in groups:
        assert g.prompt == prompt_ids(tok, g.task.prompt)
        for i, s in enumerate(g.results):
            assert s.seed == derive_seed(WORKER, g.task.task_id, 3, i)
            assert s.proofs
            acts, logits = recompute(qwen2.model, g.prompt, s.tokens)
            claim = RolloutClaim(
                s.tokens, s.proofs, s.seed, s.finish_reason, 40, params.temperature, 1.0
            )
            assert check_rollout(claim, acts, logits, eos_token_id=tok.eos_token_id).passed
            # the same proofs for other tokens (one swapped): refused
            other = [*s.tokens]
            other[0] = (other[0] + 1) % len(tok)
            acts, logits = recompute(qwen2.model, g.prompt, other)
            forged = dataclasses.replace(claim, tokens=other)
            assert not check_rollout(forged, acts, logits, eos_token_id=tok.eos_token_id).passed
            checked += 1
    assert checked == 6


def test_devnet_help_names_the_model_family():
    out = subprocess.run(
        [sys.executable, "-m", "node.cli", "devnet", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--model-family {llama,qwen2}" in out
    assert "byte-level BPE" in " ".join(out.split())


def test_devnet_refuses_a_model_and_a_family_together(tmp_path, qwen2_model_dir):
    from node.cli.devnet import run_devnet

    with pytest.raises(ValueError, match="--model-family qwen2 builds the base model"):
        run_devnet(
            tmp_path,
            run_id="x",
            inference=1,
            duration=1,
            model=qwen2_model_dir,
            model_family="qwen2",
        )
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_the_devnet_writes_the_task_file_the_qwen2_model_is_built_on(tmp_path, qwen2_tasks):
    from node.cli.devnet import prepare_tasks

    assert prepare_tasks(tmp_path, "llama") is None
    path = prepare_tasks(tmp_path, "qwen2")
    assert path == (tmp_path / "tasks" / "problems.jsonl").resolve()
    assert path.read_bytes() == qwen2_tasks.read_bytes()
    assert dataclasses.replace(QWEN2, task=str(path)).digest() == (
        dataclasses.replace(QWEN2, task=str(qwen2_tasks)).digest()
    )


def test_generation_stops_at_the_end_of_an_answer(qwen2):
    """``<|im_end|>`` is the end-of-sequence token the engine stops at (the chat format's)."""
    tok = qwen2.tokenizer
    end = tok.convert_tokens_to_ids(IM_END)
    prompt = prompt_ids(tok, "What is 2 + 3?\nPut the final answer in \\boxed{}.")
    with torch.no_grad():
        out = qwen2.model.generate(
            torch.tensor([prompt]), max_new_tokens=60, do_sample=False, pad_token_id=0
        )
    new = out[0, len(prompt) :].tolist()
    assert end in new, tok.decode(new)
