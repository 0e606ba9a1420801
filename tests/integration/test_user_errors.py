"""Errors a user meets at the console: one line and exit code 2, before the model loads where it can be.

A missing optional package the config needs (math-verify for the `math` reward, ...) is found by the preflight
(oxrl/preflight.py); its install command names the package itself, never `oxrl[...]` (the `oxrl` on PyPI is
another project). A reward that raises, a processor that cannot load and a Ray layout the cluster cannot hold are
one line each too.
"""

from __future__ import annotations

import json
import logging
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from oxrl.cli import main
from oxrl.dependencies import EXTRAS, install_hint
from oxrl.preflight import missing_for
from tests.conftest import save_tiny_model

ROOT = Path(__file__).resolve().parents[2]


def explodes(prompt: str, completion: str) -> float:
    raise ValueError("this reward is broken\non purpose")


@pytest.fixture
def tiny_model_dir(tmp_path, smollm2_tokenizer):
    return save_tiny_model(tmp_path / "tiny-model", smollm2_tokenizer)


def _grpo_config(tmp_path: Path, model_dir: Path, **rl) -> Path:
    cfg = {"run": {"name": "grpo", "output_dir": str(tmp_path / "runs")}, "model": {"name_or_path": str(model_dir)},
           "algorithm": {"name": "grpo"},
           "rl": {"task": "arithmetic", "task_size": 8, "validation_size": 0, "prompts_per_step": 2,
                  "rollout": {"n": 2, "max_new_tokens": 4}, **rl},
           "train": {"max_steps": 1, "micro_batch_size_per_device": 4}, "logging": {"progress_bar": False, "plot": False}}
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _errors(log) -> list[str]:
    # (distinct: before `oxrl train` set up its logging, caplog sees a record through two handlers)
    return list(dict.fromkeys(record.getMessage() for record in log.records if record.levelno >= logging.ERROR))


def test_the_install_hints_pin_the_packages_of_pyproject_extras():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {name: tuple(requirements) for name, requirements in extras.items() if name != "dev"} == EXTRAS
    assert install_hint("math-verify") == "pip install 'math-verify>=0.7' (oxRL's `rl` extra)"
    assert install_hint("torchvision") == "pip install 'torchvision'"


def test_a_missing_optional_package_is_one_line_before_the_model_loads(tmp_path, tiny_model_dir, monkeypatch, oxrl_log):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # what an environment without math-verify looks like
    config = _grpo_config(tmp_path, tiny_model_dir)
    assert main(["train", str(config)]) == 2
    [error] = _errors(oxrl_log)
    assert error == ("the `math` reward needs math-verify, which is not installed: pip install 'math-verify>=0.7' "
                     "(oxRL's `rl` extra)")
    assert "oxrl[" not in oxrl_log.text and "loaded" not in oxrl_log.text
    assert not (tmp_path / "runs").exists()  # checked before the run directory is claimed


def test_the_preflight_names_every_package_a_config_lacks(tmp_path, monkeypatch):
    from oxrl.config.load import load_config

    for module in ("reasoning_gym", "deepspeed", "gguf"):
        monkeypatch.setitem(sys.modules, module, None)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"model": {"name_or_path": "m.gguf"}, "algorithm": {"name": "grpo"},
                                    "rl": {"task": "countdown"}, "strategy": {"name": "deepspeed"}}))
    missing = missing_for(load_config(path))
    assert [line.split(" needs ")[1].split(",")[0] for line in missing] == ["deepspeed", "gguf", "reasoning-gym"]
    assert all("pip install '" in line and "oxrl[" not in line for line in missing)


