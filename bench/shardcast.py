"""Benchmark: SHARDCAST between node processes on 127.0.0.1, against a bare py-libp2p
stream and a raw TCP socket between two processes moving the same bytes.

    .venv/bin/python bench/shardcast.py [--mib 256] [--peers 6] [--cap 40] [--json]

(a) one origin → one downloader: an ``intellect-node`` trainer publishes a ``--mib``
    checkpoint (two safetensors files and a config); a second node pulls it. MB/s = bytes
    / the downloader's job time (first request to verified, renamed version, including
    the final whole-checkpoint hash). The same bytes then go from one process to another
    over a bare py-libp2p stream (Noise + yamux, 1 MiB writes; ``plain_host``: the library
    as shipped, without the read-ahead our nodes put on their TCP streams), over the same
    stream with that read-ahead (for reference: what the nodes' transport itself moves),
    and over a raw TCP socket. Also for reference: how fast this machine's disk takes as
    many new bytes through the page cache, in shards (``disk_write_MBps``: what bound the
    pull on a VM that charges each new page, before the store wrote past the cache).
(b) one origin → ``--peers`` downloaders at once, every node with the same upload cap
    (``--cap`` MB/s, a home uplink): time from the publish request until every downloader
    holds the version, against the ideal ``size / cap`` (one copy leaving the origin at
    its cap); per-node MB/s; the origin's egress divided by the checkpoint size.
MB/s = 10^6 bytes per second. Figures, and their history: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from node.cli.adminclient import admin_get as _admin_get  # noqa: E402
from node.cli.adminclient import admin_post, admin_text
from node.cli.devnet import NodeProcess, p2p_addr, spawn_node, wait_ready  # noqa: E402
from node.config import NodeConfig  # noqa: E402

MiB = 1024 * 1024
TIMEOUT = 600
MEET_TIMEOUT = 120.0  # seconds the swarm's nodes get to know each other (bench/sim.py: more)
# seconds between the bench's status requests to a node: each costs the node a few ms of
# CPU (HTTP in Python), which polling 7 nodes 20 times a second took from the transfer
# itself; the figures come from the nodes' own records (a job's elapsed_s and ended_at),
# so the poll's period does not blur them
POLL = 0.5
SHARD: list[str] = []  # --shard-mib: the origin's shard size (default: the node's)
# the node's default intervals (as a real run has them), deadlines relaxed: seven node
# processes share this machine's cores with the bench
NODE_ARGS = [
    "--network-only",  # the trainer role's own work needs a model and a chain
    "--net.connect-timeout", "10", "--net.read-timeout", "20",
]  # fmt: skip


def make_checkpoint(path: Path, mib: int) -> int:
    path.mkdir(parents=True, exist_ok=True)
    half = mib * MiB // 2
    sizes = {
        "model-00001-of-00002.safetensors": half + 4097,
        "model-00002-of-00002.safetensors": mib * MiB - half - 4097 - 600,
        "config.json": 600,
    }
    for name, size in sizes.items():
        with open(path / name, "wb") as f:
            left = size
            while left:
                n = min(left, 8 * MiB)
                f.write(os.urandom(n))
                left -= n
    return sum(sizes.values())


def counter(node: NodeProcess, name: str, label: str) -> int:
    text = admin_text(node.data_dir, "/metrics")
    return sum(
        int(float(line.split()[-1]))
        for line in text.splitlines()
        if line.startswith(name) and label in line
    )


def wait(pred, timeout: float, what: str, interval: float = 0.05):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(interval)
    raise RuntimeError(f"timed out waiting for {what}")


def complete(node: NodeProcess) -> dict | None:  # type: ignore[type-arg]
    w = _admin_get(node.data_dir, "/weights")
    job = w["downloads"].get("1")
    return job if job and job["state"] == "complete" else None


def swarm(base: Path, ckpt: Path, total: int, peers: int, cap: float) -> dict[str, object]:
    """One origin, ``peers`` downloaders started first; all capped at ``cap`` MB/s."""
    nodes: list[NodeProcess] = []
    try:
        capped = ["--shardcast.upload-rate", str(cap)] if cap else []
        origin = spawn_node(
            "origin",
            "trainer",
            base,
            run_id="bench",
            listen="/ip4/127.0.0.1/tcp/0",
            die_with_parent=True,
            bootstrap=[],
            extra=NODE_ARGS + capped + SHARD,
        )
        nodes.append(origin)
        st = wait_ready(origin)
        tid = st["peer_id"]
        for i in range(peers):
            nodes.append(
                spawn_node(
                    f"dl{i}",
                    "bootstrap",
                    base,
                    run_id="bench",
                    listen="/ip4/127.0.0.1/tcp/0",
                    die_with_parent=True,
                    bootstrap=[p2p_addr(st)],
                    extra=NODE_ARGS
                    + capped
                    + ["--run.trainer-peer-id", tid, "--shardcast.follow-weights", "true"],
                )
            )
        for n in nodes[1:]:
            wait_ready(n)
        wait(
            # peer_count, not the rows: /status lists every known peer up to 32 only
            lambda: all((n.status() or {}).get("peer_count", 0) >= peers for n in nodes),
            MEET_TIMEOUT,
            "the nodes to meet",
            0.2,
        )
        rest = busy_cores(REST_S)  # the met swarm, waiting
        t0 = time.time()
        admin_post(origin.data_dir, "/weights/publish", {"dir": str(ckpt)}, timeout=600)
        published = time.time()
        busy0 = busy_seconds()
        jobs = {}
        while len(jobs) < peers:
            for n in nodes[1:]:
                if n.name not in jobs and (job := complete(n)):
                    jobs[n.name] = (float(job["ended_at"]), job)
            if time.time() - published > TIMEOUT:
                break  # reported: completed < peers
            time.sleep(POLL)
        busy = (busy_seconds() - busy0) / max(time.time() - published, 1e-9)
        done = max((t for t, _ in jobs.values()), default=time.time())
        if len(jobs) < peers:
            done = time.time()
            for n in nodes[1:]:
                if n.name not in jobs:  # where the unfinished ones stand
                    job = _admin_get(n.data_dir, "/weights")["downloads"].get("1") or {}
                    print(
                        f"  {n.name} unfinished: {job.get('done_shards')}/{job.get('shards')} "
                        f"shards, from {job.get('peers')}, banned {job.get('banned')}",
                        file=sys.stderr,
                    )
        rss = [peak_rss_mib(n) for n in nodes[1:]]
        egress = counter(origin, "intellect_shardcast_bytes_total", 'direction="out"')
        relayed = {
            name: counter(n, "intellect_shardcast_bytes_total", 'direction="out"')
            for n in nodes[1:]
            for name in [n.name]
        }
        return {
            "publish_seconds": round(published - t0, 3),
            # when each downloader's job began, seconds after the publish request returned
            # (its ended_at less its elapsed_s): bench/sim.py starts its simulated nodes so
            "start_offsets": {
                name: round(t - float(job["elapsed_s"]) - published, 3)
                for name, (t, job) in jobs.items()
            },
            "done_offsets": {name: round(t - published, 3) for name, (t, _) in jobs.items()},
            "swarm_seconds": round(done - published, 3),
            "per_node_MBps": {
                name: round(total / job["elapsed_s"] / 1e6, 1) for name, (_, job) in jobs.items()
            },
            "origin_egress_ratio": round(egress / total, 3),
            "relayed_bytes": relayed,
            "completed": len(jobs),
            "downloader_peak_rss_MiB": max(rss),
            # the machine's busy cores (every process, /proc/stat) before the publish and
            # from it until the last downloader completed: a swarm that holds every core
            # while it moves the weights is bound by the CPU, not by the cap
            "busy_cores": {"at_rest": round(rest, 2), "spreading": round(busy, 2)},
        }
    finally:
        for n in nodes:
            n.stop(grace=10)


REST_S = 3.0  # seconds the machine's use is read for before a swarm's publish


def busy_seconds() -> float:
    """Processor seconds this machine has spent busy since boot, over all cores (the
    first line of ``/proc/stat``, less idle and I/O wait; guest time is in user time)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def busy_cores(seconds: float) -> float:
    """The machine's busy cores over the next ``seconds``."""
    before = busy_seconds()
    time.sleep(seconds)
    return (busy_seconds() - before) / seconds


