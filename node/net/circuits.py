"""py-libp2p 0.8.1's circuit relay v2 and DCUtR, adapted for ``node/net/relay.py``.

Like ``host.py`` for the host, this is the one place that reaches into the library's relay
internals (each reach says why); ``Relays`` uses only what is defined here.
- ``CountingRelay``: the HOP and STOP handlers, with a per-peer circuit limit, a hard end to
  idle circuits, and counts of every outcome (the library counts nothing);
- ``reserve``: one RESERVE exchange, without the library's own refresh task (``Relays``
  renews, and drops what it cannot renew);
- ``CountingDCUtR``: the hole-punching service, counting its outcomes and telling whether a
  punch to a peer runs or may still run.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import trio
from libp2p.abc import IHost
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2.dcutr import MAX_HOLE_PUNCH_ATTEMPTS, DCUtRProtocol
from libp2p.relay.circuit_v2.exceptions import RelayConnectionError
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.relay.circuit_v2.transport import CircuitV2Transport

from node.net.metrics import Metrics

log = logging.getLogger("intellect.node")


class CountingRelay(CircuitV2Protocol):
    """py-libp2p's circuit relay v2 HOP and STOP handlers, with what the library lacks:
    a limit on the circuits one peer opens at once (``per_peer``), a hard end to a
    circuit at ``limits.duration`` even when idle (the library checks it only when
    bytes flow), and counts of every reservation and circuit accepted, refused or cut
    (``relay_reservations``, ``relay_circuits``, ``relay_bytes``)."""

    def __init__(self, host: Any, limits: RelayLimits, hop: bool, per_peer: int, metrics: Metrics):
        super().__init__(host, limits=limits, allow_hop=hop)
        self.per_peer = per_peer
        self.metrics = metrics
        self.open_from: dict[ID, int] = {}  # circuits open now, by the peer that opened them
        accept = self.resource_manager.can_accept_reservation

        def counted(peer_id: ID) -> bool:
            ok = bool(accept(peer_id))
            self.metrics.inc("relay_reservations", outcome="accepted" if ok else "refused")
            return ok

        self.resource_manager.can_accept_reservation = counted  # type: ignore[method-assign]

    def reservations_held(self) -> int:
        """Reservations this relay holds for others now (expired ones may linger until
        the library cleans them on the next reservation)."""
        return len(self.resource_manager._reservations)

    async def _handle_connect(self, stream: Any, msg: Any) -> None:
        source = stream.muxed_conn.peer_id
        if self.open_from.get(source, 0) >= self.per_peer:
            self.metrics.inc("relay_circuits", outcome="refused: circuits per peer")
            await self._send_status(
                stream, StatusCode.RESOURCE_LIMIT_EXCEEDED, "too many circuits from this peer"
            )
            await trio.sleep(0.5)  # as the library does: the dialer reads the status first
            await _reset(stream)
            return
        self.open_from[source] = self.open_from.get(source, 0) + 1
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._end_at_duration, stream, ID(msg.peer.id))
                await super()._handle_connect(stream, msg)
                nursery.cancel_scope.cancel()
        finally:
            left = self.open_from.get(source, 1) - 1
            if left > 0:
                self.open_from[source] = left
            else:
                self.open_from.pop(source, None)

    async def _end_at_duration(self, stream: Any, target: ID) -> None:
        """The library checks a circuit's duration only when bytes flow: an idle circuit
        would hold its slot, and both its streams, for ever. At the duration this resets
        both ends as the library's own cut does (``host.wake_readers_on_reset`` wakes its
        copy tasks), and the library's cleanup then closes them and frees the slot.
        Cancelling the library's handler instead would skip that cleanup."""
        await trio.sleep(self.limits.duration + 1)
        self.metrics.inc("relay_circuits", outcome="cut: duration")
        ends = self._active_relays.get(target)
        await _reset(stream)
        if ends is not None and ends[0] is stream and ends[1] is not None:
            await _reset(ends[1])

    async def _send_status(  # type: ignore[override]  # forwards py-libp2p's arguments as given
        self, stream: Any, status_code: Any, message: str, *args: Any, **kw: Any
    ) -> None:
        outcome = _CIRCUIT_OUTCOMES.get(message)
        if outcome is not None:
            self.metrics.inc("relay_circuits", outcome=outcome)
        await super()._send_status(stream, status_code, message, *args, **kw)

    async def _read_stream_with_retry(self, stream: Any, *args: Any, **kw: Any) -> bytes | None:
        data: bytes | None = await super()._read_stream_with_retry(stream, *args, **kw)
        if data:
            self.metrics.inc("relay_bytes", len(data))
        return data


