"""Homes behind real NATs, built with Linux network namespaces (root only).

    public (203.0.113.1, a bridge) ─┬─ (203.0.113.2) router 1 (198.18.1.1) ── home 1 (198.18.1.2)
                                    ├─ (203.0.113.3) router 2 (198.18.2.1) ── home 2 (198.18.2.2)
                                    └─ ...

Each router masquerades its home network behind its public address with nftables: a
``cone`` router keeps a connection's source port where it can (Linux's plain
``masquerade``), so a node at home is seen from outside at WAN_IP:its_port and TCP hole
punching can predict it; a ``random`` router maps every connection to a random port
(``masquerade random``), as symmetric NATs do, which defeats that prediction. Neither the
public namespace nor any other home has a route to a home's network, so a node at home can
dial out but nobody can dial it. Addresses are from the documentation and benchmarking
ranges and live only inside the namespaces: nothing leaves them. ``nat_reason()`` says why a
machine cannot build this.

A connection attempt from outside that no mapping expects reaches the router itself. Linux
answers it with a reset, and the reset also ends the mapping that the dialer's own router had
just made: two homes punching a TCP hole then each refuse the other's SYN unless both SYNs
cross in flight (here, within microseconds). Most home routers drop such attempts silently
instead; ``drop_unsolicited=True`` builds routers that do, and only there can TCP hole
punching succeed in this lab (measured with py-libp2p hosts: cone-cone 0 of 5 with
resets, 8 of 8 with drops; SPEC §17)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.cli.devnet import REPO_ROOT, NodeProcess, wait_ready
from node.net.adminfile import read_admin_file

PUBLIC_IP = "203.0.113.1"
# the first home's addresses, as HomeNat builds it
WAN_IP, HOME_IP = "203.0.113.2", "198.18.1.2"
NATS = {"cone": "masquerade", "random": "masquerade random"}
_LABS = itertools.count()


def nat_reason() -> str | None:
    """Why namespaces with a NAT cannot be built here, or None if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (scripts/setup.sh installs it)"
    probe = f"inprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def sh(*cmd: str, ns: str | None = None, stdin: str | None = None) -> str:
    full = ["ip", "netns", "exec", ns, *cmd] if ns else list(cmd)
    res = subprocess.run(full, input=stdin, capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(full)}: {res.stderr.strip()}")
    return res.stdout


@dataclass(frozen=True)
class Home:
    """One home network: its namespace, its router's, their addresses and the NAT kind."""

    ns: str
    router: str
    ip: str
    gateway: str
    wan_ip: str
    nat: str


class NatLab:
    """The public namespace and one home per entry of ``nats`` ("cone" or "random"), each
    router dropping unsolicited inbound SYNs or answering them with a reset;
    ``close`` removes them all, and so does a build that fails half way. Names carry the pid
    and a per-process count, so labs of several processes, or several of one, never meet."""

    def __init__(self, nats: Sequence[str], *, drop_unsolicited: bool = False) -> None:
        if not nats or any(n not in NATS for n in nats):
            raise ValueError(f"each home's NAT must be one of {sorted(NATS)}: {nats}")
        self.tag = f"{os.getpid()}n{next(_LABS)}"
        self.public = f"pub{self.tag}"
        self.homes = [
            Home(
                f"home{i}_{self.tag}",
                f"rtr{i}_{self.tag}",
                f"198.18.{i}.2",
                f"198.18.{i}.1",
                f"203.0.113.{i + 1}",
                nat,
            )
            for i, nat in enumerate(nats, start=1)
        ]
        self.drop_unsolicited = drop_unsolicited
        self.made: list[str] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        self._add_ns(self.public)
        bridge = f"br{self.tag}"  # interface names: at most 15 characters
        sh("ip", "link", "add", bridge, "type", "bridge", ns=self.public)
        sh("ip", "addr", "add", f"{PUBLIC_IP}/24", "dev", bridge, ns=self.public)
        sh("ip", "link", "set", bridge, "up", ns=self.public)
        for i, home in enumerate(self.homes, start=1):
            self._add_ns(home.router)
            self._add_ns(home.ns)
            wan, port = f"w{i}r{self.tag}", f"w{i}p{self.tag}"
            self._veth(wan, home.router, port, self.public)
            sh("ip", "link", "set", port, "master", bridge, "up", ns=self.public)
            self._address(wan, home.router, f"{home.wan_ip}/24")
            lan, inside = f"l{i}r{self.tag}", f"l{i}h{self.tag}"
            self._veth(lan, home.router, inside, home.ns)
            self._address(lan, home.router, f"{home.gateway}/24")
            self._address(inside, home.ns, f"{home.ip}/24")
            sh("ip", "route", "add", "default", "via", home.gateway, ns=home.ns)
            sh("sysctl", "-q", "-w", "net.ipv4.ip_forward=1", ns=home.router)
            sh("nft", "-f", "-", ns=home.router, stdin=self._ruleset(wan, home.nat))

    def _ruleset(self, wan: str, nat: str) -> str:
        drop = (
            "  chain input {\n"
            "    type filter hook input priority filter; policy accept;\n"
            f'    iifname "{wan}" ct state new drop\n'
            "  }\n"
        )
        return (
            "table ip nat {\n"
            "  chain postrouting {\n"
            "    type nat hook postrouting priority srcnat; policy accept;\n"
            f'    oifname "{wan}" {NATS[nat]}\n'
            "  }\n"
            f"{drop if self.drop_unsolicited else ''}"
            "}\n"
        )

    def _add_ns(self, ns: str) -> None:
        sh("ip", "netns", "add", ns)
        self.made.append(ns)
        sh("ip", "link", "set", "lo", "up", ns=ns)

    @staticmethod
    def _veth(a: str, ns_a: str, b: str, ns_b: str) -> None:
        """A veth pair made with its ends already in their namespaces: nothing is left in
        the root namespace if the build stops half way."""
        sh("ip", "link", "add", a, "netns", ns_a, "type", "veth", "peer", "name", b, "netns", ns_b)

    @staticmethod
    def _address(dev: str, ns: str, cidr: str) -> None:
        sh("ip", "addr", "add", cidr, "dev", dev, ns=ns)
        sh("ip", "link", "set", dev, "up", ns=ns)

    def close(self) -> None:
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.made.clear()


