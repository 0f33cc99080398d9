"""The run manifest between real node processes (SPEC §2): a worker started without
``--run-id`` and ``--trainer-peer-id`` joins the run by the manifest a bootstrap node
collected from the trainer (a worker asking the trainer itself is checked too);
a peer serving a forged manifest is refused in one line, and a node that finds only the
forged one stops before its node of the run starts, keeping nothing but its identity and
its ban list.

Run as a module (``python -m tests.test_manifest_network start ...``), this file is the
forging peer: the real binary serving the manifest in ``FORGED_MANIFEST`` (hex)."""

import os
import subprocess
import sys

import msgpack
import pytest

from crypto.envelope import Envelope
from node.cli.devnet import NodeProcess, spawn_node, wait_ready
from node.cli.manifest import trainer_manifest
from node.config import load_config
from node.keystore import create_identity
from protocol.manifest import RunManifest, open_run_manifest
from tests.helpers.net import CLI, FAST, FAST_ENV, addr_of, status, wait_until

pytestmark = pytest.mark.slow

CONTRACT = "0x" + "ab" * 20
RUN_FLAGS = {
    "run.manifest_name": "math",
    "chain.id": 31337,
    "chain.contract": CONTRACT,
    "run.temperature": 0.7,
    "run.async_level": 1,
}
FAST_FLAGS = [x for kv in FAST.items() for x in kv]
ENV = {"INTELLECT_NODE_NETWORK_ONLY": "true", **FAST_ENV}


def a_model(path):
    path.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (path / name).write_text("{}")
    (path / "model.safetensors").write_bytes(os.urandom(4096))
    return path


def flags(settings):
    return [x for k, v in settings.items() for x in (f"--{k.replace('_', '-')}", str(v))]


def forged(honest, forger):
    """The honest terms with another temperature, signed by ``forger`` as their trainer,
    under the honest run id (which those terms do not hash to)."""
    terms = {**honest.terms.to_obj(), "temperature": 0.1, "trainer": forger.peer_id}
    obj = {
        "type": RunManifest.TYPE,
        "run_id": honest.run_id,
        "sender": forger.peer_id,
        "seq": 1,
        "ts_ms": 1,
        "terms": terms,
        "chain_urls": [],
    }
    payload = msgpack.packb(obj, use_bin_type=True)
    env = Envelope.seal(forger, RunManifest.TYPE, payload)
    return msgpack.packb(
        {"d": RunManifest.TYPE, "p": payload, "k": env.signer, "s": env.signature},
        use_bin_type=True,
    )


