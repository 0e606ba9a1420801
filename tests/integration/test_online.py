"""Online DPO, RFT and SPIN: the selection rules by hand, their config checks, and a tiny model learning with each."""

import json

import pytest
import torch
from pydantic import ValidationError

from oxrl.algorithms.online import best_worst_pairs, rejection_sample
from oxrl.config.schema import Config
from oxrl.data.types import RLPromptBatch
from oxrl.loops.online import build_online, spin_iteration_steps
from oxrl.loops.pipeline import RolloutPipeline
from oxrl.loops.rl import RLHandles, train_rl
from oxrl.rewards.combine import build_reward_fn
from oxrl.rollout.hf import HFEngine
from oxrl.training.strategy import SingleDevice
from tests.conftest import make_tiny_llama
from tests.integration.test_rl_loop import NO_VALIDATION, prompts
from tests.integration.test_rollout_hf import TinyTokenizer


class WordTokenizer(TinyTokenizer):
    """TinyTokenizer that also encodes: the text is the space-separated token ids (SPIN tokenises gold answers)."""

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [int(word) for word in text.split()]}


def first_token_low(prompt: str, completion: str) -> float:
    """1 when the completion's first token id is below 32 (a quarter of the tiny vocabulary at random)."""
    words = completion.split()
    return float(bool(words) and int(words[0]) < 32)


# ----------------------------------------------------------------------------------------------- selection rules


def test_online_dpo_pairs_best_with_worst_and_drops_ties():
    rewards = torch.tensor([1.0, 0.1, 0.0, 0.1, 0.5, 0.5, 0.5, 0.0, 2.0, 2.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2, 2])
    pairs = best_worst_pairs(rewards, groups)
    # prompt 0: best is 0 (1.0), worst 2 (0.0); prompt 1: all 0.5, a tie; prompt 2: best 8 (the first 2.0), worst 7
    assert (pairs.chosen, pairs.rejected, pairs.ties) == ([0, 8], [2, 7], 1)
    assert pairs.reward_gaps == [1.0, 2.0]


def test_rft_keeps_by_threshold_or_best_and_drops_repeats():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.3, 0.7, 0.7])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    ids = [(5, 2), (5, 2), (6, 2), (7, 2), (8,), (9,), (10,)]
    # threshold 1: 0, 1 (a repeat of 0: dropped), 3
    assert rejection_sample(rewards, groups, ids, "threshold", 1.0).__dict__ == {"indices": [0, 3], "duplicates": 1}
    assert rejection_sample(rewards, groups, ids, "threshold", 1.0, dedupe=False).indices == [0, 1, 3]
    assert rejection_sample(rewards, groups, ids, "threshold", 0.5).indices == [0, 3, 5, 6]
    # best of each prompt (the first of equal bests), if it reaches the threshold
    assert rejection_sample(rewards, groups, ids, "best", None).indices == [0, 5]
    assert rejection_sample(rewards, groups, ids, "best", 0.8).indices == [0]


# ----------------------------------------------------------------------------------------------- config checks


def config(algorithm: str, tmp_path=None, **sections) -> Config:
    rl = {"prompts_per_step": 4, "rollout": {"n": 4, "max_new_tokens": 4, "temperature": 1.0}, **sections.pop("rl", {})}
    return Config.model_validate({
        "run": {"name": algorithm, "output_dir": str(tmp_path or "runs"), "seed": 0},
        "model": {"name_or_path": "unused"}, "algorithm": {"name": algorithm}, "rl": rl,
        "train": {"max_steps": 12, "micro_batch_size_per_device": 8,
                  "optim": {"lr": 2e-2, "schedule": "constant", "max_grad_norm": 1.0}},
        "logging": {"progress_bar": False, "plot": False}, **sections,
    })


