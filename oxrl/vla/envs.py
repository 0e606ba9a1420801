"""Simulators as robot environments: a gymnasium environment with image observations, seen as camera frames,
a proprioceptive state and an instruction, and stepped with continuous actions.

`vla.env` names one:
- `reach`: built in (numpy only, about 50 us a step). A point agent in the unit square must reach the corner the
  instruction names; the frame shows the agent and the target. Fast enough for tests, and a tiny model learns it.
- `pusht`: LeRobot's PushT (`pip install 'gym-pusht>=0.1.8'`, or `pip install -e '.[vla]'` in oxRL's source tree): push
  a T-shaped block onto a target pose with a round agent, 96x96 frames rendered headless by pygame, the agent's
  position as the state (and the block's pose too with `vla.env_kwargs: {block_pose: true}`).
  The action is where the agent should go (pixels, 0..512), or with `{relative: R}` its offset from the agent
  (within +-R pixels); the environment's reward is the goal's coverage.
- `panda-push`: panda-gym's PandaPush (`pip install 'panda-gym>=3.0.7'`, in the `vla` extra): a Franka arm pushes a
  cube onto a target, PyBullet's physics, 96x96 frames from its CPU renderer (oxrl/vla/panda.py).
- `panda-reach`: panda-gym's PandaReach, the same arm and camera: the gripper moves to a target point.
- `module:factory` or `file.py:factory`: any callable returning a gymnasium environment (called with
  `vla.env_kwargs`). It is code: in a config that is data (a run directory's saved config.yaml under `oxrl eval`)
  it is refused before anything is imported, unless --trust-config-code (oxrl/config/trust.py).

An observation is read from what the environment returns: a dict's uint8 arrays of shape [H, W, 3] are the
cameras (in key order), its 1-D float arrays the state (concatenated in key order); a bare [H, W, 3] array is
one camera and no state. Success is `info["is_success"]` (gymnasium-robotics, PushT) or `info["success"]`;
the instruction is `info["task"]` after reset, else `vla.instruction`. An environment with a `draw_frames` attribute
(ON_DEMAND) is told before each step whether anyone will look at its frames, and may leave them out when not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from PIL import Image

from oxrl.dependencies import require
from oxrl.errors import UserError
from oxrl.user_code import load_function


class RobotEnvError(UserError):
    """A robot environment that cannot be made, or that returned something an episode cannot use."""


@dataclass
class Observation:
    images: list[Image.Image]  # one per camera
    state: np.ndarray | None  # float [state_dim]


# A wrapper with this attribute draws its camera frames only while it is true (oxrl/vla/panda.py's PandaFrames).
ON_DEMAND = "draw_frames"


@dataclass
class Transition:
    observation: Observation | None  # None: a step taken with observe=False
    reward: float
    success: bool
    done: bool  # terminated or truncated
    info: dict


class RobotEnv:
    """A gymnasium environment seen as cameras, a state, an instruction and a success flag."""

    def __init__(self, env: gym.Env, name: str, instruction: str | None = None):
        self.env, self.name, self.instruction = env, name, instruction
        space = env.action_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise RobotEnvError(f"environment {name!r}: the action space must be a 1-D Box of continuous actions, "
                                f"got {space}")
        self.low, self.high = space.low.astype(np.float64), space.high.astype(np.float64)
        self.image_shapes: list[tuple[int, ...]] | None = None  # the first frame's, which every later one must match
        self.on_demand = env.has_wrapper_attr(ON_DEMAND)  # it draws its frames only when told to
        self.info: dict = {}

    @property
    def action_dim(self) -> int:
        return self.low.shape[0]

    def reset(self, seed: int) -> tuple[Observation, str]:
        """The initial observation of the episode `seed` names, and its instruction."""
        raw, info = self.env.reset(seed=seed)
        self.info, self.image_shapes = dict(info), None
        task = info.get("task") or self.instruction
        if not task:
            raise RobotEnvError(f"environment {self.name!r} gives no instruction (no info['task'] after reset): "
                                "set vla.instruction")
        return self.observation(raw, "reset"), str(task)

    def step(self, action: np.ndarray, where: str, observe: bool = True) -> Transition:
        """One action. `observe=False`: no one looks at this step's frames (an action inside a chunk), so the
        transition has no observation, and an environment that draws its frames on demand (a `draw_frames`
        attribute: panda-gym's renderer, most of its step's time) does not draw them."""
        if self.on_demand:
            self.env.set_wrapper_attr(ON_DEMAND, observe)
        raw, reward, terminated, truncated, info = self.env.step(action.astype(self.env.action_space.dtype))
        if not np.isfinite(reward):
            raise RobotEnvError(f"environment {self.name!r}: {where}: reward {reward!r} is not finite")
        self.info = dict(info)
        success = bool(info.get("is_success", info.get("success", False)))
        return Transition(self.observation(raw, where) if observe else None, float(reward), success,
                          bool(terminated or truncated), self.info)

    def observation(self, raw: Any, where: str) -> Observation:
        """Cameras and state of a raw observation; a frame whose size differs from the episode's first frame's is an
        error naming `where`."""
        parts = raw if isinstance(raw, dict) else {"image": raw}
        images, states = [], []
        for key in sorted(parts):
            value = np.asarray(parts[key])
            if value.dtype == np.uint8 and value.ndim == 3 and value.shape[-1] == 3:
                images.append(value)
            elif value.ndim == 1 and np.issubdtype(value.dtype, np.number):
                states.append(value.astype(np.float64))
        if not images:
            raise RobotEnvError(f"environment {self.name!r}: {where}: the observation has no camera frame (a uint8 "
                                f"[H, W, 3] array); it has {sorted(parts)}")
        shapes = [image.shape for image in images]
        if self.image_shapes is None:
            self.image_shapes = shapes
        elif shapes != self.image_shapes:
            raise RobotEnvError(f"environment {self.name!r}: {where}: frames of shape {shapes}, but the episode began "
                                f"with {self.image_shapes}")
        state = np.concatenate(states) if states else None
        if state is not None and not np.all(np.isfinite(state)):
            raise RobotEnvError(f"environment {self.name!r}: {where}: the state {state.tolist()} is not finite")
        return Observation([Image.fromarray(image) for image in images], state)

    def close(self) -> None:
        self.env.close()


class ReachEnv(gym.Env):
    """A point agent in the unit square moves by up to `speed` per step toward the corner the instruction names;
    success when it is within `radius` of it. Observation: a `size` x `size` frame (target green, agent red) and
    the agent's position."""

    CORNERS = {"top left": (0.1, 0.9), "top right": (0.9, 0.9), "bottom left": (0.1, 0.1), "bottom right": (0.9, 0.1)}
    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, size: int = 32, speed: float = 0.25, radius: float = 0.15):
        self.size, self.speed, self.radius = size, speed, radius
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_space = gym.spaces.Dict({
            "pixels": gym.spaces.Box(0, 255, (size, size, 3), np.uint8),
            "agent_pos": gym.spaces.Box(0.0, 1.0, (2,), np.float64)})
        self.agent = np.zeros(2)
        self.target = np.zeros(2)
        self.corner = ""

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.corner = list(self.CORNERS)[int(self.np_random.integers(4))]
        self.target = np.array(self.CORNERS[self.corner])
        self.agent = self.np_random.uniform(0.35, 0.65, size=2)
        return self._observation(), {**self._info(), "task": f"move the red dot to the {self.corner} corner"}

    def step(self, action):
        self.agent = np.clip(self.agent + self.speed * np.clip(np.asarray(action, dtype=np.float64), -1, 1), 0, 1)
        info = self._info()
        return self._observation(), float(info["is_success"]), info["is_success"], False, info

    def _info(self) -> dict:
        return {"is_success": bool(np.linalg.norm(self.agent - self.target) < self.radius),
                "agent_pos": self.agent.copy(), "target": self.target.copy(), "speed": self.speed}

    def _observation(self) -> dict:
        frame = np.zeros((self.size, self.size, 3), np.uint8)
        for (x, y), colour in ((self.target, (0, 200, 0)), (self.agent, (220, 0, 0))):
            row, col = int((1 - y) * (self.size - 1)), int(x * (self.size - 1))
            frame[max(row - 1, 0): row + 2, max(col - 1, 0): col + 2] = colour
        return {"pixels": frame, "agent_pos": self.agent.copy()}


