"""A config the user did not name is data: a run directory's saved config.yaml that names code (an extension, a
reward or environment file, a `module:factory`, trust_remote_code, ...) or a host to send to (a judge's `url`, with
the user's API key; an MLflow server; a Ray cluster) is refused by `oxrl eval` before anything is imported or sent,
naming the setting and --trust-config-code; a config named on the command line, `--set` and the flags are the
user's. Every setting the schema marks (`NamesCode`, `SendsOut`) is tried, and a scan of the package checks that
every place that imports or runs code by a config's word is fed by a marked setting.

Each hostile file writes a witness file when it is imported, and each host is a server thread on 127.0.0.1 that
records what it is sent: neither may see anything after a refusal, and both do after the opt-in (so the test can
tell).
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
from oxrl.config.schema import NamesCode, SendsOut
from oxrl.config.trust import TRUST_FLAG, as_data, trust_fields
from oxrl.evaluation.run import EvalRequest, evaluate_models
from oxrl.rewards.judge import judge_for
from tests.conftest import save_tiny_model
from tests.integration.test_judge_hostile import Server, chat, reply

PACKAGE = Path(__file__).resolve().parents[2] / "oxrl"
FAST = ["--task", "arithmetic", "--limit", "1", "--max-new-tokens", "2"]
SAVED = {"model": {"name_or_path": "tiny"}, "algorithm": {"name": "grpo"}, "rl": {"task": "arithmetic"}}
KEY_ENV, KEY = "OXRL_TEST_JUDGE_KEY", "sk-evaluators-own-4b7e9c1d"  # the evaluating user's key, in their environment


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


@pytest.fixture
def host(monkeypatch) -> Server:
    """A server on 127.0.0.1 standing for whoever wrote a shared config, answering as a judge; the user's key is set."""
    monkeypatch.setenv(KEY_ENV, KEY)
    judge_for.cache_clear()  # a judge is kept per settings for the process: this test's must be built here
    server = Server(lambda handler, body: reply(handler, 200, chat("Fine.\nScore: 10")))
    yield server
    server.close()
    judge_for.cache_clear()


def judge_at(host: Server) -> dict:
    return {"rl": {"rewards": [{"name": "judge", "kwargs": {"url": host.url, "model_name": "judge", "api_key_env": KEY_ENV}}]}}


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


# Per setting marked NamesCode: a saved config naming code there (evil: the hostile file, witness: what it writes).
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
# Per setting marked SendsOut: a saved config naming `host` there (a judge with the user's key, trackers, Ray).
SENDING = {
    "rl.rewards[].kwargs": judge_at,
    "logging.mlflow_tracking_uri": lambda host: {"logging": {"report_to": ["mlflow"], "mlflow_tracking_uri": host.origin}},
    "ray.address": lambda host: {"run": {"launcher": "ray"}, "ray": {"address": host.origin.removeprefix("http://")}},
}
SETTINGS = {  # the dotted key the refusal names, for HOSTILE's and SENDING's values
    "rl.rewards[].name": "rl.rewards[1].name", "rl.rewards[].kwargs": "rl.rewards[0].kwargs",
}
MARKED = [("code", field) for field in sorted(HOSTILE)] + [("host", field) for field in sorted(SENDING)]


def _deepspeed_json(evil: Path) -> Path:
    """DeepSpeed imports the modules `torch_autocast.lower_precision_safe_modules` names."""
    path = evil.with_name("ds.json")
    path.write_text(json.dumps({"torch_autocast": {"enabled": True, "lower_precision_safe_modules": ["evil.Thing"]}}))
    return path


def marked_as(kind: type) -> set[str]:
    """The dotted keys of the settings the schema marks with a `kind` marker."""
    return {key for key, markers in trust_fields().items() if any(isinstance(marker, kind) for marker in markers)}


def test_the_marked_settings_are_the_ones_that_name_code_or_a_host():
    names_code, sends = marked_as(NamesCode), marked_as(SendsOut)
    assert names_code == set(HOSTILE), "give each setting marked NamesCode a hostile value in HOSTILE"
    assert sends == set(SENDING), "give each setting marked SendsOut a value naming the test's host in SENDING"
    assert names_code | sends == set(trust_fields())
    assert {"extensions", "rl.rewards[].name", "rl.env.path", "vla.env", "model.trust_remote_code"} <= names_code
    assert {"rl.rewards[].kwargs", "logging.mlflow_tracking_uri", "ray.address"} <= sends


