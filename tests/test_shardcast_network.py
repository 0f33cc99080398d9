"""SHARDCAST between real node processes on 127.0.0.1: publish and follow, relays, a
malicious peer, forged and replayed manifests, a serving peer that dies or freezes, and
a downloader killed with SIGKILL that resumes without fetching its verified shards again,
a downloader whose disk fills mid-download.
Every process a test starts, the test stops (the ``cluster`` fixture).

The origin is a trainer node; downloaders are network-only nodes told to follow the
weights (``follow_weights``), so these tests need no model or chain."""

import filecmp
import os
import re
import resource
import signal
import subprocess
from pathlib import Path

import pytest

from node.cli.adminclient import admin_get as _admin_get
from tests.helpers.net import (
    CLI,
    Cluster,
    addr_of,
    counter,
    dump_logs,
    metrics,
    post,
    status,
    wait_until,
)

KiB, MiB = 1024, 1024 * 1024
SHARDCAST, WEIGHTS = "/intellect/shardcast/1.0.0", "/intellect/weights/1.0.0"


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path / "nodes")
    yield c
    c.close()


def checkpoint(path, sizes):
    for name, size in sizes.items():
        f = path / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(os.urandom(size))
    return path


ODD = {
    "model-00001-of-00002.safetensors": 2 * MiB + 12_345,
    "model-00002-of-00002.safetensors": MiB + 1,
    "config.json": 617,
    "generation_config.json": 0,
    "tokenizer/tokenizer.json": 99_999,
}


def weights(node):
    return _admin_get(node.data_dir, "/weights")


def job(node, version=1):
    return weights(node)["downloads"].get(str(version))


def has(node, version):
    return weights(node)["current"] >= version and any(
        v["version"] == version and v["complete"] for v in weights(node)["versions"]
    )


def path_of(node, version):
    return next(v["path"] for v in weights(node)["versions"] if v["version"] == version)


def assert_same_files(src, dest):
    names = sorted(str(p.relative_to(src)) for p in src.rglob("*") if p.is_file())
    got = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert names == got
    for name in names:
        assert filecmp.cmp(src / name, dest / name, shallow=False), name


def cli(*args):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


def follower(cluster, st, **opts):
    """A network-only node that follows the weights of the trainer whose status is ``st``."""
    return cluster.start(
        "bootstrap",
        [addr_of(st)],
        run__trainer_peer_id=st["peer_id"],
        shardcast__follow_weights="true",
        **opts,
    )


def trainer_and(cluster, n, trainer_opts=None, **opts):
    t, st = cluster.start("trainer", **(trainer_opts or {}))
    others = [follower(cluster, st, **opts)[0] for _ in range(n)]
    return t, st["peer_id"], others


def wait_known(nodes, count, timeout=30):
    wait_until(
        lambda: all(len(status(n)["peers"]) >= count for n in nodes), timeout, "nodes to meet"
    )


def test_publish_follow_bit_exact_cli_progress_and_retention(cluster, tmp_path):
    t, tid, (a, b) = trainer_and(
        cluster,
        2,
        trainer_opts={"run__async_level": 1, "shardcast__shard_size": 256 * KiB},
        run__async_level=1,
    )
    boot, _ = cluster.start("bootstrap", [addr_of(status(t))], run__trainer_peer_id=tid)
    wait_known([t, a, b, boot], 3)
    src = checkpoint(tmp_path / "v1", ODD)
    r = cli("weights", "publish", str(src), "--data-dir", str(t.data_dir))
    assert r.returncode == 0, r.stderr
    assert "published version 1" in r.stdout and "13 shards" in r.stdout, r.stdout
    wait_until(lambda: has(a, 1) and has(b, 1), 30, "both followers to hold version 1")
    assert status(a)["weights"]["current"] == 1 and status(a)["weights"]["held"] == [1]
    for n in (a, b):  # each shard fetched is timed in /metrics, once
        assert counter(metrics(n), "intellect_shardcast_shard_seconds_count") == 13, n.name
    for n in (t, a, b):
        assert_same_files(src, Path(path_of(n, 1)))
    # a bootstrap node does not follow; a hand pull prints progress as plain log lines
    assert weights(boot)["current"] == 0 and not weights(boot)["downloads"]
    r = cli("weights", "pull", "--data-dir", str(boot.data_dir), "--timeout", "60")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert any(line.startswith("pull v1: ") and " MiB (" in line for line in lines), r.stdout
    assert "\r" not in r.stdout and "\x1b" not in r.stdout  # no bar when not on a terminal
    assert lines[-1].startswith("version 1 complete: ")
    assert_same_files(src, Path(path_of(boot, 1)))
    r = cli("weights", "ls", "--data-dir", str(boot.data_dir))
    assert r.returncode == 0 and "current 1" in r.stdout and path_of(boot, 1) in r.stdout
    # three versions with async_level 1: everyone keeps the newest two
    for v in (2, 3):  # each held before the next is published: a follower may skip a
        # version a newer one overtakes while it downloads (one did, once, in the quick tier)
        src_v = checkpoint(tmp_path / f"v{v}", {"w.safetensors": 300 * KiB + v})
        assert post(t, "/weights/publish", {"dir": str(src_v)})["version"] == v
        wait_until(lambda v=v: has(a, v) and has(b, v), 30, f"followers to hold version {v}")
    for n in (t, a, b):
        held = [v["version"] for v in weights(n)["versions"] if v["complete"]]
        assert held == [2, 3], (n.name, held)
        assert sorted(p.name for p in (n.data_dir / "weights").iterdir()) == [
            "v00000002",
            "v00000003",
        ]
    # the pull window: version 1 is below newest (3) - async_level (1)
    r = cli("weights", "pull", "--version", "1", "--data-dir", str(a.data_dir))
    assert r.returncode == 1 and "outside the retention window" in r.stderr, r.stderr


