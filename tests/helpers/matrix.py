"""The cheating matrix on one devnet (``tests/test_matrix.py`` and ``bench/adversarial.py``).

Honest workers and cheating ones, each cheater cycling through a few cheats of the
catalogue (``tests/helpers/cheating/catalogue.py``, SPEC §19.1) one batch each, a trainer and one
validator, on the served development chain. ``run_matrix`` runs until every cheat was made
``trials`` times and judged, stops the clock, waits for every verdict, settles every worker
after the challenge period and reads the books back from the chain, the workers' own
records of what each batch was (the ``cheating`` section of their status) and the trainer's state.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from ledger.codes import REASON_NAMES
from node.cli.devnet import wait_ready
from tests.helpers.net import wait_until
from tests.test_loop import Loop, submissions, verdict_events

Sub = tuple[str, bytes]  # (worker address, work key)

# few processes (the machine is small), each making its cheats in turn, one batch each (one
# pass: one batch per trainer step, so the run lasts as many steps as the longest list).
# A version cheat is made only once the trainer has published a version far enough from an
# older one in the window to tell apart (SPEC §19.1; before, the batch is honest, must be
# accepted, and the cheat comes again on the next batch): ``stale_weights`` (the base model)
# comes last in its list, by when some step has trained; ``older_version`` comes first in
# its (after ``greedy``), and is made once the worker holds an older version in the window
# that a step trained away from. ``greedy`` comes first of all in its list: it is made only
# while verification can tell it (SPEC §19.1), and a policy that learned level 1 at this
# learning rate soon decodes greedily what its seeded draws would give, near-ties aside.
# ``withhold`` comes first in its list: its verdict waits for the fetch deadline, which then
# passes while the other cheats are made.
CHEATERS = {
    "c-compute": "other_weights,int8_weights,fewer_layers,foreign_proofs,edit_token,stale_weights",
    "c-sampling": "greedy,older_version,other_temperature,early_stop,truncated,inflate_reward",
    "c-claims": "withhold,inflate_units,easy_tasks,replay_step,replay_other,key_mismatch",
    "c-key": "other_key",
}
HONEST = ("honest-0", "honest-1")
# fetch deadline = verdict window // 6 = 120 s: a withheld batch is rejected as unavailable
# then (and a loaded machine's slow fetches still land before it); the chain's window is the
# nodes' (the tests' ASYNC_LEVEL 5): a loaded machine's slow downloads and generation still
# submit in time, and a worker holds older versions inside it for ``older_version``
CHAIN_ARGS = ["--verdict-window", "720", "--max-staleness", "5"]


@dataclass
class MatrixBooks:
    """What the run did, from the chain and the nodes' own records."""

    made: dict[Sub, str]  # each submission -> the cheat it made ("none": honest work)
    worker_of: dict[str, str]  # address -> node name
    status: dict[Sub, str]  # accepted / rejected (on-chain)
    reason: dict[Sub, str | None]  # the rejection's reason (SPEC §19), None if accepted
    verdicts: dict[Sub, int]  # verdict events per submission
    slashed: dict[Sub, int]  # stake taken from the worker at settlement (Slashed events)
    collateral: dict[Sub, int]
    consumed: set[Sub]  # what the trainer trained on
    stake_lost: dict[str, int] = field(default_factory=dict)  # per node, at settlement
    judged_by_validator: int = 0

    def per_attack(self) -> dict[str, dict[str, int]]:
        """attack -> trials, detected (rejected with the catalogue's reason), slashed
        (its collateral taken), trained (by the trainer: must be 0)."""
        out: dict[str, Counter[str]] = {}
        for sub, cheat in self.made.items():
            if cheat == "none":
                continue
            row = out.setdefault(cheat, Counter())
            row["trials"] += 1
            row["detected"] += int(self.detected(sub, cheat))
            row["slashed"] += int(self.slashed.get(sub, 0) == self.collateral[sub] > 0)
            row["trained"] += int(sub in self.consumed)
        return {
            k: {f: v[f] for f in ("trials", "detected", "slashed", "trained")}
            for k, v in out.items()
        }

    def detected(self, sub: Sub, cheat: str) -> bool:
        """Whether ``sub`` was rejected with the reason the catalogue gives ``cheat``."""
        from tests.helpers.cheating.catalogue import CATALOGUE

        return self.status[sub] == "rejected" and self.reason[sub] == CATALOGUE[cheat].reason

    def misses(self, cheat: str) -> list[tuple[str, str, str | None]]:
        """(work key, status, reason) of each batch of ``cheat`` not ``detected``: what a
        failed run says about them."""
        return [
            (sub[1].hex()[:16], self.status[sub], self.reason[sub])
            for sub, c in self.made.items()
            if c == cheat and not self.detected(sub, cheat)
        ]

    def honest(self) -> list[Sub]:
        return [s for s, c in self.made.items() if c == "none"]

    def honest_false_slashes(self) -> int:
        return sum(1 for s in self.honest() if self.status[s] != "accepted" or self.slashed.get(s))


