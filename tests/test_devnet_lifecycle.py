"""The devnet's own lifecycle, without a network: its signals (a Ctrl-C while it starts
stops it at once; once it runs, a first ends the run, a second does not wait), its nodes
stopped together, an earlier run's files set aside, and children that die with it."""

import os
import signal
import subprocess
import sys
import time

import pytest
import trio
import trio.testing

from node.cli.devnet import NodeProcess, Stopper, set_aside_earlier_run, stop_all
from tests.helpers.net import wait_until
from tests.helpers.procs import gone, parent_and_child

# a devnet stand-in: it spawns one node (tied to it or not) and handles its own Ctrl-C (a
# handler, not SIG_IGN, which the node would inherit)
PARENT = """
import signal, sys, time
from pathlib import Path
from node.cli.devnet import spawn_node

signal.signal(signal.SIGINT, lambda *a: None)
node = spawn_node("n", "inference", Path(sys.argv[1]), run_id="r", listen="-", bootstrap=[],
                  module="tests.helpers.sleeper", die_with_parent=sys.argv[2] == "1")
print(node.proc.pid, flush=True)
time.sleep(60)
"""


def devnet_with_a_node(tmp_path, tied, **popen):
    """``PARENT`` as a process (``popen``: more ``Popen`` arguments) and its node's pid;
    both killed on exit."""
    return parent_and_child(PARENT, str(tmp_path), "1" if tied else "0", **popen)


def test_a_signal_while_starting_stops_at_once_and_a_second_while_running():
    stop = Stopper()
    with pytest.raises(KeyboardInterrupt):  # the chain, the model build, the nodes: now
        stop(signal.SIGINT, None)
    stop = Stopper()
    stop.running = True
    stop(signal.SIGINT, None)  # ends the run loop, which stops the nodes
    assert stop.asked
    with pytest.raises(KeyboardInterrupt):  # again while they stop: do not wait
        stop(signal.SIGTERM, None)


def test_an_earlier_run_is_set_aside_and_an_older_one_replaced(tmp_path):
    """Each run deploys a new chain: a trainer resumed at its old step on it reported
    "2 steps done" without training, or had every batch refused as too old."""
    assert set_aside_earlier_run(tmp_path) is None  # nothing there
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "trainer-state.json").write_text('{"step": 2}')
    (tmp_path / "chain.log").write_text("first")
    moved = set_aside_earlier_run(tmp_path)
    assert moved == tmp_path / "previous-run"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["previous-run"]
    assert (moved / "trainer" / "trainer-state.json").read_text() == '{"step": 2}'
    (tmp_path / "chain.log").write_text("second")
    set_aside_earlier_run(tmp_path)
    assert (moved / "chain.log").read_text() == "second" and not (moved / "trainer").exists()


HOLDER = """
import sys, time
from pathlib import Path
from node.cli.devnet import claim_base_dir

claim_base_dir(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(60)
"""


def test_a_second_devnet_on_the_same_base_dir_is_refused_at_once(tmp_path, monkeypatch, capsys):
    """A second devnet on a running one's base dir set the running one's files aside and
    both terminals showed the second's figures: it now exits at once, in one line naming
    the base dir and the running devnet's pid, and touches nothing there."""
    import node.cli.devnet
    from node.cli.main import main

    def no_chain(*_a, **_k):
        raise AssertionError("the second devnet went on to start a chain")

    monkeypatch.setattr(node.cli.devnet, "start_chain", no_chain)
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "trainer-state.json").write_text('{"step": 2}')
    running = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert running.stdout is not None and running.stdout.readline() == "held\n"
        assert main(["devnet", "--base-dir", str(tmp_path)]) == 1
        said = capsys.readouterr().err
        assert said == (
            f"intellect-node: error: another devnet (pid {running.pid}) runs in {tmp_path}:"
            " stop it first, or give this one another --base-dir\n"
        )
        assert (tmp_path / "trainer" / "trainer-state.json").exists()
        assert not (tmp_path / "previous-run").exists()
    finally:
        running.kill()
        running.wait()
        running.stdout.close()
    with pytest.raises(AssertionError, match="went on to start a chain"):  # free again
        main(["devnet", "--base-dir", str(tmp_path)])
    assert (tmp_path / "previous-run" / "trainer" / "trainer-state.json").exists()
    assert (tmp_path / "devnet.lock").exists()  # not set aside: a third devnet finds it


def test_nodes_are_stopped_together_and_one_that_will_not_is_killed(tmp_path):
    def child(code):
        proc = subprocess.Popen([sys.executable, "-c", code])
        return NodeProcess("n", "inference", tmp_path, proc, tmp_path / "log")

    polite = [child("import time; time.sleep(60)") for _ in range(3)]
    deaf = child(
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    )
    time.sleep(1)  # the deaf one has set its handler
    stop_all([*polite, deaf], grace=2)
    assert [n.proc.returncode for n in polite] == [-signal.SIGTERM] * 3
    assert deaf.proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("tied", [True, False])
