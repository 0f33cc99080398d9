"""The ``[run]`` section (and the ledger of ``[chain]``) as a run manifest, and back.

The trainer builds its ``RunTerms`` from its configuration (``terms_of``); a worker or a
validator that joins a run takes every setting the manifest binds from it
(``settings_of``) and refuses, in one line naming both values, a setting it was given
that contradicts the manifest (``contradictions``). SPEC §2 says which settings these
are. Imported on start only (it pulls in ``protocol/``'s msgpack and hashing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from node.config.node import NodeConfig
from node.config.places import by_path
from protocol.manifest import FileRef, RunManifest, RunTerms

# the terms' field -> the setting it fills on a node that joins
BOUND: dict[str, str] = {
    "trainer": "run.trainer_peer_id",
    "chain_id": "chain.id",
    "contract": "chain.contract",
    "contract_block": "chain.contract_block",
    "taskset": "run.taskset",
    "verify_profile": "run.verify_profile",
    "temperature": "run.temperature",
    "top_p": "run.top_p",
    "max_new_tokens": "run.max_new_tokens",
    "group_size": "run.group_size",
    "tasks_per_batch": "run.tasks_per_batch",
    "async_level": "run.async_level",
}


class ManifestError(ValueError):
    """A run manifest that cannot be built, or one this node's settings contradict."""


def refs(files: list[tuple[str, int, bytes]]) -> list[FileRef]:
    return [FileRef(name=n, size=s, blake3=h) for n, s, h in files]


def terms_of(
    cfg: NodeConfig,
    trainer: str,
    model: list[tuple[str, int, bytes]],
    taskset_file: tuple[int, bytes] | None = None,
) -> RunTerms:
    """The trainer's terms from its settings, its peer id, its model directory's files
    (``node.files.model_files``) and, for a task set file, that file's (size, BLAKE3)."""
    missing = [
        p for p in ("run.manifest_name", "chain.id", "chain.contract") if _value(cfg, p) is None
    ]
    if missing:
        raise ManifestError("a run manifest needs " + ", ".join(by_path()[p].flag for p in missing))
    run = cfg.run
    taskset, file_refs = run.taskset, []
    if taskset_file is not None:
        taskset = Path(run.taskset).name
        file_refs = refs([(taskset, *taskset_file)])
    assert (
        run.manifest_name is not None
        and cfg.chain.id is not None
        and cfg.chain.contract is not None
    )
    terms = RunTerms(
        format=1,
        name=run.manifest_name,
        trainer=trainer,
        chain_id=cfg.chain.id,
        contract=cfg.chain.contract,
        contract_block=cfg.chain.contract_block,
        model=refs(model),
        taskset=taskset,
        taskset_file=file_refs,
        verify_profile=run.verify_profile,
        temperature=float(run.temperature),
        top_p=float(run.top_p),
        max_new_tokens=run.max_new_tokens,
        group_size=run.group_size,
        tasks_per_batch=run.tasks_per_batch,
        async_level=run.async_level,
    )
    terms.validate()
    return terms


def settings_of(manifest: RunManifest) -> dict[str, Any]:
    """The settings a node that joins takes from ``manifest`` (by place: ``run.top_p``),
    its run id among them. A task set file stays the node's own ``run.taskset`` (checked
    against the file's hash by ``check_files``)."""
    terms = manifest.terms
    out: dict[str, Any] = {"run.id": manifest.run_id}
    for field, path in BOUND.items():
        if field == "taskset" and terms.taskset_file:
            continue
        out[path] = getattr(terms, field)
    return out


def contradictions(cfg: NodeConfig, settings: dict[str, Any]) -> list[str]:
    """One line per setting given to this node (file, environment or flag) that differs
    from the manifest's ``settings``, naming both values."""
    lines, run = [], settings.get("run.id", "?")
    for path, value in settings.items():
        section, _, name = path.partition(".")
        model = getattr(cfg, section)
        if name not in model.model_fields_set:
            continue
        given = getattr(model, name)
        if given != value and not (
            path == "chain.contract" and str(given).lower() == value.lower()
        ):
            flag = by_path()[path].flag
            lines.append(
                f"{flag} {given} contradicts the run manifest of {run}: {path} is {value} there"
            )
    return lines


def check_files(
    manifest: RunManifest,
    model: list[tuple[str, int, bytes]] | None,
    taskset_file: tuple[int, bytes] | None,
) -> list[str]:
    """One line per way this node's model directory's files (``model``; None: no model
    given) or its task set file differ from what the manifest names."""
    terms, lines = manifest.terms, []
    if model is not None:
        want = {f.name: (f.size, f.blake3) for f in terms.model}
        have = {n: (s, h) for n, s, h in model}
        for name in sorted(set(want) | set(have)):
            if name not in have:
                lines.append(f"--model: {name} is missing (the run manifest names it)")
            elif name not in want:
                lines.append(f"--model: {name} is not one of the run manifest's model files")
            elif have[name] != want[name]:
                lines.append(
                    f"--model: {name} has BLAKE3 {have[name][1].hex()[:16]}… "
                    f"({have[name][0]} bytes), the run manifest {want[name][1].hex()[:16]}… "
                    f"({want[name][0]} bytes)"
                )
    if terms.taskset_file:
        ref = terms.taskset_file[0]
        if taskset_file is None:
            lines.append(f"the run's task set is the file {ref.name}: pass --run.taskset FILE")
        elif taskset_file != (ref.size, ref.blake3):
            lines.append(
                f"--run.taskset: the file's BLAKE3 {taskset_file[1].hex()[:16]}… is not the "
                f"run manifest's {ref.blake3.hex()[:16]}… ({ref.name})"
            )
    return lines


def _value(cfg: NodeConfig, path: str) -> Any:
    section, _, name = path.partition(".")
    return getattr(getattr(cfg, section), name)
