"""The run manifest (``protocol/manifest.py``, SPEC §2): its terms, their digest and the
run id derived from it, the trainer's signature, bounds and version; and the ``[run]``
settings built into it and taken from it (``node/config/manifest.py``)."""

import dataclasses
from pathlib import Path

import msgpack
import pytest

from crypto.envelope import Envelope
from crypto.identity import Identity
from node.config import NodeConfig, load_config
from node.config.manifest import (
    ManifestError,
    check_files,
    contradictions,
    settings_of,
    terms_of,
)
from node.files import model_files
from protocol.errors import Reason, WireError
from protocol.manifest import (
    FileRef,
    ManifestReply,
    RunManifest,
    RunTerms,
    is_derived_run_id,
    open_run_manifest,
    run_id_of,
)
from protocol.wire import seal
from tests.helpers.manifests import CONTRACT, run_terms

TRAINER = Identity.generate()
OTHER = Identity.generate()


def a_terms(**changes):
    return run_terms(changes.pop("trainer", TRAINER.peer_id), **changes)


def header(run_id, sender=TRAINER):
    return {"run_id": run_id, "sender": sender.peer_id, "seq": 1, "ts_ms": 1}


def a_manifest(terms=None, signer=TRAINER):
    terms = terms or a_terms()
    return RunManifest(**header(run_id_of(terms), signer), terms=terms)


def raw_envelope(obj, signer=TRAINER):
    """An envelope around a payload built by hand (what a forger sends)."""
    payload = msgpack.packb(obj, use_bin_type=True)
    env = Envelope.seal(signer, RunManifest.TYPE, payload)
    return msgpack.packb(
        {"d": RunManifest.TYPE, "p": payload, "k": env.signer, "s": env.signature},
        use_bin_type=True,
    )


def test_round_trip_and_the_run_id_is_derived_from_the_terms():
    m = a_manifest()
    env = seal(TRAINER, m)
    back = open_run_manifest(env, run_id=m.run_id, trainer=TRAINER.peer_id)
    assert back == m and back.terms == m.terms
    assert m.run_id.startswith("math-") and is_derived_run_id(m.run_id)
    assert len(m.run_id) == len("math-") + 32
    # every bound field changes the run id
    for change in (
        {"temperature": 0.9},
        {"top_p": 1.0},
        {"async_level": 1},
        {"chain_id": 1},
        {"contract": "0x" + "cd" * 20},
        {"model": [FileRef(name="config.json", size=11, blake3=bytes(32))]},
        {"verify_profile": "gpu-bf16"},
        {"taskset": "arithmetic"},
    ):
        assert run_id_of(a_terms(**change)) != m.run_id, change


def test_the_digest_is_the_canonical_encoding_in_spec_order():
    terms = a_terms()
    fields = [f.name for f in dataclasses.fields(RunTerms)]
    decoded = msgpack.unpackb(terms.canonical(), raw=False)
    assert list(decoded) == fields  # SPEC §2's table order
    assert type(decoded["temperature"]) is float
    # bytes as msgpack bin, not str: a hash encoded as a string would decode as text
    assert decoded["model"][1]["blake3"] == bytes(range(32))
    import hashlib

    want = hashlib.blake2b(b"intellect/run-terms/1\x00" + terms.canonical(), digest_size=32)
    assert terms.digest() == want.digest()


def test_signed_by_another_key_is_refused():
    m = a_manifest()
    # the forger signs the trainer's terms as itself: the signer is not the terms' trainer
    forged = raw_envelope({"type": RunManifest.TYPE, **header(m.run_id, OTHER), **_terms(m)}, OTHER)
    with pytest.raises(WireError) as err:
        open_run_manifest(forged)
    assert err.value.reason is Reason.BAD_SIGNATURE
    # ... or names itself as the trainer: another run id, not the one asked for
    own = a_manifest(a_terms(trainer=OTHER.peer_id), OTHER)
    with pytest.raises(WireError) as err:
        open_run_manifest(seal(OTHER, own), run_id=m.run_id)
    assert err.value.reason is Reason.WRONG_RUN
    with pytest.raises(WireError) as err:
        open_run_manifest(seal(OTHER, own), trainer=TRAINER.peer_id)
    assert err.value.reason is Reason.BAD_SIGNATURE


