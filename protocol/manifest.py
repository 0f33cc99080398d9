"""The run manifest: the one document every worker and validator of a run agrees on.

The run owner's trainer signs a ``RunManifest`` whose ``terms`` (``RunTerms``) bind what a
node must share with the run: the trainer's peer id, the ledger (chain id, contract,
deployment block), the base model (each file by size and BLAKE3-256 hash: configuration,
tokenizer and chat template, weights as policy version 0), the task set (a built-in spec,
or a data file by hash), sampling, batch shape, verification profile and async level.

The run id is derived from the terms: ``<name>-<first 16 bytes of the terms' digest, hex>``
(``run_id_of``), so a run id names exactly one set of terms, and a manifest whose terms do
not hash to its run id, or that is signed by any key but the trainer its terms name, is
refused (``open_run_manifest``). The ledger contract records no run identity; the contract
address inside the terms ties the run to its ledger.

One request/response protocol, ``/intellect/manifest/1.0.0`` (``ManifestQuery`` →
``ManifestReply``), serves it, answered for any run (the asker does not know its run
yet). SPEC §2 is the normative text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import msgpack

from crypto.hashing import DIGEST_SIZE, digest
from protocol.errors import Reason, WireError
from protocol.ids import PEER_ID_PATTERN
from protocol.messages import Header
from protocol.schema import FieldSpec, Message, blob, f64, listof, nested, spec, text, u64
from protocol.shardcast import FILE_NAME_PATTERN, MAX_VERSION, is_file_name
from protocol.wire import ENVELOPE_OVERHEAD, open_message

MANIFEST_FORMAT = 1  # RunTerms.format: a node refuses a format it does not know
RUN_NAME_PATTERN = r"[a-z0-9][a-z0-9_-]{0,30}"
RUN_HASH_CHARS = 32  # hex characters of the terms' digest in the run id (128 bits)
CONTRACT_PATTERN = r"0x[0-9a-fA-F]{40}"
VERIFY_PROFILES = ("gpu-bf16", "paper", "strict-fp32")  # crypto.verdict.PROFILES
MAX_MODEL_FILES = 64
MAX_FILE_SIZE = 2**44  # 16 TiB
MAX_TASKSET = 256
MAX_CHAIN_URLS = 4  # RunManifest.chain_urls: the JSON-RPC URLs a joiner may be told
CHAIN_URL_PATTERN = r"https?://[\x21-\x7e]{1,248}"  # printable ASCII, no spaces
RUN_MANIFEST_MAX = 16 * 1024
MANIFEST_ENVELOPE_MAX = RUN_MANIFEST_MAX + ENVELOPE_OVERHEAD
# the run's files (the terms' model files and task set file) travel over SHARDCAST as this
# version of the run, signed by its trainer like a weight version (SPEC §2, §15); inside
# it, a model file ``n`` is named ``model/n`` and the task set file ``taskset/n``
RUN_FILES_VERSION = MAX_VERSION
RUN_FILES_MODEL, RUN_FILES_TASKSET = "model", "taskset"


def _bad(detail: str) -> WireError:
    return WireError(Reason.MALFORMED, detail)


@dataclass(frozen=True)
class FileRef(Message):
    """One file by name, size and BLAKE3-256 hash (nested only)."""

    TYPE = "intellect/file-ref/1"  # nested only
    MAX_SIZE = 512

    name: str = text(255, pattern=FILE_NAME_PATTERN)
    size: int = u64(0, MAX_FILE_SIZE)
    blake3: bytes = blob(DIGEST_SIZE, exact_len=DIGEST_SIZE)

    def check(self) -> None:
        if not is_file_name(self.name):
            raise _bad(f"file name {self.name!r} has a '.' or '..' segment")


@dataclass(frozen=True)
class RunTerms(Message):
    """What a run's nodes agree on; its digest names the run (nested only)."""

    TYPE = "intellect/run-terms/1"  # nested only; also the digest's domain
    MAX_SIZE = RUN_MANIFEST_MAX - 2048  # room for the header and the chain URLs

    format: int = u64(MANIFEST_FORMAT, MANIFEST_FORMAT)
    name: str = text(31, pattern=RUN_NAME_PATTERN)
    trainer: str = text(64, pattern=PEER_ID_PATTERN)
    chain_id: int = u64(1, 2**53)
    contract: str = text(42, pattern=CONTRACT_PATTERN)
    contract_block: int = u64()
    model: list[FileRef] = listof(nested(FileRef), MAX_MODEL_FILES)
    taskset: str = text(MAX_TASKSET)
    taskset_file: list[FileRef] = listof(nested(FileRef), 1)
    verify_profile: str = text(16, choices=VERIFY_PROFILES)
    temperature: float = f64(1e-6, 10.0)
    top_p: float = f64(1e-6, 1.0)
    max_new_tokens: int = u64(1, 16384)
    group_size: int = u64(1, 64)
    tasks_per_batch: int = u64(1, 256)
    async_level: int = u64(0, 64)

    def check(self) -> None:
        if not self.model:
            raise _bad("the manifest names no model files")
        names = [f.name for f in self.model]
        if names != sorted(set(names)):
            raise _bad("model file names must be unique and sorted")
        if not self.taskset:
            raise _bad("the manifest names no task set")
        builtin = self.taskset == "arithmetic" or self.taskset.startswith("arithmetic:")
        if builtin == bool(self.taskset_file):
            raise _bad("a built-in task set has no file; a task set file has exactly one")
        if self.taskset_file and self.taskset_file[0].name != self.taskset:
            raise _bad("taskset must be the task set file's name")

    def canonical(self) -> bytes:
        """The terms' canonical encoding (SPEC §5's order and forms), what is hashed."""
        self.validate()
        data: bytes = msgpack.packb(self.to_obj(), use_bin_type=True)
        return data

    def digest(self) -> bytes:
        """BLAKE2b-256 of the domain, a zero byte and the canonical terms."""
        return digest(self.TYPE.encode() + b"\x00" + self.canonical())

    def run_id(self) -> str:
        return run_id_of(self)


