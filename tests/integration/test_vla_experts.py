"""The built-in simulators' scripted demonstrators succeed on the real simulators, within the steps a recording gives
them: PushT's (gym-pusht) ends with the block on the goal's pose (coverage > 95%), turned as well as moved;
panda-push's (panda-gym's PyBullet arm, frames from its CPU renderer) with the cube within 5 cm of the target,
panda-reach's (the same arm) with the gripper within 5 cm of its target."""

from __future__ import annotations

import numpy as np
import pytest

from oxrl.vla.build import VALIDATION_SEEDS, record_demonstrations
from oxrl.vla.envs import expert, make_env
from oxrl.vla.lerobot import read_dataset

PACKAGES = {"pusht": "gym_pusht", "panda-push": "panda_gym", "panda-reach": "panda_gym"}
# Training and held-out reset seeds each finishes in 33-51 (PushT) or 12-41 (panda-push) steps here; the budgets
# leave room for small numeric differences between machines (a PushT planner's tie can break the other way).
CASES = [("pusht", seed, 150) for seed in (0, 3, 22, VALIDATION_SEEDS + 22)] + \
        [("panda-push", seed, 100) for seed in (0, 2, VALIDATION_SEEDS, VALIDATION_SEEDS + 1)] + \
        [("panda-reach", seed, 20) for seed in (0, 2, VALIDATION_SEEDS, VALIDATION_SEEDS + 1)]


@pytest.fixture(scope="module")
def simulators():
    made = {}

    def simulator(name: str):
        pytest.importorskip(PACKAGES[name])
        if name not in made:
            made[name] = make_env(name)
        return made[name]

    yield simulator
    for env in made.values():
        env.close()


def how_far(name: str, info: dict) -> str:
    if name == "pusht":
        return f"coverage {info['coverage']:.3f}"
    moved = "the cube" if name == "panda-push" else "the gripper"  # (panda-reach's achieved goal is the gripper)
    return f"{moved} {np.linalg.norm(info['object_pos'] - info['goal']):.3f} m from the target"


@pytest.mark.parametrize(("name", "seed", "budget"), CASES)
def test_the_scripted_expert_succeeds(simulators, name, seed, budget):
    env = simulators(name)
    env.reset(seed)
    act = expert(name)
    for step in range(budget):
        action = act(env.info)
        assert action.shape == (env.action_dim,) and np.all((action >= env.low) & (action <= env.high))
        transition = env.step(action, f"seed {seed}")
        if transition.success:
            return
        assert not transition.done, f"{name} seed {seed}: the episode ended at step {step + 1} without success"
    pytest.fail(f"{name} seed {seed}: no success in {budget} steps ({how_far(name, env.info)})")


def test_each_episode_gets_its_own_expert():
    """PushT's and the arm's experts remember what they are doing, so `expert` makes a new one a call; reach's
    stays a plain function."""
    assert expert("pusht") is not expert("pusht")
    assert expert("panda-push") is not expert("panda-push")
    assert expert("reach") is expert("reach")


def test_a_panda_push_observation_is_a_camera_frame_the_state_and_an_instruction(simulators):
    env = simulators("panda-push")
    observation, task = env.reset(0)
    assert task == "push the cube onto the target"
    assert [image.size for image in observation.images] == [(96, 96)]
    # panda-gym's observation (gripper position and velocity, cube position, rotation, velocities: 18), the cube's
    # position and the target's, in the dict's key order: achieved_goal, desired_goal, observation
    assert observation.state.shape == (24,)
    assert np.allclose(observation.state[:3], env.info["object_pos"])
    assert np.allclose(observation.state[3:6], env.info["goal"])
    assert env.action_dim == 3 and env.low.tolist() == [-1.0] * 3 and env.high.tolist() == [1.0] * 3
    # the frame is drawn from the simulation: moving the arm down changes it
    first = np.asarray(observation.images[0], dtype=np.int16)
    for _ in range(3):
        transition = env.step(np.array([0.0, 0.0, -1.0]), "seed 0")
    assert np.abs(np.asarray(transition.observation.images[0], dtype=np.int16) - first).sum() > 0
    assert transition.reward == pytest.approx(-np.linalg.norm(env.info["object_pos"] - env.info["goal"]), abs=1e-6)


def test_a_panda_reach_observation_is_the_gripper_and_its_target(simulators):
    env = simulators("panda-reach")
    observation, task = env.reset(0)
    assert task == "move the gripper to the green target"
    assert [image.size for image in observation.images] == [(96, 96)]
    # achieved_goal (the gripper's position), desired_goal (the target's), observation (its position and velocity)
    assert observation.state.shape == (12,)
    assert np.allclose(observation.state[:3], env.info["ee_pos"]) and np.allclose(observation.state[6:9], env.info["ee_pos"])
    assert np.allclose(observation.state[3:6], env.info["goal"])
    transition = env.step(np.array([1.0, 0.0, 0.0]), "seed 0")
    assert transition.observation.state[0] > observation.state[0]  # the gripper moved along x
    assert transition.reward == pytest.approx(-np.linalg.norm(env.info["ee_pos"] - env.info["goal"]), abs=1e-6)


def test_panda_push_demonstrations_are_a_lerobot_dataset(tmp_path):
    pytest.importorskip("panda_gym")
    folder, success = record_demonstrations("panda-push", 2, tmp_path / "panda", max_steps=60)
    assert success == 1.0  # reset seeds 0 and 1: done in 41 and 37 steps here
    dataset = read_dataset(folder)
    assert dataset.image_shapes["observation.image"] == (96, 96, 3)
    assert len(dataset.episodes) == 2 and all(10 < len(episode.frames) < 60 for episode in dataset.episodes)
    assert all(len(frame.action) == 3 and len(frame.state) == 24 for e in dataset.episodes for frame in e.frames)
