"""Simulators as robot environments: a gymnasium environment with image observations, seen as camera frames,
a proprioceptive state and an instruction, and stepped with continuous actions.

`vla.env` names one:
- `reach`: built in (numpy only, about 50 us a step). A point agent in the unit square must reach the corner the
  instruction names; the frame shows the agent and the target. Fast enough for tests, and a tiny model learns it.
- `pusht`: LeRobot's PushT (`pip install 'gym-pusht>=0.1.8'`, or `pip install -e '.[vla]'` in oxRL's source tree): push
  a T-shaped block onto a target pose with a round agent, 96x96 frames rendered headless by pygame, the agent's
  position as the state.
  The action is where the agent should go (pixels, 0..512); the environment's reward is the goal's coverage.
- `module:factory` or `file.py:factory`: any callable returning a gymnasium environment (called with
  `vla.env_kwargs`). It is code: in a config that is data (a run directory's saved config.yaml under `oxrl eval`)
  it is refused before anything is imported, unless --trust-config-code (oxrl/config/trust.py).

An observation is read from what the environment returns: a dict's uint8 arrays of shape [H, W, 3] are the
cameras (in key order), its 1-D float arrays the state (concatenated in key order); a bare [H, W, 3] array is
one camera and no state. Success is `info["is_success"]` (gymnasium-robotics, PushT) or `info["success"]`;
the instruction is `info["task"]` after reset, else `vla.instruction`.
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


@dataclass
class Transition:
    observation: Observation
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

    def step(self, action: np.ndarray, where: str) -> Transition:
        raw, reward, terminated, truncated, info = self.env.step(action.astype(self.env.action_space.dtype))
        if not np.isfinite(reward):
            raise RobotEnvError(f"environment {self.name!r}: {where}: reward {reward!r} is not finite")
        self.info = dict(info)
        success = bool(info.get("is_success", info.get("success", False)))
        return Transition(self.observation(raw, where), float(reward), success, bool(terminated or truncated), self.info)

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


# PushT's scripted demonstrator. Frames: "local" is the T's own (gym_pusht's add_tee: the bar spans x -60..60,
# y 0..30, the stem x -15..15, y 30..120), "world" the simulator's pixels. The simulator has no floor friction and no
# momentum (space damping 0 zeroes every velocity each substep), and the agent is kinematic, driven by a PD loop
# towards the action: the block moves only while the agent's disc pushes it, along the contact's normal. So a
# push is chosen by where the disc touches the T, and how far it pushes; a copy of the physics predicts it.
_RADIUS = 15.0  # the agent's disc (gym_pusht's add_circle)
_CLEARANCE = 5.0  # between the disc and the T while going around it
_STANDOFF = _RADIUS + 7.0  # a push starts with the disc's centre this far out from its contact
_ARENA = (22.0, 490.0)  # where the disc's centre fits inside the walls (segments at 5 and 506, radius 2)
_BOXES = np.array([[-60.0, 60.0, 0.0, 30.0], [-15.0, 15.0, 30.0, 120.0]])  # the bar and the stem: x0, x1, y0, y1
# The T's outline, edge by edge: start, end and outward normal.
_EDGES = (((-60, 0), (60, 0), (0, -1)), ((60, 0), (60, 30), (1, 0)), ((60, 30), (15, 30), (0, 1)),
          ((15, 30), (15, 120), (1, 0)), ((15, 120), (-15, 120), (0, 1)), ((-15, 120), (-15, 30), (-1, 0)),
          ((-15, 30), (-60, 30), (0, 1)), ((-60, 30), (-60, 0), (-1, 0)))
# The area's centroid and the mean squared distance of the T's points from it: with them, the RMS displacement of
# all of the T's points between two poses is a closed form.
_CENTROID_Y = (3600 * 15 + 2700 * 75) / 6300
_SPREAD = (3600 * (1275 + (15 - _CENTROID_Y) ** 2) + 2700 * (750 + (75 - _CENTROID_Y) ** 2)) / 6300


def _rotation(angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, -s], [s, c]])


def _pose_error(pose: Any, goal: Any) -> float:
    """The RMS distance (pixels) the T's points, spread evenly over its area, are from where the goal puts them.
    Coverage > 0.95 needs it under about 1.8."""
    x, y, angle = pose
    gx, gy, goal_angle = goal
    dx = (x - np.sin(angle) * _CENTROID_Y) - (gx - np.sin(goal_angle) * _CENTROID_Y)
    dy = (y + np.cos(angle) * _CENTROID_Y) - (gy + np.cos(goal_angle) * _CENTROID_Y)
    return float(np.sqrt(dx * dx + dy * dy + 2 * (1 - np.cos(angle - goal_angle)) * _SPREAD))


def _inside(points: np.ndarray, margin: float) -> np.ndarray:
    """Which local points lie within `margin` of the T."""
    boxes = _BOXES + margin * np.array([-1, 1, -1, 1])
    x, y = points[..., 0, None], points[..., 1, None]
    return np.any((boxes[:, 0] < x) & (x < boxes[:, 1]) & (boxes[:, 2] < y) & (y < boxes[:, 3]), axis=-1)


def _crosses(start: np.ndarray, end: np.ndarray, margin: float) -> np.ndarray:
    """Which local segments start -> end (broadcast) pass within `margin` of the T: clipped against each box
    (Liang-Barsky)."""
    start, end = np.broadcast_arrays(np.asarray(start, float), np.asarray(end, float))
    delta = end - start
    hit = np.zeros(start.shape[:-1], bool)
    for box in _BOXES + margin * np.array([-1, 1, -1, 1]):
        enter, leave = np.zeros(start.shape[:-1]), np.ones(start.shape[:-1])
        for axis in (0, 1):
            low, high = box[2 * axis], box[2 * axis + 1]
            d, s = delta[..., axis], start[..., axis]
            flat = np.abs(d) < 1e-12
            with np.errstate(divide="ignore", invalid="ignore"):
                a, b = (low - s) / d, (high - s) / d
            inside = (low < s) & (s < high)
            enter = np.maximum(enter, np.where(flat, np.where(inside, -np.inf, np.inf), np.minimum(a, b)))
            leave = np.minimum(leave, np.where(flat, np.where(inside, np.inf, -np.inf), np.maximum(a, b)))
        hit |= leave - enter > 1e-9
    return hit


class _Paths:
    """Shortest paths for the disc around the T (local frame) through the corners of the T grown by the disc and
    a clearance: a visibility graph, its corners dropped where they fall outside the arena."""

    def __init__(self):
        grow = _RADIUS + _CLEARANCE + 1
        self.corners = np.array([(-60 - grow, -grow), (60 + grow, -grow), (60 + grow, 30 + grow),
                                 (15 + grow, 30 + grow), (15 + grow, 120 + grow), (-15 - grow, 120 + grow),
                                 (-15 - grow, 30 + grow), (-60 - grow, 30 + grow)])
        gaps = np.linalg.norm(self.corners[:, None] - self.corners[None], axis=2)
        self.edges = np.where(_crosses(self.corners[:, None], self.corners[None], _RADIUS + _CLEARANCE), np.inf, gaps)

    def route(self, start: np.ndarray, targets: np.ndarray, usable: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Path lengths from `start` to each target, and the first point to head for on each."""
        margin = _RADIUS + _CLEARANCE
        if _inside(start, margin):  # touching the T (after a push): leave it straight out of the nearest side
            exit_point = self._exit(start)
            lengths, _ = self.route(exit_point, targets, usable)
            return lengths + np.linalg.norm(exit_point - start), np.repeat(exit_point[None], len(targets), 0)
        n = len(self.corners)
        dist = np.where(usable[:, None] & usable[None], self.edges, np.inf)
        after = np.tile(np.arange(n), (n, 1))  # after[i, j]: the corner after i on the way to j (Floyd-Warshall)
        for k in range(n):
            via = dist[:, k:k + 1] + dist[k:k + 1]
            shorter = via < dist - 1e-9
            dist, after = np.where(shorter, via, dist), np.where(shorter, after[:, k:k + 1], after)
        to_corner = np.where(usable & ~_crosses(start, self.corners, margin),
                             np.linalg.norm(self.corners - start, axis=1), np.inf)
        to_target = np.where(~_crosses(self.corners[None], targets[:, None], margin),
                             np.linalg.norm(self.corners[None] - targets[:, None], axis=2), np.inf)
        total = to_corner[None, :, None] + dist[None] + to_target[:, None, :]  # [target, first corner, last corner]
        best = total.reshape(len(targets), -1).argmin(1)
        first, last = best // n, best % n
        lengths = total[np.arange(len(targets)), first, last]
        at_corner = to_corner[first] < 2  # standing on the first corner already: head for the next one
        heading = self.corners[np.where(at_corner, after[first, last], first)]
        heading = np.where((at_corner & (first == last))[:, None], targets, heading)
        direct = ~_crosses(start, targets, margin)
        lengths = np.where(direct, np.linalg.norm(targets - start, axis=1), lengths)
        return lengths, np.where(direct[:, None], targets, heading)

    @staticmethod
    def _exit(point: np.ndarray) -> np.ndarray:
        margin = _RADIUS + _CLEARANCE + 1
        best, exit_point = np.inf, point
        for x0, x1, y0, y1 in _BOXES + (margin - 1) * np.array([-1, 1, -1, 1]):
            if not (x0 < point[0] < x1 and y0 < point[1] < y1):
                continue
            for distance, candidate in ((point[0] - x0, (x0 - 1, point[1])), (x1 - point[0], (x1 + 1, point[1])),
                                        (point[1] - y0, (point[0], y0 - 1)), (y1 - point[1], (point[0], y1 + 1))):
                candidate = np.array(candidate)
                if distance < best and not _inside(candidate, margin - 1):
                    best, exit_point = distance, candidate
        return exit_point


