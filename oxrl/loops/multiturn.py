"""Multi-turn episodes against a user environment in RL2's format, over any rollout engine.

An environment is a Python file (`rl.env.path`) with

    async def step(state: str, action: str, extra_info: dict) -> dict:
        return {"next_state": str | None, "reward": float, "score": float, "done": bool, "extra_info": ...}

An episode starts from a prompt: `state` is the prompt's text (its token ids decoded with special
tokens, i.e. the rendered chat template), `extra_info` a copy of the prompt row's fields. Each turn
the engine samples an action from the current context; `step(state, action, extra_info)` answers;
the episode ends when the environment says `done` or after `rl.env.max_turns` turns (the last turn's
step still runs, for its reward). Otherwise:

- `next_state` extends `state + action` (the usual case): only the new text is tokenised and
  appended, so the episode stays ONE sequence: prompt, action 1, env text 1, action 2, ...
- `next_state` does not extend it (the environment rewrote the history): the next turn starts a
  fresh context, `next_state` tokenised whole. The trainer then sees the same fresh context (a new
  sequence of the same example, positions from 0), so the log-probs it computes are those of the
  context the engine sampled in. The earlier actions inside the rewritten text are context only.

Either way the trained tokens are exactly the ids the engine returned, never re-tokenised text:
environment tokens ride along in `Completion.completion_ids` with `loss_mask` False and have no
entry in `Completion.logprobs`. The episode's reward is the SUM of its turns' rewards (an outcome
reward for the advantage estimator), its score the sum of the turns' scores (accuracy counts
episodes with score >= 1). `max_new_tokens` is a per-turn budget.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import math
import numbers
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from oxrl.user_code import load_function
from oxrl.rewards.combine import RewardOutput
from oxrl.rollout.base import Completion, SamplingParams

STEP_KEYS = ("next_state", "reward", "score", "done", "extra_info")
EXCERPT_CHARS = 200


class EnvLoadError(ValueError):
    """The environment named in the config cannot be found or does not have `step`'s signature."""


class EnvStepError(RuntimeError):
    """An environment's `step` raised or returned something other than the expected dict."""


@dataclass(frozen=True)
class Environment:
    step: Callable[[str, str, Any], Awaitable[dict]]
    reference: str  # `path.py:function`, for error messages
    max_turns: int
    tokenizer: Any  # encodes the environment's text (`encode(text, add_special_tokens=False)`) and decodes prompts

    def run(self, engine, batch, params: SamplingParams) -> Episodes:
        """The episode runner's one method (a VLA's is oxrl/vla/episodes.py): `params.n` episodes per prompt."""
        return run_episodes(engine, self, batch.prompt_ids, batch.fields, params)


def load_environment(path: str, max_turns: int, tokenizer) -> Environment:
    """The environment `path` names (`envs/calc.py`, whose `step` is used, or `envs/calc.py:my_step`,
    or `pkg.module:step`), checked to be `async def f(state, action, extra_info)` before any compute."""
    if max_turns < 1:
        raise EnvLoadError(f"environment {path!r}: max_turns must be >= 1, got {max_turns}")
    reference = f"{path}:step" if path.endswith(".py") else path
    step = load_function(reference, "environment", EnvLoadError)
    if not inspect.iscoroutinefunction(step):
        raise EnvLoadError(f"environment {reference!r}: `step` must be an `async def` (it is awaited with asyncio), "
                           f"got a plain {type(step).__name__}")
    try:
        inspect.signature(step).bind("state", "action", {})
    except TypeError as error:
        raise EnvLoadError(f"environment {reference!r}: `step` must take (state, action, extra_info); its signature is "
                           f"{inspect.signature(step)}") from error
    return Environment(step, reference, max_turns, tokenizer)


@dataclass(frozen=True)
class StepResult:
    next_state: str | None
    reward: float
    score: float
    done: bool
    extra_info: Any


def check_step_result(value: Any, reference: str) -> StepResult:
    """`step`'s returned dict as a `StepResult`; a missing key or wrong type is an error naming both."""
    where = f"environment {reference!r}: step returned"
    if not isinstance(value, dict):
        raise EnvStepError(f"{where} a {type(value).__name__}, expected a dict with keys {list(STEP_KEYS)}")
    missing = [key for key in STEP_KEYS if key not in value]
    if missing:
        raise EnvStepError(f"{where} a dict without key(s) {missing} (it has {sorted(value)}; expected {list(STEP_KEYS)})")
    for key in ("reward", "score"):
        number = value[key]
        if not isinstance(number, numbers.Real) or not math.isfinite(float(number)):
            raise EnvStepError(f"{where} {key}={number!r:.80}: expected a finite number")
    if not isinstance(value["done"], bool):
        raise EnvStepError(f"{where} done={value['done']!r:.80}: expected True or False")
    next_state = value["next_state"]
    if not value["done"] and not isinstance(next_state, str):
        raise EnvStepError(f"{where} next_state={next_state!r:.80} with done=False: expected the next state's text")
    return StepResult(next_state, float(value["reward"]), float(value["score"]), value["done"], value["extra_info"])


