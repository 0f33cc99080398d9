"""Probe (temporary): does py-libp2p's DCUtR punch a direct TCP connection between two homes
behind real NATs (tests/helpers/netns.py's NatLab)? Root only.

A relay runs in the public namespace, node A in home 1 and node B in home 2, each a process
of its own started with ``ip netns exec``; they swap ids and addresses through files in a
temporary folder. A and B reserve a slot on the relay (circuit relay v2); B dials A through
the circuit; B starts a hole punch (DCUtR) while both libraries also drive punches on their
own every 2 s. B reports whether a direct connection came, after how long, and whether a
new stream to A then goes over it. Each try starts fresh processes; the routers' nftables
counters (SYNs and RSTs in and out of each WAN) are printed after each try.

    python bench/nat_probe.py --nats cone cone --tries 5 --drop-unsolicited
    python bench/nat_probe.py --nats cone random --tries 3 --listen-port 4001

Measured here (py-libp2p 0.8.1, 2 cores): with routers that drop unsolicited SYNs, cone-cone
went direct 8 times in 8 (0.31-0.36 s after the relayed link with B's explicit hole punch,
2.4-2.5 s with the libraries' auto-drive alone) and every new stream then took the direct
link; cone-random 0/4, random-cone 0/2, random-random 0/3 (each side's SYN reaches the other
router on a port no mapping holds). With routers that answer such SYNs with a reset (Linux
with no firewall), cone-cone 0/5: the first SYN to arrive is refused, the reset also ends the
sender's own mapping, and the two SYNs would have to cross within microseconds here.
Identify gave each home its router's address 0.25-0.3 s after connecting to the relay, and
DCUtR advertised the right prediction (WAN address, listen port) every time.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import multiaddr  # noqa: E402
import trio  # noqa: E402
from libp2p.custom_types import TProtocol  # noqa: E402
from libp2p.peer.id import ID  # noqa: E402
from libp2p.peer.peerinfo import PeerInfo  # noqa: E402
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole  # noqa: E402
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol  # noqa: E402
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP  # noqa: E402
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol  # noqa: E402
from libp2p.relay.circuit_v2.resources import RelayLimits  # noqa: E402
from libp2p.relay.circuit_v2.transport import CircuitV2Transport  # noqa: E402
from libp2p.tools.anyio_service import background_trio_service  # noqa: E402

from crypto.identity import Identity  # noqa: E402
from node.net.host import plain_host  # noqa: E402
from tests.helpers.netns import NatLab, sh  # noqa: E402

ECHO = "/probe/echo/1.0.0"
RELAY_PORT = 4100


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nats", nargs=2, default=["cone", "cone"], help="NAT of home 1 and home 2")
    p.add_argument("--tries", type=int, default=3)
    p.add_argument("--wait", type=float, default=30, help="seconds B waits for a direct link")
    p.add_argument("--listen-port", type=int, default=0, help="homes listen on this port")
    p.add_argument("--no-initiate", action="store_true", help="leave punching to auto-drive")
    p.add_argument(
        "--drop-unsolicited",
        action="store_true",
        help="routers drop inbound SYNs to themselves instead of answering RST",
    )
    p.add_argument("--role", choices=["relay", "a", "b"], help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    return p.parse_args()


# ---------------------------------------------------------------- one node (inside a namespace)


def say(*a: object) -> None:
    print(f"[{time.monotonic() - T0:6.2f}s]", *a, flush=True)


async def until(check, seconds: float) -> bool:
    """Poll ``check`` (a file appearing, a link coming up: nothing here to wait on) until it
    holds or ``seconds`` pass."""
    with trio.move_on_after(max(0.0, seconds)):
        while True:
            if check():
                return True
            await trio.sleep(0.05)
    return bool(check())


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


async def wait_file(path: Path, seconds: float) -> dict:
    """The JSON another process writes at ``path`` (written whole: it appears by rename)."""
    if not await until(path.exists, seconds):
        raise TimeoutError(f"{path} did not appear")
    return read_json(path)


def write_json(path: Path, data: dict) -> None:
    path.with_suffix(".tmp").write_text(json.dumps(data))
    path.with_suffix(".tmp").rename(path)


def conns(host, peer) -> list[list[str]]:
    cs = host.get_network().connections.get(peer) or []
    cs = cs if isinstance(cs, list) else [cs]
    return [[str(a) for a in c.get_transport_addresses()] for c in cs]


def is_direct(host, peer) -> bool:
    return any(all("/p2p-circuit" not in a for a in c) and c for c in conns(host, peer))


async def node(args: argparse.Namespace) -> None:

    d = Path(args.dir)
    host = plain_host(Identity.generate())
    limits = RelayLimits(
        duration=120, data=1 << 24, max_circuit_conns=8, max_reservations=8, reservation_ttl=60
    )
    if args.role == "relay":
        listen = multiaddr.Multiaddr(f"/ip4/203.0.113.1/tcp/{RELAY_PORT}")
        async with host.run([listen]):
            relay = CircuitV2Protocol(host, limits=limits, allow_hop=True)
            async with background_trio_service(relay):
                write_json(d / "relay.json", {"addr": str(host.get_addrs()[0])})
                say("relay", host.get_addrs())
                await until((d / "stop").exists, 3600)
        return

    listen = multiaddr.Multiaddr(f"/ip4/0.0.0.0/tcp/{args.listen_port}")
    echo_proto = TProtocol(ECHO)

    async def echo(stream) -> None:
        data = await stream.read(1 << 16)
        addrs = [str(a) for a in stream.muxed_conn.get_transport_addresses()]
        await stream.write(json.dumps({"echo": data.decode(), "addrs": addrs}).encode())
        await stream.close()

    async with host.run([listen]), trio.open_nursery() as nursery:
        host.set_stream_handler(echo_proto, echo)
        proto = CircuitV2Protocol(host, limits=limits, allow_hop=False)
        cfg = RelayConfig(roles=RelayRole.STOP | RelayRole.CLIENT, limits=limits)
        transport = CircuitV2Transport(host, proto, cfg)
        dcutr = DCUtRProtocol(host)
        async with background_trio_service(proto), background_trio_service(dcutr):
            relay_addr = multiaddr.Multiaddr((await wait_file(d / "relay.json", 30))["addr"])
            relay_id = ID.from_base58(relay_addr.value_for_protocol("p2p"))
            t = time.monotonic()
            await host.connect(PeerInfo(relay_id, [relay_addr]))
            manager = host._observed_addr_manager
            await until(lambda: manager.addrs(min_observers=1), 10)
            observed = [str(a) for a in manager.addrs(min_observers=1)]
            say("listen", host.get_transport_addrs(), "observed", observed,
                f"after {time.monotonic() - t:.2f}s")  # fmt: skip
            with trio.fail_after(20):
                s = await host.new_stream(relay_id, [HOP])
                ok = await transport.reserve(s, relay_id, nursery)
                await s.close()
            say("reserved", ok)
            me = {
                "id": str(host.get_id()),
                "listen": [str(a) for a in host.get_transport_addrs()],
                "observed": observed,
                "predicted": [
                    str(multiaddr.Multiaddr(b)) for b in await dcutr._get_observed_addrs()
                ],
            }
            write_json(d / f"{args.role}.json", me)
            if args.role == "a":
                await until((d / "stop").exists, 3600)
                b = ID.from_base58((await wait_file(d / "b.json", 1))["id"])
                say("A's links to B at the end:", conns(host, b))
            else:
                await dial_and_punch(args, host, transport, dcutr, relay_addr, me, d)
            nursery.cancel_scope.cancel()


async def dial_and_punch(args, host, transport, dcutr, relay_addr, me, d: Path) -> None:

    a = await wait_file(d / "a.json", 60)
    a_id = ID.from_base58(a["id"])
    result: dict = {"b": me, "a": a}
    with trio.fail_after(30):
        await transport.dial(multiaddr.Multiaddr(f"{relay_addr}/p2p-circuit/p2p/{a_id}"))
    t0 = time.monotonic()
    result["relayed"] = conns(host, a_id)
    say("B->A via relay:", result["relayed"])
    if not args.no_initiate:
        with trio.fail_after(60):
            result["initiate"] = await dcutr.initiate_hole_punch(a_id)
        say("initiate_hole_punch:", result["initiate"], f"{time.monotonic() - t0:.2f}s")
    await until(lambda: is_direct(host, a_id), args.wait - (time.monotonic() - t0))
    result["direct"] = is_direct(host, a_id)
    result["direct_after_s"] = round(time.monotonic() - t0, 2) if result["direct"] else None
    result["links"] = conns(host, a_id)
    say("direct:", result["direct"], result["direct_after_s"], "links:", result["links"])
    with trio.fail_after(20):
        st = await host.new_stream(a_id, [TProtocol(ECHO)])
        await st.write(b"hello")
        reply = json.loads((await st.read(1 << 16)).decode())
        await st.close()
    result["stream"] = {
        "b_side": [str(x) for x in st.muxed_conn.get_transport_addresses()],
        "a_side": reply["addrs"],
    }
    result["stream_direct"] = all("/p2p-circuit" not in x for x in result["stream"]["b_side"])
    say("stream over:", result["stream"])
    write_json(d / "result.json", result)
    write_json(d / "stop", {})


# ---------------------------------------------------------------- the lab (root namespace)

COUNTERS = """table ip probe {{
  chain pre {{
    type filter hook prerouting priority -300; policy accept;
    iifname "{wan}" tcp flags & (syn|ack) == syn counter comment "syn in"
    iifname "{wan}" tcp flags & (syn|ack) == syn|ack counter comment "synack in"
    iifname "{wan}" tcp flags & rst == rst counter comment "rst in"
  }}
  chain post {{
    type filter hook postrouting priority 300; policy accept;
    oifname "{wan}" tcp flags & (syn|ack) == syn counter comment "syn out"
    oifname "{wan}" tcp flags & (syn|ack) == syn|ack counter comment "synack out"
    oifname "{wan}" tcp flags & rst == rst counter comment "rst out"
  }}
  chain input {{
    type filter hook input priority -10; policy accept;
    iifname "{wan}" tcp flags & (syn|ack) == syn counter comment "syn to router"
  }}
}}
"""


def counters(ns: str) -> dict[str, int]:
    out = json.loads(sh("nft", "-j", "list", "table", "ip", "probe", ns=ns))
    got = {}
    for item in out["nftables"]:
        rule = item.get("rule")
        if rule:
            count = next(e["counter"]["packets"] for e in rule["expr"] if "counter" in e)
            got[rule["comment"]] = count
    return got


def lab_main(args: argparse.Namespace) -> None:
    lab = NatLab(args.nats, drop_unsolicited=args.drop_unsolicited)
    results = []
    try:
        for i, home in enumerate(lab.homes, start=1):
            sh("nft", "-f", "-", ns=home.router, stdin=COUNTERS.format(wan=f"w{i}r{lab.tag}"))
        for n in range(args.tries):
            for home in lab.homes:
                sh("nft", "reset", "counters", "table", "ip", "probe", ns=home.router)
            results.append(one_try(args, lab, n))
            for i, home in enumerate(lab.homes, start=1):
                print(f"    router {i} ({home.nat}):", counters(home.router))
    finally:
        lab.close()
    ok = [r for r in results if r.get("direct")]
    times = [r["direct_after_s"] for r in ok]
    print(f"SUMMARY nats={args.nats} listen_port={args.listen_port} "
          f"drop_unsolicited={args.drop_unsolicited}: direct {len(ok)}/{len(results)}, "
          f"stream direct {sum(bool(r.get('stream_direct')) for r in results)}/{len(results)}, "
          f"times {times}")  # fmt: skip


def one_try(args: argparse.Namespace, lab, n: int) -> dict:
    d = Path(tempfile.mkdtemp(prefix="natprobe"))
    base = [sys.executable, __file__, "--dir", str(d), "--wait", str(args.wait)]
    base += ["--listen-port", str(args.listen_port)] + (
        ["--no-initiate"] if args.no_initiate else []
    )
    procs = {}
    for role, ns in (("relay", lab.public), ("a", lab.homes[0].ns), ("b", lab.homes[1].ns)):
        log = open(d / f"{role}.log", "wb")
        procs[role] = subprocess.Popen(
            ["ip", "netns", "exec", ns, *base, "--role", role], stdout=log, stderr=subprocess.STDOUT
        )
    try:
        procs["b"].wait(timeout=args.wait + 120)
        (d / "stop").write_text("")
        for role in ("a", "relay"):
            procs[role].wait(timeout=20)
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    result = json.loads((d / "result.json").read_text()) if (d / "result.json").exists() else {}
    print(f"try {n}: direct={result.get('direct')} after={result.get('direct_after_s')}s "
          f"initiate={result.get('initiate')} stream_direct={result.get('stream_direct')} "
          f"A predicted={result.get('a', {}).get('predicted')} "
          f"B predicted={result.get('b', {}).get('predicted')} logs={d}")  # fmt: skip
    if not result:
        print((d / "b.log").read_text()[-3000:])
    return result


if __name__ == "__main__":
    ARGS = parse()
    T0 = time.monotonic()
    if ARGS.role:
        logging.basicConfig(
            level=logging.WARNING, format="%(relativeCreated)6d %(name)s %(message)s"
        )
        trio.run(node, ARGS)
    else:
        # a stop by signal still closes the lab (its finally), and with it the namespaces
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
        lab_main(ARGS)
