"""`algorithm.name` is checked when the config loads, against every offline and RL name, and `sgrpo`
is GRPO with its paper's KL term."""

import copy
import subprocess
import sys

import pytest
import torch

from oxrl.config.load import ConfigError, load_config, save_config
from oxrl.config.names import ALGORITHM_GROUPS, ALL_ALGORITHMS, OFFLINE_ALGORITHMS, RL_ALGORITHMS
from oxrl.loops.objectives import all_objectives, get_objective
from oxrl.config.rl_presets import PRESETS, resolve


def config_with(name: str, *overrides: str):
    return load_config(None, ["model.name_or_path=m", "data.train=[{path: d.jsonl}]", f"algorithm.name={name}", *overrides])


def test_the_names_are_exactly_those_the_registries_implement():
    assert set(OFFLINE_ALGORITHMS) == set(all_objectives())
    assert tuple(PRESETS) == RL_ALGORITHMS
    assert sorted(ALL_ALGORITHMS) == sorted(name for names in ALGORITHM_GROUPS.values() for name in names)
    assert len(set(ALL_ALGORITHMS)) == len(ALL_ALGORITHMS)


@pytest.mark.parametrize("typo, suggestion", [("grpoo", "grpo"), ("dr-grpo", "dr_grpo"), ("dpoo", "dpo"), ("kd_jds", "kd_jsd")])
def test_an_unknown_name_fails_at_load_with_a_suggestion_from_every_family(typo, suggestion):
    with pytest.raises(ConfigError) as caught:
        config_with(typo)
    message = str(caught.value)
    assert f"- `algorithm.name` = '{typo}': unknown algorithm `{typo}`. Did you mean `{suggestion}`?" in message
    # The whole grouped list, RL included, and no pydantic prefix.
    for group, names in ALGORITHM_GROUPS.items():
        assert f"{group}: {', '.join(names)}" in message
    assert "Value error" not in message


@pytest.mark.parametrize("spelling, canonical", [("GRPO", "grpo"), (" Dr_GRPO ", "dr_grpo"), ("DPO", "dpo"), ("SGRPO", "sgrpo")])
def test_names_are_case_insensitive_and_stored_in_lower_case(spelling, canonical):
    assert config_with(spelling).algorithm.name == canonical


def test_checking_a_name_imports_no_torch():
    code = ("import sys; from oxrl.config.load import load_config; "
            "load_config(None, ['model.name_or_path=m', 'algorithm.name=GRPO']); "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_registries_name_the_wrong_family_and_suggest_within_their_own():
    rl = config_with("grpo").rl
    with pytest.raises(ValueError, match="`dpo` is an offline objective, not an RL algorithm"):
        resolve("dpo", rl)
    with pytest.raises(ValueError, match="unknown RL algorithm `grpx`. Did you mean `grpo`?"):
        resolve("grpx", rl)
    with pytest.raises(ValueError, match="`grpo` is an RL algorithm, not an offline objective"):
        get_objective("grpo")
    with pytest.raises(ValueError, match="unknown offline objective `kto2`. Did you mean `kto`?"):
        get_objective("kto2")
    assert resolve("GRPO", rl).advantage == "grpo" and get_objective("SFT").name == "sft"


def test_sgrpo_is_grpo_with_the_papers_kl_term_and_grpo_has_none(tmp_path):
    grpo, sgrpo = resolve("grpo", config_with("grpo").rl), resolve("sgrpo", config_with("sgrpo").rl)
    assert grpo.kl_coef == 0.0  # the runner builds a reference model only for kl_coef > 0
    assert sgrpo.kl_coef == 0.04 and sgrpo.kl_estimator == "k3" and not sgrpo.kl_in_reward
    different = {key for key in type(grpo).model_fields if getattr(grpo, key) != getattr(sgrpo, key)}
    assert different == {"kl_coef"}
    # A coefficient the user sets wins, 0 included; a saved config (kl_coef: null) resolves the same again.
    assert resolve("sgrpo", config_with("sgrpo", "rl.kl_coef=0.01").rl).kl_coef == 0.01
    assert resolve("sgrpo", config_with("sgrpo", "rl.kl_coef=0").rl).kl_coef == 0.0
    save_config(config_with("sgrpo"), tmp_path / "saved.yaml")
    assert resolve("sgrpo", load_config(tmp_path / "saved.yaml").rl).kl_coef == 0.04


def share_of_low_ids(prompt: str, completion: str) -> float:
    """The fraction of completion tokens with an id below 64 (TinyTokenizer decodes ids as numbers)."""
    words = completion.split()
    return sum(int(w) < 64 for w in words) / max(1, len(words))


def test_sgrpo_trains_with_a_kl_term_to_a_frozen_reference(tmp_path):
    from oxrl.training.strategy import SingleDevice
    from oxrl.data.types import RLPromptBatch
    from oxrl.loops.rl import train_rl
    from oxrl.models.reference import FrozenModel
    from oxrl.rewards.combine import build_reward_fn
    from oxrl.rollout.hf import HFEngine
    from tests.conftest import make_tiny_llama, rl_handles
    from tests.integration.test_rl_loop import prompts, rl_config
    from tests.integration.test_rollout_hf import TinyTokenizer

    cfg = rl_config(tmp_path, "sgrpo")
    cfg.train.max_steps = 3
    torch.manual_seed(0)
    model = make_tiny_llama()
    reference = FrozenModel(copy.deepcopy(model).eval().requires_grad_(False))
    # a dense reward: every group's completions score differently from the first step, so the policy moves at once
    reward = build_reward_fn([{"name": "tests.unit.test_algorithm_names:share_of_low_ids"}])

    def train(reference, run_dir):
        h = rl_handles(cfg, model, HFEngine(model, TinyTokenizer()), reward,
                       SingleDevice(torch.device("cpu"), "no", max_grad_norm=1.0), reference=reference)
        return train_rl(h, prompts(), RLPromptBatch([], [], [], []), tmp_path / run_dir)

    with pytest.raises(ValueError, match="kl_coef is set but PolicyLossInput.ref_logprobs is None"):
        train(None, "without_reference")  # the preset's KL term is real: without a reference it cannot be computed
    result = train(reference, "with_reference")
    assert result.final_metrics["kl_ref"] > 0  # the policy moved away from the frozen reference
