"""A home behind a real NAT, built with Linux network namespaces (root only).

    public (203.0.113.1) ── (203.0.113.2) router (198.18.0.1) ── home (198.18.0.2)

The router masquerades the home network behind its public address with nftables; the public
namespace has no route to 198.18.0.0/24, so a node at home can dial out but nobody can dial
it. Addresses are from the documentation and benchmarking ranges and live only inside the
namespaces: nothing leaves them. ``nat_reason()`` says why a machine cannot build this."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.cli.devnet import REPO_ROOT, NodeProcess
from node.net.adminfile import read_admin_file

PUBLIC_IP, WAN_IP, LAN_GW, HOME_IP = "203.0.113.1", "203.0.113.2", "198.18.0.1", "198.18.0.2"


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


class HomeNat:
    """The three namespaces and their links; ``close`` removes them."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.public, self.router, self.home = f"pub{tag}", f"rtr{tag}", f"home{tag}"
        self.made: list[str] = []
        try:
            self._build(tag)
        except BaseException:
            self.close()
            raise

    def _build(self, tag: str) -> None:
        for ns in (self.public, self.router, self.home):
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
            sh("ip", "link", "set", "lo", "up", ns=ns)
        self._link(f"w{tag}a", self.public, PUBLIC_IP, f"w{tag}b", self.router, WAN_IP)
        self._link(f"l{tag}a", self.home, HOME_IP, f"l{tag}b", self.router, LAN_GW)
        sh("ip", "route", "add", "default", "via", LAN_GW, ns=self.home)
        sh("sysctl", "-q", "-w", "net.ipv4.ip_forward=1", ns=self.router)
        wan = f"w{tag}b"
        sh(
            "nft",
            "-f",
            "-",
            ns=self.router,
            stdin=(
                "table ip nat {\n"
                "  chain postrouting {\n"
                "    type nat hook postrouting priority srcnat; policy accept;\n"
                f'    oifname "{wan}" masquerade\n'
                "  }\n"
                "}\n"
            ),
        )

    def _link(self, a: str, ns_a: str, ip_a: str, b: str, ns_b: str, ip_b: str) -> None:
        sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        for dev, ns, ip in ((a, ns_a, ip_a), (b, ns_b, ip_b)):
            sh("ip", "link", "set", dev, "netns", ns)
            sh("ip", "addr", "add", f"{ip}/24", "dev", dev, ns=ns)
            sh("ip", "link", "set", dev, "up", ns=ns)

    def close(self) -> None:
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.made.clear()


@dataclass
class NsNode(NodeProcess):
    """A node process inside a namespace; its status read from inside it too (the admin
    endpoint listens on that namespace's 127.0.0.1). ``wait_ready`` and ``stop`` are the
    devnet's, as for any node process."""

    ns: str

    @classmethod
    def start(
        cls, ns: str, name: str, base: Path, role: str, listen_ip: str, args: list[str]
    ) -> NsNode:
        data_dir = base / name
        data_dir.mkdir(parents=True, exist_ok=True)
        log_path = data_dir / "node.log"
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "node.cli", "start"]
        cmd += ["--role", role, "--data-dir", str(data_dir), "--run-id", "nat-run"]
        cmd += ["--listen", f"/ip4/{listen_ip}/tcp/0", *args]
        env = dict(os.environ, PYTHONUNBUFFERED="1", INTELLECT_NODE_NETWORK_ONLY="true")
        env["INTELLECT_NODE_PRESENCE_RATE"] = "1000"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT
            )
        return cls(name, role, data_dir, proc, log_path, ns)

    def status(self, timeout: float = 5) -> dict[str, Any] | None:
        try:
            port = read_admin_file(self.data_dir)["port"]
        except Exception:  # not written yet
            return None
        code = "import sys,urllib.request;print(urllib.request.urlopen(sys.argv[1],timeout=float(sys.argv[2])).read().decode())"
        res = subprocess.run(
            ["ip", "netns", "exec", self.ns, sys.executable, "-S", "-c", code,
             f"http://127.0.0.1:{port}/status", str(timeout)],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        return json.loads(res.stdout) if res.returncode == 0 else None
