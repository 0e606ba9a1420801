"""Every name and hyper-parameter is declared once: the config's choices are the registries' keys, each
`*Params` field is a config setting of the same name (or listed as derived), and a setting the chosen
algorithm does not read is refused, with the `ReadOnly` rules declared beside the settings checked against what
the losses really read."""

import dataclasses
import inspect
import re
import subprocess
import sys
import typing
from types import SimpleNamespace

import pytest
import torch

from oxrl.config import names
from oxrl.config.load import ConfigError, load_config, save_config
from oxrl.config.params import GIVEN, NOT_BY_NAME, params_from
from oxrl.loops.rl_update import loss_params
from oxrl.config.rl_presets import PRESETS, resolve
from oxrl.config.schema import (AlgorithmConfig, Config, ModelConfig, OnlineConfig, PreferenceConfig, RLConfig,
                                Section, rules_of, unread_settings)

# ----------------------------------------------------------------------------- choices


def test_schema_imports_no_torch():
    code = "import sys, oxrl.config.schema; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def _literals(annotation) -> list[tuple]:
    """The value tuples of every Literal inside `annotation` (unions and lists included)."""
    if typing.get_origin(annotation) is typing.Literal:
        return [typing.get_args(annotation)]
    return [found for arg in typing.get_args(annotation) for found in _literals(arg)]


def _sections(model=Config, seen=None) -> set[type]:
    seen = set() if seen is None else seen
    seen.add(model)
    for field in model.model_fields.values():
        for arg in (field.annotation, *typing.get_args(field.annotation)):
            for inner in (arg, *typing.get_args(arg)):
                if isinstance(inner, type) and issubclass(inner, Section) and inner not in seen:
                    _sections(inner, seen)
    return seen


# Literals not (yet) declared in oxrl.config.names: peft's own constant, and the data sections' (to move there).
NOT_DECLARED_IN_NAMES = {("LoraConfig", "target_modules"), ("DatasetSpec", "format"), ("DataConfig", "truncation")}


def test_every_literal_of_the_schema_is_a_tuple_of_names():
    declared = {value for value in vars(names).values() if isinstance(value, tuple)}
    for section in _sections():
        for key, field in section.model_fields.items():
            for choices in _literals(field.annotation):
                if (section.__name__, key) not in NOT_DECLARED_IN_NAMES:
                    assert choices in declared, f"{section.__name__}.{key}: Literal{list(choices)} is not in oxrl.config.names"


def test_the_registries_implement_exactly_the_declared_choices():
    from oxrl.algorithms.advantages import ADVANTAGES
    from oxrl.algorithms.kl import KL_ESTIMATORS
    from oxrl.config.schema import RL_PROMPT_FORMATS
    from oxrl.data.rl_prompts import ROW_CONVERTERS
    from oxrl.algorithms.policy_loss import AGGREGATIONS, OFF_POLICY_CORRECTIONS, POLICY_LOSSES
    from oxrl.data.rl_tasks import ANSWER_INSTRUCTIONS
    from oxrl.rollout.build import ENGINES
    from oxrl.rollout.vllm_engine import DEFAULT_TOLERANCE
    from oxrl.training.optim import DECAYS

    assert tuple(ADVANTAGES) == names.ADVANTAGE_ESTIMATORS
    assert tuple(POLICY_LOSSES) == names.POLICY_LOSS_NAMES
    assert tuple(AGGREGATIONS) == names.AGGREGATION_MODES
    assert OFF_POLICY_CORRECTIONS == names.OFF_POLICY_CORRECTIONS
    assert tuple(KL_ESTIMATORS) == names.KL_ESTIMATOR_NAMES
    assert tuple(ENGINES) == names.ROLLOUT_ENGINES
    assert ("constant", *DECAYS) == names.LR_SCHEDULES
    assert tuple(ANSWER_INSTRUCTIONS) == names.ANSWER_FORMATS
    assert ("auto", *DEFAULT_TOLERANCE) == names.DTYPES
    assert all(isinstance(getattr(torch, dtype), torch.dtype) for dtype in names.DTYPES[1:])  # models.load.resolve_dtype
    assert tuple(PRESETS) == names.RL_ALGORITHMS
    assert tuple(ROW_CONVERTERS) == RL_PROMPT_FORMATS
    online_readers = {field: rules_of(OnlineConfig, field)[0].by for field in OnlineConfig.model_fields}
    assert {reader for readers in online_readers.values() for reader in readers} == set(names.ONLINE)