def run_files_of(terms: RunTerms) -> list[tuple[str, FileRef]]:
    """The files of the run's SHARDCAST version ``RUN_FILES_VERSION``, sorted by the name
    they have there (``model/<name>``, ``taskset/<name>``), each with its ``FileRef``."""
    files = [(f"{RUN_FILES_MODEL}/{f.name}", f) for f in terms.model]
    files += [(f"{RUN_FILES_TASKSET}/{f.name}", f) for f in terms.taskset_file]
    return sorted(files, key=lambda x: x[0])


def run_id_of(terms: RunTerms) -> str:
    """The run id the terms name: ``<name>-<hex of the digest's first 16 bytes>``."""
    return f"{terms.name}-{terms.digest().hex()[:RUN_HASH_CHARS]}"


def is_derived_run_id(run_id: str) -> bool:
    """Whether ``run_id`` has the shape of a run id derived from a manifest."""
    return bool(re.fullmatch(rf"{RUN_NAME_PATTERN}-[0-9a-f]{{{RUN_HASH_CHARS}}}", run_id))


@dataclass(frozen=True)
class RunManifest(Header):
    """The run's terms, signed by its trainer; ``run_id`` is the one the terms name.
    ``chain_urls``: JSON-RPC URLs of the terms' chain the trainer suggests to a joiner
    that has none of its own; signed but outside the terms (a new URL is not a new run),
    and a joiner checks the chain id and the contract's code behind each before use."""

    TYPE = "intellect/run-manifest/1"
    MAX_SIZE = RUN_MANIFEST_MAX

    terms: RunTerms = spec(FieldSpec(RunTerms))
    chain_urls: list[str] = field(
        default_factory=list,
        metadata={
            "spec": FieldSpec(
                list,
                max_len=MAX_CHAIN_URLS,
                item=FieldSpec(str, max_len=256, pattern=CHAIN_URL_PATTERN),
            )
        },
    )

    def check(self) -> None:
        if self.run_id != run_id_of(self.terms):
            raise WireError(
                Reason.WRONG_RUN,
                f"the manifest's terms hash to run {run_id_of(self.terms)}, not {self.run_id}",
            )
        if self.sender != self.terms.trainer:
            raise WireError(
                Reason.BAD_SIGNATURE,
                f"manifest signed by {self.sender}, its trainer is {self.terms.trainer}",
            )


@dataclass(frozen=True)
class ManifestQuery(Header):
    """Ask a peer for the run manifest it holds (any run: the asker may know none)."""

    TYPE = "intellect/manifest-query/1"
    MAX_SIZE = 512


@dataclass(frozen=True)
class ManifestReply(Header):
    """The trainer's signed manifest envelope the replying peer holds (empty: none)."""

    TYPE = "intellect/manifest-reply/1"
    MAX_SIZE = MANIFEST_ENVELOPE_MAX + 512

    manifest: bytes = blob(MANIFEST_ENVELOPE_MAX)


def open_run_manifest(
    data: bytes, *, run_id: str | None = None, trainer: str | None = None
) -> RunManifest:
    """Verify a manifest envelope: size, shape, the signature, that the signer is the
    trainer its terms name and that the terms hash to its run id; with ``run_id`` or
    ``trainer``, that it is that run's or that trainer's. ``WireError`` if not."""
    manifest = open_message(data, RunManifest)  # check() ran: hash and signer bound
    if run_id is not None and manifest.run_id != run_id:
        raise WireError(Reason.WRONG_RUN, f"manifest of run {manifest.run_id}, not {run_id}")
    if trainer is not None and manifest.sender != trainer:
        raise WireError(
            Reason.BAD_SIGNATURE, f"manifest signed by {manifest.sender}, not the trainer {trainer}"
        )
    return manifest
