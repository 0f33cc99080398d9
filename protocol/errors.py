"""Rejection reasons. Every input the node refuses is counted under one of these."""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    OVERSIZED = "oversized"  # length prefix or encoded size above the message's maximum
    TRUNCATED = "truncated"  # the stream ended inside a frame
    TIMEOUT = "timeout"  # the peer did not send the rest within the read deadline
    MALFORMED = "malformed"  # not msgpack, or msgpack of the wrong shape / types / ranges
    BAD_SIGNATURE = "bad_signature"  # signature does not verify under the expected domain
    WRONG_TYPE = "wrong_type"  # a valid message of a type this protocol does not take
    SENDER_MISMATCH = "sender_mismatch"  # claimed sender is not the signer / the stream's peer
    WRONG_RUN = "wrong_run"  # message from another run
    REPLAY = "replay"  # a sequence number this node has already accepted from that sender
    STALE = "stale"  # timestamp outside the allowed clock skew
    RESET = "reset"  # the stream was reset or failed underneath us
    INTERNAL = "internal"  # our own handler failed; the host stays up
    BAD_SHARD = "bad_shard"  # shard bytes whose hash is not the manifest's (the peer is banned)
    NOT_FOUND = "not_found"  # a refusal: the listener does not hold what was asked for
    BUSY = "busy"  # a refusal: every upload slot is taken; ask another peer
    NOT_MEMBER = "not_member"  # a refusal: the sender is not in this DiLoCo roster/attempt
    ABORTED = "aborted"  # a refusal: this DiLoCo all-reduce attempt was abandoned
    BANNED = "banned"  # a refusal: the listener has banned the asker (SPEC §2's bans)


class WireError(Exception):
    """An input rejected for ``reason``; ``detail`` is for humans."""

    def __init__(self, reason: Reason, detail: str = "") -> None:
        super().__init__(f"{reason.value}: {detail}" if detail else reason.value)
        self.reason = reason
        self.detail = detail
