"""The `vla` section (oxrl/config/schema.py `_vla_fits`): read by behaviour cloning and RL in a simulator, and every
setting such a run would not read refused with what to do instead, before anything loads."""

from __future__ import annotations

import pytest

from oxrl.config.load import ConfigError, load_config

MODEL = ["model.name_or_path=m"]
DEMOS = ["data.train=[{path: demos, format: lerobot}]"]
RL = MODEL + ["algorithm.name=grpo", "vla.env=reach"]


def test_a_behaviour_cloning_and_an_rl_config_load():
    sft = load_config(None, MODEL + DEMOS + ["algorithm.name=sft", "vla.bins=64", "vla.chunk=4"])
    assert sft.vla.bins == 64 and sft.vla.chunk == 4 and sft.data.train[0].format == "lerobot"
    grpo = load_config(None, RL + ["vla.max_chunks=8"])
    assert grpo.vla.env == "reach" and grpo.vla.max_chunks == 8 and grpo.vla.reward == "success"


@pytest.mark.parametrize("overrides, message", [
    (MODEL + DEMOS + ["algorithm.name=sft"], r"data.train\[0\] is a LeRobot dataset, which needs a `vla` section"),
    (MODEL + DEMOS + ["algorithm.name=dpo", "vla.bins=8"], r"read by `sft` \(behaviour cloning\) and the RL algorithms"),
    (MODEL + ["algorithm.name=sft", "data.train=[{path: chat.jsonl}]", "vla.bins=8"],
     r"every dataset needs format `lerobot` \(data.train\[0\]\)"),
    (MODEL + ["algorithm.name=grpo", "vla.bins=8"], r"runs episodes in a simulator: set vla.env"),
    (MODEL + ["algorithm.name=grpo", "vla.env=nowhere"], r"vla.env 'nowhere' is not a built-in environment \(reach, pusht, panda-push, panda-reach\)"),
    (RL + ["rl.task=arithmetic"], r"rl.task = 'arithmetic' is not read by `grpo`: it is read only without a `vla` section: its episodes start"),
    (RL + ["rl.rollout.max_new_tokens=64"], r"rl.rollout.max_new_tokens = 64 is not read by `grpo`: it is read only without a `vla` section: each of its turns"),
    (RL + ["rl.max_staleness=1", "rl.off_policy_correction=tis"], r"leave rl.max_staleness 0 and run.launcher local"),
    (RL + ["vla.binning=quantile"], r"vla.binning `quantile` takes its bins from demonstrations: set vla.stats"),
    (RL + ["vla.state_bins=100"], r"vla.state_bins = 100 takes the state's bounds from demonstrations: set vla.stats"),
    (MODEL + DEMOS + ["algorithm.name=sft", "vla.state=false", "vla.state_bins=100"],
     r"vla.state_bins = 100 writes the state, which vla.state false leaves out"),
    (RL + ["vla.chunk=2", "vla.execute=3"], r"vla.execute = 3: a chunk holds vla.chunk = 2 actions to execute"),
    (MODEL + DEMOS + ["algorithm.name=sft", "vla.chunk=4", "vla.execute=2"], r"vla.execute = 2 is not read by `sft`"),
    (MODEL + ["algorithm.name=grpo", "data.train=[{path: demos, format: lerobot}]", "vla.env=reach"],
     r"data.train = .* is not read by `grpo`: it is read only without a `vla` section: its episodes start from the "
     r"simulator's initial states"),
    (MODEL + DEMOS + ["algorithm.name=sft", "vla.binz=8"], r"unknown key `vla.binz`.*Did you mean `vla.bins`"),
])
def test_what_a_vla_run_would_not_read_is_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_quantile_bins_need_no_demonstrations_from_a_model_that_saved_its_own(tmp_path):
    (tmp_path / "action_tokens.json").write_text('{"first_id": 10, "chunk": 1, "edges": [[0, 1, 2]]}')
    cfg = load_config(None, [f"model.name_or_path={tmp_path}", "algorithm.name=grpo", "vla.env=reach",
                             "vla.binning=quantile"])
    assert cfg.vla.binning == "quantile" and cfg.vla.stats is None
