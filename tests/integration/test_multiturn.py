"""Multi-turn environments (RL2's `step` format): loading errors, the turn loop on a tiny random model,
masks on environment tokens, no re-tokenisation drift, fresh contexts, and a reward that rises."""

from pathlib import Path

import pytest
import torch

from oxrl.config.load import ConfigError, load_config
from oxrl.config.schema import Config
from oxrl.training.strategy import SingleDevice
from oxrl.data.types import RLPromptBatch
from oxrl.loops.rl import train_rl
from oxrl.loops.rl_update import score_logprobs
from oxrl.loops.rl import rollout_metrics
from oxrl.loops.rl import estimate, sample, score
from oxrl.loops.rl_update import completion_example
from oxrl.rollout.base import Completion, SamplingParams
from oxrl.rollout.hf import HFEngine
from oxrl.loops.multiturn import EnvLoadError, EnvStepError, load_environment, run_episodes
from tests.conftest import make_tiny_critic, make_tiny_llama, rl_handles
from tests.integration.test_rl_loop import prompts, rl_config
from tests.integration.test_rollout_hf import TinyTokenizer

ROOT = Path(__file__).resolve().parents[2]
ENV_TOKEN = 9  # what the test environments write: the word "9"


class WordTokenizer(TinyTokenizer):
    """TinyTokenizer plus `encode`: each whitespace-separated integer is one token id."""

    def encode(self, text, add_special_tokens=False):
        return [int(word) for word in text.split()]


class RecordingEngine:
    """Any engine, with every `generate` call's prompts and returned completions kept for inspection."""

    def __init__(self, engine):
        self.engine = engine
        self.calls: list[tuple[list[list[int]], list[Completion]]] = []
        self.offloads = 0

    def generate(self, prompts, params):
        out = self.engine.generate(prompts, params)
        self.calls.append(([list(p) for p in prompts], out))
        return out

    def sync_weights(self, model):
        return self.engine.sync_weights(model)

    def offload(self):
        self.offloads += 1
        self.engine.offload()


# Never done by itself (max_turns ends it); appends " 9 9" to the conversation; reward 0.5 a turn.
EXTENDING = '''
async def step(state, action, extra_info):
    return {"next_state": state + action + " 9 9", "reward": 0.5, "score": 0.0, "done": False,
            "extra_info": extra_info}
'''
# Turn 1 rewrites the history (a fresh context "7 7 7"); turn 2 ends the episode.
RESTARTING = '''
async def step(state, action, extra_info):
    turn = extra_info.get("turn", 0) + 1
    return {"next_state": "7 7 7", "reward": float(turn), "score": 1.0, "done": turn == 2,
            "extra_info": {"turn": turn}}
'''
# Reward: the share of the action's tokens that are 7, summed over two turns.
SEVENS = '''
async def step(state, action, extra_info):
    words = action.split()
    turn = extra_info.get("turn", 0) + 1
    share = sum(word == "7" for word in words) / max(1, len(words))
    return {"next_state": state + action + " 9", "reward": share, "score": share, "done": turn == 2,
            "extra_info": {"turn": turn}}
'''


def env_file(tmp_path: Path, source: str, name: str = "env.py") -> str:
    path = tmp_path / name
    path.write_text(source)
    return str(path)


def tiny_engine(seed: int = 0):
    model = make_tiny_llama(seed=seed)
    return model, RecordingEngine(HFEngine(model, WordTokenizer()))


PARAMS = SamplingParams(n=2, temperature=1.0, max_new_tokens=3)
PROMPTS = [[1, 3, 4], [1, 5]]


# ------------------------------------------------------------------------------------------------
# Loading and checking the environment


@pytest.mark.parametrize("source, reference_suffix, message", [
    ("async def step(s, a, x):\n    return {}\n", ":nope", "has no attribute 'nope'"),
    ("async def act(s, a, x):\n    return {}\n", "", "has no attribute 'step'"),
    ("def step(s, a, x):\n    return {}\n", "", "must be an `async def`"),
    ("async def step(state, action):\n    return {}\n", "", r"must take \(state, action, extra_info\)"),
    ("STEP = 3\nstep = STEP\n", "", "not a function"),
])
def test_bad_environment_files_fail_at_load_naming_the_file(tmp_path, source, reference_suffix, message):
    path = env_file(tmp_path, source)
    with pytest.raises(EnvLoadError, match=message) as caught:
        load_environment(path + reference_suffix, 2, WordTokenizer())
    assert "env.py" in str(caught.value)