def test_the_dispatches_handle_exactly_the_declared_choices():
    from oxrl.models.reference import build_reference
    from oxrl.rewards.combine import RewardSpec
    from oxrl.training.build import resolve_strategy_name

    # build_reference is an if-chain: its branches are the modes.
    assert set(re.findall(r'kind == "(\w+)"', inspect.getsource(build_reference))) == set(names.REFERENCE_MODES)
    for mode in names.REWARD_ERROR_MODES:
        RewardSpec("math", on_error=mode)
    with pytest.raises(ValueError, match="on_error"):
        RewardSpec("math", on_error="ignore")
    # `auto` stands for the others, whatever the world size.
    concrete = {resolve_strategy_name(name, world) for name in names.STRATEGY_NAMES for world in (1, 2)}
    assert concrete == set(names.STRATEGY_NAMES) - {"auto"}
    from oxrl.vla.action_tokens import ActionTokenizer
    from oxrl.vla.envs import BUILT_IN
    from oxrl.vla.episodes import episode_reward

    assert tuple(BUILT_IN) == names.ROBOT_ENVIRONMENTS
    # each binning is the ActionTokenizer constructor of its name; each episode reward a value of episode_reward
    assert all(callable(getattr(ActionTokenizer, binning, None)) for binning in names.ACTION_BINNINGS)
    episode = SimpleNamespace(success=True, reward=2.5, best=0.75)
    assert [episode_reward(episode, kind) for kind in names.EPISODE_REWARDS] == [1.0, 2.5, 0.75]


# ----------------------------------------------------------------------------- hyper-parameters by name


def _params_classes():
    from oxrl.algorithms.advantages import AdvantageParams
    from oxrl.algorithms.distill import DistillParams
    from oxrl.algorithms.kto import KTOParams
    from oxrl.algorithms.policy_loss import PolicyLossParams
    from oxrl.algorithms.preference import PREFERENCE_LOSSES

    pairwise = sorted({loss.params for loss in PREFERENCE_LOSSES.values()}, key=lambda params: params.__name__)
    return [(PolicyLossParams, RLConfig), (AdvantageParams, RLConfig), (KTOParams, PreferenceConfig),
            (DistillParams, PreferenceConfig), *((params, PreferenceConfig) for params in pairwise)]


@pytest.mark.parametrize("params_class, section", _params_classes(), ids=lambda c: c.__name__)
def test_every_params_field_is_a_setting_of_the_same_name_or_listed(params_class, section):
    special = NOT_BY_NAME.get(params_class.__name__, {})
    fields = {field.name: field for field in dataclasses.fields(params_class)}
    assert set(special) <= set(fields), "NOT_BY_NAME lists a field the dataclass does not have"
    for name, field in fields.items():
        if name in special:  # derived (kl_coef: the setting, or 0 when the KL is a reward penalty) or fixed
            continue
        assert name in section.model_fields, f"{params_class.__name__}.{name} is not a setting: expose it or list it"
        setting = section.model_fields[name]
        config_default = setting.get_default(call_default_factory=True)
        default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        if config_default is not None:
            assert config_default == default, f"{name}: the config's default differs from the dataclass's"
    if section is PreferenceConfig:  # derived values too: the default config gives the dataclass's defaults
        assert params_from(params_class, PreferenceConfig()) == params_class()


def test_a_params_field_that_is_neither_exposed_nor_listed_is_an_error():
    unexposed = dataclasses.make_dataclass("Unexposed", [("beta", float, 0.1), ("secret_knob", float, 1.0)])
    with pytest.raises(TypeError, match="Unexposed.secret_knob is neither a setting of PreferenceConfig"):
        params_from(unexposed, PreferenceConfig())


