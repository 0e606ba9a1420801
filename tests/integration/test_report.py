"""The run report: curves.png panels chosen from what the run logged, and report.md beside it."""

import json
import re

import pytest
import yaml

from oxrl.config.schema import Config
from oxrl.logging.plot import moving_average, plot_curves, select_panels, smoothing_window
from oxrl.config.load import NOT_SET, REQUIRED, non_default_settings
from tests.integration.test_runner import _write_config, tiny_model_dir  # noqa: F401 (a fixture)


def demo_like_rows(steps: int = 40) -> list[dict]:
    """Rows shaped like an RL run's: a 0/1 reward (so `accuracy` repeats `reward/mean`), one update per rollout
    (`clip_frac_high` and `approx_kl` stay 0), a constant lr, held-out accuracy at step 0 and every 8 steps."""
    rows = [{"step": 0, "time": 0.0, "val/accuracy": 0.25, "val/reward": 0.25}]
    for step in range(1, steps + 1):
        reward = (step * 7 % 11) / 10
        row = {"step": step, "time": float(step), "reward/mean": reward, "accuracy": reward, "loss": (step % 3) / 100,
               "clip_frac_high": 0.0, "approx_kl": 0.0, "lr": 1e-5, "entropy": 0.5 - step / 1000,
               "response_length/mean": 30.0 + step % 4, "tokens_per_s": 100.0 + step, "completions_per_s": 4 + step % 2}
        if step % 8 == 0:
            row.update({"val/accuracy": 0.25 + step / 100, "val/reward": 0.25 + step / 100})
        rows.append(row)
    return rows


def panel_keys(rows: list[dict]) -> dict[str, list[str]]:
    return {panel.title: [s.key for s in series] for panel, series in select_panels(rows)}


def test_constant_and_repeated_series_are_left_out_and_related_ones_share_a_panel():
    panels = panel_keys(demo_like_rows())
    assert panels == {
        "loss": ["loss"],
        "reward (training samples)": ["reward/mean"],  # `accuracy` repeats it under a 0/1 reward
        "held-out accuracy": ["val/accuracy"],  # `val/reward` repeats it
        "response length (tokens)": ["response_length/mean"],
        "entropy": ["entropy"],
        "throughput": ["tokens_per_s", "completions_per_s"],
    }  # no KL, clip fraction or lr panel: constant


def test_a_series_that_differs_is_drawn_with_its_relatives():
    rows = demo_like_rows(8)
    for row in rows[1:]:
        row["accuracy"] = row["reward/mean"] / 2  # e.g. a format reward on top of correctness: not a repeat
    rows[4]["val/loss"], rows[8]["val/loss"] = 2.0, 1.5
    panels = {panel.title: series for panel, series in select_panels(rows)}
    assert [s.key for s in panels["loss"]] == ["loss", "val/loss"]
    assert [s.key for s in panels["reward (training samples)"]] == ["reward/mean", "accuracy"]
    assert [s.smooth for s in panels["reward (training samples)"]] == [True, False]  # reward/mean: raw + average
    assert [s.right for s in panels["throughput"]] == [False, True]  # completions/s on its own axis


def test_a_single_evaluation_joins_its_panel_but_makes_none_alone():
    rows = [{"step": s, "time": 0.0, "loss": 3.0 - s} for s in (1, 2, 3)]
    rows[-1]["val/loss"] = 0.5
    rows[-1]["val/accuracy"] = 0.5
    assert panel_keys(rows) == {"loss": ["loss", "val/loss"]}
    assert panel_keys([{"step": 1, "time": 0.0, "loss": 2.0}]) == {}


def test_nonfinite_values_are_left_out_of_a_series():
    rows = [{"step": 1, "time": 0.0, "loss": 2.0}, {"step": 2, "time": 0.0, "loss": float("nan")},
            {"step": 3, "time": 0.0, "loss": 1.0}]
    (panel, [series]), = select_panels(rows)
    assert series.steps == [1, 3] and series.values == [2.0, 1.0]


def test_moving_average_by_hand():
    # window 3: each point with its neighbours; the ends average the two points they have.
    assert moving_average([1.0, 2.0, 6.0, 4.0, 5.0], 3) == pytest.approx([1.5, 3.0, 4.0, 5.0, 4.5])
    # window 5: (0+4+8)/3, (0+4+8+2)/4, (0+4+8+2+6)/5, (4+8+2+6)/4, (8+2+6)/3
    assert moving_average([0.0, 4.0, 8.0, 2.0, 6.0], 5) == pytest.approx([4.0, 3.5, 4.0, 5.0, 16 / 3])
    assert moving_average([3.0], 5) == [3.0]
    assert [smoothing_window(n) for n in (7, 8, 40, 100, 5000)] == [None, 3, 5, 11, 51]


def test_curves_png_has_the_title_and_only_moving_series(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in demo_like_rows()))
    png = plot_curves(tmp_path, title="demo · dr_grpo · smollm2")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "time": 0, "lr": 1e-5}\n{"step": 2, "time": 1, "lr": 1e-5}\n')
    (tmp_path / "curves.png").unlink()
    assert plot_curves(tmp_path) is None and not (tmp_path / "curves.png").exists()


