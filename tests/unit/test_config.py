"""Config errors name the key, the bad value and the fix."""

import os
import time

import pytest
import yaml

from oxrl.cli import main
from oxrl.config.load import ConfigError, ConfigLoader, load_config, read_yaml_file, save_config
from oxrl.config.reference import config_reference
from tests.hostile_files import make_fifo, raised_within

BASE = ["model.name_or_path=m", "data.train=[{path: d.jsonl}]", "algorithm.name=sft"]


def test_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: {name_or_path: m}\ndata: {train: [{path: a.jsonl}]}\nalgorithm: {name: sft}\ntrain: {optim: {lr: 1.0e-4}}\n")
    cfg = load_config(path, ["train.optim.lr=2e-6", "train.global_batch_size=16", "run.name=x"])
    assert cfg.train.optim.lr == 2e-6 and cfg.train.global_batch_size == 16 and cfg.run.name == "x"
    assert cfg.data.train[0].path == "a.jsonl"


def test_unknown_key_suggests_the_closest():
    with pytest.raises(ConfigError, match=r"unknown key `train.optim.learning_rate`.*Did you mean `train.optim.lr`\?"):
        load_config(None, BASE + ["train.optim.learning_rate=1e-5"])
    with pytest.raises(ConfigError, match=r"unknown key `data.train.0.wieght`.*Did you mean `data.train.0.weight`"):
        load_config(None, ["model.name_or_path=m", "data.train=[{path: a, wieght: 2}]", "algorithm.name=sft"])


def test_wrong_type_names_key_and_value():
    with pytest.raises(ConfigError, match=r"`train.global_batch_size` = 'eight'.*integer"):
        load_config(None, BASE + ["train.global_batch_size=eight"])


@pytest.mark.parametrize("seed, bound", [("-1", "greater than or equal to 0"), ("4294967296", "less than 4294967296")])
def test_a_seed_numpy_cannot_take_is_refused_naming_the_setting(seed, bound):
    with pytest.raises(ConfigError, match=rf"`run.seed` = {seed}.*{bound}"):
        load_config(None, BASE + [f"run.seed={seed}"])
    assert load_config(None, BASE + ["run.seed=4294967295"]).run.seed == 2**32 - 1


def test_bad_choice_lists_the_allowed_values():
    with pytest.raises(ConfigError, match=r"`train.optim.schedule` = 'cosin'.*'constant', 'linear' or 'cosine'"):
        load_config(None, BASE + ["train.optim.schedule=cosin"])


def test_missing_required_field():
    with pytest.raises(ConfigError, match=r"missing required key `model.name_or_path`"):
        load_config(None, ["model.dtype=auto", "data.train=[{path: a}]", "algorithm.name=sft"])


def test_batch_sizes_must_divide():
    with pytest.raises(ConfigError, match=r"global_batch_size \(10\) must be a multiple of .*micro_batch_size_per_device \(4\)"):
        load_config(None, BASE + ["train.global_batch_size=10", "train.micro_batch_size_per_device=4"])


def test_overrides_leave_the_callers_base_tree_as_it_was():
    base = {"model": {"name_or_path": "m"}, "algorithm": {"name": "sft"}, "data": {"train": [{"path": "d.jsonl"}]},
            "train": {"optim": {"lr": 1e-5}}}
    expected = yaml.safe_dump(base)
    assert load_config(None, ["train.optim.lr=0.001", "train.max_steps=3"], base=base).train.optim.lr == 0.001
    assert yaml.safe_dump(base) == expected  # the next load from the same tree starts where the caller left it
    assert load_config(None, base=base).train.optim.lr == 1e-5


def test_missing_file_and_bad_override():
    with pytest.raises(ConfigError, match="config file not found"):
        load_config("/nonexistent.yaml")
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(None, ["no_equals_sign"])


def test_cli_reports_config_errors_without_traceback(tmp_path, caplog):
    path = tmp_path / "c.yaml"
    path.write_text("model: {name_or_path: m}\ndata: {train: [{path: a.jsonl}]}\nalgorithm: {name: sft}\n")
    assert main(["train", str(path), "train.optm.lr=1"]) == 2
    assert main(["train", str(path), "algorithm.name=dpoo"]) == 2


