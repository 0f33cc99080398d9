"""Outside peers that hold a worker's batch upload slots, as one process (issue #54):

    python -m tests.helpers.hogs --worker ADDR/p2p/PEER --key HEX --dir D [--peers 8] ...

``--peers`` real nodes (``node.net.runtime.Node``, each its own peer key; no chain account,
no voucher: strangers to the run) connect to the worker and keep every upload slot they can:
each of a peer's ``--lanes`` (the worker's per-peer cap of batch streams) asks for the batch
``--key`` (one the worker holds), reads the reply header and never a byte of the batch.
The header is read to its last byte and no further: yamux lets the worker write one
256 KiB window past what its reader took, so a batch larger than that stalls the upload
and holds its slot until the worker's write deadline ends it. A lane watches its stream's
state (the worker's close or reset, seen by yamux; nothing is read) and asks again the
moment the upload ends (at most ``--hold`` seconds later); a refused lane asks again after
``--retry`` seconds (a freed slot is taken within tens of milliseconds, and the peer stays
far below the worker's request rate per peer, which would shun it).

Writes ``D/hogs.json`` every half second: ``ready`` (every peer connected), ``held``
(replies read, each an upload stalled), ``holding`` (lanes holding one now), ``dropped``
(held uploads the worker ended), ``refused``
(refusal reasons, counted) and ``failed`` (other errors, by type). Exits 0 on SIGTERM,
every node stopped.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from multiaddr import Multiaddr

from crypto.identity import Identity
from node.config import NodeConfig
from node.logs import setup_logging
from node.net.runtime import Node
from protocol import ids
from protocol.batches import BatchReply, BatchRequest
from protocol.framing import HEADER, write_frame
from protocol.messages import Refusal
from protocol.wire import max_envelope_size, open_message, seal

log = logging.getLogger("intellect.hogs")


@dataclass
class Tally:
    peers: int
    lanes: int
    ready: bool = False
    held: int = 0
    holding: int = 0
    dropped: int = 0  # held uploads the worker ended (its deadline), seen as they ended
    refused: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, object]:
        return {
            "peers": self.peers,
            "lanes": self.lanes,
            "ready": self.ready,
            "held": self.held,
            "holding": self.holding,
            "dropped": self.dropped,
            "refused": dict(self.refused),
            "failed": dict(self.failed),
        }


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--worker", required=True, help="the worker's multiaddr, ending /p2p/PEER")
    p.add_argument("--key", required=True, help="a work key the worker holds, in hex")
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--run-id", default="loop-run")
    p.add_argument("--peers", type=int, default=8)
    p.add_argument("--lanes", type=int, default=2)
    p.add_argument("--hold", type=float, default=12.0)
    p.add_argument("--retry", type=float, default=0.05)
    return p.parse_args()


def node_config(args: argparse.Namespace, i: int) -> NodeConfig:
    return NodeConfig(
        data_dir=args.dir / f"hog-{i}",
        run={"id": args.run_id},
        net={"listen": ["/ip4/127.0.0.1/tcp/0"], "discovery_interval": 600.0},
    )


async def read_exactly(stream: object, n: int) -> bytes:
    """``n`` bytes of ``stream``, asked for no more (the rest stays unread, unacknowledged)."""
    data = b""
    while len(data) < n:
        got = await stream.read(n - len(data))  # type: ignore[attr-defined]
        if not got:
            raise EOFError(f"stream ended after {len(data)} of {n} bytes")
        data += got
    return data


def ended(stream: object) -> bool:
    """Whether the worker closed or reset ``stream`` (py-libp2p's yamux stream state: its
    FIN or RST arrived), whatever is still buffered unread."""
    muxed = getattr(stream, "muxed_stream", None)
    return bool(getattr(muxed, "recv_closed", False) or getattr(muxed, "reset_received", False))


async def hold_one(node: Node, worker: ID, key: bytes, hold: float, tally: Tally) -> bool:
    """Ask for the batch ``key``; on a reply, hold the stream unread until the worker ends
    the upload (or ``hold`` seconds); True if it was held."""
    with trio.fail_after(node.cfg.net.connect_timeout):
        stream = await node.network.host.new_stream(worker, [TProtocol(ids.BATCH)])
    try:
        request = BatchRequest(**node.header(), work_key=key)
        await write_frame(stream, seal(node.identity, request), node.cfg.net.read_timeout)
        with trio.fail_after(node.cfg.net.read_timeout):
            (size,) = HEADER.unpack(await read_exactly(stream, HEADER.size))
            if size > max_envelope_size(BatchReply, Refusal):
                raise ValueError(f"a reply of {size} bytes")
            reply = open_message(await read_exactly(stream, size), BatchReply, Refusal)
        if isinstance(reply, Refusal):
            tally.refused[reply.reason] += 1
            return False
        tally.held += 1
        tally.holding += 1
        try:
            with trio.move_on_after(hold):
                # polled: yamux has no event for a FIN or RST that a non-reader may wait on
                while not ended(stream):  # noqa: ASYNC110 - never reads a frame
                    await trio.sleep(0.02)
                tally.dropped += 1
        finally:
            tally.holding -= 1
        return True
    finally:
        with trio.move_on_after(1.0) as scope:
            scope.shield = True
            try:
                await stream.reset()
            except Exception:
                pass


async def lane(node: Node, worker: PeerInfo, args: argparse.Namespace, tally: Tally) -> None:
    """One of ``node``'s streams to the worker, asking again and again for as long as it runs."""
    key = bytes.fromhex(args.key)
    while True:
        try:
            if await hold_one(node, worker.peer_id, key, args.hold, tally):
                continue  # the upload ended: its slot is free now, ask again at once
        except Exception as exc:  # a dropped link, a reset, a slow dial: ask again
            tally.failed[type(exc).__name__] += 1
            log.info("hog %s: %r", node.peer_id[-8:], exc)
            try:
                with trio.fail_after(node.cfg.net.connect_timeout):
                    await node.connect(worker)
            except Exception:
                pass
        await trio.sleep(args.retry)


async def main(args: argparse.Namespace) -> None:
    args.dir.mkdir(parents=True, exist_ok=True)
    tally = Tally(args.peers, args.peers * args.lanes)
    worker = info_from_p2p_addr(Multiaddr(args.worker))

    async def write_report() -> None:
        while True:
            (args.dir / "hogs.json.tmp").write_text(json.dumps(tally.as_dict()))
            (args.dir / "hogs.json.tmp").replace(args.dir / "hogs.json")
            await trio.sleep(0.5)

    async with trio.open_nursery() as reporting:
        reporting.start_soon(write_report)
        async with trio.open_nursery() as serving:
            nodes = [
                await serving.start(Node(node_config(args, i), Identity.generate()).serve)
                for i in range(args.peers)
            ]
            for node in nodes:
                with trio.fail_after(30):
                    await node.connect(worker)
            tally.ready = True
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async with trio.open_nursery() as hogging:
                    for node in nodes:
                        for _ in range(args.lanes):
                            hogging.start_soon(lane, node, worker, args, tally)
                    async for _ in signals:
                        hogging.cancel_scope.cancel()
                        break
            for node in nodes:  # each leaves the network as a node does, then stops
                node.request_stop()
        reporting.cancel_scope.cancel()


if __name__ == "__main__":
    setup_logging("INFO", "hogs")
    trio.run(main, parse())
