"""A non-finite step never reaches the weights, repeated ones stop the run with an error naming the
step, and weights holding inf/NaN are never saved."""

from __future__ import annotations

import itertools
import json
import logging
import math

import pytest
import torch
from safetensors.torch import load_file

from oxrl.algorithms.output import LossOutput
from oxrl.config.schema import OptimConfig, StrategyConfig, TrainConfig
from oxrl.training.distributed import DistEnv
from oxrl.training.nonfinite import NonFiniteError
from oxrl.training.optim import build_optimizer, build_scheduler
from oxrl.training.strategy import SingleDevice
from oxrl.loops.sl import Objective
from oxrl.loops.objectives import get_objective
from oxrl.loops.sl import train_offline
from oxrl.rollout.base import SamplingParams
from oxrl.rollout.hf import HFEngine
from tests.conftest import make_tiny_llama
from tests.integration.test_rollout_hf import TinyTokenizer
from tests.integration.test_tiny_training import copy_task, tiny_config

NAN = float("nan")


def prepared(max_nonfinite_steps: int = 3):
    model = make_tiny_llama()
    strategy = SingleDevice(torch.device("cpu"), "no", max_grad_norm=1.0, max_nonfinite_steps=max_nonfinite_steps)
    optim = OptimConfig(lr=1e-2, schedule="linear", weight_decay=0.1)
    optimizer = build_optimizer(model, optim)
    strategy.prepare(model, optimizer, build_scheduler(optimizer, 10, optim))
    return model, strategy


def backward(model, strategy, scale: float = 1.0) -> float:
    ids = torch.tensor([[1, 5, 9, 12, 30]])
    loss = model(input_ids=ids, labels=ids).loss * scale
    strategy.backward(loss)
    return float(loss.detach())


