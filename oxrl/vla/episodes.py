"""Vision-language-action episodes: a robot environment stepped by action chunks a rollout engine samples.

One episode (SimpleVLA-RL, arXiv:2509.09674, on OpenVLA-OFT's action tokens):

    observation 0 -> prompt 0 (frames + instruction + state) -> action tokens 0 -> step the simulator chunk times
    observation 1 -> prompt 1 -> action tokens 1 -> ...            until success, the end, or `vla.max_chunks`

Each turn's prompt is a fresh context (the frames of that moment; no earlier frame is re-read), so the episode is
one `Completion`: the first prompt, then action tokens (trained, with the engine's log-probs) and each later
prompt (written by the environment: untrained, a `context_starts` entry with its frames in `context_vision`).
The trainer scores every turn in the context the engine sampled it in, and the episode's log-prob is the sum over
all its action tokens. A group is `rl.rollout.n` episodes from the same initial state (the same reset seed); the
episode's reward is its success (1 or 0, `vla.reward: success`), the environment's summed reward (`env`) or its
highest one (`env_max`, LeRobot's PushT score: the best coverage of the goal), its score its success, so held-out
accuracy is the success rate.

Every prompt, the first and the later ones and the demonstrations' (`oxrl/vla/data.py`), is made by one
`Prompter`, so training, rollouts and evaluation read the same text.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from oxrl.data.rl_tasks import RLPrompt, encode_prompts
from oxrl.data.formats import prompt_messages_with_images
from oxrl.data.types import RLPromptBatch, VisionInputs
from oxrl.loops.multiturn import Episodes
from oxrl.rollout.base import Completion, SamplingParams
from oxrl.vla.action_tokens import ActionTokenError, ActionTokenizer, StateBins
from oxrl.vla.envs import Observation, RobotEnv, RobotEnvError
from oxrl.vla.video import EpisodeFilm


class EpisodeError(RuntimeError):
    """An episode that cannot go on: a non-action token, a simulator error, a frame of the wrong size."""


@dataclass(frozen=True)
class Prompter:
    """Frames + instruction + state -> a vision-language prompt's ids (the generation header last) and images."""

    tokenizer: object
    processor: object
    with_state: bool = True
    state_bins: StateBins | None = None  # the state as its bins (`vla.state_bins`), else its values' digits

    def text(self, task: str, state: np.ndarray | None) -> str:
        if not self.with_state or state is None:
            return task
        if self.state_bins is not None:
            return f"{task}\nstate: {self.state_bins.text(state)}"
        return f"{task}\nstate: " + " ".join(f"{value:.3f}" for value in state)

    def prompt(self, observation: Observation, task: str, source: str, row: int, fields: dict | None = None) -> RLPrompt:
        messages = prompt_messages_with_images(self.text(task, observation.state), len(observation.images), source, row)
        return RLPrompt(messages=messages, fields=dict(fields or {}), source=source, row=row, images=observation.images)

    def encode(self, observation: Observation, task: str, source: str, row: int) -> tuple[list[int], VisionInputs]:
        batch = encode_prompts([self.prompt(observation, task, source, row)], self.tokenizer, processor=self.processor)
        return batch.prompt_ids[0], batch.vision[0]


@dataclass
class _Episode:
    prompt_index: int
    seed: int
    env: RobotEnv
    task: str
    prompt_ids: list[int]
    vision: VisionInputs
    context: list[int]  # what the engine sees next: the latest prompt
    current_vision: VisionInputs  # and its frames
    completion_ids: list[int] = field(default_factory=list)
    loss_mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    context_starts: list[int] = field(default_factory=list)
    later_vision: list[VisionInputs] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    reward: float = 0.0  # the environment's rewards, summed
    best: float = float("-inf")  # and their maximum
    success: bool = False
    chunks: int = 0
    done: bool = False
    film: EpisodeFilm | None = None  # its first camera's frames, when the runner films (`VLAEpisodes.films`)

    def completion(self) -> Completion:
        return Completion(self.prompt_index, self.prompt_ids, self.completion_ids, self.logprobs, "length",
                          " | ".join(self.actions), loss_mask=self.loss_mask, context_starts=self.context_starts,
                          vision=self.vision, context_vision=self.later_vision)