def test_a_setting_whose_rule_does_not_hold_is_not_read_into_its_field():
    from oxrl.algorithms.distill import DistillParams
    from oxrl.algorithms.policy_loss import PolicyLossParams

    # grpo's resolved section holding a value its rules refuse (no KL term): params_from alone cannot tell
    section = config("grpo").rl.model_copy(update={"kl_estimator": "k1", "eps_high": 0.3})
    assert params_from(PolicyLossParams, section, max_len=8).kl_estimator == "k1"
    skipped = params_from(PolicyLossParams, section, lambda rule: "rl.kl_coef" not in rule.shows, max_len=8)
    assert skipped.kl_estimator == "k3" and skipped.eps_high == 0.3  # the KL term's rule fails; eps_high's hold
    # A run reads through its own config: grpo has no KL term, so its estimator is never read.
    assert loss_params(config("grpo")).kl_estimator == "k3"
    assert loss_params(config("grpo", "rl.kl_coef=0.1", "rl.kl_estimator=k1")).kl_estimator == "k1"
    # kd_forward does not read kd_jsd's jsd_beta.
    jsd = PreferenceConfig(jsd_beta=0.9)
    assert params_from(DistillParams, jsd, lambda rule: "kd_forward" in rule.by).jsd_beta == 0.5
    assert params_from(DistillParams, jsd, lambda rule: "kd_jsd" in rule.by).jsd_beta == 0.9


def test_derived_values_come_from_the_listed_settings():
    from oxrl.algorithms.policy_loss import PolicyLossParams

    cfg = config("grpo", "rl.rollout.max_new_tokens=77", "rl.kl_coef=0.1", "rl.kl_in_reward=true")
    params = loss_params(cfg)
    assert params.max_len == 77 and params.kl_coef == 0.0  # a reward penalty: no loss term
    assert cfg.rl.kl_penalty_in_reward and not config("grpo", "rl.kl_coef=0.1").rl.kl_penalty_in_reward
    assert loss_params(config("grpo", "rl.kl_coef=0.1")).kl_coef == 0.1
    assert NOT_BY_NAME[type(params).__name__]["max_len"] is GIVEN
    with pytest.raises(TypeError, match="PolicyLossParams.max_len is given by the caller"):
        params_from(PolicyLossParams, cfg.rl)
    with pytest.raises(TypeError, match="eps_low not marked GIVEN"):
        params_from(PolicyLossParams, cfg.rl, max_len=8, eps_low=0.1)


# ----------------------------------------------------------------------------- clip bounds of every loss


def config(name: str, *overrides: str) -> Config:
    return load_config(None, ["model.name_or_path=m", f"algorithm.name={name}", *overrides])


@pytest.mark.parametrize("name, low, high", [("grpo", 0.2, 0.2), ("dapo", 0.2, 0.28), ("cispo", 1.0, 4.0),
                                             ("gspo", 3e-4, 4e-4)])
def test_eps_are_the_clip_bounds_of_whichever_loss_with_the_presets_defaults(name, low, high):
    params = loss_params(config(name))
    assert (params.eps_low, params.eps_high) == (low, high)
    params = loss_params(config(name, "rl.eps_low=0.5", "rl.eps_high=2.0"))
    assert (params.eps_low, params.eps_high) == (0.5, 2.0)  # the user's setting wins, under cispo and gspo too


# ----------------------------------------------------------------------------- unread settings


