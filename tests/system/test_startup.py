"""Start-up stays light and quiet: no optional backend imported unless the config uses it, no torch for
`oxrl --help`, no transformers progress bar on oxRL's own saves, no key table when PPO's critic loads.

The runs go through a fresh interpreter (`python -c`), so that `sys.modules` shows what that one run imported.
One import is not oxRL's and is not checked here: where DeepSpeed is installed (the `deepspeed` and `dev`
extras), transformers' `save_pretrained` imports it through accelerate (`unwrap_model` ->
`extract_model_from_parallel`, which imports `deepspeed` whenever it is installed, to recognise a
DeepSpeed engine), and DeepSpeed imports MLflow in turn; neither library offers a switch to skip that.
So the backend check below trains without saving, and the save check looks at the progress bars only.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import make_tiny_llama, save_tiny_model, write_chat_rows

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = ("deepspeed", "vllm", "mlflow", "ray")
RUN_AND_REPORT = """
import json, sys
from oxrl.config.load import load_config
from oxrl.logging.setup import setup_logging
from oxrl.runner import run

setup_logging()
run(load_config(sys.argv[1], sys.argv[2:]))
print("IMPORTED " + json.dumps(sorted(m for m in {optional!r} if m in sys.modules)))
"""


@pytest.fixture
def tiny_config(tmp_path, smollm2_tokenizer) -> Path:
    """A one-step SFT config on a tiny random Llama (the real SmolLM2 tokenizer) saved in tmp_path."""
    save_tiny_model(tmp_path / "tiny-model", smollm2_tokenizer)
    write_chat_rows(tmp_path / "chat.jsonl", 8)
    config = {
        "run": {"name": "tiny", "output_dir": str(tmp_path / "runs")},
        "model": {"name_or_path": str(tmp_path / "tiny-model")},
        "data": {"train": [{"path": str(tmp_path / "chat.jsonl")}], "max_length": 64},
        "algorithm": {"name": "sft"},
        "train": {"global_batch_size": 4, "micro_batch_size_per_device": 2, "max_steps": 1},
        "logging": {"progress_bar": False},
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run_fresh(code: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result


def imported(result: subprocess.CompletedProcess) -> list[str]:
    line = next(line for line in result.stdout.splitlines() if line.startswith("IMPORTED "))
    return json.loads(line.removeprefix("IMPORTED "))


def test_a_plain_run_imports_no_optional_backend(tiny_config, tmp_path):
    """Single process, no LoRA, HF engine, no tracker: DeepSpeed, vLLM, MLflow and Ray stay unimported
    (the libraries that are installed here included). Nothing is saved: see the module docstring."""
    result = run_fresh(RUN_AND_REPORT.format(optional=OPTIONAL), str(tiny_config), "checkpoint.save_final=false")
    assert imported(result) == []
    assert (tmp_path / "runs" / "tiny" / "metrics.jsonl").is_file()


def test_saving_draws_no_progress_bar(tiny_config, tmp_path):
    """A checkpoint and the final model are written without transformers' "Writing model shards" bars."""
    result = run_fresh(RUN_AND_REPORT.format(optional=OPTIONAL), str(tiny_config), "checkpoint.every=1")
    run_dir = tmp_path / "runs" / "tiny"
    assert (run_dir / "final" / "model.safetensors").is_file()
    assert (run_dir / "checkpoints" / "step_000001" / "model.safetensors").is_file()
    output = result.stdout + result.stderr
    assert "Writing model shards" not in output
    assert not {"vllm", "ray"} & set(imported(result))


# What a config must name to load: the core path (one process, the built-in engine, a generated task or offline rows)
# imports none of these (docs/layout.md; docs/extending.md).
EXTENSIONS = (
    "oxrl.loops.pipeline", "oxrl.loops.online", "oxrl.loops.critic", "oxrl.loops.multiturn", "oxrl.logging.trackers",
    "oxrl.logging.report", "oxrl.logging.plot", "oxrl.data.rl_prompts", "oxrl.models.registry", "oxrl.models.recipe",
    "oxrl.rollout.vllm_engine", "oxrl.cluster", "oxrl.vla", "oxrl.evaluation", "oxrl.onboard", "oxrl.extensions",
    "oxrl.rewards.sandbox", "oxrl.rewards.code_reward", "oxrl.rewards.judge", "oxrl.rewards.reward_model_reward",
    "oxrl.rewards.gym_reward", "oxrl.models.reward_model", "oxrl.models.critic", "oxrl.training.fsdp",
    "oxrl.training.deepspeed_strategy",
)


