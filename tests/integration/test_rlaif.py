"""RLAIF end to end: a policy trained against an LLM judge (a deterministic OpenAI-compatible server on
127.0.0.1 that prefers answers saying "good") wins more of the judge's position-swapped comparisons with
a reference answer, on held-out prompts too; with GRPO (`rlaif`) and with Online DPO ranking by the judge."""

from __future__ import annotations

import json

import pytest

from tests.conftest import save_tiny_model
from tests.integration.test_judge import PAIR_RUBRIC, server  # noqa: F401 - the fake judge (a fixture)
from tests.integration.test_reward_model_reward import chat_rows, run_config, word_tokenizer, write_jsonl

PROMPTS = ["say a word", "tell me about the sun", "say it", "tell me a word about a cat", "please say one word",
           "tell me three", "say about the dog", "tell me it"]
HELD_OUT = ["say a word about the tree", "tell me two", "please say it", "tell me about a red dog"]


@pytest.mark.parametrize("algorithm", ["rlaif", "online_dpo"])
def test_the_judged_win_rate_against_the_reference_rises(tmp_path, server, algorithm):
    from oxrl.runner import run

    policy = save_tiny_model(tmp_path / "policy", word_tokenizer())
    with_reference = lambda texts: [{**row, "reference": "a red cat"} for row in chat_rows(texts)]  # noqa: E731
    train = write_jsonl(tmp_path / "train.jsonl", with_reference(PROMPTS))
    val = write_jsonl(tmp_path / "val.jsonl", with_reference(HELD_OUT))
    judge = {"name": "judge", "kwargs": {"url": server.url, "model_name": "judge", "mode": "pairwise",
                                         "rubric": PAIR_RUBRIC, "backoff_s": 0.01, "concurrency": 4}}
    result = run(run_config(
        tmp_path, algorithm, policy, {"train": [{"path": str(train)}], "validation": [{"path": str(val)}]},
        algorithm={"name": algorithm}, **({"preference": {"beta": 0.5}} if algorithm == "online_dpo" else {}),
        rl={"prompts_per_step": 4, "validation_every": 100, "rollout": {"n": 4, "max_new_tokens": 4, "temperature": 1.0},
            "rewards": [judge]},
        train={"max_steps": 10, "micro_batch_size_per_device": 16,
               "optim": {"lr": 2e-2, "schedule": "constant", "max_grad_norm": 1.0}}))
    rows = {r["step"]: r for r in map(json.loads, (result.run_dir / "metrics.jsonl").read_text().splitlines())}
    # The reward is the judged win rate against "a red cat" (win 1, tie 0.5, loss 0; two orders each).
    win_rate = [rows[step]["reward/mean"] for step in range(1, 11)]
    assert sum(win_rate[-3:]) / 3 > sum(win_rate[:3]) / 3 + 0.15, win_rate
    assert rows[10]["val/reward"] > rows[0]["val/reward"] + 0.15, (rows[0]["val/reward"], rows[10]["val/reward"])
    assert all(rows[step]["reward/judge/failures"] == 0 for step in range(1, 11))
    assert server.requests > 0
