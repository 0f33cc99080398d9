"""GRPO as INTELLECT-2 ran it (node.training): hand-computed losses, clipping, advantages,
and the policy's step, checkpoints and held-out set on the tiny model."""

from __future__ import annotations

import math

import pytest
import torch

from node.training.grpo import (
    GRPOConfig,
    TrainSample,
    group_advantages,
    grpo_loss,
    samples_from_batch,
    samples_from_groups,
)

CFG = GRPOConfig(lr=1e-4)

# -- advantages --------------------------------------------------------------------------


def test_group_advantages_hand_computed():
    # rewards 1,0,0,0: mean 1/4, population std sqrt(3/16) = sqrt(3)/4
    adv = group_advantages([1.0, 0.0, 0.0, 0.0], eps=0.0)
    assert adv == pytest.approx(
        [math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)]
    )
    # rewards 1,0,0,1: mean 1/2, std 1/2; eps enters the divisor
    assert group_advantages([1.0, 0.0, 0.0, 1.0], eps=0.5) == pytest.approx([0.5, -0.5, -0.5, 0.5])
    assert group_advantages([0.3, 0.3], eps=1e-4) == [0.0, 0.0]


def test_zero_advantage_groups_dropped():
    groups = [
        ([5, 6], [([1, 2], [-0.1, -0.2], 1.0), ([3], [-0.3], 1.0)]),  # all right: dropped
        ([7], [([1], [-0.5], 0.0), ([2, 3], [-0.1, -0.2], 0.0)]),  # all wrong: dropped
        ([8, 9], [([4], [-0.4], 1.0), ([5, 6], [-0.6, -0.7], 0.0)]),
    ]
    samples = samples_from_groups(groups, eps=0.0)
    assert [(s.prompt, s.tokens, s.logprobs) for s in samples] == [
        ([8, 9], [4], [-0.4]),
        ([8, 9], [5, 6], [-0.6, -0.7]),
    ]
    assert [s.advantage for s in samples] == pytest.approx([1.0, -1.0])


def test_samples_from_batch_unpacks_and_drops():
    from protocol.rollouts import (
        RolloutBatch,
        RolloutGroup,
        RolloutSample,
        pack_floats,
        pack_tokens,
    )

    def sample(i, tokens, lps, reward):
        return RolloutSample(
            sample=i,
            seed=i,
            tokens=pack_tokens(tokens),
            logprobs=pack_floats(lps),
            finish_reason="stop",
            reward=reward,
            proofs=[],
        )

    groups = [
        RolloutGroup(
            0,
            "t/0",
            pack_tokens([2, 10]),
            [sample(0, [7], [-0.5], 1.0), sample(1, [8, 1], [-0.25, -2.0], 0.0)],
        ),
        RolloutGroup(
            1,
            "t/1",
            pack_tokens([2, 11]),
            [sample(0, [7], [-0.5], 0.0), sample(1, [9], [-1.0], 0.0)],
        ),
        RolloutGroup(
            2,
            "t/2",
            pack_tokens([2, 12]),
            [sample(0, [7], [-0.5], 0.0), sample(1, [9], [-1.0], 1.0)],
        ),
    ]
    batch = RolloutBatch(
        run_id="run",
        sender="peer",
        seq=1,
        ts_ms=0,
        worker="0x" + "11" * 20,
        step=3,
        policy_version=1,
        taskset="arithmetic",
        group_size=2,
        max_new_tokens=8,
        temperature=1.0,
        top_p=1.0,
        proof_chunk=32,
        proof_topk=8,
        groups=groups,
    )
    samples = samples_from_batch(batch, eps=0.0)
    assert [(s.prompt, s.tokens, s.logprobs, s.advantage) for s in samples] == [
        ([2, 10], [7], [-0.5], 1.0),
        ([2, 10], [8, 1], [-0.25, -2.0], -1.0),  # float32 values exact in binary
        ([2, 12], [7], [-0.5], -1.0),
        ([2, 12], [9], [-1.0], 1.0),
    ]
    kept = samples_from_batch(batch, eps=0.0, drop=lambda g: g.index == 0)
    assert [s.prompt for s in kept] == [[2, 12], [2, 12]]