def test_a_worker_joins_by_the_manifest_and_a_forged_one_is_refused(tmp_path):
    model = a_model(tmp_path / "model")
    trainer_id = create_identity(tmp_path / "trainer")
    settings = {**RUN_FLAGS, "run.model": str(model)}
    cfg, envelope = trainer_manifest(load_config(flags={"role": "trainer", **settings}), trainer_id)
    assert envelope is not None
    honest = open_run_manifest(envelope)
    forger = create_identity(tmp_path / "forger")
    nodes: list[NodeProcess] = []
    try:
        trainer = spawn_node(
            "trainer",
            "trainer",
            tmp_path,
            run_id=cfg.run.id,  # given, and equal to the one its manifest names
            listen="/ip4/127.0.0.1/tcp/0",
            bootstrap=[],
            extra=[*FAST_FLAGS, *flags(settings)],
            env_extra=ENV,
        )
        nodes.append(trainer)
        forging = spawn_node(
            "forger",
            "bootstrap",
            tmp_path,
            run_id="elsewhere",
            listen="/ip4/127.0.0.1/tcp/0",
            bootstrap=[],
            extra=FAST_FLAGS,
            env_extra={**ENV, "FORGED_MANIFEST": forged(honest, forger).hex()},
            module="tests.test_manifest_network",
        )
        nodes.append(forging)
        t_addr, f_addr = addr_of(wait_ready(trainer)), addr_of(wait_ready(forging))
        # the banner follows the role's start (torch imported), after the admin endpoint answers
        banner = f"run     : {honest.run_id}"
        wait_until(lambda: banner in trainer.log_path.read_text(), 300, "the trainer's banner")
        # a bootstrap node of the run's id collects the manifest from the trainer it hears of
        boot = spawn_node(
            "bootstrap",
            "bootstrap",
            tmp_path,
            run_id=honest.run_id,
            listen="/ip4/127.0.0.1/tcp/0",
            bootstrap=[t_addr],
            extra=FAST_FLAGS,
            env_extra=ENV,
        )
        nodes.append(boot)
        b_addr = addr_of(wait_ready(boot))
        wait_until(lambda: status(boot)["manifest"]["held"], 30, "the bootstrap's manifest")

        # a worker given neither the run nor the trainer: the forger refused, the run joined
        data_dir, log_path = tmp_path / "worker", tmp_path / "worker.log"
        cmd = [*CLI, "start", "--role", "inference", "--data-dir", str(data_dir)]
        cmd += ["--listen", "/ip4/127.0.0.1/tcp/0", "--bootstrap", f_addr, "--bootstrap", b_addr]
        cmd += ["--model", str(model), "--run.async-level", "1", *FAST_FLAGS]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **ENV}
            )
        worker = NodeProcess("worker", "inference", data_dir, proc, log_path)
        nodes.append(worker)
        st = wait_ready(worker)
        assert st["run_id"] == honest.run_id
        assert st["manifest"] == {"held": True, "run": honest.run_id}
        text = log_path.read_text()
        assert f"joining run {honest.run_id} by its manifest" in text
        [refused] = [line for line in text.splitlines() if "fails its check" in line]
        assert f"peer {forging_peer(f_addr)} served a manifest that fails its check" in refused
        assert "wrong_run: the manifest's terms hash to run math-" in refused

        # a worker whose only bootstrap peer forges: one line, and it keeps nothing
        lone = tmp_path / "lone"
        res = subprocess.run(
            [
                *CLI,
                "start",
                "--role",
                "validator",
                "--data-dir",
                str(lone),
                "--run-id",
                honest.run_id,
                "--listen",
                "/ip4/127.0.0.1/tcp/0",
                "--bootstrap",
                f_addr,
                *FAST_FLAGS,
            ],
            capture_output=True,
            text=True,
            env={**os.environ, **ENV},
            timeout=120,
        )
        assert res.returncode == 1, res.stdout + res.stderr
        [line] = res.stderr.splitlines()
        assert line.startswith(
            f"intellect-node: error: no bootstrap peer serves the manifest of run {honest.run_id}"
            " (runs found: none); peer "
        ), line
        # its identity, and the forger on its ban list (asked no more next time)
        assert sorted(p.name for p in lone.iterdir()) == ["bans.json", "identity.key", "node.lock"]
        assert "fails its check" in (lone / "bans.json").read_text()

        # a flag that contradicts the manifest: one line naming both values
        res = subprocess.run(
            [
                *CLI,
                "start",
                "--role",
                "inference",
                "--data-dir",
                str(tmp_path / "eager"),
                "--listen",
                "/ip4/127.0.0.1/tcp/0",
                "--bootstrap",
                t_addr,
                "--run.temperature",
                "0.5",
                *FAST_FLAGS,
            ],
            capture_output=True,
            text=True,
            env={**os.environ, **ENV},
            timeout=120,
        )
        assert res.returncode == 1
        assert res.stderr.splitlines() == [
            f"intellect-node: error: --run.temperature 0.5 contradicts the run manifest of "
            f"{honest.run_id}: run.temperature is 0.7 there"
        ]
    finally:
        for n in nodes:
            n.stop(grace=5)


def forging_peer(addr):
    return addr.rsplit("/p2p/", 1)[1]


if __name__ == "__main__":
    from node.net import runs

    serve_honestly = runs.RunManifests.__init__

    def serve_forged(self, node, envelope=None):
        serve_honestly(self, node, bytes.fromhex(os.environ["FORGED_MANIFEST"]))

    runs.RunManifests.__init__ = serve_forged
    from node.cli import main

    sys.exit(main(sys.argv[1:]))