def test_missing_environment_file_is_named(tmp_path):
    with pytest.raises(EnvLoadError, match=r"environment .*nowhere\.py.*not found"):
        load_environment(str(tmp_path / "nowhere.py"), 2, WordTokenizer())


def test_named_function_and_default_step_both_load(tmp_path):
    path = env_file(tmp_path, EXTENDING.replace("def step", "def my_step") + EXTENDING)
    assert load_environment(path, 2, WordTokenizer()).step.__name__ == "step"
    assert load_environment(f"{path}:my_step", 2, WordTokenizer()).step.__name__ == "my_step"


@pytest.mark.parametrize("returned, message", [
    ('{"next_state": "", "reward": 0.0, "done": False, "extra_info": x}', r"without key\(s\) \['score'\]"),
    ('{"next_state": "", "reward": "high", "score": 0.0, "done": False, "extra_info": x}', "reward='high'"),
    ('{"next_state": "", "reward": 0.0, "score": 0.0, "done": 1, "extra_info": x}', "done=1"),
    ('{"next_state": None, "reward": 0.0, "score": 0.0, "done": False, "extra_info": x}', "next_state=None"),
    ('[0.0]', "step returned a list"),
])
def test_wrong_step_results_name_the_file_and_the_key(tmp_path, returned, message):
    path = env_file(tmp_path, f"async def step(s, a, x):\n    return {returned}\n")
    env = load_environment(path, 2, WordTokenizer())
    _, engine = tiny_engine()
    with pytest.raises(EnvStepError, match=message) as caught:
        run_episodes(engine, env, PROMPTS, [{}, {}], PARAMS)
    assert "env.py" in str(caught.value)


def test_a_step_that_raises_is_reported_with_the_action(tmp_path):
    path = env_file(tmp_path, "async def step(s, a, x):\n    raise KeyError('answer')\n")
    _, engine = tiny_engine()
    with pytest.raises(EnvStepError, match=r"env\.py.*raised on turn 1 \(KeyError: 'answer'\)\n  action: ") as caught:
        run_episodes(engine, load_environment(path, 2, WordTokenizer()), PROMPTS, [{}, {}], PARAMS)
    assert isinstance(caught.value.__cause__, KeyError)


def test_env_and_rewards_together_is_a_config_error(tmp_path):
    base = {"model": {"name_or_path": "m"}, "algorithm": {"name": "grpo"}}
    with pytest.raises(ValueError, match="rl.env supplies the reward"):
        Config.model_validate({**base, "rl": {"env": {"path": "e.py"}, "rewards": [{"name": "math"}]}})
    with pytest.raises(ValueError, match="greater than 0"):
        Config.model_validate({**base, "rl": {"env": {"path": "e.py", "max_turns": 0}}})


# ------------------------------------------------------------------------------------------------
# The turn loop


def _episode_actions(engine: RecordingEngine, episode: int) -> list[Completion]:
    """The engine's completion for `episode` in every call, when no episode ends early."""
    return [completions[episode] for _, completions in engine.calls]


