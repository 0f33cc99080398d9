"""Every decoder that reads bytes from a peer or from disk, as a fuzz target.

Shared by the CI fuzz tests (``tests/test_fuzz.py``, hypothesis) and the long
coverage-guided run (``bench/fuzz.py``, atheris). A target takes one input (``bytes``)
and feeds it to one decoder exactly as the node does; the only exceptions it may raise
are the decoder's documented ones (``allowed``: ``protocol.errors.WireError`` on the
wire, ``BatchStoreError`` for a damaged stored batch). Anything else is a crash. A
target also checks what the decoder promises about a *success* (a resumed journal
holds only verified shards, a store never loads an unverified manifest), so a decoder
that silently accepts garbage fails too.

``seeds()`` gives valid encodings of each input, for mutation: random bytes alone would
rarely get past the first length or type check.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import trio

from crypto.envelope import Envelope
from crypto.hashing import bulk_digest, digest
from crypto.identity import Identity
from protocol import batches as pb
from protocol import diloco as pd
from protocol import manifest as pr
from protocol import messages as pm
from protocol import shardcast as ps
from protocol.errors import WireError
from protocol.framing import HEADER, FrameReader
from protocol.messages import Header
from protocol.rollouts import RolloutBatch, pack_floats
from protocol.wire import open_message, seal

RUN = "fuzz-run"
SIGNER = Identity(bytes(range(32)))  # the fuzzer's own key: it signs whatever it makes
OTHER = Identity(bytes(range(1, 33)))
TS = 1_700_000_000_000

# every signed message type a node opens from the wire
HEADER_TYPES: tuple[type[Header], ...] = (
    pm.NodeInfo,
    pm.Announcement,
    pm.SyncRequest,
    pm.SyncReply,
    pm.Refusal,
    pb.BatchRequest,
    pb.BatchReply,
    RolloutBatch,
    ps.WeightManifest,
    ps.WeightsQuery,
    ps.WeightsHolding,
    ps.ShardRequest,
    ps.ShardReply,
    pd.DilocoRequest,
    pd.DilocoRoster,
    pd.DilocoChunk,
    pr.RunManifest,
    pr.ManifestQuery,
    pr.ManifestReply,
)


@dataclass(frozen=True)
class Target:
    name: str
    run: Callable[[bytes], object]
    seeds: Callable[[], list[bytes]]
    allowed: tuple[type[BaseException], ...] = (WireError,)


def header(identity: Identity = SIGNER, seq: int = 1) -> dict[str, object]:
    return dict(run_id=RUN, sender=identity.peer_id, seq=seq, ts_ms=TS)


def short(cls: type) -> str:
    """``intellect/batch-request/1`` → ``batch-request``."""
    return str(cls.TYPE).split("/")[1]  # type: ignore[attr-defined]


# ---- valid examples of every message ---------------------------------------------------


def a_manifest(files: list[tuple[str, bytes]], shard_size: int = ps.MIN_SHARD) -> ps.WeightManifest:
    """The manifest of ``files`` (name, content), sorted, in shards of ``shard_size``."""
    blob = b"".join(content for _, content in files)
    offset, entries = 0, []
    for name, content in files:
        entries.append(ps.WeightFile(name=name, size=len(content), offset=offset))
        offset += len(content)
    hashes = b"".join(
        bulk_digest(blob[i : i + shard_size]) for i in range(0, len(blob), shard_size)
    )
    return ps.WeightManifest(
        **header(),
        version=1,
        step=0,
        shard_size=shard_size,
        total_size=len(blob),
        digest=bulk_digest(blob),
        files=entries,
        shard_hashes=hashes,
    )


def examples() -> list[Header]:
    """One valid instance of every type in ``HEADER_TYPES`` (some of several)."""
    from tests.helpers.batches import a_batch

    batch = a_batch(SIGNER)
    key = bytes(range(32))
    small = a_manifest([("config.json", b"{}" * 10), ("model.safetensors", bytes(100))])
    run = a_run_manifest()
    ann = pm.Announcement(**header(), topic="batches", session=7, index=0, body=b"x" * 40)
    return [
        pm.NodeInfo(
            **header(),
            role="inference",
            state="up",
            addrs=["/ip4/127.0.0.1/tcp/4001"],
            session=1,
            announced=3,
        ),
        ann,
        pm.SyncRequest(**header(), session=7, indices=[0, 1, 5]),
        pm.SyncReply(**header(), items=[seal(SIGNER, ann)]),
        pm.Refusal(**header(), reason="busy", detail="every upload slot is taken"),
        pb.BatchRequest(**header(), work_key=key),
        pb.BatchReply(**header(), work_key=key, size=1234),
        batch,
        small,
        ps.WeightsQuery(**header(), version=0, with_manifest=True),
        ps.WeightsHolding(**header(), version=1, manifest=seal(SIGNER, small), have=b"\x01"),
        ps.ShardRequest(**header(), version=1, index=0),
        ps.ShardReply(**header(), version=1, index=0, size=ps.MIN_SHARD),
        pd.DilocoRequest(
            **header(),
            op="sync",
            step=2,
            attempt=0,
            phase="",
            round=0,
            layout="ab" * 16,
            norm=1.5,
            state="cd" * 32,
            blame="",
        ),
        pd.DilocoRoster(
            **header(),
            step=2,
            attempt=1,
            state="ready",
            encoding="int8",
            members=[SIGNER.peer_id, OTHER.peer_id],
            norms=[1.0, 2.5],
        ),
        pd.DilocoChunk(
            **header(), step=2, attempt=0, phase="rs", round=1, size=1024, digest=bytes(32)
        ),
        run,
        pr.ManifestQuery(**header()),
        pr.ManifestReply(**header(), manifest=seal(SIGNER, run)),
        pr.ManifestReply(**header(), manifest=b""),
    ]


def a_run_manifest() -> pr.RunManifest:
    """A valid run manifest signed by ``SIGNER`` (its trainer), under its derived run id."""
    from tests.helpers.manifests import run_terms

    terms = run_terms(SIGNER.peer_id, name="fuzz")
    return pr.RunManifest(**{**header(), "run_id": pr.run_id_of(terms)}, terms=terms)


def payload_seeds(cls: type[Header]) -> list[bytes]:
    return [m.encode() for m in examples() if type(m) is cls]


# ---- the targets ---------------------------------------------------------------------


def _frames(data: bytes) -> None:
    """A stream delivering ``data[1:]`` in pieces of ``data[0] + 1`` bytes, read frame by
    frame (max 4 KiB each) until it ends: the framing every protocol stream uses."""
    piece = (data[0] + 1) if data else 1
    body = data[1:]

    class Chunked:
        def __init__(self) -> None:
            self.at = 0

        async def read(self, n: int | None = None) -> bytes:
            await trio.lowlevel.checkpoint()
            out = body[self.at : self.at + min(piece, n or piece)]
            self.at += len(out)
            return out

        async def write(self, data: bytes) -> None:  # pragma: no cover - never written
            raise AssertionError

    async def main() -> None:
        reader = FrameReader(Chunked(), chunk=64)
        got = 0
        while True:
            try:
                frame = await reader.read_frame(4096, deadline=5.0)
            except EOFError:
                break
            got += HEADER.size + len(frame)
            assert len(frame) <= 4096
        assert got == len(body), f"read {got} of {len(body)} bytes without an error"

    trio.run(main)


def _open_any(data: bytes) -> None:
    open_message(data, *HEADER_TYPES)


def _decode(cls: type[Header]) -> Callable[[bytes], object]:
    def run(data: bytes) -> object:
        message = cls.decode(data)
        message.validate()  # what decoding accepted is a valid message
        return message

    return run


def _signed(cls: type[Header], then: Callable[[Header], object]) -> Callable[[bytes], object]:
    """Sign ``data`` as a ``cls`` payload (a peer can sign anything) and open it the way
    the node does, then ``then(message)``: the path behind the signature check."""

    def run(data: bytes) -> object:
        env = Envelope.seal(SIGNER, cls.TYPE, data)
        sealed = msgpack.packb(
            {"d": cls.TYPE, "p": data, "k": env.signer, "s": env.signature}, use_bin_type=True
        )
        return then(open_message(sealed, cls))

    return run


def _use_batch(message: Header) -> object:
    """What the store, validator and trainer read from an opened batch."""
    assert isinstance(message, RolloutBatch)
    message.work_key()
    for g in message.groups:
        assert len(g.prompt_ids) >= 1
        for s in g.samples:
            assert len(s.token_ids) == len(s.logprob_values)
    return message.num_tokens


def _open_manifest(data: bytes) -> object:
    env = Envelope.seal(SIGNER, ps.WeightManifest.TYPE, data)
    sealed = msgpack.packb(
        {"d": ps.WeightManifest.TYPE, "p": data, "k": env.signer, "s": env.signature},
        use_bin_type=True,
    )
    m = ps.open_manifest(sealed, run_id=RUN, trainer=SIGNER.peer_id)
    for i in range(min(m.num_shards, 4)):  # what serving and pulling compute from it
        start, end = m.shard_range(i)
        m.spans(start, end)
    ps.unbitmap(bytes((m.num_shards + 7) // 8), m.num_shards)
    return m


def _open_run_manifest(data: bytes) -> object:
    """``data`` signed by ``SIGNER`` as a run manifest's payload, opened as a joining node
    opens what a peer serves (``protocol.manifest.open_run_manifest``)."""
    env = Envelope.seal(SIGNER, pr.RunManifest.TYPE, data)
    sealed = msgpack.packb(
        {"d": pr.RunManifest.TYPE, "p": data, "k": env.signer, "s": env.signature},
        use_bin_type=True,
    )
    m = pr.open_run_manifest(sealed)
    return m.terms.digest()


_ACTIVATIONS: list[object] = []


def _proofs(data: bytes) -> object:
    """TOPLOC verification of proofs from a peer against the validator's own states:
    ``data[0]`` picks top-k (1..8), the rest is cut into proofs (``data[1]``-byte pieces)."""
    import torch

    from crypto.toploc import verify_proofs

    if not _ACTIVATIONS:
        g = torch.Generator().manual_seed(0)
        _ACTIVATIONS.extend([torch.randn(3, 8, generator=g)] + list(torch.randn(5, 8, generator=g)))
    topk = 1 + (data[0] % 8 if data else 0)
    width = data[1] if len(data) > 1 else 1
    rest = data[2:]
    proofs = [rest[i : i + max(width, 1)] for i in range(0, len(rest), max(width, 1))]
    results = verify_proofs(_ACTIVATIONS, proofs, chunk_size=2, topk=topk)  # type: ignore[arg-type]
    assert len(results) == 4 and all(isinstance(r.passed, bool) for r in results)
    return results


def _quant(data: bytes) -> object:
    """A DiLoCo ring chunk (``node/diloco/quant.py``, ``sparse.py``): ``data[0]`` picks the
    encoding, ``data[1:3]`` the agreed value count, the rest is the chunk."""
    from node.diloco import codecs

    encodings = ("int8", "fp32", "bf16", "sparse-2", "sparse-64")
    encoding = encodings[data[0] % len(encodings)] if data else "int8"
    n = int.from_bytes(data[1:3], "big") if len(data) >= 3 else 0
    out = codecs.decode(data[3:], encoding, n)
    assert out.numel() == n
    return out


def _sparse_seed() -> bytes:
    import torch

    from node.diloco import codecs

    return codecs.encode(torch.linspace(-1, 1, 4097), "sparse-2")


@dataclass
class DiskTargets:
    """Targets that read files a node wrote (and a crash or a disk may have damaged)."""

    root: Path
    _made: bool = False
    _files: list[tuple[str, bytes]] = field(default_factory=list)

    def _setup(self) -> None:
        if self._made:
            return
        from node.rollouts.store import BatchStore

        self.root.mkdir(parents=True, exist_ok=True)
        self.batches = BatchStore(self.root / "batches")
        # a partial download of three shards: 0 and 2 written right, 1 damaged
        self._files = [
            ("a.bin", random.Random(1).randbytes(ps.MIN_SHARD + 10)),
            ("b.bin", random.Random(2).randbytes(ps.MIN_SHARD + 20)),
        ]
        self.manifest = a_manifest(self._files)
        self.envelope = seal(SIGNER, self.manifest)
        self.partial = self.root / "weights" / ".partial-v00000001"
        (self.partial / "files").mkdir(parents=True, exist_ok=True)
        blob = bytearray(b"".join(c for _, c in self._files))
        blob[ps.MIN_SHARD + 5] ^= 0xFF  # shard 1 holds a flipped byte
        (self.partial / "manifest.sig").write_bytes(self.envelope)
        off = 0
        for name, content in self._files:
            (self.partial / "files" / name).write_bytes(bytes(blob[off : off + len(content)]))
            off += len(content)
        # a store holding one complete version (v1), next to which the input is put
        from node.shardcast.store import WeightStore, publish

        src = self.root / "checkpoint"
        src.mkdir(exist_ok=True)
        (src / "config.json").write_bytes(b"{}")
        publish(
            WeightStore(self.root / "store", RUN, SIGNER.peer_id),
            src,
            identity=SIGNER,
            version=1,
            step=0,
            shard_size=ps.MIN_SHARD,
            seq=1,
            ts_ms=TS,
        ).close()
        self._made = True

    def batch_file(self, data: bytes) -> object:
        """A stored batch file read back by ``BatchStore.get`` (and the directory listed)."""
        from node.rollouts.store import BatchStore

        self._setup()
        try:  # stored under its work key, as ``put`` does; garbage under any name
            key = open_message(data, RolloutBatch).work_key()
        except WireError:
            key = hashlib.blake2b(data, digest_size=32).digest()
        path = self.batches.dir / f"{key.hex()}.batch"
        path.write_bytes(data)
        # a stray name in the directory (a copy, an editor's backup) must not break listing
        stray = self.batches.dir / (data[:12].hex()[: (data[0] % 70) if data else 0] + ".batch")
        stray.write_bytes(b"")
        try:
            got = self.batches.get(key)
            assert got == data
            keys = BatchStore(self.batches.dir).keys()
            assert key in keys and all(len(k) == 32 for k in keys)
            return got
        finally:
            path.unlink(missing_ok=True)
            stray.unlink(missing_ok=True)

    def journal(self, data: bytes) -> object:
        """A SHARDCAST partial's ``done`` journal resumed after a crash."""
        from node.shardcast.store import JOURNAL, Partial

        self._setup()
        (self.partial / "done").write_bytes(data)
        partial = Partial(self.partial, self.manifest, self.envelope)
        try:
            listed = {
                JOURNAL.unpack_from(data, i)[0] for i in range(0, len(data) - len(data) % 4, 4)
            }
            assert partial.held == listed & {0, 2}, (partial.held, listed)
            rewritten = (self.partial / "done").read_bytes()
            assert rewritten == b"".join(struct.pack(">I", i) for i in sorted(partial.held))
            return partial.held
        finally:
            partial.close()

    def weight_dir(self, data: bytes) -> object:
        """A version directory's ``manifest.sig`` and a partial's directory name, loaded by
        ``WeightStore.load`` and swept by ``retain`` on start."""
        from node.shardcast.store import WeightStore

        self._setup()
        root = self.root / "store"
        (root / "v00000003").mkdir(parents=True, exist_ok=True)
        (root / "v00000003" / "manifest.sig").write_bytes(data)
        name = data[:8].decode("ascii", "replace").replace("/", "_").replace("\0", "_")
        partial = root / f".partial-v{name}"
        partial.mkdir(exist_ok=True)
        store = WeightStore(root, RUN, SIGNER.peer_id)
        store.load()
        # v1 loads; nothing in the input is a verified, complete version
        assert set(store.complete) == {1}, sorted(store.complete)
        try:
            store.retain(keep=1)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
            for source in store.complete.values():
                source.close()
        return store


