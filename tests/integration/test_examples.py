"""Every example config loads, every algorithm has one, and each runs one optimizer step.

The run swaps the bundled SmolLM2-135M-Instruct (and any teacher, critic, reward model or judge) for a
tiny random model saved with the real SmolLM2 tokenizer (a vision-language or -action example, `vlm_*.yaml` or
`vla_*.yaml`, for a tiny random Qwen2-VL, tests/vlm_fixtures.py), and shrinks only the sizes (steps, rows,
prompts, samples, tokens): the data, the objective, its hyper-parameters and the rewards are the
example's own, so an example whose data, rewards or settings no longer fit the code fails here, not in
a user's hands. Multi-turn examples (`rl.env`) run too, on the built-in `hf` engine; an example on the
vLLM engine would only be loaded (CI has no vLLM).
"""

from __future__ import annotations

import importlib.util
import json
import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from oxrl.config.load import apply_override, find_beside, load_config
from oxrl.config.names import ALL_ALGORITHMS, OFFLINE_ALGORITHMS, ONLINE
from oxrl.config.schema import CheckpointConfig, LoggingConfig
from tests.config_reads import check_reads_against_rules
from tests.conftest import make_tiny_llama, save_tiny_model
from tests.vlm_fixtures import save_tiny_qwen2_vl

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
IDS = [path.stem for path in EXAMPLES]


@pytest.fixture(autouse=True)
def _in_the_repository(monkeypatch):
    """Examples' commands run from the repository root (their data files are found beside them from anywhere)."""
    monkeypatch.chdir(ROOT)


@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_example_loads_and_says_how_to_run_it(path):
    load_config(path)
    header = path.read_text().split("\nrun:")[0]
    assert f"python -m oxrl train examples/{path.name}" in header, "the header comment gives the command"


def test_every_algorithm_has_an_example():
    covered = {load_config(path).algorithm.name for path in EXAMPLES}
    missing = sorted(set(ALL_ALGORITHMS) - covered)
    assert not missing, f"algorithms without an example in examples/: {missing}"


# Data files written by a generator beside them, each with a `files()` -> {path: rows}.
GENERATORS = [ROOT / "examples/data/make_arithmetic_text.py", ROOT / "examples/data/make_arithmetic_kto.py",
              ROOT / "oxrl/data/bundled/make_reasoning_openr1.py", ROOT / "examples/data/make_calculator_traces.py",
              ROOT / "examples/data/make_vlm_shapes.py"]


@pytest.mark.parametrize("generator", GENERATORS, ids=[path.stem for path in GENERATORS])
def test_data_files_are_what_their_generators_write(generator, monkeypatch):
    monkeypatch.syspath_prepend(str(generator.parent))  # make_arithmetic_kto imports its neighbour
    spec = importlib.util.spec_from_file_location(generator.stem, generator)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for path, rows in module.files().items():
        assert path.read_text() == "".join(json.dumps(row) + "\n" for row in rows), f"regenerate {path.name}"


@dataclass(frozen=True)
class TinyModels:
    """Tiny random Llamas with the real SmolLM2 tokenizer: the policy, a teacher (other weights), a reward model;
    and a tiny random Qwen2-VL, the policy of the vision-language examples."""

    policy: Path
    teacher: Path
    reward_model: Path
    vision_language: Path


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory, smollm2_tokenizer) -> TinyModels:
    from transformers import LlamaForSequenceClassification

    folder = tmp_path_factory.mktemp("tiny-models")
    config = make_tiny_llama(vocab_size=len(smollm2_tokenizer)).config
    config.num_labels, config.pad_token_id = 1, smollm2_tokenizer.pad_token_id
    LlamaForSequenceClassification(config).save_pretrained(folder / "reward-model")
    smollm2_tokenizer.save_pretrained(folder / "reward-model")
    return TinyModels(save_tiny_model(folder / "policy", smollm2_tokenizer),
                      save_tiny_model(folder / "teacher", smollm2_tokenizer, seed=1), folder / "reward-model",
                      save_tiny_qwen2_vl(folder / "vision-language", smollm2_tokenizer))


def coin_reward(prompt: str, completion: str) -> float:
    """Full marks for about half of all completions, reproducibly (a checksum's parity)."""
    return float(zlib.crc32(completion.encode()) % 2)