def test_a_setting_the_algorithm_does_not_read_is_a_config_error():
    with pytest.raises(ConfigError) as caught:
        config("grpo", "rl.gamma=0.9")
    assert ("rl.gamma = 0.9 is not read by `grpo` (rl.advantage is 'grpo'): it is read only by a policy-gradient "
            "update with rl.advantage `gae` (ppo)") in str(caught.value)
    with pytest.raises(ConfigError, match=r"rl.value_coef = 0.3 is not read by `ppo` \(.*rl.critic_backbone is 'separate'\): .* "
                       r"rl.critic_backbone `shared`"):
        config("ppo", "rl.value_coef=0.3")
    with pytest.raises(ConfigError, match=r"rl.critic_lr = 0.001 is not read by `ppo` \(.*rl.critic_backbone is 'shared'\): .* "
                       r"rl.critic_backbone `separate`"):
        config("ppo", "rl.critic_backbone=shared", "rl.critic_lr=1e-3")
    with pytest.raises(ConfigError, match=r"rl.kl_estimator = 'k1' is not read by `sgrpo` \(.*rl.kl_in_reward is True\): .* "
                       r"rl.kl_in_reward false"):
        config("sgrpo", "rl.kl_in_reward=true", "rl.kl_estimator=k1")
    with pytest.raises(ConfigError, match=r"rl.dual_clip = 3.0 is not read by `cispo` \(rl.policy_loss is 'cispo'\): .* "
                       r"rl.policy_loss `ppo`"):
        config("cispo", "rl.dual_clip=3")
    with pytest.raises(ConfigError, match="preference.beta = 0.5 is not read by `sft`: it is read only by dpo"):
        config("sft", "preference.beta=0.5")
    with pytest.raises(ConfigError, match="preference.jsd_beta = 0.3 is not read by `grpo`"):
        config("grpo", "preference.jsd_beta=0.3")
    # Read where the choice reads it: a user's choice of advantage counts, not only the preset's.
    assert config("grpo", "rl.advantage=gae", "rl.gamma=0.9").rl.gamma == 0.9
    assert config("ppo", "rl.critic_backbone=shared", "rl.value_coef=0.3").rl.value_coef == 0.3
    assert config("dpo", "preference.beta=0.5").preference.beta == 0.5


def test_the_rules_by_algorithm_name_real_algorithms():
    rules = {field: rules_of(PreferenceConfig, field) for field in PreferenceConfig.model_fields}
    assert all(len(found) == 1 and found[0].by for found in rules.values())  # every preference setting is objective-specific
    rules = {field: found[0] for field, found in rules.items()}
    assert all(set(rule.by) <= set(names.OFFLINE_ALGORITHMS) for rule in rules.values())
    assert all(set(rules_of(OnlineConfig, field)[0].by) <= set(names.ONLINE) for field in OnlineConfig.model_fields)


def _rules():
    """Every `ReadOnly` of the schema, with its section and field."""
    for section in _sections():
        for field in section.model_fields:
            for rule in rules_of(section, field):
                yield section, field, rule


def test_a_rule_names_each_changed_setting_and_a_section_keeps_its_own_switch():
    assert all(rule.reader for _, _, rule in _rules()) and len(list(_rules())) >= 60
    sft = config("sft")
    assert unread_settings(sft) == []
    lines = unread_settings(sft.model_copy(update={"lora": sft.lora.model_copy(update={"rank": 8})}))
    assert lines == ["lora.rank = 8 is not read by `sft`: it is read only with lora.enabled: true. Remove it, or set it "
                     "to its default, 16"]
    assert unread_settings(sft.model_copy(update={"lora": sft.lora.model_copy(update={"enabled": True})})) == []


def test_the_fix_an_unread_setting_is_told_loads():
    # Settings of several types, each unread by `sft`: an int, a string, a list, a float, a section set where its
    # default is null. The refusal gives, for each, the default to set; set as the message writes it, it loads.
    unread = ["lora.rank=4", "lora.target_modules=[q_proj]", "checkpoint.keep_last=5", "rl.rollout.n=2",
              "rl.kl_coef=0.1", "rl.env={path: env.py}", "preference.reference=precomputed"]
    with pytest.raises(ConfigError) as refused:
        config("sft", *unread)
    told = re.findall(r"- (\S+) = .*? is not read by `sft`: .*?Remove it, or set it to its default, (.+)", str(refused.value))
    assert sorted(key for key, _ in told) == sorted(setting.split("=")[0] for setting in unread)
    assert config("sft", *unread, *(f"{key}={default}" for key, default in told)) == config("sft")


