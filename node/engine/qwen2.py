"""The Qwen2-family base model's parts: a byte-level BPE tokenizer with Qwen's chat
template, trained here on the task set's text, and a small ``Qwen2Config``.

``model init --family qwen2`` (``tinymodel.build_tiny_model`` with a ``Recipe`` of family
``qwen2``) builds a model of a real family beside the tiny Llama: grouped-query attention
(fewer KV heads than heads) and a bias on the q, k and v projections (Qwen2's attention
always has it), with a tokenizer of the kind real models ship rather than one token per
character. Nothing is downloaded: the tokenizer is trained with the ``tokenizers`` library
on the task set's prompts and worked solutions (byte-level, so any text round-trips, every
byte being in the alphabet), with ``vocab`` entries in all (256 bytes, the specials, the
merges learned from the text; a small corpus may learn fewer). The SFT loop is
``tinymodel``'s, on the chat-formatted prompt.

The chat template is Qwen's ChatML: each message ``<|im_start|>ROLE\\nTEXT<|im_end|>\\n``,
then ``<|im_start|>assistant\\n`` as the generation prompt; ``<|im_end|>`` ends an answer
(the tokenizer's and the model's end-of-sequence token) and ``<|endoftext|>`` pads. A
prompt is rendered through it wherever the nodes build one (``models.prompt_ids``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from node.tasks import TaskSet

END_OF_TEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIALS = (END_OF_TEXT, IM_START, IM_END)  # ids 0, 1, 2: the first the trainer adds
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CORPUS_TASKS = 4096  # tasks whose prompt and worked solution the BPE is trained on


def corpus(taskset: TaskSet, count: int = CORPUS_TASKS) -> Iterator[str]:
    """The text the tokenizer learns from: ``count`` tasks' prompts and solutions after
    the roles the chat template puts before them (a math file of fewer tasks repeats,
    which changes no merge)."""
    for key in range(count):
        task = taskset.task(key)
        yield f"user\n{task.prompt}"  # as the chat template frames them
        answer = task.solution or f"\\boxed{{{task.answer}}}"
        yield f"assistant\n{answer}"


def build_tokenizer(out_dir: Path, taskset: TaskSet, vocab: int) -> None:
    """Train the byte-level BPE on ``taskset``'s text and save it as a Hugging Face
    tokenizer (``tokenizer.json``, ``tokenizer_config.json``, the chat template)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(taskset), trainer=trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # transformers: unannotated
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        clean_up_tokenization_spaces=False,  # byte-level: decode gives the bytes back
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)


def config(
    tokenizer: Any,
    *,
    hidden: int,
    mlp: int,
    layers: int,
    heads: int,
    kv_heads: int,
    max_positions: int,
) -> Any:
    """The ``Qwen2Config`` of these sizes for ``tokenizer``'s vocabulary."""
    from transformers import Qwen2Config

    eos, pad = tokenizer.convert_tokens_to_ids([IM_END, END_OF_TEXT])
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        use_sliding_window=False,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=None,  # as Qwen2: a prompt starts with its chat template
        tie_word_embeddings=True,
    )
