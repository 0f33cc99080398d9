"""JSON-RPC over one or several provider URLs: each failure classified, counted, and the
request tried again on the next URL after a backoff with jitter.

Hosted providers answer 429 (rate limit) and 5xx, time out, reset connections, and answer
from a lagging backend. ``FailoverProvider`` is the web3 provider behind every http(s)
chain (``ledger.chain.connect``). Per request, each URL is tried in turn (starting with the
one that answered last), at most ``attempts`` times in all, until one answers well:

- A send (``eth_sendRawTransaction``) is tried again only after a 429 (it was not taken);
  after any other failure it may have arrived, and the caller looks it up by its hash.
- ``rate_limit`` (HTTP 429), ``server`` (HTTP 5xx or another HTTP error) and
  ``unreachable`` (refused, reset, timed out) are tried again on the next URL, after
  ``BACKOFF_S * 2**attempt`` (capped, with up to 50 % random jitter; a 429's Retry-After is
  honoured up to the cap). A time-out is tried again only on another URL: a provider that
  accepts and never answers would hold every call ``attempts`` time-outs long.
- ``bad_answer``: an answer that is not JSON-RPC, an ``eth_chainId`` other than the one the
  client is pinned to (a provider that lies, or points at another chain), or a head older
  than the newest block already seen from any URL (a lagging backend: acting on it would
  read old state as new). Tried again like the others; but a head or a chain id that every
  URL, and the first one once more, gives is the chain's: handed to the caller (a chain
  that went back, or another chain, which ``ChainGuard`` then refuses in one line).
- ``refusal``: a well-formed JSON-RPC error (a revert, a nonce too low): the chain's own
  answer, handed to the caller as it is and never tried again here.

When every attempt failed, ``RpcUnavailable`` (a ``ConnectionError``, so the ledger's
callers treat it as the chain being down: nothing was refused) names the last failure.
``health()`` is what ``/status`` and the dashboard show: per URL, its answers and faults.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import requests
from web3 import HTTPProvider
from web3.providers.base import JSONBaseProvider
from web3.types import RPCEndpoint, RPCResponse

BACKOFF_S = 0.1
BACKOFF_CAP_S = 2.0
ATTEMPTS = 6
FAULTS = ("rate_limit", "server", "unreachable", "bad_answer")
HEAD_METHODS = ("eth_blockNumber",)
SENDS = ("eth_sendRawTransaction", "eth_sendTransaction")  # never sent twice blindly


class RpcUnavailable(ConnectionError):
    """No provider URL gave a usable answer within the attempts."""


class RpcTimeout(RpcUnavailable, TimeoutError):
    """The last provider tried accepted the request and did not answer in time."""


@dataclass
class Endpoint:
    url: str
    provider: HTTPProvider
    counts: Counter[str] = field(default_factory=Counter)
    last_fault: str = ""


def _head_of(method: str, response: Any) -> int | None:
    """The block number an answer says is the newest (eth_blockNumber, latest block)."""
    result = response.get("result") if isinstance(response, dict) else None
    try:
        if method in HEAD_METHODS and isinstance(result, str):
            return int(result, 16)
    except ValueError:
        return None
    return None


class FailoverProvider(JSONBaseProvider):
    """web3 provider over ``urls`` in turn (see the module docstring)."""

    def __init__(
        self,
        urls: list[str],
        *,
        timeout: float = 30,
        attempts: int = ATTEMPTS,
        expected_chain_id: int | None = None,
        seed: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__()
        if not urls:
            raise ValueError("no JSON-RPC URL given")
        self.endpoints = [
            Endpoint(
                url,
                HTTPProvider(
                    url, request_kwargs={"timeout": timeout}, exception_retry_configuration=None
                ),
            )
            for url in urls
        ]
        self.attempts = attempts
        self.chain_id = expected_chain_id  # pinned to the first answer when not configured
        self.highest = -1  # the newest head any URL answered
        self._current = 0
        self._rng = random.Random(seed)
        self._sleep = sleep
        self._lock = threading.Lock()

    @property
    def endpoint_uri(self) -> str:
        return self.endpoints[self._current].url

    def __str__(self) -> str:
        return "JSON-RPC over " + ", ".join(e.url for e in self.endpoints)

    def health(self) -> list[dict[str, Any]]:
        """Per URL: answers (``ok``), refusals, each fault's count, the last fault, and
        whether it is the one in use."""
        with self._lock:
            return [
                {
                    "url": e.url,
                    "current": i == self._current,
                    "ok": e.counts["ok"],
                    "refusal": e.counts["refusal"],
                    **{f: e.counts[f] for f in FAULTS},
                    "last_fault": e.last_fault,
                }
                for i, e in enumerate(self.endpoints)
            ]

    def faults(self) -> int:
        with self._lock:
            return sum(e.counts[f] for e in self.endpoints for f in FAULTS)

    def make_request(self, method: RPCEndpoint, params: Any) -> RPCResponse:
        last = ""
        start = self._current
        doubtful = 0  # answers that looked stale or from another chain
        for attempt in range(self.attempts):
            index = (start + attempt) % len(self.endpoints)
            endpoint = self.endpoints[index]
            kind, detail, wait = self._try(endpoint, method, params)
            if kind in ("stale", "foreign"):
                doubtful += 1
                if doubtful > len(self.endpoints) or attempt == self.attempts - 1:
                    # every URL, and the first one again, said so: the chain itself went back
                    # (a deep reorg, a development chain reverted), or is another chain than
                    # the one expected: the caller's own checks (ChainGuard) refuse it
                    with self._lock:
                        endpoint.counts["ok"] += 1
                        self._current = index
                        if kind == "stale":
                            self.highest = _head_of(method, detail) or -1
                    return detail  # type: ignore[no-any-return]
            if kind in ("ok", "refusal"):
                with self._lock:
                    endpoint.counts[kind] += 1
                    self._current = index
                return detail  # type: ignore[no-any-return]
            if kind in ("stale", "foreign"):
                kind, detail = "bad_answer", f"{kind} answer: {str(detail)[:100]}"
            with self._lock:
                endpoint.counts[kind] += 1
                endpoint.last_fault = f"{kind}: {str(detail)[:160]}"
            last = f"{endpoint.url}: {kind} ({str(detail)[:200]})"
            if isinstance(detail, requests.Timeout) and len(self.endpoints) == 1:
                raise RpcTimeout(f"the chain did not answer in time: {last}")
            if method in SENDS and kind != "rate_limit":
                # it may have arrived: the caller looks it up by hash (on the next URL)
                with self._lock:
                    self._current = (index + 1) % len(self.endpoints)
                raise RpcUnavailable(f"{method}: {last}")
            if attempt < self.attempts - 1:
                self._sleep(self._backoff(attempt, wait))
        raise RpcUnavailable(f"{method}: no usable answer after {self.attempts} tries: {last}")

    def _backoff(self, attempt: int, hint: float) -> float:
        base = min(BACKOFF_CAP_S, max(float(hint), BACKOFF_S * 2**attempt))
        return float(base * (1 + 0.5 * self._rng.random()))

    def _try(self, endpoint: Endpoint, method: RPCEndpoint, params: Any) -> tuple[str, Any, float]:
        """(kind, the answer or what went wrong, a backoff hint)."""
        try:
            response = endpoint.provider.make_request(method, params)
        except requests.HTTPError as exc:
            status = exc.response.status_code if exc.response is not None else 0
            if status == 429:
                return "rate_limit", exc, _retry_after(exc.response)
            return "server", exc, 0.0
        except (requests.ConnectionError, requests.Timeout, OSError) as exc:
            return "unreachable", exc, 0.0
        except ValueError as exc:  # not JSON
            return "bad_answer", exc, 0.0
        return self._judge(method, response)

    def _judge(self, method: str, response: Any) -> tuple[str, Any, float]:
        if not isinstance(response, dict) or ("result" not in response and "error" not in response):
            return "bad_answer", f"not a JSON-RPC answer: {str(response)[:100]}", 0.0
        if "error" in response:
            return "refusal", response, 0.0
        if method == "eth_chainId":
            try:
                got = int(response["result"], 16)
            except (TypeError, ValueError):
                return "bad_answer", f"chain id {response['result']!r}", 0.0
            with self._lock:
                if self.chain_id is None:
                    self.chain_id = got
                if got != self.chain_id:
                    return "foreign", response, 0.0
        head = _head_of(method, response)
        if head is not None:
            with self._lock:
                if head < self.highest:
                    return "stale", response, 0.0
                self.highest = head
        return "ok", response, 0.0


def _retry_after(response: Any) -> float:
    try:
        return min(BACKOFF_CAP_S, float(response.headers.get("Retry-After", 0)))
    except (AttributeError, TypeError, ValueError):
        return 0.0