@pytest.mark.parametrize("name", names.ALL_ALGORITHMS)
def test_a_saved_config_loads_again_and_resolving_twice_changes_nothing(name, tmp_path):
    overrides = ["preference.teacher=t"] if name.startswith("kd_") else []
    overrides += ["train.micro_batch_size_per_device=2"] if name == "kto" else []
    named_reward = {"rlhf": "reward_model", "rlaif": "judge"}.get(name)  # the reward these two are named after
    overrides += [f"rl.rewards=[{{name: {named_reward}}}]"] if named_reward else []
    cfg = config(name, *overrides)
    save_config(cfg, tmp_path / "config.yaml")  # every key, at its default where unused
    assert load_config(tmp_path / "config.yaml") == cfg
    if name in names.RL_ALGORITHMS:
        assert resolve(name, cfg.rl) == cfg.rl and cfg.rl.advantage == PRESETS[name]["advantage"]
    else:
        assert cfg.rl == RLConfig()  # only an RL algorithm fills the rl section


def test_every_way_of_building_a_config_resolves_rl():
    from oxrl import Trainer

    tree = {"model": {"name_or_path": "m"}, "algorithm": {"name": "cispo"}}
    assert Config.model_validate(tree).rl.eps_high == 4.0  # no rl section at all
    assert Trainer("m", algorithm="gspo").config().rl.eps_high == 4e-4
    cfg = Config.model_validate(tree)
    cfg.rl = RLConfig(kl_coef=0.1)  # assignment is validated too
    assert cfg.rl.policy_loss == "cispo" and cfg.rl.kl_coef == 0.1
    renamed = cfg.model_copy(update={"run": cfg.run.model_copy(update={"name": "x"})})  # the runner's copy
    assert renamed.rl == cfg.rl


# The rules against the code: a setting a rule says is not read under a choice must not change that choice's
# loss or advantages, and one it says is read must.


def _rl(**settings) -> Config:
    """A grpo config (built unvalidated, so that a setting it does not read stays to be found) with these `rl`
    settings over a resolved base."""
    base = {"advantage": "grpo", "policy_loss": "ppo", "aggregation": "token_mean", "eps_low": 0.2, "eps_high": 0.2,
            "kl_coef": 0.1}
    return Config.model_construct(model=ModelConfig(name_or_path="m"), algorithm=AlgorithmConfig(name="grpo"),
                                  rl=RLConfig(**{**base, **settings}))


@pytest.mark.parametrize("field, other", [("std_normalise", False), ("gamma", 0.5), ("lam", 0.3),
                                          ("whiten_advantages", False)])
def test_advantage_settings_are_read_exactly_where_their_rules_say(field, other):
    from oxrl.algorithms.advantages import ADVANTAGES, AdvantageParams, RolloutRewards

    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0]] * 3 + [[1, 1, 0, 0]] * 3)
    rewards = RolloutRewards(torch.randn(6, 4) * mask, mask, torch.tensor([0, 0, 0, 1, 1, 1]), torch.randn(6, 4))
    for name, estimator in ADVANTAGES.items():
        default, changed = estimator(rewards, AdvantageParams()), estimator(rewards, AdvantageParams(**{field: other}))
        moved = not torch.equal(default.advantages, changed.advantages)
        assert moved == (not unread_settings(_rl(advantage=name, **{field: other}))), (name, field)


@pytest.mark.parametrize("field, other", [("dual_clip", 1.3), ("kl_estimator", "k1"), ("eps_low", 0.5),
                                          ("eps_high", 0.5)])
def test_loss_settings_are_read_exactly_where_their_rules_say(field, other):
    from oxrl.algorithms.policy_loss import POLICY_LOSSES, PolicyLossInput, PolicyLossParams

    # Rows whose token and sequence ratios are 0.6 or 1.4 (so each bound binds somewhere), one advantage per row.
    ratio, advantage = torch.tensor([0.6, 1.4, 1.4, 0.6]), torch.tensor([-1.0, -1.0, 2.0, 2.0])
    old = torch.full((4, 5), -1.0)
    logprobs = old + ratio.log()[:, None] + torch.tensor([0.05, -0.05, 0.02, -0.02, 0.0])  # noise of mean 0
    ref = old - torch.rand(4, 5)
    inp = PolicyLossInput(logprobs, old, advantage[:, None].expand(4, 5), torch.ones(4, 5), 20.0, ref_logprobs=ref)
    for name, loss in POLICY_LOSSES.items():
        default, changed = loss(inp, PolicyLossParams(kl_coef=0.1)), loss(inp, PolicyLossParams(kl_coef=0.1, **{field: other}))
        moved = not torch.equal(default[0], changed[0])
        assert moved == (not unread_settings(_rl(policy_loss=name, **{field: other}))), (name, field)


