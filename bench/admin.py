"""Benchmark: the admin endpoint, new (starlette served by hypercorn on trio,
``node/net/admin.py``) against the old hand-written HTTP/1.1 server
(``bench/baselines/legacy_admin.py``, kept only for this), measured in one run; and the node's own
work while a dashboard page is open.

    .venv/bin/python bench/admin.py [--clients 20] [--requests 2000] [--seconds 8]
                                    [--phase-s 6] [--pairs 3] [--json]

Each server runs in its own process over a real node (a py-libp2p host on 127.0.0.1, no
peers), both at once; the clients are trio tasks in this process, on loopback, one fresh
connection per request (what ``intellect-node status`` and the old server do). Every
measurement runs in two rounds per server, alternating old, new, old, new (half the count
and time each), so that a change in the machine's load hits both: rates are the rounds'
mean, percentiles the slower round's. Per server:

- ``/status`` and ``/metrics``: ``--clients`` concurrent clients until ``--requests``
  answers or ``--seconds``, whichever comes first: requests per second, p50 / p95 latency.
- the event stream: ``--clients`` clients hold ``GET /events?interval=0.1`` open (3 s a
  round): time to the first event (p95) and events per second in all. The old
  server has no stream; its figures are those of the page's fallback, the same clients
  polling ``GET /status`` every 0.1 s (time to the first answer, answers per second).

The node's work: the ``model init`` tiny model generating with the project's torch engine
(batch 8, 64 tokens, EOS ignored) in a child process, as the inference role's batch maker
runs, next to the node's process serving the new endpoint; ``--pairs`` pairs of
``--phase-s`` phases, alternately with no client and with a page open (one event stream
at the default 1 s and a ``/status`` poll every second, as the page does): the median
tokens per second of each, and ``work_slowdown_pct`` = how much slower with the page.
On a shared 2-core machine this wobbles by a few percent either way.

``--json``: the last line is one JSON object with ``status_rps``, ``status_p95_ms``,
``metrics_rps``, ``metrics_p95_ms``, ``events_first_p95_ms``, ``events_per_s`` (the new
server), the same with ``baseline_`` for the old one (``baseline_events_*``: the polling
fallback), the ratios, ``work_tokens_per_s`` / ``work_tokens_per_s_page`` and
``work_slowdown_pct``.

The old server's ``/metrics`` now answers ``prometheus_client``'s exposition too (the
hand-written renderer is gone with the counters it read), so its ``/metrics`` figures
compare the servers, not the renderers.

Measured here (2026-12-01, default run, 4.7 minutes: 2 cores shared with three other
engineers' tests, load average 16-18, so every figure is squeezed and noisy):

                                  old server    new server   new/old
    /status requests/s                   445           221     0.50x
    /status p50 / p95 ms        44.6 / 107.1   95.6 / 225.7     2.1x
    /metrics requests/s                  192           130     0.68x
    /metrics p50 / p95 ms      106.1 / 183.9  164.3 / 321.2   1.6-1.8x
    live: first update p95 ms           85.8         181.1     2.11x
    live: updates/s in all               169           157     0.93x

The old server's figures (its own, the baseline): /status 445 requests/s, p95 107 ms;
/metrics 192 requests/s, p95 184 ms; polling /status every 0.1 s from 20 clients, first
answer p95 86 ms, 169 answers/s. hypercorn + starlette cost about twice the CPU per
request of the hand-written server (a task group, an idle timer and the ASGI layers per
connection); at a page's rate (one event and one /status a second) that is a few
milliseconds of CPU a second. The node's work: 46 tokens/s alone, 44 with a page open
(+6.3%), with phases alone at 46, 54, 27 and with the page at 48, 44, 14 tokens/s: the
machine's load swung more than the page could cost, so this run does not show whether the
page stays within 2%; run it on a quiet machine for that.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HANG_S = 30.0


# ---- the server process ---------------------------------------------------------------------


def serve(kind: str, data_dir: Path) -> None:
    """``--serve``: a node with the ``kind`` admin endpoint, until SIGTERM."""
    from crypto.identity import Identity
    from node.config import load_config
    from node.net.runtime import Node

    if kind == "new":
        from node.net.admin import AdminServer
    else:
        from bench.baselines.legacy_admin import AdminServer  # type: ignore[no-redef]

    cfg = load_config(
        environ={},
        flags={
            "run.id": "bench-admin",
            "net.listen": ["/ip4/127.0.0.1/tcp/0"],
            "data_dir": data_dir,
            "net.discovery_interval": 600.0,
        },
    )

    async def main() -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                node = await nursery.start(Node(cfg, Identity.generate()).serve)
                await nursery.start(AdminServer(node, data_dir).serve)
                async for _ in signals:
                    node.request_stop()
                    nursery.cancel_scope.cancel()

    trio.run(main)


class Server:
    """A ``--serve`` process and its port."""

    def __init__(self, kind: str, base: Path) -> None:
        self.kind = kind
        self.dir = base / kind
        self.dir.mkdir(parents=True)
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", kind, "--data-dir", str(self.dir)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "log", "w"),  # noqa: SIM115 - closed with the process
        )
        deadline = time.monotonic() + 120
        while not (self.dir / "admin.json").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{kind} server did not start: {self.dir / 'log'}")
            time.sleep(0.1)
        time.sleep(0.1)  # written whole
        self.port = int(json.loads((self.dir / "admin.json").read_text())["port"])

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---- clients --------------------------------------------------------------------------------


async def get(port: int, path: str) -> bytes:
    """One GET on a fresh connection; the whole answer."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
        )
        raw = b""
        while chunk := await stream.receive_some(1 << 16):
            raw += chunk
    if not raw.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"GET {path}: {raw[:80]!r}")
    return raw


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