# -- the loss ----------------------------------------------------------------------------

# Two sequences, four token slots. Ratios exp(new - old):
#   A = +1: 1.0 (inside the clip range), 1.5 (above 1 + eps: clipped to 1.2, no gradient),
#           0.5 (below 1 - eps: min keeps 0.5 * A, gradient flows), 100 (masked out)
#   A = -1: 5.0 (above δ = 4: the clamp gives the constant -4, no gradient),
#           0.5 (below 1 - eps: clipped to -0.8, no gradient),
#           3.0 (above 1 + eps, below δ: min keeps -3, gradient flows), 1.0
# Objectives: 1 + 1.2 + 0.5 = 2.7 and -4 - 0.8 - 3 - 1 = -8.8; 7 tokens.
RATIOS = [[1.0, 1.5, 0.5, 100.0], [5.0, 0.5, 3.0, 1.0]]
MASK = [[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]]
ADV = [1.0, -1.0]


def _case(cfg=CFG):
    old = torch.tensor([[-0.7, -1.1, -2.3, -0.2], [-3.0, -0.4, -1.9, -0.05]])
    new = (old + torch.log(torch.tensor(RATIOS))).requires_grad_(True)
    loss, stats = grpo_loss(new, old, torch.tensor(ADV), torch.tensor(MASK), cfg)
    loss.backward()
    return loss, stats, new.grad


def test_loss_hand_computed_token_level():
    loss, stats, _ = _case()
    assert loss.item() == pytest.approx(-(2.7 - 8.8) / 7, rel=1e-6)
    # a mean per sequence first would give -(2.7/3 - 8.8/4)/2 = 0.65: not what INTELLECT-2 does
    assert loss.item() != pytest.approx(0.65, rel=1e-3)
    assert stats["clip_frac"] == pytest.approx(3 / 7)  # 1.5 (A>0), 5.0 and 0.5 (A<0)
    assert stats["ratio_mean"] == pytest.approx(12.5 / 7, rel=1e-6)
    assert stats["tokens"] == 7


def test_loss_gradients_clipped_on_both_sides_and_by_delta():
    # d loss / d new_logprob = -A * ratio / 7 where the unclipped term is the minimum
    _, _, grad = _case()
    want = torch.tensor([[-1.0, 0.0, -0.5, 0.0], [0.0, 0.0, 3.0, 1.0]]) / 7
    assert torch.allclose(grad, want, atol=1e-6)


def test_delta_clamp_is_what_bounds_negative_advantages():
    # with δ = 100 the ratio 5.0 of A = -1 is no longer clamped: -5 instead of -4
    loss, stats, grad = _case(GRPOConfig(lr=1e-4, ratio_clamp=100.0))
    assert loss.item() == pytest.approx(-(2.7 - 9.8) / 7, rel=1e-6)
    assert grad[1, 0].item() == pytest.approx(5 / 7, rel=1e-5)
    assert stats["clip_frac"] == pytest.approx(2 / 7)


def test_no_kl_by_default_and_k3_when_asked():
    old = torch.tensor([[-1.0]])
    new = old + math.log(2.0)  # ratio 2, advantage 0: only a KL term could make a loss
    args = (new, old, torch.tensor([0.0]), torch.tensor([[1.0]]))
    assert grpo_loss(*args, CFG)[0].item() == 0.0
    loss, _ = grpo_loss(*args, GRPOConfig(lr=1e-4, kl_coef=0.1))
    # k3 with d = old - new = -ln 2: e^d - d - 1 = 0.5 + ln 2 - 1
    assert loss.item() == pytest.approx(0.1 * (0.5 + math.log(2.0) - 1), rel=1e-6)


def test_config_bounds():
    with pytest.raises(ValueError, match="ratio_clamp"):
        GRPOConfig(ratio_clamp=1.1)
    with pytest.raises(ValueError, match="lr"):
        GRPOConfig(lr=0.0)


# -- the policy on the tiny model --------------------------------------------------------


