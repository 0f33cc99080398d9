"""Chaos on a hostile chain, and the chain's books afterwards (issue #55).

``ChaosSchedule`` is a seeded thread that, on a running ``HostileAnvil`` and the
``FaultProxy`` in front of it, sets the proxies' fault rates (10 % of requests in all by
default) and then, at seeded random gaps, injects a reorg of 1 to 3 blocks (the removed
transactions sent again, as a real chain's mempool takes them back), drops a pending
transaction (waiting up to two blocks for one to be there; the first drop leads and waits
up to a minute), or spikes the base fee tenfold
and to at least 10 gwei (once by default), counting each. The floor matters: anvil's base
fee falls towards zero on empty blocks, and the client offers twice the base fee plus a
1 gwei tip, so a tenfold spike of a near-zero base fee would stop nothing.

``reconcile`` reads the contract's events and state at the end (``chain_records`` of
``tests/helpers/books.py`` for submissions, votes, status and slashes; the ``Slashed``,
``Settled`` and ``Claimed`` events here) and the accounts' nonces and mempool, and
``check`` returns, for each figure, the lines that explain it (its count is the number of
lines; all empty: the books add up):

- ``lost``: work a worker meant to submit that is not on-chain, and work on-chain that has
  no final verdict;
- ``paid_twice``: a worker settled more entries than it submitted, settled more reward than
  its accepted work is worth, or claimed more reward than was settled to it;
- ``slashed_twice``: a submission slashed more than once, or slashed though accepted;
- ``honest_slashed``: a reject vote on an honest worker's batch, or a slash the chain counts
  for one (``books.honest_slashes``);
- ``stuck_nonces``: an account whose ``latest`` and ``pending`` nonces differ, or with
  transactions still in the mempool.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tests.helpers.books import Books, Key, Vote, Work, chain_records, honest_slashes, key_text
from tests.helpers.hostilechain import FAULTS, FaultProxy, HostileAnvil

# 10 % of requests in all: what a busy public endpoint does on a bad day
BITES = {"reorg": "reorgs", "drop": "dropped", "spike": "fee_spikes"}  # what each kind counts
RPC_RATES = {"429": 0.03, "500": 0.02, "timeout": 0.01, "reset": 0.02, "stale": 0.015}
RPC_RATES["wrong_chain"] = 0.005
FIGURES = ("lost", "paid_twice", "slashed_twice", "honest_slashed", "stuck_nonces")


class ChaosSchedule:
    """Chain and RPC faults at seeded moments, in a thread (``start`` .. ``stop``)."""

    def __init__(
        self,
        anvil: HostileAnvil,
        proxies: list[FaultProxy],
        *,
        seed: int = 0,
        gap_s: tuple[float, float] = (3.0, 8.0),
        rates: dict[str, float] | None = None,
        spikes: int = 1,
        spike_factor: float = 10.0,
        spike_floor_wei: int = 10 * 10**9,
        first_drop_wait_s: float = 60.0,
    ) -> None:
        self.anvil = anvil
        self.proxies = proxies
        self.rng = random.Random(seed)
        self.gap_s = gap_s
        self.rates = dict(RPC_RATES if rates is None else rates)
        self.spikes = spikes
        self.spike_factor = spike_factor
        self.spike_floor_wei = spike_floor_wei
        self.first_drop_wait_s = first_drop_wait_s
        self.log: list[tuple[float, str, str]] = []  # (seconds since start, kind, what)
        self.errors: list[str] = []  # injections the chain refused
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="chaos")
        self._began = 0.0

    @property
    def counts(self) -> dict[str, int]:
        """What was injected so far: the chain's counts, and the proxies' faults."""
        rpc = Counter[str]()
        for p in self.proxies:
            rpc.update({k: v for k, v in p.counts.items() if k in FAULTS})
        a = self.anvil.counts
        return {
            "reorgs": a["reorgs"],
            "reorged_txs": a["reorged_txs"],
            "dropped": a["dropped"],
            "fee_spikes": a["fee_spikes"],
            "rpc_faults": sum(rpc.values()),
            **{f"rpc_{k}": rpc[k] for k in FAULTS},
        }

    def start(self) -> ChaosSchedule:
        self._began = time.monotonic()
        for p in self.proxies:
            p.set_rates(**self.rates)
        self._thread.start()
        return self

    def stop(self) -> dict[str, int]:
        """No more faults (the proxies forward everything again); the counts."""
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(60)
        for p in self.proxies:
            p.set_rates(**dict.fromkeys(FAULTS, 0.0))
        return self.counts

    def _run(self) -> None:
        # every kind first, until each has bitten once (a drop from an empty mempool, a
        # reorg at genesis do not: that kind goes to the back and comes again), then at
        # random: a run that settles early still met each kind of fault. The drop leads and
        # waits up to ``first_drop_wait_s`` for a transaction: the chaos starts at the first
        # verdict, when most of a short run's transactions are still to come (one that
        # waited behind the others for two blocks met an idle mempool and never bit)
        others = [k for k in self._kinds() if k != "drop"]
        first = ["drop", *self.rng.sample(others, len(others))]
        while not self._stop.wait(self.rng.uniform(*self.gap_s)):
            again = bool(first)  # one of the first round: again until it bites
            kind = first.pop(0) if first else self.rng.choice(self._kinds())
            before = self.anvil.counts[BITES[kind]]
            try:
                what = self.inject(kind, patient=again)
            except Exception as exc:  # the chain refused or did not answer: noted, go on
                self.errors.append(f"{kind}: {exc}")
                what = None
            if what is not None:
                self.log.append((round(time.monotonic() - self._began, 1), kind, what))
            if again and self.anvil.counts[BITES[kind]] == before:
                first.append(kind)  # it did not bite: again, after the others

    def _kinds(self) -> list[str]:
        return ["reorg", "drop"] + (["spike"] if self.spikes > 0 else [])

    def inject(self, kind: str, *, patient: bool = False) -> str | None:
        """One fault of ``kind``; what it did (None: nothing, at genesis there is no reorg).
        ``patient``: a drop waits up to ``first_drop_wait_s`` (or ``stop``) for a
        transaction to come, not two blocks."""
        if kind == "reorg":
            depth = self.rng.randint(1, 3)
            if self.anvil.head() == 0:
                return None
            removed = self.anvil.reorg(depth)
            return f"depth {depth}, {len(removed)} transactions sent again"
        if kind == "drop":
            two_blocks = 2 * (self.anvil.block_time or 1)
            until = time.monotonic() + (self.first_drop_wait_s if patient else 0.0)
            while True:  # in slices of two blocks, so that ``stop`` is heard
                dropped = self.anvil.drop_pending(1, self.rng, wait_s=two_blocks)
                if dropped or time.monotonic() >= until or self._stop.is_set():
                    return f"dropped {dropped or 'nothing (mempool empty)'}"
        self.spikes -= 1
        fee = self.anvil.spike_fees(self.spike_factor, at_least=self.spike_floor_wei)
        return f"base fee now {fee} wei"


# ---- the books ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Slash:
    """A ``Slashed`` event: the worker's submission at ``index`` lost ``stake``."""

    worker: str
    index: int
    stake: int


