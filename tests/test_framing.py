import pytest
import trio
import trio.testing

from protocol.errors import Reason, WireError
from protocol.framing import HEADER, FrameReader, TrioStream, read_frame, write_frame


def pair():
    a, b = trio.testing.memory_stream_pair()
    return TrioStream(a), TrioStream(b), a, b


async def test_roundtrip_several_frames():
    a, b, _, _ = pair()
    async with trio.open_nursery() as n:
        n.start_soon(write_frame, a, b"hello", 1)
        assert await read_frame(b, 100, 1) == b"hello"
        n.start_soon(write_frame, a, b"", 1)
        assert await read_frame(b, 100, 1) == b""
        big = bytes(range(256)) * 1000
        n.start_soon(write_frame, a, big, 1)
        assert await read_frame(b, len(big), 1) == big


async def test_oversized_length_prefix_rejected_before_reading_body():
    a, b, raw_a, _ = pair()
    await raw_a.send_all(HEADER.pack(2**32 - 1))
    with pytest.raises(WireError) as exc:
        await read_frame(b, 1024, 1)
    assert exc.value.reason == Reason.OVERSIZED


async def test_truncated_frame():
    a, b, raw_a, _ = pair()
    await raw_a.send_all(HEADER.pack(10) + b"abc")
    await raw_a.aclose()
    with pytest.raises(WireError) as exc:
        await read_frame(b, 1024, 1)
    assert exc.value.reason == Reason.TRUNCATED


async def test_truncated_header():
    a, b, raw_a, _ = pair()
    await raw_a.send_all(b"\x00\x00")
    await raw_a.aclose()
    with pytest.raises(WireError) as exc:
        await read_frame(b, 1024, 1)
    assert exc.value.reason == Reason.TRUNCATED


async def test_clean_close_between_frames_is_eof():
    a, b, raw_a, _ = pair()
    await raw_a.aclose()
    with pytest.raises(EOFError):
        await read_frame(b, 1024, 1)


async def test_frozen_peer_times_out_at_the_deadline(autojump_clock):
    a, b, raw_a, _ = pair()
    await raw_a.send_all(HEADER.pack(10) + b"abc")  # then nothing: a frozen peer
    start = trio.current_time()
    with pytest.raises(WireError) as exc:
        await read_frame(b, 1024, deadline=7.5)
    assert exc.value.reason == Reason.TIMEOUT
    assert trio.current_time() - start == pytest.approx(7.5)


async def test_stalled_reader_does_not_block_writer_forever(autojump_clock):
    a, b = trio.testing.lockstep_stream_pair()
    with pytest.raises(WireError) as exc:
        await write_frame(TrioStream(a), b"x" * 100, deadline=3)
    assert exc.value.reason == Reason.TIMEOUT


class Chunked:
    """A ByteStream that returns a fixed byte string in chunks of the given sizes."""

    def __init__(self, data, sizes):
        self.data = data
        self.sizes = sizes
        self.pos = 0
        self.i = 0

    async def read(self, n=None):
        await trio.lowlevel.checkpoint()
        size = min(n, self.sizes[self.i % len(self.sizes)])
        self.i += 1
        out = self.data[self.pos : self.pos + size]
        self.pos += len(out)
        return out

    async def write(self, data):
        raise AssertionError("read-only")


def encode(*bodies):
    return b"".join(HEADER.pack(len(b)) + b for b in bodies)


async def test_frame_reader_any_chunking_gives_the_same_frames(autojump_clock):
    # on the mock clock: 5,000 one-byte reads may take more than the 1 s deadline of real
    # time on a loaded machine, and the deadline is not what this test is about
    import random

    rng = random.Random(3)
    bodies = [rng.randbytes(rng.choice([0, 1, 5, 100, 5000])) for _ in range(40)]
    data = encode(*bodies)
    for sizes in ([1], [3, 7], [4096], [len(data)], [rng.randint(1, 300) for _ in range(50)]):
        reader = FrameReader(Chunked(data, sizes))
        got = [await reader.read_frame(10_000, 1) for _ in bodies]
        assert got == bodies
        with pytest.raises(EOFError):
            await reader.read_frame(10_000, 1)


async def test_frame_reader_into_reuses_the_buffer_and_enforces_its_size():
    data = encode(b"abc", b"defgh", b"x" * 20)
    reader = FrameReader(Chunked(data, [2]))
    buf = bytearray(8)
    assert bytes(await reader.read_frame_into(buf, 1)) == b"abc"
    view = await reader.read_frame_into(buf, 1)
    assert bytes(view) == b"defgh"
    assert view.obj is buf
    with pytest.raises(WireError) as exc:
        await reader.read_frame_into(buf, 1)
    assert exc.value.reason == Reason.OVERSIZED


async def test_frame_reader_truncation_inside_a_later_frame():
    data = encode(b"first", b"second")[:-2]
    reader = FrameReader(Chunked(data, [5]))
    assert await reader.read_frame(100, 1) == b"first"
    with pytest.raises(WireError) as exc:
        await reader.read_frame(100, 1)
    assert exc.value.reason == Reason.TRUNCATED


async def test_the_header_is_a_big_endian_u32_byte_for_byte():
    """SPEC §6: four bytes, big-endian, then the body. The other tests build their headers
    with ``HEADER`` itself, so only literal bytes pin the order."""
    a, _, _, raw_b = pair()
    await write_frame(a, b"hello", 1)
    assert await raw_b.receive_some() == b"\x00\x00\x00\x05hello"
    body = bytes(range(256)) + b"\x01"
    await write_frame(a, body, 1)
    sent = b""
    while len(sent) < 4 + len(body):
        sent += await raw_b.receive_some()
    assert sent[:4] == b"\x00\x00\x01\x01", f"header {sent[:4].hex()} for 257 bytes"
    _, b, raw_a, _ = pair()
    await raw_a.send_all(b"\x00\x00\x01\x00" + bytes(256))  # little-endian: 65,536 bytes
    assert await read_frame(b, 1 << 20, 1) == bytes(256)
    assert HEADER.size == 4 and HEADER.pack(0x01020304) == b"\x01\x02\x03\x04"
