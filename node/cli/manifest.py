"""``start``'s run manifest (SPEC §2), before the node of the run is built.

The trainer with ``[run] manifest_name`` signs its manifest, whose terms name its run id
(``trainer_manifest``). A worker or validator without the trainer's peer id, whose run id
is not given or is a derived one, finds the manifest through its bootstrap peers
(``join_run``): a short-lived node under a run id of its own asks them, the manifest is
checked, every setting the node was given is compared with it (a contradiction stops the
node in one line naming both values), its model directory and task set file against the
hashes, and the node then starts with the manifest's settings. All of it happens before
the role starts: no stake is locked and nothing but the node's identity is written before
the manifest passed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from crypto.identity import Identity
from node.config import NodeConfig
from node.config.manifest import (
    ManifestError,
    check_files,
    contradictions,
    settings_of,
    terms_of,
)
from node.files import file_digest, model_files
from node.net.bans import PeerBans, load_bans, save_bans
from node.net.runs import JOINING_RUN, Found, JoinError, choose_run, find_runs
from node.tasks import builtin_taskset
from protocol.manifest import (
    RUN_FILES_MODEL,
    RUN_FILES_TASKSET,
    RunManifest,
    is_derived_run_id,
    open_run_manifest,
)
from protocol.wire import seal

if TYPE_CHECKING:
    from node.shardcast.service import WeightService

JOIN_PATIENCE = 20.0  # seconds a joining node asks its bootstrap peers for a run


def trainer_manifest(cfg: NodeConfig, identity: Identity) -> tuple[NodeConfig, bytes | None]:
    """The trainer's config with the run id its manifest names, and the signed manifest
    envelope; ``(cfg, None)`` for any other node, or a trainer without ``manifest_name``."""
    if cfg.role != "trainer" or cfg.run.manifest_name is None:
        return cfg, None
    if cfg.run.model is None:
        raise ManifestError("a run manifest names the base model: pass --model DIR")
    taskset = None if builtin_taskset(cfg.run.taskset) else file_digest(Path(cfg.run.taskset))
    terms = terms_of(cfg, identity.peer_id, model_files(cfg.run.model), taskset)
    run_id = terms.run_id()
    if "id" in cfg.run.model_fields_set and cfg.run.id != run_id:
        raise ManifestError(
            f"--run-id {cfg.run.id} contradicts the run manifest: its terms hash to run {run_id}"
        )
    now_us = time.time_ns() // 1000
    manifest = RunManifest(
        run_id=run_id, sender=identity.peer_id, seq=now_us, ts_ms=now_us // 1000, terms=terms
    )
    return cfg.changed({"run.id": run_id}), seal(identity, manifest)


def joins(cfg: NodeConfig) -> bool:
    """Whether this node finds its run's manifest through its bootstrap peers: a worker or
    validator not given the trainer's peer id, whose run id is not given or is a derived
    one (a hand-made run id, ``devnet``'s, names a run without a manifest)."""
    given = "id" in cfg.run.model_fields_set
    return (
        cfg.role in ("inference", "validator")
        and cfg.run.trainer_peer_id is None
        and (not given or is_derived_run_id(cfg.run.id))
    )


def join_run(cfg: NodeConfig, identity: Identity) -> tuple[NodeConfig, bytes | None, list[str]]:
    """For a node that ``joins``: its config with the manifest's settings, the manifest's
    envelope, and one line per bootstrap peer refused on the way; ``(cfg, None, [])`` for
    any other. ``JoinError`` or ``ManifestError`` (one line) if it cannot join."""
    if not joins(cfg):
        return cfg, None, []
    import trio

    if not cfg.net.bootstrap:
        raise JoinError(
            "no --run.trainer-peer-id and no --bootstrap: give a bootstrap peer to find the "
            "run's manifest through"
        )
    want = cfg.run.id if "id" in cfg.run.model_fields_set else None
    probe = cfg.changed(
        {"run.id": JOINING_RUN, "net.bootstrap": [], "net.listen": ["/ip4/0.0.0.0/tcp/0"]}
    )
    bans = load_bans(cfg.resolved_data_dir, time.time())
    found = trio.run(_ask_bootstraps, probe, cfg.net.bootstrap, identity, want, bans)
    save_bans(cfg.resolved_data_dir, bans, time.time())  # a forger stays refused next time
    manifest, envelope = choose_run(found, want)
    settings = settings_of(manifest)
    given_taskset = "taskset" in cfg.run.model_fields_set and not builtin_taskset(cfg.run.taskset)
    lines = contradictions(cfg, settings)
    if cfg.run.model is not None:  # without one, the run's files come from the swarm
        lines += check_files(
            manifest,
            model_files(cfg.run.model),
            file_digest(Path(cfg.run.taskset)) if given_taskset else None,
        )
    if lines:
        raise ManifestError("; ".join(lines))
    return cfg.changed(settings), envelope, list(found.refused.values())


async def _ask_bootstraps(
    probe: NodeConfig, bootstrap: list[str], identity: Identity, want: str | None, bans: PeerBans
) -> Found:
    import trio

    from node.net.runtime import Node

    node = Node(probe, identity)
    async with trio.open_nursery() as nursery:
        await nursery.start(node.serve)
        try:
            return await find_runs(node, bootstrap, want=want, patience=JOIN_PATIENCE, bans=bans)
        finally:
            node.request_stop()


PULL_PATIENCE = 120.0  # seconds a joining node waits for a peer serving the run's files


async def take_run_files(
    cfg: NodeConfig, weights: WeightService, envelope: bytes | None, joined: bool
) -> NodeConfig:
    """The run's files over SHARDCAST (``node/shardcast/runfiles.py``), before the role
    starts: the trainer of a manifest serves its own; a node that joined without a model
    pulls them, checked, and works with them (its config names them: ``run.model``, and
    ``run.taskset`` for a task file). Any other node: ``cfg`` as it is. ``RunFilesError``
    (one line) if they cannot be had, do not fit the disk, or the weights the memory."""
    from node.shardcast.runfiles import (
        RunFilesError,
        available_memory,
        memory_line,
        weights_bytes,
    )

    if envelope is None:
        return cfg
    terms = open_run_manifest(envelope).terms
    if cfg.role == "trainer" and not joined:
        assert cfg.run.model is not None
        taskset = None if builtin_taskset(cfg.run.taskset) else Path(cfg.run.taskset)
        await weights.run_files.publish(terms, cfg.run.model, taskset)
        return cfg
    if not joined or cfg.run.model is not None:
        return cfg

    def report(line: str) -> None:
        print(f"intellect-node: {line}", flush=True)

    line = memory_line(weights_bytes(terms), available_memory())
    if line is not None:  # before a byte is pulled, and before any stake
        raise RunFilesError(line)
    files = await weights.run_files.pull(terms, report, patience=PULL_PATIENCE)
    changes: dict[str, object] = {"run.model": str(files / RUN_FILES_MODEL)}
    if terms.taskset_file:
        changes["run.taskset"] = str(files / RUN_FILES_TASKSET / terms.taskset_file[0].name)
    return cfg.changed(changes)
