"""panda-gym's Franka Panda arm (`pip install 'panda-gym>=3.0.7'`), simulated by PyBullet. The frames come from
PyBullet's TinyRenderer, which draws on a CPU with no display or GL, so it runs headless anywhere.

- `vla.env: panda-push` (PandaPush): the arm, its gripper held closed, pushes a 4 cm cube across a table onto a
  target 15 cm or so away. The state is panda-gym's observation (the gripper's position and velocity, the cube's
  position, rotation and velocities), the cube's position and the target's. Success: the cube within 5 cm of the
  target.
- `vla.env: panda-reach` (PandaReach): the gripper moves to a target point drawn in a 30 cm cube above the table
  (x, y within 15 cm of its centre, 0-30 cm up). The state is the gripper's position and velocity, its position again
  (panda-gym's achieved goal) and the target's. Success: the gripper within 5 cm of the target.

The action is the gripper's displacement (x, y, z in [-1, 1], 5 cm at 1). The reward is panda-gym's dense one,
minus the distance to success (`vla.env_kwargs: {reward_type: sparse}` for -1 until success).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from oxrl.dependencies import require

# A camera in front of the table, looking down at 60 degrees: the cube and the target, with the gripper above.
CAMERA = {"render_distance": 0.6, "render_yaw": 90.0, "render_pitch": -60.0, "render_target_position": np.zeros(3)}


class PandaFrames(gym.Wrapper):
    """Adds the camera frame to each observation and, for the scripted demonstrator, the gripper's, the cube's
    and the target's positions to `info`. A step draws its frame only while `draw_frames` is true: drawing is 33 of
    a step's 34 ms here, and an episode's policy sees only the frame after each chunk's last action
    (`RobotEnv.step(observe=...)` sets it)."""

    draw_frames = True

    def reset(self, **kwargs):
        observation, info = self.env.reset(**kwargs)
        return self._frame(observation), self._positions(info)

    def step(self, action):
        observation, reward, terminated, truncated, info = self.env.step(action)
        if self.draw_frames:
            observation = self._frame(observation)
        return observation, reward, terminated, truncated, self._positions(info)

    def _frame(self, observation: dict) -> dict:
        return {"pixels": self.env.render(), **observation}

    def _positions(self, info: dict) -> dict:
        sim = self.env.unwrapped
        return {**info, "is_success": bool(info["is_success"]), "ee_pos": sim.robot.get_ee_position(),
                "object_pos": sim.task.get_achieved_goal(), "goal": sim.task.goal.copy()}


# vla.env -> (panda-gym's environment id, the default most steps of an episode: the push's twice panda-gym's 50)
PANDA_TASKS = {"panda-push": ("PandaPush-v3", 100), "panda-reach": ("PandaReach-v3", 50)}


def make_panda(name: str, width: int = 96, height: int = 96, max_episode_steps: int | None = None,
               reward_type: str = "dense", **kwargs) -> gym.Env:
    """The built-in `name` (a key of PANDA_TASKS), its frames `width` x `height`, at most `max_episode_steps`."""
    require("panda_gym", "panda-gym", f"vla.env `{name}`")
    import panda_gym  # noqa: F401  (registers PandaPush-v3 and PandaReach-v3)

    env_id, default_steps = PANDA_TASKS[name]
    max_episode_steps = default_steps if max_episode_steps is None else max_episode_steps
    env = gym.make(env_id, render_mode="rgb_array", renderer="Tiny", render_width=width,
                   render_height=height, reward_type=reward_type, max_episode_steps=max_episode_steps,
                   **{**CAMERA, **kwargs})
    return PandaFrames(env)


def panda_reach_expert(info: dict) -> np.ndarray:
    """The scripted demonstrator of `panda-reach`: straight at the target, at full speed until the last 5 cm. It
    succeeds on all of reset seeds 0..95 and the 24 held-out ones within 4 steps (`benchmarks/experts.py`)."""
    return np.clip((info["goal"] - info["ee_pos"]) / 0.05, -1.0, 1.0)


class PandaPushExpert:
    """The scripted demonstrator: go above the spot behind the cube (on the line from the target through it), down
    to the table, then push the cube along that line at half speed (faster, it slides past the target); whenever
    the gripper leaves the line, go back up and start again from where the cube now is. 56 of reset seeds 0..59 and
    23 of 24 held-out ones succeed within 100 steps, 92% within panda-gym's own 50 (docs/benchmarks.md)."""

    BEHIND = 0.055  # m from the cube's centre to where the push starts
    CONTACT = 0.02  # m short of the target the gripper stops, its fingertips at the cube's far side
    CLEAR = 0.1  # m: the height at which the gripper passes over the cube
    PUSH_SPEED = 0.5  # the largest action while pushing

    def __init__(self):
        self.phase = "above"  # above the start of the push, going down to it, or pushing

    def __call__(self, info: dict) -> np.ndarray:
        ee, cube, goal = info["ee_pos"], info["object_pos"], info["goal"]
        line = goal[:2] - cube[:2]
        line = line / max(float(np.linalg.norm(line)), 1e-6)
        start = cube[:2] - line * self.BEHIND
        along = float(np.dot(ee[:2] - cube[:2], line))
        lateral = float(np.linalg.norm(ee[:2] - cube[:2] - along * line))
        off = float(np.linalg.norm(ee[:2] - start))
        if (self.phase == "push" and (lateral > 0.015 or along > -0.01)) or (self.phase == "down" and off > 0.03):
            self.phase = "above"
        if self.phase == "above" and off < 0.01:
            self.phase = "down"
        if self.phase == "down" and abs(ee[2] - cube[2]) < 0.01:
            self.phase = "push"
        if self.phase == "push":
            target = np.array([*(goal[:2] - line * self.CONTACT), cube[2]])
            return np.clip((target - ee) / 0.05 * 0.5, -self.PUSH_SPEED, self.PUSH_SPEED)
        if self.phase == "down":
            target = np.array([*start, cube[2]])
        elif ee[2] < self.CLEAR - 0.01 and np.linalg.norm(ee[:2] - cube[:2]) < 0.06:
            target = np.array([*ee[:2], self.CLEAR])  # straight up first: moving sideways would hit the cube
        else:  # (from above the table's clearance it keeps its height until it is over the start)
            target = np.array([*start, max(self.CLEAR, ee[2]) if off > 0.01 else self.CLEAR])
        return np.clip((target - ee) / 0.05 * 0.7, -1.0, 1.0)
