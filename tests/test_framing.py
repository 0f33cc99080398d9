import pytest
import trio
import trio.testing

from protocol.errors import Reason, WireError
from protocol.framing import HEADER, TrioStream, read_frame, write_frame


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
