"""The development chain's state file (``ledger.devchain``: ``DevChain.save`` and
``load``, behind ``intellect-node chain --state``): replaced whole, never written in place.
The chain served from it is tested with the ledger client (``tests/test_ledger_client.py``).
"""

from __future__ import annotations

import json
import os

import pytest

from ledger import devchain
from ledger.devchain import DevChain


def test_saving_replaces_the_state_file_whole_and_a_crash_keeps_the_old_one(tmp_path, monkeypatch):
    chain = DevChain()
    state = tmp_path / "state.json"
    chain.save(state, {"save": 1})
    before = state.read_bytes()
    old = tmp_path / "old.json"
    os.link(state, old)  # the first file, as a reader that opened it still holds it
    chain.offset = 7
    chain.save(state, {"save": 2})
    assert old.read_bytes() == before, "the state file was written in place"
    assert not os.path.samefile(state, old)
    assert DevChain.load(state)[1] == {"save": 2} and DevChain.load(state)[0].offset == 7
    assert state.stat().st_mode & 0o777 == 0o600  # it may hold development keys
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json", "state.json"]

    def killed(doc):  # the process dies while it writes the new state
        raise KeyboardInterrupt

    monkeypatch.setattr(devchain, "json", type("Json", (), {"dumps": staticmethod(killed)}))
    with pytest.raises(KeyboardInterrupt):
        chain.save(state, {"save": 3})
    monkeypatch.undo()
    assert json.loads(state.read_text())["extra"] == {"save": 2}  # the last state, whole
    chain.save(state, {"save": 4})  # the half-written file left behind is no obstacle
    assert DevChain.load(state)[1] == {"save": 4}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json", "state.json"]
