"""VLA episodes (oxrl/vla/episodes.py) on a tiny random Qwen2-VL and the built-in `reach` simulator: the trainer
scores every turn exactly as the engine sampled it (each turn's own frames), decoding never leaves the action
tokens, a group starts from one initial state, and a bad episode stops with an error naming its step."""

from __future__ import annotations

from dataclasses import replace

import gymnasium as gym
import numpy as np
import pytest
import torch

from oxrl.data.rl_tasks import encode_prompts
from oxrl.loops.rl_update import completion_example, score_logprobs
from oxrl.rollout.base import Completion, SamplingParams
from oxrl.rollout.hf import HFEngine
from oxrl.vla.action_tokens import ActionTokenizer, last_vocabulary_ids
from oxrl.vla.envs import ReachEnv, RobotEnv, RobotEnvError, expert, make_env
from oxrl.vla.episodes import EpisodeError, Prompter, VLAEpisodes, initial_prompts
from tests.vlm_fixtures import save_tiny_qwen2_vl

BINS = 16


@pytest.fixture(scope="module")
def vlm(tmp_path_factory, smollm2_tokenizer):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    folder = save_tiny_qwen2_vl(tmp_path_factory.mktemp("vla"), smollm2_tokenizer)
    return AutoModelForImageTextToText.from_pretrained(folder).eval(), AutoProcessor.from_pretrained(folder)


def runner(processor, make=lambda: make_env("reach"), max_chunks: int = 4, chunk: int = 1,
           execute: int | None = None) -> VLAEpisodes:
    tokens = ActionTokenizer.uniform([-1, -1], [1, 1], BINS, last_vocabulary_ids(processor.tokenizer, BINS), chunk)
    return VLAEpisodes("reach", make, tokens, Prompter(processor.tokenizer, processor), max_chunks, execute=execute)


def prompts(run: VLAEpisodes, seeds: list[int]):
    env = run.make_env()
    return encode_prompts(initial_prompts(env, run.prompter, seeds, "reach"), run.prompter.tokenizer,
                          processor=run.prompter.processor)


def test_the_trainer_scores_every_turn_of_an_episode_as_the_engine_sampled_it(vlm):
    model, processor = vlm
    run = runner(processor)
    batch = prompts(run, [0, 1])
    torch.manual_seed(0)
    episodes = run.run(HFEngine(model, processor.tokenizer), batch, SamplingParams(n=3))
    assert [c.prompt_index for c in episodes.completions] == [0, 0, 0, 1, 1, 1]
    several = [c for c in episodes.completions if c.context_starts]
    assert several, "some episode must run more than one chunk"
    for completion, turns in zip(episodes.completions, episodes.turns):
        assert len(completion.context_starts) == len(completion.context_vision) == turns - 1
        sampled = [i for i, keep in zip(completion.completion_ids, completion.loss_mask) if keep]
        assert len(sampled) == 2 * turns and set(sampled) <= set(run.tokens.token_ids)
        example = completion_example(completion)
        assert len(example.sequences) == turns  # one sequence per turn, each with its own frame
        assert all(sequence.vision is not None for sequence in example.sequences)
    scored = score_logprobs(model, episodes.completions, 4, 1.0)
    for completion, trainer in zip(episodes.completions, scored):
        assert torch.allclose(torch.tensor(completion.logprobs), trainer, atol=1e-5)
    # Each turn's frames matter: scoring the later turns with the first frame instead gives other log-probs.
    wrong = [replace(c, context_vision=[c.vision] * len(c.context_starts)) for c in several]
    moved = score_logprobs(model, wrong, 4, 1.0)
    assert any(not torch.allclose(a, b, atol=1e-5) for a, b in zip(moved, score_logprobs(model, several, 4, 1.0)))