def test_extending_turns_form_one_sequence_with_env_tokens_masked(tmp_path):
    env = load_environment(env_file(tmp_path, EXTENDING), 3, WordTokenizer())
    _, engine = tiny_engine()
    episodes = run_episodes(engine, env, PROMPTS, [{}, {}], PARAMS)
    assert len(engine.calls) == 3 and [c.prompt_index for c in episodes.completions] == [0, 0, 1, 1]
    assert episodes.turns == [3, 3, 3, 3] and episodes.rewards == [1.5] * 4  # 3 turns x 0.5, the last step counts
    assert episodes.metrics()["turns/mean"] == 3.0
    for k, completion in enumerate(episodes.completions):
        a1, a2, a3 = (c.completion_ids for c in _episode_actions(engine, k))
        prompt = PROMPTS[completion.prompt_index]
        # One sequence: prompt, action 1, env text, action 2, env text, action 3.
        assert completion.completion_ids == a1 + [9, 9] + a2 + [9, 9] + a3
        assert completion.loss_mask == [True] * len(a1) + [False, False] + [True] * len(a2) + [False, False] + [True] * len(a3)
        assert completion.context_starts == []
        # The engine's turn-2 and turn-3 contexts were exactly the episode so far.
        assert engine.calls[1][0][k] == prompt + a1 + [9, 9]
        assert engine.calls[2][0][k] == prompt + a1 + [9, 9] + a2 + [9, 9]
        (sequence,) = completion_example(completion).sequences
        assert sequence.input_ids == prompt + completion.completion_ids
        assert [t for t, m in zip(sequence.input_ids, sequence.loss_mask) if m] == a1 + a2 + a3


def test_trained_ids_and_logprobs_are_the_engines_token_for_token(tmp_path):
    env = load_environment(env_file(tmp_path, EXTENDING), 3, WordTokenizer())
    model, engine = tiny_engine()
    episodes = run_episodes(engine, env, PROMPTS, [{}, {}], PARAMS)
    trainer = score_logprobs(model, episodes.completions, micro_size=3, temperature=1.0)
    tokenizer = WordTokenizer()
    for k, completion in enumerate(episodes.completions):
        actions = _episode_actions(engine, k)
        sampled = [t for a in actions for t in a.completion_ids]
        assert completion.sampled_ids == sampled
        assert completion.logprobs == [lp for a in actions for lp in a.logprobs]
        # The trainer scores the same tokens in the same contexts: its log-probs are the engine's.
        torch.testing.assert_close(trainer[k], torch.tensor(completion.logprobs), atol=1e-4, rtol=1e-4)
        # Re-tokenising the conversation's text would NOT give these ids ("1 3 4" + "57 ..." reads as 457):
        text = tokenizer.decode(PROMPTS[completion.prompt_index]) + "".join(
            a.text + " 9 9" for a in actions[:-1]) + actions[-1].text
        assert tokenizer.encode(text) != PROMPTS[completion.prompt_index] + completion.completion_ids


def test_a_state_that_does_not_extend_starts_a_fresh_context(tmp_path):
    env = load_environment(env_file(tmp_path, RESTARTING), 4, WordTokenizer())
    model, engine = tiny_engine()
    episodes = run_episodes(engine, env, PROMPTS, [{}, {}], PARAMS)
    assert episodes.turns == [2] * 4 and episodes.rewards == [3.0] * 4 and episodes.scores == [2.0] * 4
    assert episodes.metrics()["context_restarts/mean"] == 1.0
    trainer = score_logprobs(model, episodes.completions, micro_size=4, temperature=1.0)
    for k, completion in enumerate(episodes.completions):
        a1, a2 = (c.completion_ids for c in _episode_actions(engine, k))
        assert engine.calls[1][0][k] == [7, 7, 7]  # the engine sampled turn 2 from the fresh context alone
        assert completion.completion_ids == a1 + [7, 7, 7] + a2 and completion.context_starts == [len(a1)]
        first, second = completion_example(completion).sequences
        assert first.input_ids == PROMPTS[completion.prompt_index] + a1
        assert second.input_ids == [7, 7, 7] + a2 and second.loss_mask == [False] * 3 + [True] * len(a2)
        # Had the trainer kept turn 1 in view, turn 2's log-probs would differ from the engine's.
        torch.testing.assert_close(trainer[k], torch.tensor(completion.logprobs), atol=1e-4, rtol=1e-4)