def targets(workdir: Path) -> dict[str, Target]:
    """Every fuzz target by name; disk targets work under ``workdir``."""
    out: dict[str, Target] = {}

    def add(t: Target) -> None:
        out[t.name] = t

    add(Target("frame", _frames, lambda: [b"\x07" + HEADER.pack(3) + b"abc" + HEADER.pack(0)]))
    add(Target("envelope", _open_any, lambda: [seal(SIGNER, m) for m in examples()]))
    for cls in HEADER_TYPES:
        add(Target(f"msg/{short(cls)}", _decode(cls), lambda c=cls: payload_seeds(c)))
    add(
        Target(
            "rollout-batch",
            _signed(RolloutBatch, _use_batch),
            lambda: payload_seeds(RolloutBatch),
        )
    )
    add(Target("manifest", _open_manifest, lambda: payload_seeds(ps.WeightManifest)))
    add(Target("run-manifest", _open_run_manifest, lambda: payload_seeds(pr.RunManifest)))
    notice = pb.BatchNotice(
        work_key=bytes(32), worker="0x" + "ab" * 20, step=1, policy_version=0, units=9, size=99
    )
    add(Target("body/batch-notice", pb.BatchNotice.decode, lambda: [notice.encode()]))
    add(
        Target(
            "body/step-notice",
            pb.StepNotice.decode,
            lambda: [pb.StepNotice(step=3, policy_version=2).encode()],
        )
    )
    wn = ps.WeightsNotice(version=2, step=5, manifest=digest(b"m"))
    add(Target("body/weights-notice", ps.check_notice, lambda: [ps.encode_notice(wn)]))
    add(Target("proofs", _proofs, lambda: [b"\x01\x04" + bytes(40), b"\x07\x12" + bytes(90)]))
    add(
        Target(
            "diloco/chunk-bytes",
            _quant,
            lambda: [
                b"\x01\x00\x03" + pack_floats([1.0, -2.0, 0.5]),
                b"\x00\x00\x02" + bytes(1026),
                b"\x03\x10\x01" + _sparse_seed(),  # sparse-2, 4097 values
            ],
        )
    )
    disk = DiskTargets(workdir)
    add(
        Target(
            "disk/batch-store",
            disk.batch_file,
            lambda: [seal(SIGNER, e) for e in examples() if isinstance(e, RolloutBatch)],
            allowed=(_batch_store_error(),),
        )
    )
    add(
        Target(
            "disk/shardcast-journal",
            disk.journal,
            lambda: [struct.pack(">III", 0, 1, 2), struct.pack(">II", 2, 7) + b"\x00\x00"],
            allowed=(),
        )
    )
    add(
        Target(
            "disk/weight-store",
            disk.weight_dir,
            lambda: [seal(SIGNER, a_manifest([("x", b"1")]))],
            allowed=(),
        )
    )
    return out


def _batch_store_error() -> type[BaseException]:
    from node.rollouts.store import BatchStoreError

    return BatchStoreError