def _terms(m):
    return {"terms": m.terms.to_obj(), "chain_urls": list(m.chain_urls)}


def test_a_tampered_field_is_refused():
    m = a_manifest()
    obj = {"type": RunManifest.TYPE, **header(m.run_id), **_terms(m)}
    obj["terms"]["temperature"] = 0.5  # re-signed by the trainer, but not its run id's terms
    with pytest.raises(WireError) as err:
        open_run_manifest(raw_envelope(obj))
    assert err.value.reason is Reason.WRONG_RUN
    # a byte changed after signing
    env = bytearray(seal(TRAINER, m))
    env[env.index(b"arithmetic:2-3")] ^= 1
    with pytest.raises(WireError) as err:
        open_run_manifest(bytes(env))
    assert err.value.reason is Reason.BAD_SIGNATURE


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"format": 2}, "format"),
        ({"name": "Math"}, "name"),
        ({"temperature": 0.0}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"group_size": 65}, "group_size"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"async_level": 65}, "async_level"),
        ({"verify_profile": "fast"}, "verify_profile"),
        ({"contract": "0x12"}, "contract"),
        ({"model": []}, "no model files"),
        ({"taskset": "math.jsonl"}, "a task set file has exactly one"),
        (
            {"model": [FileRef(name="b", size=1, blake3=bytes(32))] * 2},
            "unique and sorted",
        ),
        (
            {"model": [FileRef(name=f"f{i:03}", size=1, blake3=bytes(32)) for i in range(65)]},
            "more than 64",
        ),
    ],
)
def test_bounds(change, why):
    with pytest.raises(WireError, match=why):
        a_terms(**change).validate()
    # and on the wire, where the forger bypasses the encoder
    good = a_manifest()
    obj = {"type": RunManifest.TYPE, **header(good.run_id), **_terms(good)}
    obj["terms"].update(
        {k: [f.to_obj() for f in v] if k == "model" else v for k, v in change.items()}
    )
    with pytest.raises(WireError) as err:
        open_run_manifest(raw_envelope(obj))
    assert err.value.reason is Reason.MALFORMED


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        ({"model": []}, "the manifest names no model files"),
        (
            {"model": [FileRef(name="b", size=1, blake3=bytes(32))] * 2},
            "model file names must be unique and sorted",
        ),
        ({"taskset": ""}, "the manifest names no task set"),
        (
            {"taskset": "math.jsonl"},
            "a built-in task set has no file; a task set file has exactly one",
        ),
        (
            {
                "taskset": "math.jsonl",
                "taskset_file": [FileRef(name="other.jsonl", size=1, blake3=bytes(32))],
            },
            "taskset must be the task set file's name",
        ),
    ],
)
def test_each_refusal_of_the_terms_says_exactly_what_is_wrong(change, detail):
    with pytest.raises(WireError) as err:
        a_terms(**change).check()
    assert (err.value.reason, err.value.detail) == (Reason.MALFORMED, detail)


def test_each_refusal_of_a_manifest_names_the_run_or_signer_it_found():
    m = a_manifest()
    obj = {"type": RunManifest.TYPE, **header(m.run_id), **_terms(m)}
    obj["terms"]["temperature"] = 0.5
    changed = run_id_of(a_terms(temperature=0.5))
    with pytest.raises(WireError) as err:
        open_run_manifest(raw_envelope(obj))
    assert err.value.detail == f"the manifest's terms hash to run {changed}, not {m.run_id}"
    forged = raw_envelope({"type": RunManifest.TYPE, **header(m.run_id, OTHER), **_terms(m)}, OTHER)
    with pytest.raises(WireError) as err:
        open_run_manifest(forged)
    assert err.value.detail == (
        f"manifest signed by {OTHER.peer_id}, its trainer is {TRAINER.peer_id}"
    )
    own = a_manifest(a_terms(trainer=OTHER.peer_id), OTHER)
    with pytest.raises(WireError) as err:
        open_run_manifest(seal(OTHER, own), run_id=m.run_id)
    assert err.value.detail == f"manifest of run {own.run_id}, not {m.run_id}"
    with pytest.raises(WireError) as err:
        open_run_manifest(seal(OTHER, own), trainer=TRAINER.peer_id)
    assert (
        err.value.detail == f"manifest signed by {OTHER.peer_id}, not the trainer {TRAINER.peer_id}"
    )