@dataclass
class Episodes:
    """The finished episodes of one `run_episodes` call, in the order the engine returned the first turns."""

    completions: list[Completion]
    rewards: list[float]  # sum over turns
    scores: list[float]  # sum over turns
    turns: list[int]
    context_restarts: list[int]
    step_seconds: float  # wall time spent awaiting the environment

    def reward_output(self) -> RewardOutput:
        """As the reward functions report it: totals = episode rewards; the `score` component gives accuracy."""
        return RewardOutput(list(self.rewards), {"score": list(self.scores)}, {"score": 0}, {"score": self.step_seconds})

    def metrics(self) -> dict[str, float]:
        count = max(1, len(self.turns))
        return {"turns/mean": sum(self.turns) / count, "turns/max": float(max(self.turns, default=0)),
                "context_restarts/mean": sum(self.context_restarts) / count}


@dataclass
class _Episode:
    """One episode in progress: what the engine sees next (`context`), what the environment sees (`state`)."""

    prompt_index: int
    prompt_ids: list[int]
    context: list[int]
    state: str
    extra_info: Any
    completion_ids: list[int] = field(default_factory=list)
    loss_mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    context_starts: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    reward: float = 0.0
    score: float = 0.0
    turns: int = 0
    finish_reason: str = "length"
    done: bool = False

    def add_action(self, sampled: Completion) -> None:
        """Append the engine's tokens exactly as sampled (trained) and their log-probs."""
        self.completion_ids += sampled.completion_ids
        self.loss_mask += [True] * len(sampled.completion_ids)
        self.logprobs += sampled.logprobs
        self.context += sampled.completion_ids
        self.texts.append(sampled.text)
        self.finish_reason = sampled.finish_reason
        self.turns += 1

    def add_environment(self, next_state: str, action: str, env: Environment) -> None:
        """Append the environment's text as untrained tokens: its new part when `next_state` extends the
        conversation, else the whole of it as a fresh context."""
        extended = self.state + action
        if next_state.startswith(extended):
            text, fresh = next_state[len(extended):], False
        else:
            text, fresh = next_state, True
        ids = list(env.tokenizer.encode(text, add_special_tokens=False)) if text else []
        if fresh:
            if not ids:
                raise EnvStepError(f"environment {env.reference!r}: next_state restarts the context but is empty")
            self.context_starts.append(len(self.completion_ids))
            self.context = []
        self.completion_ids += ids
        self.loss_mask += [False] * len(ids)
        self.context += ids
        self.texts.append(text)
        self.state = next_state

    def completion(self) -> Completion:
        return Completion(self.prompt_index, self.prompt_ids, self.completion_ids, self.logprobs, self.finish_reason,
                          "".join(self.texts), loss_mask=self.loss_mask, context_starts=self.context_starts)


def run_episodes(engine, env: Environment, prompt_ids: list[list[int]], extra_infos: list[Any],
                 params: SamplingParams) -> Episodes:
    """`params.n` episodes per prompt: engine turns (batched over the unfinished episodes) alternate with
    the environment's `step`, awaited for all of them together."""
    first = engine.generate(prompt_ids, params)
    episodes = [_Episode(c.prompt_index, list(prompt_ids[c.prompt_index]), list(prompt_ids[c.prompt_index]),
                         env.tokenizer.decode(prompt_ids[c.prompt_index]), copy.deepcopy(extra_infos[c.prompt_index]))
                for c in first]
    active, sampled = episodes, first
    step_seconds = 0.0
    for turn in range(1, env.max_turns + 1):
        if turn > 1:  # one completion per unfinished episode, from its own context
            sampled = sorted(engine.generate([e.context for e in active], replace(params, n=1)), key=lambda c: c.prompt_index)
        started = time.perf_counter()
        results = asyncio.run(_step_all(env, active, sampled, turn))
        step_seconds += time.perf_counter() - started
        for episode, action, result in zip(active, sampled, results):
            episode.add_action(action)
            episode.reward += result.reward
            episode.score += result.score
            episode.extra_info = result.extra_info
            episode.done = result.done or turn == env.max_turns
            if not episode.done:
                episode.add_environment(result.next_state, action.text, env)
        active = [e for e in active if not e.done]
        if not active:
            break
    return Episodes([e.completion() for e in episodes], [e.reward for e in episodes], [e.score for e in episodes],
                    [e.turns for e in episodes], [len(e.context_starts) for e in episodes], step_seconds)


async def _step_all(env: Environment, episodes: list[_Episode], actions: list[Completion], turn: int) -> list[StepResult]:
    if len(actions) != len(episodes):
        raise RuntimeError(f"the rollout engine returned {len(actions)} completions for {len(episodes)} episodes")
    return list(await asyncio.gather(*(_step_one(env, e, a.text, turn) for e, a in zip(episodes, actions))))


async def _step_one(env: Environment, episode: _Episode, action: str, turn: int) -> StepResult:
    try:
        value = await env.step(episode.state, action, episode.extra_info)
    except Exception as error:
        raise EnvStepError(f"environment {env.reference!r}: step raised on turn {turn} "
                           f"({type(error).__name__}: {error})\n  action: {_excerpt(action)!r}") from error
    return check_step_result(value, env.reference)


def _excerpt(text: str) -> str:
    return text if len(text) <= EXCERPT_CHARS else f"{text[:EXCERPT_CHARS]} [... {len(text) - EXCERPT_CHARS} chars]"