def _fixed_samples(policy, temperature=1.0):
    """Two groups answered right and wrong, with the policy's own log-probs as the
    sampling log-probs (ratio 1 at the start)."""
    from node.engine.models import prompt_ids

    tok = policy.tokenizer
    eos = tok.eos_token_id
    groups = []
    for prompt, right, wrongs in (
        ("3+4=?\nAnswer:", "7", ("8", "6", "12")),
        ("21+35=?\nAnswer:", "56", ("55", "65", "46")),
    ):
        ids = prompt_ids(tok, prompt)
        comps = []
        for answer, reward in [(right, 1.0)] + [(w, 0.0) for w in wrongs]:
            out = tok(f" \\boxed{{{answer}}}", add_special_tokens=False)["input_ids"] + [eos]
            comps.append((out, [0.0] * len(out), reward))
        groups.append((ids, comps))
    samples = samples_from_groups(groups)
    for s, lps in zip(samples, policy.logprobs(samples, temperature), strict=True):
        s.logprobs = lps
    return samples


def _weights(policy):
    return {k: v.detach().clone() for k, v in policy.model.state_dict().items()}


@pytest.fixture(params=["llama", "qwen2"])
def policy(request):
    """The policy of the tiny Llama, and of the Qwen2-family model (its chat template, BPE
    tokenizer, grouped-query attention and q/k/v bias)."""
    from node.training.policy import Policy

    torch.set_num_threads(2)
    model_dir = request.getfixturevalue(
        "tiny_model_dir" if request.param == "llama" else "qwen2_model_dir"
    )
    return Policy(model_dir, GRPOConfig(lr=1e-4, micro_batch=3))


def test_train_step_changes_weights_and_lowers_the_loss(policy):
    samples = _fixed_samples(policy)
    before_w = _weights(policy)
    before = policy.loss_on(samples, 1.0)
    stats = policy.train_step(samples, 1.0)
    after = policy.loss_on(samples, 1.0)
    assert stats["samples"] == 8 and stats["tokens"] == sum(len(s.tokens) for s in samples)
    assert stats["loss"] == pytest.approx(before, abs=1e-6)
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-4)  # on-policy at the start
    assert stats["grad_norm"] > 0
    changed = [k for k, v in _weights(policy).items() if not torch.equal(v, before_w[k])]
    assert len(changed) == len(before_w)
    assert after < before - 1e-4
    # the step moved probability toward the right answers: sum of A * (change in log-prob)
    moved = [
        sum(a) - sum(s.logprobs)
        for s, a in zip(samples, policy.logprobs(samples, 1.0), strict=True)
    ]
    assert sum(m * s.advantage for m, s in zip(moved, samples, strict=True)) > 0


def test_an_engine_sharing_the_policy_samples_from_the_stepped_weights(policy):
    """The centralized baseline samples with an engine over the policy's own modules; the
    optimizer updates those weights in place, and the engine's fused copies must follow
    (else each step would be trained on samples of the base policy)."""
    from node.engine.base import GenRequest, SamplingParams
    from node.engine.models import prompt_ids
    from node.engine.torch_engine import TorchEngine

    engine = TorchEngine(policy.model, eos_token_ids=policy.eos_token_ids, max_batch=8)
    ids = prompt_ids(policy.tokenizer, "21+35=?\nAnswer:")
    params = SamplingParams(max_new_tokens=12, temperature=1.0, prove=False)
    reqs = [GenRequest(ids, seed) for seed in range(4)]
    engine.generate(reqs, params)  # the fused copies exist before the step
    policy.train_step(_fixed_samples(policy), 1.0)
    after = engine.generate(reqs, params)
    samples = [TrainSample(list(ids), list(r.tokens), list(r.logprobs), 0.0) for r in after]
    fresh = policy.logprobs(samples, 1.0)
    for r, lps in zip(after, fresh, strict=True):
        assert lps == pytest.approx(r.logprobs, abs=1e-4)  # the engine saw the new weights


def test_micro_batching_equals_one_batch(policy):
    from node.training.policy import Policy

    samples = _fixed_samples(policy)
    whole = Policy(policy.base_dir, GRPOConfig(lr=1e-4, micro_batch=64))
    a, b = policy.train_step(samples, 1.0), whole.train_step(samples, 1.0)
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    for (k, v), w in zip(
        policy.model.state_dict().items(), whole.model.state_dict().values(), strict=True
    ):
        assert torch.allclose(v, w, atol=1e-6), k


