"""The whole run through `oxrl train`: local HF folder + data file -> checkpoints, final model, metrics, plot."""

import json

import pytest
import torch
import yaml

from oxrl.cli import main
from tests.conftest import make_tiny_llama


@pytest.fixture
def tiny_model_dir(tmp_path, smollm2_tokenizer):
    """A tiny random Llama with the real SmolLM2 tokenizer, saved as a local HF folder."""
    model = make_tiny_llama(vocab_size=len(smollm2_tokenizer))
    model.config.eos_token_id = smollm2_tokenizer.eos_token_id
    path = tmp_path / "tiny-model"
    model.save_pretrained(path)
    smollm2_tokenizer.save_pretrained(path)
    return path


def _write_config(tmp_path, model_dir, **overrides):
    rows = [{"messages": [{"role": "user", "content": f"What is {i}+{i}?"}, {"role": "assistant", "content": f"The answer is {2 * i}."}]}
            for i in range(24)]
    data = tmp_path / "chat.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = {
        "run": {"name": "tiny", "output_dir": str(tmp_path / "runs")},
        "model": {"name_or_path": str(model_dir)},
        "data": {"train": [{"path": str(data)}], "validation_fraction": 0.25, "max_length": 64},
        "algorithm": {"name": "sft"},
        "train": {"global_batch_size": 4, "micro_batch_size_per_device": 2, "max_steps": 4, "eval_every": 2,
                  "optim": {"lr": 1e-3}},
        "checkpoint": {"every": 2, "keep_last": 1},
        "logging": {"progress_bar": False},
    }
    for key, value in overrides.items():
        cfg[key].update(value)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_cli_train_writes_a_complete_run(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert main(["train", str(_write_config(tmp_path, tiny_model_dir))]) == 0
    run = tmp_path / "runs" / "tiny"
    assert (run / "config.yaml").is_file()
    assert not (run / "curves.png").exists() and not (run / "report.md").exists()  # logging.plot is opt-in
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert "val/loss" in records[1] and "val/loss" in records[3] and "tokens_per_s" in records[0]
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert checkpoints == ["step_000004"]  # keep_last 1
    final = AutoModelForCausalLM.from_pretrained(run / "final")
    AutoTokenizer.from_pretrained(run / "final")
    assert final.config.vocab_size == 49152


def test_resume_through_the_cli_matches_the_uninterrupted_run(tmp_path, tiny_model_dir):
    config = _write_config(tmp_path, tiny_model_dir, checkpoint={"every": 2, "keep_last": 3})
    assert main(["train", str(config)]) == 0
    full = [json.loads(l)["loss"] for l in (tmp_path / "runs" / "tiny" / "metrics.jsonl").read_text().splitlines()]
    checkpoint = tmp_path / "runs" / "tiny" / "checkpoints" / "step_000002"
    assert main(["train", str(config), "run.name=resumed", f"run.resume={checkpoint}"]) == 0
    resumed = [json.loads(l)["loss"] for l in (tmp_path / "runs" / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert len(resumed) == 2
    for a, b in zip(full[2:], resumed):
        assert abs(a - b) < 1e-6


def test_a_malformed_row_stops_the_run_before_the_model_loads(tmp_path, tiny_model_dir, caplog):
    config = _write_config(tmp_path, tiny_model_dir)
    data = tmp_path / "chat.jsonl"
    lines = data.read_text().splitlines()
    lines[6] = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]})
    data.write_text("\n".join(lines) + "\n")
    assert main(["train", str(config)]) == 2
    assert "chat.jsonl" in caplog.text and "row 7" in caplog.text and "content" in caplog.text
    run = tmp_path / "runs" / "tiny"
    assert not (run / "metrics.jsonl").exists() and not (run / "config.yaml").exists()
    # Nothing of a run was written, so the corrected command needs neither run.resume nor run.overwrite.
    lines[6] = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})
    data.write_text("\n".join(lines) + "\n")
    assert main(["train", str(config), "train.max_steps=1", "checkpoint.every=null",
                 "checkpoint.keep_last=2"]) == 0


@pytest.mark.slow
def test_smollm2_sft_lowers_the_loss(tmp_path):
    """The real bundled SmolLM2-135M: a few SFT steps on the shipped chat set lower the loss."""
    from oxrl.config.load import load_config
    from oxrl.runner import run

    cfg = load_config("examples/sft_smollm2_chat.yaml", [
        f"run.output_dir={tmp_path}", "train.max_steps=6", "train.global_batch_size=4", "train.micro_batch_size_per_device=4",
        "train.eval_every=6", "checkpoint.every=null", "checkpoint.keep_last=2", "logging.samples=[]", "train.optim.warmup_steps=0",
        "train.optim.lr=1e-4", "data.max_length=128",
    ])
    result = run(cfg)
    assert sum(result.losses[-2:]) / 2 < 0.8 * sum(result.losses[:2]) / 2, result.losses