def reach_expert(info: dict) -> np.ndarray:
    """The scripted demonstrator of `reach`: straight at the target, at full speed until the last step."""
    return np.clip((info["target"] - info["agent_pos"]) / info["speed"], -1.0, 1.0)


def _pusht_expert() -> Callable[[dict], np.ndarray]:
    from oxrl.vla.pusht_expert import PushTExpert  # (numpy planning code: loaded only to record PushT demonstrations)

    return PushTExpert()


def _panda_push_expert() -> Callable[[dict], np.ndarray]:
    from oxrl.vla.panda import PandaPushExpert

    return PandaPushExpert()


def _panda(name: str) -> Callable[..., gym.Env]:
    def make(**kwargs) -> gym.Env:
        from oxrl.vla.panda import make_panda  # (PyBullet: loaded only where such an environment is named)

        return make_panda(name, **kwargs)

    return make


def _panda_reach_expert() -> Callable[[dict], np.ndarray]:
    from oxrl.vla.panda import panda_reach_expert

    return panda_reach_expert


# name -> (factory, a new scripted demonstrator for an episode, instruction when the environment gives none)
BUILT_IN: dict[str, tuple[Callable[..., gym.Env], Callable[[], Callable[[dict], np.ndarray]], str | None]] = {
    "reach": (ReachEnv, lambda: reach_expert, None),
    "pusht": (lambda **kwargs: _pusht(**kwargs), _pusht_expert, "push the T-shaped block onto the T-shaped target"),
    "panda-push": (_panda("panda-push"), _panda_push_expert, "push the cube onto the target"),
    "panda-reach": (_panda("panda-reach"), _panda_reach_expert, "move the gripper to the green target"),
}


