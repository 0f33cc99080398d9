"""The moving parts between the scheduler and the network: the upload rate cap and the
download loop. Both take their I/O as arguments, so they run under trio's MockClock in
tests with fake peers, and under the real clock with libp2p streams in the service.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from node.shardcast.schedule import DownloadPlan

log = logging.getLogger("intellect.shardcast")


@dataclass
class ByteBucket:
    """Upload rate cap: ``rate`` bytes/s on average, bursts of at most ``burst`` bytes.

    Pure. A sender waits ``delay(now)`` and then ``take(now, n)`` for a frame of ``n``
    bytes; a frame larger than what is left puts the bucket in debt, which later waits
    repay, so over any interval no more than ``burst + rate × t`` (plus one frame) leaves.
    """

    rate: float
    burst: float
    tokens: float = -1.0
    stamp: float | None = None

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst <= 0:
            raise ValueError("rate and burst must be > 0")
        if self.tokens < 0:
            self.tokens = self.burst

    def _refill(self, now: float) -> None:
        if self.stamp is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def delay(self, now: float) -> float:
        self._refill(now)
        return 0.0 if self.tokens > 0 else -self.tokens / self.rate + 1e-9

    def take(self, now: float, n: int) -> None:
        self._refill(now)
        self.tokens -= n

    async def spend(self, n: int) -> None:
        """Wait until ``n`` more bytes may leave, and account for them."""
        wait = self.delay(trio.current_time())
        if wait > 0:  # whoever spends meanwhile deepens the debt the next sender repays
            await trio.sleep(wait)
        self.take(trio.current_time(), n)


class BadShard(Exception):
    """The bytes a peer served do not hash to the manifest's value."""


class PeerBusy(Exception):
    """The peer refused for now: every one of its upload slots is taken."""


class PeerLacks(Exception):
    """The peer does not hold the shard it was asked for."""


class LocalFault(Exception):
    """The downloader itself cannot go on (its disk refused a shard): the download ends
    with this error, and no peer is blamed for it."""


class Wakeup:
    """Something changed (a fetch ended, holdings were refreshed): re-plan now."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self, within: float) -> None:
        with trio.move_on_after(within):
            await self._event.wait()
        self._event = trio.Event()


# (shard, peer) -> bytes stored; BadShard, PeerBusy, PeerLacks, LocalFault or any error
Fetch = Callable[[int, str], Awaitable[int]]
Report = Callable[[str, int, str, BaseException | None], None]  # (outcome, shard, peer, error)


async def run_download(
    plan: DownloadPlan,
    fetch: Fetch,
    *,
    shard_deadline: Callable[[int], float],
    wakeup: Wakeup,
    report: Report | None = None,
    idle_poll: float = 1.0,
) -> None:
    """Fetch every shard ``plan`` does not have, as it assigns them, until complete.

    Each fetch runs under ``shard_deadline(shard)`` seconds (the fetch also bounds each
    read); a fetch that stalls past it, fails or is refused gives its shard back to the
    plan (and backs the peer off); one whose bytes do not verify gets its peer banned.
    Returns when every shard is done; cancel it to stop. A fetch that raises
    ``LocalFault`` stops the others, and ``run_download`` raises it."""
    fault: list[LocalFault] = []

    def note(outcome: str, shard: int, peer: str, err: BaseException | None) -> None:
        if report is not None:
            report(outcome, shard, peer, err)

    async def one(shard: int, peer: str) -> None:
        started = trio.current_time()
        try:
            with trio.fail_after(shard_deadline(shard)):
                nbytes = await fetch(shard, peer)
        except BadShard as err:
            plan.corrupt(shard, peer)
            note("corrupt", shard, peer, err)
        except PeerBusy as err:
            plan.busy(shard, peer, trio.current_time())
            note("busy", shard, peer, err)
        except PeerLacks as err:
            plan.lacks(shard, peer)
            note("lacks", shard, peer, err)
        except LocalFault as err:
            fault.append(err)
            nursery.cancel_scope.cancel()
        except trio.TooSlowError as err:
            plan.failed(shard, peer, trio.current_time())
            note("stalled", shard, peer, err)
        except Exception as err:  # dead peer, reset stream, refusal, timeout inside
            plan.failed(shard, peer, trio.current_time())
            note("failed", shard, peer, err)
        else:
            plan.completed(shard, peer, nbytes, trio.current_time() - started)
            note("completed", shard, peer, None)
        finally:
            wakeup.set()

    async with trio.open_nursery() as nursery:
        while not plan.complete:
            now = trio.current_time()
            for shard, peer in plan.assign(now):
                nursery.start_soon(one, shard, peer)
            if plan.complete:
                break
            wake = plan.next_wakeup(now)
            await wakeup.wait(min(idle_poll, wake - now) if wake is not None else idle_poll)
    if fault:
        raise fault[0]