@dataclass
class VLAEpisodes:
    """The episode runner of a VLA run: initial states as RL prompts (`prompts`), episodes as completions (`run`)."""

    env_name: str
    make_env: object  # () -> RobotEnv
    tokens: ActionTokenizer
    prompter: Prompter
    max_chunks: int
    reward: str = "success"  # success | env | env_max
    execute: int | None = None  # actions of each chunk stepped (receding horizon); None: all of them
    films: list[EpisodeFilm] | None = None  # a list: every episode `run` plays is filmed into it (`oxrl eval`'s video)

    @property
    def reference(self) -> str:
        return f"vla.env {self.env_name}"

    @property
    def turn_tokens(self) -> int:
        """What a turn samples: one action chunk (rl.rollout.max_new_tokens and stop are not read under `vla`)."""
        return self.tokens.tokens_per_chunk

    def params(self, params: SamplingParams) -> SamplingParams:
        """Sampling of one action chunk: exactly its tokens, from the action tokens only."""
        return replace(params, max_new_tokens=self.turn_tokens, stop=[],
                       allowed_token_ids=self.tokens.token_ids)

    def run(self, engine, batch: RLPromptBatch, params: SamplingParams) -> Episodes:
        """`params.n` episodes from each prompt's initial state, every unfinished one's next chunk sampled together."""
        params = self.params(params)
        first = engine.generate(batch.prompt_ids, params, batch.vision)
        started = time.perf_counter()
        episodes: list[_Episode] = []
        try:  # every environment made is closed, whatever stops the episodes
            for completion in first:
                episodes.append(self._start(completion, batch))
            stepping = time.perf_counter() - started
            active, sampled = episodes, first
            for chunk in range(1, self.max_chunks + 1):
                if chunk > 1:
                    sampled = engine.generate([e.context for e in active], replace(params, n=1),
                                              [e.current_vision for e in active])
                started = time.perf_counter()
                for episode, completion in zip(active, sampled, strict=True):
                    self._act(episode, completion, chunk)
                stepping += time.perf_counter() - started
                active = [e for e in active if not e.done]
                if not active:
                    break
        finally:
            for episode in episodes:
                episode.env.close()
        if self.films is not None:
            for episode in episodes:
                episode.film.success = episode.success
                self.films.append(episode.film)
        rewards = [episode_reward(e, self.reward) for e in episodes]
        return Episodes([e.completion() for e in episodes], rewards, [float(e.success) for e in episodes],
                        [e.chunks for e in episodes], [len(e.context_starts) for e in episodes], stepping)

    def _start(self, sampled: Completion, batch: RLPromptBatch) -> _Episode:
        """A fresh environment reset to the prompt's seed, which must show what the prompt shows."""
        seed = int(batch.fields[sampled.prompt_index]["seed"])
        env = self.make_env()
        observation, task = self._guarded(lambda: env.reset(seed), f"reset(seed={seed})")
        prompt_ids, vision = batch.prompt_ids[sampled.prompt_index], batch.vision[sampled.prompt_index]
        if self.prompter.encode(observation, task, self.reference, seed)[0] != prompt_ids:
            raise EpisodeError(f"{self.reference}: reset(seed={seed}) gave another initial observation than when the "
                               "prompts were made: the environment must be deterministic given its reset seed")
        film = EpisodeFilm(seed, [observation.images[0]]) if self.films is not None else None
        return _Episode(sampled.prompt_index, seed, env, task, list(prompt_ids), vision, list(prompt_ids), vision,
                        film=film)

    def _act(self, episode: _Episode, sampled: Completion, chunk: int) -> None:
        """Decode the sampled chunk, step the simulator with each action in turn, and append the next prompt."""
        where = f"episode of seed {episode.seed}, chunk {chunk}"
        try:
            actions = self.tokens.decode(sampled.completion_ids)
        except ActionTokenError as error:
            raise EpisodeError(f"{self.reference}: {where}: the engine sampled a non-action chunk: {error} (an engine "
                               "must honour SamplingParams.allowed_token_ids)") from error
        # Receding horizon: the chunk's later actions are sampled again from the frames then. The episode keeps the
        # tokens of the actions it executed: the trainer scores what acted, each token in the context it was sampled
        # in (the tokens after it cannot change its log-prob).
        actions = actions[: self.execute]
        executed = len(actions) * self.tokens.dims
        episode.completion_ids += sampled.completion_ids[:executed]
        episode.loss_mask += [True] * executed
        episode.logprobs += sampled.logprobs[:executed]
        episode.actions.append(" ".join(f"{v:.3g}" for v in actions.ravel()))
        episode.chunks = chunk
        for k, action in enumerate(actions):
            # the policy sees only the frames after a chunk's last action, and none after the episode's last chunk
            observe = episode.film is not None or (k == len(actions) - 1 and chunk < self.max_chunks)
            transition = self._guarded(lambda: episode.env.step(action, f"{where}, action {k}", observe),
                                       f"{where}, action {k}")
            episode.reward += transition.reward
            episode.best = max(episode.best, transition.reward)
            episode.success = episode.success or transition.success
            if episode.film is not None:
                episode.film.frames.append(transition.observation.images[0])
            if transition.done or episode.success:
                episode.done = True
                break
        if episode.done or chunk == self.max_chunks:
            episode.done = True
            return
        ids, vision = self.prompter.encode(transition.observation, episode.task, self.reference, episode.seed)
        episode.context_starts.append(len(episode.completion_ids))
        episode.completion_ids += ids
        episode.loss_mask += [False] * len(ids)
        episode.later_vision.append(vision)
        episode.context, episode.current_vision = list(ids), vision

    def _guarded(self, call, where: str):
        return guarded(call, self.reference, where)


def episode_reward(episode: _Episode, kind: str) -> float:
    """`vla.reward`: success (1 or 0), the environment's rewards summed (`env`), or their maximum (`env_max`)."""
    return {"success": float(episode.success), "env": episode.reward, "env_max": episode.best}[kind]


def guarded(call, reference: str, where: str):
    """`call()`, a simulator error becoming one that names the environment and the step."""
    try:
        return call()
    except RobotEnvError:
        raise
    except Exception as error:
        raise EpisodeError(f"{reference}: the simulator raised at {where}: {type(error).__name__}: {error}") from error


def initial_prompts(env: RobotEnv, prompter: Prompter, seeds: list[int], source: str) -> list[RLPrompt]:
    """Each seed's initial observation as a prompt (its row's `seed` field resets the environment to it)."""
    prompts = []
    for row, seed in enumerate(seeds, start=1):
        observation, task = guarded(lambda: env.reset(seed), f"vla.env {env.name}", f"reset(seed={seed})")
        prompts.append(prompter.prompt(observation, task, source, row, {"seed": seed, "task": task}))
    return prompts