def test_rewards_are_success_and_a_group_shares_its_initial_state(vlm):
    model, processor = vlm
    run = runner(processor, max_chunks=6)
    batch = prompts(run, [3])
    torch.manual_seed(1)
    episodes = run.run(HFEngine(model, processor.tokenizer), batch, SamplingParams(n=8))
    assert episodes.rewards == episodes.scores and set(episodes.rewards) <= {0.0, 1.0}
    assert {tuple(c.prompt_ids) for c in episodes.completions} == {tuple(batch.prompt_ids[0])}
    # replaying each episode's decoded actions in a fresh environment from the same seed gives its outcome
    for completion, reward in zip(episodes.completions, episodes.rewards):
        env = make_env("reach")
        env.reset(3)
        ids = [i for i, keep in zip(completion.completion_ids, completion.loss_mask) if keep]
        success = False
        for turn in range(len(ids) // 2):
            success = success or env.step(run.tokens.decode(ids[2 * turn: 2 * turn + 2])[0], "replay").success
        assert float(success) == reward


def test_a_receding_horizon_steps_the_first_actions_of_each_chunk_and_trains_only_them(vlm):
    """vla.chunk 3, vla.execute 1: each turn samples 3 actions (6 tokens), the simulator steps the first, and the
    policy samples again from the frame then; the episode keeps the 2 tokens of the action it stepped, which the
    trainer scores as the engine sampled them."""
    model, processor = vlm
    run = runner(processor, max_chunks=5, chunk=3, execute=1)
    batch = prompts(run, [3])
    torch.manual_seed(2)
    episodes = run.run(HFEngine(model, processor.tokenizer), batch, SamplingParams(n=4))
    for completion, reward, turns in zip(episodes.completions, episodes.rewards, episodes.turns):
        example = completion_example(completion)
        assert len(example.sequences) == turns
        assert all(sum(sequence.loss_mask) == 2 for sequence in example.sequences)  # one action of 2 dimensions a turn
        # Replaying only each chunk's first action from the same seed gives the episode's outcome and length.
        env = make_env("reach")
        env.reset(3)
        trained = [i for i, keep in zip(completion.completion_ids, completion.loss_mask) if keep]
        assert len(trained) == 2 * turns
        success = False
        for turn in range(turns):
            chunk = run.tokens.decode(trained[2 * turn: 2 * turn + 2] + [run.tokens.first_id] * 4)
            success = success or env.step(chunk[0], "replay").success
        assert float(success) == reward

    scored = score_logprobs(model, episodes.completions, 4, 1.0)
    for completion, trainer in zip(episodes.completions, scored):
        assert torch.allclose(torch.tensor(completion.logprobs), trainer, atol=1e-5)


def test_decoding_is_held_to_the_action_tokens_greedy_and_sampled(vlm):
    model, processor = vlm
    run = runner(processor)
    batch = prompts(run, [0, 1, 2])
    engine = HFEngine(model, processor.tokenizer)
    for temperature in (0.0, 1.0):
        params = run.params(SamplingParams(n=4, temperature=temperature, top_k=5))
        for completion in engine.generate(batch.prompt_ids, params, batch.vision):
            assert len(completion.completion_ids) == 2 and set(completion.completion_ids) <= set(run.tokens.token_ids)
    unconstrained = engine.generate(batch.prompt_ids, SamplingParams(n=4, max_new_tokens=2), batch.vision)
    assert any(not set(c.completion_ids) <= set(run.tokens.token_ids) for c in unconstrained)


class TextEngine:
    """An engine that ignores `allowed_token_ids` (a broken or foreign engine)."""

    def generate(self, prompts, params, vision=None):
        return [Completion(i, list(p), [17, 18], [-1.0, -1.0], "length", "xy") for i, p in enumerate(prompts)
                for _ in range(params.n)]


class Exploding(ReachEnv):
    def step(self, action):
        raise RuntimeError("the gripper broke")


class Resizing(ReachEnv):
    def step(self, action):
        observation, *rest = super().step(action)
        observation["pixels"] = np.zeros((16, 16, 3), np.uint8)
        return (observation, *rest)


class Unseeded(ReachEnv):
    def reset(self, *, seed=None, options=None):
        return super().reset(seed=int(np.random.randint(1 << 30)), options=options)


def test_a_bad_episode_stops_with_an_error_naming_its_step(vlm):
    model, processor = vlm
    run = runner(processor)
    batch = prompts(run, [5])
    with pytest.raises(EpisodeError, match=r"episode of seed 5, chunk 1: the engine sampled a non-action chunk: token 17"):
        run.run(TextEngine(), batch, SamplingParams(n=1))
    engine = HFEngine(model, processor.tokenizer)
    broken = runner(processor, lambda: RobotEnv(Exploding(), "exploding"))
    with pytest.raises(EpisodeError, match=r"simulator raised at episode of seed 5, chunk 1, action 0: RuntimeError: "
                                           r"the gripper broke"):
        broken.run(engine, batch, SamplingParams(n=1))
    resized = runner(processor, lambda: RobotEnv(Resizing(), "resizing"))
    with pytest.raises(RobotEnvError, match=r"episode of seed 5, chunk 1, action 0: frames of shape \[\(16, 16, 3\)\], "
                                            r"but the episode began with \[\(32, 32, 3\)\]"):
        resized.run(engine, batch, SamplingParams(n=1))
    unseeded = runner(processor, lambda: RobotEnv(Unseeded(), "unseeded"))
    with pytest.raises(EpisodeError, match="must be deterministic given its reset seed"):
        unseeded.run(engine, batch, SamplingParams(n=1))


def test_an_environment_that_is_not_a_robot_is_refused_by_name():
    with pytest.raises(RobotEnvError, match="not a built-in environment"):
        make_env("walker")
    with pytest.raises(RobotEnvError, match="1-D Box"):
        RobotEnv(gym.make("CartPole-v1"), "cartpole")
    env = RobotEnv(ReachEnv(), "reach")
    env.reset(0)
    with pytest.raises(RobotEnvError, match=r"no camera frame .* it has \['state'\]"):
        env.observation({"state": np.zeros(2)}, "step 3")


def test_pusht_runs_headless_as_a_robot_environment(vlm, tmp_path):
    from oxrl.vla.build import record_demonstrations
    from oxrl.vla.lerobot import read_dataset

    model, processor = vlm
    env = make_env("pusht")
    observation, task = env.reset(0)
    assert task == "push the T-shaped block onto the T-shaped target"
    assert observation.images[0].size == (96, 96) and observation.state.shape == (2,)
    assert env.action_dim == 2 and env.low.tolist() == [0.0, 0.0] and env.high.tolist() == [512.0, 512.0]
    posed = make_env("pusht", {"block_pose": True})  # the block's pose after the agent's position
    pose = posed.reset(0)[0].state
    assert pose[:2].tolist() == observation.state.tolist() and pose[2:].tolist() == posed.info["block_pose"].tolist()
    moved = posed.step(np.array([200.0, 200.0]), "step 1").observation.state
    assert moved[2:].tolist() == posed.info["block_pose"].tolist() and -np.pi <= moved[4] < np.pi
    relative = make_env("pusht", {"relative": 96})  # actions as offsets from the agent: zero stands still
    start = relative.reset(0)[0].state
    assert relative.low.tolist() == [-96.0, -96.0] and relative.high.tolist() == [96.0, 96.0]
    assert np.allclose(relative.step(np.zeros(2), "step 1").observation.state, start)
    assert relative.step(np.array([90.0, 0.0]), "step 2").observation.state[0] > start[0] + 1
    offset, target = expert("pusht", {"relative": 96})(relative.info), expert("pusht")(relative.info)
    with pytest.raises(RobotEnvError, match="relative = 0: pusht's reach must be a positive number of pixels"):
        make_env("pusht", {"relative": 0})
    assert np.allclose(offset, np.clip(target - relative.info["pos_agent"], -96, 96))
    folder, _ = record_demonstrations("pusht", 2, tmp_path / "pusht", max_steps=5)
    dataset = read_dataset(folder)
    assert [len(e.frames) for e in dataset.episodes] == [5, 5] and dataset.image_shapes["observation.image"] == (96, 96, 3)
    tokens = ActionTokenizer.uniform(env.low, env.high, BINS, last_vocabulary_ids(processor.tokenizer, BINS))
    run = VLAEpisodes("pusht", lambda: make_env("pusht"), tokens, Prompter(processor.tokenizer, processor), 3, "env")
    episodes = run.run(HFEngine(model, processor.tokenizer), prompts(run, [0]), SamplingParams(n=2))
    assert episodes.turns == [3, 3] and all(0.0 <= reward <= 3.0 for reward in episodes.rewards)


@pytest.mark.parametrize("name", ["panda-push", "panda-reach"])
def test_panda_gym_runs_headless_as_a_robot_environment(vlm, name):
    """One policy episode on panda-gym's PyBullet arm: 3 chunks sampled from the frames, scored by its dense reward."""
    pytest.importorskip("panda_gym")
    model, processor = vlm
    env = make_env(name)
    low, high = env.low, env.high
    env.close()
    tokens = ActionTokenizer.uniform(low, high, BINS, last_vocabulary_ids(processor.tokenizer, BINS))
    run = VLAEpisodes(name, lambda: make_env(name), tokens, Prompter(processor.tokenizer, processor), 3, "env")
    episodes = run.run(HFEngine(model, processor.tokenizer), prompts(run, [0]), SamplingParams(n=2))
    # minus the cube's (the gripper's) distance to the target, summed over 3 steps: it starts within 0.5 m of it
    assert episodes.turns == [3, 3] and all(-1.5 <= reward < 0.0 for reward in episodes.rewards)


def test_panda_gym_draws_only_the_frames_the_policy_sees_and_plays_the_same_episodes(vlm):
    """Drawing a frame is most of a panda-gym step: an episode draws one at reset and one after each chunk that a next
    chunk follows, not one after every action, and plays the episodes of a runner that films (draws every frame)."""
    pytest.importorskip("panda_gym")
    from oxrl.vla.panda import PandaFrames, make_panda

    model, processor = vlm
    drawn = []

    class Counted(gym.Wrapper):
        def render(self):
            drawn.append(1)
            return self.env.render()

    def make():
        return RobotEnv(PandaFrames(Counted(make_panda("panda-reach").env)), "panda-reach", "reach the target")

    env = make()
    tokens = ActionTokenizer.uniform(env.low, env.high, BINS, last_vocabulary_ids(processor.tokenizer, BINS), 4)
    env.close()
    played, frames = {}, {}
    for filming in (False, True):
        run = VLAEpisodes("panda-reach", make, tokens, Prompter(processor.tokenizer, processor), 3, "env",
                          films=[] if filming else None)
        batch = prompts(run, [0, 1])
        drawn.clear()
        played[filming] = run.run(HFEngine(model, processor.tokenizer), batch, SamplingParams(n=2, temperature=0))
        frames[filming] = len(drawn)
    seen, filmed = played[False], played[True]
    assert [c.completion_ids for c in seen.completions] == [c.completion_ids for c in filmed.completions]
    assert seen.rewards == filmed.rewards and seen.turns == filmed.turns == [3] * 4 and not any(seen.scores)
    assert frames[False] == 4 * (1 + 2)  # reset, then after chunks 1 and 2 of 3
    assert frames[True] == 4 * (1 + 3 * 4)  # reset, then after every action


class TwoCameras(ReachEnv):
    """`reach` with a second camera (the first one's frame mirrored), as a wrist camera beside a scene camera."""

    def _observation(self) -> dict:
        observation = super()._observation()
        return {**observation, "wrist": observation["pixels"][:, ::-1].copy()}


def test_every_camera_of_an_observation_is_in_the_prompt_and_scored(vlm):
    model, processor = vlm
    run = runner(processor, lambda: RobotEnv(TwoCameras(), "two-cameras"))
    batch = prompts(run, [0])
    assert len(batch.vision[0].images) == 2
    assert "state: " in processor.tokenizer.decode(batch.prompt_ids[0])  # the state follows the instruction
    torch.manual_seed(2)
    episodes = run.run(HFEngine(model, processor.tokenizer), batch, SamplingParams(n=2))
    for completion, trainer in zip(episodes.completions, score_logprobs(model, episodes.completions, 4, 1.0)):
        assert all(len(vision.images) == 2 for vision in completion.context_vision)
        assert torch.allclose(torch.tensor(completion.logprobs), trainer, atol=1e-5)


def test_a_first_prompt_leaves_one_action_chunk_of_the_row_and_a_row_that_cannot_hold_one_is_refused(vlm):
    from types import SimpleNamespace

    from oxrl.config.load import load_config
    from oxrl.data.errors import DataError
    from oxrl.loops.rl_setup import read_prompts

    _, processor = vlm
    one_process = SimpleNamespace(shards_parameters=False, world_size=1)

    def read(max_length: int):
        cfg = load_config(None, ["model.name_or_path=m", "algorithm.name=grpo", "vla.env=reach", f"vla.bins={BINS}",
                                 "rl.task_size=2", "rl.validation_size=0", f"data.max_length={max_length}"])
        return read_prompts(cfg, one_process, processor.tokenizer, processor)

    env, train, _, _ = read(2048)
    chunk, longest = env.turn_tokens, max(len(ids) for ids in train.prompt_ids)
    assert chunk == 2  # reach's two joints, one action a chunk: not rl.rollout.max_new_tokens, which is not read
    assert read(longest + chunk)[1].prompt_ids == train.prompt_ids  # the row holds the prompt and one chunk
    with pytest.raises(DataError, match=rf"more than the {longest - 1} that data.max_length leaves after the "
                                        rf"completion \(an action chunk's {chunk} tokens"):
        read(longest + chunk - 1)
    with pytest.raises(ValueError, match=rf"data.max_length \({chunk}\) must exceed an action chunk's {chunk} tokens"):
        read(chunk)