def test_preference_settings_are_read_exactly_where_their_rules_say():
    from oxrl.algorithms.distill import DISTILL_LOSSES, DistillInput, DistillParams
    from oxrl.algorithms.preference import PREFERENCE_LOSSES, PreferenceInput
    from oxrl.loops.objectives import all_objectives
    from oxrl.algorithms.distill import DISTILL_OBJECTIVES

    torch.manual_seed(0)
    pairs = PreferenceInput(-torch.rand(4) * 9, -torch.rand(4) * 9, torch.tensor([3.0, 5, 2, 7]),
                            torch.tensor([4.0, 2, 6, 3]), -torch.rand(4) * 9, -torch.rand(4) * 9)
    others = {"beta": 0.5, "label_smoothing": 0.2, "rdpo_epsilon": 0.2, "simpo_gamma": 1.0, "orpo_lambda": 0.5,
              "ipo_length_normalise": True}
    declared = set()
    for name, (loss, params_class, _) in PREFERENCE_LOSSES.items():
        own = {field.name for field in dataclasses.fields(params_class)}
        declared |= own
        for field, other in others.items():
            # A pairwise loss's parameter class holds exactly the settings whose rule names the loss ...
            assert (field in own) == (name in rules_of(PreferenceConfig, field)[0].by), (name, field)
            if field in own:  # ... and the loss really reads each of them
                assert loss(pairs, params_class()).loss != loss(pairs, params_class(**{field: other})).loss, (name, field)
    assert declared == set(others)
    logits = DistillInput(torch.randn(5, 7), torch.randn(5, 7), torch.ones(5, dtype=torch.bool))
    for field, other in {"temperature": 2.0, "jsd_beta": 0.2}.items():
        for name, loss_name in DISTILL_OBJECTIVES.items():
            loss = DISTILL_LOSSES[loss_name]
            moved = loss(logits, DistillParams()).loss != loss(logits, DistillParams(**{field: other})).loss
            assert bool(moved) == (name in rules_of(PreferenceConfig, field)[0].by), (name, field)
    # The reference is built for exactly the objectives that compare against one (a KD teacher is not a reference).
    uses_reference = {name for name, objective in all_objectives().items() if objective.needs_reference}
    assert set(rules_of(PreferenceConfig, "reference")[0].by) == uses_reference - set(names.DISTILLATION)
    assert set(rules_of(PreferenceConfig, "reference")[0].by) >= {name for name, loss in PREFERENCE_LOSSES.items()
                                                                   if loss.needs_reference}


def test_the_reference_free_objectives_are_exactly_those_built_without_one():
    from oxrl.loops.objectives import all_objectives

    assert {name for name, objective in all_objectives().items() if not objective.needs_reference} == set(
        names.REFERENCE_FREE)


def test_the_completion_budget_under_vla_is_a_row_not_the_unread_max_new_tokens():
    # Each turn of a `vla` episode samples one action chunk, so rl.rollout.max_new_tokens is refused there, and a row
    # shorter than its default (256) is accepted: the episode's actions are bounded by the row (data.max_length).
    cfg = config("grpo", "vla.env=reach", "data.max_length=128")
    assert cfg.completion_tokens == 128 and loss_params(cfg).max_len == 128
    with pytest.raises(ConfigError, match="rl.rollout.max_new_tokens"):
        config("grpo", "vla.env=reach", "rl.rollout.max_new_tokens=8")
    text = config("grpo", "rl.rollout.max_new_tokens=77", "data.max_length=128")
    assert text.completion_tokens == 77 and loss_params(text).max_len == 77
    with pytest.raises(ConfigError, match=r"data.max_length \(64\) must exceed rl.rollout.max_new_tokens \(77\)"):
        config("grpo", "rl.rollout.max_new_tokens=77", "data.max_length=64")
