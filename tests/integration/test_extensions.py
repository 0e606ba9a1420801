"""The extension seam (oxrl/extensions.py) with the four worked extensions of docs/extending.md: each one's
maths by hand, the config accepting exactly the names they register, and a real run using all four from
outside the package (a subprocess, as a user starts it, so this process's registries stay the built-ins)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from oxrl.algorithms.advantages import ADVANTAGES, AdvantageParams, RolloutRewards
from oxrl.algorithms.policy_loss import POLICY_LOSSES, PolicyLossInput, PolicyLossParams
from oxrl.config.load import ConfigError, load_config
from oxrl.config.names import REGISTERED
from oxrl.rewards.combine import REWARDS, build_reward_fn
from oxrl.rollout.build import ENGINES
from tests.conftest import save_tiny_model

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "extensions"


@pytest.fixture
def registries():
    """Every registry an extension adds to, restored afterwards (extensions register for the whole process)."""
    saved = [(registry, dict(registry)) for registry in (ADVANTAGES, POLICY_LOSSES, REWARDS, ENGINES,
                                                          *REGISTERED.values())]
    modules = set(sys.modules)
    yield
    for registry, copy in saved:
        registry.clear()
        registry.update(copy)
    for name in set(sys.modules) - modules:
        if name.startswith("oxrl_user_"):
            del sys.modules[name]


def _config(*extensions: str, **rl) -> object:
    tree = {"extensions": [str(EXAMPLES / name) for name in extensions], "model": {"name_or_path": "m"},
            "algorithm": {"name": "grpo"}, "rl": {"task": "arithmetic", **rl}}
    return load_config(None, base=tree)


def test_a_registered_advantage_is_a_valid_choice_and_computes_the_group_median_baseline(registries):
    with pytest.raises(ConfigError, match="median_baseline.*not a registered advantage"):
        load_config(None, ["model.name_or_path=m", "algorithm.name=grpo", "rl.task=arithmetic",
                           "rl.advantage=median_baseline"])
    cfg = _config("median_baseline.py", advantage="median_baseline")
    assert cfg.rl.advantage == "median_baseline"
    # Group 0 rewards 1, 0, 0, 5: torch's (lower) median is 0; group 1: 2, 2 -> median 2.
    rewards = torch.tensor([1.0, 0.0, 0.0, 5.0, 2.0, 2.0])
    mask = torch.tensor([[1, 1, 0]] * 6)
    token_rewards = torch.zeros(6, 3)
    token_rewards[:, 1] = rewards  # an outcome reward sits on the last sampled token
    inp = RolloutRewards(token_rewards, mask, torch.tensor([0, 0, 0, 0, 1, 1]))
    out = ADVANTAGES["median_baseline"](inp, AdvantageParams())
    expected = torch.tensor([1.0, 0.0, 0.0, 5.0, 0.0, 0.0])[:, None] * mask
    torch.testing.assert_close(out.advantages, expected)


def test_an_advantage_estimator_with_its_own_parameter_reads_it_from_the_config(registries):
    from oxrl.loops.rl_update import advantage_params

    cfg = _config("median_baseline.py", advantage="median_baseline", advantage_params={"clip": 2.0})
    params = advantage_params(cfg)
    assert params.advantage_params == {"clip": 2.0}
    rewards = torch.zeros(6, 3)
    rewards[:, 1] = torch.tensor([1.0, 0.0, 0.0, 5.0, 2.0, 2.0])
    out = ADVANTAGES["median_baseline"](RolloutRewards(rewards, torch.ones(6, 3), torch.tensor([0, 0, 0, 0, 1, 1])),
                                        params)
    # 5 - 0 clipped to 2; the others within the bound
    torch.testing.assert_close(out.advantages[:, 0], torch.tensor([1.0, 0.0, 0.0, 2.0, 0.0, 0.0]))
    with pytest.raises(ConfigError, match=r"rl.advantage_params for `median_baseline`: .*clp.*\(it takes: clip\)"):
        _config("median_baseline.py", advantage="median_baseline", advantage_params={"clp": 2.0})
    with pytest.raises(ConfigError, match="rl.advantage_params for `median_baseline`: clip must be > 0"):
        _config("median_baseline.py", advantage="median_baseline", advantage_params={"clip": -1.0})
    with pytest.raises(ConfigError, match=r"rl.advantage_params = \{'clip': 2.0\} is not read by `grpo` "
                                          r"\(rl.advantage is 'grpo'\)"):
        _config("median_baseline.py", advantage_params={"clip": 2.0})


def test_a_policy_loss_with_its_own_parameter_reads_it_from_the_config(registries):
    cfg = _config("capped_reinforce.py", policy_loss="capped_reinforce", policy_loss_params={"max_weight": 2.0})
    with pytest.raises(ConfigError, match="max_wieght"):
        _config("capped_reinforce.py", policy_loss="capped_reinforce", policy_loss_params={"max_wieght": 2.0})
    with pytest.raises(ConfigError, match="policy_loss_params.*rl.policy_loss is 'ppo'"):
        _config(policy_loss="ppo", policy_loss_params={"max_weight": 2.0})
    # Two tokens, both trained: ratios 0.5 / 0.1 = 5 (capped to 2) and 0.5 / 0.5 = 1; advantages 1 and -1.
    logprobs = torch.log(torch.tensor([[0.5, 0.5]])).requires_grad_()
    inp = PolicyLossInput(logprobs=logprobs, old_logprobs=torch.log(torch.tensor([[0.1, 0.5]])),
                          advantages=torch.tensor([[1.0, -1.0]]), mask=torch.ones(1, 2), normaliser=2.0)
    from oxrl.loops.rl_update import loss_params

    params = loss_params(cfg)
    assert params.policy_loss_params == {"max_weight": 2.0}
    loss, metrics = POLICY_LOSSES["capped_reinforce"](inp, PolicyLossParams(policy_loss_params={"max_weight": 2.0}))
    # token_mean over 2 tokens: (-2 * 1 * log 0.5 + -1 * -1 * log 0.5) / 2 = -log(0.5) / 2
    assert math.isclose(float(loss.detach()), -math.log(0.5) / 2, rel_tol=1e-6)
    assert float(metrics["capped_frac"]) == 0.5
    loss.backward()  # d/dlogp: -w A / 2 -> [-1, 0.5]
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-1.0, 0.5]]))


def test_an_engine_with_its_own_parameter_is_checked_when_the_config_loads(registries):
    cfg = _config("counting_engine.py", rollout={"engine": "counting_hf", "engine_params": {"prefix": "counted"}})
    assert cfg.rl.rollout.engine_params == {"prefix": "counted"}
    with pytest.raises(ConfigError, match=r"rl.rollout.engine_params for `counting_hf`: .*prefx.*\(it takes: prefix\)"):
        _config("counting_engine.py", rollout={"engine": "counting_hf", "engine_params": {"prefx": "counted"}})
    with pytest.raises(ConfigError, match=r"rl.rollout.engine_params = \{'prefix': 'x'\} is not read by `grpo` "
                                          r"\(rl.rollout.engine is 'hf'\)"):
        _config("counting_engine.py", rollout={"engine_params": {"prefix": "x"}})


def test_a_registered_reward_is_named_like_a_built_in(registries):
    _config("brevity_reward.py")
    out = build_reward_fn([{"name": "brevity", "kwargs": {"max_chars": 10}}])(["q", "q"], ["abcde", "x" * 20])
    assert out.components["brevity"] == [0.5, 0.0]


def test_a_taken_name_and_a_missing_extension_are_errors(registries, tmp_path):
    clash = tmp_path / "clash.py"
    clash.write_text("from oxrl.extensions import register_advantage\n\n"
                     "register_advantage('grpo')(lambda inp, params: None)\n")
    with pytest.raises(ConfigError, match="advantage 'grpo' is already registered"):
        load_config(None, base={"extensions": [str(clash)], "model": {"name_or_path": "m"},
                                "algorithm": {"name": "sft"}})
    with pytest.raises(ConfigError, match="extension 'no_such_module_here'"):
        load_config(None, base={"extensions": ["no_such_module_here"], "model": {"name_or_path": "m"},
                                "algorithm": {"name": "sft"}})


@pytest.mark.system  # a subprocess, as a user starts it
def test_a_run_trains_with_all_four_extensions_from_outside_the_package(tmp_path, smollm2_tokenizer):
    model = save_tiny_model(tmp_path / "tiny", smollm2_tokenizer)
    config = {
        "extensions": [f"{EXAMPLES.name}/{name}" for name in
                       ("median_baseline.py", "capped_reinforce.py", "brevity_reward.py", "counting_engine.py")],
        "run": {"name": "ext", "output_dir": str(tmp_path / "runs"), "seed": 3},
        "model": {"name_or_path": str(model)},
        "algorithm": {"name": "grpo"},
        "rl": {"task": "arithmetic", "task_size": 8, "validation_size": 0, "prompts_per_step": 2,
               "advantage": "median_baseline", "advantage_params": {"clip": 1.0}, "policy_loss": "capped_reinforce",
               "policy_loss_params": {"max_weight": 1.5},
               "rewards": [{"name": "brevity", "kwargs": {"max_chars": 40}}],
               "rollout": {"n": 4, "max_new_tokens": 8, "temperature": 1.0, "engine": "counting_hf",
                           "engine_params": {"prefix": "counted"}}},
        "train": {"max_steps": 2, "micro_batch_size_per_device": 4, "optim": {"lr": 1e-3}},
        "checkpoint": {"save_final": False},
        "logging": {"progress_bar": False, "plot": False},
    }
    # The config sits beside the examples folder's copy, so its relative extension paths resolve beside it.
    folder = tmp_path / "project"
    (folder / EXAMPLES.name).mkdir(parents=True)
    for source in EXAMPLES.glob("*.py"):
        (folder / EXAMPLES.name / source.name).write_text(source.read_text())
    (folder / "run.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "oxrl", "train", str(folder / "run.yaml")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "runs" / "ext" / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "reward/brevity" in row]
    assert [row["step"] for row in steps] == [1, 2]
    assert [row["counted/calls"] for row in steps] == [1.0, 2.0]  # the wrapped engine sampled each step
    assert steps[1]["counted/sampled_tokens"] > steps[0]["counted/sampled_tokens"] > 0
    assert all(abs(row["advantage/abs_max"]) <= 1.0 for row in steps)  # median_baseline's own clip
    assert all("capped_frac" in row and math.isfinite(row["loss"]) for row in steps)