async def run_clients(client: Callable[[], Awaitable[None]], clients: int, seconds: float) -> float:
    """Run ``clients`` copies of ``client`` at once for at most ``seconds``; the seconds
    they took."""
    started = time.perf_counter()
    with trio.move_on_after(seconds):
        async with trio.open_nursery() as nursery:
            for _ in range(clients):
                nursery.start_soon(client)
    return time.perf_counter() - started


async def load(port: int, path: str, clients: int, requests: int, seconds: float) -> dict:
    """``clients`` concurrent clients GET ``path`` until ``requests`` or ``seconds``."""
    latencies: list[float] = []
    left = requests

    async def client() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            t = time.perf_counter()
            await get(port, path)
            latencies.append(time.perf_counter() - t)

    elapsed = await run_clients(client, clients, seconds)
    return {
        "rps": len(latencies) / elapsed,
        "p50_ms": 1000 * pct(latencies, 50),
        "p95_ms": 1000 * pct(latencies, 95),
        "count": len(latencies),
    }


async def events(port: int, clients: int, seconds: float, interval: float = 0.1) -> dict:
    """``clients`` event streams held ``seconds``: time to the first event, events/s."""
    firsts: list[float] = []
    count = 0

    async def client() -> None:
        nonlocal count
        t = time.perf_counter()
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(
                f"GET /events?interval={interval} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
            )
            buf, head_done, first = b"", False, True
            while chunk := await stream.receive_some(1 << 16):
                buf += chunk
                if not head_done:
                    if b"\r\n\r\n" not in buf:
                        continue
                    head, _, buf = buf.partition(b"\r\n\r\n")
                    if not head.startswith(b"HTTP/1.1 200"):
                        raise RuntimeError(f"/events: {head[:80]!r}")
                    head_done = True
                n = buf.count(b"\n\n")
                if n:
                    if first:
                        firsts.append(time.perf_counter() - t)
                        first = False
                    count += n
                    buf = buf[buf.rindex(b"\n\n") + 2 :]

    elapsed = await run_clients(client, clients, seconds)
    return {"first_p95_ms": 1000 * pct(firsts, 95), "per_s": count / elapsed, "streams": clients}


async def polls(port: int, clients: int, seconds: float, interval: float = 0.1) -> dict:
    """The page's fallback without a stream: ``clients`` polling ``/status`` every
    ``interval``: time to the first answer, answers/s."""
    firsts: list[float] = []
    count = 0

    async def client() -> None:
        nonlocal count
        t = time.perf_counter()
        await get(port, "/status")
        firsts.append(time.perf_counter() - t)
        count += 1
        while True:
            await trio.sleep(interval)
            await get(port, "/status")
            count += 1

    elapsed = await run_clients(client, clients, seconds)
    return {"first_p95_ms": 1000 * pct(firsts, 95), "per_s": count / elapsed, "streams": clients}


async def page(port: int) -> None:
    """A dashboard page: one event stream at the default interval, ``/status`` each second."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(events, port, 1, 1e9, 1.0)
        while True:
            await get(port, "/status")
            await trio.sleep(1.0)


ROUNDS = 2  # each measurement alternates old, new, old, new: drift hits both alike


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds of one measurement as one: rates summed over the rounds' time, the
    latency figures from the slower round (percentiles cannot be averaged)."""
    out: dict[str, Any] = {k: max(p[k] for p in parts) for k in parts[0] if k.endswith("_ms")}
    for key in ("rps", "per_s"):
        if key in parts[0]:
            out[key] = statistics.mean(p[key] for p in parts)
    return out


