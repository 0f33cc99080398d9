"""The ``model init`` base policy sits where RL can improve it (issue #27), and a recipe's
build is seeded and stops inside its learning-rate schedule where the recipe says."""

import pytest
import torch
from safetensors.torch import load_file

from node.engine.tinymodel import Recipe, build_tiny_model
from node.tasks import RL_TASKSET
from node.training.heldout import HeldOut

SMALL = {"hidden": 32, "layers": 1, "heads": 2, "kv_heads": 1, "batch": 8}


@pytest.mark.timeout(900)  # the first test to ask for the base policy builds it (~3 min)
def test_the_base_policy_is_weak_yet_holds_the_skill(base_model_dir):
    """On the held-out tasks of the run's task mix: weak when decoding greedily and when
    sampling, yet 16 samples hold a right answer on most tasks, and the right answers sit
    on tasks (fewer tasks solved than if the same accuracy were spread evenly)."""
    from node.engine import open_engine

    engine, tokenizer = open_engine(str(base_model_dir), backend="torch", max_batch=64)
    held = HeldOut(RL_TASKSET, per_level=50)
    assert held.levels == [2, 3]
    stats = held.sample_stats(engine, tokenizer, samples=32, k=16)
    greedy = held.evaluate(engine, tokenizer, draws=1)["greedy"]["all"]
    sampled = sum(v["sampled"] for v in stats.values()) / len(stats)
    passed = sum(v["pass_at_k"] for v in stats.values()) / len(stats)
    shown = f"greedy {greedy:.3f}, per level {stats}"
    assert greedy <= 0.5, shown
    assert 0.1 <= sampled <= 0.4, shown  # some right samples for GRPO's groups to rank
    assert passed >= 0.7, shown
    for level in stats.values():  # concentrated, not lucky guesses
        assert level["pass_at_k"] < level["pass_at_k_if_even"] - 0.05, shown


def test_a_build_is_seeded_and_stops_inside_its_schedule(tmp_path, monkeypatch):
    schedules = []
    real = torch.optim.lr_scheduler.OneCycleLR

    def recording(opt, **kw):
        schedules.append(kw["total_steps"])
        return real(opt, **kw)

    monkeypatch.setattr(torch.optim.lr_scheduler, "OneCycleLR", recording)
    r = Recipe(steps=6, schedule=20, **SMALL)
    seen = []
    a, built = build_tiny_model(tmp_path / "a", r, progress=lambda d, t, _l: seen.append((d, t)))
    assert built and seen == [(i, 6) for i in range(1, 7)]  # 6 steps of a 20-step schedule
    b, _ = build_tiny_model(tmp_path / "b", r)
    full, _ = build_tiny_model(tmp_path / "full", Recipe(steps=6, schedule=0, **SMALL))
    assert schedules == [20, 20, 6]
    wa, wb, wfull = (load_file(p / "model.safetensors") for p in (a, b, full))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)  # seeded: the same weights bitwise
    assert any(not torch.equal(wa[k], wfull[k]) for k in wa)  # the schedule matters
    assert Recipe(steps=6, schedule=20).digest() != Recipe(steps=6, schedule=0).digest()
    with pytest.raises(ValueError, match="schedule"):
        Recipe(steps=21, schedule=20)