@dataclass(frozen=True)
class Settle:
    """A ``Settled`` event: ``entries`` of the worker's submissions settled, ``reward`` paid."""

    worker: str
    entries: int
    reward: int


@dataclass
class ChainBooks:
    """What ``check`` reconciles, as plain data (``read_chain_books`` reads it)."""

    submitted: dict[Key, Work]
    votes: dict[Key, list[Vote]]
    status: dict[Key, str]
    slashed: dict[str, int]  # worker -> slashes the chain counts
    honest: set[str]
    index_of: dict[tuple[str, int], Key]  # (worker, FIFO index) -> key
    rewards: dict[Key, int]  # the reward each submission is worth if accepted
    slashes: list[Slash]
    settles: list[Settle]
    claimed: dict[str, int]  # account -> worker reward claimed (Claimed.reward)
    nonces: dict[str, tuple[int, int]]  # account -> (latest, pending)
    mempool: dict[str, list[int]]  # account -> nonces of its transactions still pending
    expected: set[Key] | None = None  # what the workers meant to submit (None: unknown)
    notes: list[str] = field(default_factory=list)


def _lost(b: ChainBooks) -> list[str]:
    expected = sorted((w.lower(), k) for w, k in b.expected or ())
    out = [
        f"{key_text(k)}: meant to be submitted, not on-chain"
        for k in expected
        if k not in b.submitted
    ]
    out += [
        f"{key_text(k)}: submitted, no final verdict (status {b.status.get(k)})"
        for k in b.submitted
        if b.status.get(k) not in ("accepted", "rejected")
    ]
    return out


def _paid_twice(b: ChainBooks) -> list[str]:
    out = []
    workers = {w for w, _ in b.submitted} | {s.worker for s in b.settles}
    for w in sorted(workers):
        submitted = sum(1 for k in b.submitted if k[0] == w)
        entries = sum(s.entries for s in b.settles if s.worker == w)
        if entries > submitted:
            out.append(f"{w}: {entries} entries settled, {submitted} submitted")
        worth = sum(r for k, r in b.rewards.items() if k[0] == w and b.status.get(k) == "accepted")
        paid = sum(s.reward for s in b.settles if s.worker == w)
        if paid > worth:
            out.append(f"{w}: settled {paid} wei of reward, its accepted work is worth {worth}")
        if b.claimed.get(w, 0) > paid:
            out.append(f"{w}: claimed {b.claimed[w]} wei of reward, {paid} settled to it")
    return out


def _slashed_twice(b: ChainBooks) -> list[str]:
    out = []
    for (w, i), n in sorted(Counter((s.worker, s.index) for s in b.slashes).items()):
        key = b.index_of.get((w, i))
        what = key_text(key) if key else f"{w}:#{i}"
        if n > 1:
            out.append(f"{what}: slashed {n} times")
        if key is not None and b.status.get(key) == "accepted":
            out.append(f"{what}: slashed, though accepted")
    return out


