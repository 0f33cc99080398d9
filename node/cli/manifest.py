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

import sys
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
from node.files import file_digest, model_files, write_atomic
from node.net.bans import PeerBans, load_bans, save_bans
from node.net.runs import (
    JOINING_RUN,
    KEPT_FILE,
    Found,
    JoinError,
    choose_with_kept,
    find_runs,
)
from node.tasks import builtin_taskset
from protocol.errors import WireError
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
    public = cfg.chain.public_url
    manifest = RunManifest(
        run_id=run_id,
        sender=identity.peer_id,
        seq=now_us,
        ts_ms=now_us // 1000,
        terms=terms,
        chain_urls=[u.strip() for u in public.split(",")] if public else [],
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
    data_dir = cfg.resolved_data_dir
    bans = load_bans(data_dir, time.time())
    kept = load_kept(data_dir)
    until = want if want is not None else kept[0].run_id if kept is not None else None
    found = trio.run(_ask_bootstraps, probe, cfg.net.bootstrap, identity, until, bans)
    save_bans(data_dir, bans, time.time())  # a forger stays refused next time
    choice = choose_with_kept(found, want, kept)
    manifest, envelope = choice.manifest, choice.envelope
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
    notes = list(found.refused.values()) + ([choice.note] if choice.note else [])
    url = suggested_chain_url(cfg, manifest, notes)
    if url is not None:
        settings["chain.url"] = url
    keep_manifest(data_dir, envelope)
    return cfg.changed(settings), envelope, notes


def load_kept(data_dir: Path) -> tuple[RunManifest, bytes] | None:
    """The manifest this node joined by before (``KEPT_FILE``), verified again; None if
    there is none, or one that no longer verifies (said in one line)."""
    path = data_dir / KEPT_FILE
    try:
        envelope = path.read_bytes()
        return open_run_manifest(envelope), envelope
    except FileNotFoundError:
        return None
    except (OSError, WireError) as exc:
        print(f"intellect-node: ignoring {path}: {exc}", file=sys.stderr)
        return None


def keep_manifest(data_dir: Path, envelope: bytes) -> None:
    """Keep the verified manifest this node joins by in its data dir (atomically), for a
    restart whose bootstrap peers are down, and to know its run by."""
    write_atomic(data_dir / KEPT_FILE, envelope)


def suggested_chain_url(cfg: NodeConfig, manifest: RunManifest, notes: list[str]) -> str | None:
    """The chain URLs (joined by commas) a joining node takes from the manifest's
    ``chain_urls``: None if it was given a chain URL of its own, runs network only, or the
    manifest suggests none. Each URL is used only if it answers the terms' chain id and
    holds code at the terms' contract; one line in ``notes`` per URL refused and one for
    those taken. ``ManifestError`` (one line) if none passes."""
    if "url" in cfg.chain.model_fields_set or cfg.network_only or not manifest.chain_urls:
        return None
    terms, good = manifest.terms, []
    for url in manifest.chain_urls:
        problem = chain_problem(url, terms.chain_id, terms.contract, cfg.chain.rpc_timeout_s)
        if problem is None:
            good.append(url)
        else:
            notes.append(f"the run manifest's chain URL {url} refused: {problem}")
    if not good:
        raise ManifestError(
            f"no chain URL the run manifest suggests is chain {terms.chain_id} with the run's "
            f"contract {terms.contract} (see above): pass --chain.url URL of that chain"
        )
    notes.append(
        f"using the run manifest's chain URL {', '.join(good)} (chain {terms.chain_id}, the "
        f"run's contract found there)"
    )
    return ",".join(good)


def chain_problem(url: str, chain_id: int, contract: str, timeout: float) -> str | None:
    """Why ``url`` is not the run's chain (one phrase), or None: it must answer, be chain
    ``chain_id``, and hold code at ``contract``."""
    from web3 import Web3

    w3 = Web3(Web3.HTTPProvider(url, request_kwargs={"timeout": min(timeout, 10.0)}))
    try:
        answered = int(w3.eth.chain_id)
        if answered != chain_id:
            return f"it is chain {answered}, not the run's chain {chain_id}"
        if not w3.eth.get_code(Web3.to_checksum_address(contract)):
            return f"no contract at {contract} there"
    except Exception as exc:
        return f"it does not answer ({' '.join(str(exc).split())[:160] or type(exc).__name__})"
    return None


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