def tiny_run_tree(path: Path, models: TinyModels, output_dir: Path) -> dict:
    """The example's config tree, made tiny: the models swapped (policy, teacher, critic, reward model, judge),
    one step, small data, prompts and samples; files a run writes (a judge's cache) go to `output_dir`.

    An online algorithm that picks answers by reward trains only on answers whose rewards differ (a DPO pair)
    or reach full marks (RFT), and a random model's answers all score 0: `coin_reward` is added to the
    example's rewards (or its task's default one), with 4 answers per prompt, so some answers are kept.
    """
    tree = find_beside(yaml.safe_load(path.read_text()), path.parent)  # its data files, as `oxrl train` finds them
    policy = models.vision_language if path.name.startswith(("vlm_", "vla_")) else models.policy
    settings = {
        "model.name_or_path": str(policy), "run.output_dir": str(output_dir), "train.max_steps": 1,
        "checkpoint.every": None, "logging.samples": [], "logging.plot": False, "logging.progress_bar": False,
        # without samples their length is not read, nor without step checkpoints how many to keep: both go back to
        # their defaults
        "logging.sample_max_new_tokens": LoggingConfig.model_fields["sample_max_new_tokens"].default,
        "checkpoint.keep_last": CheckpointConfig.model_fields["keep_last"].default,
    }
    if tree["algorithm"]["name"] in OFFLINE_ALGORITHMS:
        settings |= {"train.global_batch_size": 4, "train.micro_batch_size_per_device": 4}
        if tree.get("preference", {}).get("teacher") is not None:
            settings["preference.teacher"] = str(models.teacher)
    else:
        rl = tree.get("rl", {})
        # An online algorithm that picks answers by reward; SPIN's are the data's (a file, no rewards).
        picks_by_reward = tree["algorithm"]["name"] in ONLINE and bool(rl.get("rewards") or rl.get("task"))
        held_out = rl.get("validation_size")
        settings |= {"rl.prompts_per_step": 2, "rl.rollout.max_new_tokens": 8, "train.micro_batch_size_per_device": 4,
                     "rl.rollout.n": 4 if picks_by_reward else min(rl.get("rollout", {}).get("n", 2), 2),
                     "rl.validation_size": 2 if held_out is None else min(held_out, 2)}
        if rl.get("task") is not None or "vla" in tree:
            settings["rl.task_size"] = 8
        if "vla" in tree:  # a chunk is exactly its action tokens
            del settings["rl.rollout.max_new_tokens"]
        if tree.get("data", {}).get("validation_fraction"):
            del settings["rl.validation_size"]  # the fraction holds out the validation prompts instead
        if rl.get("critic_model") is not None:
            settings["rl.critic_model"] = str(models.policy)
        rewards = [_tiny_reward(spec, models, output_dir) for spec in rl.get("rewards") or []]
        if picks_by_reward:
            rewards = (rewards or _task_rewards(rl)) + [{"name": "tests.integration.test_examples:coin_reward"}]
        if rewards:
            settings["rl.rewards"] = rewards
    for key, value in settings.items():
        apply_override(tree, key.split("."), value)
    for spec in tree.get("data", {}).get("train", []) + tree.get("data", {}).get("validation", []):
        spec["max_rows"] = min(spec.get("max_rows") or 24, 24)
    return tree


def _tiny_reward(spec: dict, models: TinyModels, output_dir: Path) -> dict:
    """A reward spec whose reward model or judge is the tiny one, judging in few tokens, caching in `output_dir`."""
    kwargs = dict(spec.get("kwargs") or {})
    if spec["name"] == "reward_model":
        kwargs["path"] = str(models.reward_model)
    if spec["name"] == "judge" and "model" in kwargs:
        # A random model writes no verdict: its babble is counted (on_error) rather than stopping the run.
        kwargs |= {"model": str(models.policy), "max_new_tokens": 8, "max_unparsed_fraction": 1.0}
    if "cache_path" in kwargs:
        kwargs["cache_path"] = str(output_dir / Path(kwargs["cache_path"]).name)
    return {**spec, "kwargs": kwargs}


def _task_rewards(rl: dict) -> list[dict]:
    """The rewards of an `rl` section that names none: its task's default."""
    from oxrl.data.rl_tasks import default_rewards

    specs = default_rewards(rl.get("task") or "gsm8k", rl.get("answer_format", "boxed"))
    return [{"name": spec.name, "weight": spec.weight, "kwargs": spec.kwargs} for spec in specs]


@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_example_runs_one_step_on_a_tiny_model(path, tiny_models, tmp_path, config_reads):
    """One step of the example; then each setting the step never read is refused when set (tests/config_reads.py)."""
    from oxrl.runner import run

    tree = tiny_run_tree(path, tiny_models, tmp_path)
    if tree.get("rl", {}).get("rollout", {}).get("engine") == "vllm":
        pytest.skip("the vLLM engine is not installed in CI: this example is checked by loading only")
    cfg = load_config(None, base=tree)
    if any(spec.name == "judge" and "model" in spec.kwargs for spec in cfg.rl.rewards):
        # A random model writes no verdict, so every judgement fails, and a reward failing on every sample of a batch
        # stops the run rather than train on zeros (oxrl/rewards/failures.py). RLAIF's step with a judge that answers
        # is tests/integration/test_rlaif.py's.
        from oxrl.rewards.failures import EveryCallFailedError

        with pytest.raises(EveryCallFailedError, match="reward 'judge' failed on every sample"):
            run(cfg)
        return
    result = run(cfg)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert max(row["step"] for row in rows) == 1
    step = next(row for row in rows if row["step"] == 1)
    # `loss`; a PPO step still in critic warm-up logs only `critic/loss` (its policy does not move yet).
    losses = {key: value for key, value in step.items() if key == "loss" or key.endswith("/loss")}
    assert losses and all(math.isfinite(value) for value in losses.values()), step
    if cfg.algorithm.name not in OFFLINE_ALGORITHMS:
        assert math.isfinite(step["reward/mean"]), step
    assert check_reads_against_rules(cfg, config_reads, lambda overrides: load_config(None, overrides, base=tree)) >= 20