class _Physics:
    """A planning copy of PushT: a second gym_pusht environment (never rendered, never stepped through its
    `step`, whose coverage costs more than the physics), its agent and block moved to a state and its space stepped
    under the same PD loop as `PushTEnv.step`."""

    def __init__(self):
        from gym_pusht.envs.pusht import PushTEnv

        self.env = PushTEnv(obs_type="state")
        self.env.reset(seed=0)
        self.substeps = int(1 / (self.env.dt * self.env.control_hz))
        self.x = self.y = self.vx = self.vy = 0.0

    def set(self, agent: Any, velocity: Any, pose: Any, block_velocity: tuple = (0.0, 0.0, 0.0)) -> None:
        space, block = self.env.space, self.env.block
        space.remove(block, *block.shapes)  # and re-added: drops contacts cached from the last rollout
        block.angle = float(pose[2])  # angle first: setting it turns the block about its centre of gravity
        block.position = (float(pose[0]), float(pose[1]))
        block.velocity, block.angular_velocity = block_velocity[:2], block_velocity[2]
        space.add(block, *block.shapes)
        self.x, self.y, self.vx, self.vy = float(agent[0]), float(agent[1]), float(velocity[0]), float(velocity[1])
        self.env.agent.position = (self.x, self.y)

    def snapshot(self) -> tuple:
        block = self.env.block
        return (self.x, self.y), (self.vx, self.vy), self.pose(), (*block.velocity, block.angular_velocity)

    def pose(self) -> tuple[float, float, float]:
        return (*self.env.block.position, self.env.block.angle)

    def step(self, target: np.ndarray) -> None:
        """One control step towards `target`. The agent is kinematic (the block does not push back), so its
        path is integrated here in floats, as Chipmunk does, rather than read back from the space."""
        tx, ty = float(target[0]), float(target[1])
        x, y, vx, vy = self.x, self.y, self.vx, self.vy
        kp, kv, dt = self.env.k_p, self.env.k_v, self.env.dt
        for _ in range(self.substeps):
            vx += (kp * (tx - x) - kv * vx) * dt
            vy += (kp * (ty - y) - kv * vy) * dt
            self.env.agent.velocity = (vx, vy)
            self.env.space.step(dt)
            x, y = x + vx * dt, y + vy * dt
        self.x, self.y, self.vx, self.vy = x, y, vx, vy


