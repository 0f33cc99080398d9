"""The wire messages. Each ``TYPE`` doubles as the signing domain of its envelope.

Every message carries the same header: ``run_id`` (messages from another run are
rejected), ``sender`` (the peer id that must equal the envelope's signer), ``seq`` (the
sender's monotonic counter, for replay rejection) and ``ts_ms`` (the sender's clock, for
staleness). SPEC.md documents every field and limit below.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.errors import Reason
from protocol.ids import PEER_ID_PATTERN, ROLES, RUN_ID_PATTERN
from protocol.schema import FieldSpec, Message, blob, listof, text, u64

MAX_ADDRS = 8
MAX_ADDR_LEN = 256
MAX_ANNOUNCE_BODY = 64 * 1024
MAX_SYNC_ITEMS = 64


@dataclass(frozen=True)
class Header(Message):
    run_id: str = text(64, pattern=RUN_ID_PATTERN)
    sender: str = text(64, pattern=PEER_ID_PATTERN)
    seq: int = u64()
    ts_ms: int = u64()


@dataclass(frozen=True)
class NodeInfo(Header):
    """Who a node is: sent as a presence request/reply and as a gossip heartbeat."""

    TYPE = "intellect/node-info/1"
    MAX_SIZE = 4096

    role: str = text(16, choices=ROLES)
    state: str = text(8, choices=("up", "leaving"))
    addrs: list[str] = listof(FieldSpec(str, max_len=MAX_ADDR_LEN), MAX_ADDRS)
    session: int = u64()  # the sender's announcement session (start time, µs)
    announced: int = u64()  # how many announcements it has published in this session


@dataclass(frozen=True)
class Announcement(Header):
    """A small gossip announcement; ``index`` counts from 0 within ``session``."""

    TYPE = "intellect/announcement/1"
    MAX_SIZE = MAX_ANNOUNCE_BODY + 1024

    topic: str = text(64, pattern=r"[a-z0-9._/-]{1,64}")
    session: int = u64()
    index: int = u64()
    body: bytes = blob(MAX_ANNOUNCE_BODY)


@dataclass(frozen=True)
class SyncRequest(Header):
    """Ask a publisher for announcements of one of its sessions that gossip did not bring."""

    TYPE = "intellect/sync-request/1"
    MAX_SIZE = 2048

    session: int = u64()
    indices: list[int] = listof(FieldSpec(int), MAX_SYNC_ITEMS)


@dataclass(frozen=True)
class SyncReply(Header):
    """The publisher's original signed announcement envelopes it still holds."""

    TYPE = "intellect/sync-reply/1"
    MAX_SIZE = MAX_SYNC_ITEMS * (Announcement.MAX_SIZE + 256) + 1024

    items: list[bytes] = listof(
        FieldSpec(bytes, max_len=Announcement.MAX_SIZE + 256), MAX_SYNC_ITEMS
    )


@dataclass(frozen=True)
class Refusal(Header):
    """The reply a handler sends instead of an answer when it rejects a request."""

    TYPE = "intellect/refusal/1"
    MAX_SIZE = 1024

    reason: str = text(32, choices=tuple(r.value for r in Reason))  # SPEC §9's
    detail: str = text(256)
