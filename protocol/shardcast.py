"""SHARDCAST on the wire: signed weight manifests, holdings and the shard exchange.

A checkpoint (a directory of safetensors weights, config and tokenizer files) is one
*version*. Its files, sorted by name, are concatenated into one byte sequence cut into
shards of ``shard_size`` bytes (the last one shorter). The trainer signs a
``WeightManifest``: run id, version, training step, the files (name, size, offset), the
shard size, one BLAKE3-256 hash per shard and one for the whole sequence. A node accepts
a manifest only when the run's trainer key (``trainer_peer_id``) signed it
(``open_manifest``), and verifies each shard against it on arrival, so any peer may serve
shards and none has to be trusted.

Two request/response protocols (one request envelope, one reply envelope):
- ``/intellect/weights/1.0.0``: ``WeightsQuery`` → ``WeightsHolding``: which version a peer
  holds (0 = its newest), the trainer's manifest envelope if asked for, and a bitmap of the
  shards it holds (a peer still downloading serves what it has);
- ``/intellect/shardcast/1.0.0``: ``ShardRequest`` → ``ShardReply``, followed by the shard's
  bytes in raw frames of at most ``DATA_FRAME`` bytes (unsigned: the manifest's hash is
  the check).
New versions are announced on the ``weights`` announcement topic (``WeightsNotice``).
SPEC.md section 15 is the normative text.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import msgpack

from crypto.hashing import DIGEST_SIZE, digest
from protocol.errors import Reason, WireError
from protocol.messages import Header
from protocol.schema import (
    FieldSpec,
    Message,
    blob,
    listof,
    nested,
    read_fields,
    spec,
    text,
    u64,
)
from protocol.wire import ENVELOPE_OVERHEAD, open_message

KiB, MiB = 1024, 1024 * 1024
MIN_SHARD = 64 * KiB
MAX_SHARD = 64 * MiB
DEFAULT_SHARD = 8 * MiB  # bench/shardcast.py: one pull 155 MB/s at 8 MiB, 142 at 4; swarm alike
MAX_SHARDS = 65_536
MAX_FILES = 1024
MAX_NAME = 255
MAX_VERSION = 2**48 - 1
DATA_FRAME = 1 * MiB  # shard bytes travel in frames of at most this size
WEIGHTS_TOPIC = "weights"
FILE_NAME_PATTERN = r"[A-Za-z0-9_.+=-]+(/[A-Za-z0-9_.+=-]+)*"
MANIFEST_MAX = MAX_SHARDS * DIGEST_SIZE + MAX_FILES * (MAX_NAME + 48) + 2048
MAX_BITMAP = MAX_SHARDS // 8


def _bad(detail: str) -> WireError:
    return WireError(Reason.MALFORMED, detail)


@dataclass(frozen=True)
class WeightFile(Message):
    TYPE = "intellect/weight-file/1"  # nested only
    MAX_SIZE = 1024

    name: str = text(MAX_NAME, pattern=FILE_NAME_PATTERN)  # relative path, '/' separated
    size: int = u64(0, MAX_SHARD * MAX_SHARDS)
    offset: int = u64(0, MAX_SHARD * MAX_SHARDS)  # where it starts in the concatenation

    def check(self) -> None:
        if any(part in (".", "..") for part in self.name.split("/")):
            raise _bad(f"file name {self.name!r} has a '.' or '..' segment")


@dataclass(frozen=True)
class WeightManifest(Header):
    """One checkpoint version, signed by the run's trainer."""

    TYPE = "intellect/weight-manifest/1"
    MAX_SIZE = MANIFEST_MAX

    version: int = u64(1, MAX_VERSION)
    step: int = u64()  # the training step that produced these weights
    shard_size: int = u64(MIN_SHARD, MAX_SHARD)
    total_size: int = u64(1, MAX_SHARD * MAX_SHARDS)
    digest: bytes = blob(DIGEST_SIZE, exact_len=DIGEST_SIZE)  # of the whole concatenation
    files: list[WeightFile] = listof(nested(WeightFile), MAX_FILES)
    shard_hashes: bytes = blob(MAX_SHARDS * DIGEST_SIZE)  # 32 bytes per shard, in order

    def check(self) -> None:
        if not self.files:
            raise _bad("manifest lists no files")
        offset, previous = 0, ""
        for f in self.files:
            if f.name <= previous:
                raise _bad(f"file names must be unique and sorted: {f.name!r}")
            if f.offset != offset:
                raise _bad(f"{f.name}: offset {f.offset}, files before it end at {offset}")
            offset += f.size
            previous = f.name
        names = {f.name for f in self.files}
        for name in names:  # a file may not also be a directory ("a" and "a/b")
            parts = name.split("/")
            if any("/".join(parts[:i]) in names for i in range(1, len(parts))):
                raise _bad(f"{name!r} lies under another file")
        if offset != self.total_size:
            raise _bad(f"files add up to {offset} bytes, total_size is {self.total_size}")
        want = math.ceil(self.total_size / self.shard_size)
        if want > MAX_SHARDS:
            raise _bad(f"{want} shards > {MAX_SHARDS}")
        if len(self.shard_hashes) != want * DIGEST_SIZE:
            raise _bad(
                f"{len(self.shard_hashes) // DIGEST_SIZE} shard hashes, {self.total_size} bytes "
                f"in shards of {self.shard_size} need {want}"
            )

    @property
    def num_shards(self) -> int:
        return len(self.shard_hashes) // DIGEST_SIZE

    def shard_hash(self, index: int) -> bytes:
        return self.shard_hashes[index * DIGEST_SIZE : (index + 1) * DIGEST_SIZE]

    def shard_range(self, index: int) -> tuple[int, int]:
        """[start, end) of shard ``index`` in the concatenation."""
        if not 0 <= index < self.num_shards:
            raise IndexError(f"shard {index} of {self.num_shards}")
        start = index * self.shard_size
        return start, min(start + self.shard_size, self.total_size)

    def shard_length(self, index: int) -> int:
        start, end = self.shard_range(index)
        return end - start

    def spans(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """The pieces of [start, end) as (file index, offset in that file, length)."""
        out = []
        for i, f in enumerate(self.files):
            lo, hi = max(start, f.offset), min(end, f.offset + f.size)
            if lo < hi:
                out.append((i, lo - f.offset, hi - lo))
        return out


@dataclass(frozen=True)
class WeightsNotice(Message):
    """The body of a ``weights`` announcement: a version is available from the sender."""

    TYPE = "intellect/weights-notice/1"  # inside an announcement body
    MAX_SIZE = 256

    version: int = u64(1, MAX_VERSION)
    step: int = u64()
    manifest: bytes = blob(DIGEST_SIZE, exact_len=DIGEST_SIZE)  # digest of its envelope


@dataclass(frozen=True)
class WeightsQuery(Header):
    """Ask a peer what it holds of ``version`` (0: its newest), with the manifest or not."""

    TYPE = "intellect/weights-query/1"
    MAX_SIZE = 1024

    version: int = u64(0, MAX_VERSION)
    with_manifest: bool = spec(FieldSpec(bool))


@dataclass(frozen=True)
class WeightsHolding(Header):
    """What the replying peer holds: ``version`` 0 means nothing."""

    TYPE = "intellect/weights-holding/1"
    MAX_SIZE = MANIFEST_MAX + ENVELOPE_OVERHEAD + MAX_BITMAP + 1024

    version: int = u64(0, MAX_VERSION)
    manifest: bytes = blob(MANIFEST_MAX + ENVELOPE_OVERHEAD)  # trainer's envelope, or empty
    have: bytes = blob(MAX_BITMAP)  # bit i (LSB first within each byte) = holds shard i


@dataclass(frozen=True)
class ShardRequest(Header):
    TYPE = "intellect/shard-request/1"
    MAX_SIZE = 1024

    version: int = u64(1, MAX_VERSION)
    index: int = u64(0, MAX_SHARDS - 1)


@dataclass(frozen=True)
class ShardReply(Header):
    """Precedes exactly ``size`` bytes of shard ``index`` in frames of ≤ ``DATA_FRAME``."""

    TYPE = "intellect/shard-reply/1"
    MAX_SIZE = 1024

    version: int = u64(1, MAX_VERSION)
    index: int = u64(0, MAX_SHARDS - 1)
    size: int = u64(1, MAX_SHARD)


def open_manifest(data: bytes, *, run_id: str, trainer: str | None) -> WeightManifest:
    """Verify a manifest envelope: size, shape, signature, run, and the trainer's key.

    A manifest signed by anyone but ``trainer`` is ``bad_signature``; with no trust root
    configured (``trainer`` None) every manifest is refused.
    """
    manifest = open_message(data, WeightManifest)
    if manifest.run_id != run_id:
        raise WireError(Reason.WRONG_RUN, f"manifest of run {manifest.run_id!r}")
    if trainer is None:
        raise WireError(Reason.BAD_SIGNATURE, "no trainer_peer_id configured: no trust root")
    if manifest.sender != trainer:
        raise WireError(
            Reason.BAD_SIGNATURE,
            f"manifest signed by {manifest.sender}, the run's trainer is {trainer}",
        )
    return manifest


def check_notice(body: bytes) -> WeightsNotice:
    """Decode a ``weights`` announcement body."""
    obj = read_fields(WeightsNotice, body, typed=False, where="weights notice")
    return WeightsNotice.from_obj(obj, where="weights notice")


def encode_notice(notice: WeightsNotice) -> bytes:
    notice.validate()
    data: bytes = msgpack.packb(notice.to_obj(), use_bin_type=True)
    return data


def manifest_id(envelope: bytes) -> bytes:
    """What a notice names a manifest by: the digest of its signed envelope."""
    return digest(envelope)


def bitmap(held: set[int] | list[bool], n: int) -> bytes:
    """Pack shard indices (or flags) into the ``have`` bitmap of ``n`` shards."""
    out = bytearray((n + 7) // 8)
    indices = held if isinstance(held, set) else {i for i, h in enumerate(held) if h}
    for i in indices:
        if 0 <= i < n:
            out[i // 8] |= 1 << (i % 8)
    return bytes(out)


def unbitmap(data: bytes, n: int) -> set[int]:
    """Shard indices set in a ``have`` bitmap; a bitmap of the wrong length is malformed."""
    if len(data) != (n + 7) // 8:
        raise _bad(f"have bitmap of {len(data)} bytes for {n} shards")
    return {i for i in range(n) if data[i // 8] >> (i % 8) & 1}


def is_file_name(name: str) -> bool:
    return bool(re.fullmatch(FILE_NAME_PATTERN, name)) and not any(
        p in (".", "..") for p in name.split("/")
    )