@dataclass
class _Push:
    index: int  # into PushTExpert.contacts
    lead: float
    pose: np.ndarray  # the block's when it was chosen
    predicted: float  # the pose error it should leave
    start_error: float = np.inf  # the pose error when the push began


class PushTExpert:
    """PushT's scripted demonstrator: plans pushes on the T's pose (position and angle) with a copy of the physics.

    Candidate pushes: contact points every 10 px along the T's edges that the disc can reach, pushed along the
    edge's inward normal at one of three speeds. Each is tried in the copy from a stand-off point 7 px out, pushing
    k = 1..12 steps and then backing off one step; the best k leaves the lowest pose error (the RMS distance of the
    T's points from the goal's). The expert picks the push whose error plus 0.015 per pixel of the way there (round
    the T, past corners of it grown by the disc) is lowest, goes to its stand-off point, and pushes while a line
    search from the real state says one more step still helps (this corrects for the arrival's speed and offset),
    then backs off and plans again. A push that moved nothing is not tried again from the same pose; a bump on
    the way makes it plan again.

    Measured (benchmarks/pusht_expert.py, 300 steps): 96/96 successes on reset seeds 0..95 and 24/24 on the
    held-out 1_000_000..1_000_023; median ~75 steps; about 80% by 100 steps, 92% by 120, 99-100% by 150; about
    0.013 s a step on one core (a plan, a few times an episode, takes up to ~0.1 s).

    One per episode: it remembers its current push. Called with `info` from the last reset or step."""

    LEADS = (60.0, 10.0, 2.0)  # how far inside the T the push aims: the agent then moves at about lead / 2 px a step
    HORIZON = 12  # push steps tried
    TRAVEL_COST = 0.015  # pose error (px) a pixel of travel is worth
    MIN_GAIN = 0.05  # px: a push that gains less is noise
    APPROACH = 5.0  # px from its stand-off point where a push begins
    OVERSHOOT = 15.0  # px past a corner on the way: the PD loop slows down before a target
    BUMP = 0.5  # px (and BUMP / 50 rad): the block moved under a plan that predicted it still

    def __init__(self):
        require("gym_pusht", "gym-pusht", "the `pusht` scripted demonstrator")
        self.contacts: list[tuple[np.ndarray, np.ndarray]] = []
        for start, end, normal in _EDGES:
            start, end, normal = np.array(start, float), np.array(end, float), np.array(normal, float)
            count = max(int(np.linalg.norm(end - start) // 10), 1)
            for i in range(count):
                contact = start + (end - start) * (i + 0.5) / count
                if not _inside(contact + normal * _STANDOFF, _RADIUS + _CLEARANCE):  # room for the disc there
                    self.contacts.append((contact, normal))
        self.standoffs = np.array([c + n * _STANDOFF for c, n in self.contacts])
        self.paths = _Paths()
        self.physics = _Physics()
        self.push: _Push | None = None
        self.phase = "travel"  # then "push", then "back off"
        self.tried: set[int] = set()  # contacts whose push left the block where it was

    def __call__(self, info: dict) -> np.ndarray:
        agent, velocity = np.asarray(info["pos_agent"], float), np.asarray(info["vel_agent"], float)
        pose, goal = np.asarray(info["block_pose"], float), np.asarray(info["goal_pose"], float)
        rotation = _rotation(pose[2])
        local = rotation.T @ (agent - pose[:2])
        error = _pose_error(pose, goal)
        push = self.push
        if push is not None and self.phase == "back off":
            if error > push.start_error - 1e-3:
                self.tried.add(push.index)
            else:
                self.tried.clear()
            push = None
        if push is not None and self.phase == "push":
            contact, normal = self.contacts[push.index]
            if not self._on_line(pose, agent, push.index):
                push = None  # slid off the edge
            elif self._line_search(agent, velocity, pose, goal, push.index, push.lead, 1e-3)[1] == 0:
                self.phase = "back off"
                return np.clip(agent + rotation @ normal * 20, 0, 512)
        if push is not None and self.phase == "travel" and (np.abs(pose[:2] - push.pose[:2]).max() > self.BUMP
                                                            or abs(pose[2] - push.pose[2]) > self.BUMP / 50):
            push = None
        if push is None:
            push = self._plan(pose, goal, local) or (self.tried.clear() or self._plan(pose, goal, local))
            self.phase = "travel"
        self.push = push
        if push is None:  # no push helps
            return np.clip(agent, 0, 512)
        contact, normal = self.contacts[push.index]
        if self.phase == "travel" and np.linalg.norm(local - self.standoffs[push.index]) < self.APPROACH:
            self.phase, push.start_error = "push", error
        if self.phase == "push":
            return np.clip(self._push_target(pose, push.index, push.lead), 0, 512)
        lengths, heading = self.paths.route(local, self.standoffs[push.index][None], self._usable_corners(pose))
        if not np.isfinite(lengths[0]):
            self.push = None
            return np.clip(agent, 0, 512)
        waypoint = heading[0]
        if np.linalg.norm(waypoint - self.standoffs[push.index]) > 1e-6:  # a corner: aim past it, the way it is passed
            way = waypoint - local
            waypoint = waypoint + way / max(np.linalg.norm(way), 1e-6) * self.OVERSHOOT
        return np.clip(rotation @ waypoint + pose[:2], *_ARENA)

    def _plan(self, pose: np.ndarray, goal: np.ndarray, local: np.ndarray) -> _Push | None:
        rotation = _rotation(pose[2])
        lengths, _ = self.paths.route(local, self.standoffs, self._usable_corners(pose))
        best, best_score = None, np.inf
        for index in range(len(self.contacts)):
            start = rotation @ self.standoffs[index] + pose[:2]
            if index in self.tried or not np.isfinite(lengths[index]) or not _in_arena(start):
                continue
            for lead in self.LEADS:
                error, steps = self._line_search(start, np.zeros(2), pose, goal, index, lead, self.MIN_GAIN)
                score = error + self.TRAVEL_COST * lengths[index]
                if steps > 0 and score < best_score:
                    best, best_score = _Push(index, lead, pose.copy(), error), score
        return best

    def _line_search(self, agent: np.ndarray, velocity: np.ndarray, pose: np.ndarray, goal: np.ndarray, index: int,
                     lead: float, min_gain: float) -> tuple[float, int]:
        """The lowest pose error after pushing at contact `index` for 0..HORIZON steps then backing off one step,
        and that number of steps (0: pushing does not gain `min_gain`)."""
        physics, normal = self.physics, self.contacts[index][1]

        def backed_off() -> float:
            # the agent's momentum carries it on for a moment after it turns back: that is part of the push
            saved = physics.snapshot()
            now = physics.pose()
            physics.step(np.array([physics.x, physics.y]) + _rotation(now[2]) @ normal * 20)
            error = _pose_error(physics.pose(), goal)
            physics.set(*saved)
            return error

        physics.set(agent, velocity, pose)
        best, best_steps, worse = backed_off(), 0, 0
        for steps in range(1, self.HORIZON + 1):
            physics.step(self._push_target(physics.pose(), index, lead))
            if not self._on_line(physics.pose(), (physics.x, physics.y), index):
                break
            error = backed_off()
            if error < best - (min_gain if best_steps == 0 else 1e-6):
                best, best_steps, worse = error, steps, 0
            else:
                worse += 1
                if worse == 2:
                    break
        return best, best_steps

    def _push_target(self, pose: Any, index: int, lead: float) -> np.ndarray:
        """Where the agent aims to push at contact `index`: `lead` px inside the T from touching it, in the T's
        frame so that the push turns with it."""
        contact, normal = self.contacts[index]
        return _rotation(pose[2]) @ (contact + normal * (_RADIUS - lead)) + np.asarray(pose[:2])

    def _on_line(self, pose: Any, agent: Any, index: int) -> bool:
        """Whether the agent is still on the push's line, not slid along the edge or off it."""
        contact, normal = self.contacts[index]
        offset = _rotation(pose[2]).T @ (np.asarray(agent) - np.asarray(pose[:2])) - contact
        return _RADIUS - 5 <= offset @ normal <= _STANDOFF + 3 and abs(offset @ np.array([-normal[1], normal[0]])) <= 12

    def _usable_corners(self, pose: np.ndarray) -> np.ndarray:
        return _in_arena(self.paths.corners @ _rotation(pose[2]).T + pose[:2])


def _in_arena(points: np.ndarray) -> np.ndarray:
    return np.all((points > _ARENA[0]) & (points < _ARENA[1]), axis=-1)


# name -> (factory, a new scripted demonstrator for an episode, instruction when the environment gives none)
BUILT_IN: dict[str, tuple[Callable[..., gym.Env], Callable[[], Callable[[dict], np.ndarray]], str | None]] = {
    "reach": (ReachEnv, lambda: reach_expert, None),
    "pusht": (lambda **kwargs: _pusht(**kwargs), PushTExpert, "push the T-shaped block onto the T-shaped target"),
}


def _pusht(**kwargs) -> gym.Env:
    require("gym_pusht", "gym-pusht", "vla.env `pusht`")
    import gym_pusht  # noqa: F401  (registers gym_pusht/PushT-v0)

    return gym.make("gym_pusht/PushT-v0", obs_type="pixels_agent_pos", render_mode="rgb_array", **kwargs)


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


def expert(name: str) -> Callable[[dict], np.ndarray]:
    """A scripted demonstrator of a built-in environment for one episode (PushT's remembers the push it is
    making): info after reset/step -> the next action."""
    if name not in BUILT_IN:
        raise RobotEnvError(f"only the built-in environments ({', '.join(BUILT_IN)}) have a scripted demonstrator, "
                            f"not {name!r}")
    return BUILT_IN[name][1]()