# the library's status messages on a circuit, and what each counts as
_CIRCUIT_OUTCOMES = {
    "Connection established": "opened",
    "Destination peer has no active reservation on this relay": "refused: no reservation",
    "Source peer has exceeded its connection limit": "refused: circuits per reservation",
    "Data transfer limit exceeded": "cut: bytes",
    "Circuit duration limit exceeded": "cut: duration",
    "Invalid reservation": "refused: invalid reservation",
}


async def _reset(stream: Any) -> None:
    with trio.CancelScope(shield=True), trio.move_on_after(2):
        try:
            await stream.reset()
        except Exception:  # already gone
            pass


async def dial_circuit(
    host: IHost, transport: CircuitV2Transport, circuit: Any, target: ID
) -> None:
    """Open a connection to ``target`` through ``circuit`` (``<relay>/p2p-circuit/p2p/<target>``;
    the relay dialed first if need be): one CONNECT, and the connection joins the swarm. The
    library's ``dial`` would also take a reservation on the relay first (its client role)."""
    relay_addr, _ = transport.parse_circuit_ma(circuit)
    relay = ID.from_base58(str(relay_addr.get_peer_id()))
    await host.connect(PeerInfo(relay, [relay_addr]))  # at once if connected already
    try:
        raw = await transport._dial_via_circuit_addr(circuit, PeerInfo(target, [circuit]))
    except RelayConnectionError as exc:  # the relay answered CONNECT with a refusal
        raise ConnectionError(f"the relay refused the circuit: {exc}") from exc
    await host.upgrade_outbound_connection(raw, target)


async def reserve(host: IHost, transport: CircuitV2Transport, relay: ID) -> float | None:
    """Reserve (or renew) a slot on ``relay``: when it expires (Unix time), or None if the
    relay refused. The library's ``reserve`` would also start its own refresh task."""
    stream = await host.new_stream(relay, [HOP])
    try:
        if not await transport._make_reservation(stream, relay):
            return None
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(2):
            try:
                await stream.close()
            except Exception:  # the relay closed it first
                pass
    return float(transport._reservations.get(relay, 0))


class CountingDCUtR(DCUtRProtocol):
    """py-libp2p's DCUtR, counting hole punches by outcome (``hole_punch_attempts``)."""

    def __init__(self, host: IHost, metrics: Metrics) -> None:
        super().__init__(host)
        self.metrics = metrics
        self.seconds: deque[float] = deque(maxlen=32)  # how long each successful punch took

    async def _perform_hole_punch(
        self, peer_id: ID, addrs: list[Any], as_responder: bool = False
    ) -> bool:
        started = time.monotonic()
        ok = bool(await super()._perform_hole_punch(peer_id, addrs, as_responder))
        self.metrics.inc("hole_punch_attempts", outcome="direct" if ok else "failed")
        log.info(
            "hole punch to %s: %s after %.2f s",
            str(peer_id)[-8:],
            "direct" if ok else "failed",
            time.monotonic() - started,
        )
        if ok:
            self.seconds.append(round(time.monotonic() - started, 3))
        return ok

    def try_again(self, peer: ID) -> bool:
        """Give ``peer`` a new budget of hole punches if it used its last; True if so. The
        library resets it only when the connection closes, and a relayed connection to a
        busy peer (a worker generating) may stay up for hours after three mistimed tries."""
        if self._hole_punch_attempts.get(peer, 0) < MAX_HOLE_PUNCH_ATTEMPTS:
            return False
        self._hole_punch_attempts.pop(peer, None)
        return True

    def punching(self, peer: ID) -> tuple[bool, bool]:
        """(a punch to ``peer`` runs now, we have tries left for it)."""
        tried = self._hole_punch_attempts.get(peer, 0)
        return peer in self._in_progress, tried < MAX_HOLE_PUNCH_ATTEMPTS