@pytest.mark.parametrize("algorithm, sections, message", [
    ("grpo", {"online": {"loss": "ipo"}}, "online.loss = 'ipo' is not read by `grpo`: it is read only by online_dpo, spin"),
    ("online_dpo", {"online": {"threshold": 0.5}}, "online.threshold = 0.5 is not read by `online_dpo`"),
    ("online_dpo", {"rl": {"rollout": {"n": 1}}}, "set rl.rollout.n >= 2"),
    ("online_dpo", {"rl": {"kl_coef": 0.1}}, "rl.kl_coef = 0.1 is not read by `online_dpo`"),
    ("rft", {"rl": {"advantage": "rloo"}}, "rl.advantage = 'rloo' is not read by `rft` (its loss `sft`): it is read only by a policy-gradient update"),
    ("rft", {"online": {"threshold": None}}, "needs online.threshold"),
    ("online_dpo", {"preference": {"simpo_gamma": 1.0}}, "simpo_gamma = 1.0 is not read by `online_dpo` (its loss `dpo`)"),
    ("online_dpo", {"preference": {"reference": "precomputed"}}, "`precomputed` cannot serve `online_dpo`"),
    ("spin", {"strategy": {"name": "fsdp2"}}, "`spin` runs in one process"),
    ("online_dpo", {"rl": {"off_policy_correction": "tis"}},
     "rl.off_policy_correction = 'tis' is not read by `online_dpo`"),
    ("spin", {"rl": {"max_staleness": 1}}, "iteration's end: rl.max_staleness must be 0 (it is 1)"),
    ("rlhf", {}, "add {name: reward_model"),
    ("rlaif", {"rl": {"rewards": [{"name": "math"}]}}, "add {name: judge"),
])
def test_settings_an_online_algorithm_does_not_read_are_refused(algorithm, sections, message):
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)").replace("{", r"\{")):
        config(algorithm, **sections)


def test_a_preference_setting_of_the_chosen_online_loss_is_read():
    cfg = config("online_dpo", online={"loss": "simpo"}, preference={"simpo_gamma": 1.0})
    assert cfg.trained_objective == "simpo" and config("rft").trained_objective == "sft"


def test_spin_checkpoints_and_validates_at_iteration_ends_only():
    cfg = config("spin", online={"iteration_steps": 4}, checkpoint={"every": 6})
    with pytest.raises(ValueError, match=r"checkpoint.every \(6\) must be a multiple of the iteration's 4 steps"):
        spin_iteration_steps(cfg, train_prompts=100)
    cfg = config("spin", online={"iteration_steps": 4}, rl={"validation_every": 6, "rewards": [{"name": "math"}]})
    with pytest.raises(ValueError, match=r"rl.validation_every \(6\) must be a multiple of the iteration's 4 steps"):
        spin_iteration_steps(cfg, train_prompts=100, validating=True)
    assert spin_iteration_steps(cfg, train_prompts=100) == 4  # no held-out prompts: nothing validates
    assert spin_iteration_steps(config("spin", checkpoint={"every": 4}), train_prompts=16) == 4  # 16 prompts / 4 a step


# ----------------------------------------------------------------------------------------------- learning


def run(tmp_path, algorithm: str, reward: str, batch: RLPromptBatch | None = None, **sections):
    cfg = config(algorithm, tmp_path, **sections)
    torch.manual_seed(0)
    model = make_tiny_llama()
    strategy = SingleDevice(torch.device("cpu"), "no", max_grad_norm=1.0)
    batch = batch or prompts()
    online, sampled = build_online(cfg, model, WordTokenizer(), strategy, len(batch.prompt_ids))
    h = RLHandles(cfg, model, strategy, HFEngine(sampled, WordTokenizer()), build_reward_fn([{"name": reward}]),
                  tokenizer=None, online=online, ahead=RolloutPipeline.of if cfg.rl.max_staleness else None)
    result = train_rl(h, batch, NO_VALIDATION, tmp_path / algorithm)
    lines = (tmp_path / algorithm / "metrics.jsonl").read_text().splitlines()
    return result, [json.loads(line) for line in lines], h


@pytest.mark.parametrize("loss", ["dpo", "simpo"])
def test_online_dpo_raises_the_reward(tmp_path, loss):
    result, metrics, h = run(tmp_path, "online_dpo", "tests.integration.test_rl_loop:share_of_sevens", online={"loss": loss},
                             preference={"beta": 0.5} if loss == "dpo" else {})
    first, last = sum(result.rewards[:3]) / 3, sum(result.rewards[-3:]) / 3
    assert last > first + 0.2, result.rewards
    assert (h.online.reference is None) == (loss == "simpo")  # SimPO has no reference model
    assert all(m["pairs/count"] + m["pairs/ties"] == 4 for m in metrics)  # one pair or one tie per prompt
    assert all(m["pairs/reward_gap"] > 0 for m in metrics if m["pairs/count"])


def test_rft_kept_fraction_rises(tmp_path):
    result, metrics, _ = run(tmp_path, "rft", "tests.integration.test_online:first_token_low", online={"threshold": 1.0})
    kept = [m["rft/kept_fraction"] for m in metrics]
    assert sum(kept[-3:]) / 3 > sum(kept[:3]) / 3 + 0.3, kept
    assert all(m["rft/kept"] == m["online/examples"] for m in metrics)


def test_spin_raises_the_gold_vs_own_margin_and_refreshes_its_opponent(tmp_path):
    ids = [[1, 3 + i, 4 + i] for i in range(8)]
    gold = RLPromptBatch(ids, [" ".join(map(str, p)) for p in ids], [{"response": "7 9 7"} for _ in ids],
                         [f"row {i}" for i in range(8)])
    _, metrics, h = run(tmp_path, "spin", "tests.integration.test_rl_loop:share_of_sevens", batch=gold,
                        online={"iteration_steps": 4}, rl={"rollout": {"n": 2, "max_new_tokens": 4}},
                        preference={"beta": 0.5})
    assert [m["spin/iteration"] for m in metrics] == [1] * 4 + [2] * 4 + [3] * 4
    # inside iteration 1 the margin (gold - own implicit reward) grows from 0: the opponent is the reference
    margins = [m["rewards/margins"] for m in metrics]
    assert margins[0] == pytest.approx(0.0, abs=1e-4) and margins[3] > margins[0] + 0.5, margins
    # at an iteration's end the opponent became the policy
    for name, weight in h.model.state_dict().items():
        torch.testing.assert_close(h.online.reference.model.state_dict()[name], weight)
    assert metrics[-1]["spin/own_equals_gold"] >= metrics[0]["spin/own_equals_gold"]


def test_the_engine_keeps_the_opponent_mid_iteration(tmp_path):
    ids = [[1, 3 + i, 4 + i] for i in range(8)]
    gold = RLPromptBatch(ids, [" ".join(map(str, p)) for p in ids], [{"response": "7 9 7"} for _ in ids],
                         [f"row {i}" for i in range(8)])
    _, _, h = run(tmp_path, "spin", "tests.integration.test_rl_loop:share_of_sevens", batch=gold, online={"iteration_steps": 8},
                  rl={"rollout": {"n": 2, "max_new_tokens": 4}}, train={"max_steps": 4, "micro_batch_size_per_device": 8,
                                                                        "optim": {"lr": 2e-2, "schedule": "constant"}})
    # 4 steps of an 8-step iteration: the policy moved, the opponent (which the engine samples from) did not
    assert h.engine.model is h.online.reference.model
    moved = [not torch.equal(h.online.reference.model.state_dict()[n], w) for n, w in h.model.state_dict().items()]
    assert any(moved)


# ----------------------------------------------------------------------------------------------- runs and resume


def varied(prompt: str, completion: str) -> float:
    """Rewards that differ inside a group (so pairs exist and some samples pass), and that a resume must repeat."""
    return (len(completion) % 5) / 4


@pytest.mark.parametrize("algorithm, online, pipelined", [
    ("online_dpo", {}, 0), ("rft", {"threshold": 0.5}, 0), ("spin", {"iteration_steps": 2, "gold_field": "answer"}, 0),
    ("online_dpo", {}, 1), ("rft", {"threshold": 0.5}, 1),  # rl.max_staleness 1: step 3 was sampled before the save
])
def test_a_run_resumed_from_its_checkpoint_repeats_the_uninterrupted_steps(tmp_path, smollm2_tokenizer, algorithm,
                                                                           online, pipelined):
    from oxrl.runner import run as run_config
    from tests.conftest import save_tiny_model
    from tests.system.test_rl_resume import COMPARED, rows_by_step

    save_tiny_model(tmp_path / "model", smollm2_tokenizer)
    tree = {
        "run": {"name": "full", "output_dir": str(tmp_path / "runs"), "seed": 3, "device": "cpu"},
        "model": {"name_or_path": str(tmp_path / "model")},
        "algorithm": {"name": algorithm}, "online": online,
        "rl": {"task": "arithmetic", "task_size": 16, "validation_size": 0, "prompts_per_step": 2,
               "rollout": {"n": 4, "max_new_tokens": 8, "temperature": 1.0},
               "rewards": [{"name": "tests.integration.test_online:varied"}], "max_staleness": pipelined},
        "train": {"max_steps": 4, "micro_batch_size_per_device": 4,
                  "optim": {"lr": 1e-2, "schedule": "cosine", "warmup_steps": 1, "weight_decay": 0.1}},
        "checkpoint": {"every": 2, "keep_last": 5, "save_final": False},
        "logging": {"progress_bar": False, "plot": False},
    }
    run_config(Config.model_validate(tree))
    tree["run"].update(name="resumed", resume=str(tmp_path / "runs" / "full" / "checkpoints" / "step_000002"))
    run_config(Config.model_validate(tree))
    full, resumed = rows_by_step(tmp_path / "runs" / "full"), rows_by_step(tmp_path / "runs" / "resumed")
    assert sorted(full) == [1, 2, 3, 4] and sorted(resumed) == [3, 4]
    compared = [key for key in COMPARED if key in full[3]] + ["online/examples"]
    compared += ["off_policy/version_lag"] if pipelined else []
    assert "loss" in compared and "grad_norm" in compared
    for step in (3, 4):
        for key in compared:
            assert resumed[step][key] == pytest.approx(full[step][key], rel=1e-6, abs=1e-6), (step, key)
    assert len({full[step]["loss"] for step in full}) > 1


def test_an_sft_chat_gives_spin_its_prompt_and_gold_answer(tmp_path):
    from oxrl.data.errors import DataError
    from oxrl.data.rl_prompts import read_rl_prompts

    rows = [{"messages": [{"role": "user", "content": "What is 7*4?"}, {"role": "assistant", "content": "28."},
                          {"role": "user", "content": "And plus 7?"}, {"role": "assistant", "content": "35."}]},
            {"messages": [{"role": "user", "content": "Hi"}]}]
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in rows))
    first, second = read_rl_prompts(str(path))
    assert [m["content"] for m in first.messages] == ["What is 7*4?", "28.", "And plus 7?"]
    assert first.fields == {"response": "35."} and second.fields == {}  # a chat that ends with the user: no gold
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "a"}],
                                "response": "b"}))
    with pytest.raises(DataError, match="row 1.*response.*keep one"):
        read_rl_prompts(str(path))