def test_malicious_peer_serving_corrupt_shards_is_banned(cluster, tmp_path):
    t, st = cluster.start(
        "trainer", shardcast__upload_rate="2", shardcast__shard_size=str(256 * KiB)
    )
    tid = st["peer_id"]
    evil, se = follower(cluster, st, module="tests.helpers.evil_node", env={"EVIL": "corrupt"})
    src = checkpoint(tmp_path / "ckpt", {"w.safetensors": 3 * MiB + 5, "config.json": 100})
    post(t, "/weights/publish", {"dir": str(src)})
    wait_until(lambda: has(evil, 1), 30, "the evil node to hold version 1 (honestly)")
    victim, _ = follower(cluster, st)
    wait_until(lambda: has(victim, 1), 60, "the victim to complete from the honest trainer")
    assert_same_files(src, Path(path_of(victim, 1)))
    view = job(victim)
    assert view["banned"] == [se["peer_id"]], dump_logs(cluster.nodes)
    assert view["peers"][se["peer_id"]]["bytes"] == 0  # nothing it sent was kept
    assert view["peers"][tid]["bytes"] == view["total_bytes"]
    bad = counter(
        metrics(victim), "intellect_rejected_total", protocol=SHARDCAST, reason="bad_shard"
    )
    assert bad >= 1
    assert "banned peer=" + se["peer_id"] in victim.log_path.read_text()


def test_forged_oversized_inconsistent_and_replayed_manifests_are_refused(cluster, tmp_path):
    t, st = cluster.start("trainer")
    tid = st["peer_id"]
    victim, _ = follower(cluster, st)
    evil, _ = follower(cluster, st, module="tests.helpers.evil_node", env={"EVIL": "manifests"})
    wait_known([t, victim, evil], 2)
    src = checkpoint(tmp_path / "ckpt", {"w.safetensors": 100 * KiB})
    post(t, "/weights/publish", {"dir": str(src)})
    wait_until(lambda: has(victim, 1) and has(evil, 1), 30, "version 1 everywhere")
    assert post(evil, "/evil/notices", {})["announced"] == 5
    reasons = {
        "bad_signature": WEIGHTS,  # 50: signed by the evil node, not the trainer
        "oversized": WEIGHTS,  # 51
        "malformed": WEIGHTS,  # 52: files do not add up to the shards
        "replay": WEIGHTS,  # 53: the trainer's real manifest of version 1
    }

    def all_counted():
        text = metrics(victim)
        got = {
            r: counter(text, "intellect_rejected_total", protocol=p, reason=r)
            for r, p in reasons.items()
        }
        got["notice"] = counter(
            text, "intellect_rejected_total", protocol="gossip-weights", reason="malformed"
        )
        return got if all(got.values()) else None

    got = wait_until(all_counted, 30, "every bad manifest to be refused and counted")
    assert all(v >= 1 for v in got.values()), got
    w = weights(victim)
    assert w["newest_known"] == 1 and w["current"] == 1 and not w["downloads"].get("53")
    assert [v["version"] for v in w["versions"]] == [1]
    assert post(victim, "/ping", {"peer_id": tid})["ok"]  # still up and serving


@pytest.mark.parametrize("how", ["sigkill", "sigstop"])
def test_serving_peer_dies_or_freezes_mid_download(cluster, tmp_path, how):
    t, st = cluster.start(
        "trainer", shardcast__upload_rate="2", shardcast__shard_size=str(256 * KiB)
    )
    tid = st["peer_id"]
    relay, sr = follower(cluster, st, shardcast__upload_rate="1.5")
    src = checkpoint(tmp_path / "ckpt", {"w.safetensors": 4 * MiB + 77})
    post(t, "/weights/publish", {"dir": str(src)})
    wait_until(lambda: has(relay, 1), 30, "the relay to hold version 1")
    d, _ = follower(cluster, st)

    def from_relay():
        j = job(d)
        return j and j["peers"].get(sr["peer_id"], {}).get("bytes", 0) > 0

    wait_until(from_relay, 30, "the downloader to fetch from the relay", interval=0.05)
    assert not has(d, 1)
    sig = signal.SIGKILL if how == "sigkill" else signal.SIGSTOP
    os.kill(relay.proc.pid, sig)
    try:
        wait_until(lambda: has(d, 1), 60, "the download to complete from the trainer")
        assert_same_files(src, Path(path_of(d, 1)))
        j = job(d)
        assert j["peers"][tid]["bytes"] > 0 and j["peers"][sr["peer_id"]]["bytes"] > 0
        assert j["banned"] == []  # a dead or frozen peer is not a liar
        if how == "sigstop":  # its in-flight shard was taken back after the read deadline
            assert counter(metrics(d), "intellect_shardcast_fetch_failures_total") >= 1
    finally:
        if how == "sigstop":
            os.kill(relay.proc.pid, signal.SIGCONT)