def test_config_diff_lists_exactly_the_keys_that_differ_from_the_schema_defaults():
    cfg = Config.model_validate({
        "model": {"name_or_path": "m"},
        "algorithm": {"name": "grpo"},
        "train": {"optim": {"lr": 3e-4}},
        "logging": {"plot": False, "every": 5},  # plot: its default, so not listed
        "rl": {"task": "arithmetic", "prompts_per_step": 8, "task_config": {"max_operand": 20}},  # 8: the default
    })
    assert non_default_settings(cfg) == [
        ("algorithm.name", "grpo", REQUIRED),
        ("logging.every", 5, 1),
        ("model.name_or_path", "m", REQUIRED),
        ("rl.task", "arithmetic", None),
        ("rl.task_config.max_operand", 20, NOT_SET),  # a key of a dict-valued field, absent from its default
        ("train.optim.lr", 3e-4, 1e-5),
    ]


def config_keys_in(report: str) -> set[str]:
    section = report.split("## Config: what differs from the defaults")[1].split("\n## ")[0]
    return set(re.findall(r"^\| `([^`]+)` \|", section, flags=re.M))


def test_report_of_a_grpo_run(tmp_path, tiny_model_dir):
    from oxrl.cli import main

    config = {
        "run": {"name": "grpo", "output_dir": str(tmp_path / "runs"), "device": "cpu"},
        "model": {"name_or_path": str(tiny_model_dir)},
        "algorithm": {"name": "grpo"},
        "rl": {"task": "arithmetic", "task_size": 16, "validation_size": 4, "validation_every": 2, "prompts_per_step": 2,
               "rollout": {"n": 2, "max_new_tokens": 4, "temperature": 1.0}},  # 1.0: the default, not listed
        "train": {"max_steps": 2, "micro_batch_size_per_device": 4},
        "checkpoint": {"every": None, "save_final": False},  # every: None is the default, not listed
        "logging": {"progress_bar": False, "plot": True, "samples": ["What is 2 + 2?"], "sample_max_new_tokens": 3},
    }
    (tmp_path / "grpo.yaml").write_text(yaml.safe_dump(config))
    assert main(["train", str(tmp_path / "grpo.yaml")]) == 0
    run = tmp_path / "runs" / "grpo"
    report = (run / "report.md").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert report.startswith("# grpo\n") and "**grpo** on **tiny-model**" in report
    assert f"| held-out accuracy (greedy) | {summary['accuracy_before']:.1%} | {summary['accuracy_after']:.1%} |" in report
    assert "| optimizer steps | 2 |" in report and "| completions_per_s (mean over logged steps) |" in report
    assert config_keys_in(report) == {
        "run.name", "run.output_dir", "run.device", "model.name_or_path", "algorithm.name", "rl.task", "rl.task_size",
        "rl.validation_size", "rl.validation_every", "rl.prompts_per_step", "rl.rollout.n", "rl.rollout.max_new_tokens",
        "train.max_steps", "train.micro_batch_size_per_device", "checkpoint.save_final", "logging.progress_bar",
        "logging.plot", "logging.samples", "logging.sample_max_new_tokens",
    }
    assert "### First training step (step 1)" in report and "### Last training step (step 2)" in report
    answers = json.loads((run / "samples.json").read_text())  # logging.samples, answered before and after
    assert [a["prompt"] for a in answers["before"] + answers["after"]] == ["What is 2 + 2?"] * 2
    assert "## Sample answers (greedy, before / after training)" in report
    assert report.count("**completion** (reward ") == 4  # the first completion of each of the 2 prompts, twice
    assert re.search(r"What is \d+ ?[-+*] ?\d+", report)
    assert (run / "curves.png").is_file() and "![training curves](curves.png)" in report  # throughput moves


def test_report_of_an_sft_run(tmp_path, tiny_model_dir):
    from oxrl.cli import main

    config = _write_config(tmp_path, tiny_model_dir, logging={"plot": True, "samples": ["What is 2+2?"], "sample_max_new_tokens": 4})
    assert main(["train", str(config)]) == 0
    run = tmp_path / "runs" / "tiny"
    report = (run / "report.md").read_text()
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert (run / "curves.png").is_file() and "![training curves](curves.png)" in report
    assert f"| loss (step 1 / step 4) | {metrics[0]['loss']:.4g} | {metrics[-1]['loss']:.4g} |" in report
    assert f"| val/loss (step 2 / step 4) | {metrics[1]['val/loss']:.4g} | {metrics[-1]['val/loss']:.4g} |" in report
    assert "| optimizer steps | 4 |" in report and "| tokens_per_s (mean over logged steps) |" in report
    assert config_keys_in(report) == {
        "run.name", "run.output_dir", "model.name_or_path", "data.train", "data.validation_fraction", "data.max_length",
        "algorithm.name", "train.global_batch_size", "train.micro_batch_size_per_device", "train.max_steps",
        "train.eval_every", "train.optim.lr", "checkpoint.every", "checkpoint.keep_last", "logging.progress_bar",
        "logging.plot", "logging.samples", "logging.sample_max_new_tokens",
    }
    samples = json.loads((run / "samples.json").read_text())
    assert "## Sample answers (greedy, before / after training)" in report
    assert "What is 2+2?" in report and samples["after"][0]["completion"] in report