def _pusht(block_pose: bool = False, relative: float | None = None, **kwargs) -> gym.Env:
    require("gym_pusht", "gym-pusht", "vla.env `pusht`")
    import gym_pusht  # noqa: F401  (registers gym_pusht/PushT-v0)

    env = gym.make("gym_pusht/PushT-v0", obs_type="pixels_agent_pos", render_mode="rgb_array", **kwargs)
    env = _WithBlockPose(env) if block_pose else env
    return _RelativeToAgent(env, relative) if relative is not None else env


class _RelativeToAgent(gym.ActionWrapper):
    """PushT's action as an offset from the agent's position, each coordinate within +-`reach` pixels (`vla.env_kwargs:
    {relative: 96}`), rather than the absolute target the agent is driven to. With absolute targets a policy can
    clone the demonstrations closely by naming the agent's own position (the expert's target is 15 px from it at
    the median), and then never moves: the copycat problem of behaviour cloning with proprioception (Wen et al.,
    arXiv:2010.14876). An offset of zero stands still, so the loss asks for the direction."""

    def __init__(self, env: gym.Env, reach: float):
        super().__init__(env)
        if isinstance(reach, bool) or not isinstance(reach, int | float) or not reach > 0:
            raise RobotEnvError(f"vla.env_kwargs relative = {reach!r}: pusht's reach must be a positive number of "
                                "pixels")
        self.reach = float(reach)
        self.action_space = gym.spaces.Box(-reach, reach, (2,), np.float64)

    def action(self, offset: np.ndarray) -> np.ndarray:
        agent = np.asarray(self.env.unwrapped.agent.position, dtype=np.float64)
        return np.clip(agent + np.clip(offset, -self.reach, self.reach), 0.0, 512.0)


class _WithBlockPose(gym.ObservationWrapper):
    """PushT's state with the block's pose (x, y in pixels, the angle in radians within [-pi, pi)) after the
    agent's position: what the policy must act on, given apart from the frame that shows it (`vla.env_kwargs:
    {block_pose: true}`), so that what it learns to see and what it learns to do can be told apart."""

    def observation(self, observation: dict) -> dict:
        block = self.env.unwrapped.block
        angle = (block.angle + np.pi) % (2 * np.pi) - np.pi
        return {**observation, "block_pose": np.array([block.position.x, block.position.y, angle])}


def make_env(name: str, kwargs: dict | None = None, instruction: str | None = None) -> RobotEnv:
    """The environment `vla.env` names, wrapped."""
    kwargs = dict(kwargs or {})
    if name in BUILT_IN:
        factory, _, default = BUILT_IN[name]
        instruction = instruction or default
    elif ":" in name:
        factory = load_function(name, "environment factory", RobotEnvError)
    else:
        raise RobotEnvError(f"vla.env {name!r} is not a built-in environment ({', '.join(BUILT_IN)}) nor a "
                            "`module:factory` / `file.py:factory` reference")
    try:
        env = factory(**kwargs)
    except TypeError as error:
        raise RobotEnvError(f"vla.env {name!r} with vla.env_kwargs {kwargs}: {error}") from error
    if not isinstance(env, gym.Env):
        raise RobotEnvError(f"vla.env {name!r} made a {type(env).__name__}, not a gymnasium environment")
    return RobotEnv(env, name, instruction)


def expert(name: str, kwargs: dict | None = None) -> Callable[[dict], np.ndarray]:
    """A scripted demonstrator of a built-in environment for one episode (PushT's remembers the push it is
    making): info after reset/step -> the next action, as the environment made with `kwargs` takes it."""
    if name not in BUILT_IN:
        raise RobotEnvError(f"only the built-in environments ({', '.join(BUILT_IN)}) have a scripted demonstrator, "
                            f"not {name!r}")
    act = BUILT_IN[name][1]()
    reach = (kwargs or {}).get("relative") if name == "pusht" else None
    if reach is None:
        return act
    return lambda info: np.clip(act(info) - np.asarray(info["pos_agent"], dtype=np.float64), -reach, reach)