@pytest.mark.parametrize("kind, field", MARKED)
def test_every_marked_setting_of_a_saved_config_is_refused_before_anything_is_imported_or_sent(
        tmp_path, tiny_model, evil, witness, host, kind, field):
    hostile = HOSTILE[field](evil, witness) if kind == "code" else SENDING[field](host)
    run = shared_run(tmp_path, tiny_model, merged(SAVED, hostile))
    with pytest.raises(ConfigError) as refused:
        evaluate_models(EvalRequest(str(run), limit=1, max_new_tokens=2))
    message = str(refused.value)
    assert len(message.splitlines()) == 1, message
    assert message.startswith(f"{run / 'config.yaml'} is data") and f"{SETTINGS.get(field, field)} = " in message
    assert TRUST_FLAG in message and "trust_config_code=True" in message
    assert ("the code it names is not run" if kind == "code" else "nothing is sent to the hosts it names") in message
    assert KEY not in message
    assert not witness.exists() and host.requests == []
    assert str(evil.resolve()) not in {getattr(module, "__file__", None) for module in list(sys.modules.values())}


def test_local_stores_and_clusters_name_no_host(tmp_path, tiny_model):
    """A SQLite or file MLflow store, and the Ray cluster of this machine (`auto`), are not refused."""
    for index, uri in enumerate(("sqlite:///runs/mlflow.db", "file:///tmp/mlruns", "./mlruns")):
        tree = merged(SAVED, {"logging": {"mlflow_tracking_uri": uri}, "run": {"launcher": "ray"}, "ray": {"address": "auto"}})
        saved = shared_run(tmp_path / str(index), tiny_model, tree) / "config.yaml"
        assert as_data({})(yaml.safe_load(saved.read_text()), str(saved)) == tree


def test_built_in_names_name_no_code(tmp_path, tiny_model):
    """Built-in rewards and simulators, and trust_remote_code off (in any spelling validation reads), load."""
    saved = merged(SAVED, {"model": {"trust_remote_code": "no"}, "rl": {"rewards": [{"name": n} for n in REWARD_NAMES]}})
    assert load_config(shared_run(tmp_path, tiny_model, saved) / "config.yaml", screen=as_data({})).rl.rewards
    for env in ("reach", "pusht", "panda-push", "panda-reach"):
        saved = merged(SAVED, {"rl": {"task": None}, "vla": {"env": env}})
        cfg = load_config(shared_run(tmp_path / env, tiny_model, saved) / "config.yaml", screen=as_data({}))
        assert cfg.vla.env == env


def test_the_built_in_reward_names_are_the_reward_registry_s():
    from oxrl.rewards.combine import REWARDS

    assert set(REWARDS) - set(REGISTERED["reward"]) == set(REWARD_NAMES)


# --- the attacks, through `oxrl eval RUN_DIR` ---------------------------------------------------------------------

def test_a_judge_url_is_sent_neither_samples_nor_the_users_key_unless_trusted(tmp_path, tiny_model, host, oxrl_log):
    """The saved config's judge names the author's server and the user's key variable: the key would go in the
    Authorization header of every request. Refused, the server hears nothing; with the opt-in, it gets the key."""
    run = shared_run(tmp_path, tiny_model, merged(SAVED, judge_at(host)))
    assert main(["eval", str(run), *FAST]) == 2
    assert "rl.rewards[0].kwargs = " in oxrl_log.text and host.url in oxrl_log.text and TRUST_FLAG in oxrl_log.text
    assert KEY not in oxrl_log.text and host.requests == []
    assert main(["eval", str(run), *FAST, "--reward", "math"]) == 0 and host.requests == []  # the user's reward
    assert main(["eval", str(run), *FAST, TRUST_FLAG]) == 0
    assert host.requests and {request["headers"]["Authorization"] for request in host.requests} == {f"Bearer {KEY}"}

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
    "oxrl/vla/panda.py": "gym.make of the built-in panda-gym tasks' fixed ids (PANDA_TASKS)",
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
    "oxrl/commands.py": "`oxrl onboard --trust-remote-code`, a flag the user gives",
}


def test_every_call_that_runs_code_is_fed_by_a_marked_setting_or_none():
    calls = {str(path.relative_to(PACKAGE.parent)) for path in PACKAGE.rglob("*.py") if RUNS_CODE.search(path.read_text())}
    assert len(calls) > 10 and "oxrl/rewards/base.py" in calls  # the scan really read the package
    assert calls == set(FED_BY), (f"new: {sorted(calls - set(FED_BY))} (mark the settings that reach them with "
                                  f"NamesCode and list them here); gone: {sorted(set(FED_BY) - calls)}")
    fed = {key for settings in FED_BY.values() if isinstance(settings, list) for key in settings}
    assert fed == marked_as(NamesCode)
