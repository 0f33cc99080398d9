"""The trainer's policy across several processes: ``torchrun`` ranks driven by the role.

With ``[trainer] procs`` > 1 the trainer role's child process (``node/roles/children/offload.py``) holds
a ``RankedPolicyWorker`` (built from a ``RanksSpec``) instead of a ``PolicyWorker``
(``node/training/worker.py``). It launches

    torchrun --standalone --nproc-per-node N -m node.training.ranks POLICY_SPEC_JSON

and forwards each call of the role to rank 0 over a local connection (127.0.0.1, a random
port, authenticated with a one-time key passed in the environment). Rank 0 broadcasts the
call to every rank (``torch.distributed.broadcast_object_list``) and every rank runs the
same ``PolicyWorker`` on its FSDP2 shard of the policy (``node/training/policy.py``):
``TrainStep`` is collective (each rank trains on every N-th sample, gradients are averaged,
rank 0 writes the checkpoint and the optimizer state), ``Evaluate`` (the held-out set, on the
checkpoint directory rank 0 wrote) runs on rank 0 alone. Rank 0 sends the result back. A
DiLoCo member's ranks hold its worker instead (``GroupPolicyWorker``,
``node/roles/children/grouppolicy.py``, or ``PretrainWorker``, ``node/roles/children/pretrainpolicy.py``),
whose calls are all collective but ``Evaluate``.

The process group is gloo on the CPU and NCCL with ``[trainer] device`` cuda (rank r on GPU r
of this machine); their sockets are kept on the loopback interface. When the role's child
exits, also when the node is killed, the connection closes; rank 0 then broadcasts a stop
and every rank exits, and torchrun with them (torchrun also gets SIGTERM when the role's
child dies, and is stopped as a process group when it closes). A rank whose collective
call fails (building the policy, a training step) reports the error (rank 0) and exits at
once: the others may be waiting inside a collective, and torchrun stops them when one
fails. The role's call then fails with that error, or with "the training ranks are gone",
instead of waiting. The held-out evaluation runs on rank 0 alone; its error is only
reported. Not closed here: torchrun's rendezvous store listens on every interface (a
random port) while the ranks start.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import secrets
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Any, NoReturn, Protocol

from node.orphans import parent_death_signal
from node.training.worker import Evaluate, PolicyWorker

ADDR_ENV = "INTELLECT_RANKS_ADDR"
KEY_ENV = "INTELLECT_RANKS_KEY"
START_TIMEOUT = 600.0  # seconds for torchrun to start, rank 0 to connect, every rank to build
CHALLENGE_TIMEOUT = 10.0  # seconds a connecting process has to answer our key challenge
GROUP_TIMEOUT = timedelta(days=7)  # ranks wait in a broadcast while the role waits for batches
STOP = None  # rank 0 broadcasts it when the role's process is gone
LOCAL = (Evaluate,)  # calls rank 0 runs alone; every other call is collective


def _send(conn: Connection, obj: Any) -> None:
    """Plain pickle, not ``Connection.send``'s: that one passes a torch tensor as a handle
    to this process's shared memory, which rank 0 and the role's child (not parent and
    child) cannot open; pickle copies its values."""
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())  # noqa: S301 - our own ranks, key-authenticated


def torchrun_command(procs: int) -> list[str]:
    """``torchrun`` next to this interpreter, else ``python -m torch.distributed.run``."""
    beside = Path(sys.executable).with_name("torchrun")
    launcher = [str(beside)] if beside.exists() else [sys.executable, "-m", "torch.distributed.run"]
    return [*launcher, "--standalone", "--nproc-per-node", str(procs)]


class RankWorker(Protocol):
    """A worker class the ranks can run: it names the calls it takes."""

    CALLS: tuple[type, ...]

    def __init__(self, spec: Any, *, distributed: bool = False) -> None: ...


@dataclass(frozen=True)
class RanksSpec:
    """``procs`` torchrun ranks, each with a ``worker`` built from ``policy`` (sharded:
    ``worker(policy, distributed=True)``): a ``PolicyWorker`` from a ``PolicySpec``, or a
    DiLoCo member's ``GroupPolicyWorker`` / ``PretrainWorker`` from its ``GroupSpec`` /
    ``PretrainSpec``. ``policy.device``: cpu, or cuda with rank r on GPU r. The worker class
    names its spec class (``SPEC``, with ``from_dict``) and the calls it takes (``CALLS``)."""

    procs: int
    policy: Any  # the worker's spec (PolicySpec, GroupSpec, PretrainSpec)
    worker: type[RankWorker] = PolicyWorker

    def argument(self) -> str:
        """The ranks' command-line argument, readable in ``ps``: the worker class (module
        and name, as a spawned child gets its target) and its spec as JSON."""
        worker = f"{self.worker.__module__}:{self.worker.__qualname__}"
        return json.dumps({"worker": worker, "spec": asdict(self.policy)})


def _build_worker(argument: str) -> tuple[Any, str]:
    """On a rank: a function that builds the sharded worker ``RanksSpec.argument`` names,
    and its device."""
    named = json.loads(argument)
    module, name = named["worker"].split(":")
    worker = getattr(importlib.import_module(module), name)
    spec = worker.SPEC.from_dict(named["spec"])
    return lambda: worker(spec, distributed=True), spec.device


class RankedPolicyWorker:
    """``PolicyWorker``'s interface (``TrainStep``, ``Evaluate``) over torchrun ranks."""

    def __init__(self, spec: RanksSpec) -> None:
        procs, device = spec.procs, spec.policy.device
        self.calls: tuple[type, ...] = spec.worker.CALLS
        if procs < 2:
            raise ValueError("RankedPolicyWorker is for 2 or more processes")
        key = secrets.token_bytes(32)
        server = socket.create_server(("127.0.0.1", 0))
        server.settimeout(1.0)
        host, port = server.getsockname()[:2]
        root = str(Path(__file__).resolve().parent.parent.parent)
        env = {
            **os.environ,
            ADDR_ENV: f"{host}:{port}",
            KEY_ENV: key.hex(),
            "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
        }
        if device == "cpu":
            env.setdefault("OMP_NUM_THREADS", "1")  # N ranks share this machine's cores
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the ranks talk over the loopback only
        env.setdefault("NCCL_SOCKET_IFNAME", "lo")
        self.proc = subprocess.Popen(
            [
                *torchrun_command(procs),
                "-m",
                "node.training.ranks",
                spec.argument(),
            ],
            env=env,  # the node's working directory: relative paths mean the same there
            start_new_session=True,  # close() stops torchrun and every rank as one group
            preexec_fn=parent_death_signal(),
        )
        self.conn: Connection | None = None
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while self.conn is None:
                self._still_starting(deadline, "rank 0 did not connect")
                try:
                    sock, _ = server.accept()
                except TimeoutError:
                    continue
                sock.settimeout(None)
                wait = struct.pack("ll", int(CHALLENGE_TIMEOUT), 0)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, wait)
                conn = Connection(sock.detach())
                try:
                    deliver_challenge(conn, key)
                except Exception:
                    conn.close()  # not our rank 0, or silent
                    continue
                fd = socket.socket(fileno=conn.fileno())
                fd.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, 0))
                fd.detach()  # the connection keeps the descriptor
                self.conn = conn
            while not self.conn.poll(1.0):  # every rank builds its PolicyWorker
                self._still_starting(deadline, "the ranks were not ready")
            ok, detail = _recv(self.conn)
            if not ok:
                raise RuntimeError(detail)
        except BaseException:
            self.close()
            raise
        finally:
            server.close()

    def _still_starting(self, deadline: float, late: str) -> None:
        """Raise if torchrun has exited, or ``late`` once ``deadline`` has passed."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"torchrun exited with status {self.proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{late} within {START_TIMEOUT:.0f} s")

    def __call__(self, call: Any) -> Any:
        if self.conn is None:
            raise RuntimeError("the ranks are closed")
        if not isinstance(call, self.calls):
            raise TypeError(f"RankedPolicyWorker does not take {type(call).__name__}")
        try:
            _send(self.conn, call)
            ok, value = _recv(self.conn)
        except (EOFError, OSError) as exc:
            status = self.proc.poll()
            raise RuntimeError(f"the training ranks are gone (torchrun status {status})") from exc
        if not ok:
            raise RuntimeError(value)
        return value

    def close(self, grace: float = 30.0) -> None:
        """Stop every rank (a closed connection is a stop) and wait for torchrun."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.proc.wait()
        self._signal_group(signal.SIGKILL)  # a rank that outlived torchrun

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def __del__(self) -> None:
        if getattr(self, "proc", None) is not None and self.proc.poll() is None:
            self.close(grace=5.0)


