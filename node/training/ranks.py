"""The trainer's policy across several processes: ``torchrun`` ranks driven by the role.

With ``train_procs`` > 1 the trainer role's child process (``node/roles/offload.py``) holds
a ``RankedPolicyWorker`` instead of a ``PolicyWorker``. It launches

    torchrun --standalone --nproc-per-node N -m node.training.ranks ARGS

and forwards each call of the role to rank 0 over a local connection (127.0.0.1, a random
port, authenticated with a one-time key passed in the environment). Rank 0 broadcasts the
call to every rank (``torch.distributed.broadcast_object_list``) and every rank runs the
same ``PolicyWorker`` on its FSDP2 shard of the policy (``node/training/policy.py``):
``train`` is collective (each rank trains on every N-th sample, gradients are averaged,
rank 0 writes the checkpoint and the optimizer state), ``eval`` (the held-out set, on the
checkpoint directory rank 0 wrote) runs on rank 0 alone. Rank 0 sends the result back.

The process group is gloo on the CPU and NCCL with ``train_device`` cuda (rank r on GPU r
of this machine). When the role's child exits, also when the node is killed, the
connection closes; rank 0 then broadcasts a stop and every rank exits, and torchrun with
them. A rank that fails makes torchrun stop the others, which closes the connection: the
role's call fails with the error instead of waiting.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from datetime import timedelta
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Any

ADDR_ENV = "INTELLECT_RANKS_ADDR"
KEY_ENV = "INTELLECT_RANKS_KEY"
START_TIMEOUT = 600.0  # seconds for torchrun to start and rank 0 to connect
GROUP_TIMEOUT = timedelta(days=7)  # ranks wait in a broadcast while the role waits for batches
STOP = ("stop",)


def torchrun_command(procs: int) -> list[str]:
    """``torchrun`` next to this interpreter, else ``python -m torch.distributed.run``."""
    beside = Path(sys.executable).with_name("torchrun")
    launcher = [str(beside)] if beside.exists() else [sys.executable, "-m", "torch.distributed.run"]
    return [*launcher, "--standalone", "--nproc-per-node", str(procs)]


class RankedPolicyWorker:
    """``PolicyWorker``'s interface (``("train", step, envelopes)``, ``("eval", dir)``)
    over ``procs`` torchrun ranks. ``worker_args`` are ``PolicyWorker``'s arguments."""

    def __init__(self, procs: int, device: str, *worker_args: Any) -> None:
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
        self.proc = subprocess.Popen(
            [
                *torchrun_command(procs),
                "-m",
                "node.training.ranks",
                json.dumps([device, *worker_args]),
            ],
            env=env,
            cwd=root,
        )
        self.conn: Connection | None = None
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while self.conn is None:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"torchrun exited with status {self.proc.returncode}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"rank 0 did not connect within {START_TIMEOUT:.0f} s")
                try:
                    sock, _ = server.accept()
                except TimeoutError:
                    continue
                sock.settimeout(None)
                conn = Connection(sock.detach())
                try:
                    deliver_challenge(conn, key)
                except Exception:
                    conn.close()  # not our rank 0
                    continue
                self.conn = conn
            ok, detail = self.conn.recv()  # every rank built its PolicyWorker, or why not
            if not ok:
                raise RuntimeError(detail)
        except BaseException:
            self.close()
            raise
        finally:
            server.close()

    def __call__(self, op: str, *args: Any) -> Any:
        if self.conn is None:
            raise RuntimeError("the ranks are closed")
        try:
            self.conn.send((op, *args))
            ok, value = self.conn.recv()
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
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

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

    from node.roles.trainer import PolicyWorker

    device, *worker_args = json.loads((argv or sys.argv[1:])[0])
    if device.startswith("cuda"):
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(
        backend="nccl" if device.startswith("cuda") else "gloo", timeout=GROUP_TIMEOUT
    )
    rank = dist.get_rank()
    conn = _connect_to_role() if rank == 0 else None
    worker: PolicyWorker | None = None
    built: tuple[bool, str] = (True, "ready")
    try:
        worker = PolicyWorker(*worker_args, device=device, distributed=True)
    except Exception as exc:
        built = (False, f"rank {rank}: {type(exc).__name__}: {exc}")
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, built)
    failed = [detail for ok, detail in everyone if not ok]
    if conn is not None:
        conn.send((False, "; ".join(failed)) if failed else (True, "ready"))
    try:
        while worker is not None and not failed:
            box: list[Any] = [None]
            if conn is not None:
                try:
                    box[0] = conn.recv()
                except (EOFError, OSError):
                    box[0] = STOP  # the role's process is gone
            dist.broadcast_object_list(box, src=0)
            call = tuple(box[0])
            if call == STOP:
                break
            if call[0] == "eval" and rank != 0:
                continue
            try:
                result: tuple[bool, Any] = (True, worker(*call))
            except Exception as exc:
                result = (False, f"rank {rank}: {type(exc).__name__}: {exc}")
            if conn is not None:
                conn.send(result)
    finally:
        if conn is not None:
            conn.close()
        dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
