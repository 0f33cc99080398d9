"""The run's files as SHARDCAST content (``node/shardcast/runfiles.py``) and the ban list
(``node/net/bans.py``), without a network: what the trainer publishes is what the terms
name, a file whose bytes differ is named in one line, a run-files manifest is never taken
for a weight version (nor back), the disk and memory lines, and bans that end."""

import time
from pathlib import Path

import pytest
import trio

from crypto.identity import Identity
from node.files import file_digest
from node.net.bans import PeerBans, load_bans, save_bans
from node.shardcast.runfiles import (
    RunFilesError,
    check_files,
    differences,
    memory_line,
    room_line,
    sources,
    weights_bytes,
)
from node.shardcast.store import WeightStore, publish_files
from node.shardcast.versions import VersionBook
from protocol.errors import WireError
from protocol.manifest import RUN_FILES_VERSION, FileRef
from protocol.wire import seal
from tests.helpers.manifests import run_terms

TRAINER = Identity.generate()


def a_run(tmp_path: Path):
    """A model directory and a task file, the terms naming them, and the trainer's signed
    run-files version of them in a store."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 8}')
    (model / "model.safetensors").write_bytes(bytes(range(256)) * 700)
    tasks = tmp_path / "sums.jsonl"
    tasks.write_text('{"prompt": "1+1", "answer": "2"}\n')
    refs = [
        FileRef(name=p.name, size=s, blake3=h)
        for p in sorted(model.iterdir())
        for s, h in [file_digest(p)]
    ]
    size, blake3 = file_digest(tasks)
    terms = run_terms(
        TRAINER.peer_id,
        model=refs,
        taskset="sums.jsonl",
        taskset_file=[FileRef(name="sums.jsonl", size=size, blake3=blake3)],
    )
    files = sources(terms, model, tasks)
    run_id = terms.run_id()
    store = WeightStore(tmp_path / "run-files", run_id, TRAINER.peer_id)
    src = publish_files(
        store,
        files,
        identity=TRAINER,
        version=RUN_FILES_VERSION,
        step=0,
        shard_size=65536,
        seq=1,
        ts_ms=1,
        where=str(model),
    )
    return terms, store, src


def test_the_run_files_are_the_terms_files_and_a_changed_byte_is_named(tmp_path):
    terms, _store, src = a_run(tmp_path)
    assert [f.name for f in src.manifest.files] == [
        "model/config.json",
        "model/model.safetensors",
        "taskset/sums.jsonl",
    ]
    assert differences(src.manifest, terms) == []
    with pytest.raises(RunFilesError, match="the run's task set is the file sums.jsonl"):
        sources(terms, tmp_path / "model", None)
    files = src.root / "files"
    assert check_files(files, terms) == []
    weights = files / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[1000] ^= 1
    weights.write_bytes(bytes(data))
    [line] = check_files(files, terms)
    assert line.startswith("model/model.safetensors has BLAKE3 ")
    assert line.endswith(
        f"({len(data)} bytes), the run manifest {terms.model[1].blake3.hex()[:16]}… ({len(data)} bytes)"
    )
    (files / "taskset" / "sums.jsonl").unlink()
    lines = check_files(files, terms)
    assert len(lines) == 2 and lines[0] == line
    assert lines[1] == "taskset/sums.jsonl: No such file or directory"


def test_a_run_files_manifest_that_names_other_files_is_told_apart(tmp_path):
    terms, _store, src = a_run(tmp_path)
    bigger = [FileRef(name=f.name, size=f.size + 1, blake3=f.blake3) for f in terms.model]
    other = run_terms(TRAINER.peer_id, model=bigger, taskset="arithmetic", taskset_file=[])
    assert differences(src.manifest, other) == [
        "model/config.json has 18 bytes, the run manifest 19",
        "model/model.safetensors has 179200 bytes, the run manifest 179201",
        "taskset/sums.jsonl is not one of the run manifest's files",
    ]


def test_a_run_files_manifest_is_never_a_weight_version_nor_back(tmp_path):
    terms, store, src = a_run(tmp_path)
    run_id = terms.run_id()
    weights = VersionBook(store, run_id=run_id, trainer=TRAINER.peer_id, async_level=1)
    with pytest.raises(WireError, match="is not a weight version"):
        weights.accept(src.envelope)  # replayed as a weight version: refused
    assert weights.newest_known == 0
    files_book = VersionBook(
        store, run_id=run_id, trainer=TRAINER.peer_id, async_level=0, run_files=True
    )
    files_book.accept(src.envelope, claimed=RUN_FILES_VERSION)
    weight = src.manifest
    fields = {k: getattr(weight, k) for k in weight.specs()}
    fields.update(version=3)
    envelope = seal(TRAINER, type(weight)(**fields))
    with pytest.raises(WireError, match="is not a run-files version"):
        files_book.accept(envelope)


def test_a_run_files_manifest_signed_by_another_key_is_refused(tmp_path):
    terms, store, src = a_run(tmp_path)
    other = Identity.generate()
    fields = {k: getattr(src.manifest, k) for k in src.manifest.specs()}
    fields.update(sender=other.peer_id)
    forged = seal(other, type(src.manifest)(**fields))
    book = VersionBook(
        store, run_id=terms.run_id(), trainer=TRAINER.peer_id, async_level=0, run_files=True
    )
    with pytest.raises(WireError, match="bad_signature"):
        book.accept(forged, claimed=RUN_FILES_VERSION)


def test_a_dropped_run_files_version_leaves_nothing(tmp_path):
    terms, store, _src = a_run(tmp_path)
    book = VersionBook(
        store, run_id=terms.run_id(), trainer=TRAINER.peer_id, async_level=0, run_files=True
    )
    trio.run(book.load)
    assert book.model_dir(RUN_FILES_VERSION) is not None
    trio.run(book.drop, RUN_FILES_VERSION)
    assert book.model_dir(RUN_FILES_VERSION) is None and book.manifest(RUN_FILES_VERSION) is None
    assert list(store.root.iterdir()) == []


def test_the_disk_and_memory_lines():
    assert room_line(100, 100, Path("/d")) is None
    line = room_line(3 * 2**20, 2**20, Path("/d"))
    assert line == (
        "the run's files need 3.0 MiB and /d has 1.0 MiB free: nothing pulled, no stake "
        "locked (free space or pass --data-dir on a larger disk)"
    )
    assert memory_line(10, None) is None and memory_line(10, 10) is None
    assert "no stake locked" in (memory_line(2**21, 2**20) or "")
    terms = run_terms(TRAINER.peer_id)
    assert weights_bytes(terms) == 1000  # model.safetensors, not config.json


def test_a_ban_holds_until_it_ends_and_survives_a_restart(tmp_path):
    bans = PeerBans()
    bans.ban("a", "served a bad shard 3 of version 7", now=100.0, seconds=60)
    bans.ban("a", "served a forged manifest", now=110.0, seconds=10)  # shorter: the first stays
    assert bans.banned("a", 150.0) == bans.banned("a", 159.0)
    assert bans.banned("a", 150.0).reason == "served a bad shard 3 of version 7"  # type: ignore[union-attr]
    assert bans.banned("a", 160.0) is None and bans.banned("b", 150.0) is None
    assert bans.view(150.0) == {
        "a": {"reason": "served a bad shard 3 of version 7", "left_s": 10.0}
    }
    save_bans(tmp_path, bans, 150.0)
    assert load_bans(tmp_path, 155.0).banned("a", 155.0) is not None
    assert load_bans(tmp_path, 161.0).active(161.0) == {}
    (tmp_path / "bans.json").write_text("[1, 2]")
    assert load_bans(tmp_path, 150.0).active(150.0) == {}  # not a ban list: ignored


async def test_a_peer_serving_a_forged_run_files_manifest_is_banned_and_holders_kept(tmp_path):
    from types import SimpleNamespace

    from node.config import NodeConfig
    from node.shardcast.pulling import Holders
    from node.shardcast.runfiles import RunFiles

    terms, _store, src = a_run(tmp_path)
    other = Identity.generate()
    fields = {k: getattr(src.manifest, k) for k in src.manifest.specs()}
    fields.update(sender=other.peer_id)
    served = {"liar": seal(other, type(src.manifest)(**fields)), "honest": src.envelope}
    asked, rejected = [], []

    async def request(peer, protocol, message, reply_type):
        asked.append((peer, message.version, message.with_manifest))
        return SimpleNamespace(version=RUN_FILES_VERSION, manifest=served[peer])

    node = SimpleNamespace(
        peer_id="me",
        header=lambda: {"run_id": terms.run_id(), "sender": "me", "seq": 1, "ts_ms": 1},
        request=request,
        reject=lambda protocol, peer, err: rejected.append((peer, err.reason.value)),
        connected_peers=lambda: {"liar", "honest", "me"},
        known_peers=lambda: ["honest"],
    )
    cfg = NodeConfig(data_dir=tmp_path / "node", run={"id": terms.run_id()})
    holders = Holders()
    files = RunFiles(node, cfg, holders, TRAINER.peer_id)  # type: ignore[arg-type]
    await files._find_manifest(lambda line: None)
    # the honest peer twice (the round that found the manifest, and one more), the liar
    # once: banned after the first
    honest, liar = ("honest", RUN_FILES_VERSION, True), ("liar", RUN_FILES_VERSION, True)
    assert sorted(asked) == [honest, honest, liar]
    assert holders.banned == {"liar"} and rejected == [("liar", "bad_signature")]
    ban = holders.bans.banned("liar", time.time())
    assert ban is not None
    reason = ban.reason
    assert reason.startswith("served a run-files manifest that fails its check: bad_signature")
    assert files.book.manifest(RUN_FILES_VERSION) == (src.manifest, src.envelope)
    assert holders.of(RUN_FILES_VERSION) == {"honest"}


async def test_the_trainer_keeps_files_still_the_terms_and_refuses_missing_ones(tmp_path):
    from types import SimpleNamespace

    from node.config import NodeConfig
    from node.shardcast.pulling import Holders
    from node.shardcast.runfiles import RunFiles

    (tmp_path / "run").mkdir()
    terms, _store, _src = a_run(tmp_path / "run")
    model, tasks = tmp_path / "run" / "model", tmp_path / "run" / "sums.jsonl"
    seq = iter(range(1, 100))
    node = SimpleNamespace(
        peer_id=TRAINER.peer_id,
        identity=TRAINER,
        header=lambda: {"seq": next(seq), "ts_ms": 1},
    )
    cfg = NodeConfig(data_dir=tmp_path / "node", run={"id": terms.run_id()})
    files = RunFiles(node, cfg, Holders(), TRAINER.peer_id)  # type: ignore[arg-type]
    root = await files.publish(terms, model, tasks)
    assert check_files(root, terms) == []
    envelope = files.book.manifest(RUN_FILES_VERSION)
    assert await files.publish(terms, model, tasks) == root  # still the terms': kept
    assert files.book.manifest(RUN_FILES_VERSION) == envelope
    (root / "model" / "config.json").write_text("{}")  # no longer the terms': published again
    assert await files.publish(terms, model, tasks) == root
    assert check_files(root, terms) == []
    assert files.book.manifest(RUN_FILES_VERSION) != envelope
    (model / "config.json").unlink()
    (root / "model" / "config.json").write_text("{}")
    with pytest.raises(RunFilesError, match=r"cannot serve the run's files: .*config\.json"):
        await files.publish(terms, model, tasks)
    assert files.files_dir is None  # nothing kept that is not the terms'


async def test_a_joiner_says_in_the_dht_that_it_pulls_and_asks_who_else_does(tmp_path):
    """Joiners starting together find each other before any pulls: each provides the run
    files' key and asks the providers it finds, beside the peers it is connected to."""
    from types import SimpleNamespace

    from node.config import NodeConfig
    from node.shardcast.pulling import Holders
    from node.shardcast.runfiles import RunFiles
    from protocol import ids

    terms, _store, src = a_run(tmp_path)
    asked, provided = [], []

    async def request(peer, protocol, message, reply_type):
        asked.append(peer)
        return SimpleNamespace(version=RUN_FILES_VERSION, manifest=src.envelope)

    async def provide(key):
        provided.append(key)

    async def find_providers(key):
        assert key == ids.weights_key(terms.run_id(), RUN_FILES_VERSION)
        return {"co-joiner"}

    node = SimpleNamespace(
        peer_id="me",
        header=lambda: {"run_id": terms.run_id(), "sender": "me", "seq": 1, "ts_ms": 1},
        request=request,
        provide=provide,
        find_providers=find_providers,
        connected_peers=lambda: {TRAINER.peer_id},
        known_peers=lambda: [],
    )
    cfg = NodeConfig(data_dir=tmp_path / "node", run={"id": terms.run_id()})
    holders = Holders()
    files = RunFiles(node, cfg, holders, TRAINER.peer_id)  # type: ignore[arg-type]
    with trio.fail_after(30):
        await files._find_manifest(lambda line: None)
    assert provided == [ids.weights_key(terms.run_id(), RUN_FILES_VERSION)]
    assert "co-joiner" in asked
    assert holders.of(RUN_FILES_VERSION) == {TRAINER.peer_id, "co-joiner"}