def test_oversized_and_a_float_given_as_an_int_are_refused():
    good = a_manifest()
    obj = {"type": RunManifest.TYPE, **header(good.run_id), **_terms(good)}
    obj["terms"]["temperature"] = 1
    with pytest.raises(WireError) as err:
        open_run_manifest(raw_envelope(obj))
    assert err.value.reason is Reason.MALFORMED
    with pytest.raises(WireError) as err:
        open_run_manifest(b"\x80" + bytes(RunManifest.MAX_SIZE + 200))
    assert err.value.reason is Reason.OVERSIZED


def test_a_reply_carries_the_envelope():
    env = seal(TRAINER, a_manifest())
    reply = ManifestReply(**header("devnet"), manifest=env)
    assert ManifestReply.decode(reply.encode()).manifest == env


# ---- the [run] settings into and out of a manifest -----------------------------------


def trainer_cfg(**run):
    return NodeConfig.model_validate(
        {
            "role": "trainer",
            "run": {"manifest_name": "math", "temperature": 0.7, "async_level": 1, **run},
            "chain": {"id": 31337, "contract": CONTRACT, "contract_block": 3},
        }
    )


def test_terms_from_the_config_and_settings_back(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"w" * 100)
    (model / ".cache").mkdir()
    files = model_files(model)
    assert [f[0] for f in files] == ["config.json", "model.safetensors"]
    terms = terms_of(trainer_cfg(), TRAINER.peer_id, files)
    m = a_manifest(terms)
    settings = settings_of(m)
    assert settings["run.id"] == m.run_id
    assert settings["run.trainer_peer_id"] == TRAINER.peer_id
    assert settings["run.temperature"] == 0.7 and settings["run.async_level"] == 1
    assert settings["chain.contract"] == CONTRACT and settings["chain.contract_block"] == 3
    joined = NodeConfig.model_validate({"role": "inference"}).changed(settings)
    assert joined.run.id == m.run_id and joined.chain.id == 31337
    assert check_files(m, files, None) == []
    (model / "model.safetensors").write_bytes(b"x" * 100)
    [line] = check_files(m, model_files(model), None)
    assert line.startswith("--model: model.safetensors has BLAKE3")


def test_a_manifest_needs_a_name_and_the_ledger():
    cfg = NodeConfig.model_validate({"role": "trainer"})
    with pytest.raises(ManifestError, match="--run.manifest-name, --chain.id, --chain.contract"):
        terms_of(cfg, TRAINER.peer_id, [("config.json", 1, bytes(32))])


def test_a_given_setting_that_contradicts_the_manifest_is_one_line_naming_both():
    m = a_manifest()
    cfg = load_config(flags={"role": "inference", "run.temperature": 0.5}, environ={})
    [line] = contradictions(cfg, settings_of(m))
    assert line == (
        f"--run.temperature 0.5 contradicts the run manifest of {m.run_id}: "
        "run.temperature is 1.0 there"
    )
    # a default is not a contradiction; the same value given is none either
    assert (
        contradictions(load_config(flags={"role": "inference"}, environ={}), settings_of(m)) == []
    )
    same = load_config(flags={"role": "inference", "run.top_p": 0.95}, environ={})
    assert contradictions(same, settings_of(m)) == []


def test_a_task_set_file_is_bound_by_its_hash(tmp_path):
    data = tmp_path / "math.jsonl"
    data.write_text('{"q": 1}\n')
    from node.files import file_digest

    cfg = trainer_cfg(taskset=str(data))
    terms = terms_of(cfg, TRAINER.peer_id, [("config.json", 1, bytes(32))], file_digest(data))
    assert terms.taskset == "math.jsonl" and terms.taskset_file[0].size == data.stat().st_size
    m = a_manifest(terms)
    assert "run.taskset" not in settings_of(m)  # the node's own path, checked by hash
    assert check_files(m, None, file_digest(data)) == []
    assert "pass --run.taskset FILE" in check_files(m, None, None)[0]
    data.write_text('{"q": 2}\n')
    assert "is not the run manifest's" in check_files(m, None, file_digest(data))[0]