def test_episodes_that_end_early_leave_the_batch(tmp_path):
    # Prompt 0's episodes end at turn 1, prompt 1's after two turns: turn 2 samples only two episodes.
    source = '''
async def step(state, action, extra_info):
    turn = extra_info.get("turn", 0) + 1
    return {"next_state": state + action + " 9", "reward": 1.0, "score": 0.0,
            "done": turn >= extra_info["turns"], "extra_info": {**extra_info, "turn": turn}}
'''
    env = load_environment(env_file(tmp_path, source), 5, WordTokenizer())
    _, engine = tiny_engine()
    episodes = run_episodes(engine, env, PROMPTS, [{"turns": 1}, {"turns": 2}], PARAMS)
    assert [len(prompts_) for prompts_, _ in engine.calls] == [2, 2]
    assert episodes.turns == [1, 1, 2, 2] and episodes.rewards == [1.0, 1.0, 2.0, 2.0]
    assert episodes.completions[0].loss_mask == [True] * len(episodes.completions[0].completion_ids)
    assert episodes.metrics() == {"turns/mean": 1.5, "turns/max": 2.0, "context_restarts/mean": 0.0}


# ------------------------------------------------------------------------------------------------
# The RL loop with an environment


def test_collect_compares_and_trains_only_sampled_tokens(tmp_path):
    env = load_environment(env_file(tmp_path, RESTARTING), 2, WordTokenizer())
    cfg = rl_config(tmp_path, "dr_grpo", epochs=2)  # several updates: the score stage takes the old log-probs
    model, engine = tiny_engine()
    h = rl_handles(cfg, model, engine, env=env)
    rollouts, metrics = sample(h, prompts(2), 1)
    score(h, rollouts)
    estimate(h, rollouts)
    metrics.update(rollout_metrics(rollouts))
    assert len(engine.calls) == 2 and engine.offloads == 1  # the engine frees memory once, after the last turn
    assert metrics["turns/mean"] == 2.0 and metrics["reward/mean"] == 3.0 and metrics["accuracy"] == 1.0
    assert metrics["logprob_mismatch/mean_abs"] < 1e-4
    for completion, old, advantage in zip(rollouts.completions, rollouts.old_logprobs, rollouts.advantages):
        assert old.numel() == advantage.numel() == completion.num_sampled == len(completion.completion_ids) - 3
    assert metrics["response_length/mean"] == sum(c.num_sampled for c in rollouts.completions) / len(rollouts.completions)


@pytest.mark.parametrize("algorithm", ["dr_grpo", "ppo"])
def test_strict_on_policy_holds_for_multi_turn_episodes(tmp_path, algorithm):
    """The engine/trainer checks (mean log-prob gap, first ratio) pass: they see sampled tokens only."""
    env = load_environment(env_file(tmp_path, RESTARTING), 2, WordTokenizer())
    cfg = rl_config(tmp_path, algorithm, strict_on_policy=True)
    cfg.train.max_steps = 2
    model = make_tiny_llama()
    critic = make_tiny_critic() if algorithm == "ppo" else None
    h = rl_handles(cfg, model, HFEngine(model, WordTokenizer()), strategy=SingleDevice(torch.device("cpu"), "no"),
                   critic_model=critic, env=env)
    result = train_rl(h, prompts(), RLPromptBatch([], [], [], []), tmp_path / algorithm)
    assert result.final_metrics["turns/mean"] == 2.0


def test_env_reward_goes_up_over_training(tmp_path):
    env = load_environment(env_file(tmp_path, SEVENS), 2, WordTokenizer())
    cfg = rl_config(tmp_path, "dr_grpo")
    model = make_tiny_llama()
    result = train_rl(rl_handles(cfg, model, HFEngine(model, WordTokenizer()), env=env), prompts(),
                      RLPromptBatch([], [], [], []), tmp_path / "sevens")
    first, last = sum(result.rewards[:4]) / 4, sum(result.rewards[-4:]) / 4  # rewards lie in [0, 2]
    assert last > first + 0.4, result.rewards


# ------------------------------------------------------------------------------------------------
# The example calculator environment and config


def _calculator():
    import importlib.util

    spec = importlib.util.spec_from_file_location("calculator_example", ROOT / "examples/envs/calculator.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("expression, value", [
    ("12*7", 84), ("(1+2)*3", 9), ("-3 + 5", 2), ("2**3", 8), ("7/2", 3.5), ("--4", 4), ("1.5*2", 3.0),
])
def test_calculator_evaluates_plain_arithmetic(expression, value):
    assert _calculator().evaluate(expression) == value


