"""A precomputed reference scores only the rows the run will read (one batch for `train.max_steps: 1`, validation
rows only when it validates), and shows its progress: a bar, or log lines without one."""

import json
import logging

import pytest
import torch

from oxrl.logging.progress import progress
from oxrl.models.reference import precompute_reference
from oxrl.training.strategy import SingleDevice
from tests.conftest import make_tiny_llama
from tests.integration.test_preference_training import preference_pairs
from tests.integration.test_reference import tiny_model_dir  # noqa: F401 (a fixture)

CPU = SingleDevice(torch.device("cpu"), "no")


def _dpo_config(tmp_path, model_dir, rows: int, *overrides: str):
    from oxrl.config.load import load_config

    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {a}+{a}?", "chosen": f"{2 * a}", "rejected": f"{2 * a + 1}"})
                            + "\n" for a in range(rows)))
    return load_config(None, [
        f"model.name_or_path={model_dir}", f"data.train=[{{path: {data}}}]", "algorithm.name=dpo",
        "preference.reference=precomputed", f"run.output_dir={tmp_path}", "run.device=cpu",
        "train.global_batch_size=4", "train.micro_batch_size_per_device=2", "train.max_steps=1",
        "data.validation_fraction=0.25", "logging.progress_bar=false", "logging.plot=false",
        "checkpoint.save_final=false", *overrides])


@pytest.mark.parametrize("validating", [False, True], ids=["no validation", "eval_every"])
def test_max_steps_1_precomputes_only_the_first_batch(tmp_path, tiny_model_dir, monkeypatch, validating):
    """40 pairs (30 train, 10 validation), 1 step of 4 pairs: 4 pairs scored (8 sequences), + the 10 held out when the
    run validates; before, every one of the 40 was scored."""
    import oxrl.models.reference
    from oxrl.runner import run

    scored = []
    real = oxrl.models.reference.precompute_reference
    monkeypatch.setattr(oxrl.models.reference, "precompute_reference",
                        lambda model, examples, *rest: scored.append(len(examples)) or real(model, examples, *rest))
    extra = ["train.eval_every=1"] if validating else []
    result = run(_dpo_config(tmp_path, tiny_model_dir, 40, *extra))
    assert scored == [4 + (10 if validating else 0)]
    assert len(result.losses) == 1 and ("val/loss" in result.final_metrics) == validating


def test_examples_used_are_the_steps_batches():
    from oxrl.config.schema import Config
    from oxrl.loops.sl import examples_used, step_sampler

    train_set, val_set = preference_pairs(12), preference_pairs(3, seed=4)
    base = {"model": {"name_or_path": "m"}, "algorithm": {"name": "dpo"}, "data": {"train": [{"path": "p"}]}}
    cfg = Config.model_validate({**base, "train": {"global_batch_size": 4, "micro_batch_size_per_device": 2,
                                                   "max_steps": 2}})
    sampler = step_sampler(cfg, len(train_set))
    wanted = {i for step in (0, 1) for i in sampler.step_indices(step)}
    used = examples_used(cfg, train_set, val_set)
    assert len(used) == len(wanted) == 8 and all(any(u is train_set[i] for i in wanted) for u in used)
    longer = Config.model_validate({**base, "train": {"global_batch_size": 4, "micro_batch_size_per_device": 2,
                                                      "max_steps": 9, "eval_every": 3}})
    assert len(examples_used(longer, train_set, val_set)) == 12 + 3  # every row, and validation


def test_the_precompute_shows_a_bar(capsys):
    precompute_reference(make_tiny_llama(), preference_pairs(6), 2, CPU, progress_bar=True)
    err = capsys.readouterr().err
    assert "reference log-probs" in err and "3/3" in err


def test_without_a_bar_the_precompute_logs_lines(oxrl_log):
    oxrl_log.set_level(logging.INFO)
    precompute_reference(make_tiny_llama(), preference_pairs(6), 2, CPU, progress_bar=False)
    assert "reference log-probs: 3 micro-batch(s)..." in oxrl_log.text
    assert "precomputed reference log-probs of 12 sequences" in oxrl_log.text


def test_progress_logs_about_every_tenth_and_nothing_on_other_ranks(oxrl_log, capsys):
    oxrl_log.set_level(logging.INFO)
    assert list(progress(range(30), "scoring", unit="row", bar=False)) == list(range(30))
    lines = [r.getMessage() for r in oxrl_log.records if r.getMessage().startswith("scoring")]
    assert lines[0] == "scoring: 30 row(s)..." and lines[1] == "scoring: 3/30 row(s)" and len(lines) == 10
    oxrl_log.clear()
    assert list(progress(iter(range(5)), "quiet", enabled=False)) == list(range(5))
    assert "quiet" not in oxrl_log.text and "quiet" not in capsys.readouterr().err


def test_rl_validation_before_step_1_is_announced_before_the_step_bar_opens(tmp_path, tiny_model_dir, monkeypatch,
                                                                           oxrl_log):
    """The held-out pass before step 1 takes minutes on a CPU: a line says so, and the step bar (which would sit at
    0/N all that time) opens only after it."""
    import oxrl.loops.rl
    from oxrl import Trainer
    from tests.integration.test_trainer_api import TINY_RL

    events = []
    real = oxrl.loops.rl.MetricsLogger
    monkeypatch.setattr(oxrl.loops.rl, "MetricsLogger", lambda *a, **k: events.append("step bar") or real(*a, **k))
    real_evaluate = oxrl.loops.rl.evaluate
    monkeypatch.setattr(oxrl.loops.rl, "evaluate", lambda h, batch: events.append("validation") or real_evaluate(h, batch))
    oxrl_log.set_level(logging.INFO)
    Trainer(model=str(tiny_model_dir)).train(task="math", **{"run.output_dir": str(tmp_path / "runs"), **TINY_RL})
    assert events[:2] == ["validation", "step bar"]
    assert "held-out validation: greedy answers to 2 prompts" in oxrl_log.text
