"""Reachability: can other peers dial this node? (SPEC §16)

A worker at home behind a router's NAT can dial out but cannot be dialed, and in this
design validators and SHARDCAST pullers dial the holder of what they want. So every node
finds out which it is, with AutoNAT v1 (``/libp2p/autonat/1.0.0``, libp2p's protobuf
messages, so any libp2p peer can answer or ask):
- **asking:** every round the node asks up to ``ASK`` peers it holds a direct connection to
  (a peer joined through a relay would dial back the relay's IP) to dial it back on its
  candidate addresses. It is ``public`` once ``CONFIRMATIONS`` peers reached it, ``private``
  once that many tried and failed (and none reached it), else ``unknown``;
- **answering:** a dial-back is a new TCP connection on which the Noise handshake proves
  the asker's peer id, closed right after; an existing connection to the asker proves
  nothing. Only the asker's own IP, as we see it, is ever dialed (the ports of its
  candidates on that IP, all at once, so the answer comes within ``DIAL_BACK_TIMEOUT``): a
  peer cannot make us dial a third party. A question over a relayed connection is refused
  (we would see the relay's IP). One dial-back per peer at a time and ``SERVE_AT_ONCE`` in
  all; more are refused, and counted.
The addresses peers observe us at come from identify (each peer tells us the address our
connection to it came from; over a relayed connection that is the relay's view, ignored);
behind NAT they are the router's.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import multiaddr
import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.host.autonat.pb.autonat_pb2 import Message
from libp2p.peer.id import ID
from libp2p.utils import encode_varint_prefixed, read_varint_prefixed_bytes_limited

from node.net.metrics import Metrics
from node.net.network import Network, is_relayed

log = logging.getLogger("intellect.node")

PROTOCOL = "/libp2p/autonat/1.0.0"
ASK = 4  # peers asked per round
CONFIRMATIONS = 2  # agreeing peers needed to call ourselves public or private
FIRST_ROUND = 3.0  # seconds after start-up (or after the first peer) before asking
ROUND_UNDECIDED = 15.0  # seconds between rounds while unknown
ROUND_DECIDED = 300.0  # ... and once public or private
RESULT_TTL = 1800.0  # a peer's verdict counts this long
DIAL_BACK_TIMEOUT = 5.0  # one dial-back: TCP connect and the Noise handshake
ASK_TIMEOUT = 30.0  # a whole question, dial-backs included
MAX_MESSAGE = 4096  # bytes of one AutoNAT message
MAX_PORTS = 4  # ports of one asker dialed back
SERVE_AT_ONCE = 4  # dial-backs in flight for all askers together
QUESTIONS_PER_PEER = 2  # question streams of one peer open at once (more are closed)
QUESTION_TIMEOUT = 5.0  # seconds to send the question once the stream is open
KEEP_OBSERVED = 8  # observed addresses shown

PUBLIC, PRIVATE, UNKNOWN = "public", "private", "unknown"


@dataclass
class Verdicts:
    """Each asked peer's last answer; the state they add up to (no I/O)."""

    confirmations: int = CONFIRMATIONS
    ttl: float = RESULT_TTL
    results: dict[str, tuple[bool, float]] = field(default_factory=dict)  # peer: reached, when

    def record(self, peer: str, reached: bool, now: float) -> None:
        self.results[peer] = (reached, now)

    def counts(self, now: float) -> tuple[int, int]:
        """(peers that reached us, peers that tried and failed), within the TTL."""
        fresh = [ok for ok, at in self.results.values() if now - at <= self.ttl]
        return sum(fresh), len(fresh) - sum(fresh)

    def state(self, now: float) -> str:
        reached, failed = self.counts(now)
        if reached >= self.confirmations:
            return PUBLIC
        if failed >= self.confirmations and reached == 0:
            return PRIVATE
        return UNKNOWN


def dial_back_targets(candidates: list[bytes], observed_ip: str | None) -> list[str]:
    """What an answering node dials: the TCP ports of the asker's candidates, on the IP the
    asker's connection came from, and nothing else (no amplification onto third parties).
    At most ``MAX_PORTS``; candidates that do not parse are skipped."""
    if not observed_ip:
        return []
    family = "ip6" if ":" in observed_ip else "ip4"
    out: list[str] = []
    for raw in candidates[: MAX_PORTS * 4]:
        try:
            port = multiaddr.Multiaddr(raw).value_for_protocol("tcp")
        except Exception:  # multiaddr raises several unrelated types
            continue
        target = f"/{family}/{observed_ip}/tcp/{port}"
        if port and target not in out:
            out.append(target)
        if len(out) == MAX_PORTS:
            break
    return out


@dataclass(frozen=True)
class ReachabilityStatus:
    state: str  # public / private / unknown
    advertised: list[str]  # what we tell peers to dial
    observed: list[str]  # where peers saw our connections come from (identify)
    reached_by: int  # peers that dialed us back, within the TTL
    not_reached_by: int  # peers that tried and failed
    refused: int  # questions the answering peer refused (it would not dial)
    unanswered: int  # questions that got no answer (timed out, or the stream failed)
    answered: dict[str, int]  # dial-backs we made for others, by outcome


