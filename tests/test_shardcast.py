"""SHARDCAST without the network: manifests and their limits, the store (resume, atomic
completion, retention), the download plan, the download loop and the upload cap under
trio's MockClock, progress output."""

import os
import random
import time

import blake3
import msgpack
import pytest
import trio

from crypto.hashing import digest
from crypto.identity import Identity
from node.cli.weights import pull_info
from node.config import NodeConfig
from node.shardcast.pulling import REFRESH, REFRESH_IDLE
from node.shardcast.schedule import DownloadPlan
from node.shardcast.store import DiskFault, StoreError, WeightStore, publish, version_dir_name
from node.shardcast.transfer import BadShard, ByteBucket, LocalFault, Wakeup, run_download
from protocol.errors import Reason, WireError
from protocol.shardcast import (
    MANIFEST_MAX,
    WeightFile,
    WeightManifest,
    WeightsHolding,
    WeightsNotice,
    bitmap,
    check_notice,
    encode_notice,
    open_manifest,
    unbitmap,
)
from protocol.wire import max_envelope_size, seal
from tests.helpers.disk import file_size_limit

TRAINER = Identity.generate()
KiB = 1024


def checkpoint(tmp_path, sizes=None):
    """A checkpoint directory with several files of odd sizes (one nested, one empty)."""
    src = tmp_path / "ckpt"
    sizes = sizes or {
        "model-00001.safetensors": 300 * KiB + 7,
        "model-00002.safetensors": 129 * KiB + 1,
        "config.json": 311,
        "tokenizer/tokenizer.json": 70 * KiB + 3,
        "empty.txt": 0,
    }
    for name, size in sizes.items():
        path = src / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    return src


def make_store(tmp_path, name="store", trainer=TRAINER):
    return WeightStore(tmp_path / name, "run-1", trainer.peer_id)


def published(tmp_path, version=1, shard=64 * KiB, src=None):
    store = make_store(tmp_path, "origin")
    src = src or checkpoint(tmp_path)
    source = publish(
        store,
        src,
        identity=TRAINER,
        version=version,
        step=version * 10,
        shard_size=shard,
        seq=version,
        ts_ms=1,
    )
    return store, source, src


def manifest(**over):
    files = [WeightFile(name="a.bin", size=100_000, offset=0)]
    fields = dict(
        run_id="run-1",
        sender=TRAINER.peer_id,
        seq=1,
        ts_ms=1,
        version=3,
        step=30,
        shard_size=64 * KiB,
        total_size=100_000,
        digest=bytes(32),
        files=files,
        shard_hashes=bytes(64),
    )
    fields.update(over)
    return WeightManifest(**fields)


def rejected(data, reason, trainer=TRAINER.peer_id, run_id="run-1"):
    with pytest.raises(WireError) as exc:
        open_manifest(data, run_id=run_id, trainer=trainer)
    assert exc.value.reason == reason, exc.value
    return exc.value


# ---- manifests ------------------------------------------------------------------------


