"""Benchmark: the project's framed stream vs. a bare py-libp2p stream vs. raw TCP, and
DHT lookup latency across a six-node network of real node processes.

    .venv/bin/python bench/p2p.py [--mib 256] [--lookups 20] [--json]

Throughput: the same payload is sent in 1 MiB writes (1 MiB frames for ours) from one
endpoint to another in this process over 127.0.0.1, each variant ``--repeat`` times, best
run kept. MB/s = 10^6 bytes per second, receive side, until the last byte arrived.

DHT: six ``intellect-node`` processes bootstrapped as a chain; for each lookup a fresh
client host joins through the last node only (so it knows one peer) and times
``find_providers`` for a role key until providers come back ("cold", several hops); then
one client repeats lookups with its connections open and its local provider cache
cleared before each ("warm").
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import multiaddr  # noqa: E402
import trio  # noqa: E402
from libp2p.peer.peerinfo import info_from_p2p_addr  # noqa: E402
from libp2p.tools.anyio_service import background_trio_service  # noqa: E402

from crypto.identity import Identity  # noqa: E402
from node.cli.devnet import p2p_addr, spawn_node, wait_ready  # noqa: E402
from node.net.host import build_dht, build_host  # noqa: E402
from protocol import ids  # noqa: E402
from protocol.framing import FrameReader, write_frame  # noqa: E402

CHUNK = 1 << 20
LOCAL = multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")
BENCH_PROTO = "/intellect/bench/1.0.0"


async def drain_bare(stream, total: int) -> None:
    got = 0
    while got < total:
        data = await stream.read(CHUNK)
        if not data:
            break
        got += len(data)
    if got != total:
        raise RuntimeError(f"received {got} of {total} bytes")


async def drain_framed(stream, total: int, into: bool = True) -> None:
    """Our reader: ``read_frame_into`` a reused buffer (bulk path), or ``read_frame`` (bytes)."""
    reader = FrameReader(stream)
    buf = bytearray(CHUNK)
    got = 0
    while got < total:
        if into:
            got += len(await reader.read_frame_into(buf, deadline=30))
        else:
            got += len(await reader.read_frame(CHUNK, deadline=30))
    if got != total:
        raise RuntimeError(f"received {got} of {total} bytes")


async def libp2p_throughput(total: int, mode: str) -> float:
    """``mode``: "bare" (stream.read/write), "framed" (into a reused buffer), "framed-bytes"."""
    framed = mode != "bare"
    a, b = build_host(Identity.generate()), build_host(Identity.generate())
    done = trio.Event()
    elapsed = 0.0
    started = 0.0

    async def handler(stream) -> None:
        nonlocal elapsed
        if framed:
            await drain_framed(stream, total, into=mode == "framed")
        else:
            await drain_bare(stream, total)
        elapsed = time.perf_counter() - started
        done.set()
        await stream.close()

    payload = bytes(CHUNK)
    async with a.run([LOCAL]), b.run([LOCAL]):
        a.set_stream_handler(BENCH_PROTO, handler)
        await b.connect(info_from_p2p_addr(a.get_addrs()[0]))
        stream = await b.new_stream(a.get_id(), [BENCH_PROTO])
        started = time.perf_counter()
        for _ in range(total // CHUNK):
            if framed:
                await write_frame(stream, payload, deadline=30)
            else:
                await stream.write(payload)
        with trio.fail_after(120):
            await done.wait()
        await stream.close()
    return total / elapsed / 1e6


async def tcp_throughput(total: int) -> float:
    done = trio.Event()
    elapsed = 0.0
    started = 0.0

    async def handler(stream: trio.SocketStream) -> None:
        nonlocal elapsed
        got = 0
        while got < total:
            data = await stream.receive_some(CHUNK)
            if not data:
                break
            got += len(data)
        elapsed = time.perf_counter() - started
        done.set()

    payload = bytes(CHUNK)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        client = await trio.open_tcp_stream("127.0.0.1", port)
        started = time.perf_counter()
        for _ in range(total // CHUNK):
            await client.send_all(payload)
        with trio.fail_after(120):
            await done.wait()
        await client.aclose()
        nursery.cancel_scope.cancel()
    return total / elapsed / 1e6


def percentile(values: list[float], p: float) -> float:
    values = sorted(values)
    k = (len(values) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


async def one_lookup(entry: str, key: str) -> tuple[float, float]:
    """A fresh client that knows one peer: (dial ms to it, find_providers ms)."""
    host = build_host(Identity.generate())
    dht = build_dht(host)
    async with host.run([LOCAL]), background_trio_service(dht):
        info = info_from_p2p_addr(multiaddr.Multiaddr(entry))
        t0 = time.perf_counter()
        await host.connect(info)
        dial = (time.perf_counter() - t0) * 1000
        await dht.add_peer(info.peer_id)
        t0 = time.perf_counter()
        with trio.fail_after(30):
            providers = await dht.find_providers(key)
        dt = (time.perf_counter() - t0) * 1000
        if not providers:
            raise RuntimeError(f"no providers found for {key}")
        return dial, dt


async def warm_lookups(entry: str, keys: list[str], n: int) -> list[float]:
    host = build_host(Identity.generate())
    dht = build_dht(host)
    out = []
    async with host.run([LOCAL]), background_trio_service(dht):
        info = info_from_p2p_addr(multiaddr.Multiaddr(entry))
        await host.connect(info)
        await dht.add_peer(info.peer_id)
        for i in range(n):
            dht.provider_store.providers.clear()  # a real network lookup, not a local cache hit
            t0 = time.perf_counter()
            with trio.fail_after(30):
                providers = await dht.find_providers(keys[i % len(keys)])
            out.append((time.perf_counter() - t0) * 1000)
            if not providers:
                raise RuntimeError("no providers found")
    return out


def dht_bench(lookups: int) -> dict[str, float]:
    roles = ["bootstrap", "trainer", "validator", "inference", "inference", "inference"]
    run_id = "bench"
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            prev = None
            for i, role in enumerate(roles):
                p = spawn_node(
                    f"n{i}",
                    role,
                    Path(tmp),
                    run_id=run_id,
                    listen="/ip4/127.0.0.1/tcp/0",
                    bootstrap=[prev] if prev else [],
                    extra=[
                        "--network-only",  # the roles' own work needs a model and a chain
                        "--net.heartbeat-interval",
                        "1",
                        "--net.peer-ttl",
                        "10",
                        "--net.discovery-interval",
                        "0.5",
                    ],
                )
                procs.append(p)
                prev = p2p_addr(wait_ready(p))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if all(
                    len((p.status() or {"peers": []})["peers"]) == len(roles) - 1 for p in procs
                ):
                    break
                time.sleep(0.3)
            else:
                seen = [len((p.status() or {"peers": []})["peers"]) for p in procs]
                raise RuntimeError(
                    f"the six-node network did not converge in 60 s: peers known per node "
                    f"{seen}, {len(roles) - 1} each expected"
                )
            keys = [
                ids.role_key(run_id, r) for r in ("bootstrap", "trainer", "validator", "inference")
            ]
            entry = prev  # the last node in the chain
            cold_runs = [trio.run(one_lookup, entry, keys[i % len(keys)]) for i in range(lookups)]
            dials = [d for d, _ in cold_runs]
            cold = [c for _, c in cold_runs]
            warm = trio.run(warm_lookups, entry, keys, lookups * 2)
        finally:
            for p in procs:
                p.stop()
    return {
        "dht_lookup_ms_p50": round(percentile(cold, 0.5), 2),
        "dht_lookup_ms_p95": round(percentile(cold, 0.95), 2),
        "dht_lookup_warm_ms_p50": round(percentile(warm, 0.5), 2),
        "dht_lookup_warm_ms_p95": round(percentile(warm, 0.95), 2),
        "dht_lookups": lookups,
        "dial_ms_p50": round(percentile(dials, 0.5), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--mib", type=int, default=256, help="payload per throughput run, MiB (default 256)"
    )
    ap.add_argument(
        "--repeat", type=int, default=2, help="runs per variant; the best is kept (default 2)"
    )
    ap.add_argument("--lookups", type=int, default=20, help="cold DHT lookups (default 20)")
    ap.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = ap.parse_args()
    from node.logs import setup_logging

    setup_logging("warning", "bench")
    total = args.mib * CHUNK
    results: dict[str, list[float]] = {"tcp": [], "libp2p": [], "framed": [], "framed_bytes": []}
    for _ in range(args.repeat):  # interleave so that machine noise hits every variant alike
        results["tcp"].append(trio.run(tcp_throughput, total))
        results["libp2p"].append(trio.run(libp2p_throughput, total, "bare"))
        results["framed"].append(trio.run(libp2p_throughput, total, "framed"))
        results["framed_bytes"].append(trio.run(libp2p_throughput, total, "framed-bytes"))
    best = {k: max(v) for k, v in results.items()}
    overhead = (best["libp2p"] - best["framed"]) / best["libp2p"] * 100
    print(
        f"throughput, {args.mib} MiB in 1 MiB writes / 1 MiB frames over 127.0.0.1 (best of {args.repeat}):"
    )
    print(f"  raw TCP socket                {best['tcp']:9.1f} MB/s")
    print(
        f"  bare py-libp2p stream         {best['libp2p']:9.1f} MB/s   ({best['libp2p'] / best['tcp']:.3f} x TCP)"
    )
    print(
        f"  framed, read_frame_into       {best['framed']:9.1f} MB/s   ({best['framed'] / best['libp2p']:.3f} x bare libp2p, "
        f"framing costs {overhead:.1f}%)"
    )
    print(
        f"  framed, read_frame (bytes)    {best['framed_bytes']:9.1f} MB/s   "
        f"({best['framed_bytes'] / best['libp2p']:.3f} x bare libp2p)"
    )
    dht = dht_bench(args.lookups)
    print(
        f"DHT find_providers across six node processes ({args.lookups} cold lookups, {2 * args.lookups} warm):"
    )
    print(
        f"  cold (client knows 1 peer)  p50 {dht['dht_lookup_ms_p50']:.1f} ms   p95 {dht['dht_lookup_ms_p95']:.1f} ms"
    )
    print(
        f"  warm (connections open)     p50 {dht['dht_lookup_warm_ms_p50']:.1f} ms   p95 {dht['dht_lookup_warm_ms_p95']:.1f} ms"
    )
    print(
        f"  for scale: one Noise+yamux dial p50 {dht['dial_ms_p50']:.1f} ms (a cold lookup dials several peers)"
    )
    if args.json:
        figures = {
            "framed_MBps": round(best["framed"], 1),
            "libp2p_MBps": round(best["libp2p"], 1),
            "tcp_MBps": round(best["tcp"], 1),
            "framing_overhead_pct": round(overhead, 2),
            "framed_vs_libp2p": round(best["framed"] / best["libp2p"], 4),
            "framed_bytes_MBps": round(best["framed_bytes"], 1),
            "payload_MiB": args.mib,
            **dht,
        }
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