def snapshot(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def unchanged(model, before) -> bool:
    return all(torch.equal(p, before[name]) for name, p in model.named_parameters())


def test_a_nan_step_leaves_weights_and_optimizer_untouched_is_counted_and_training_goes_on(caplog):
    model, strategy = prepared()
    before = snapshot(model)
    with caplog.at_level(logging.WARNING):
        norm = strategy.step(loss=backward(model, strategy, scale=NAN), step=7)
    assert math.isnan(norm)
    assert unchanged(model, before)  # weight decay included: the optimizer did not run
    assert not strategy.optimizer.state  # AdamW's moments never saw the NaN gradients
    assert all(p.grad is None for p in model.parameters())  # dropped, not carried into the next step
    assert strategy.scheduler.last_epoch == 1  # the schedule position stays tied to the step count
    assert (strategy.nonfinite.skipped, strategy.nonfinite.consecutive) == (1, 1)
    assert "step 7" in caplog.text and "skipped" in caplog.text

    strategy.step(loss=backward(model, strategy), step=8)
    assert not unchanged(model, before)
    assert (strategy.nonfinite.skipped, strategy.nonfinite.consecutive) == (1, 0)


def test_a_nan_loss_with_finite_gradients_is_skipped_too():
    model, strategy = prepared()
    before = snapshot(model)
    backward(model, strategy)  # finite gradients
    assert math.isfinite(strategy.step(loss=NAN, step=1))
    assert unchanged(model, before) and strategy.nonfinite.skipped == 1


def test_consecutive_nonfinite_steps_stop_with_the_step_loss_and_norm_named():
    model, strategy = prepared(max_nonfinite_steps=2)
    strategy.step(loss=backward(model, strategy, scale=NAN), step=1)
    strategy.step(loss=backward(model, strategy), step=2)  # a good step resets the streak
    strategy.step(loss=backward(model, strategy, scale=NAN), step=3)
    with pytest.raises(NonFiniteError, match=r"step 4: non-finite loss nan, grad norm nan.*train\.optim\.lr"):
        strategy.step(loss=backward(model, strategy, scale=NAN), step=4)
    assert strategy.nonfinite.skipped == 3


def nan_on_step(objective: Objective, bad_step: int, calls_per_step: int) -> Objective:
    """`objective`, except that every micro-batch of optimizer step `bad_step` (1-based) has a NaN loss."""
    calls = itertools.count()

    def compute(model, batch, normaliser, reference=None) -> LossOutput:
        out = objective.compute(model, batch, normaliser, reference)
        if next(calls) // calls_per_step == bad_step - 1:
            return LossOutput(out.loss * NAN, {**out.metrics, "loss": out.metrics["loss"] * NAN})
        return out

    return Objective(objective.name, objective.count_units, compute)


def test_training_skips_one_nan_step_logs_it_and_goes_on(tmp_path):
    cfg = tiny_config(tmp_path, max_steps=4)  # 4 examples per step in micro-batches of 2: 2 calls per step
    cfg.checkpoint.every, cfg.checkpoint.keep_last = 1, 5
    run = tmp_path / "run"
    result = train_offline(cfg, nan_on_step(get_objective("sft"), 2, 2), make_tiny_llama(), None, copy_task(), [],
                           SingleDevice(torch.device("cpu"), "no", max_grad_norm=1.0), run)
    assert result.steps == 4 and math.isnan(result.losses[1]) and all(map(math.isfinite, result.losses[2:]))

    def weights(step: int) -> dict[str, torch.Tensor]:
        return load_file(run / "checkpoints" / f"step_{step:06d}" / "model.safetensors")

    first, second, third = weights(1), weights(2), weights(3)
    assert all(torch.equal(first[k], second[k]) for k in first)  # step 2 changed nothing
    assert any(not torch.equal(second[k], third[k]) for k in second)  # step 3 trained again
    rows = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    assert [rows[s]["train/nonfinite_steps"] for s in (1, 2, 3, 4)] == [0, 1, 1, 1]
    assert math.isnan(rows[2]["grad_norm"])
    state = json.loads((run / "checkpoints" / "step_000002" / "training_state" / "trainer_state.json").read_text())
    assert state["nonfinite_steps"] == 1  # a resumed run keeps counting from there


def test_weights_holding_inf_are_never_saved(tmp_path):
    model, strategy = prepared()
    strategy.save_checkpoint(tmp_path, 1, None, {}, keep_last=5)
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[0, 0] = float("inf")
    with pytest.raises(NonFiniteError, match=r"checkpoint step 2: 1 trainable parameter.*layers\.1\.mlp\.up_proj"):
        strategy.save_checkpoint(tmp_path, 2, None, {}, keep_last=5)
    with pytest.raises(NonFiniteError, match="final"):
        strategy.save_hf_folder(None, tmp_path / "final")
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000001"]  # no partial folder either
    assert not (tmp_path / "final").exists()


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_generating_from_diverged_weights_raises_a_clear_error(temperature):
    """Sampling would fail inside `generate` (torch.multinomial on NaN probabilities), greedy decoding
    would silently return junk: both raise NonFiniteError."""
    model = make_tiny_llama()
    with torch.no_grad():
        model.lm_head.weight.fill_(3e38)  # finite weights whose logits overflow to inf
    engine = HFEngine(model, TinyTokenizer())
    with pytest.raises(NonFiniteError, match="logits hold inf/NaN"):
        engine.generate([[1, 5, 9]], SamplingParams(n=2, temperature=temperature, max_new_tokens=3))


def test_the_critic_skips_a_nonfinite_update():
    from oxrl.loops.critic import Critic
    from oxrl.rollout.base import Completion
    from tests.conftest import make_tiny_critic

    model = make_tiny_critic()
    before = snapshot(model)
    strategy = SingleDevice(torch.device("cpu"), "no", max_grad_norm=1.0).companion("critic", max_grad_norm=1.0)
    strategy.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    critic = Critic(model, strategy, micro_batch_size=1, value_clip=0.2)
    completions = [Completion(0, [1, 3], [5, 6, 2], [-1.0, -1.0, -1.0], "eos", "5 6")]
    metrics = critic.update(completions, [torch.zeros(3)], [torch.full((3,), NAN)], step=5)
    assert math.isnan(metrics["critic/loss"])
    assert unchanged(model, before) and strategy.nonfinite.skipped == 1


class FakeDeepSpeedEngine:
    """What DeepSpeedStrategy.step reads from a DeepSpeed engine after its step."""

    def __init__(self, applied: bool, grad_norm: float | None):
        self.applied, self.grad_norm, self.steps = applied, grad_norm, 0

    def step(self) -> None:
        self.steps += 1

    def get_global_grad_norm(self) -> float | None:
        return self.grad_norm

    def was_step_applied(self) -> bool:
        return self.applied


def test_deepspeed_counts_the_steps_it_skipped_and_stops_when_it_applied_a_nan_loss():
    from oxrl.training.deepspeed_strategy import DeepSpeedStrategy

    strategy = DeepSpeedStrategy(DistEnv(0, 0, 1, torch.device("cpu")), StrategyConfig(name="deepspeed"),
                                 TrainConfig(max_nonfinite_steps=2))
    assert strategy.config["bf16"]["check_grad_overflow"] is True  # ZeRO skips non-finite norms in bf16 too
    strategy.ds_engine = FakeDeepSpeedEngine(applied=True, grad_norm=0.5)
    assert strategy.step(loss=1.0, step=1) == 0.5 and strategy.nonfinite.skipped == 0
    strategy.ds_engine = FakeDeepSpeedEngine(applied=False, grad_norm=math.inf)  # ZeRO's overflow skip
    strategy.step(loss=NAN, step=2)
    assert (strategy.nonfinite.skipped, strategy.nonfinite.consecutive) == (1, 1)
    strategy.ds_engine = FakeDeepSpeedEngine(applied=True, grad_norm=0.5)  # a NaN loss whose update went through
    with pytest.raises(NonFiniteError, match="step 3.*DeepSpeed applied the update"):
        strategy.step(loss=NAN, step=3)


# ----------------------------------------------------------------------------- whole runs with lr = 1e10


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, smollm2_tokenizer):
    model = make_tiny_llama(vocab_size=len(smollm2_tokenizer))
    model.config.eos_token_id = smollm2_tokenizer.eos_token_id
    path = tmp_path_factory.mktemp("tiny-model")
    model.save_pretrained(path)
    smollm2_tokenizer.save_pretrained(path)
    return path