def measure_servers(base: Path, args: argparse.Namespace) -> tuple[dict, dict]:
    """The old and the new server side by side, every measurement in alternating rounds."""
    servers = {kind: Server(kind, base) for kind in ("legacy", "new")}
    try:

        async def run() -> dict[str, dict[str, Any]]:
            with trio.fail_after(60):
                for server in servers.values():
                    for _ in range(20):  # warm-up
                        await get(server.port, "/status")
                        await get(server.port, "/metrics")
            rounds: dict[str, dict[str, list]] = {k: {} for k in servers}
            seconds = args.seconds / ROUNDS
            for part in ("status", "metrics", "events"):
                for _ in range(ROUNDS):
                    for kind, server in servers.items():
                        if part == "events":
                            stream = events if kind == "new" else polls
                            got = await stream(server.port, args.clients, min(seconds, 3.0))
                        else:
                            n = args.requests // ROUNDS
                            got = await load(server.port, f"/{part}", args.clients, n, seconds)
                        rounds[kind].setdefault(part, []).append(got)
            return {k: {p: merge(v) for p, v in r.items()} for k, r in rounds.items()}

        out = trio.run(run)
    finally:
        for server in servers.values():
            server.stop()
    return out["legacy"], out["new"]


# ---- the node's work --------------------------------------------------------------------------


def generator(conn: Any, model_dir: str) -> None:
    """Child process: generate with the torch engine for the seconds asked; tokens/s back."""
    from node.engine.base import GenRequest, SamplingParams
    from node.engine.models import load_model, prompt_ids
    from node.engine.torch_engine import TorchEngine
    from node.tasks import assign, load_taskset

    loaded = load_model(model_dir, dtype="float32", device="cpu")
    tasks = assign(load_taskset("arithmetic:1-5"), "0x" + "be" * 20, 0, 8)
    prompts = [prompt_ids(loaded.tokenizer, t.prompt) for t in tasks]
    engine = TorchEngine(loaded.model, eos_token_ids=loaded.eos_token_ids, max_batch=8)
    params = SamplingParams(max_new_tokens=64, prove=True, stop_at_eos=False)

    def batch(seed: int) -> int:
        reqs = [GenRequest(p, seed + i) for i, p in enumerate(prompts)]
        return sum(len(r.tokens) for r in engine.generate(reqs, params))

    batch(0)  # warm-up
    conn.send("ready")
    while (seconds := conn.recv()) is not None:
        tokens, started, seed = 0, time.perf_counter(), 1
        while (elapsed := time.perf_counter() - started) < seconds:
            tokens += batch(seed)
            seed += 100
        conn.send(tokens / elapsed)


def tiny_model(out: Path) -> Path:
    """The ``model init`` base policy, from the cache the tests and the devnet share
    (``.cache/`` of the checkout, else ``$INTELLECT_NODE_CACHE`` or the XDG cache; built
    there once, about a minute, if it is in none)."""
    from node.engine.tinymodel import Recipe, build_tiny_model, default_cache_dir

    local = ROOT / ".cache" / "models"
    cache = local if local.is_dir() and "INTELLECT_NODE_CACHE" not in os.environ else None
    cache = cache or default_cache_dir()
    model_dir, _ = build_tiny_model(out, Recipe(), cache_dir=cache)
    return model_dir


def measure_work(base: Path, args: argparse.Namespace) -> dict[str, Any]:
    model_dir = args.model or tiny_model(base / "model")
    server = Server("work", base)
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=generator, args=(theirs, str(model_dir)), daemon=True)
    child.start()
    try:
        if not ours.poll(300) or ours.recv() != "ready":
            raise RuntimeError("the generator did not start")

        async def phase(with_page: bool) -> float:
            async with trio.open_nursery() as nursery:
                if with_page:
                    nursery.start_soon(page, server.port)
                    await trio.sleep(0.5)  # the page is open before the work is timed
                ours.send(args.phase_s)
                rate: float = await trio.to_thread.run_sync(ours.recv)
                nursery.cancel_scope.cancel()
            return rate

        async def run() -> tuple[list[float], list[float]]:
            idle, busy = [], []
            for i in range(args.pairs):  # alternated (and swapped), so drift hits both alike
                for with_page in (False, True) if i % 2 == 0 else (True, False):
                    (busy if with_page else idle).append(await phase(with_page))
            return idle, busy

        idle, busy = trio.run(run)
        ours.send(None)
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
        server.stop()
    a, b = statistics.median(idle), statistics.median(busy)
    return {
        "tokens_per_s": a,
        "tokens_per_s_page": b,
        "slowdown_pct": 100 * (a - b) / a,
        "idle_runs": idle,
        "page_runs": busy,
    }