def test_a_vla_config_needs_its_simulators_packages_and_no_reward_package(monkeypatch):
    from oxrl.config.load import load_config

    for module in ("gym_pusht", "panda_gym", "math_verify"):
        monkeypatch.setitem(sys.modules, module, None)
    pusht = load_config(None, ["model.name_or_path=m", "algorithm.name=grpo", "vla.env=pusht"])
    assert missing_for(pusht) == ["vla.env `pusht` needs gym-pusht, which is not installed: pip install "
                                  "'gym-pusht>=0.1.8' (oxRL's `vla` extra)"]
    panda = load_config(None, ["model.name_or_path=m", "algorithm.name=grpo", "vla.env=panda-push"])
    assert missing_for(panda) == ["vla.env `panda-push` needs panda-gym, which is not installed: pip install "
                                  "'panda-gym>=3.0.7' (oxRL's `vla` extra)"]
    assert missing_for(load_config(None, ["model.name_or_path=m", "algorithm.name=grpo", "vla.env=reach"])) == []


def test_a_reward_that_raises_stops_the_run_in_one_line(tmp_path, tiny_model_dir, oxrl_log):
    config = _grpo_config(tmp_path, tiny_model_dir, rewards=[{"name": "tests.integration.test_user_errors:explodes"}])
    assert main(["train", str(config)]) == 2
    [error] = _errors(oxrl_log)
    assert "\n" not in error and error.startswith("reward 'explodes' failed on sample 1 of 4 (arithmetic row ")
    assert "ValueError: this reward is broken on purpose; prompt " in error and "completion " in error
    assert "Traceback" in (tmp_path / "runs" / "grpo" / "failure.txt").read_text()  # the whole story, for a report


def test_a_reward_missing_a_package_stops_even_with_on_error_zero(tmp_path):
    from oxrl.rewards import RewardError, RewardSpec, build_reward_fn

    (tmp_path / "needs_package.py").write_text(
        "def score(prompt, completion):\n    import a_package_nobody_installed\n    return 1.0\n")
    reward_fn = build_reward_fn([RewardSpec(f"{tmp_path / 'needs_package.py'}:score", on_error="zero")])
    with pytest.raises(RewardError, match=r"ModuleNotFoundError.*\(install the missing package\)$"):
        reward_fn(["p"], ["c"])


def test_a_processor_that_cannot_load_is_one_line(tmp_path, smollm2_tokenizer, oxrl_log):
    from oxrl.dependencies import installed
    from tests.vlm_fixtures import save_tiny_qwen2_vl

    if installed("torchvision"):
        pytest.skip("torchvision is installed: Qwen2-VL's whole processor loads")
    model = save_tiny_qwen2_vl(tmp_path / "qwen2-vl", smollm2_tokenizer)
    settings = json.loads((model / "processor_config.json").read_text())
    settings["processor_class"] = "Qwen2VLProcessor"  # as a hub checkpoint names it: with a video processor
    (model / "processor_config.json").write_text(json.dumps(settings))
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}] * 4
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = tmp_path / "sft.yaml"
    config.write_text(yaml.safe_dump({
        "run": {"name": "vlm", "output_dir": str(tmp_path / "runs")}, "model": {"name_or_path": str(model)},
        "data": {"train": [{"path": str(tmp_path / "chat.jsonl")}]}, "algorithm": {"name": "sft"},
        "train": {"max_steps": 1, "global_batch_size": 2, "micro_batch_size_per_device": 2}}))
    assert main(["train", str(config)]) == 2
    [error] = _errors(oxrl_log)
    assert "\n" not in error and error.startswith(f"{model}: its processor cannot be loaded: OSError: ")
    assert "need torchvision" in error


def test_a_ray_layout_the_cluster_cannot_hold_is_one_line(tmp_path, tiny_model_dir, oxrl_log):
    ray = pytest.importorskip("ray")
    config = _grpo_config(tmp_path, tiny_model_dir)
    try:
        code = main(["train", str(config), "run.launcher=ray", "ray.trainers.gpus=1"])
    finally:
        ray.shutdown()
    assert code == 2
    [error] = _errors(oxrl_log)
    assert error.startswith("worker group `trainers`: a worker needs 1 GPU on one node, and the largest node")
