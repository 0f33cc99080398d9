"""Joining a run with ``--bootstrap`` only (#53): the run's files from the swarm.

Real node processes on 127.0.0.1 (network only: no chain, no model loaded). The trainer
signs its run manifest and serves the run's files (model directory and task file) as
SHARDCAST version ``RUN_FILES_VERSION``; a worker that joined before serves them too.
Among a fresh joiner's bootstrap peers one serves a forged manifest and one (a worker
that joined, then turned) serves corrupted shards: both are refused and banned, and the
joiner still ends with files byte-identical to the trainer's, checked against the
manifest, under its data dir, and starts with the manifest's settings. Then the whole
loop on the development chain: a joiner with a funded account and ``--bootstrap`` only
(the chain's URL it takes from the manifest, checked) pulls the model, stakes, and its
first batch is accepted.

Run as a module (``python -m tests.test_join start ...``), this file is a joining node
whose disk reports ``JOIN_FREE_BYTES`` free: it must stop in one line before pulling.
"""

import filecmp
import os
import re
import signal
import subprocess
import sys

import msgpack
import pytest

from crypto.envelope import Envelope
from node.cli.devnet import NodeProcess, spawn_node, wait_ready
from node.cli.manifest import trainer_manifest
from node.config import load_config
from node.keystore import create_identity
from protocol.manifest import RUN_FILES_VERSION, RunManifest, open_run_manifest
from tests.helpers.joinrun import ManifestRun
from tests.helpers.net import FAST, FAST_ENV, addr_of, status, wait_until
from tests.test_manifest_network import forged

pytestmark = pytest.mark.slow

CONTRACT = "0x" + "cd" * 20
SHARD = 65536  # the smallest shard: the model below is 20 shards, the task file one more
FAST_FLAGS = [x for kv in FAST.items() for x in kv]
ENV = {"INTELLECT_NODE_NETWORK_ONLY": "true", **FAST_ENV}
LISTEN = "/ip4/127.0.0.1/tcp/0"