def test_a_devnet_killed_outright_takes_its_nodes_with_it(tmp_path, tied):
    """SIGKILL runs no cleanup: its chain and nodes went on under init, and the next
    devnet on the same directory was refused ("another node runs with the data dir")."""
    with devnet_with_a_node(tmp_path, tied) as (parent, node):
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        if tied:
            wait_until(lambda: gone(node), 20, "the node to go with its devnet")
        else:  # what it was before: the node lives on
            time.sleep(1)
            assert not gone(node)


@pytest.mark.parametrize("owned", [True, False])
def test_a_terminals_ctrl_c_reaches_the_devnet_alone_not_its_nodes(tmp_path, owned):
    """A terminal sends Ctrl-C's SIGINT to its whole foreground job: the devnet and, when
    they shared its process group, every node, which then also got the devnet's SIGTERM
    (two signals: each node forced out without its departure). The devnet's nodes run in
    sessions of their own; a node not tied to its parent (``owned`` False) is as before."""
    # a terminal's job: its own process group
    with devnet_with_a_node(tmp_path, owned, start_new_session=True) as (parent, node):
        os.killpg(parent.pid, signal.SIGINT)  # what Ctrl-C in that terminal sends
        time.sleep(1.5)
        assert parent.poll() is None  # the devnet heard it (and would stop its nodes)
        assert gone(node) != owned


@pytest.fixture
def silent_chain():
    """A JSON-RPC endpoint that accepts connections and never answers (a node's chain
    calls wait 30 s each on it)."""
    import select
    import socket
    from types import SimpleNamespace

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    try:
        yield SimpleNamespace(
            url=f"http://127.0.0.1:{server.getsockname()[1]}",
            called=lambda: bool(select.select([server], [], [], 0)[0]),  # a call waits on it
        )
    finally:
        server.close()


def test_ctrl_c_reaches_a_node_still_starting_and_a_second_one_forces_it(
    tmp_path, silent_chain, tiny_model_dir
):
    """A validator whose role is starting (its chain silent: a call waits 30 s) hears the
    first Ctrl-C at once, and a second one ends it at once: before, both waited until the
    role was up, so start-up could not be interrupted at all. A second SIGINT used to be
    lost at times (this test sent a SIGTERM instead): it came while the loop was held by
    the role module's import (torch, seconds, now in a thread), and trio's receiver merged
    it into the first, still unread; now they are counted as they come."""
    from node.cli.devnet import DEVNET_PASSWORD, make_account
    from node.keystore import load_or_create_identity

    data = tmp_path / "validator"
    make_account(data)
    trainer = load_or_create_identity(tmp_path / "trainer").peer_id
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        INTELLECT_NODE_CHAIN__URL=silent_chain.url,
        INTELLECT_NODE_CHAIN__CONTRACT="0x" + "11" * 20,
        INTELLECT_NODE_PASSWORD=DEVNET_PASSWORD,
        INTELLECT_NODE_RUN__MODEL=str(tiny_model_dir),
        INTELLECT_NODE_RUN__TRAINER_PEER_ID=trainer,
        INTELLECT_NODE_CHAIN__ID="1337",
    )
    cmd = [sys.executable, "-m", "node.cli", "start", "--role", "validator"]
    cmd += ["--data-dir", str(data), "--listen", "/ip4/127.0.0.1/tcp/0"]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        # the role is starting: its first chain call waits on the silent chain
        wait_until(silent_chain.called, 120, "the validator's first chain call")
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        time.sleep(2)
        assert proc.poll() is None  # the start-up's chain call is in a thread: it waits...
        proc.send_signal(signal.SIGINT)  # ...unless told again
        out, _ = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, out
    assert "stopping: announcing departure" in out and "forced: exiting now" in out, out


async def test_signals_are_counted_as_they_come_not_as_they_are_read():
    """Two SIGINTs before the loop ran anything: trio's receiver keeps one pending signal
    of a kind, so its task read one, and a node told twice only stopped politely. Counted
    in the handler, the second forces the exit; the first stops the node once, in the
    loop; the handlers before are back afterwards."""
    from node.cli.stopping import FORCED, stop_on_signals

    with trio.open_signal_receiver(signal.SIGINT) as receiver:  # what the node used
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
        assert await receiver.__anext__() == signal.SIGINT
        await trio.testing.wait_all_tasks_blocked()
        assert not receiver._pending  # the second was merged into the first
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    stops, exits = [], []
    with stop_on_signals(lambda: stops.append(1), exit=exits.append):
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
        assert exits == [FORCED]
        await trio.testing.wait_all_tasks_blocked()
        assert stops == [1]
        signal.raise_signal(signal.SIGTERM)  # any later one forces too
        assert exits == [FORCED, FORCED] and stops == [1]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