def test_manifest_layout_and_signature_roundtrip(tmp_path):
    _store, source, _src = published(tmp_path)
    m = source.manifest
    assert [f.name for f in m.files] == sorted(f.name for f in m.files)
    assert m.total_size == 300 * KiB + 7 + 129 * KiB + 1 + 311 + 70 * KiB + 3
    assert m.num_shards == -(-m.total_size // m.shard_size)
    assert m.shard_length(m.num_shards - 1) == m.total_size - (m.num_shards - 1) * m.shard_size
    # a shard that straddles files is split at their boundaries
    for i in range(m.num_shards):
        start, end = m.shard_range(i)
        assert sum(n for _, _, n in m.spans(start, end)) == end - start
    assert open_manifest(source.envelope, run_id="run-1", trainer=TRAINER.peer_id) == m


def test_forged_manifest_is_refused_as_bad_signature(tmp_path):
    mallory = Identity.generate()
    forged = seal(mallory, manifest(sender=mallory.peer_id))
    err = rejected(forged, Reason.BAD_SIGNATURE)
    assert mallory.peer_id in str(err)
    # the trainer's manifest with its signature replaced by another key's
    env = msgpack.unpackb(seal(TRAINER, manifest()))
    env["s"] = mallory.sign(b"x")
    rejected(msgpack.packb(env), Reason.BAD_SIGNATURE)
    # no trust root configured: nothing is accepted
    rejected(seal(TRAINER, manifest()), Reason.BAD_SIGNATURE, trainer=None)
    rejected(seal(TRAINER, manifest(run_id="other")), Reason.WRONG_RUN)


def test_oversized_manifest_is_refused_before_decoding():
    big = seal(TRAINER, manifest()) + b"\x00" * (max_envelope_size(WeightManifest) + 1)
    rejected(big, Reason.OVERSIZED)
    with pytest.raises(WireError) as exc:  # the encoder refuses to build one either
        manifest(
            shard_hashes=bytes(32 * 65_537), total_size=65_537 * 64 * KiB, shard_size=64 * KiB
        ).encode()
    assert exc.value.reason == Reason.MALFORMED
    assert WeightsHolding.MAX_SIZE > MANIFEST_MAX  # a holding reply can carry the largest one


@pytest.mark.parametrize(
    ("over", "why"),
    [
        ({"total_size": 100_001}, "add up"),  # files do not add up to total_size
        ({"shard_hashes": bytes(32)}, "shard hashes"),  # 100,000 bytes need 2 shards
        ({"shard_hashes": bytes(96)}, "shard hashes"),
        ({"shard_hashes": bytes(63)}, "shard hashes"),
        ({"files": []}, "no files"),
        (
            {
                "files": [
                    WeightFile(name="a", size=50_000, offset=0),
                    WeightFile(name="b", size=50_000, offset=40_000),  # overlaps a
                ]
            },
            "offset",
        ),
        (
            {
                "files": [
                    WeightFile(name="b", size=50_000, offset=0),
                    WeightFile(name="a", size=50_000, offset=50_000),  # not sorted
                ]
            },
            "sorted",
        ),
        (
            {
                "files": [
                    WeightFile(name="a", size=50_000, offset=0),
                    WeightFile(name="a/b", size=50_000, offset=50_000),  # a file and a dir
                ]
            },
            "under",
        ),
        ({"files": [WeightFile(name="../etc/passwd", size=100_000, offset=0)]}, "'..'"),
        ({"shard_size": 1024}, "shard_size"),
    ],
)
def test_manifest_that_does_not_add_up_is_malformed(over, why):
    fields = manifest().to_obj()
    fields.update({k: [f.to_obj() for f in v] if k == "files" else v for k, v in over.items()})
    payload = msgpack.packb({"type": WeightManifest.TYPE, **fields}, use_bin_type=True)
    from crypto.envelope import Envelope

    env = Envelope.seal(TRAINER, WeightManifest.TYPE, payload)
    data = msgpack.packb(
        {"d": WeightManifest.TYPE, "p": payload, "k": env.signer, "s": env.signature}
    )
    err = rejected(data, Reason.MALFORMED)
    assert why in str(err), err


def test_notice_and_bitmap_codecs():
    n = WeightsNotice(version=7, step=70, manifest=digest(b"m"))
    assert check_notice(encode_notice(n)) == n
    for garbage in (b"", b"\xc1", msgpack.packb([1]), msgpack.packb({"version": 1})):
        with pytest.raises(WireError) as exc:
            check_notice(garbage)
        assert exc.value.reason == Reason.MALFORMED
    held = {0, 3, 8, 16}
    assert unbitmap(bitmap(held, 17), 17) == held
    assert bitmap([True, False, True], 3) == b"\x05"
    with pytest.raises(WireError):
        unbitmap(b"\x00", 17)


# ---- the store ------------------------------------------------------------------------


def read_all(root, m):
    return b"".join((root / "files" / f.name).read_bytes() for f in m.files)


def test_store_resumes_verified_shards_and_completes_bit_exact(tmp_path):
    origin, source, src = published(tmp_path)
    m, env = source.manifest, source.envelope
    # SPEC §14: shard hashes and the whole digest are BLAKE3-256 of the bytes
    whole = read_all(origin.root / "v00000001", m)
    assert m.digest == blake3.blake3(whole).digest()
    for i in range(m.num_shards):
        start, end = m.shard_range(i)
        assert m.shard_hash(i) == blake3.blake3(whole[start:end]).digest()
    store = make_store(tmp_path)
    partial = store.begin(m, env)
    assert partial.resumed == 0
    written = [0, 2, m.num_shards - 1]
    for i in written:
        data = source.read_shard(i)
        assert partial.verify(i, data)
        partial.write(i, data)
    assert not partial.verify(1, b"\x00" * m.shard_length(1))
    partial.close()  # the process dies here: no finish
    # damage one journaled shard on disk and tear the journal's last entry
    victim = m.spans(*m.shard_range(2))[0]
    path = store.root / (".partial-" + version_dir_name(1)) / "files" / m.files[victim[0]].name
    with open(path, "r+b") as f:
        f.seek(victim[1])
        f.write(b"\xff\xff")
    with open(store.root / ".partial-v00000001" / "done", "ab") as f:
        f.write(b"\x00\x00")
    assert store.load() == [1] and not store.complete  # a partial, not a version
    partial = store.begin(m, env)
    assert partial.held == {0, m.num_shards - 1} and partial.resumed == 2
    assert partial._hashed == 1  # shard 0 entered the whole hash as it was re-verified
    for i in range(m.num_shards):
        if i not in partial.held:
            partial.write(i, source.read_shard(i))
    with pytest.raises(StoreError):  # a second writer on the same partial is refused
        store.begin(m, env)
    done = store.finish(partial)
    assert not (store.root / ".partial-v00000001").exists()
    assert done.root == store.root / "v00000001"
    for f in m.files:
        assert (done.root / "files" / f.name).read_bytes() == (src / f.name).read_bytes()
    assert read_all(done.root, m) == read_all(origin.root / "v00000001", m)
    # a fresh store finds it complete, verified
    again = make_store(tmp_path)
    assert again.load() == [] and list(again.complete) == [1]


def test_store_refuses_to_finish_incomplete_or_wrong_whole_digest(tmp_path):
    _origin, source, _src = published(tmp_path)
    m = source.manifest
    store = make_store(tmp_path)
    partial = store.begin(m, source.envelope)
    partial.write(0, source.read_shard(0))
    with pytest.raises(StoreError, match="shards"):
        store.finish(partial)
    partial.close()
    # every shard hash right but the whole digest wrong (a bad trainer): never visible
    bad = WeightManifest(**{**{k: getattr(m, k) for k in m.specs()}, "digest": bytes(32)})
    env = seal(TRAINER, bad)
    p2 = make_store(tmp_path, "other").begin(bad, env)
    for i in range(m.num_shards):
        p2.write(i, source.read_shard(i))
    with pytest.raises(StoreError, match="whole"):
        make_store(tmp_path, "other").finish(p2)
    assert not (tmp_path / "other" / "v00000003").exists()


def test_a_disk_that_refuses_fails_the_download_keeps_its_shards_and_locks_nothing(tmp_path):
    """A full disk at the start or in the middle of a download is a ``DiskFault`` naming
    the version and the cause; nothing stays open or locked (the next attempt starts in
    the same process), and the shards verified before are resumed, not fetched again."""
    _origin, source, src = published(tmp_path)  # model-00001 is 300 KiB: shards 0-4
    m, env = source.manifest, source.envelope
    store = make_store(tmp_path)
    with file_size_limit(100 * KiB):  # its files cannot even be made at their size
        with pytest.raises(DiskFault, match=r"version 1: cannot start in .*: File too large"):
            store.begin(m, env)
    partial = store.begin(m, env)
    for i in (0, 1):
        partial.write(i, source.read_shard(i))
    with file_size_limit(100 * KiB):  # shard 3 lies at 192-256 KiB of model-00001
        with pytest.raises(DiskFault, match="version 1: cannot write shard 3: File too large"):
            partial.write(3, source.read_shard(3))
    assert partial.held == {0, 1}
    partial.close()
    with pytest.raises(WireError) as closed:  # an upload from it that was under way
        partial.read_shard(0)
    assert closed.value.reason == Reason.NOT_FOUND
    again = store.begin(m, env)
    assert again.held == {0, 1} and again.resumed == 2
    for i in range(2, m.num_shards):
        again.write(i, source.read_shard(i))
    done = store.finish(again)
    for f in m.files:
        assert (done.root / "files" / f.name).read_bytes() == (src / f.name).read_bytes()


def test_the_whole_digest_advances_as_shards_are_written_in_any_order(tmp_path):
    """Finishing has nothing left to hash once the shards are in: the whole-sequence hash
    advances as they are written, from the bytes just written when it is a shard's turn and
    from the files for shards that came ahead of their turn; written in any order, from
    several threads at once, it is the manifest's digest; a shard altered on disk while it
    waited for its turn is caught."""
    import random
    import threading

    _origin, source, _src = published(tmp_path)
    m = source.manifest
    assert m.num_shards >= 6

    in_order = make_store(tmp_path, "in-order").begin(m, source.envelope)
    for i in range(m.num_shards):
        in_order.write(i, source.read_shard(i))
        assert in_order._hashed == i + 1  # hashed as written, not at the end
    assert in_order.whole_digest() == m.digest
    in_order.close()

    backwards = make_store(tmp_path, "backwards").begin(m, source.envelope)
    for i in reversed(range(m.num_shards)):
        backwards.write(i, source.read_shard(i))
    assert backwards._hashed == m.num_shards  # shard 0 came last and pulled the rest in
    assert backwards.whole_digest() == m.digest
    backwards.close()

    store = make_store(tmp_path, "threads")
    order = list(range(m.num_shards))
    random.Random(7).shuffle(order)
    shuffled = store.begin(m, source.envelope)
    threads = [
        threading.Thread(target=shuffled.write, args=(i, source.read_shard(i))) for i in order
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.finish(shuffled).manifest.digest == m.digest

    # shard 1 written ahead of its turn, then altered on disk: read back when its turn
    # comes, it no longer hashes to the whole digest
    tampered = make_store(tmp_path, "tampered")
    partial = tampered.begin(m, source.envelope)
    partial.write(1, source.read_shard(1))
    i, off, _n = next(iter(m.spans(*m.shard_range(1))))
    with open(partial.root / "files" / m.files[i].name, "r+b") as f:
        f.seek(off)
        was = f.read(1)
        f.seek(off)
        f.write(b"X" if was != b"X" else b"Y")
    for i in [0, *range(2, m.num_shards)]:
        partial.write(i, source.read_shard(i))
    with pytest.raises(StoreError, match="whole"):
        tampered.finish(partial)


def resident_pages(path):
    """The indices of ``path``'s pages that are in the page cache (``mincore``)."""
    import ctypes
    import mmap

    size = path.stat().st_size
    page = mmap.PAGESIZE
    n = -(-size // page)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    libc.mmap.argtypes += [ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(path, os.O_RDONLY)
    try:  # mapped, never touched: mapping a file brings none of it in
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        vec = ctypes.create_string_buffer(n)
        try:
            assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return {i for i in range(n) if vec.raw[i] & 1}


@pytest.mark.parametrize("order", ["in order", "backwards"])
def test_a_download_writes_and_reads_back_its_new_bytes_past_the_page_cache(tmp_path, order):
    """Shard bytes go to disk with O_DIRECT (``node/shardcast/direct.py``): a VM whose
    free memory goes back to the host charges every new page-cache page (3-4 s of CPU per
    GB), which bound the pull. Only the pages a span covers in part (a file's unaligned
    end, a shard boundary inside a file that does not start on a block) go through the
    page cache; a
    shard read back for the whole-sequence hash (it came ahead of its turn) is read direct
    too. The bytes are exact either way."""
    _origin, source, src = published(tmp_path)
    m = source.manifest
    store = make_store(tmp_path)
    partial = store.begin(m, source.envelope)
    shards = range(m.num_shards) if order == "in order" else reversed(range(m.num_shards))
    for i in shards:
        partial.write(i, source.read_shard(i))
    assert partial._hashed == m.num_shards
    # the pages a span covers only in part: its first and last unless they start and end
    # on a block (a span within one page is all edges)
    edges: dict[int, set[int]] = {}
    for k in range(m.num_shards):
        for i, off, n in m.spans(*m.shard_range(k)):
            lo, hi = -(-off // 4096), (off + n) // 4096
            pages = range(off // 4096, -(-(off + n) // 4096))
            mine = edges.setdefault(i, set())
            mine.update(pages if hi <= lo else {p for p in pages if p < lo or p >= hi})
    total = 0
    for i, f in enumerate(m.files):
        if f.size:
            assert resident_pages(partial.root / "files" / f.name) == edges[i], f.name
            total += -(-f.size // 4096)
    assert sum(map(len, edges.values())) < total // 4  # 11 of 128 pages
    done = store.finish(partial)
    for f in m.files:
        assert (done.root / "files" / f.name).read_bytes() == (src / f.name).read_bytes()


def test_a_file_system_without_direct_io_gets_the_page_cache(tmp_path, monkeypatch):
    """Refused at open (``EINVAL``) or at a write, direct I/O gives way to the page cache
    for the rest of the download; the bytes and the whole digest are exact."""
    import errno

    real_open, real_pwrite = os.open, os.pwrite
    _origin, source, src = published(tmp_path)
    m = source.manifest

    def no_direct(path, flags, *a):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *a)

    monkeypatch.setattr(os, "open", no_direct)
    partial = make_store(tmp_path, "at-open").begin(m, source.envelope)
    monkeypatch.setattr(os, "open", real_open)
    assert partial._direct is None
    for i in reversed(range(m.num_shards)):
        partial.write(i, source.read_shard(i))
    big = max(m.files, key=lambda f: f.size)
    assert len(resident_pages(partial.root / "files" / big.name)) == -(-big.size // 4096)
    partial.close()

    store = make_store(tmp_path, "at-write")
    partial = store.begin(m, source.envelope)
    partial.write(0, source.read_shard(0))
    direct_fds = set(partial._direct._fds)
    refused = []

    def refuse(fd, data, offset):
        if fd in direct_fds:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", refuse)
    for i in reversed(range(1, m.num_shards)):
        partial.write(i, source.read_shard(i))
    assert len(refused) == 1 and not partial._direct.usable  # asked once, then not again
    done = store.finish(partial)
    for f in m.files:
        assert (done.root / "files" / f.name).read_bytes() == (src / f.name).read_bytes()


def test_retention_keeps_the_newest_k_versions(tmp_path):
    store = make_store(tmp_path, "origin")
    src = checkpoint(tmp_path, {"w.bin": 1000})
    for v in range(1, 6):
        publish(
            store, src, identity=TRAINER, version=v, step=v, shard_size=64 * KiB, seq=v, ts_ms=1
        )
    (store.root / ".partial-v00000002").mkdir()
    assert sorted(store.retain(3)) == [1, 2, 2]  # two complete versions and one partial
    assert sorted(store.complete) == [3, 4, 5]
    assert sorted(p.name for p in store.root.iterdir()) == ["v00000003", "v00000004", "v00000005"]
    # a version below the window goes even if fewer than keep are held
    assert store.retain(3, floor=5) == [3, 4] and sorted(store.complete) == [5]


async def test_versions_still_needed_are_kept_and_fetchable_below_the_window(tmp_path):
    """A validator's versions of work it has not judged yet (``needed``) outlive the
    retention window: the store keeps them, the book still accepts their manifests and a
    pull of one is not refused as too old (the matrix stalled when a late batch's version
    was gone: left unjudged, its worker waited for the verdict forever)."""
    from node.shardcast.versions import VersionBook

    store = make_store(tmp_path, "origin")
    src = checkpoint(tmp_path, {"w.bin": 1000})
    sources = {
        v: publish(
            store, src, identity=TRAINER, version=v, step=v, shard_size=64 * KiB, seq=v, ts_ms=1
        )
        for v in range(1, 8)
    }
    assert sorted(store.retain(4, floor=4, needed={2})) == [1, 3]
    assert sorted(store.complete) == [2, 4, 5, 6, 7]

    book = VersionBook(
        make_store(tmp_path, "follower"), run_id="run-1", trainer=TRAINER.peer_id, async_level=2
    )
    book.accept(sources[7].envelope)  # the newest: the window is 5..7
    with pytest.raises(WireError, match="below the retention window"):
        book.accept(sources[3].envelope)
    assert book.outside(3) and book.outside(2)
    book.needed = lambda: {3}
    assert not book.outside(3) and book.outside(2)
    manifest, new = book.accept(sources[3].envelope)
    assert manifest.version == 3 and new and book.knows(3)

    kept = VersionBook(store, run_id="run-1", trainer=TRAINER.peer_id, async_level=2)
    await kept.load()
    kept.needed = lambda: {4}
    await kept.retain(downloading=())
    assert sorted(store.complete) == [4, 5, 6, 7]  # keep = 4: 2 went, 4 stays as needed
    kept.needed = frozenset
    await kept.retain(downloading=())
    assert sorted(store.complete) == [5, 6, 7]  # the window's floor: 7 - 2


def test_retention_from_several_threads_at_once_drops_each_version_once(tmp_path, monkeypatch):
    """Downloads finish in worker threads and each retains: two retains at once both saw
    version 2 and both dropped it (KeyError: a worker of the matrix run died of it)."""
    import threading

    from node.shardcast.store import ShardSource

    store = make_store(tmp_path, "origin")
    src = checkpoint(tmp_path, {"w.bin": 1000})
    for v in range(1, 7):
        publish(
            store, src, identity=TRAINER, version=v, step=v, shard_size=64 * KiB, seq=v, ts_ms=1
        )
    close = ShardSource.close

    def slow_close(self):  # the other thread runs while this one closes a version
        time.sleep(0.05)
        close(self)

    monkeypatch.setattr(ShardSource, "close", slow_close)
    dropped, errors = [], []

    def retain():
        try:
            dropped.extend(store.retain(2))
        except Exception as exc:  # noqa: BLE001 - the test reports whatever a thread raised
            errors.append(exc)

    threads = [threading.Thread(target=retain) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors, errors
    assert sorted(dropped) == [1, 2, 3, 4] and sorted(store.complete) == [5, 6]


def test_a_retention_in_another_thread_leaves_a_download_starting_or_finishing_alone(
    tmp_path, monkeypatch
):
    """Versions 2 and 3 download at once, 3 completes first and its retention runs (in a
    worker thread) while 2 starts or finishes in another. A partial is safe from retention
    only while it holds its lock: one made but not locked yet, or unlocked before its
    rename, was deleted as abandoned (FileNotFoundError: a follower of the shardcast test
    died of it under two xdist workers)."""
    import threading

    from node.shardcast.store import Partial

    origin = make_store(tmp_path, "origin")
    src = checkpoint(tmp_path, {"w.bin": 1000})
    sources = {
        v: publish(
            origin, src, identity=TRAINER, version=v, step=v, shard_size=64 * KiB, seq=v, ts_ms=1
        )
        for v in (1, 2, 3)
    }
    store = make_store(tmp_path)
    for v in (1, 3):
        done = store.begin(sources[v].manifest, sources[v].envelope)
        for i in range(sources[v].manifest.num_shards):
            done.write(i, sources[v].read_shard(i))
        store.finish(done)
    m, env = sources[2].manifest, sources[2].envelope
    dropped, errors = [], []

    def retain_now():
        """Version 3's download ends and retains (window 2..3), at the worst moment."""

        def retain():
            try:
                dropped.extend(store.retain(3, floor=2))
            except Exception as exc:  # noqa: BLE001 - the test reports what the thread raised
                errors.append(exc)

        other = threading.Thread(target=retain)
        other.start()
        other.join(0.5)  # it runs now unless the store holds it off
        return other

    threads = []
    init, close = Partial.__init__, Partial.close

    def init_after_retain(self, *a, **kw):  # the directory made, its lock not taken yet
        threads.append(retain_now())
        init(self, *a, **kw)

    monkeypatch.setattr(Partial, "__init__", init_after_retain)
    partial = store.begin(m, env)
    monkeypatch.setattr(Partial, "__init__", init)
    threads[0].join(10)
    assert not errors, errors
    assert dropped == [1] and (store.root / ".partial-v00000002").is_dir()
    for i in range(m.num_shards):
        partial.write(i, sources[2].read_shard(i))

    def close_then_retain(self):  # the partial's lock just released, not renamed yet
        close(self)
        if self is partial:
            threads.append(retain_now())

    monkeypatch.setattr(Partial, "close", close_then_retain)
    finished = store.finish(partial)
    threads[1].join(10)
    assert not errors, errors
    assert finished.root == store.root / "v00000002" and sorted(store.complete) == [2, 3]
    assert read_all(finished.root, m) == read_all(origin.root / "v00000002", m)


def test_a_version_closed_in_another_thread_never_uploads_another_files_bytes(
    tmp_path, monkeypatch
):
    """An upload reads a version on the trio thread while a retention (or a finishing
    download) closes it in a worker thread. Closed between the read's check and its
    ``pread``, the descriptor was free for the next file opened, and the upload sent that
    file's bytes as the shard: the peer bans an honest node for them."""
    import threading

    from node.shardcast import store as store_mod

    store, source, _ = published(tmp_path)
    want = source.read_shard(0)
    in_read, go_on = threading.Event(), threading.Event()
    pread = os.pread

    def paused_pread(fd, n, off):  # the upload is inside its read when the close comes
        in_read.set()
        assert go_on.wait(10)
        return pread(fd, n, off)

    monkeypatch.setattr(store_mod.os, "pread", paused_pread)
    got, errors = [], []

    def upload():
        try:
            got.append(source.read_shard(0))
        except Exception as exc:  # noqa: BLE001 - the test reports what the thread raised
            errors.append(exc)

    reader = threading.Thread(target=upload)
    reader.start()
    assert in_read.wait(10)
    closer = threading.Thread(target=lambda: store.retain(0))
    closer.start()
    closer.join(0.5)  # it closes now unless the read holds it off
    other = tmp_path / "other.bin"
    other.write_bytes(b"x" * len(want))
    fds = [os.open(other, os.O_RDONLY) for _ in source.manifest.files]  # takes freed numbers
    go_on.set()
    reader.join(10)
    closer.join(10)
    for fd in fds:
        os.close(fd)
    assert not errors, errors
    assert got == [want]
    with pytest.raises(WireError) as exc:  # once closed, a read is refused, not misread
        source.read_shard(0)
    assert exc.value.reason == Reason.NOT_FOUND
    assert store.complete == {}


def test_publish_refuses_bad_checkpoints(tmp_path):
    store = make_store(tmp_path, "origin")
    kw = dict(identity=TRAINER, step=1, shard_size=64 * KiB, seq=1, ts_ms=1)
    with pytest.raises(StoreError, match="not a directory"):
        publish(store, tmp_path / "missing", version=1, **kw)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "has space.bin").write_bytes(b"x")
    with pytest.raises(StoreError, match="names"):
        publish(store, bad, version=1, **kw)
    src = checkpoint(tmp_path, {"w.bin": 10})
    publish(store, src, version=1, **kw)
    with pytest.raises(StoreError, match="exists"):
        publish(store, src, version=1, **kw)


# ---- the download plan ----------------------------------------------------------------


def plan(n=8, **kw):
    return DownloadPlan(n, rng=random.Random(1), **kw)


def drain(p, now=0.0):
    """Every fetch the plan starts at ``now``, each completed at once: shard -> peer."""
    taken = {}
    while got := p.assign(now):
        for shard, peer in got:
            p.completed(shard, peer, 10, 1.0)
            taken[shard] = peer
    return taken


def got_origin(got):
    """The one shard of ``got`` (shard -> peer) fetched from the origin."""
    (shard,) = [s for s, peer in got.items() if peer == "trainer"]
    return shard


def test_a_downloader_takes_one_shard_at_a_time_from_the_origin_beside_other_downloaders():
    """The origin's uplink is the swarm's scarcest: with another downloader known (a
    peer that answered holdings and still lacks a shard), a second fetch from the origin
    would take a second share of it, or wait in its queue holding a download slot."""
    p = plan(8, origin="trainer", max_inflight=4, per_peer=2, explore=0.0)
    p.update_peer("trainer", set(range(8)))
    assert len(p.assign(0)) == 2  # alone with the origin: two, the gap between shards hidden
    q = plan(8, origin="trainer", max_inflight=4, per_peer=2, explore=0.0)
    q.update_peer("trainer", set(range(8)))
    q.update_peer("other", {5})  # another downloader, one shard held so far
    got = dict(q.assign(0))
    assert got == {5: "other", got_origin(got): "trainer"} and len(got) == 2
    assert q.assign(0) == []  # the origin is at one, "other" has nothing more
    q.update_peer("other", {5, 6})
    assert q.assign(0) == [(6, "other")]  # peers still take the second slot
    first = got_origin(got)
    q.completed(first, "trainer", 10, 1.0)
    ((nxt, peer),) = q.assign(0)
    assert peer == "trainer" and nxt not in (first, 5, 6)  # the next one, in turn
    # a peer holding the whole version competes for nothing: two from the origin again
    r = plan(8, origin="trainer", max_inflight=4, per_peer=2, explore=0.0)
    r.update_peer("trainer", set(range(8)))
    r.update_peer("seeder", set(range(8)))
    r.update_peer("gone", set())
    r.remove_peer("gone")  # its holdings query failed: no longer a downloader we know
    r.peers["seeder"].backoff_until = 5.0  # busy for now
    assert [peer for _, peer in r.assign(0)] == ["trainer", "trainer"]


def test_plan_prefers_rarest_shards_and_spreads_over_peers():
    p = plan(4, max_inflight=2, per_peer=2)
    p.update_peer("a", {0, 1, 2, 3})
    p.update_peer("b", {0, 1, 2})
    p.update_peer("c", {0, 1})
    first = p.assign(0)
    assert first[0] == (3, "a")  # held by one peer only
    assert first[1][0] == 2  # then the shard two peers hold
    assert len(p.assign(0)) == 0  # max_inflight
    p.completed(3, "a", 1000, 1.0)
    (nxt,) = p.assign(0)
    assert nxt[0] in (0, 1)


def test_plan_asks_the_origin_only_for_what_nobody_else_holds():
    p = plan(4, origin="trainer", max_inflight=4, per_peer=2)
    p.update_peer("trainer", {0, 1, 2, 3})
    p.update_peer("relay", {0, 1, 2})
    got = dict(p.assign(0))
    # shard 3 only the origin has; 0-2 the relay has too, so the origin is not asked for
    # them even though it has a free slot and the relay is at its limit
    assert got[3] == "trainer"
    assert len(got) == 3 and sorted(v for k, v in got.items() if k != 3) == ["relay"] * 2
    for shard, peer in got.items():
        p.completed(shard, peer, 10, 1.0)
    (last,) = p.assign(0)
    assert last[1] == "relay"
    # without any other holder, the origin serves
    q = plan(2, origin="trainer", max_inflight=2, per_peer=2)
    q.update_peer("trainer", {0, 1})
    assert sorted(q.assign(0)) == [(0, "trainer"), (1, "trainer")]


def test_plan_asks_a_holder_behind_a_relay_only_for_what_no_direct_holder_has():
    p = plan(4, max_inflight=4, per_peer=4, explore=0.0)
    p.update_peer("home", {0, 1, 2, 3})
    p.update_peer("near", {0, 1})
    p.peers["home"].relayed = True  # only a circuit relay joins us to it
    p.peers["home"].rate, p.peers["near"].rate = 1e9, 1.0  # faster, and still not asked
    got = dict(p.assign(0))
    assert got == {0: "near", 1: "near", 2: "home", 3: "home"}
    # whichever holder is the relayed one: the direct one serves, the faster relayed one not
    q = plan(2, max_inflight=2, per_peer=2, explore=0.0)
    q.update_peer("home", {0, 1})
    q.update_peer("near", {0, 1})
    q.peers["near"].relayed = True
    q.peers["near"].rate, q.peers["home"].rate = 1e9, 1.0
    assert dict(q.assign(0)) == {0: "home", 1: "home"}


def test_the_origin_reached_directly_serves_before_a_holder_behind_a_relay():
    """'Origin last' yields to 'direct first': bulk bytes never ride a relay while a direct
    path holds the shard, even when that direct holder is busy for a moment."""
    p = plan(2, origin="trainer", max_inflight=2, per_peer=2, explore=0.0)
    p.update_peer("trainer", {0, 1})
    p.update_peer("home", {0, 1})
    p.peers["home"].relayed = True
    assert dict(p.assign(0)) == {0: "trainer", 1: "trainer"}
    p.busy(0, "trainer", now=0.0)  # every upload slot taken: asked again shortly
    p.busy(1, "trainer", now=0.0)
    assert p.assign(0.1) == []  # waited out, not fetched through the relay
    assert dict(p.assign(1.0)) == {0: "trainer", 1: "trainer"}
    # with no direct holder at all, the relayed one serves
    q = plan(2, origin="trainer", max_inflight=2, per_peer=2, explore=0.0)
    q.update_peer("home", {0, 1})
    q.peers["home"].relayed = True
    assert dict(q.assign(0)) == {0: "home", 1: "home"}


def test_a_peer_busy_time_after_time_is_asked_less_often_until_it_serves():
    """Each ``busy`` in a row doubles the wait before the peer is asked again, up to
    ``max_backoff``; a shard it serves brings the wait back to a quarter second (a holder
    busy with large shards otherwise held a download slot at every quarter-second ask)."""
    p = plan(2, max_inflight=1, per_peer=1, explore=0.0)
    p.update_peer("home", {0, 1})
    now, waits = 0.0, []
    for _ in range(10):
        ((shard, peer),) = p.assign(now)
        p.busy(shard, peer, now)
        nxt = p.next_wakeup(now)
        assert nxt is not None and p.assign(now) == []
        waits.append(nxt - now)
        now = nxt
    assert waits == [0.25, 0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    ((shard, peer),) = p.assign(now)
    p.completed(shard, peer, 100, 1.0)
    ((shard, peer),) = p.assign(now)
    p.busy(shard, peer, now)
    assert p.next_wakeup(now) == now + 0.25


def test_a_downloader_behind_a_relay_is_left_out_of_the_origin_shares():
    """Two downloaders joined directly split the origin's shards; the third, joined to them
    only through a relay, is no share-holder for them (they would never fetch its share from
    it) and, seeing both through the relay, takes its whole copy from the origin."""
    ids = ["peer-a", "peer-b", "peer-c"]
    taken = {}
    for me in ids:
        p = plan(6, origin="trainer", me=me, max_inflight=6, per_peer=6)
        p.update_peer("trainer", set(range(6)))
        for other in ids:
            if other != me:
                p.update_peer(other, set())
                p.peers[other].relayed = "peer-c" in (me, other)
        taken[me] = drain(p)
    assert set(taken["peer-a"]) == {0, 2, 4} and set(taken["peer-b"]) == {1, 3, 5}
    assert set(taken["peer-c"]) == set(range(6))
    assert {v for t in taken.values() for v in t.values()} == {"trainer"}


def test_downloaders_split_the_origins_shards_and_take_the_rest_from_each_other():
    ids = ["peer-a", "peer-b", "peer-c"]
    plans = {}
    for me in ids:
        p = plan(12, origin="trainer", me=me, max_inflight=4, per_peer=4)
        p.update_peer("trainer", set(range(12)))
        for other in ids:
            if other != me:
                p.update_peer(other, set())  # joined: downloading, nothing held yet
        plans[me] = p
    taken = {me: drain(p) for me, p in plans.items()}
    for rank, me in enumerate(ids):  # sorted ids: rank r takes shards s = r (mod 3)
        assert set(taken[me]) == {s for s in range(12) if s % 3 == rank}
        assert set(taken[me].values()) == {"trainer"}
    # peer-a has its share; peer-b's shards come from peer-b, not from the origin again
    a = plans["peer-a"]
    a.update_peer("peer-b", {1, 4})
    got = dict(a.assign(0))
    assert got == {1: "peer-b", 4: "peer-b"}
    # what nobody else holds yet stays with its owner while we have work in flight...
    assert a.assign(0) == []
    for shard in got:
        a.completed(shard, "peer-b", 10, 1.0)
    # ...and idle, for ``share_patience`` seconds: a refresh shows what the others fetched
    assert a.assign(1.0) == [] and a.next_wakeup(1.0) == a.share_patience == 2 * REFRESH_IDLE
    a.update_peer("peer-c", {2})
    assert a.assign(1.5) == [(2, "peer-c")]  # traded: the wait starts again
    a.completed(2, "peer-c", 10, 1.0)
    again = 1.5 + a.share_patience
    assert a.assign(again - 0.5) == [] and a.next_wakeup(again - 0.5) == again
    # ...then we take another's share from the origin rather than wait longer
    (late,) = a.assign(again)
    assert late[1] == "trainer" and late[0] % 3 != 0
    # without our own id (or alone) every shard is ours to take
    solo = plan(4, origin="trainer", max_inflight=4, per_peer=4)
    solo.update_peer("trainer", set(range(4)))
    solo.update_peer("peer-b", set())
    assert len(drain(solo)) == 4


def test_plan_tries_untried_peers_then_picks_by_measured_rate():
    p = plan(100, max_inflight=1, per_peer=1, explore=0.0)
    for peer in ("slow", "fast", "new"):
        p.update_peer(peer, set(range(100)))
    p.peers["slow"].rate, p.peers["fast"].rate = 1e6, 50e6
    assert p.assign(0)[0][1] == "new"  # never measured: tried first
    shard = next(iter(p.inflight))
    p.completed(shard, "new", 10_000_000, 1.0)  # 10 MB/s
    picks = []
    for _ in range(5):
        ((s, peer),) = p.assign(0)
        picks.append(peer)
        p.completed(s, peer, 50_000_000, 1.0)
    assert picks == ["fast"] * 5
    # EWMA: one slow transfer lowers the rate by alpha of the difference
    p.completed(p.assign(0)[0][0], "fast", 10_000_000, 1.0)
    assert p.peers["fast"].rate == pytest.approx(0.7 * 50e6 + 0.3 * 10e6)
    # untried peers are spread over, least loaded first
    u = plan(10, max_inflight=2, per_peer=2)
    u.update_peer("x", set(range(10)))
    u.update_peer("y", set(range(10)))
    assert sorted(peer for _, peer in u.assign(0)) == ["x", "y"]
    # with exploration on, every holder is tried now and then
    q = plan(1000, max_inflight=1, per_peer=1, explore=0.5)
    for peer in ("a", "b", "c"):
        q.update_peer(peer, set(range(1000)))
        q.peers[peer].rate = 1.0
    q.peers["a"].rate = 100.0
    seen = set()
    for _ in range(60):
        ((s, peer),) = q.assign(0)
        seen.add(peer)
        q.completed(s, peer, 100, 1.0)
    assert seen == {"a", "b", "c"}


def test_plan_backs_off_failed_peers_and_bans_corrupt_ones():
    p = plan(2, max_inflight=2, per_peer=2, backoff=1.0, max_backoff=4.0)
    p.update_peer("x", {0, 1})
    p.update_peer("y", {0})
    got = dict(p.assign(0.0))
    assert got == {0: "y", 1: "x"} or got == {0: "x", 1: "x"}
    for shard, peer in got.items():
        p.failed(shard, peer, 10.0)
    assert p.inflight == {}
    # backed off: nothing to do until the earliest backoff ends
    p.update_peer("y", {0})
    assert p.next_wakeup(10.0) == 11.0
    assert p.assign(10.5) == []
    again = p.assign(11.0)
    assert again
    shard, peer = again[0]
    p.failed(shard, peer, 11.0)
    assert p.peers[peer].backoff_until == 13.0  # doubled
    p.corrupt(*(p.assign(13.0)[0]))
    assert p.banned and p.peers[p.banned[0]].have == set()
    p.update_peer(p.banned[0], {0, 1})  # a banned peer's holdings are never used again
    assert all(peer not in p.banned for _, peer in p.assign(100.0))


def test_a_peers_score_is_its_rate_times_its_success_shared_over_its_fetches_in_flight():
    p = plan(4, max_inflight=1, per_peer=1, explore=0.0, alpha=0.3, backoff=1.0)
    p.update_peer("x", {0, 1, 2, 3})
    x = p.peers["x"]
    assert x.score() == 0.0  # never measured: no rate to go by
    ((s, _),) = p.assign(0.0)
    p.completed(s, "x", 3_000_000, 2.0)
    assert x.rate == 1_500_000  # bytes per second
    ((s, _),) = p.assign(0.0)
    assert x.score() == 1_500_000 / 2  # one fetch in flight
    p.failed(s, "x", 0.0)
    ((s, _),) = p.assign(5.0)
    p.failed(s, "x", 5.0)
    assert x.success == pytest.approx(0.7 * 0.7)  # each failure takes alpha of it
    assert x.score() == pytest.approx(1_500_000 * 0.49)


# ---- the download loop and the upload cap, on a mock clock -----------------------------


async def test_download_loop_reassigns_stalled_dead_and_corrupt_peers(autojump_clock):
    p = DownloadPlan(6, max_inflight=3, per_peer=1, rng=random.Random(3))
    for peer in ("staller", "dead", "evil", "honest"):
        p.update_peer(peer, set(range(6)))
    p.peers["honest"].rate = 1.0  # measured, so the untried bad peers are tried first
    events = []

    async def fetch(shard, peer):
        if peer == "staller":
            await trio.sleep_forever()
        if peer == "dead":
            await trio.sleep(0.5)
            raise ConnectionResetError("peer died")
        if peer == "evil":
            raise BadShard("bad bytes")
        await trio.sleep(1.0)
        return 100

    def report(outcome, shard, peer, err):
        events.append((trio.current_time(), outcome, peer))

    await run_download(p, fetch, shard_deadline=lambda s: 7.0, wakeup=Wakeup(), report=report)
    assert p.complete and p.banned == ["evil"]
    bad = [(t, o, peer) for t, o, peer in events if o != "completed"]
    # evil: banned at once and never asked again; dead: retried after its backoff (1 s,
    # then 2 s) and failing each time; staller: its shard taken back at exactly the deadline.
    # At 4 s dead's backoff ends as honest completes a shard: a peer whose fetches only
    # failed is no longer taken before a measured one, so which of the two trio wakes first
    # decides whether dead is asked a third time
    assert bad[:3] == [(0.0, "corrupt", "evil"), (0.5, "failed", "dead"), (2.0, "failed", "dead")]
    assert bad[3:] in (
        [(4.5, "failed", "dead"), (7.0, "stalled", "staller")],
        [(7.0, "stalled", "staller")],
    )
    assert [peer for _, o, peer in events if o == "completed"] == ["honest"] * 6
    # the stalled shard was the last one: fetched from the honest peer from 7 s to 8 s
    assert trio.current_time() == pytest.approx(8.0)


async def test_busy_peer_is_asked_again_soon_and_a_stale_holding_is_dropped(autojump_clock):
    from node.shardcast.transfer import PeerBusy, PeerLacks

    p = DownloadPlan(2, max_inflight=1, per_peer=1, rng=random.Random(0))
    p.update_peer("only", {0, 1})
    p.update_peer("stale", {1})
    p.peers["only"].rate = 1.0  # measured: the untried "stale" peer is asked first
    refusals = 0
    asked = []

    async def fetch(shard, peer):
        nonlocal refusals
        asked.append((trio.current_time(), shard, peer))
        if peer == "stale":
            raise PeerLacks("not held")
        if refusals < 3:
            refusals += 1
            raise PeerBusy("busy")
        return 1

    with trio.fail_after(10):  # a refusal handled wrongly would spin or wait forever
        await run_download(p, fetch, shard_deadline=lambda s: 5.0, wakeup=Wakeup())
    assert p.complete and p.peers["stale"].have == set()
    # three refusals in a row cost a quarter, a half and a whole second, never a failure
    assert [t for t, _, peer in asked if peer == "only"] == pytest.approx(
        [0, 0.25, 0.75, 1.75, 1.75]
    )
    assert p.peers["only"].failures == 0 and p.peers["only"].success == 1.0


async def test_a_local_fault_stops_the_download_and_blames_no_peer(autojump_clock):
    """This node's disk failing a shard ends the whole download with that error at once
    (the other fetches in flight are cancelled); no peer is backed off or banned."""
    p = DownloadPlan(8, max_inflight=4, per_peer=4, rng=random.Random(0))
    p.update_peer("honest", set(range(8)))
    events, started, cancelled = [], [], []

    async def fetch(shard, peer):
        started.append(shard)
        if len(started) == 3:  # the third of the four fetched at once
            await trio.sleep(0.5)
            raise LocalFault(f"version 1: cannot write shard {shard}: No space left on device")
        try:
            await trio.sleep(1.0 + len(started))
        except trio.Cancelled:
            cancelled.append(shard)
            raise
        return 1

    def report(outcome, shard, peer, err):
        events.append(outcome)

    with pytest.raises(LocalFault, match="No space left"):
        await run_download(p, fetch, shard_deadline=lambda s: 30.0, wakeup=Wakeup(), report=report)
    assert trio.current_time() == pytest.approx(0.5)  # not after the others' 1-4 s
    assert len(started) == 4 and sorted(cancelled) == sorted(started[:2] + started[3:])
    assert events == []
    honest = p.peers["honest"]
    assert not p.banned and honest.failures == 0 and honest.backoff_until == 0.0


async def test_download_waits_for_a_holder_then_finishes(autojump_clock):
    p = DownloadPlan(2, rng=random.Random(0))
    wake = Wakeup()

    async def fetch(shard, peer):
        return 1

    async def later():
        await trio.sleep(3.0)
        p.update_peer("late", {0, 1})
        wake.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(later)
        await run_download(p, fetch, shard_deadline=lambda s: 5.0, wakeup=wake)
    assert p.complete and trio.current_time() == pytest.approx(3.0)


async def test_upload_rate_cap_is_exact_on_a_mock_clock(autojump_clock):
    bucket = ByteBucket(rate=1_000_000, burst=100_000)
    start = trio.current_time()
    for _ in range(50):  # 5 MB in 100 kB frames
        await bucket.spend(100_000)
    # the burst goes at once, the rest at 1 MB/s; the last frame leaves in debt
    assert trio.current_time() - start == pytest.approx((5_000_000 - 200_000) / 1_000_000)
    with pytest.raises(ValueError, match="must be > 0"):
        ByteBucket(rate=0, burst=1)


def test_pull_progress_names_rate_peers_bans_and_resumed_shards():
    job = {
        "version": 4,
        "state": "downloading",
        "total_bytes": 200 * 1024 * 1024,
        "done_bytes": 50 * 1024 * 1024,
        "rate_Bps": 93_500_000,
        "peers": {"a": {"bytes": 5}, "b": {"bytes": 0}, "c": {"bytes": 7}},
        "banned": ["z"],
        "resumed_shards": 3,
    }
    assert pull_info(job) == "93.5 MB/s, 2 peers, 1 banned, 3 shards resumed"
    quiet = {**job, "banned": [], "resumed_shards": 0}
    assert pull_info(quiet) == "93.5 MB/s, 2 peers"


def test_weights_cli_help_and_offline_ls_import_no_network_stack(tmp_path):
    """``weights --help`` is instant and ``weights ls`` reads a stopped node's data dir
    without importing py-libp2p, trio or torch."""
    import subprocess
    import sys

    store = WeightStore(tmp_path / "weights", "run-1", TRAINER.peer_id)
    src = checkpoint(tmp_path, {"w.bin": 5000})
    publish(store, src, identity=TRAINER, version=4, step=40, shard_size=64 * KiB, seq=1, ts_ms=1)
    code = (
        "import sys; from node.cli import main; main(['weights', 'ls', '--data-dir', sys.argv[1]]);"
        " print(sorted({m.split('.')[0] for m in sys.modules} & {'libp2p', 'trio', 'torch'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "(node not running: listing the data dir)"
    assert lines[1].split() == ["version", "step", "MiB", "shards", "held", "path"]
    assert lines[3].split()[:5] == ["4", "40", "0.0", "1", "1"]
    assert str(tmp_path / "weights" / "v00000004" / "files") in lines[3]
    assert lines[-1] == "[]"
    help_out = subprocess.run(
        [sys.executable, "-m", "node.cli", "weights", "pull", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert help_out.returncode == 0 and "--version" in help_out.stdout


async def test_version_polls_back_off_while_gossip_keeps_up_and_restart_after_a_miss(
    autojump_clock, monkeypatch
):
    """Gossip can miss a notice, so a follower asks connected peers for their newest
    version: after ``discovery_interval``, then twice as long after each poll that found
    nothing new, up to ``POLL_BACKOFF`` x the interval; a poll that finds a version gossip
    missed starts the schedule again (MockClock: the poll times are exact)."""
    from types import SimpleNamespace

    from node.shardcast import following
    from node.shardcast.following import POLL_BACKOFF, Follower, next_poll

    assert next_poll(1.0, 1.0, missed=False) == 2.0
    assert next_poll(8.0, 1.0, missed=False) == POLL_BACKOFF * 1.0 == 8.0
    assert next_poll(8.0, 1.0, missed=True) == 1.0

    asked: list[float] = []
    peer_version = [0]

    async def ask_holding(node, peer, version, *, with_manifest):
        asked.append(trio.current_time())
        return SimpleNamespace(version=peer_version[0], manifest=None)

    monkeypatch.setattr(following, "ask_holding", ask_holding)
    node = SimpleNamespace(connected_peers=lambda: {"peer"}, known_peers=lambda: ["peer"])
    book = SimpleNamespace(newest_known=0)
    follower = Follower(
        node,  # type: ignore[arg-type]
        SimpleNamespace(net=SimpleNamespace(discovery_interval=1.0)),  # type: ignore[arg-type]
        book,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        SimpleNamespace(banned=set()),  # type: ignore[arg-type]
        follow=False,
    )

    async def learn(peer, version, expect):
        book.newest_known = version

    follower._learn = learn  # type: ignore[method-assign]
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(follower._poll_loop)
        await trio.sleep(40.5)
        peer_version[0] = 5  # a version whose notice never came
        await trio.sleep(30)
        nursery.cancel_scope.cancel()
    times = [round(t - start, 3) for t in asked]
    assert times == [1, 3, 7, 15, 23, 31, 39, 47, 48, 50, 54, 62, 70]
    assert book.newest_known == 5


async def test_a_flood_of_weights_notices_asks_for_a_few_manifests_at_a_time(
    autojump_clock, monkeypatch
):
    """Any peer may announce any versions: each notice of a newer one started its own
    manifest request to the sender, so a flood of notices made as many tasks and requests.
    At most ``MAX_LEARNING`` run at once; the rest are counted and left to the version
    poll, and a slot freed takes the next notice."""
    from types import SimpleNamespace

    from node.net.metrics import Metrics
    from node.shardcast import following
    from node.shardcast.following import MAX_LEARNING, Follower
    from protocol.shardcast import WeightsNotice, encode_notice

    asked, answer = [], trio.Event()

    async def ask_holding(node, peer, version, *, with_manifest):
        asked.append(version)
        await answer.wait()
        return SimpleNamespace(version=0, manifest=None)  # nothing that verifies

    monkeypatch.setattr(following, "ask_holding", ask_holding)
    node = SimpleNamespace(metrics=Metrics(), reject=lambda *a: None)
    follower = Follower(
        node,  # type: ignore[arg-type]
        SimpleNamespace(net=SimpleNamespace(discovery_interval=1.0)),  # type: ignore[arg-type]
        SimpleNamespace(newest_known=0),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        SimpleNamespace(saw=lambda version, peer: None),  # type: ignore[arg-type]
        follow=False,
    )

    def notice(version):
        body = encode_notice(WeightsNotice(version=version, step=version, manifest=bytes(32)))
        return SimpleNamespace(sender="flooder", body=body)

    async with trio.open_nursery() as nursery:
        follower._nursery = nursery
        for v in range(1, 51):
            follower.on_notice(notice(v))
        await trio.sleep(1)
        assert sorted(asked) == list(range(1, MAX_LEARNING + 1))  # the first ones
        assert node.metrics.get("weights_notices_deferred") == 50 - MAX_LEARNING
        answer.set()  # the requests end (nothing learned): their slots are free again
        await trio.sleep(1)
        follower.on_notice(notice(60))
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert asked[-1] == 60 and len(asked) == MAX_LEARNING + 1


def test_asking_for_weights_waits_out_a_disk_back_off_unless_a_person_asks():
    """A validator asks for the weights of each batch it judges: a download its own disk
    failed was started again at once on every ask (the disk still full), ignoring its
    back-off. It waits for its retry now; ``weights pull`` (a person) starts it at once,
    and a download that failed for another reason starts again when asked, as before."""
    import time
    from types import SimpleNamespace

    from node.shardcast.pulling import DownloadJob, Downloads

    book = SimpleNamespace(is_complete=lambda v: False)
    downloads = Downloads(None, None, book, None)  # type: ignore[arg-type]
    started: list[int] = []
    downloads.start = started.append  # type: ignore[method-assign]
    later = time.monotonic() + 100
    downloads._jobs[1] = DownloadJob(1, 10, 1, state="failed", retry_at=later)  # its disk
    downloads._jobs[2] = DownloadJob(2, 10, 1, state="failed")  # no peer had it, say
    downloads._jobs[3] = DownloadJob(3, 10, 1)  # downloading
    for v in (1, 2, 3, 4):
        downloads.ensure(v)
    assert started == [2, 4]
    downloads.ensure(1, now=True)
    assert started == [2, 4, 1]


# ---- bans outlive a download; bulk bytes wait for a hole punch ---------------------------


class _Versions:
    """What ``Downloads`` uses of its ``VersionBook``: every version of ``shards`` shards
    of 10 bytes from ``origin``, none held; ``finished`` the versions completed."""

    def __init__(self, shards=4, origin="origin"):
        self.shards, self.origin, self.finished = shards, origin, []

    async def begin(self, version):
        from types import SimpleNamespace

        manifest = SimpleNamespace(
            version=version,
            num_shards=self.shards,
            sender=self.origin,
            total_size=10 * self.shards,
            shard_length=lambda shard: 10,
        )
        return SimpleNamespace(manifest=manifest, held=set(), resumed=0)

    async def finish(self, partial):
        self.finished.append(partial.manifest.version)

    def end(self, version):
        pass

    async def retain(self, downloading):
        pass


def _downloads(monkeypatch, holders, holding):
    """``Downloads`` over fakes: each plan learns that every peer of ``holding`` holds
    every shard; ``asked`` records (version, shard, peer) of each fetch, ``fetch`` is
    ``Downloads._fetch``'s stand-in (an ``evil`` peer serves bad bytes)."""
    from types import SimpleNamespace

    from node.shardcast import pulling

    async def provide(node, cfg, version):
        pass

    monkeypatch.setattr(pulling, "provide", provide)
    node = SimpleNamespace(
        peer_id="me",
        reject=lambda protocol, peer, err: None,
        metrics=SimpleNamespace(inc=lambda *a, **k: None),
    )
    cfg = NodeConfig(shardcast={"download_slots": 2}, net={"read_timeout": 1.0})
    downloads = pulling.Downloads(node, cfg, _Versions(), holders)  # type: ignore[arg-type]
    asked = []

    async def refresh(m, plan, wakeup):
        for peer in holding:
            plan.update_peer(peer, set(range(m.num_shards)))
        wakeup.set()
        await trio.sleep_forever()

    async def fetch(partial, job, shard, peer):
        asked.append((partial.manifest.version, shard, peer))
        if peer == "evil":
            raise BadShard("bad bytes")
        return 10

    downloads._refresh_loop = refresh  # type: ignore[method-assign]
    downloads._fetch = fetch  # type: ignore[method-assign]
    return downloads, asked


async def test_a_peer_banned_in_one_download_is_banned_in_every_later_plan(
    autojump_clock, monkeypatch
):
    from node.shardcast.pulling import DownloadJob, Holders

    holders = Holders()
    downloads, asked = _downloads(monkeypatch, holders, ["evil", "good"])
    for version in (1, 2):
        downloads._jobs[version] = DownloadJob(version, 40, 4)
        await downloads._download(version)
        assert downloads._jobs[version].state == "complete"
    assert holders.banned == {"evil"}
    assert [peer for v, _, peer in asked if v == 1].count("evil") == 1  # once, then banned
    assert [peer for v, _, peer in asked if v == 2] == ["good"] * 4  # never asked again
    assert downloads._jobs[2].plan.banned == ["evil"]


async def test_a_finished_download_says_when_it_ended_in_wall_clock_time(
    autojump_clock, monkeypatch
):
    """A job's view has ``ended_at`` (Unix time) once it completes: what a bench or an
    operator compares with its own clock; None while it runs."""
    import time

    from node.shardcast.pulling import DownloadJob, Holders

    downloads, _ = _downloads(monkeypatch, Holders(), ["good"])
    job = downloads._jobs[1] = DownloadJob(1, 40, 4)
    assert job.view()["ended_at"] is None
    before = time.time()
    await downloads._download(1)
    view = job.view()
    assert view["state"] == "complete"
    assert before - 0.01 <= view["ended_at"] <= time.time() + 0.01


async def test_the_holdings_of_a_banned_peer_are_never_asked_for(autojump_clock, monkeypatch):
    from types import SimpleNamespace

    from node.shardcast import providers
    from node.shardcast.pulling import Downloads, Holders

    async def find_providers(node, cfg, version):
        return {"evil", "good"}

    monkeypatch.setattr(providers, "find_providers", find_providers)
    holders = Holders()
    holders.saw(3, "evil")
    holders.ban("evil", "served a bad shard")
    node = SimpleNamespace(peer_id="me", known_peers=lambda: ["evil", "good", "me"])
    downloads = Downloads(node, NodeConfig(net={"read_timeout": 1.0}), None, holders)
    asked = []

    async def refresh_one(m, plan, peer):
        asked.append(peer)

    downloads._refresh_one = refresh_one  # type: ignore[method-assign]
    plan = DownloadPlan(4)
    with trio.move_on_after(3.5 * REFRESH_IDLE):  # a slot free: at 0, 1, 2 and 3 s
        await downloads._refresh_loop(SimpleNamespace(version=3), plan, Wakeup())
    assert asked == ["good"] * 4  # known, provided, seen with the version: still banned


def _refresher(monkeypatch, holds, relayed=None):
    """``Downloads`` whose holdings refresh knows the peers of ``holds`` (no DHT
    providers), each answering for version 3 of 4 shards that it holds ``holds[peer]``;
    returns it, the version's stand-in manifest, and the peers asked and when, in order."""
    from types import SimpleNamespace

    from node.shardcast import providers, pulling
    from node.shardcast.pulling import Downloads, Holders

    async def find_providers(node, cfg, version):
        return set()

    asked: list[str] = []
    times: list[float] = []

    async def ask_holding(node, peer, version, *, with_manifest):
        asked.append(peer)
        times.append(trio.current_time())
        return SimpleNamespace(version=3, have=bitmap(holds[peer], 4))

    monkeypatch.setattr(providers, "find_providers", find_providers)
    monkeypatch.setattr(pulling, "ask_holding", ask_holding)
    relayed = relayed if relayed is not None else {}
    node = SimpleNamespace(
        peer_id="me", known_peers=lambda: list(holds), relayed=lambda p: relayed.get(p, False)
    )
    downloads = Downloads(node, NodeConfig(net={"read_timeout": 1.0}), None, Holders())
    return downloads, SimpleNamespace(version=3, num_shards=4), asked, times


async def test_a_refresh_asks_a_complete_holder_again_only_once_it_fails(
    autojump_clock, monkeypatch
):
    holds = {"full": {0, 1, 2, 3}, "part": {0}}
    relayed = {"full": True}
    downloads, m, asked, _ = _refresher(monkeypatch, holds, relayed)
    plan = DownloadPlan(4)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(downloads._refresh_loop, m, plan, Wakeup())
        await trio.sleep(2.5 * REFRESH_IDLE)  # a slot free: at 0, 1 and 2 s
        assert sorted(asked) == ["full", "part", "part", "part"]  # its bitmap cannot grow
        assert plan.peers["full"].have == {0, 1, 2, 3} and plan.peers["full"].relayed
        relayed["full"] = False  # a hole punch made its path direct: seen without asking
        holds["part"] = {0, 1}
        await trio.sleep(REFRESH_IDLE)
        assert not plan.peers["full"].relayed and plan.peers["part"].have == {0, 1}
        assert asked.count("full") == 1
        plan.failed(2, "full", trio.current_time())  # gone away? the next refresh asks it
        await trio.sleep(REFRESH_IDLE)
        assert asked.count("full") == 2
        await trio.sleep(REFRESH_IDLE)  # and every refresh until a fetch from it completes
        assert asked.count("full") == 3
        plan.completed(2, "full", 10, 1.0)
        await trio.sleep(REFRESH_IDLE)
        assert asked.count("full") == 3
        nursery.cancel_scope.cancel()


async def test_a_download_with_every_slot_busy_refreshes_half_as_often(autojump_clock, monkeypatch):
    downloads, m, _, asked = _refresher(monkeypatch, {"part": {0}})
    plan = DownloadPlan(4, max_inflight=1)
    plan.inflight[0] = "part"  # its one slot busy
    async with trio.open_nursery() as nursery:
        t0 = trio.current_time()
        nursery.start_soon(downloads._refresh_loop, m, plan, Wakeup())
        await trio.sleep(2 * REFRESH + REFRESH_IDLE / 2)
        assert [t - t0 for t in asked] == pytest.approx([0.0, REFRESH, 2 * REFRESH])
        del plan.inflight[0]  # the fetch ended and nothing else is known: a slot free
        await trio.sleep(2 * REFRESH_IDLE)
        again = [2 * REFRESH + REFRESH_IDLE, 2 * REFRESH + 2 * REFRESH_IDLE]
        assert [t - t0 for t in asked[3:]] == pytest.approx(again)
        nursery.cancel_scope.cancel()
    assert REFRESH_IDLE < REFRESH


async def test_a_version_poll_never_asks_a_banned_peer(monkeypatch):
    from types import SimpleNamespace

    from node.shardcast import following
    from node.shardcast.following import Follower
    from node.shardcast.pulling import Holders

    asked = []

    async def ask_holding(node, peer, version, *, with_manifest):
        asked.append(peer)
        return SimpleNamespace(version=0, manifest=None)

    monkeypatch.setattr(following, "ask_holding", ask_holding)
    holders = Holders()
    holders.ban("evil", "served a bad shard")
    peers = ["evil", "good"]
    node = SimpleNamespace(connected_peers=lambda: set(peers), known_peers=lambda: peers)
    follower = Follower(
        node,  # type: ignore[arg-type]
        SimpleNamespace(discovery_interval=1.0),  # type: ignore[arg-type]
        SimpleNamespace(newest_known=0),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        holders,
        follow=False,
    )
    for _ in range(5):  # peers are sampled at random: every time
        assert await follower._poll_some() is False
    assert asked == ["good"] * 5


async def test_a_shard_fetch_waits_for_a_hole_punch_before_it_opens_its_stream():
    from contextlib import asynccontextmanager
    from types import SimpleNamespace

    from node.shardcast.pulling import DownloadJob, Downloads

    steps = []

    async def direct_path(peer):
        steps.append(("direct_path", peer))
        await trio.lowlevel.checkpoint()
        return True

    @asynccontextmanager
    async def open_request(peer, protocol, msg, reply_type):
        steps.append(("open_request", peer))
        raise ConnectionError("stop here")
        yield

    node = SimpleNamespace(
        header=lambda: {"run_id": "r", "sender": TRAINER.peer_id, "seq": 1, "ts_ms": 1},
        direct_path=direct_path,
        open_request=open_request,
    )
    downloads = Downloads(node, NodeConfig(net={"read_timeout": 1.0}), None, None)
    manifest = SimpleNamespace(version=1, shard_length=lambda shard: 10)
    with pytest.raises(ConnectionError, match="stop here"):
        await downloads._fetch(SimpleNamespace(manifest=manifest), DownloadJob(1, 10, 1), 0, "p")
    assert steps == [("direct_path", "p"), ("open_request", "p")]


# ---- what a download takes, and what an upload serves ----------------------------------


def _fetching(tmp_path, reply_of, served):
    """``Downloads`` whose node answers a shard request with ``reply_of(manifest, shard)``
    and then ``served(manifest, shard)``'s bytes; a real ``Partial`` of a published
    version (``source``: the origin's copy)."""
    from contextlib import asynccontextmanager
    from types import SimpleNamespace

    from node.shardcast.pulling import Downloads

    _, source, _ = published(tmp_path)
    m = source.manifest
    partial = make_store(tmp_path).begin(m, source.envelope)

    class Frames:
        def __init__(self, data):
            self.data = memoryview(data)

        async def read_frame_into(self, view, deadline):
            n = min(len(view), len(self.data))
            view[:n] = self.data[:n]
            self.data = self.data[n:]
            return view[:n]

    @asynccontextmanager
    async def open_request(peer, protocol, req, reply_type):
        yield SimpleNamespace(
            reply=reply_of(m, req.index), reader=Frames(served(source, req.index))
        )

    async def direct_path(peer):
        return False

    node = SimpleNamespace(
        header=lambda: {"run_id": "run-1", "sender": TRAINER.peer_id, "seq": 1, "ts_ms": 1},
        direct_path=direct_path,
        open_request=open_request,
        metrics=SimpleNamespace(inc=lambda *a, **k: None, observe=lambda *a, **k: None),
    )
    downloads = Downloads(node, NodeConfig(net={"read_timeout": 1.0}), None, None)
    return downloads, partial, source


def _shard_reply(m, shard, **over):
    from protocol.shardcast import ShardReply

    fields = dict(version=m.version, index=shard, size=m.shard_length(shard))
    fields.update(over)
    return ShardReply(run_id="run-1", sender=TRAINER.peer_id, seq=1, ts_ms=1, **fields)


async def test_a_shard_whose_bytes_do_not_match_its_hash_is_never_stored(tmp_path):
    from node.shardcast.pulling import DownloadJob

    def other_bytes(source, shard):
        return bytes(len(source.read_shard(shard)))

    downloads, partial, source = _fetching(tmp_path, _shard_reply, other_bytes)
    job = DownloadJob(1, source.manifest.total_size, source.manifest.num_shards)
    with pytest.raises(BadShard, match="does not match its hash"):  # its peer is banned
        await downloads._fetch(partial, job, 1, "evil")
    assert partial.held == set() and job.done_bytes == 0
    downloads, partial, source = _fetching(
        tmp_path / "honest", _shard_reply, lambda s, i: s.read_shard(i)
    )
    assert await downloads._fetch(partial, job, 1, "honest") == source.manifest.shard_length(1)
    assert partial.held == {1}
    partial.close()


@pytest.mark.parametrize(
    "over", [{"index": 2}, {"version": 2}, {"size": 10}], ids=["index", "version", "size"]
)
async def test_a_shard_reply_for_another_shard_is_refused_before_its_bytes(tmp_path, over):
    from node.shardcast.pulling import DownloadJob

    read = []

    def served(source, shard):
        read.append(shard)
        return source.read_shard(shard)

    downloads, partial, source = _fetching(
        tmp_path, lambda m, shard: _shard_reply(m, shard, **over), served
    )
    job = DownloadJob(1, source.manifest.total_size, source.manifest.num_shards)
    with pytest.raises(WireError, match="another shard or size"):
        await downloads._fetch(partial, job, 1, "peer")
    assert partial.held == set() and job.fetched_bytes == 0
    partial.close()


async def test_holdings_of_another_version_take_the_peer_out_of_the_plan(monkeypatch):
    from types import SimpleNamespace

    from node.shardcast import pulling
    from node.shardcast.pulling import Downloads, Holders

    answer = {"version": 3}

    async def ask_holding(node, peer, version, *, with_manifest):
        return SimpleNamespace(version=answer["version"], have=bitmap({0, 1, 2, 3}, 4))

    monkeypatch.setattr(pulling, "ask_holding", ask_holding)
    node = SimpleNamespace(relayed=lambda peer: False)
    downloads = Downloads(node, NodeConfig(net={"read_timeout": 1.0}), None, Holders())
    plan, m = DownloadPlan(4), SimpleNamespace(version=3, num_shards=4)
    await downloads._refresh_one(m, plan, "peer")
    assert plan.peers["peer"].have == {0, 1, 2, 3} and plan.peers["peer"].joined
    answer["version"] = 4  # it moved on (and dropped version 3)
    await downloads._refresh_one(m, plan, "peer")
    assert plan.peers["peer"].have == set() and not plan.peers["peer"].joined
    assert plan.assign(0.0) == []


def test_a_banned_downloader_takes_no_share_of_the_origins_shards():
    p = DownloadPlan(4, origin="origin", me="m", max_inflight=4, per_peer=4)
    p.update_peer("origin", {0, 1, 2, 3})
    p.update_peer("a", set())  # another downloader of the version ...
    p.corrupt(0, "a")  # ... that served a bad shard: it will get nothing from us
    assert sorted(shard for shard, _ in p.assign(0.0)) == [0, 1, 2, 3]


async def test_an_upload_serves_only_held_shards_and_at_most_upload_slots_at_once(
    autojump_clock,
):
    from types import SimpleNamespace

    from node.shardcast.serving import ShardServer
    from protocol.shardcast import ShardRequest

    m = SimpleNamespace(shard_length=lambda index: 10)
    book = SimpleNamespace(source=lambda version: SimpleNamespace(held={0, 1}, manifest=m))
    node = SimpleNamespace(
        header=lambda: {"run_id": "run-1", "sender": TRAINER.peer_id, "seq": 1, "ts_ms": 1},
        metrics=SimpleNamespace(inc=lambda *a, **k: None),
    )
    cfg = NodeConfig(shardcast={"upload_slots": 1}, net={"read_timeout": 4.0})
    server = ShardServer(node, cfg, book, read=lambda src, i, off, n: bytes(n))  # type: ignore[arg-type]
    release = trio.Event()

    class Slow:
        async def send(self, msg):
            pass

        async def write(self, data, deadline):
            await release.wait()

    def req(index):
        return ShardRequest(
            run_id="run-1", sender=TRAINER.peer_id, seq=1, ts_ms=1, version=1, index=index
        )

    with trio.fail_after(30):  # a broken check serves, and waits on the slow peer
        with pytest.raises(WireError) as info:
            await server.on_shard(req(2), Slow())
        assert info.value.reason == Reason.NOT_FOUND
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.on_shard, req(0), Slow())  # takes the only slot
            await trio.sleep(1)
            start = trio.current_time()
            with pytest.raises(WireError) as info:
                await server.on_shard(req(1), Slow())
            assert info.value.reason == Reason.BUSY
            assert trio.current_time() - start == pytest.approx(2.0)  # read_timeout / 2
            release.set()
    assert server.status().active == 0


async def test_a_peer_asking_for_a_version_we_pull_is_asked_for_its_shards_in_turn():
    """Whoever asks what we hold of a version we are downloading is most likely pulling it
    too: the server tells the holders hints (our download asks it from then on); of a
    version we hold complete it does not."""
    from types import SimpleNamespace

    from node.shardcast.serving import ShardServer
    from protocol.shardcast import WeightsQuery

    m = SimpleNamespace(num_shards=4)
    complete: set[int] = {1}
    book = SimpleNamespace(
        newest_known=2,
        manifest=lambda version: (m, b"envelope"),
        source=lambda version: SimpleNamespace(held={0}),
        is_complete=lambda version: version in complete,
    )
    node = SimpleNamespace(
        header=lambda: {"run_id": "run-1", "sender": TRAINER.peer_id, "seq": 1, "ts_ms": 1}
    )
    seen: list[tuple[int, str]] = []
    server = ShardServer(
        node,  # type: ignore[arg-type]
        NodeConfig(),
        book,  # type: ignore[arg-type]
        read=lambda src, i, off, n: bytes(n),
        asked=lambda version, peer: seen.append((version, peer)),
    )
    sent = []
    reply = SimpleNamespace(peer="asker", send=lambda msg: _record(sent, msg))
    for version in (2, 1):
        query = WeightsQuery(
            run_id="run-1", sender="asker", seq=1, ts_ms=1, version=version, with_manifest=False
        )
        await server.on_query(query, reply)  # type: ignore[arg-type]
    assert seen == [(2, "asker")]
    assert [(r.version, r.have) for r in sent] == [(2, b"\x01"), (1, b"\x01")]


async def _record(into: list, msg) -> None:
    into.append(msg)
