"""Joining a run by its manifest, the parts without a running network (#53): the chain
URL the manifest suggests (checked before use), the manifest kept in the data dir across
restarts, and a new manifest of the same trainer ending the old run."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from crypto.identity import Identity
from node.cli.manifest import suggested_chain_url, trainer_manifest
from node.config import NodeConfig, load_config
from node.config.manifest import ManifestError
from protocol.manifest import RunManifest, open_run_manifest, run_id_of
from tests.helpers.manifests import CONTRACT, run_terms

TRAINER = Identity.generate()


class FakeChain:
    """A JSON-RPC endpoint on 127.0.0.1 that answers ``eth_chainId`` and ``eth_getCode``."""

    def __init__(self, chain_id: int, code: str) -> None:
        chain = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                result = {"eth_chainId": hex(chain.chain_id), "eth_getCode": chain.code}
                body = json.dumps(
                    {"jsonrpc": "2.0", "id": req["id"], "result": result[req["method"]]}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.chain_id, self.code = chain_id, code
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def chains() -> Iterator[dict[str, FakeChain]]:
    made = {
        "run": FakeChain(31337, "0x6080"),  # the run's chain, code at the contract
        "other": FakeChain(1, "0x6080"),  # another chain
        "empty": FakeChain(31337, "0x"),  # the run's chain id, no contract there
    }
    yield made
    for c in made.values():
        c.close()


def manifest_with(urls: list[str]) -> RunManifest:
    terms = run_terms(TRAINER.peer_id)
    return RunManifest(
        run_id=run_id_of(terms),
        sender=TRAINER.peer_id,
        seq=1,
        ts_ms=1,
        terms=terms,
        chain_urls=urls,
    )


def joiner_cfg(**chain: object) -> NodeConfig:
    return load_config(flags={"role": "inference", **{f"chain.{k}": v for k, v in chain.items()}})


def test_the_trainer_signs_its_public_chain_urls_and_a_new_url_is_not_a_new_run(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    flags = {
        "role": "trainer",
        "run.manifest_name": "math",
        "chain.id": 31337,
        "chain.contract": CONTRACT,
        "run.model": str(model),
        "chain.url": "https://secret.example/KEY",
    }
    cfg, env = trainer_manifest(load_config(flags=flags, environ={}), TRAINER)
    assert env is not None and open_run_manifest(env).chain_urls == []  # never its own url
    urls = "https://a.example/rpc,http://b.example:8545"
    cfg2, env2 = trainer_manifest(
        load_config(flags={**flags, "chain.public_url": urls}, environ={}), TRAINER
    )
    assert env2 is not None
    m = open_run_manifest(env2, trainer=TRAINER.peer_id)
    assert m.chain_urls == ["https://a.example/rpc", "http://b.example:8545"]
    assert cfg2.run.id == cfg.run.id == m.run_id  # the URLs are outside the terms


def test_a_tampered_chain_url_breaks_the_trainers_signature():
    from protocol.errors import WireError
    from protocol.wire import seal

    other = Identity.generate()
    m = manifest_with(["https://evil.example/"])
    # signed by another key than the terms' trainer: refused, whatever URL it carries
    forged = RunManifest(**{**m.__dict__, "sender": other.peer_id})
    with pytest.raises(WireError, match="bad_signature"):
        open_run_manifest(seal(other, forged))


def test_a_joiner_without_a_chain_url_takes_the_manifests_once_checked(chains):
    run, other, empty = chains["run"], chains["other"], chains["empty"]
    notes: list[str] = []
    urls = [other.url, empty.url, "http://127.0.0.1:9/", run.url]
    got = suggested_chain_url(joiner_cfg(), manifest_with(urls), notes)
    assert got == run.url
    assert notes == [
        f"the run manifest's chain URL {other.url} refused: it is chain 1, not the run's "
        "chain 31337",
        f"the run manifest's chain URL {empty.url} refused: no contract at {CONTRACT} there",
        notes[2],
        f"using the run manifest's chain URL {run.url} (chain 31337, the run's contract "
        "found there)",
    ]
    assert notes[2].startswith(
        "the run manifest's chain URL http://127.0.0.1:9/ refused: it does not answer ("
    )


def test_a_joiner_given_its_own_chain_url_never_uses_the_manifests(chains):
    notes: list[str] = []
    manifest = manifest_with([chains["other"].url])
    assert suggested_chain_url(joiner_cfg(url="http://127.0.0.1:8545"), manifest, notes) is None
    assert suggested_chain_url(joiner_cfg(), manifest_with([]), notes) is None
    assert notes == []


def test_a_manifest_whose_only_chain_url_is_another_chain_stops_the_join(chains):
    notes: list[str] = []
    with pytest.raises(ManifestError) as err:
        suggested_chain_url(joiner_cfg(), manifest_with([chains["other"].url]), notes)
    assert str(err.value) == (
        f"no chain URL the run manifest suggests is chain 31337 with the run's contract "
        f"{CONTRACT} (see above): pass --chain.url URL of that chain"
    )
    assert notes == [
        f"the run manifest's chain URL {chains['other'].url} refused: it is chain 1, not the "
        "run's chain 31337"
    ]


# ---- the manifest kept in the data dir, and a new run of the same trainer --------------


def signed(terms_changes: dict[str, object] | None = None, *, seq: int = 1, key=TRAINER):
    """A manifest of ``run_terms`` with ``terms_changes``, signed at ``seq``, its envelope."""
    terms = run_terms(key.peer_id, **(terms_changes or {}))
    m = RunManifest(run_id=run_id_of(terms), sender=key.peer_id, seq=seq, ts_ms=seq, terms=terms)
    return m, seal_(key, m)


def seal_(key, m):
    from protocol.wire import seal

    return seal(key, m)


def found_runs(*runs):
    from node.net.runs import Found

    return Found(runs={m.run_id: (m, env) for m, env in runs})


def test_a_new_run_is_one_of_the_same_trainer_signed_later():
    from node.net.runs import supersedes

    old, _ = signed(seq=10)
    assert supersedes(signed({"taskset": "arithmetic:4-5"}, seq=11)[0], old)
    assert supersedes(signed({"verify_profile": "paper"}, seq=11)[0], old)
    assert not supersedes(signed({"taskset": "arithmetic:4-5"}, seq=9)[0], old)  # a replay
    assert not supersedes(signed(seq=11)[0], old)  # the same run signed again
    other = Identity.generate()  # another owner's run is not this run's successor
    assert not supersedes(signed({"taskset": "arithmetic:4-5"}, seq=11, key=other)[0], old)


def test_a_node_that_joined_before_keeps_to_its_run():
    from node.net.runs import JoinError, choose_with_kept

    kept = signed(seq=10)
    fresh = signed(seq=12)  # its trainer signed the same run again
    other = signed({"name": "else"}, seq=5, key=Identity.generate())
    new = signed({"taskset": "arithmetic:4-5"}, seq=20)
    newer = signed({"taskset": "arithmetic:6-7"}, seq=30)
    run_id = kept[0].run_id

    # nobody serves it (the bootstrap is down): the kept one, with one line
    c = choose_with_kept(found_runs(), None, kept)
    assert (c.envelope, c.note) == (
        kept[1],
        f"no bootstrap peer serves run {run_id}'s manifest now: using the one this node "
        "verified before (run-manifest.bin)",
    )
    # another run is served: still its own, and the line says how to join the other
    c = choose_with_kept(found_runs(other), None, kept)
    assert c.envelope == kept[1] and c.note is not None
    assert c.note.endswith(f"; they serve {other[0].run_id} (--run-id RUN_ID joins another)")
    # served: the peers' (newer) envelope, nothing to say
    c = choose_with_kept(found_runs(fresh, other), None, kept)
    assert (c.envelope, c.note) == (fresh[1], None)
    # --run-id of its own run: the kept one when no peer serves it
    assert choose_with_kept(found_runs(), run_id, kept).envelope == kept[1]
    # --run-id of another run is never answered by the kept manifest
    want = new[0].run_id
    with pytest.raises(JoinError, match=f"no bootstrap peer serves the manifest of run {want}"):
        choose_with_kept(found_runs(), want, kept)
    # its trainer signed a new run (twice): the latest, with one line
    c = choose_with_kept(found_runs(new, newer, fresh), None, kept)
    assert c.envelope == newer[1]
    assert c.note == (
        f"the trainer of run {run_id} signed a new run, {newer[0].run_id} (a run that changes "
        "is a new run): joining it"
    )


def test_the_kept_manifest_is_verified_again_when_read(tmp_path, capsys):
    from node.cli.manifest import keep_manifest, load_kept

    assert load_kept(tmp_path) is None
    m, env = signed(seq=3)
    keep_manifest(tmp_path, env)
    assert load_kept(tmp_path) == (m, env)
    (tmp_path / "run-manifest.bin").write_bytes(env[:-1] + bytes([env[-1] ^ 1]))
    assert load_kept(tmp_path) is None
    assert "ignoring " in capsys.readouterr().err


async def test_a_joined_node_sees_its_trainers_new_run_from_a_peer(tmp_path):
    import trio

    from node.net.runs import RunManifests, RunWatch

    held, _ = signed(seq=10)
    replayed = signed({"taskset": "arithmetic:4-5"}, seq=5)  # an older run of the trainer
    new = signed({"taskset": "arithmetic:6-7"}, seq=20)
    from tests.helpers import net

    seen: list[tuple[RunManifest, bytes]] = []
    heard = trio.Event()

    def on_new(*m: object) -> None:
        seen.append(m)  # type: ignore[arg-type]
        heard.set()

    async with net.two_nodes(tmp_path, ("peer", "worker"), run__id=held.run_id) as (peer, worker):
        served = RunManifests(peer, replayed[1])
        async with trio.open_nursery() as nursery:
            await nursery.start(served.serve)
            addr = f"{peer.addrs[0]}/p2p/{peer.peer_id}"
            watch = RunWatch(worker, held, [addr], on_new, every=0.05)
            await nursery.start(watch.serve)
            await trio.sleep(0.5)
            assert seen == []  # a replayed older run ends nothing
            served.envelope = new[1]
            with trio.fail_after(10):
                await heard.wait()
            assert seen == [new]
            nursery.cancel_scope.cancel()


def test_the_line_a_node_of_an_old_run_stops_with():
    from node.net.runs import new_run_line

    old, new = signed(seq=1)[0], signed({"verify_profile": "paper"}, seq=2)[0]
    assert new_run_line(old, new) == (
        f"the trainer of run {old.run_id} signed a new run, {new.run_id} (a run that changes "
        f"is a new run): this node takes no more of {old.run_id}'s work and stops; start it "
        "again (the same command) to join the new run"
    )