def disk_write(base: Path, total: int, shard: int) -> float:
    """MB/s of writing ``total`` new bytes to a new file through the page cache, one
    ``pwrite`` and ``fdatasync`` per shard: what a downloader's store did before it wrote
    past the cache (``node/shardcast/direct.py``), and what it still does on a file system
    that refuses ``O_DIRECT``."""
    data = memoryview(os.urandom(shard))
    path = base / "disk-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        started = time.perf_counter()
        for offset in range(0, total, shard):
            os.pwrite(fd, data[: min(shard, total - offset)], offset)
            os.fdatasync(fd)
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
        path.unlink()
    return total / elapsed / 1e6


def peak_rss_mib(node: NodeProcess) -> float:
    """The process's peak resident memory (VmHWM), MiB."""
    for line in Path(f"/proc/{node.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def single(base: Path, ckpt: Path, total: int) -> float:
    nodes: list[NodeProcess] = []
    try:
        origin = spawn_node(
            "origin",
            "trainer",
            base,
            run_id="bench1",
            listen="/ip4/127.0.0.1/tcp/0",
            die_with_parent=True,
            bootstrap=[],
            extra=NODE_ARGS + SHARD,
        )
        nodes.append(origin)
        st = wait_ready(origin)
        admin_post(origin.data_dir, "/weights/publish", {"dir": str(ckpt)}, timeout=600)
        d = spawn_node(
            "dl",
            "bootstrap",
            base,
            run_id="bench1",
            listen="/ip4/127.0.0.1/tcp/0",
            die_with_parent=True,
            bootstrap=[p2p_addr(st)],
            extra=NODE_ARGS
            + ["--run.trainer-peer-id", st["peer_id"], "--shardcast.follow-weights", "true"],
        )
        nodes.append(d)
        wait_ready(d)
        job = wait(lambda: complete(d), 600, "the single download", POLL)
        return float(total / job["elapsed_s"] / 1e6)
    finally:
        for n in nodes:
            n.stop(grace=10)


# ---- the same bytes between two processes: bare py-libp2p stream, raw TCP --------------


SINK = r"""
import sys, time, trio, multiaddr
from functools import partial
sys.path.insert(0, {root!r})
from crypto.identity import Identity
from node.net.host import build_host, plain_host
mode, total = sys.argv[1], int(sys.argv[2])
CHUNK = 1 << 20
async def main():
    done = trio.Event()
    got = 0
    first = None
    async def drain(read):
        nonlocal got, first
        while got < total:
            data = await read(CHUNK)
            if not data:
                break
            if first is None:
                first = time.perf_counter()
            got += len(data)
        print(f"DONE {{got}} {{time.perf_counter():.6f}}", flush=True)
        done.set()
    if mode == "tcp":
        async def handler(stream):
            await drain(stream.receive_some)
        async with trio.open_nursery() as n:
            listeners = await n.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
            print(f"ADDR {{listeners[0].socket.getsockname()[1]}}", flush=True)
            await done.wait()
            n.cancel_scope.cancel()
    else:
        host = (build_host if mode == "tuned" else plain_host)(Identity.generate())
        async def handler(stream):
            await drain(stream.read)
            await stream.close()
        async with host.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
            host.set_stream_handler("/intellect/bench/1.0.0", handler)
            print(f"ADDR {{host.get_addrs()[0]}}", flush=True)
            await done.wait()
            await trio.sleep(0.2)
trio.run(main)
"""


def two_process(mode: str, total: int) -> float:
    import trio

    root = str(Path(__file__).resolve().parent.parent)
    proc = subprocess.Popen(
        [sys.executable, "-c", SINK.format(root=root), mode, str(total)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("ADDR "):
            raise RuntimeError(f"sink did not start: {line!r}")
        addr = line.split()[1]
        payload = bytes(1 << 20)

        async def send() -> float:
            if mode == "tcp":
                stream = await trio.open_tcp_stream("127.0.0.1", int(addr))
                started = time.perf_counter()
                for _ in range(total // len(payload)):
                    await stream.send_all(payload)
                await stream.aclose()
                return started
            import multiaddr
            from libp2p.peer.peerinfo import info_from_p2p_addr

            from crypto.identity import Identity
            from node.net.host import build_host, plain_host

            host = (build_host if mode == "tuned" else plain_host)(Identity.generate())
            async with host.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
                info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
                await host.connect(info)
                s = await host.new_stream(info.peer_id, ["/intellect/bench/1.0.0"])
                started = time.perf_counter()
                for _ in range(total // len(payload)):
                    await s.write(payload)
                await trio.to_thread.run_sync(proc.wait)
                return started

        started = trio.run(send)
        done = proc.stdout.readline()
        proc.wait(60)
        got, finished = int(done.split()[1]), float(done.split()[2])
        if got != total:
            raise RuntimeError(f"{mode}: received {got} of {total}")
        return total / (finished - started) / 1e6  # perf_counter is system-wide (CLOCK_MONOTONIC)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--mib", type=int, default=256, help="checkpoint size in MiB (default 256)")
    ap.add_argument("--peers", type=int, default=6, help="downloaders in the swarm (default 6)")
    ap.add_argument("--cap", type=float, default=40, help="upload cap per node, MB/s (default 40)")
    ap.add_argument(
        "--timeout", type=float, default=600, help="swarm: give up after this many seconds"
    )
    ap.add_argument(
        "--shard-mib",
        type=int,
        default=None,
        help="the origin's shard size in MiB (default: the node's, 8)",
    )
    ap.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = ap.parse_args()
    global TIMEOUT
    TIMEOUT = args.timeout
    shard_mib = args.shard_mib or NodeConfig().shardcast.shard_size // MiB
    SHARD[:] = ["--shardcast.shard-size", str(shard_mib * MiB)]
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        total = make_checkpoint(base / "ckpt", args.mib)
        size = args.mib * MiB
        tcp = two_process("tcp", size)
        libp2p = two_process("libp2p", size)
        tuned = two_process("tuned", size)  # last: it wraps this process's TCP streams
        disk = disk_write(base, total, shard_mib * MiB)
        one = single(base / "single", base / "ckpt", total)
        print(f"(a) {args.mib} MiB, one origin -> one downloader, separate processes on 127.0.0.1:")
        print(f"  raw TCP socket           {tcp:8.1f} MB/s")
        print(f"  bare py-libp2p stream    {libp2p:8.1f} MB/s")
        print(
            f"  the same, nodes' TCP     {tuned:8.1f} MB/s   (with our read-ahead, node/net/host.py)"
        )
        print(f"  disk, new bytes          {disk:8.1f} MB/s   (through the page cache)")
        print(f"  SHARDCAST pull           {one:8.1f} MB/s   ({one / libp2p:.3f} x bare libp2p)")
        sw = swarm(base / "swarm", base / "ckpt", total, args.peers, args.cap)
        ideal = total / (args.cap * 1e6) if args.cap else 0.0
        print(f"(b) one origin -> {args.peers} downloaders, every node capped at {args.cap} MB/s:")
        print(
            f"  all complete after {sw['swarm_seconds']:.2f} s; ideal size/cap {ideal:.2f} s "
            f"({float(sw['swarm_seconds']) / ideal if ideal else 0:.2f} x)"
        )
        print(f"  completed {sw['completed']} of {args.peers}")
        print(
            f"  origin egress {sw['origin_egress_ratio']:.3f} x the checkpoint (HTTP origin: {args.peers})"
        )
        print(f"  per-node MB/s {sw['per_node_MBps']}")
        print(f"  downloader peak RSS {sw['downloader_peak_rss_MiB']} MiB (whole process)")
        print(f"  bytes each downloader relayed {sw['relayed_bytes']}")
        if args.json:
            print(
                json.dumps(
                    {
                        "single_MBps": round(one, 1),
                        "libp2p_MBps": round(libp2p, 1),
                        "libp2p_read_ahead_MBps": round(tuned, 1),
                        "tcp_MBps": round(tcp, 1),
                        "disk_write_MBps": round(disk, 1),
                        "single_vs_libp2p": round(one / libp2p, 3),
                        "swarm_seconds": sw["swarm_seconds"],
                        "swarm_ideal_seconds": round(ideal, 3),
                        "swarm_vs_ideal": round(float(sw["swarm_seconds"]) / ideal, 3)
                        if ideal
                        else None,
                        "origin_egress_ratio": sw["origin_egress_ratio"],
                        "completed": sw["completed"],
                        "per_node_MBps": sw["per_node_MBps"],
                        "downloader_peak_rss_MiB": sw["downloader_peak_rss_MiB"],
                        "peers": args.peers,
                        "cap_MBps": args.cap,
                        "checkpoint_bytes": total,
                        "shard_bytes": shard_mib * MiB,
                    }
                )
            )


if __name__ == "__main__":
    main()