@pytest.fixture
def grpo_config(tiny_config, tmp_path) -> Path:
    """One GRPO step on the arithmetic task with the `math` reward, the same tiny model."""
    config = yaml.safe_load(tiny_config.read_text())
    del config["data"]
    config["train"] = {"max_steps": 1, "micro_batch_size_per_device": 4}
    config.update(algorithm={"name": "grpo"}, rl={
        "task": "arithmetic", "task_size": 8, "validation_size": 0, "prompts_per_step": 2, "rewards": [{"name": "math"}],
        "rollout": {"n": 4, "max_new_tokens": 8}})
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("algorithm", ["sft", "grpo"])
def test_the_core_path_loads_no_extension(algorithm, tiny_config, grpo_config):
    config = tiny_config if algorithm == "sft" else grpo_config
    result = run_fresh(RUN_AND_REPORT.format(optional=EXTENSIONS), str(config), "run.overwrite=true")
    assert imported(result) == []


def test_an_extension_loads_when_the_config_names_it(grpo_config):
    """The other side, so that the test above can fail: the report, the curves and the schedule of steps
    sampled ahead load when the config turns them on."""
    result = run_fresh(RUN_AND_REPORT.format(optional=EXTENSIONS), str(grpo_config), "logging.plot=true",
                       "rl.max_staleness=1", "rl.off_policy_correction=decoupled")
    assert imported(result) == ["oxrl.logging.plot", "oxrl.logging.report", "oxrl.loops.pipeline"]


def test_help_imports_no_torch():
    result = run_fresh("import sys\nfrom oxrl.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
                       "print('IMPORTED ' + __import__('json').dumps(sorted(m for m in ('torch', 'transformers') "
                       "if m in sys.modules)))")
    assert "train" in result.stdout
    assert imported(result) == []


def test_no_progress_bars_is_scoped_and_restores_the_users_hook():
    from transformers.utils import logging as hf_logging

    from oxrl.logging.quiet import no_progress_bars

    if not hasattr(hf_logging, "set_tqdm_hook"):
        pytest.skip("this transformers has no tqdm hook (and draws no bar on save)")
    seen = []

    def users_hook(factory, args, kwargs):
        seen.append(kwargs.get("disable"))
        return factory(*args, **kwargs)

    previous = hf_logging.set_tqdm_hook(users_hook)
    try:
        with no_progress_bars():
            assert hf_logging.tqdm(range(3), desc="inside").disable
        assert seen == [True]  # passed on through the user's hook, disabled
        assert hf_logging.set_tqdm_hook(users_hook) is users_hook  # the user's hook is back
        assert hf_logging.is_progress_bar_enabled()  # and the global switch never moved
    finally:
        hf_logging.set_tqdm_hook(previous)


@pytest.fixture
def critic_log(caplog):
    """caplog for the `oxrl` logger, which does not propagate to the root once logging is set up."""
    logger = logging.getLogger("oxrl")
    own = not logger.propagate
    if own:
        logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="oxrl")
    yield caplog
    if own:
        logger.removeHandler(caplog.handler)


def test_the_critic_loads_without_a_key_table(tmp_path, capfd, critic_log):
    """A causal LM loaded as PPO's critic: its LM head is unused and the value head new, as expected, so no
    transformers key table; one line says the value head is new, and it starts near V = 0."""
    from oxrl.models.critic import load_critic

    make_tiny_llama().save_pretrained(tmp_path / "policy")
    critic = load_critic(str(tmp_path / "policy"), torch.device("cpu"))
    err = capfd.readouterr().err
    assert "LOAD REPORT" not in err and "UNEXPECTED" not in err and "MISSING" not in err
    lines = [r.getMessage() for r in critic_log.records if r.name == "oxrl.models.critic"]
    assert len(lines) == 1 and "new value head" in lines[0] and "score.weight" in lines[0]
    assert critic.score.weight.abs().max() < 1e-2 and critic.config.num_labels == 1
    assert not logging.getLogger("transformers.modeling_utils").filters  # the filter is gone again


def test_the_critic_still_reports_missing_backbone_weights(tmp_path, capfd, critic_log):
    from oxrl.models.critic import load_critic

    model = make_tiny_llama()
    state = {k: v for k, v in model.state_dict().items() if k != "model.norm.weight"}
    model.save_pretrained(tmp_path / "broken", state_dict=state)
    load_critic(str(tmp_path / "broken"), torch.device("cpu"))
    warnings = [r.getMessage() for r in critic_log.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "model.norm.weight" in warnings[0]


BAD_EVAL_FLAGS = """
import json, sys, time
started = time.monotonic()
from oxrl.cli import main
code = main(sys.argv[1:])
print("RESULT " + json.dumps({"code": code, "seconds": time.monotonic() - started,
                              "torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules}))
"""


@pytest.mark.parametrize("flags", [["--n", "0"], ["--limit", "0"], ["--temperature", "-1"],
                                   ["--task", "arithmetic", "--data", "x.jsonl"]])
def test_bad_eval_flags_fail_before_torch_is_imported(flags):
    result = subprocess.run([sys.executable, "-c", BAD_EVAL_FLAGS, "eval", "smollm2-135m-instruct", *flags],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                            timeout=120)
    out = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert out["code"] == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not out["torch"] and not out["transformers"]
    assert out["seconds"] < 1.5, out  # (the CLI's own imports and the check; the interpreter's start is not counted)