def test_spec_documents_the_terms():
    spec = (Path(__file__).resolve().parent.parent / "SPEC.md").read_text()
    section = spec.split("### The run manifest", 1)[1].split("\n## ", 1)[0]
    header = {"run_id", "sender", "seq", "ts_ms"}
    for cls in (RunTerms, FileRef, RunManifest, ManifestReply):
        for field in set(cls.specs()) - header:
            assert f"| `{field}` |" in section, (cls.TYPE, field)
    assert str(RunManifest.MAX_SIZE) in section.replace(",", "")


# ---- which run a node joins, and when (node/net/runs.py, node/cli/manifest.py) --------


def found_with(*manifests, refused=None, empty=(), unreachable=None):
    from node.net.runs import Found

    return Found(
        runs={m.run_id: (m, seal(TRAINER, m)) for m in manifests},
        refused=refused or {},
        empty=set(empty),
        unreachable=unreachable or {},
    )


def test_choose_run():
    from node.net.runs import JoinError, choose_run

    a, b = a_manifest(), a_manifest(a_terms(async_level=0))
    assert choose_run(found_with(a), None)[0] == a  # the only run
    assert choose_run(found_with(a, b), b.run_id)[0] == b  # --run-id picks
    with pytest.raises(JoinError, match=f"^several runs found: {min(a.run_id, b.run_id)}, "):
        choose_run(found_with(a, b), None)
    forged = {"P": "peer P served a manifest that fails its check: wrong_run: ..."}
    with pytest.raises(JoinError) as err:
        choose_run(found_with(b, refused=forged), a.run_id)
    assert str(err.value) == (
        f"no bootstrap peer serves the manifest of run {a.run_id} (runs found: {b.run_id}); "
        + forged["P"]
    )
    with pytest.raises(JoinError, match="^no run to join: peer P served"):
        choose_run(found_with(refused=forged), None)
    with pytest.raises(JoinError, match="^the bootstrap peers know no run"):
        choose_run(found_with(empty={"B"}), None)
    with pytest.raises(JoinError, match=r"^no bootstrap peer could be reached \(.*: refused\)"):
        choose_run(found_with(unreachable={"12D3KooWB": "refused"}), None)


def test_which_nodes_join_by_a_manifest():
    from node.cli.manifest import joins

    def cfg(**flags):
        return load_config(flags={"role": "inference", **flags}, environ={})

    m = a_manifest()
    assert joins(cfg())  # neither a run id nor a trainer: found through the bootstrap
    assert joins(cfg(**{"run.id": m.run_id}))  # --run-id of a manifest's run picks it
    assert not joins(cfg(**{"run.id": "devnet"}))  # a hand-made run: no manifest
    assert not joins(cfg(**{"run.trainer_peer_id": TRAINER.peer_id}))
    assert not joins(cfg(role="trainer")) and not joins(cfg(role="bootstrap"))


def test_the_trainer_signs_its_manifest_and_takes_its_run_id(tmp_path):
    from node.cli.manifest import trainer_manifest

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    cfg = trainer_cfg(model=str(model))
    joined, env = trainer_manifest(cfg, TRAINER)
    assert env is not None
    m = open_run_manifest(env, trainer=TRAINER.peer_id)
    assert joined.run.id == m.run_id and m.terms.temperature == 0.7
    with pytest.raises(ManifestError, match="^--run-id other contradicts the run manifest"):
        trainer_manifest(trainer_cfg(model=str(model), id="other"), TRAINER)
    assert trainer_manifest(NodeConfig.model_validate({"role": "trainer"}), TRAINER)[1] is None


def test_print_config_shows_the_trainers_run_id(tmp_path, capsys):
    from node.cli.main import main
    from node.cli.manifest import trainer_manifest
    from node.keystore import create_identity

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    ident = create_identity(tmp_path / "trainer")
    args = ["--run.manifest-name", "math", "--chain.id", "31337", "--chain.contract", CONTRACT]
    args += ["--model", str(model), "--data-dir", str(tmp_path / "trainer")]
    assert main(["start", "--role", "trainer", *args, "--print-config"]) == 0
    run_id = trainer_manifest(
        load_config(
            flags={
                "role": "trainer",
                "run.manifest_name": "math",
                "chain.id": 31337,
                "chain.contract": CONTRACT,
                "run.model": str(model),
            },
            environ={},
        ),
        ident,
    )[0].run.id
    assert f'id = "{run_id}"' in capsys.readouterr().out