# ---- report -------------------------------------------------------------------------------------


def report(old: dict[str, Any], new: dict[str, Any], work: dict[str, Any]) -> dict[str, Any]:
    print(f"{'':26}{'old server':>14}{'new server':>14}{'new/old':>10}")
    rows = [
        ("/status requests/s", "status", "rps", "{:.0f}"),
        ("/status p50 ms", "status", "p50_ms", "{:.1f}"),
        ("/status p95 ms", "status", "p95_ms", "{:.1f}"),
        ("/metrics requests/s", "metrics", "rps", "{:.0f}"),
        ("/metrics p50 ms", "metrics", "p50_ms", "{:.1f}"),
        ("/metrics p95 ms", "metrics", "p95_ms", "{:.1f}"),
        ("live: first update p95 ms", "events", "first_p95_ms", "{:.1f}"),
        ("live: updates/s in all", "events", "per_s", "{:.0f}"),
    ]
    for label, part, key, fmt in rows:
        o, n = old[part][key], new[part][key]
        print(f"{label:26}{fmt.format(o):>14}{fmt.format(n):>14}{n / o:>9.2f}x")
    print("(live, old: the clients poll /status every 0.1 s; new: /events?interval=0.1)")
    print(
        f"node's work (tiny model, torch engine, batch 8): {work['tokens_per_s']:.0f} tokens/s "
        f"alone, {work['tokens_per_s_page']:.0f} with a page open: "
        f"{work['slowdown_pct']:+.1f}% slowdown"
        f" (runs alone {[round(x) for x in work['idle_runs']]},"
        f" with the page {[round(x) for x in work['page_runs']]})"
    )
    out: dict[str, Any] = {}
    for prefix, fig in (("", new), ("baseline_", old)):
        out[f"{prefix}status_rps"] = round(fig["status"]["rps"], 1)
        out[f"{prefix}status_p95_ms"] = round(fig["status"]["p95_ms"], 2)
        out[f"{prefix}metrics_rps"] = round(fig["metrics"]["rps"], 1)
        out[f"{prefix}metrics_p95_ms"] = round(fig["metrics"]["p95_ms"], 2)
        out[f"{prefix}events_first_p95_ms"] = round(fig["events"]["first_p95_ms"], 2)
        out[f"{prefix}events_per_s"] = round(fig["events"]["per_s"], 1)
    out["status_rps_ratio"] = round(new["status"]["rps"] / old["status"]["rps"], 3)
    out["metrics_rps_ratio"] = round(new["metrics"]["rps"] / old["metrics"]["rps"], 3)
    out["work_tokens_per_s"] = round(work["tokens_per_s"], 1)
    out["work_tokens_per_s_page"] = round(work["tokens_per_s_page"], 1)
    out["work_slowdown_pct"] = round(work["slowdown_pct"], 2)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=20, help="concurrent clients (default 20)")
    p.add_argument("--requests", type=int, default=2000, help="answers per endpoint at most")
    p.add_argument("--seconds", type=float, default=8.0, help="seconds per endpoint at most")
    p.add_argument("--phase-s", type=float, default=6.0, help="seconds of work per phase")
    p.add_argument("--pairs", type=int, default=3, help="work phases without/with a page")
    p.add_argument("--model", type=Path, help="the model to generate with (default: tiny)")
    p.add_argument("--json", action="store_true", help="last line: one JSON object")
    p.add_argument("--serve", choices=("new", "legacy", "work"), help=argparse.SUPPRESS)
    p.add_argument("--data-dir", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve("legacy" if args.serve == "legacy" else "new", args.data_dir)
        return 0
    if args.clients < 1 or args.requests < 1 or args.seconds <= 0 or args.pairs < 1:
        p.error("--clients, --requests, --seconds and --pairs must be positive")
    with tempfile.TemporaryDirectory(prefix="bench-admin-") as tmp:
        base = Path(tmp)
        print(f"{args.clients} clients, at most {args.requests} requests or {args.seconds} s each")
        old, new = measure_servers(base, args)
        work = measure_work(base, args)
    out = report(old, new, work)
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
