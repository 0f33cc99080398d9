"""The pretraining corpus of a DiLoCo group, cut into one contiguous shard per member.

SPEC §22. The text file (UTF-8) is tokenized once with the model's tokenizer: ``N`` tokens.
With ``k`` shards (the members of the roster that formed the group, in the roster's order),
member ``i`` owns the tokens ``[i·N // k, (i+1)·N // k)``: shards are disjoint and cover the
text, and every member computes its own from the roster alone. A member reads its shard in
order as sequences of ``T + 1`` tokens whose starts are ``T`` apart (a sequence's last token,
its last target, is the next one's first input: within a pass no token is a target twice):
sequence ``s`` starts at
``lo + (s mod m)·T``, with ``m = (hi − lo − 1) // T`` sequences per pass over the shard;
batch ``p`` is sequences ``p·B … p·B + B − 1``. So the number of batches consumed, the
``position``, is the member's whole data state (``meta.position`` of its DiLoCo state,
``node/diloco/state.py``): a member resumed from its checkpoint reads on exactly where it
stopped, and tokens seen = ``position·B·T``.

Reading and checking the file is here too, without torch, so that ``intellect-node start``
refuses a bad ``--trainer.data`` at once with one line.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class CorpusError(ValueError):
    """A corpus that cannot be trained on, with a one-line message for the user."""


def read_text(path: Path) -> str:
    """The text of ``path``; a ``CorpusError`` if it is missing, unreadable, empty or not
    UTF-8."""
    path = Path(path).expanduser()
    if not path.exists():
        raise CorpusError(f"data file not found: {path}")
    if path.is_dir():
        raise CorpusError(f"data file {path} is a directory, not a text file")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CorpusError(f"cannot read data file {path}: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorpusError(f"data file {path} is not UTF-8 text (byte {exc.start})") from exc
    if not text.strip():
        raise CorpusError(f"data file {path} is empty")
    return text


def check_readable(path: Path, chunk: int = 1 << 20) -> None:
    """``read_text``'s checks for a start command, reading the file in chunks (constant
    memory, however large the corpus): the role's child reads it whole later."""
    path = Path(path).expanduser()
    if not path.exists():
        raise CorpusError(f"data file not found: {path}")
    if path.is_dir():
        raise CorpusError(f"data file {path} is a directory, not a text file")
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, blank = 0, True
    try:
        with open(path, "rb") as f:
            while True:
                raw = f.read(chunk)
                try:
                    text = decoder.decode(raw, final=not raw)
                except UnicodeDecodeError as exc:
                    raise CorpusError(
                        f"data file {path} is not UTF-8 text (byte {offset + exc.start})"
                    ) from exc
                blank = blank and not text.strip()
                offset += len(raw)
                if not raw:
                    break
    except OSError as exc:
        raise CorpusError(f"cannot read data file {path}: {exc.strerror or exc}") from exc
    if blank:
        raise CorpusError(f"data file {path} is empty")


@dataclass(frozen=True)
class Shard:
    """Member ``index`` of ``count``: its token range ``[lo, hi)`` and how it reads it."""

    index: int
    count: int
    lo: int
    hi: int
    seq_len: int  # T
    batch: int  # B

    @classmethod
    def of(cls, n_tokens: int, index: int, count: int, seq_len: int, batch: int) -> Shard:
        if not 0 <= index < count:
            raise CorpusError(f"shard {index} of {count} does not exist")
        lo, hi = index * n_tokens // count, (index + 1) * n_tokens // count
        if hi - lo < seq_len + 1:
            raise CorpusError(
                f"the text has {n_tokens} tokens: shard {index} of {count} holds {hi - lo}, "
                f"fewer than one sequence of pretrain_seq_len + 1 = {seq_len + 1}; use a "
                "longer text or a shorter pretrain_seq_len"
            )
        return cls(index, count, lo, hi, seq_len, batch)

    @property
    def per_pass(self) -> int:
        """Sequences in one pass over the shard (``m``)."""
        return (self.hi - self.lo - 1) // self.seq_len

    def starts(self, position: int) -> list[int]:
        """The token offsets of batch ``position``'s sequences."""
        first = position * self.batch
        return [self.lo + ((first + j) % self.per_pass) * self.seq_len for j in range(self.batch)]

    def tokens_seen(self, position: int) -> int:
        return position * self.batch * self.seq_len

    def passes(self, position: int) -> float:
        """Passes over the shard so far (1.0: every token of it was a target once)."""
        return position * self.batch / self.per_pass

    def as_dict(self) -> dict[str, Any]:
        return {
            "shard": self.index,
            "shards": self.count,
            "tokens": [self.lo, self.hi],
            "per_pass": self.per_pass,
        }


def spans(starts: list[int], seq_len: int) -> list[list[int]]:
    """The token ranges ``[a, b)`` that sequences starting at ``starts`` cover, merged
    (what a member reports it read: computed from the starts it actually used)."""
    out: list[list[int]] = []
    for s in sorted(starts):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], s + seq_len + 1)
        else:
            out.append([s, s + seq_len + 1])
    return out