def test_saved_policy_loads_in_the_engine(policy, tmp_path):
    from node.engine import open_engine
    from node.engine.base import GenRequest, SamplingParams
    from node.engine.models import prompt_ids
    from node.engine.torch_engine import TorchEngine

    samples = _fixed_samples(policy)
    policy.train_step(samples, 1.0)
    out = policy.save(tmp_path / "v1")
    assert out == tmp_path / "v1"
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "intellect-model.json"} <= names
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left
    engine, saved = open_engine(str(out), backend="torch")
    # the tokenizer travels with each version, its chat template too (Qwen2's)
    assert saved.chat_template == policy.tokenizer.chat_template
    assert prompt_ids(saved, "3+4=?") == prompt_ids(policy.tokenizer, "3+4=?")
    for k, v in policy.model.state_dict().items():
        assert torch.equal(engine.model.state_dict()[k], v), k
    live = TorchEngine(policy.model, eos_token_ids=policy.eos_token_ids)
    reqs = [GenRequest(s.prompt, i) for i, s in enumerate(samples)]
    params = SamplingParams(max_new_tokens=12, temperature=1.0, prove=False)
    assert [r.tokens for r in engine.generate(reqs, params)] == [
        r.tokens for r in live.generate(reqs, params)
    ]
    policy.train_step(samples, 1.0)
    policy.save(out)  # replaces the earlier version whole
    engine2, _ = open_engine(str(out), backend="torch")
    k = "model.norm.weight"
    assert torch.equal(engine2.model.state_dict()[k], policy.model.state_dict()[k])
    assert not torch.equal(engine2.model.state_dict()[k], engine.model.state_dict()[k])


def test_resume_gives_the_identical_next_step(policy, tmp_path):
    from node.training.policy import Policy

    samples = _fixed_samples(policy)
    policy.train_step(samples, 1.0)
    policy.save(tmp_path / "ckpt")
    policy.save_state(tmp_path / "ckpt.state")
    want = policy.train_step(samples[::-1], 1.0)
    resumed = Policy.from_checkpoint(tmp_path / "ckpt", tmp_path / "ckpt.state", policy.cfg)
    assert resumed.steps == 1
    got = resumed.train_step(samples[::-1], 1.0)
    for key in ("loss", "grad_norm", "clip_frac", "ratio_mean", "tokens"):
        assert got[key] == want[key], key
    for (k, v), w in zip(
        policy.model.state_dict().items(), resumed.model.state_dict().values(), strict=True
    ):
        assert torch.equal(v, w), k
    # without the optimizer state the next step is a first Adam step: different weights
    fresh = Policy(tmp_path / "ckpt", policy.cfg)
    fresh.train_step(samples[::-1], 1.0)
    assert not torch.equal(fresh.model.model.norm.weight, policy.model.model.norm.weight)


# -- held-out ----------------------------------------------------------------------------


def test_heldout_is_fixed_distinct_and_never_trained_on():
    from node.rollouts.generate import ScoredGroup
    from node.tasks import assign, load_taskset
    from node.training.central import fake_worker, trainable_groups
    from node.training.heldout import HeldOut

    h = HeldOut("arithmetic", per_level=40, seed=3)
    assert [t.prompt for t in h.tasks] == [
        t.prompt for t in HeldOut("arithmetic", per_level=40, seed=3).tasks
    ]
    assert [t.prompt for t in h.tasks] != [
        t.prompt for t in HeldOut("arithmetic", per_level=40, seed=4).tasks
    ]
    assert len(h.tasks) == 120 and len(h.prompts) == 120 and h.levels == [1, 2, 3]
    assert all(sum(t.difficulty == lv for t in h.tasks) == 40 for lv in (1, 2, 3))
    # level 1 has only 100 problems: training assignments hit held-out prompts (mostly level 1) ...
    taskset = load_taskset("arithmetic")
    tasks = [t for step in range(20) for t in assign(taskset, fake_worker(0), step, 32)]
    hits = [t for t in tasks if h.contains(t.prompt)]
    assert sum(t.difficulty == 1 for t in hits) > len(hits) / 2
    # ... and those groups are dropped before training
    groups = [ScoredGroup(i, t, [1], [], [], [1.0, 0.0]) for i, t in enumerate(tasks)]
    kept = trainable_groups(groups, h)
    assert [g.task for g in kept] == [t for t in tasks if not h.contains(t.prompt)]
    assert len(kept) == len(tasks) - len(hits)


