"""Length-prefixed frames on a byte stream, every read under a deadline.

Frame = 4-byte big-endian length, then that many bytes. The reader checks the length
against the caller's maximum before reading (or allocating) the body, and a stream that
ends inside a frame is ``truncated``, never a short message. A peer that stops sending
makes the read fail with reason ``timeout`` after ``deadline`` seconds instead of hanging.

Works on any object with ``async read(n) -> bytes`` and ``async write(data)`` (a
py-libp2p stream); ``TrioStream`` adapts a ``trio.abc.Stream`` for tests and raw TCP.
"""

from __future__ import annotations

import struct
from typing import Protocol

import trio

from protocol.errors import Reason, WireError

HEADER = struct.Struct(">I")
MAX_FRAME = 2**32 - 1


class ByteStream(Protocol):
    async def read(self, n: int | None = None) -> bytes: ...

    async def write(self, data: bytes) -> None: ...


class TrioStream:
    """A ``ByteStream`` over a ``trio.abc.Stream``."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream

    async def read(self, n: int | None = None) -> bytes:
        return await self.stream.receive_some(n)

    async def write(self, data: bytes) -> None:
        await self.stream.send_all(data)


async def _read_exactly(stream: ByteStream, n: int, *, at_start: bool) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = await stream.read(n - len(buf))
        except EOFError:
            chunk = b""
        if not chunk:
            if at_start and not buf:
                raise EOFError("stream closed between frames")
            raise WireError(Reason.TRUNCATED, f"stream ended after {len(buf)} of {n} bytes")
        buf += chunk
        at_start = False
    return bytes(buf)


async def read_frame(stream: ByteStream, max_size: int, deadline: float) -> bytes:
    """Read one frame of at most ``max_size`` bytes within ``deadline`` seconds.

    Raises ``EOFError`` if the stream closed cleanly before a frame began, and
    ``WireError`` (oversized, truncated, timeout) otherwise.
    """
    try:
        with trio.fail_after(deadline):
            (length,) = HEADER.unpack(await _read_exactly(stream, HEADER.size, at_start=True))
            if length > max_size:
                raise WireError(Reason.OVERSIZED, f"frame of {length} bytes > {max_size}")
            return await _read_exactly(stream, length, at_start=False)
    except trio.TooSlowError as exc:
        raise WireError(Reason.TIMEOUT, f"no complete frame within {deadline} s") from exc


async def write_frame(stream: ByteStream, body: bytes, deadline: float) -> None:
    """Write one frame within ``deadline`` seconds (a stalled reader cannot block us)."""
    if len(body) > MAX_FRAME:
        raise WireError(Reason.OVERSIZED, f"frame of {len(body)} bytes cannot be encoded")
    try:
        with trio.fail_after(deadline):
            await stream.write(HEADER.pack(len(body)) + body)
    except trio.TooSlowError as exc:
        raise WireError(Reason.TIMEOUT, f"write not accepted within {deadline} s") from exc
