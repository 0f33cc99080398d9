"""Heavy work in a child process, so the node's event loop never starves.

Generation and recomputation are long stretches of Python and torch; in a thread of the
node's own process they hold the GIL often enough that heartbeats go out late, peers
expire the node and requests to it time out (measured on this 2-core machine). A role
therefore keeps its model in an ``Offload``: a child process (``spawn``) that builds
``handler(spec)`` (a class and its frozen spec dataclass, built from the node's config)
and answers one call at a time over a pipe: ``handler(call)`` with a typed call (one
dataclass per kind of call) returns a typed result. ``async with Offload(BatchMaker,
MakerSpec.of(cfg)) as child:`` waits until it is ready and closes it on exit; the role
awaits ``child.call(MakeBatch(...))`` from trio (the waiting thread blocks in the pipe,
not on the GIL). The child imports the class by its module and qualified name (it must
be defined at the top level of a module). The pipe carries only our own local values
(specs, calls, results) between this process and its child, never anything from the
network. The child exits when the pipe closes, also when the node is killed.
"""

from __future__ import annotations

import importlib
import multiprocessing
import multiprocessing.connection
import os
import signal
from typing import Any

import trio

from node.orphans import die_with_parent


class OffloadError(RuntimeError):
    """The child process failed a call (its error, in one line) or died. ``os_error``: the
    call failed with an ``OSError`` there (a full disk, say); the child still runs."""

    def __init__(self, message: str, *, os_error: bool = False) -> None:
        super().__init__(message)
        self.os_error = os_error


def _failure(exc: Exception) -> tuple[bool, tuple[str, bool]]:
    return False, (f"{type(exc).__name__}: {exc}", isinstance(exc, OSError))


def _resolve(module: str, qualname: str) -> Any:
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def _serve(
    conn: multiprocessing.connection.Connection,
    module: str,
    qualname: str,
    spec: Any,
    threads: int = 0,
    parent: int | None = None,
) -> None:
    # Ctrl-C reaches the whole process group: the node stops us by closing the pipe (a
    # KeyboardInterrupt here printed a child's traceback under the node's last line)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if parent is not None:  # a node killed outright (SIGKILL) takes us with it
        die_with_parent(parent)
    try:
        if threads:
            import torch

            torch.set_num_threads(threads)
        handler = _resolve(module, qualname)(spec)
    except Exception as exc:
        conn.send(_failure(exc))
        return
    conn.send((True, "ready"))
    while True:
        try:
            call = conn.recv()
        except (EOFError, OSError):
            if callable(close := getattr(handler, "close", None)):
                close()  # a handler with processes of its own stops them
            return  # the node is gone
        try:
            reply: Any = (True, handler(call))
        except Exception as exc:
            reply = _failure(exc)
        try:
            conn.send(reply)
        except OSError:  # the node left while we worked
            return


class Offload:
    """``handler(spec)`` in a child process; ``await call(c)`` is ``handler(c)`` there."""

    def __init__(self, handler: type, spec: Any, *, threads: int = 0) -> None:
        """``threads``: torch's intra-op threads in the child (0: torch's default)."""
        if "<locals>" in handler.__qualname__:
            raise TypeError(f"{handler.__qualname__} is not importable by the child process")
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve,
            args=(child, handler.__module__, handler.__qualname__, spec, threads, os.getpid()),
            daemon=True,
        )
        self._proc.start()
        child.close()
        self._lock = trio.Lock()

    @classmethod
    def of(cls, handler: type, spec_type: Any, cfg: Any) -> Offload:
        """``handler(spec_type.of(cfg))`` on the node's ``torch_threads``."""
        return cls(handler, spec_type.of(cfg), threads=cfg.engine.torch_threads)

    def _recv(self) -> Any:
        try:
            ok, value = self._conn.recv()
        except (EOFError, OSError) as exc:
            raise OffloadError(
                f"the worker process died (exit code {self._proc.exitcode})"
            ) from exc
        if not ok:
            message, os_error = value
            raise OffloadError(message, os_error=os_error)
        return value

    def alive(self) -> bool:
        """Whether the child process still runs (a failed call leaves it running)."""
        return self._proc.is_alive()

    async def ready(self) -> None:
        """Wait until the child built its handler (its error if it could not)."""
        async with self._lock:
            await trio.to_thread.run_sync(self._recv, abandon_on_cancel=True)

    async def call(self, call: Any) -> Any:
        """The handler's result for ``call`` (a call dataclass of the handler's)."""

        def roundtrip() -> Any:
            try:
                self._conn.send(call)
            except OSError as exc:  # the pipe is broken: the child is gone
                self._proc.join(1)
                raise OffloadError(
                    f"the worker process died (exit code {self._proc.exitcode})"
                ) from exc
            return self._recv()

        async with self._lock:
            # on cancellation (the node stops) the thread is left to finish: the node is leaving
            return await trio.to_thread.run_sync(roundtrip, abandon_on_cancel=True)

    async def __aenter__(self) -> Offload:
        try:
            await self.ready()
        except BaseException:  # __aexit__ does not run when entering fails
            self.close()
            raise
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._conn.close()
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
