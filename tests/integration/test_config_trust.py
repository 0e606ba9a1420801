"""A config the user did not name is data: a run directory's saved config.yaml that names code (an extension, a
reward or environment file, a `module:factory`, trust_remote_code, ...) is refused by `oxrl eval` before anything
is imported, naming the setting and --trust-config-code; a config named on the command line, `--set` and the flags
are the user's. Every setting the schema marks (`NamesCode`) is tried, and a scan of the package checks that every
place that imports or runs code by a config's word is fed by a marked setting.

Each hostile file writes a witness file when it is imported: the witness must not exist after a refusal, and does
after the opt-in (so the test can tell).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from oxrl.cli import main
from oxrl.config.load import ConfigError, load_config, saved_form
from oxrl.config.names import REGISTERED, REWARD_NAMES
from oxrl.config.trust import TRUST_FLAG, as_data, code_fields
from oxrl.evaluation.run import EvalRequest, evaluate_models
from tests.conftest import save_tiny_model

PACKAGE = Path(__file__).resolve().parents[2] / "oxrl"
FAST = ["--task", "arithmetic", "--limit", "1", "--max-new-tokens", "2"]
SAVED = {"model": {"name_or_path": "tiny"}, "algorithm": {"name": "grpo"}, "rl": {"task": "arithmetic"}}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, smollm2_tokenizer) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("models") / "tiny", smollm2_tokenizer)


@pytest.fixture
def witness(tmp_path) -> Path:
    return tmp_path / "witness"


@pytest.fixture
def evil(tmp_path, witness) -> Path:
    """A Python file that, imported, writes the witness; a reward, an environment step and a factory of its own."""
    path = tmp_path / "evil.py"
    path.write_text(f"from pathlib import Path\nPath({str(witness)!r}).write_text('imported')\n\n"
                    "def reward(prompt, completion, **fields):\n    return 0.0\n\n"
                    "async def step(state, action, extra_info):\n    return state, 0.0, 0.0, True, extra_info\n")
    return path


def shared_run(tmp_path: Path, tiny_model: Path, config: dict) -> Path:
    """A run directory as someone shares it: its final model and the saved config.yaml they wrote."""
    run = tmp_path / "shared-run"
    run.mkdir(parents=True)
    (run / "final").symlink_to(tiny_model, target_is_directory=True)
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    return run


def merged(*trees: dict) -> dict:
    out: dict = {}
    for tree in trees:
        for key, value in tree.items():
            out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


# Per marked setting: a saved config naming code there (evil: the hostile file, witness: what it writes).
HOSTILE = {
    "extensions": lambda evil, witness: {"extensions": [str(evil)]},
    "model.trust_remote_code": lambda evil, witness: {"model": {"trust_remote_code": True}},
    "rl.rewards[].name": lambda evil, witness: {"rl": {"rewards": [{"name": "math"}, {"name": f"{evil}:reward"}]}},
    "rl.rewards[].kwargs": lambda evil, witness: {"rl": {"rewards": [{"name": "reward_model", "kwargs": {
        "path": "owner/reward-model", "trust_remote_code": "yes"}}]}},
    "rl.env.path": lambda evil, witness: {"rl": {"task": None, "env": {"path": f"{evil}:step"}}},
    "strategy.deepspeed_config": lambda evil, witness: {"strategy": {"deepspeed_config": str(_deepspeed_json(evil))}},
    "vla.env": lambda evil, witness: {"vla": {"env": "os:system", "env_kwargs": {"command": f"touch {witness}"}}},
}
SETTINGS = {  # the dotted key the refusal names, for HOSTILE's values
    "rl.rewards[].name": "rl.rewards[1].name", "rl.rewards[].kwargs": "rl.rewards[0].kwargs",
}


def _deepspeed_json(evil: Path) -> Path:
    """DeepSpeed imports the modules `torch_autocast.lower_precision_safe_modules` names."""
    path = evil.with_name("ds.json")
    path.write_text(json.dumps({"torch_autocast": {"enabled": True, "lower_precision_safe_modules": ["evil.Thing"]}}))
    return path


def test_the_marked_settings_are_the_ones_that_name_code():
    marked = set(code_fields())
    assert marked == set(HOSTILE), "give each marked setting a hostile value in HOSTILE"
    assert {"extensions", "rl.rewards[].name", "rl.env.path", "vla.env", "model.trust_remote_code"} <= marked


@pytest.mark.parametrize("field", sorted(HOSTILE))
def test_every_marked_setting_of_a_saved_config_is_refused_before_anything_is_imported(
        tmp_path, tiny_model, evil, witness, field):
    run = shared_run(tmp_path, tiny_model, merged(SAVED, HOSTILE[field](evil, witness)))
    with pytest.raises(ConfigError) as refused:
        evaluate_models(EvalRequest(str(run), limit=1, max_new_tokens=2))
    message = str(refused.value)
    assert len(message.splitlines()) == 1, message
    assert message.startswith(f"{run / 'config.yaml'} is data") and f"{SETTINGS.get(field, field)} = " in message
    assert TRUST_FLAG in message and "trust_config_code=True" in message
    assert not witness.exists()
    assert str(evil.resolve()) not in {getattr(module, "__file__", None) for module in list(sys.modules.values())}


def test_built_in_names_name_no_code(tmp_path, tiny_model):
    """Built-in rewards and simulators, and trust_remote_code off (in any spelling validation reads), load."""
    saved = merged(SAVED, {"model": {"trust_remote_code": "no"}, "rl": {"rewards": [{"name": n} for n in REWARD_NAMES]}})
    assert load_config(shared_run(tmp_path, tiny_model, saved) / "config.yaml", screen=as_data({})).rl.rewards
    for env in ("reach", "pusht"):
        saved = merged(SAVED, {"rl": {"task": None}, "vla": {"env": env}})
        cfg = load_config(shared_run(tmp_path / env, tiny_model, saved) / "config.yaml", screen=as_data({}))
        assert cfg.vla.env == env


def test_the_built_in_reward_names_are_the_reward_registry_s():
    from oxrl.rewards.combine import REWARDS

    assert set(REWARDS) - set(REGISTERED["reward"]) == set(REWARD_NAMES)


# --- the attacks, through `oxrl eval RUN_DIR` ---------------------------------------------------------------------

def test_os_system_as_a_simulator_factory_runs_nothing(tmp_path, tiny_model, witness, oxrl_log):
    run = shared_run(tmp_path, tiny_model, merged(SAVED, {"rl": {"task": None}, "vla": {
        "env": "os:system", "env_kwargs": {"command": f"touch {witness}"}}}))
    assert main(["eval", str(run)]) == 2
    assert 'vla.env = "os:system"' in oxrl_log.text and TRUST_FLAG in oxrl_log.text
    assert not witness.exists()
    assert main(["eval", str(run), TRUST_FLAG]) == 2  # it ran: os.system returned an int, not an environment
    assert witness.exists() and "made a int, not a gymnasium environment" in oxrl_log.text


def test_an_extension_file_beside_the_config_is_not_imported(tmp_path, tiny_model, evil, witness, oxrl_log):
    run = shared_run(tmp_path, tiny_model, merged(SAVED, {"extensions": ["evil.py"]}))
    evil.rename(run / "evil.py")  # beside the config, named relative to it
    assert main(["eval", str(run), *FAST]) == 2
    assert f'extensions = ["{run / "evil.py"}"]' in oxrl_log.text and TRUST_FLAG in oxrl_log.text
    assert not witness.exists()
    assert main(["eval", str(run), *FAST, "--set", "extensions=[]"]) == 0 and not witness.exists()  # set by the user
    assert main(["eval", str(run), *FAST, TRUST_FLAG]) == 0 and witness.exists()


def test_a_reward_file_is_not_imported_and_a_reward_the_user_names_replaces_it(
        tmp_path, tiny_model, evil, witness, oxrl_log):
    run = shared_run(tmp_path, tiny_model, merged(SAVED, {"rl": {"rewards": [{"name": f"{evil}:reward"}]}}))
    assert main(["eval", str(run), *FAST]) == 2
    assert f'rl.rewards[0].name = "{evil}:reward"' in oxrl_log.text and not witness.exists()
    assert main(["eval", str(run), *FAST, "--reward", "math"]) == 0 and not witness.exists()
    assert evaluate_models(EvalRequest(str(run), task="arithmetic", limit=1, max_new_tokens=2,
                                       trust_config_code=True)).reports
    assert witness.exists()


def test_a_gymnasium_id_naming_a_module_is_not_imported(tmp_path, tiny_model, witness, monkeypatch, oxrl_log):
    """gymnasium imports the module part of an entry-point id (`module:Env-v0`) when it makes the environment."""
    (tmp_path / "evilmod.py").write_text(f"from pathlib import Path\nPath({str(witness)!r}).write_text('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    run = shared_run(tmp_path, tiny_model, merged(SAVED, {"rl": {"task": None}, "vla": {
        "env": "gymnasium:make", "env_kwargs": {"id": "evilmod:Env-v0"}}}))
    assert main(["eval", str(run)]) == 2
    assert 'vla.env = "gymnasium:make"' in oxrl_log.text and TRUST_FLAG in oxrl_log.text
    assert not witness.exists() and "evilmod" not in sys.modules


# --- what is the user's -------------------------------------------------------------------------------------------

def test_a_config_named_on_the_command_line_is_the_users(tmp_path, tiny_model, evil, witness):
    config = tmp_path / "mine.yaml"
    config.write_text(yaml.safe_dump(merged(SAVED, {"extensions": [str(evil)]})))
    assert main(["eval", str(tiny_model), "--config", str(config), *FAST]) == 0
    assert witness.exists()


def test_a_resume_compares_the_saved_config_and_runs_only_the_users(tmp_path, evil, witness, oxrl_log):
    """`oxrl train` with run.resume runs the config the user named: the run's saved config.yaml, naming an
    extension, is only compared with it (the difference stops the resume), never imported."""
    run = tmp_path / "runs" / "tiny"
    state = run / "checkpoints" / "step_000001" / "training_state"
    state.mkdir(parents=True)
    (state / "trainer_state.json").write_text(json.dumps({"step": 1}))
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]}))
    mine = {"run": {"name": "tiny", "output_dir": str(tmp_path / "runs")}, "model": {"name_or_path": "m"},
            "algorithm": {"name": "sft"}, "data": {"train": [{"path": str(data)}]}}
    config = tmp_path / "mine.yaml"
    config.write_text(yaml.safe_dump(mine))
    (run / "config.yaml").write_text(yaml.safe_dump({**saved_form(load_config(config)), "extensions": [str(evil)]}))
    assert main(["train", str(config), "run.resume=true"]) == 2
    assert re.search(r"extensions: \[.*evil\.py.*\] -> \[\]", oxrl_log.text), oxrl_log.text
    assert not witness.exists()


# --- every importer is fed by a marked setting ----------------------------------------------------------------------

# A call that imports or runs code by name, file or repository (transformers' trust_remote_code included).
RUNS_CODE = re.compile(r"\b(load_function|load_extensions|import_module|import_file|spec_from_file_location|__import__|"
                       r"run_path|run_module|gym\.make|deepspeed\.initialize|pickle\.loads?|torch\.load|marshal\.loads)"
                       r"\(|(?<![\w.])(exec|eval)\(|\btrust_remote_code=")
# Each file holding such a call: the marked settings whose values reach it, or why no config value does.
FED_BY: dict[str, list[str] | str] = {
    "oxrl/user_code.py": "the importer the files below call",
    "oxrl/config/schema.py": ["extensions"],
    "oxrl/rewards/base.py": ["rl.rewards[].name"],
    "oxrl/loops/multiturn.py": ["rl.env.path"],
    "oxrl/vla/envs.py": ["vla.env"],  # and gym.make of the built-in `pusht`'s fixed id
    "oxrl/models/load.py": ["model.trust_remote_code"],
    "oxrl/models/processor.py": ["model.trust_remote_code"],
    "oxrl/models/fit.py": ["model.trust_remote_code"],
    "oxrl/models/shape.py": ["model.trust_remote_code"],
    "oxrl/models/critic.py": ["model.trust_remote_code"],
    "oxrl/models/reward_model.py": ["model.trust_remote_code"],
    "oxrl/rewards/reward_model_reward.py": ["rl.rewards[].kwargs"],
    "oxrl/training/deepspeed_strategy.py": ["strategy.deepspeed_config"],
    "oxrl/training/checkpoint_files.py": "torch.load(weights_only=True): tensors and plain values, no code",
    "oxrl/rewards/harness_check.py": "model-written programs and tests, run inside the bubblewrap sandbox",
    "oxrl/rewards/harness_run.py": "model-written programs and tests, run inside the bubblewrap sandbox",
    "oxrl/rewards/sandbox_child.py": "model-written programs, run inside the bubblewrap sandbox",
    "oxrl/onboard.py": "`oxrl onboard --trust-remote-code`, a flag the user gives",
    "oxrl/cli.py": "`oxrl onboard --trust-remote-code`, a flag the user gives",
}


def test_every_call_that_runs_code_is_fed_by_a_marked_setting_or_none():
    calls = {str(path.relative_to(PACKAGE.parent)) for path in PACKAGE.rglob("*.py") if RUNS_CODE.search(path.read_text())}
    assert len(calls) > 10 and "oxrl/rewards/base.py" in calls  # the scan really read the package
    assert calls == set(FED_BY), (f"new: {sorted(calls - set(FED_BY))} (mark the settings that reach them with "
                                  f"NamesCode and list them here); gone: {sorted(set(FED_BY) - calls)}")
    fed = {key for settings in FED_BY.values() if isinstance(settings, list) for key in settings}
    assert fed == set(code_fields())