def _honest_slashed(b: ChainBooks) -> list[str]:
    books = Books(
        async_level=0,
        honest=b.honest,
        names={},
        submitted=b.submitted,
        votes=b.votes,
        status=b.status,
        slashed=b.slashed,
        stored={},
        lines=[],
        state={},
    )
    return honest_slashes(books)


def _stuck(b: ChainBooks) -> list[str]:
    out = []
    for account, (latest, pending) in sorted(b.nonces.items()):
        if latest != pending:
            out.append(f"{account}: nonce {latest} mined, {pending} pending")
        if b.mempool.get(account):
            out.append(f"{account}: nonces {b.mempool[account]} still in the mempool")
    return out


def check(b: ChainBooks) -> dict[str, list[str]]:
    """Each figure's lines (see the module docstring); all empty: the books add up."""
    return {
        "lost": _lost(b),
        "paid_twice": _paid_twice(b),
        "slashed_twice": _slashed_twice(b),
        "honest_slashed": _honest_slashed(b),
        "stuck_nonces": _stuck(b),
    }


def figures(lines: dict[str, list[str]]) -> dict[str, int]:
    return {k: len(v) for k, v in lines.items()}


# ---- reading them ------------------------------------------------------------------------------


def _mempool(w3: Any) -> dict[str, list[int]]:
    """Pending nonces per sender (checksummed), from ``txpool_content`` (anvil, geth)."""
    answer = w3.provider.make_request("txpool_content", [])
    pool = answer.get("result") or {}
    out: dict[str, list[int]] = {}
    for part in ("pending", "queued"):
        for sender, by_nonce in (pool.get(part) or {}).items():
            out.setdefault(w3.to_checksum_address(sender), []).extend(int(n) for n in by_nonce)
    return {k: sorted(v) for k, v in out.items()}


def read_chain_books(
    client: Any,
    *,
    workers: list[str],
    accounts: list[str],
    honest: set[str] | None = None,
    expected: set[Key] | None = None,
    from_block: int = 0,
) -> ChainBooks:
    """The books from the chain (``client``: a ``LedgerClient``): ``workers``' submissions,
    votes, slashes and settlements, and every one of ``accounts``' nonces and mempool
    transactions. ``honest``: the workers that never cheat (default: all)."""
    w3, events = client.w3, client.contract.events
    submitted, votes, status, slashed = chain_records(client, workers)
    logs = {
        name: list(getattr(events, name).get_logs(from_block=from_block))
        for name in ("WorkSubmitted", "Slashed", "Settled", "Claimed")
    }
    index_of: dict[tuple[str, int], Key] = {}
    rewards: dict[Key, int] = {}
    for e in logs["WorkSubmitted"]:
        key = (str(e["args"]["worker"]).lower(), bytes(e["args"]["key"]))
        index_of[(key[0], int(e["args"]["index"]))] = key
        rewards[key] = int(e["args"]["reward"])
    claimed: Counter[str] = Counter()
    for e in logs["Claimed"]:
        claimed[str(e["args"]["account"]).lower()] += int(e["args"]["reward"])
    pool = _mempool(w3)
    nonces = {
        a: (
            int(w3.eth.get_transaction_count(a, "latest")),
            int(w3.eth.get_transaction_count(a, "pending")),
        )
        for a in (w3.to_checksum_address(x) for x in accounts)
    }
    return ChainBooks(
        submitted=submitted,
        votes=votes,
        status=status,
        slashed={a.lower(): n for a, n in slashed.items()},
        honest={a.lower() for a in (workers if honest is None else honest)},
        index_of=index_of,
        rewards=rewards,
        slashes=[
            Slash(
                str(e["args"]["worker"]).lower(), int(e["args"]["index"]), int(e["args"]["stake"])
            )
            for e in logs["Slashed"]
        ],
        settles=[
            Settle(
                str(e["args"]["worker"]).lower(),
                int(e["args"]["entries"]),
                int(e["args"]["reward"]),
            )
            for e in logs["Settled"]
        ],
        claimed=dict(claimed),
        nonces=nonces,
        mempool={a: pool[a] for a in nonces if pool.get(a)},
        expected=expected,
    )


def reconcile(
    client: Any,
    *,
    workers: list[str],
    accounts: list[str],
    honest: set[str] | None = None,
    expected: set[Key] | None = None,
    from_block: int = 0,
) -> tuple[dict[str, int], dict[str, list[str]]]:
    """The figures (``lost``, ``paid_twice``, ``slashed_twice``, ``honest_slashed``,
    ``stuck_nonces``) and the lines that explain them, from the chain as it is now."""
    books = read_chain_books(
        client,
        workers=workers,
        accounts=accounts,
        honest=honest,
        expected=expected,
        from_block=from_block,
    )
    lines = check(books)
    return figures(lines), lines