def test_heldout_batch_filter_recomputes_the_assignment():
    from node.tasks import assign, load_taskset
    from node.training.heldout import HeldOut

    h = HeldOut("arithmetic", per_level=50, seed=0)
    taskset = load_taskset("arithmetic")
    worker = "0x" + "22" * 20

    class Batch:  # only what the filter reads
        pass

    class Group:
        def __init__(self, index):
            self.index = index

    for step in range(40):
        tasks = assign(taskset, worker, step, 8)
        batch = Batch()
        batch.worker, batch.step = worker, step
        drop = h.batch_filter(batch, taskset)
        assert [drop(Group(i)) for i in range(8)] == [h.contains(t.prompt) for t in tasks]


def test_heldout_evaluate_per_level(tiny_model_dir):
    from node.training.heldout import HeldOut

    torch.set_num_threads(2)
    h = HeldOut("arithmetic", per_level=8, seed=0)
    scores = h.evaluate_dir(tiny_model_dir, draws=2, max_new_tokens=40)
    assert set(scores) == {"sampled", "greedy", "pass_at_k"}
    for acc in scores.values():
        assert set(acc) == {"1", "2", "3", "all"}
        assert acc["all"] == pytest.approx((acc["1"] + acc["2"] + acc["3"]) / 3)
    assert scores["greedy"]["1"] >= 0.5  # the base policy knows most one-digit sums
    assert scores["sampled"]["1"] <= scores["pass_at_k"]["1"]
    # seeded draws, greedy: deterministic
    assert scores == h.evaluate_dir(tiny_model_dir, draws=2, max_new_tokens=40)


class CharTokenizer:
    def __call__(self, text):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, tokens, skip_special_tokens=True):
        return "".join(map(chr, tokens))


def test_heldout_evaluate_sampled_greedy_and_pass_at_k_on_a_scripted_engine():
    """Sampled at the training temperature (0.7 here), 8 draws: level-1 tasks are right on
    seeds 0 and 1, the first level-2 task on every seed, level 3 never. Greedy: the first
    two level-1 tasks and the first level-3 task are right."""
    from types import SimpleNamespace

    from node.training.heldout import HeldOut, metrics_fields

    h = HeldOut("arithmetic", per_level=4, seed=0)
    by_prompt = {t.prompt: t for t in h.tasks}
    level = {lv: [t for t in h.tasks if t.difficulty == lv] for lv in (1, 2, 3)}
    greedy_right = {*level[1][:2], level[3][0]}
    calls = []

    class Engine:
        def generate(self, requests, params):
            assert not params.prove
            calls.append((params.temperature, [r.seed for r in requests]))
            out = []
            for r in requests:
                t = by_prompt["".join(map(chr, r.prompt))]
                if params.temperature == 0.0:
                    right = t in greedy_right
                else:
                    right = (t.difficulty == 1 and r.seed < 2) or t is level[2][0]
                answer = t.answer if right else str(int(t.answer) + 1)
                out.append(SimpleNamespace(tokens=[ord(c) for c in f" \\boxed{{{answer}}}"]))
            return out

    scores = h.evaluate(Engine(), CharTokenizer(), draws=8, temperature=0.7)
    assert sorted(t for t, _ in calls) == [0.0, 0.7]
    seeds = dict(calls)
    assert seeds[0.7] == list(range(8)) * len(h.tasks) and seeds[0.0] == [0] * len(h.tasks)
    assert scores == {
        "sampled": {"1": 0.25, "2": 0.25, "3": 0.0, "all": pytest.approx(2 / 12)},
        "greedy": {"1": 0.5, "2": 0.0, "3": 0.25, "all": 0.25},
        "pass_at_k": {"1": 1.0, "2": 0.25, "3": 0.0, "all": pytest.approx(5 / 12)},
    }
    fields = metrics_fields(scores, 8)
    assert fields["heldout_sampled"] == pytest.approx(2 / 12)
    assert fields["heldout_greedy"] == 0.25
    assert fields["heldout_pass_at_k"] == pytest.approx(5 / 12)
    assert fields["heldout_draws"] == 8
    assert fields["heldout_by_level"]["3"] == {"sampled": 0.0, "greedy": 0.25, "pass_at_k": 0.0}
    with pytest.raises(ValueError, match="draws must be >= 1"):
        h.evaluate(Engine(), CharTokenizer(), draws=0)


