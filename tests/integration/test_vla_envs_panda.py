"""panda-gym's PandaPush as a built-in robot environment (`vla.env: panda-push`): PyBullet's physics with frames from
its CPU renderer (no display, no GL), and a scripted demonstrator that succeeds."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("panda_gym")

from oxrl.vla.build import VALIDATION_SEEDS, record_demonstrations
from oxrl.vla.envs import expert, make_env
from oxrl.vla.lerobot import read_dataset
from oxrl.vla.panda import PandaPushExpert

# Training and held-out reset seeds it finishes in 12-41 steps; 100 leaves room for small numeric differences
# between machines.
SEEDS = (0, 2, VALIDATION_SEEDS, VALIDATION_SEEDS + 1)
BUDGET = 100


@pytest.fixture(scope="module")
def env():
    env = make_env("panda-push")
    yield env
    env.close()


def test_an_observation_is_a_camera_frame_the_state_and_an_instruction(env):
    observation, task = env.reset(0)
    assert task == "push the cube onto the target"
    assert [image.size for image in observation.images] == [(96, 96)]
    # panda-gym's observation (gripper position and velocity, cube position, rotation, velocities: 18), the cube's
    # position and the target's, in the dict's key order: achieved_goal, desired_goal, observation
    assert observation.state.shape == (24,)
    assert np.allclose(observation.state[:3], env.info["object_pos"]) and np.allclose(observation.state[3:6], env.info["goal"])
    assert env.action_dim == 3 and env.low.tolist() == [-1.0] * 3 and env.high.tolist() == [1.0] * 3
    # the frame is drawn from the simulation: moving the arm down changes it
    first = np.asarray(observation.images[0], dtype=np.int16)
    for _ in range(3):
        transition = env.step(np.array([0.0, 0.0, -1.0]), "seed 0")
    assert np.abs(np.asarray(transition.observation.images[0], dtype=np.int16) - first).sum() > 0
    assert transition.reward == pytest.approx(-np.linalg.norm(env.info["object_pos"] - env.info["goal"]), abs=1e-6)


@pytest.mark.parametrize("seed", SEEDS)
def test_panda_push_expert_succeeds(env, seed):
    env.reset(seed)
    act = expert("panda-push")
    assert isinstance(act, PandaPushExpert)
    for step in range(BUDGET):
        action = act(env.info)
        assert action.shape == (3,) and np.all(np.abs(action) <= 1.0)
        transition = env.step(action, f"seed {seed}")
        if transition.success:
            assert np.linalg.norm(env.info["object_pos"] - env.info["goal"]) < 0.05
            return
        assert not transition.done, f"seed {seed}: the episode ended at step {step + 1} without success"
    distance = np.linalg.norm(env.info["object_pos"] - env.info["goal"])
    pytest.fail(f"seed {seed}: no success in {BUDGET} steps (the cube {distance:.3f} m from the target)")


def test_its_demonstrations_are_a_lerobot_dataset(tmp_path):
    folder, success = record_demonstrations("panda-push", 2, tmp_path / "panda", max_steps=60)
    assert success == 1.0  # reset seeds 0 and 1: done in 41 and 37 steps here
    dataset = read_dataset(folder)
    assert dataset.image_shapes["observation.image"] == (96, 96, 3)
    assert len(dataset.episodes) == 2 and all(10 < len(episode.frames) < 60 for episode in dataset.episodes)
    assert all(len(frame.action) == 3 and len(frame.state) == 24 for e in dataset.episodes for frame in e.frames)