def start(loop: Loop, cheaters: dict[str, str], honest: tuple[str, ...]) -> None:
    loop.env["INTELLECT_NODE_TRAINER__BATCHES_PER_STEP"] = str(len(honest))
    loop.env["INTELLECT_NODE_TRAINER__EVAL_EVERY"] = "0"  # the books need no held-out accuracy
    # a step that trains moves the policy ~2e-2 apart at this rate, beyond what verification
    # tells apart (DETECTABLE_APART, SPEC §19.1); at the devnet's 1e-4 an older version is
    # within the noise and ``older_version`` could never be made. A step trains only on
    # groups with unequal rewards: on level 1 the tiny policy is right about 60% of the time
    # (on levels 1-5, 10-25%: most steps trained nothing, every version stayed the same)
    loop.env["INTELLECT_NODE_TRAINER__LEARNING_RATE"] = "1e-3"
    loop.env["INTELLECT_NODE_RUN__TASKSET"] = "arithmetic:1-1"
    # a loaded machine (each worker and its engine compete for the CPU) may answer a fetch
    # slowly: an honest batch must not end "unavailable" for it, nor a cheat's
    loop.env["INTELLECT_NODE_NET__READ_TIMEOUT"] = "30"
    loop.env["INTELLECT_NODE_NET__CONNECT_TIMEOUT"] = "20"
    loop.spawn("trainer", "trainer")
    loop.validator()
    for name in honest:
        loop.worker(name)
    for name, cheats in cheaters.items():
        loop.worker(name, cheats)
    for node in loop.nodes.values():
        wait_ready(node, timeout=600)


def made_by(loop: Loop, name: str) -> dict[str, str]:
    return dict((loop.section(name, "cheating") or {}).get("made", {}))


def run_matrix(
    loop: Loop,
    cheaters: dict[str, str] = CHEATERS,
    honest: tuple[str, ...] = HONEST,
    *,
    trials: int = 1,
    timeout: float = 1500,
) -> MatrixBooks:
    start(loop, cheaters, honest)

    def enough() -> bool:
        for name, cheats in cheaters.items():
            counts = Counter(made_by(loop, name).values())
            if any(counts[c] < trials for c in cheats.split(",")):
                return False
        return all((loop.section(n, "inference") or {}).get("accepted", 0) >= 1 for n in honest)

    try:
        wait_until(enough, timeout, f"every cheat made {trials} time(s)", interval=3)
    except AssertionError as exc:  # say where the run stood: which cheat, which node
        raise AssertionError(f"{exc}\n{where(loop, cheaters, honest, trials)}") from None
    loop.nodes["trainer"].stop()  # the clock stops: no new steps, so no new batches
    client = loop.client()
    workers = (*honest, *cheaters)

    def all_judged() -> bool:
        subs = submissions(client)
        return all(client.submission(w, k).status != "pending" for w, k in subs) and all(
            (loop.section(n, "inference") or {}).get("unjudged") == 0 for n in workers
        )

    wait_until(all_judged, 300, "every submitted batch to be judged", interval=3)
    return books(loop, client, workers)


def where(loop: Loop, cheaters: dict[str, str], honest: tuple[str, ...], trials: int) -> str:
    """The run's state when it timed out: each worker's step, versions, counts and the
    cheats it has still to make, and the trainer's step."""
    keys = ("step", "policy_version", "version_used", "weights_held", "last_batch_step")
    keys += ("generated", "submitted", "accepted", "rejected", "unjudged", "stale", "errors")
    trainer = loop.section("trainer", "trainer") or {}
    out = [f"trainer: { {k: v for k, v in trainer.items() if k not in ('curve', 'last')} }"]
    out.append(f"validator: {loop.section('validator', 'validator')}")
    for name in (*honest, *cheaters):
        got = loop.section(name, "inference") or {}
        row = {k: got.get(k) for k in keys}
        if name in cheaters:
            counts = Counter(made_by(loop, name).values())
            row["missing"] = [c for c in cheaters[name].split(",") if counts[c] < trials]
        out.append(f"{name}: {row}")
    return "\n".join(out)


def books(loop: Loop, client, workers: tuple[str, ...]) -> MatrixBooks:
    worker_of = {loop.addresses[n]: n for n in workers}
    made: dict[Sub, str] = {}
    for name in workers:
        own = made_by(loop, name)
        for w, k in submissions(client):
            if w == loop.addresses[name]:
                made[(w, k)] = own.get(k.hex(), "none")
    infos = {s: client.submission(*s) for s in made}
    verdicts = {s: len(v) for s, v in verdict_events(client).items()}
    state = json.loads((loop.base / "trainer" / "trainer-state.json").read_text())
    consumed = {
        (t.split(":")[0], bytes.fromhex(t.split(":")[1])) for t in state.get("consumed", {})
    }
    before = {n: client.worker(loop.addresses[n]).stake for n in workers}
    params = client.params()
    client.chain.advance_time(params.verdict_window + params.reward_lock + 10)
    from eth_account import Account

    from ledger.client import LedgerClient

    anyone = LedgerClient(
        client.chain, client.contract.address, Account.from_key(loop.chain_info["funder_key"])
    )
    for name in workers:
        anyone.settle(loop.addresses[name])
    by_index = {(w, infos[(w, k)].index): (w, k) for (w, k) in made}
    slashed: dict[Sub, int] = {}
    for e in client.contract.events.Slashed.get_logs(from_block=0):
        sub = by_index.get((str(e["args"]["worker"]).lower(), int(e["args"]["index"])))
        if sub is not None:
            slashed[sub] = slashed.get(sub, 0) + int(e["args"]["stake"])
    return MatrixBooks(
        made=made,
        worker_of=worker_of,
        status={s: i.status for s, i in infos.items()},
        reason={
            s: REASON_NAMES.get(i.reason) if i.status == "rejected" else None
            for s, i in infos.items()
        },
        verdicts={s: verdicts.get(s, 0) for s in made},
        slashed=slashed,
        collateral={s: i.collateral for s, i in infos.items()},
        consumed=consumed,
        stake_lost={n: before[n] - client.worker(loop.addresses[n]).stake for n in workers},
        judged_by_validator=(loop.section("validator", "validator") or {}).get("judged", 0),
    )