def test_train_sample_is_plain_data():
    s = TrainSample([1], [2, 3], [-0.1, -0.2], 0.5)
    assert s.tokens == [2, 3] and s.advantage == 0.5


def test_pass_at_k_estimator_on_hand_computed_cases():
    from node.training.heldout import pass_at_k

    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 3 of the 6 pairs hold the right one
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6)  # only the pair of wrong ones misses
    assert pass_at_k(5, 2, 5) == 1.0


def test_heldout_sample_stats_counts_right_draws_per_task():
    """A scripted engine: level-1 tasks are answered right on seeds 0 and 1 of 8, the
    first level-2 task on every seed and the rest never, level 3 never."""
    from types import SimpleNamespace

    from node.training.heldout import HeldOut

    h = HeldOut("arithmetic", per_level=4, seed=0)
    by_prompt = {t.prompt: t for t in h.tasks}
    first_l2 = next(t for t in h.tasks if t.difficulty == 2)

    class Engine:
        def __init__(self):
            self.requests = []

        def generate(self, requests, params):
            assert params.temperature == 1.0 and not params.prove
            self.requests += requests
            out = []
            for r in requests:
                t = by_prompt["".join(map(chr, r.prompt))]
                right = (t.difficulty == 1 and r.seed < 2) or t is first_l2
                answer = t.answer if right else str(int(t.answer) + 1)
                out.append(SimpleNamespace(tokens=[ord(c) for c in f" \\boxed{{{answer}}}"]))
            return out

    engine = Engine()
    stats = h.sample_stats(engine, CharTokenizer(), samples=8, k=2)
    assert len(engine.requests) == 8 * len(h.tasks)
    assert sorted({r.seed for r in engine.requests}) == list(range(8))
    assert set(stats) == {"1", "2", "3"}
    one, two, three = stats["1"], stats["2"], stats["3"]
    assert one["sampled"] == pytest.approx(2 / 8)
    assert one["pass_at_k"] == pytest.approx(1 - 15 / 28)  # 1 - C(6,2)/C(8,2) per task
    assert one["pass_at_k_if_even"] == pytest.approx(1 - 0.75**2)
    assert two["sampled"] == pytest.approx(1 / 4)  # one task of four, every time
    assert two["pass_at_k"] == pytest.approx(1 / 4)  # concentrated: below the even figure
    assert two["pass_at_k"] < two["pass_at_k_if_even"] < one["pass_at_k"]
    assert three["sampled"] == three["pass_at_k"] == three["best_task"] == 0.0
    assert one["best_task"] == pytest.approx(2 / 8) and two["best_task"] == 1.0
    with pytest.raises(ValueError, match="k <= samples"):
        h.sample_stats(engine, CharTokenizer(), samples=4, k=5)


def test_heldout_sample_stats_on_the_base_policy(tiny_model_dir):
    from node.engine import open_engine
    from node.training.heldout import HeldOut

    torch.set_num_threads(2)
    h = HeldOut("arithmetic", per_level=4, seed=0)
    engine, tok = open_engine(str(tiny_model_dir), backend="torch", max_batch=64)
    stats = h.sample_stats(engine, tok, samples=8, k=4, max_new_tokens=40)
    assert stats == h.sample_stats(engine, tok, samples=8, k=4, max_new_tokens=40)  # seeded
    for s in stats.values():
        assert 0.0 <= s["sampled"] <= s["pass_at_k"] <= 1.0
    assert stats["1"]["sampled"] > 0.3  # the base policy samples most one-digit sums right
