"""`oxrl eval` on tiny random models: samples, baseline, rewards, run directories, bad input, and agreement
with the RL loop's own held-out evaluation."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import yaml

from oxrl.cli import main
from oxrl.loops.rl import summarise
from oxrl.evaluation.run import EvalRequest, evaluate_models, wilson_interval
from oxrl.rewards.combine import RewardOutput
from oxrl.rollout.base import Completion
from tests.conftest import make_tiny_llama

FAST = ["--task", "arithmetic", "--limit", "3", "--max-new-tokens", "4"]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, smollm2_tokenizer):
    """Two tiny random Llamas (different weights) with the real SmolLM2 tokenizer, saved as HF folders."""
    root = tmp_path_factory.mktemp("models")
    paths = []
    for seed in (0, 1):
        model = make_tiny_llama(vocab_size=len(smollm2_tokenizer), seed=seed)
        model.config.eos_token_id = smollm2_tokenizer.eos_token_id
        model.save_pretrained(root / f"tiny{seed}")
        smollm2_tokenizer.save_pretrained(root / f"tiny{seed}")
        paths.append(root / f"tiny{seed}")
    return paths


def rows_of(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def reward_file(tmp_path, body: str) -> str:
    path = tmp_path / "rewards.py"
    path.write_text(f"def score(prompt, completion, **fields):\n    return {body}\n")
    return f"{path}:score"


def test_summary_by_hand():
    # Prompt 0: samples correct, wrong, correct (c=2 of n=3); prompt 1: wrong x3 (c=0).
    scores = [1.0, 0.0, 1.0, 0.0, 0.5, 0.0]
    completions = [Completion(i // 3, [1], [5] * length, [0.0] * length, reason, "x")
                   for i, (length, reason) in enumerate([(2, "eos"), (4, "length"), (3, "eos"), (1, "eos"), (4, "length"), (4, "length")])]
    summary = summarise(completions, RewardOutput(scores, {"math": scores}, {"math": 0}, {"math": 0.0}))
    assert summary["accuracy"] == pytest.approx(2 / 6)
    assert summary["reward/mean"] == pytest.approx(2.5 / 6)
    assert summary["response_length/mean"] == pytest.approx(18 / 6) and summary["response_length/max"] == 4.0
    assert summary["truncated_fraction"] == pytest.approx(3 / 6)
    # pass@1 = mean(c/n) = (2/3 + 0) / 2; pass@2: prompt 0: 1 - C(1,2)/C(3,2) = 1, prompt 1: 0 -> 0.5; pass@3 = 0.5
    assert summary["pass@1"] == pytest.approx(1 / 3) and summary["pass@2"] == 0.5 and summary["pass@3"] == 0.5
    assert "pass@4" not in summary


def test_wilson_interval_by_hand():
    # p = 5/10, z = 1.96: centre (0.5 + 0.19208) / 1.38416 = 0.5; half 1.96 / 1.38416 * sqrt(0.025 + 0.0096040) = 0.26341
    assert wilson_interval(5, 10) == pytest.approx((0.23659, 0.76341), abs=1e-5)
    # 0 of 10: not the empty interval p +- z * se gives; its upper end z^2 / (n + z^2) = 3.8416 / 13.8416
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.27754), abs=1e-5)
    assert wilson_interval(10, 10) == pytest.approx((0.72246, 1.0), abs=1e-5)
    with pytest.raises(ValueError, match="0 <= successes <= total and total >= 1, got 3 of 2"):
        wilson_interval(3, 2)


def test_eval_writes_every_sample(tmp_path, model_dirs, capsys):
    out = tmp_path / "samples.jsonl"
    assert main(["eval", str(model_dirs[0]), *FAST, "--n", "2", "--out", str(out)]) == 0
    rows = rows_of(out)
    assert [(r["pass"], r["prompt_index"], r["sample"]) for r in rows] == (
        [("greedy", p, 0) for p in range(3)] + [("sampled", p, s) for p in range(3) for s in range(2)])
    for row in rows:
        assert {"model", "prompt", "completion", "rewards", "reward", "correct", "answer", "finish_reason", "tokens"} <= set(row)
        assert row["model"] == str(model_dirs[0]) and "What is" in row["prompt"] and set(row["rewards"]) == {"math"}
        assert row["tokens"] <= 4
    table = capsys.readouterr().out
    assert "3 prompts (arithmetic held-out, seed 0)" in table
    for key in ("greedy/accuracy", "sampled/pass@1", "sampled/pass@2", "greedy/response_length/mean", "sampled/truncated_fraction"):
        assert key in table
    assert not (tmp_path / "samples.jsonl.partial").exists()


def test_accuracy_is_a_fraction_and_matches_the_samples(tmp_path, model_dirs):
    out = tmp_path / "samples.jsonl"
    # Scores 0, 0.5 or 1 by completion length: some samples correct, some not (a random model gets no sums right).
    result = evaluate_models(EvalRequest(str(model_dirs[0]), task="arithmetic", limit=4, max_new_tokens=6, n=3,
                                         rewards=[reward_file(tmp_path, "len(completion) % 3 / 2")], out=str(out)))
    metrics = result.reports[0].metrics
    greedy = [r for r in rows_of(out) if r["pass"] == "greedy"]
    assert 0.0 <= metrics["greedy/accuracy"] <= 1.0
    assert metrics["greedy/accuracy"] == sum(r["correct"] for r in greedy) / 4
    assert (metrics["greedy/accuracy_ci95_low"], metrics["greedy/accuracy_ci95_high"]) == wilson_interval(
        sum(r["correct"] for r in greedy), 4)
    assert "sampled/accuracy_ci95_low" not in metrics  # pass@k reports the samples
    assert metrics["greedy/reward/mean"] == pytest.approx(sum(r["reward"] for r in greedy) / 4)
    assert metrics["sampled/pass@1"] <= metrics["sampled/pass@2"] <= metrics["sampled/pass@3"]


def test_baseline_is_evaluated_on_the_same_prompts(tmp_path, model_dirs):
    out = tmp_path / "samples.jsonl"
    result = evaluate_models(EvalRequest(str(model_dirs[0]), baseline=str(model_dirs[1]), task="arithmetic", limit=3,
                                         max_new_tokens=4, out=str(out)))
    assert [r.label for r in result.reports] == [str(model_dirs[0]), str(model_dirs[1])]
    assert result.reports[0].metrics.keys() == result.reports[1].metrics.keys()
    rows = rows_of(out)
    by_model = {label: [(r["pass"], r["prompt"], r["answer"]) for r in rows if r["model"] == label] for label in
                (str(model_dirs[0]), str(model_dirs[1]))}
    assert len(by_model[str(model_dirs[0])]) == 3 and by_model[str(model_dirs[0])] == by_model[str(model_dirs[1])]
    completions = {label: [r["completion"] for r in rows if r["model"] == label and r["pass"] == "greedy"] for label in by_model}
    assert completions[str(model_dirs[0])] != completions[str(model_dirs[1])]  # two different models really ran


def test_a_reward_that_always_gives_full_marks(tmp_path, model_dirs, capsys):
    always = reward_file(tmp_path, "1.0")
    assert main(["eval", str(model_dirs[0]), *FAST, "--n", "4", "--reward", always]) == 0
    table = capsys.readouterr().out
    cells = {line.split()[0]: line.split()[-1] for line in table.splitlines()[2:]}
    assert all(cells[key] == "100.0%" for key in ("greedy/accuracy", "sampled/pass@1", "sampled/pass@2", "sampled/pass@4"))
    assert cells["greedy/reward/mean"] == cells["sampled/reward/mean"] == "1.000"


def test_a_run_directory_resolves_to_its_final_model_else_its_latest_checkpoint(tmp_path, model_dirs, oxrl_log):
    # Which model a run directory resolves to is logged at INFO: captured at that level whether or not an earlier
    # `oxrl` command in this process set up logging (else the `oxrl` logger is at the root's WARNING).
    oxrl_log.set_level(logging.INFO, logger="oxrl")
    run = tmp_path / "run"
    for step, weights in ((1, model_dirs[1]), (2, model_dirs[0])):  # step 2 holds model 0
        shutil.copytree(weights, run / "checkpoints" / f"step_00000{step}")
        (run / "checkpoints" / f"step_00000{step}" / "training_state").mkdir()
        (run / "checkpoints" / f"step_00000{step}" / "training_state" / "trainer_state.json").write_text("{}")
    direct = evaluate_models(EvalRequest(str(model_dirs[0]), task="arithmetic", limit=3, max_new_tokens=4)).reports[0]
    latest = evaluate_models(EvalRequest(str(run), task="arithmetic", limit=3, max_new_tokens=4)).reports[0]
    assert latest.path == str(run / "checkpoints" / "step_000002") and latest.metrics == direct.metrics
    assert "evaluating its latest checkpoint" in oxrl_log.text
    shutil.copytree(model_dirs[1], run / "final")
    final = evaluate_models(EvalRequest(str(run), task="arithmetic", limit=3, max_new_tokens=4)).reports[0]
    assert final.path == str(run / "final") and "evaluating its final model" in oxrl_log.text
    empty = tmp_path / "empty-run"
    empty.mkdir()
    (empty / "config.yaml").write_text("{}")
    assert main(["eval", str(empty), *FAST]) == 2
    assert "no final/ model and no complete checkpoint" in oxrl_log.text


def test_eval_of_a_training_run_reproduces_its_validation_accuracy(tmp_path, model_dirs):
    """`oxrl eval RUN_DIR` reads the run's config.yaml (prompts, rewards, sampling) and final/ model: its greedy
    accuracy and reward are the val/accuracy and val/reward the RL loop logged after its last step."""
    cfg = {
        "run": {"name": "grpo", "output_dir": str(tmp_path / "runs")},
        "model": {"name_or_path": str(model_dirs[0])},
        "algorithm": {"name": "dr_grpo"},
        "rl": {"task": "arithmetic", "task_size": 8, "validation_size": 5, "prompts_per_step": 2, "validation_every": 1,
               "rollout": {"n": 4, "max_new_tokens": 6},
               "rewards": [{"name": reward_file(tmp_path, "sum(map(ord, completion)) % 3 / 2")}]},
        "train": {"max_steps": 1, "micro_batch_size_per_device": 8, "optim": {"lr": 1e-2, "schedule": "constant"}},
        "logging": {"progress_bar": False, "plot": False},
    }
    config = tmp_path / "grpo.yaml"
    config.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(config)]) == 0
    run = tmp_path / "runs" / "grpo"
    logged = rows_of(run / "metrics.jsonl")[-1]
    assert logged["grad_norm"] > 0  # the update moved the weights: final/ is not the initial model
    # The run's saved config names a reward file: code, which a run directory's config runs only when trusted.
    report = evaluate_models(EvalRequest(str(run), trust_config_code=True)).reports[0]
    assert report.path == str(run / "final")
    assert report.metrics["greedy/accuracy"] == logged["val/accuracy"]
    assert report.metrics["greedy/reward/mean"] == pytest.approx(logged["val/reward"], abs=1e-12)


@pytest.mark.parametrize("arguments, message", [
    (["--task", "arithmetc"], "unknown generated task 'arithmetc'. Did you mean 'arithmetic'?"),
    (["--data", "missing.jsonl"], "missing.jsonl: file not found"),
    (["--task", "arithmetic", "--n", "0"], "--n must be at least 1, got 0"),
    (["--task", "arithmetic", "--limit", "0"], "--limit must be at least 1"),
    (["--task", "arithmetic", "--reward", "nope.py:score"], "file 'nope.py' not found"),
    (["--task", "arithmetic", "--video", "episodes.mp4"], "--video episodes.mp4: name the .gif file to write"),
    (["--task", "arithmetic", "--video", "episodes.gif"], "--video episodes.gif: only a config with a `vla` section"),
    ([], "nothing to evaluate on"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, model_dirs, oxrl_log, arguments, message):
    assert main(["eval", str(model_dirs[0]), *arguments]) == 2
    errors = [r.getMessage() for r in oxrl_log.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and message in errors[0] and "\n" not in errors[0], errors
    assert "loaded" not in oxrl_log.text  # no model was loaded


def test_missing_model_and_unreadable_data_file(tmp_path, model_dirs, oxrl_log):
    assert main(["eval", str(tmp_path / "no-such-model"), *FAST]) == 2
    assert "model path not found" in oxrl_log.text
    broken = tmp_path / "gsm8k.jsonl"
    broken.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")  # no '#### <answer>' line
    assert main(["eval", str(model_dirs[0]), "--data", str(broken)]) == 2
    assert "gsm8k.jsonl, row 1, field 'answer'" in oxrl_log.text
    folder = tmp_path / "results"
    folder.mkdir()
    assert main(["eval", str(model_dirs[0]), *FAST, "--out", str(folder)]) == 2
    assert f"could not write {folder}" in oxrl_log.text


def test_prompt_files_are_evaluated_row_by_row(tmp_path, model_dirs):
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i}+{i}?", "answer": f"{i}+{i}=#### {2 * i}"}) + "\n" for i in range(4)))
    out = tmp_path / "samples.jsonl"
    result = evaluate_models(EvalRequest(str(model_dirs[0]), data=[str(data)], max_new_tokens=4, out=str(out)))
    assert result.description.startswith(f"4 prompts ({data})") and "rewards: math x1" in result.description
    assert [r["answer"] for r in rows_of(out)] == ["0", "2", "4", "6"]
    assert [r["origin"] for r in rows_of(out)] == [f"{data} row {i}" for i in range(1, 5)]


def test_a_pass_shows_its_progress_and_samples_in_chunks_as_in_one_call(tmp_path, model_dirs, smollm2_tokenizer, capsys):
    """The progress bar counts prompts chunk by chunk; the chunks are the `hf` engine's own (max_batch_size // n
    prompts), so the samples are those of one call over every prompt."""
    import torch

    from oxrl.data.rl_tasks import encode_prompts, generate_rl_prompts
    from oxrl.evaluation.run import _sample_with_progress
    from oxrl.loops.rl import sample_and_reward
    from oxrl.models.load import load_model
    from oxrl.config.schema import ModelConfig
    from oxrl.rewards import build_reward_fn
    from oxrl.rollout.base import SamplingParams
    from oxrl.rollout.hf import HFEngine

    assert main(["eval", str(model_dirs[0]), *FAST, "--n", "2", "--set", "rl.rollout.max_batch_size=2"]) == 0
    progress = capsys.readouterr().err
    assert f"{model_dirs[0]} (greedy): 100%" in progress and "3/3" in progress and f"{model_dirs[0]} (sampled)" in progress

    prompts, _ = generate_rl_prompts("arithmetic", train_size=5, validation_size=0)
    batch = encode_prompts(prompts, smollm2_tokenizer)
    model = load_model(ModelConfig(name_or_path=str(model_dirs[0])), torch.device("cpu")).requires_grad_(False)
    engine, reward_fn = HFEngine(model, smollm2_tokenizer, max_batch_size=4), build_reward_fn(["math"])
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=4)
    torch.manual_seed(0)
    whole, whole_scores, _ = sample_and_reward(engine, reward_fn, None, batch, params)
    torch.manual_seed(0)
    chunked, chunked_scores = _sample_with_progress(engine, reward_fn, None, batch, params, "x", chunk=2)
    assert [(c.prompt_index, c.completion_ids) for c in chunked] == [(c.prompt_index, c.completion_ids) for c in whole]
    assert chunked_scores.totals == whole_scores.totals