class HomeNat(NatLab):
    """One home behind a cone NAT: ``public``, ``router`` and ``home`` name the namespaces."""

    def __init__(self) -> None:
        super().__init__(["cone"])
        self.router, self.home = self.homes[0].router, self.homes[0].ns


@dataclass
class NsNode(NodeProcess):
    """A node process inside a namespace; its status read from inside it too (the admin
    endpoint listens on that namespace's 127.0.0.1). ``wait_ready`` and ``stop`` are the
    devnet's, as for any node process."""

    ns: str

    @classmethod
    def start(
        cls,
        ns: str,
        name: str,
        base: Path,
        role: str,
        listen_ip: str,
        args: list[str],
        *,
        network_only: bool = True,
        env: dict[str, str] | None = None,
    ) -> NsNode:
        """``network_only``: no ledger, no model, no work (the network tests); otherwise
        ``env`` carries the run's ledger, model and work settings, as the devnet's."""
        data_dir = base / name
        data_dir.mkdir(parents=True, exist_ok=True)
        log_path = data_dir / "node.log"
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "node.cli", "start"]
        cmd += ["--role", role, "--data-dir", str(data_dir), "--run-id", "nat-run"]
        cmd += ["--listen", f"/ip4/{listen_ip}/tcp/0", *args]
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        full_env["INTELLECT_NODE_NETWORK_ONLY"] = "true" if network_only else "false"
        full_env["INTELLECT_NODE_NET__PRESENCE_RATE"] = "1000"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=REPO_ROOT
            )
        return cls(name, role, data_dir, proc, log_path, ns)

    def status(self, timeout: float = 5) -> dict[str, Any] | None:
        return self.get("/status", timeout)

    def get(self, path: str, timeout: float = 5) -> Any:
        """A GET of the admin endpoint (``/status``, ``/weights``), or None while it does
        not answer."""
        try:
            port = read_admin_file(self.data_dir)["port"]
        except Exception:  # not written yet
            return None
        code = "import sys,urllib.request;print(urllib.request.urlopen(sys.argv[1],timeout=float(sys.argv[2])).read().decode())"
        res = subprocess.run(
            ["ip", "netns", "exec", self.ns, sys.executable, "-S", "-c", code,
             f"http://127.0.0.1:{port}{path}", str(timeout)],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        return json.loads(res.stdout) if res.returncode == 0 else None


def joining(boot: NsNode, flags: list[str]) -> list[str]:
    """Once the bootstrap ``boot`` (in the public namespace) is ready: the arguments that
    join a node to the network through it (``--bootstrap`` at its public address), then
    ``flags``."""
    st = wait_ready(boot, 120)
    addr = next(a for a in st["addrs"] if f"/ip4/{PUBLIC_IP}/" in a)
    return ["--bootstrap", f"{addr}/p2p/{st['peer_id']}", *flags]