def test_reference_covers_every_field():
    text = config_reference()
    for key in ("run.seed", "model.name_or_path", "data.train[].weight", "train.optim.lr", "lora.rank", "checkpoint.keep_last"):
        assert f"`{key}`" in text


def _rows(text: str) -> dict[str, list[str]]:
    """A run reference's table rows by key: [value, default, description]."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("| `"):
            key, *cells = [cell.strip() for cell in line.strip("|").split(" | ")]
            rows[key.strip("`")] = cells
    return rows


def test_the_reference_of_a_run_lists_what_it_reads_with_its_values():
    from oxrl.config.reference import run_reference

    sft = _rows(run_reference(load_config(None, ["model.name_or_path=m", "algorithm.name=sft"]), "test"))
    assert {"train.optim.lr", "data.max_length", "lora.enabled", "model.name_or_path"} <= set(sft)
    assert not {"lora.rank", "rl.rollout.n", "preference.beta", "online.loss", "checkpoint.keep_last"} & set(sft)
    assert sft["model.name_or_path"][:2] == ["`\"m\"`", "**required**"]
    assert sft["train.optim.lr"][1] == ""  # at its default: no default column
    dpo = _rows(run_reference(load_config(None, ["model.name_or_path=m", "algorithm.name=dpo", "lora.enabled=true",
                                                 "preference.beta=0.3"]), "test"))
    assert {"preference.beta", "preference.label_smoothing", "lora.rank"} <= set(dpo)
    assert not {"preference.simpo_gamma", "preference.orpo_lambda", "rl.eps_high"} & set(dpo)
    assert dpo["preference.beta"][:2] == ["`0.3`", "`0.1`"]
    dapo = _rows(run_reference(load_config(None, ["model.name_or_path=m", "algorithm.name=dapo"]), "test"))
    assert dapo["rl.eps_high"][:2] == ["`0.28`", "`null`"]  # the preset's value; the schema's own default is unset
    assert "rl.gamma" not in dapo and "rl.dual_clip" in dapo  # GAE's, not read; the ppo loss's, read
    # What it leaves out is refused when set, naming who reads it.
    with pytest.raises(ConfigError, match="lora.rank = 8 is not read by `sft`"):
        load_config(None, ["model.name_or_path=m", "algorithm.name=sft", "lora.rank=8"])


def test_config_reference_of_one_run_from_the_command_line(tmp_path, capsys, monkeypatch):
    assert main(["config-reference", "--algorithm", "simpo", "preference.simpo_gamma=2"]) == 0
    assert _rows(capsys.readouterr().out)["preference.simpo_gamma"][:2] == ["`2.0`", "`0.5`"]
    assert main(["config-reference", "--algorithm", "dpo", "preference.simpo_gamma=2"]) == 2  # not read by dpo
    path = tmp_path / "run.yaml"
    path.write_text("model: {name_or_path: m}\ndata: {train: [{path: a.jsonl}]}\nalgorithm: {name: orpo}\n")
    assert main(["config-reference", str(path), "preference.orpo_lambda=0.3"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert rows["preference.orpo_lambda"][0] == "`0.3`" and "preference.beta" not in rows  # ORPO has no beta
    assert main(["config-reference", str(path), "--algorithm", "dpo"]) == 2  # one run or the other
    assert main(["config-reference", "train.max_steps=3"]) == 2  # an override of no run
    monkeypatch.setenv("OXRL_TEST_SECRET_TOKEN", "s3cr3t-value")  # a secret's value, by its variable's name
    assert main(["config-reference", "--algorithm", "sft", "model.name_or_path=s3cr3t-value"]) == 0
    printed = capsys.readouterr().out
    assert "s3cr3t-value" not in printed and "`\"***\"`" in printed


def test_docs_reference_is_up_to_date():
    from pathlib import Path

    doc = Path(__file__).resolve().parents[2] / "docs" / "config_reference.md"
    assert doc.read_text() == config_reference(), "run `make docs` to regenerate docs/config_reference.md"


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["eval", "--help"], ["doctor", "--help"],
                                  ["config-reference", "--help"], ["demos", "--help"]])
def test_every_command_has_help(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0 and "usage: oxrl" in capsys.readouterr().out


def test_doctor_reports_without_changing_anything(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "torch" in out and "cuda" in out


def test_a_cross_key_check_names_its_keys_without_dumping_the_config():
    with pytest.raises(ConfigError) as caught:
        load_config(None, ["model.name_or_path=m", "algorithm.name=rm", "data.train=[{path: x.jsonl}]", "logging.samples=[hi]"])
    message = str(caught.value)
    assert "`rm` trains a reward model" in message and "remove logging.samples" in message
    assert "'run':" not in message and "Value error" not in message  # no dump of the whole config


def test_malformed_yaml_names_the_file_line_and_column(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  name_or_path: m\n algorithm: {name: sft}\n")  # line 3 is indented by one space
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert message.startswith(f"{path}, line 3, column 2: not valid YAML: expected <block end>")
    assert "(while parsing a block mapping that starts at line 1, column 1)" in message
    assert message.endswith("\n     algorithm: {name: sft}\n     ^")  # the line, a caret under column 2
    assert "<unicode string>" not in message
    path.write_bytes(b"model: {name_or_path: \xff}\n")
    with pytest.raises(ConfigError, match=rf"^{path}: not UTF-8 text \(byte 22\)"):
        load_config(path)


def test_malformed_override_value_names_the_override():
    with pytest.raises(ConfigError) as caught:
        load_config(None, BASE + ["data.train=[{path: a.jsonl"])
    message = str(caught.value)  # the value ends (column 16) before its mapping and list are closed
    assert message.startswith("the value of override 'data.train=[{path: a.jsonl', line 1, column 16: not valid YAML: "
                              "expected ',' or '}'")
    assert "<unicode string>" not in message


def test_a_saved_rl_config_keeps_the_users_settings_and_takes_another_algorithms_preset(tmp_path):
    cfg = load_config(None, ["model.name_or_path=m", "algorithm.name=dapo", "rl.task=arithmetic", "rl.eps_low=0.1"])
    assert (cfg.rl.advantage, cfg.rl.eps_low, cfg.rl.eps_high) == ("grpo", 0.1, 0.28)  # dapo's clip-higher
    save_config(cfg, tmp_path / "config.yaml")
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())["rl"]
    assert saved["advantage"] is None and saved["eps_high"] is None and saved["eps_low"] == 0.1  # the preset's: unset
    assert load_config(tmp_path / "config.yaml").rl == cfg.rl  # loading resolves the same values again
    ppo = load_config(tmp_path / "config.yaml", ["algorithm.name=ppo"]).rl
    assert (ppo.advantage, ppo.eps_low, ppo.eps_high) == ("gae", 0.1, 0.2)  # ppo's preset, the user's eps_low


# --- hostile configs: each is a clear error at once, not a silent choice, a hang or a megabyte of message ----------

def test_a_key_given_twice_is_an_error_naming_both_lines(tmp_path):
    config = tmp_path / "dup.yaml"
    config.write_text("model:\n  name_or_path: m\ntrain:\n  optim:\n    lr: 1.0e-5\n    lr: 1.0e+3\n")
    with pytest.raises(ConfigError, match=r"dup.yaml, line 6.*key `lr` appears twice, on line 5 and line 6"):
        load_config(config)
    with pytest.raises(ConfigError, match="appears twice"):
        load_config(None, [*BASE, "train.optim={lr: 1.0e-5, lr: 1.0e+3}"])


def test_a_merge_key_may_still_be_overridden(tmp_path):
    tree = yaml.load("a: &d {lr: 1}\nb:\n  <<: *d\n  lr: 2\n", Loader=ConfigLoader)
    assert tree["b"] == {"lr": 2}


def test_an_alias_bomb_is_refused_at_once(tmp_path):
    levels = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    levels += [f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi")]
    config = tmp_path / "bomb.yaml"
    config.write_text("\n".join(levels) + "\n")  # under 800 bytes: 9^9 strings once expanded
    start = time.monotonic()
    with pytest.raises(ConfigError, match="expands to more than 100,000 values") as raised:
        load_config(config)
    assert time.monotonic() - start < 2 and len(str(raised.value)) < 1000


def test_an_error_quotes_a_bounded_part_of_a_huge_value(tmp_path):
    # Shared lists that are small as YAML but megabytes as a repr: the message stays a few lines.
    config = tmp_path / "wide.yaml"
    config.write_text("model: {name_or_path: m}\nalgorithm: {name: sft}\ndata: {train: [{path: d.jsonl}]}\n"
                      "x: &x [" + ", ".join(["'" + "y" * 60 + "'"] * 300) + "]\n"
                      "train: {epochs: [*x, *x, *x, *x, *x, *x, *x, *x]}\n")
    with pytest.raises(ConfigError, match=r"`train.epochs` = \[\['yyy.*\.\.\. \(") as raised:
        load_config(config)
    assert len(str(raised.value)) < 2000


def test_thousands_of_problems_are_counted_not_listed():
    with pytest.raises(ConfigError, match=r"\.\.\. and \d+ more") as raised:
        load_config(None, [*BASE, "train={" + ", ".join(f"k{i}: 1" for i in range(3000)) + "}"])
    assert len(str(raised.value).splitlines()) <= 23


def test_a_config_that_is_not_a_small_regular_file_is_refused(tmp_path):
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)  # reading it would wait forever for a writer
    error = raised_within(20, lambda: load_config(fifo), [fifo])
    assert isinstance(error, ConfigError)
    assert str(error) == f"{fifo}: is a FIFO (named pipe), not a regular file: is it a YAML config?"
    with pytest.raises(ConfigError, match=rf"^{tmp_path}: is a folder, not a regular file: is it a YAML config\?$"):
        load_config(tmp_path)
    huge = tmp_path / "huge.yaml"
    huge.write_text("# " + "x" * (2 << 20) + "\n")
    with pytest.raises(ConfigError, match=r"huge.yaml: 2,097,155 bytes, more than the 1,048,576 a config file may have"):
        load_config(huge)
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 50_000 + "]" * 50_000 + "\n")
    with pytest.raises(ConfigError, match="deep.yaml"):
        load_config(deep)


def test_every_yaml_file_oxrl_reads_is_read_as_a_config_is(tmp_path):
    # A registry file (`oxrl models --registry FILE`) and a run's saved config.yaml (read on resume) go through
    # read_yaml_file: a key given twice, an alias bomb or a FIFO is refused naming the file, as in a config.
    from oxrl.models.registry import RegistryError, read_registry_file

    registry = tmp_path / "registry.yaml"
    registry.write_text("models:\n  - name: a/b\n    family: llama\n    family: qwen2\n")
    with pytest.raises(RegistryError, match=r"registry.yaml, line 4.*key `family` appears twice, on line 3 and line 4"):
        read_registry_file(registry)
    fifo = make_fifo(tmp_path / "config.yaml")
    error = raised_within(20, lambda: read_yaml_file(fifo), [fifo])
    assert isinstance(error, ConfigError)
    assert str(error) == f"{fifo}: is a FIFO (named pipe), not a regular file: is it a YAML config?"


@pytest.mark.parametrize("algorithm, overrides, refused, reader", [
    ("sft", ["rl.rollout.n=4"], "rl.rollout.n = 4", "by RL and online algorithms"),
    ("sft", ["rl.kl_coef=0.1"], "rl.kl_coef = 0.1", "by RL and online algorithms"),
    ("dpo", ["rl.task=arithmetic"], "rl.task = 'arithmetic'", "by RL and online algorithms"),
    ("sft", ["lora.rank=8"], "lora.rank = 8", "with lora.enabled: true"),
    ("grpo", ["rl.task=arithmetic", "train.global_batch_size=64"], "train.global_batch_size = 64",
     "rl.prompts_per_step x rl.rollout.n"),
    ("grpo", ["rl.task=arithmetic", "rl.rollout.vllm.gpu_memory_utilization=0.3"],
     "rl.rollout.vllm.gpu_memory_utilization = 0.3", "with rl.rollout.engine: vllm"),
    # A generated task is its own prompts: no prompt file, hold-out or mixture setting is read beside it.
    *(("grpo", ["rl.task=arithmetic", override], refused, "rl.task generates its own prompts") for override, refused in (
        ("data.train=[{path: d.jsonl}]", "data.train = [{'path': 'd.jsonl'}]"),
        ("data.validation=[{path: v.jsonl}]", "data.validation = [{'path': 'v.jsonl'}]"),
        ("data.validation_fraction=0.1", "data.validation_fraction = 0.1"), ("data.num_examples=10", "data.num_examples = 10"),
        ("data.skip_invalid_rows=true", "data.skip_invalid_rows = True"))),
    ("grpo", ["data.train=[{path: d.jsonl}]", "rl.task_size=10"], "rl.task_size = 10", "with rl.task"),
    ("grpo", ["data.train=[{path: d.jsonl}]", "rl.task_config={max_operand: 5}"], "rl.task_config = ", "with rl.task"),
    ("grpo", ["data.train=[{path: d.jsonl}]", "data.validation=[{path: v.jsonl}]", "rl.validation_size=5"],
     "rl.validation_size = 5", "without data.validation"),
    ("grpo", ["rl.task=arithmetic", "rl.validation_size=0", "rl.validation_every=4"], "rl.validation_every = 4",
     "with held-out prompts"),
    ("grpo", ["rl.task=arithmetic", "rl.rollout.temperature=0", "rl.rollout.top_p=0.9"], "rl.rollout.top_p = 0.9",
     "with rl.rollout.temperature > 0"),
    ("grpo", ["rl.task=arithmetic", "rl.env={path: tests.integration.test_multiturn:make_env}",
              "rl.on_reward_error=zero"], "rl.on_reward_error = 'zero'", "rl.env and `vla` episodes reward themselves"),
    ("sft", ["strategy.name=single", "strategy.cpu_offload=true"], "strategy.cpu_offload = True", "fsdp2 or deepspeed"),
    ("sft", ["train.optim.warmup_steps=5", "train.optim.warmup_ratio=0.1"], "train.optim.warmup_ratio = 0.1",
     "with train.optim.warmup_steps 0"),
    ("sft", ["train.optim.schedule=constant", "train.optim.min_lr_ratio=0.1"], "train.optim.min_lr_ratio = 0.1",
     "with train.optim.schedule linear or cosine"),
    ("sft", ["train.max_steps=5", "train.epochs=3"], "train.epochs = 3.0", "without train.max_steps"),
    ("grpo", ["rl.task=arithmetic", "rl.rollout.engine=vllm", "rl.rollout.decode=static"], "rl.rollout.decode = 'static'",
     "by an `hf`-based engine"),
    ("grpo", ["rl.task=arithmetic", "rl.rollout.engine=vllm", "rl.rollout.vllm.kv_cache_gib=2",
              "rl.rollout.vllm.gpu_memory_utilization=0.3"], "rl.rollout.vllm.gpu_memory_utilization = 0.3",
     "without rl.rollout.vllm.kv_cache_gib"),
    ("sft", ["run.accept_config_changes=true"], "run.accept_config_changes = True", "with run.resume"),
    ("sft", ["logging.mlflow_tracking_uri=sqlite:///m.db"], "logging.mlflow_tracking_uri = 'sqlite:///m.db'",
     "with `mlflow` in logging.report_to"),
    ("sft", ["logging.project=mine"], "logging.project = 'mine'", "with `mlflow` or `wandb` in logging.report_to"),
    ("sft", ["logging.sample_max_new_tokens=8"], "logging.sample_max_new_tokens = 8", "with logging.samples"),
])
def test_a_setting_the_run_does_not_read_is_refused_naming_its_reader(algorithm, overrides, refused, reader):
    with pytest.raises(ConfigError) as raised:
        load_config(None, ["model.name_or_path=m", f"algorithm.name={algorithm}", *overrides])
    assert refused in str(raised.value) and reader in str(raised.value)


@pytest.mark.parametrize("overrides", [
    ["algorithm.name=sft", "lora.enabled=true", "lora.rank=8"],
    ["algorithm.name=grpo", "rl.task=arithmetic", "rl.rollout.engine=vllm", "rl.rollout.vllm.gpu_memory_utilization=0.3"],
    ["algorithm.name=grpo", "rl.task=arithmetic", "rl.kl_coef=0.1", "rl.rollout.n=4"],
    ["algorithm.name=sft", "train.global_batch_size=64"],
    ["algorithm.name=grpo", "data.train=[{path: d.jsonl}]", "data.validation_fraction=0.1", "data.num_examples=10",
     "data.skip_invalid_rows=true"],
    ["algorithm.name=grpo", "rl.task=arithmetic", "rl.task_size=10", "rl.task_config={max_operand: 5}",
     "rl.validation_size=4", "rl.validation_every=2", "rl.rollout.top_p=0.9", "rl.on_reward_error=zero"],
    ["algorithm.name=sft", "strategy.name=fsdp2", "strategy.cpu_offload=true"],
    ["algorithm.name=sft", "train.optim.warmup_ratio=0.1", "train.optim.min_lr_ratio=0.1", "train.epochs=3",
     "run.name=r", "run.resume=true", "run.accept_config_changes=true", "logging.samples=[hi]",
     "logging.sample_max_new_tokens=8"],
    ["algorithm.name=grpo", "rl.task=arithmetic", "rl.rollout.decode=static", "rl.rollout.precision=trainer"],
    ["algorithm.name=grpo", "rl.task=arithmetic", "rl.rollout.engine=vllm", "rl.rollout.vllm.kv_cache_gib=2"],
])
def test_the_same_settings_are_accepted_where_they_are_read(overrides):
    load_config(None, ["model.name_or_path=m", *overrides])


def test_validation_datasets_and_a_validation_fraction_are_one_too_many():
    with pytest.raises(ConfigError, match="data.validation_fraction = 0.1 is not read by `sft`: it is read only without "
                       "data.validation"):
        load_config(None, ["model.name_or_path=m", "algorithm.name=sft", "data.train=[{path: d.jsonl}]",
                           "data.validation=[{path: v.jsonl}]", "data.validation_fraction=0.1"])


@pytest.mark.parametrize("overrides, refused", [
    (["strategy.name=fsdp2", "strategy.zero_stage=2"], "strategy.zero_stage = 2"),
    (["strategy.name=deepspeed", "strategy.reshard_after_forward=false"], "strategy.reshard_after_forward = False"),
])
def test_a_setting_of_another_strategy_is_refused(overrides, refused):
    with pytest.raises(ConfigError, match=refused):
        load_config(None, ["model.name_or_path=m", "algorithm.name=sft", *overrides])
    load_config(None, ["model.name_or_path=m", "algorithm.name=sft", "strategy.name=deepspeed", "strategy.zero_stage=2"])


def test_a_sharding_setting_in_one_process_is_refused_before_anything_loads():
    # `auto` is fsdp2 under torchrun, so the config alone cannot tell; one process (strategy `single`) can.
    from oxrl.training.build import build_strategy

    cfg = load_config(None, ["model.name_or_path=m", "algorithm.name=sft", "strategy.cpu_offload=true"])
    with pytest.raises(ValueError, match=r"strategy.cpu_offload = True \(read by fsdp2 or deepspeed\): not read in one "
                                         r"process \(strategy `single`\)"):
        build_strategy(cfg)
    cfg = load_config(None, ["model.name_or_path=m", "algorithm.name=sft", "strategy.mesh.tp=2"])
    with pytest.raises(ValueError, match=r"strategy.mesh = \{'tp': 2\} \(read by fsdp2\): not read in one process"):
        build_strategy(cfg)


def test_a_setting_is_read_through_its_rules():
    """`Config.read` answers a setting only where the run reads it, by the rules beside it and its sections."""
    def cfg(*overrides):
        return load_config(None, ["model.name_or_path=m", *overrides])

    sft, ppo = cfg("algorithm.name=sft"), cfg("algorithm.name=ppo")
    assert sft.read("lora.rank") is None and sft.read("lora.rank", 0) == 0  # LoRA off
    assert sft.read("lora.enabled") is False  # the field the lora section keeps is read either way
    assert cfg("algorithm.name=sft", "lora.enabled=true", "lora.rank=8").read("lora.rank") == 8
    assert sft.read("rl.critic_backbone") is None and sft.read("strategy.zero_stage") is None  # rl: not read by sft
    assert ppo.read("rl.critic_backbone") == "separate" == ppo.critic and sft.critic is None
    assert cfg("algorithm.name=grpo").critic is None  # no critic without gae
    deepspeed = cfg("algorithm.name=sft", "strategy.name=deepspeed", "strategy.zero_stage=2")
    assert deepspeed.read("strategy.zero_stage") == 2 and deepspeed.read("strategy.mesh") is None