class Reachability:
    """Asks peers whether they can dial us, and dials back for peers that ask."""

    def __init__(
        self,
        network: Network,
        metrics: Metrics,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.network = network
        self.metrics = metrics
        self.clock = clock
        self.verdicts = Verdicts()
        self.refused = 0
        self.unanswered = 0
        self.answered: dict[str, int] = {}
        self.observed: dict[str, str] = {}  # peer: the address it saw us at
        self._asking: set[str] = set()  # peers we are asking now
        self._dialing: set[str] = set()  # askers we are dialing back now
        self._serving = trio.Semaphore(SERVE_AT_ONCE)
        self._questions: Counter[str] = Counter()  # askers' streams open now
        self._changed = trio.Event()

    def state(self) -> str:
        return self.verdicts.state(self.clock())

    def status(self) -> ReachabilityStatus:
        reached, failed = self.verdicts.counts(self.clock())
        return ReachabilityStatus(
            state=self.verdicts.state(self.clock()),
            advertised=list(self.network.addrs),
            observed=sorted(set(self.observed.values()))[:KEEP_OBSERVED],
            reached_by=reached,
            not_reached_by=failed,
            refused=self.refused,
            unanswered=self.unanswered,
            answered=dict(self.answered),
        )

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        host = self.network.host
        assert host is not None, "reachability needs a running host"
        host.set_stream_handler(TProtocol(PROTOCOL), self._answer)
        _watch_observations(host, self._observed)
        task_status.started()
        await trio.sleep(FIRST_ROUND)
        while True:
            await self.ask_round()
            decided = self.state() != UNKNOWN
            with trio.move_on_after(ROUND_DECIDED if decided else ROUND_UNDECIDED):
                await self._changed.wait()  # a new peer while undecided: ask it soon
                self._changed = trio.Event()
                await trio.sleep(FIRST_ROUND)

    def _observed(self, peer: str, addr: str) -> None:
        self.observed[peer] = addr
        if self.state() == UNKNOWN:
            self._changed.set()

    # ---- asking -----------------------------------------------------------------------

    async def ask_round(self) -> None:
        """Ask up to ``ASK`` directly connected peers, those not asked recently first."""
        peers = sorted(
            p for p in self.network.connected_peers() - self._asking if not self.network.relayed(p)
        )
        random.shuffle(peers)
        peers.sort(key=lambda p: self.verdicts.results.get(p, (False, -1e18))[1])
        async with trio.open_nursery() as nursery:
            for peer in peers[:ASK]:
                nursery.start_soon(self.ask, peer)

    async def ask(self, peer: str) -> bool | None:
        """Ask ``peer`` to dial us back: True if it reached us, False if it tried and
        failed, None if it would not try or could not be asked (counts neither way)."""
        host = self.network.host
        assert host is not None
        self._asking.add(peer)
        try:
            with trio.move_on_after(ASK_TIMEOUT):
                status = await _question(host, peer, self._candidates())
                reached = _outcome(status)
                if reached is None:
                    self.refused += 1
                else:
                    self.verdicts.record(peer, reached, self.clock())
                log.debug("autonat peer=%s status=%s", peer, status)
                return reached
            log.debug("autonat ask %s: no answer in %.0f s", peer, ASK_TIMEOUT)
        except Exception as exc:  # the peer left, or does not speak AutoNAT
            log.debug("autonat ask %s failed: %r", peer, exc)
        finally:
            self._asking.discard(peer)
        self.unanswered += 1
        return None

    def _candidates(self) -> list[bytes]:
        out = []
        for addr in [*self.network.listen_addrs, *self.observed.values()]:
            try:
                out.append(multiaddr.Multiaddr(addr).to_bytes())
            except Exception:  # multiaddr raises several unrelated types
                continue
        return out

    # ---- answering --------------------------------------------------------------------

    async def _answer(self, stream: INetStream) -> None:
        """One question: read it, dial back, answer; nothing it raises reaches the host."""
        peer = stream.muxed_conn.peer_id
        name = peer.to_base58()
        if self._questions[name] >= QUESTIONS_PER_PEER:  # silent streams held our tasks
            self.metrics.inc("autonat_answers", outcome="too many streams")
            await _close(stream)
            return
        self._questions[name] += 1
        try:
            with trio.move_on_after(ASK_TIMEOUT):
                with trio.fail_after(QUESTION_TIMEOUT):
                    raw = await read_varint_prefixed_bytes_limited(stream, MAX_MESSAGE)
                status: Message.ResponseStatus.ValueType
                if is_relayed(getattr(stream, "swarm_conn", None)):
                    status, text, addr = Message.E_DIAL_REFUSED, "relayed connection", None
                else:
                    status, text, addr = await self._dial_back(peer, raw, _remote_ip(stream))
                self.answered[text] = self.answered.get(text, 0) + 1
                self.metrics.inc("autonat_answers", outcome=text)
                reply = Message(type=Message.DIAL_RESPONSE)
                reply.dialResponse.status = status
                reply.dialResponse.statusText = text
                if addr:
                    reply.dialResponse.addr = multiaddr.Multiaddr(addr).to_bytes()
                await stream.write(encode_varint_prefixed(reply.SerializeToString()))
        except Exception as exc:
            log.debug("autonat answer to %s failed: %r", peer, exc)
        finally:
            self._questions[name] -= 1
            if not self._questions[name]:
                del self._questions[name]
            await _close(stream)

    async def _dial_back(
        self, peer: ID, raw: bytes, observed_ip: str | None
    ) -> tuple[Message.ResponseStatus.ValueType, str, str | None]:
        """(status, reason, the address that reached the asker)."""
        try:
            question = Message()
            question.ParseFromString(raw)
        except Exception:  # protobuf's DecodeError, or worse on garbage
            return Message.E_BAD_REQUEST, "not an AutoNAT message", None
        if question.type != Message.DIAL or question.dial.peer.id != peer.to_bytes():
            return Message.E_BAD_REQUEST, "dial-back only for the asking peer", None
        targets = dial_back_targets(list(question.dial.peer.addrs), observed_ip)
        if not targets:
            return Message.E_DIAL_REFUSED, "no address on the asker's IP", None
        name = peer.to_base58()
        if name in self._dialing or self._serving.value == 0:
            return Message.E_DIAL_REFUSED, "busy", None
        self._dialing.add(name)  # one dial-back per peer at a time
        try:
            async with self._serving:
                reached = await _first_reached(self.network, peer, targets)
            if reached:
                return Message.OK, "reached", reached
            return Message.E_DIAL_ERROR, "not reached", None
        finally:
            self._dialing.discard(name)


def _outcome(status: int) -> bool | None:
    if status == Message.OK:
        return True
    if status == Message.E_DIAL_ERROR:
        return False
    return None  # refused, bad request, internal error: the peer did not try


async def _question(host: IHost, peer: str, candidates: list[bytes]) -> int:
    """Send one DIAL question to ``peer``; its answer's status."""
    question = Message(type=Message.DIAL)
    question.dial.peer.id = host.get_id().to_bytes()
    question.dial.peer.addrs.extend(candidates)
    stream = await host.new_stream(ID.from_base58(peer), [PROTOCOL])  # type: ignore[list-item]
    try:
        await stream.write(encode_varint_prefixed(question.SerializeToString()))
        answer = Message()
        answer.ParseFromString(await read_varint_prefixed_bytes_limited(stream, MAX_MESSAGE))
    finally:
        await _close(stream)
    if answer.type != Message.DIAL_RESPONSE:
        raise ValueError("not a dial response")
    return int(answer.dialResponse.status)


async def _first_reached(network: Network, peer: ID, targets: list[str]) -> str | None:
    """Dial every target at once; the first that proves ``peer`` (the others are cut)."""
    reached: list[str] = []

    async def one(target: str, nursery: trio.Nursery) -> None:
        if await _verify_dial(network, peer, target):
            reached.append(target)
            nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        for target in targets:
            nursery.start_soon(one, target, nursery)
    return reached[0] if reached else None


async def _verify_dial(network: Network, peer: ID, target: str) -> bool:
    """A fresh TCP connection to ``target`` on which Noise proves ``peer``; closed after.
    Not through the swarm: it would reuse our connection to the asker, proving nothing."""
    host = network.host
    assert host is not None
    swarm: Any = host.get_network()
    addr = multiaddr.Multiaddr(target)
    transport = swarm.transport_manager.transport_for_dialing(addr)
    if transport is None:
        return False
    raw = None
    with trio.move_on_after(DIAL_BACK_TIMEOUT):
        try:
            raw = await transport.dial(addr)
            secured = await swarm.upgrader.upgrade_security(raw, True, peer)
            await secured.close()
            return True
        except Exception as exc:  # refused, unreachable, or another peer answered
            log.debug("autonat dial-back %s failed: %r", target, exc)
        finally:
            if raw is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(2):
                    try:
                        await raw.close()
                    except Exception:
                        pass
    return False


def _remote_ip(stream: INetStream) -> str | None:
    try:
        remote = stream.get_remote_address()
    except Exception:
        return None
    return remote[0] if remote else None


async def _close(stream: INetStream) -> None:
    with trio.CancelScope(shield=True), trio.move_on_after(2):
        try:
            await stream.close()
        except Exception:
            pass


def _watch_observations(host: IHost, seen: Callable[[str, str], None]) -> None:
    """Hear what identify tells us: each peer reports the address our connection to it
    came from. py-libp2p keeps these in its observed-address manager only past a threshold
    of distinct observer networks (never reached on one machine); we wrap its recorder to
    see every report, except over relayed connections (the relay's view of us, not the
    router's). Without the manager (identify address discovery off) nothing is heard."""
    manager = getattr(host, "_observed_addr_manager", None)
    if manager is None:
        return
    record = manager.record_observation

    def recorded(conn: Any, observed: multiaddr.Multiaddr, local: list[Any]) -> None:
        try:
            if not is_relayed(conn):
                seen(conn.muxed_conn.peer_id.to_base58(), str(observed))
        except Exception:  # a connection without a peer id: nothing to note
            pass
        record(conn, observed, local)

    manager.record_observation = recorded