def a_model(path):
    path.mkdir()
    (path / "config.json").write_text('{"model_type": "llama", "hidden_size": 8}')
    (path / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    (path / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    (path / "model.safetensors").write_bytes(os.urandom(20 * SHARD - 123))
    return path


def joiner(name, tmp_path, bootstrap, *, module="node.cli", env=None, data_dir=None):
    """``start --role inference`` with a fresh data dir (or ``data_dir``) and ``--bootstrap``
    only."""
    data_dir = data_dir or tmp_path / name
    cmd = [sys.executable, "-m", module, "start", "--role", "inference"]
    cmd += ["--data-dir", str(data_dir), "--listen", LISTEN, *FAST_FLAGS]
    for b in bootstrap:
        cmd += ["--bootstrap", b]
    data_dir.mkdir(exist_ok=True)
    log_path = data_dir / f"{name}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **ENV, **(env or {})}
        )
    return NodeProcess(name, "inference", data_dir, proc, log_path)


def signed_by(honest, key):
    """The honest manifest's terms and run id, signed by ``key``: not their trainer."""
    obj = {"type": RunManifest.TYPE, **honest.to_obj(), "sender": key.peer_id}
    payload = msgpack.packb(obj, use_bin_type=True)
    env = Envelope.seal(key, RunManifest.TYPE, payload)
    return msgpack.packb(
        {"d": RunManifest.TYPE, "p": payload, "k": env.signer, "s": env.signature},
        use_bin_type=True,
    )


def files_held(node):
    return wait_until(
        lambda: (status(node).get("run_files") or {}).get("path"),
        120,
        f"{node.name}'s run files\n{node.log_path.read_text()[-3000:]}",
    )


def test_a_fresh_node_joins_with_bootstrap_only_and_liars_are_banned(tmp_path):
    model = a_model(tmp_path / "model")
    tasks = tmp_path / "sums.jsonl"
    tasks.write_text('{"prompt": "1+1", "answer": "2"}\n')
    trainer_id = create_identity(tmp_path / "trainer")
    settings = {
        "run.manifest_name": "sums",
        "chain.id": 31337,
        "chain.contract": CONTRACT,
        "run.temperature": 0.7,
        "run.async_level": 1,
        "run.model": str(model),
        "run.taskset": str(tasks),
    }
    cfg, envelope = trainer_manifest(load_config(flags={"role": "trainer", **settings}), trainer_id)
    assert envelope is not None
    honest = open_run_manifest(envelope)
    flags = [x for k, v in settings.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    nodes: list[NodeProcess] = []
    try:
        trainer = spawn_node(
            "trainer",
            "trainer",
            tmp_path,
            run_id=cfg.run.id,
            listen=LISTEN,
            bootstrap=[],
            extra=[*FAST_FLAGS, *flags, "--shardcast.shard-size", str(SHARD)],
            env_extra=ENV,
        )
        nodes.append(trainer)
        t_addr = addr_of(wait_ready(trainer))
        t_files = files_held(trainer)

        def liar(name, forge):
            """A node that serves ``forge(its identity)`` as the run's manifest; its address."""
            node = spawn_node(
                name,
                "bootstrap",
                tmp_path,
                run_id="elsewhere",
                listen=LISTEN,
                bootstrap=[],
                extra=FAST_FLAGS,
                env_extra={**ENV, "FORGED_MANIFEST": forge(create_identity(tmp_path / name)).hex()},
                module="tests.test_manifest_network",
            )
            nodes.append(node)
            return addr_of(wait_ready(node))

        f_addr = liar("forger", lambda me: forged(honest, me))
        # the run's own terms, signed by another key than their trainer's
        s_addr = liar("signer", lambda me: signed_by(honest, me))

        # a worker that joined earlier, and one that joined and turned: it corrupts uploads.
        # The early one uploads at 0.25 MB/s, so the fresh node's pull lasts seconds: every
        # holder is in it (a pull of 0.1 s from the first holder that answered once left the
        # corrupter unasked, and unbanned)
        early = joiner(
            "early", tmp_path, [t_addr], env={"INTELLECT_NODE_SHARDCAST__UPLOAD_RATE": "0.25"}
        )
        nodes.append(early)
        e_addr = addr_of(wait_ready(early))
        files_held(early)
        evil = joiner(
            "evil", tmp_path, [t_addr], module="tests.helpers.evil_node", env={"EVIL": "corrupt"}
        )
        nodes.append(evil)
        v_addr = addr_of(wait_ready(evil))
        files_held(evil)

        # the fresh node: --bootstrap only, the forger and the corrupter among its peers
        fresh = joiner("fresh", tmp_path, [f_addr, s_addr, v_addr, e_addr, t_addr])
        nodes.append(fresh)
        wait_ready(fresh)
        got = files_held(fresh)
        st = status(fresh)
        assert st["run_id"] == honest.run_id
        assert str(got).startswith(str(tmp_path / "fresh"))

        # byte-identical to the trainer's, every file the manifest names
        names = [f"model/{f.name}" for f in honest.terms.model] + ["taskset/sums.jsonl"]
        match, mismatch, errors = filecmp.cmpfiles(t_files, got, names, shallow=False)
        assert (sorted(match), mismatch, errors) == (sorted(names), [], [])
        assert filecmp.cmp(model / "model.safetensors", f"{got}/model/model.safetensors", False)

        # both liars refused and banned, each with its reason
        forger_peer = f_addr.rsplit("/p2p/", 1)[1]
        evil_peer = v_addr.rsplit("/p2p/", 1)[1]
        bans = st["bans"]
        assert "manifest that fails its check: wrong_run" in bans[forger_peer]["reason"], bans
        assert bans[forger_peer]["left_s"] > 0
        signer_peer = s_addr.rsplit("/p2p/", 1)[1]
        assert "manifest that fails its check: bad_signature" in bans[signer_peer]["reason"]
        assert "bad shard" in bans[evil_peer]["reason"], bans
        assert f"of version {RUN_FILES_VERSION}" in bans[evil_peer]["reason"]
        pull = st["run_files"]["pull"]
        assert pull["state"] == "complete" and evil_peer in pull["banned"]
        # from every holder: the worker that joined before served the joiner too
        early_peer = e_addr.rsplit("/p2p/", 1)[1]
        print("pull", {p[-8:]: v for p, v in pull["peers"].items()}, pull["total_bytes"])
        assert pull["peers"][early_peer]["bytes"] > 0
        assert sum(v["bytes"] for v in pull["peers"].values()) == pull["total_bytes"]
        text = fresh.log_path.read_text()
        assert f"peer {forger_peer} served a manifest that fails its check" in text
        line = r"pulled the run's files: ([\d.]+) of \1 MiB \((\d+)/\2 shards\)"
        wait_until(
            lambda: re.search(line, fresh.log_path.read_text()), 30, "the last progress line"
        )
        assert st["manifest"] == {"held": True, "run": honest.run_id}

        # a disk without room for the files: one line, nothing pulled, the role never started
        tight = tmp_path / "tight"
        cmd = [sys.executable, "-m", "tests.test_join", "start", "--role", "inference"]
        cmd += ["--data-dir", str(tight), "--listen", LISTEN, "--bootstrap", t_addr, *FAST_FLAGS]
        res = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            env={**os.environ, **ENV, "JOIN_FREE_BYTES": str(2**20)},
            timeout=180,
        )
        assert res.returncode == 1, res.stdout + res.stderr
        [line] = [x for x in res.stderr.splitlines() if x.startswith("intellect-node: error:")]
        assert re.fullmatch(
            r"intellect-node: error: the run's files need 1\.3 MiB and \S+/tight/run-files has "
            r"1\.0 MiB free: nothing pulled, no stake locked \(free space or pass --data-dir on a "
            r"larger disk\)",
            line,
        ), line
        assert list((tight / "run-files").iterdir()) == []
        assert "inference up" not in res.stdout
    finally:
        for n in nodes:
            n.stop(grace=5)


def test_a_pull_stopped_by_ctrl_c_resumes_with_the_shards_it_verified(tmp_path):
    """A joiner stopped (SIGINT) mid-pull keeps no file of the run in view, only its
    journalled partial; started again, it fetches only the shards it lacks."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    (model / "model.safetensors").write_bytes(os.urandom(60 * SHARD))
    trainer_id = create_identity(tmp_path / "trainer")
    settings = {
        "run.manifest_name": "slow",
        "chain.id": 31337,
        "chain.contract": CONTRACT,
        "run.model": str(model),
    }
    cfg, _env = trainer_manifest(load_config(flags={"role": "trainer", **settings}), trainer_id)
    flags = [x for k, v in settings.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    nodes: list[NodeProcess] = []
    try:
        trainer = spawn_node(
            "trainer",
            "trainer",
            tmp_path,
            run_id=cfg.run.id,
            listen=LISTEN,
            bootstrap=[],
            extra=[*FAST_FLAGS, *flags, "--shardcast.shard-size", str(SHARD)]
            + ["--shardcast.upload-rate", "0.25"],  # 3.75 MiB: a pull of about 12 s
            env_extra=ENV,
        )
        nodes.append(trainer)
        t_addr = addr_of(wait_ready(trainer))
        t_files = files_held(trainer)
        first = joiner("resumer", tmp_path, [t_addr])
        nodes.append(first)
        wait_ready(first)

        def midway():
            pull = (status(first).get("run_files") or {}).get("pull") or {}
            return 20 <= pull.get("done_shards", 0) < 50 and pull["done_shards"]

        before = wait_until(midway, 120, "the pull to be midway", interval=0.1)
        first.stop(signal.SIGINT, grace=30)
        store = tmp_path / "resumer" / "run-files"
        assert [p.name for p in store.iterdir()] == [f".partial-v{RUN_FILES_VERSION:08d}"]
        assert "pulled the run's files" not in first.log_path.read_text()

        again = joiner("resumer-again", tmp_path, [t_addr], data_dir=tmp_path / "resumer")
        nodes.append(again)
        wait_ready(again)
        got = files_held(again)
        pull = status(again)["run_files"]["pull"]
        assert pull["resumed_shards"] >= before
        assert pull["fetched_bytes"] <= (60 - before + 1) * SHARD
        assert filecmp.cmp(
            f"{t_files}/model/model.safetensors", f"{got}/model/model.safetensors", False
        )
        assert [p.name for p in store.iterdir()] == [f"v{RUN_FILES_VERSION:08d}"]
        line = "shards kept from before"
        wait_until(lambda: line in again.log_path.read_text(), 30, "the resumed progress line")
    finally:
        for n in nodes:
            n.stop(grace=5)


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_joined_node_restarts_on_its_kept_manifest_and_leaves_for_a_new_run(tmp_path):
    """A joined node keeps its manifest: started again while its only bootstrap peer (the
    trainer) is down, it works for its run with one line. Then the trainer comes back with
    other terms (another task set: a new run): the node says so in one line, stops (exit 0)
    and, started again with the same command, joins the new run."""
    model = a_model(tmp_path / "model")
    trainer_id = create_identity(tmp_path / "trainer")
    port = free_port()
    settings = {
        "run.manifest_name": "sums",
        "chain.id": 31337,
        "chain.contract": CONTRACT,
        "run.model": str(model),
        "run.taskset": "arithmetic:2-3",
    }

    def trainer_of(taskset):
        flags = {**settings, "run.taskset": taskset}
        given = [x for k, v in flags.items() for x in (f"--{k.replace('_', '-')}", str(v))]
        cfg, _ = trainer_manifest(load_config(flags={"role": "trainer", **flags}), trainer_id)
        node = spawn_node(
            "trainer",
            "trainer",
            tmp_path,
            run_id=cfg.run.id,
            listen=f"/ip4/127.0.0.1/tcp/{port}",  # back at the same address
            bootstrap=[],
            extra=[*FAST_FLAGS, *given, "--shardcast.shard-size", str(SHARD)],
            env_extra=ENV,
        )
        nodes.append(node)
        return cfg.run.id, addr_of(wait_ready(node)), node

    nodes: list[NodeProcess] = []
    data_dir = tmp_path / "worker"
    try:
        old_run, t_addr, trainer = trainer_of("arithmetic:2-3")
        first = joiner("worker", tmp_path, [t_addr], data_dir=data_dir)
        nodes.append(first)
        wait_ready(first)
        files_held(first)
        assert open_run_manifest((data_dir / "run-manifest.bin").read_bytes()).run_id == old_run
        first.stop(signal.SIGINT, grace=30)
        trainer.stop(signal.SIGINT, grace=30)

        # its bootstrap peer is down: the manifest it verified before, with one line
        again = joiner("again", tmp_path, [t_addr], data_dir=data_dir)
        nodes.append(again)
        wait_ready(again, timeout=120)
        assert status(again)["run_id"] == old_run
        assert (
            f"no bootstrap peer serves run {old_run}'s manifest now: using the one this node "
            "verified before (run-manifest.bin)"
        ) in again.log_path.read_text()

        # the trainer comes back with other terms: a new run, and the node leaves the old
        new_run, _addr, _trainer = trainer_of("arithmetic:4-5")
        assert new_run != old_run
        assert again.proc.wait(timeout=120) == 0, again.log_path.read_text()[-3000:]
        text = again.log_path.read_text()
        assert (
            f"intellect-node: the trainer of run {old_run} signed a new run, {new_run} (a run "
            f"that changes is a new run): this node takes no more of {old_run}'s work and stops"
        ) in text
        kept = open_run_manifest((data_dir / "run-manifest.bin").read_bytes())
        assert kept.run_id == new_run

        # started again with the same command: the new run
        last = joiner("last", tmp_path, [t_addr], data_dir=data_dir)
        nodes.append(last)
        wait_ready(last, timeout=120)
        assert status(last)["run_id"] == new_run
        assert status(last)["manifest"] == {"held": True, "run": new_run}
    finally:
        for n in nodes:
            n.stop(grace=5)


@pytest.mark.timeout(900)
def test_a_joiner_with_bootstrap_only_gets_its_first_batch_accepted(tmp_path, tiny_model_dir):
    """The whole loop on the served development chain: the trainer of a manifest, an
    appointed validator, and a worker with a fresh data dir, a funded account and
    ``--bootstrap`` only: it takes the chain's URL from the manifest (after checking the
    chain id and the contract there), pulls the model from the swarm, stakes, works with
    the manifest's settings, and its first batch is accepted on-chain. Two more join with
    it at once: the three find each other before they pull, and the trainer sends at most
    half of what they pull (one copy of the model in bench/join.py; 0.77 of it when each
    took the others' shares from the trainer before it saw the others held them)."""
    run = ManifestRun(tmp_path, tiny_model_dir, trainer_flags=["--shardcast.shard-size", "65536"])
    try:
        names = ("worker", "second", "third")
        for name in names:
            run.fund_joiner(name)
        assert sorted(p.name for p in (tmp_path / "worker").iterdir()) == ["account.json"]
        joiners = {name: run.joiner(name) for name in names}  # at once
        worker = joiners["worker"]
        pulls, peer_of = {}, {}
        for name, node in joiners.items():
            peer_of[name] = addr_of(wait_ready(node, timeout=300)).rsplit("/p2p/", 1)[1]
            files_held(node)
            pulls[name] = status(node)["run_files"]["pull"]
        for name in names[1:]:
            joiners[name].stop(grace=10)
        origin = sum(p["peers"].get(run.trainer_peer, {}).get("bytes", 0) for p in pulls.values())
        total = sum(p["total_bytes"] for p in pulls.values())
        assert origin <= total / 2, {n: p["peers"] for n, p in pulls.items()}
        # each took shards from another joiner, but one whose pull ended before the others
        # began theirs (its process started first, on a loaded machine): it had no one to
        # trade with, so it took one copy from the trainer and served the others (at most one)
        began = {n: p["ended_at"] - p["elapsed_s"] for n, p in pulls.items()}
        alone = [
            n for n, p in pulls.items() if all(p["ended_at"] < began[o] for o in began if o != n)
        ]
        assert len(alone) <= 1, pulls
        for name, pull in pulls.items():
            others = [peer_of[n] for n in names if n != name]
            took = sum(pull["peers"].get(p, {}).get("bytes", 0) for p in others)
            assert took > 0 or name in alone, {n: (began[n], p) for n, p in pulls.items()}
        got = files_held(worker)
        names = sorted(p.name for p in tiny_model_dir.iterdir() if p.is_file())
        match, mismatch, errors = filecmp.cmpfiles(tiny_model_dir, f"{got}/model", names, False)
        assert (sorted(match), mismatch, errors) == (names, [], [])

        def accepted():
            return ((status(worker).get("inference") or {}).get("accepted") or 0) >= 1

        wait_until(accepted, 600, f"the joiner's first accepted batch\n{worker.log_path}", 2)
        text = worker.log_path.read_text()
        assert f"joining run {run.run_id} by its manifest" in text
        assert "using the run manifest's chain URL http://127.0.0.1:" in text
        # its first batch was made with the base weights it pulled (policy version 0)
        assert f"generating with policy version 0 ({got}/model)" in text
    finally:
        run.close()


if __name__ == "__main__":
    import shutil

    from node.shardcast import runfiles

    free = int(os.environ["JOIN_FREE_BYTES"])
    real = shutil.disk_usage

    class _Tiny:
        def disk_usage(self, path):
            return real(path)._replace(free=free)

    runfiles.shutil = _Tiny()  # type: ignore[assignment]
    from node.cli import main

    sys.exit(main(sys.argv[1:]))