REWARD_FILE = '''
def varied(prompt, completion):
    return float(len(completion) % 3)  # rewards that differ inside a group, so GRPO's update is not zero
'''


def diverging_run(tmp_path, model_dir, algorithm: str) -> tuple[dict, object]:
    """A config that trains `algorithm` with lr = 1e10 and a checkpoint after every step."""
    cfg = {
        "run": {"name": algorithm, "output_dir": str(tmp_path / "runs")},
        "model": {"name_or_path": str(model_dir)},
        "algorithm": {"name": algorithm},
        "train": {"micro_batch_size_per_device": 2, "max_steps": 6,
                  "optim": {"lr": 1e10, "schedule": "constant"}},
        "checkpoint": {"every": 1, "keep_last": 2},
        "logging": {"progress_bar": False, "plot": False},
    }
    if algorithm == "grpo":
        (tmp_path / "reward.py").write_text(REWARD_FILE)
        cfg["rl"] = {"task": "arithmetic", "task_size": 8, "validation_size": 0, "prompts_per_step": 2,
                     "rollout": {"n": 4, "max_new_tokens": 6}, "rewards": [{"name": f"{tmp_path / 'reward.py'}:varied"}]}
    else:
        cfg["train"]["global_batch_size"] = 2
        if algorithm == "dpo":
            rows = [{"prompt": f"What is {i}+{i}?", "chosen": f"It is {2 * i}.", "rejected": f"It is {2 * i + 1}."}
                    for i in range(12)]
        else:
            rows = [{"messages": [{"role": "user", "content": f"What is {i}+{i}?"},
                                  {"role": "assistant", "content": f"The answer is {2 * i}."}]} for i in range(12)]
        data = tmp_path / "data.jsonl"
        data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        cfg["data"] = {"train": [{"path": str(data)}], "max_length": 64}
    return cfg


@pytest.mark.parametrize(("algorithm", "failing_step"), [("sft", 4), ("dpo", 4), ("grpo", 2)])
def test_a_diverging_run_stops_with_an_error_naming_the_step_and_saves_nothing_broken(
        tmp_path, tiny_model_dir, oxrl_log, algorithm, failing_step):
    """SFT/DPO: step 1 makes the weights huge, steps 2-4 are non-finite and skipped, the third stops the
    run. GRPO: sampling from the diverged weights at step 2 stops it. `oxrl train` exits 2 with the message."""
    import yaml
    from transformers import AutoModelForCausalLM

    from oxrl.cli import main

    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump(diverging_run(tmp_path, tiny_model_dir, algorithm)))
    assert main(["train", str(config)]) == 2
    (error,) = {r.getMessage() for r in oxrl_log.records if r.levelno == logging.ERROR}
    assert error.startswith(f"step {failing_step}: ") and "train.optim.lr" in error
    if algorithm == "grpo":
        assert "logits hold inf/NaN" in error  # not torch.multinomial's own error from deep inside `generate`
    run = tmp_path / "runs" / algorithm
    assert not (run / "final").exists()
    last = sorted((run / "checkpoints").glob("step_*"))[-1]
    assert last.name == f"step_{failing_step - 1:06d}"
    loaded = AutoModelForCausalLM.from_pretrained(last)
    assert all(bool(torch.isfinite(p).all()) for p in loaded.parameters())