@pytest.mark.parametrize("expression", [
    "__import__('os').system('true')", "x + 1", "(1).real", "[1, 2]", "True + 1", "1 if 1 else 2", "'a' * 3",
    "2**100", "9" * 14, "1/0", "(-8) ** 0.5", "1" + "+1" * 70, "abs(-1)", "1 < 2",
])
def test_calculator_rejects_everything_else(expression):
    calculator = _calculator()
    with pytest.raises(calculator.CalculatorError):
        calculator.evaluate(expression)


def test_calculator_step_answers_calls_and_scores_answers():
    import asyncio

    calculator = _calculator()
    call = asyncio.run(calculator.step("Q: ", "Let me compute <calc>12*7</calc>", {"answer": "84"}))
    assert call["next_state"] == "Q: Let me compute <calc>12*7</calc><result>84</result>\n" and not call["done"]
    bad = asyncio.run(calculator.step("Q: ", "<calc>os.system('x')</calc>", {"answer": "84"}))
    assert bad["next_state"].endswith("<result>error: only numbers, + - * / ** and parentheses are allowed, not Call</result>\n")
    right = asyncio.run(calculator.step("Q: ", "So \\boxed{84}.", {"answer": "84"}))
    wrong = asyncio.run(calculator.step("Q: ", "So \\boxed{85}.", {"answer": "84"}))
    assert (right["done"], right["reward"], right["score"]) == (True, 1.0, 1.0)
    assert (wrong["done"], wrong["reward"]) == (True, 0.0)


class ScriptedEngine:
    """A RolloutEngine that "samples" given token ids, one list per call: the loop needs only the interface."""

    def __init__(self, tokenizer, turns: list[list[int]]):
        self.tokenizer, self.turns, self.prompts = tokenizer, turns, []

    def generate(self, prompts, params):
        ids = self.turns[len(self.prompts)]
        self.prompts.append([list(p) for p in prompts])
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return [Completion(i, list(p), list(ids), [-1.0] * len(ids), "stop", text)
                for i, p in enumerate(prompts) for _ in range(params.n)]


def test_calculator_episode_with_the_real_tokenizer(smollm2_tokenizer):
    tok = smollm2_tokenizer
    prompt = list(tok.apply_chat_template([{"role": "user", "content": "What is 12*7?"}], add_generation_prompt=True,
                                          tokenize=True, return_dict=True)["input_ids"])
    call = tok.encode("I will use <calc>12*7</calc>", add_special_tokens=False)
    answer = tok.encode("So \\boxed{84}.", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    engine = ScriptedEngine(tok, [call, answer])
    env = load_environment(str(ROOT / "examples/envs/calculator.py"), 3, tok)
    episodes = run_episodes(engine, env, [prompt], [{"answer": "84"}], SamplingParams(n=1, max_new_tokens=16))
    result = tok.encode("<result>84</result>\n", add_special_tokens=False)
    (completion,) = episodes.completions
    assert tok.decode(result) == "<result>84</result>\n"
    assert completion.completion_ids == call + result + answer
    assert completion.loss_mask == [True] * len(call) + [False] * len(result) + [True] * len(answer)
    assert engine.prompts[1] == [prompt + call + result]  # turn 2 continues the same assistant message
    assert (episodes.rewards, episodes.scores, episodes.turns) == ([1.0], [1.0], [2])


def test_calculator_example_config_loads_its_environment():
    cfg = load_config(ROOT / "examples/grpo_smollm2_calculator.yaml")
    assert cfg.rl.env is not None and cfg.rl.rollout.stop == ["</calc>"]
    env = load_environment(str(ROOT / cfg.rl.env.path), cfg.rl.env.max_turns, WordTokenizer())
    assert env.max_turns == 3 and env.reference.endswith("calculator.py:step")
    with pytest.raises(ConfigError, match="rl.env.max_turn"):
        load_config(ROOT / "examples/grpo_smollm2_calculator.yaml", ["rl.env.max_turn=2"])
