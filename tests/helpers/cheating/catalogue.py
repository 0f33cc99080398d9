"""The cheats a test can make a worker commit: the catalogue, and the setting that names them.

Each cheat is a shortcut a worker could take for profit, not a random corruption; the
validators must reject every one on-chain with the reason in ``CATALOGUE`` (SPEC §19.1 has
the matrix: what each one saves, which check catches it). A cheating worker
(``tests/helpers/cheating/worker.py``: the real binary with its inference role and batch
maker swapped for the ones here) is given several, comma-separated (``parse_cheats``): its
batches make them in turn, one each, then start over (``pick``), so one cheating process
exercises several cheats in one run; a version cheat that cannot be made yet (no older
version held, or only one with the same weights) leaves its batch honest and is tried
again on the next. Where a cheat acts:

- in the batch maker (``maker.py``, the worker's child process): other weights
  (``WEIGHT_CHEATS``, applied to the engine's model once per policy version), other
  sampling parameters, other tasks or another batch's rollouts, or edits after proving;
- in the inference role (``role.py``): which weights generate the batch, the units and
  the work key submitted, the key the batch is signed with, and serving; and the splits
  (``SPLITS``), where it rotates its registered key or runs a step ahead around whom it
  serves.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cheat:
    family: str  # cheaper compute, forged evidence, inflated claim, availability
    reason: str  # the ledger's reason a validator rejects it with (SPEC §19)
    what: str  # what the worker does, and what it hopes to gain


CATALOGUE: dict[str, Cheat] = {
    "other_weights": Cheat(
        "compute",
        "invalid",
        "generates with another model of the same shape (every weight redrawn)",
    ),
    "int8_weights": Cheat(
        "compute", "invalid", "generates with the policy's weights quantized to int8 per row"
    ),
    "fewer_layers": Cheat(
        "compute", "invalid", "generates with the policy's last decoder layer dropped"
    ),
    "stale_weights": Cheat(
        "compute",
        "invalid",
        "generates with the oldest version it holds (the base model), claims the newest",
    ),
    "older_version": Cheat(
        "compute",
        "invalid",
        "generates with the oldest version inside the window, claims the newest it holds",
    ),
    "foreign_proofs": Cheat(
        "evidence", "invalid", "each rollout carries the proofs of another prompt's rollout"
    ),
    "edit_token": Cheat("evidence", "invalid", "changes one output token after proving"),
    "greedy": Cheat(
        "evidence", "invalid", "decodes greedily, claims the run's sampling temperature"
    ),
    "other_temperature": Cheat(
        "evidence", "invalid", "samples at half the run's temperature (higher rewards)"
    ),
    "early_stop": Cheat(
        "evidence", "invalid", "stops its longest rollout half-way and claims EOS there"
    ),
    "truncated": Cheat(
        "evidence", "invalid", "cuts its longest rollout in half and claims it complete"
    ),
    "inflate_reward": Cheat("claims", "invalid", "claims reward 1 for every sample"),
    "inflate_units": Cheat("claims", "mismatch", "submits twice its batch's tokens as units"),
    "easy_tasks": Cheat(
        "claims", "invalid", "does the easiest of 8 other steps' tasks instead of its own"
    ),
    "replay_step": Cheat(
        "claims", "invalid", "sends the rollouts of an earlier step as this step's"
    ),
    "replay_other": Cheat(
        "claims", "invalid", "sends another worker's rollouts (its tasks) as its own"
    ),
    "key_mismatch": Cheat(
        "claims",
        "unavailable",
        "submits a work key before the work, serves a batch that does not hash to it",
    ),
    "other_key": Cheat(
        "claims", "invalid", "signs its batches with a peer key it did not register"
    ),
    "withhold": Cheat("availability", "unavailable", "submits and announces, never serves"),
}
# Shortcuts no validator can punish (SPEC §19.1, "Availability"): the batch is real work, so
# those who fetch it accept it, and the others' ``unavailable`` votes are unbonded, one each,
# below the quorum that would overturn the accept. What it saves is upload bandwidth alone.
UNPUNISHED: dict[str, Cheat] = {
    "serve_some": Cheat(
        "availability",
        "none",
        "serves each batch to the run's trainer and the first other peer that asks, nobody else",
    ),
}
# Attacks on the validators rather than the work (issue #54): the batch is honest, and the
# worker serves it so that honest validators might judge it differently, one of them first
# with a bonded reject that the others overturn (its bond burned). Every validator must
# reach the same verdict: accepted. Each is made once per worker (``CheatPlan.next``).
SPLITS: dict[str, Cheat] = {
    "rotate_split": Cheat(
        "split",
        "none",
        "submits an honest batch, rotates its registered peer key on-chain, serves the first "
        "validator that asks, rotates back and serves the others",
    ),
    "ahead_split": Cheat(
        "split",
        "none",
        "makes the next step's batch before the trainer announces it and serves it to the "
        "first validator that asks then, to the others once the step is announced",
    ),
}
WEIGHT_CHEATS = ("other_weights", "int8_weights", "fewer_layers")


def pick(cheats: tuple[str, ...], batch_number: int) -> str:
    """The ``batch_number``-th cheat made (0-based), in turn."""
    return cheats[batch_number % len(cheats)] if cheats else "none"


CHEATS = (*CATALOGUE, *UNPUNISHED, *SPLITS)
# ``other_key`` acts on every batch (it registers another peer key): not combined with others
WORKER_WIDE_CHEATS = ("other_key",)


def parse_cheats(spec: str) -> tuple[str, ...]:
    """The cheats of a setting: ``none`` (empty), or names comma-separated."""
    names = tuple(n.strip() for n in spec.split(",") if n.strip())
    if names in ((), ("none",)):
        return ()
    for n in names:
        if n not in CHEATS:
            raise ValueError(f"unknown cheat {n!r}; known: none, {', '.join(CHEATS)}")
    if len(names) > 1 and any(n in WORKER_WIDE_CHEATS for n in names):
        raise ValueError(f"{', '.join(WORKER_WIDE_CHEATS)} acts on every batch: give it alone")
    return names