def _connect_to_role() -> Connection:
    host, port = os.environ[ADDR_ENV].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.settimeout(None)
    conn = Connection(sock.detach())
    answer_challenge(conn, bytes.fromhex(os.environ[KEY_ENV]))
    return conn


def main(argv: list[str] | None = None) -> int:
    """One rank, under torchrun: build the worker, then run what rank 0 broadcasts."""
    import torch
    import torch.distributed as dist

    build, device = _build_worker((argv or sys.argv[1:])[0])
    if device.startswith("cuda"):
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(
        backend="nccl" if device.startswith("cuda") else "gloo", timeout=GROUP_TIMEOUT
    )
    rank = dist.get_rank()
    conn = _connect_to_role() if rank == 0 else None

    def fail(detail: str) -> NoReturn:
        """Report (rank 0) and leave now: other ranks may wait inside a collective, and
        torchrun stops them once one rank has failed."""
        if conn is not None:
            try:
                _send(conn, (False, detail))
            except OSError:
                pass
        os._exit(1)

    try:
        worker = build()
    except Exception as exc:
        fail(f"rank {rank}: {type(exc).__name__}: {exc}")
    dist.barrier()  # every rank built its worker
    if conn is not None:
        _send(conn, (True, "ready"))
    try:
        while True:
            box: list[Any] = [None]
            if conn is not None:
                try:
                    box[0] = _recv(conn)
                except (EOFError, OSError):
                    box[0] = STOP  # the role's process is gone
            dist.broadcast_object_list(box, src=0)
            call = box[0]
            if call is STOP:
                break
            collective = not isinstance(call, LOCAL)
            if not collective and rank != 0:
                continue
            try:
                result: tuple[bool, Any] = (True, worker(call))
            except Exception as exc:
                detail = f"rank {rank}: {type(exc).__name__}: {exc}"
                if collective:
                    fail(detail)
                result = (False, detail)
            if conn is not None:
                try:
                    _send(conn, result)
                except OSError:
                    pass  # the role's process is gone: the next receive fails, a stop
    finally:
        if conn is not None:
            conn.close()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