def test_downloader_killed_with_sigkill_resumes_without_refetching(cluster, tmp_path):
    t, st = cluster.start(
        "trainer", shardcast__upload_rate="1", shardcast__shard_size=str(256 * KiB)
    )
    src = checkpoint(tmp_path / "ckpt", {"a.safetensors": 3 * MiB + 3, "b.json": 1000})
    post(t, "/weights/publish", {"dir": str(src)})
    total = 3 * MiB + 3 + 1000
    d, _ = follower(cluster, st, name="downloader")
    wait_until(lambda: (job(d) or {}).get("done_shards", 0) >= 4, 30, "a few shards", 0.05)
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait()
    partial = d.data_dir / "weights" / ".partial-v00000001"
    journaled = (partial / "done").stat().st_size // 4
    assert journaled >= 4 and not has_complete_dir(d)
    sent_before = counter(metrics(t), "intellect_shardcast_bytes_total", direction="out")
    d2, _ = follower(cluster, st, name="downloader")
    wait_until(lambda: has(d2, 1), 60, "the restarted download to complete")
    assert_same_files(src, Path(path_of(d2, 1)))
    j = job(d2)
    assert j["resumed_shards"] >= journaled
    # only the shards it did not hold were transferred again, to the byte
    assert j["fetched_bytes"] == total - j["resumed_bytes"]
    sent_after = counter(metrics(t), "intellect_shardcast_bytes_total", direction="out")
    assert sent_after - sent_before == j["fetched_bytes"]
    assert "resumed version=1 verified_shards=" in d2.log_path.read_text()


def test_a_full_disk_fails_the_download_and_it_resumes_by_itself_given_room(cluster, tmp_path):
    """The downloader's disk fills mid-download: its file size limit is lowered under it,
    so the kernel refuses its writes past 1 MiB as a full disk would (EFBIG). The download
    fails with that cause; the node stays up; no peer is blamed; ``weights pull`` says why
    and when the node tries again. Given room, the node starts again by itself and fetches
    only the shards it had not verified."""
    t, st = cluster.start(
        "trainer", shardcast__upload_rate="1", shardcast__shard_size=str(256 * KiB)
    )
    src = checkpoint(tmp_path / "ckpt", {"a.safetensors": 3 * MiB + 3, "b.json": 1000})
    post(t, "/weights/publish", {"dir": str(src)})
    total = 3 * MiB + 3 + 1000
    d, _ = follower(cluster, st)
    wait_until(lambda: (job(d) or {}).get("done_shards", 0) >= 2, 30, "a few shards", 0.05)
    unlimited = resource.RLIM_INFINITY
    resource.prlimit(d.proc.pid, resource.RLIMIT_FSIZE, (MiB, unlimited))
    wait_until(lambda: job(d)["state"] == "failed", 30, "the download to fail")
    j = job(d)
    assert "cannot write shard" in j["error"] and "File too large" in j["error"], j
    assert j["retry_in_s"] is not None and j["banned"] == [] and j["attempt"] == 1
    journaled = (d.data_dir / "weights" / ".partial-v00000001" / "done").stat().st_size // 4
    assert journaled >= 2 and not has(d, 1)
    assert post(d, "/ping", {"peer_id": st["peer_id"]})["ok"]  # up, and still serving
    # by hand: the pull starts at once, fails the same way, and says so
    r = cli("weights", "pull", "--data-dir", str(d.data_dir), "--timeout", "60")
    assert r.returncode == 1, r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("version 1 failed: cannot write shard "), last
    assert "File too large (the node tries again in " in last, last
    kept = re.search(r"keeping the (\d+) shards it verified\)$", last)
    assert kept and int(kept.group(1)) >= journaled, last
    resource.prlimit(d.proc.pid, resource.RLIMIT_FSIZE, (unlimited, unlimited))
    wait_until(lambda: has(d, 1), 60, "the download to start again by itself and complete")
    assert_same_files(src, Path(path_of(d, 1)))
    j = job(d)
    assert j["attempt"] >= 3 and j["retry_in_s"] is None and j["resumed_shards"] >= journaled
    assert j["fetched_bytes"] == total - j["resumed_bytes"]  # nothing verified came again
    # started again by itself (not only by the pull above, which starts one at once)
    assert re.search(r"downloading version 1 again \(attempt \d+\)", d.log_path.read_text())


def has_complete_dir(node):
    return (node.data_dir / "weights" / "v00000001").exists()
