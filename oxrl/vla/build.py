"""A `vla` section made real: its action tokens, its episode runner, its demonstrations as training examples, and
demonstrations recorded from a scripted expert.

The action tokens are a pure function of the config (and of the dataset `vla.stats` names), so SFT, RL and
`oxrl eval` of one config use the same bins. A run writes them, as `action_tokens.json`, to its run folder and to
every model folder it saves (checkpoints, final/), as LeRobot saves a policy's normalisation statistics with it: a
run or an evaluation starting from that model decodes its tokens with the bins it learned them with, whatever the
config would make (from other demonstrations, from the environment's range rather than the data's), and a config
that asks for other bins is refused naming the file and the setting.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import numpy as np

from oxrl.config.schema import Config, DatasetSpec, VLAConfig
from oxrl.data.types import Example, Sequence
from oxrl.vla.action_tokens import ActionTokenError, ActionTokenizer, StateBins, last_vocabulary_ids
from oxrl.vla.envs import Observation, expert, make_env
from oxrl.vla.episodes import Prompter, VLAEpisodes, initial_prompts
from oxrl.vla.lerobot import EpisodeRecord, LeRobotDataset, read_dataset, refuse_to_overwrite, write_dataset

logger = logging.getLogger(__name__)

VALIDATION_SEEDS = 1_000_000  # held-out initial states start here, far from the training ones


ACTION_TOKENS = "action_tokens.json"


def action_tokenizer(vla: VLAConfig, tokenizer, demonstrations: LeRobotDataset | None = None,
                     model: str | None = None) -> ActionTokenizer:
    """The bins saved with the `model` folder (module docstring), else the config's: uniform over the environment's
    action space (else the demonstrations' range), uniform over the demonstrations' 1st..99th percentiles, or their
    quantiles; `vla.stats` names the demonstrations when set. The state's bins (`state_bins`) ride with them."""
    demonstrations = _demonstrations(vla, demonstrations)  # read once, for both
    return replace(_action_bins(vla, tokenizer, demonstrations, model), state=state_bins(vla, model, demonstrations))


def _demonstrations(vla: VLAConfig, given: LeRobotDataset | None) -> LeRobotDataset | None:
    """The demonstrations that bound the bins: `vla.stats`' (read unless `given` is that folder), else `given`."""
    if vla.stats is None or (given is not None and Path(given.root).resolve() == Path(vla.stats).resolve()):
        return given
    return read_dataset(Path(vla.stats))


def _action_bins(vla: VLAConfig, tokenizer, demonstrations: LeRobotDataset | None, model: str | None) -> ActionTokenizer:
    first_id = last_vocabulary_ids(tokenizer, vla.bins)
    saved = Path(model) / ACTION_TOKENS if model is not None else None
    if saved is not None and saved.is_file():
        tokens = load_action_tokens(saved)
        differs = [f"{setting} = {mine} (the model's: {theirs})" for setting, mine, theirs in (
            ("vla.bins", vla.bins, tokens.bins), ("vla.chunk", vla.chunk, tokens.chunk),
            ("the first action token id", first_id, tokens.first_id),
            (f"vla.env {vla.env}'s action dimensions", _action_dims(vla), tokens.dims)) if mine not in (theirs, None)]
        if vla.stats is not None and not differs:  # bins the config names explicitly must be the model's
            made = _config_bins(vla, tokenizer, demonstrations, first_id).edges
            if made.shape != tokens.edges.shape or not np.allclose(made, tokens.edges, rtol=1e-9, atol=0):
                differs.append(f"vla.stats = {vla.stats} (its bins' edges are not the model's)")
        if differs:
            raise ValueError(f"{saved}: the model learned its action tokens on other bins than this config makes: "
                             f"{'; '.join(differs)}. They would decode to other actions: match the model's bins, or "
                             "leave vla.stats unset to use them")
        logger.info("vla: the action bins saved with the model (%s)", saved)
        return tokens
    return _config_bins(vla, tokenizer, demonstrations, first_id)


def state_bins(vla: VLAConfig, model: str | None, demonstrations: LeRobotDataset | None = None) -> StateBins | None:
    """How the prompts write the state: None (its values' digits) unless `vla.state_bins`; then the bounds saved with
    the `model` folder, else the demonstrations' (`vla.stats`, else `demonstrations`, the SFT's first dataset). A
    model that learned the state written otherwise than the config asks is refused, as for the action bins."""
    saved = Path(model) / ACTION_TOKENS if model is not None else None
    if saved is not None and saved.is_file():
        learned = load_action_tokens(saved).state
        if (learned.bins if learned is not None else None) != vla.state_bins:
            written = "as its values' digits" if learned is None else f"in {learned.bins} bins"
            raise ValueError(f"{saved}: the model learned the state written {written}, but vla.state_bins is "
                             f"{vla.state_bins}: set vla.state_bins to match")
        if learned is not None and vla.stats is not None:
            made = _state_bins_of(_demonstrations(vla, demonstrations), vla.state_bins)
            if not (np.allclose(made.low, learned.low, rtol=1e-9, atol=0)
                    and np.allclose(made.high, learned.high, rtol=1e-9, atol=0)):
                raise ValueError(f"{saved}: vla.stats = {vla.stats} bounds the state's bins otherwise than the model "
                                 "learned them: leave vla.stats unset to use the model's")
        return learned
    if vla.state_bins is None:
        return None
    demonstrations = _demonstrations(vla, demonstrations)
    if demonstrations is None:
        raise ValueError(f"vla.state_bins = {vla.state_bins} takes the state's bounds from demonstrations: set vla.stats "
                         "to a LeRobot dataset folder (or start from a model saved with them)")
    return _state_bins_of(demonstrations, vla.state_bins)


def _state_bins_of(demonstrations: LeRobotDataset, bins: int) -> StateBins:
    states = demonstrations.states()
    if states is None:
        raise ValueError(f"{demonstrations.root}: vla.state_bins needs the frames' observation.state, which this "
                         "dataset has not")
    try:
        return StateBins.from_states(states, bins)
    except ActionTokenError as error:
        raise ValueError(f"{demonstrations.root}: {error}") from error


def _action_dims(vla: VLAConfig) -> int | None:
    if vla.env is None:
        return None
    env = make_env(vla.env, vla.env_kwargs, vla.instruction)
    try:
        return env.action_dim
    finally:
        env.close()


def _config_bins(vla: VLAConfig, tokenizer, demonstrations: LeRobotDataset | None, first_id: int) -> ActionTokenizer:
    demonstrations = _demonstrations(vla, demonstrations)
    if vla.binning == "uniform" and vla.env is not None:
        env = make_env(vla.env, vla.env_kwargs, vla.instruction)
        try:
            low, high = env.low, env.high
        finally:
            env.close()
        if demonstrations is not None and demonstrations.action_dim != low.shape[0]:
            raise ValueError(f"{demonstrations.root}: actions of {demonstrations.action_dim} dimensions, but vla.env "
                             f"{vla.env!r} takes {low.shape[0]}")
        return ActionTokenizer.uniform(low, high, vla.bins, first_id, vla.chunk)
    if demonstrations is None:
        raise ValueError("the action bins need vla.env (uniform bins over its action space) or demonstrations "
                         "(vla.stats)")
    actions = demonstrations.actions()
    if vla.binning == "uniform":
        return ActionTokenizer.uniform(actions.min(axis=0), actions.max(axis=0), vla.bins, first_id, vla.chunk)
    return getattr(ActionTokenizer, vla.binning)(actions, vla.bins, first_id, vla.chunk)  # uniform_q99, quantile


def save_action_tokens(tokens: ActionTokenizer, folder: Path) -> None:
    """The bins as run: `action_tokens.json` (`load_action_tokens` reads it back exactly)."""
    record = {"first_id": tokens.first_id, "chunk": tokens.chunk, "edges": tokens.edges.tolist()}
    if tokens.state is not None:
        record["state"] = {"bins": tokens.state.bins, "low": tokens.state.low.tolist(), "high": tokens.state.high.tolist()}
    (Path(folder) / ACTION_TOKENS).write_text(json.dumps(record))


def load_action_tokens(path: Path) -> ActionTokenizer:
    """The bins `save_action_tokens` wrote; a damaged file is an error naming it and the field."""
    try:
        record = json.loads(path.read_text())
        fields = {key: record[key] for key in ("first_id", "chunk", "edges")}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not the action bins a vla run saves ({type(error).__name__}: {error})") from error
    edges = np.asarray(fields["edges"], dtype=np.float64) if isinstance(fields["edges"], list) else np.empty(0)
    if edges.ndim != 2 or not np.all(np.isfinite(edges)) or not np.all(np.diff(edges, axis=1) > 0):
        raise ValueError(f"{path}: `edges` must be rows of finite, increasing bin edges, one row per action dimension")
    for key in ("first_id", "chunk"):
        if not isinstance(fields[key], int) or isinstance(fields[key], bool):
            raise ValueError(f"{path}: `{key}` must be an integer, got {fields[key]!r}")
    try:
        return replace(ActionTokenizer.from_edges(edges, fields["first_id"], fields["chunk"]),
                       state=_load_state_bins(record.get("state"), path))
    except ActionTokenError as error:
        raise ValueError(f"{path}: {error}") from error


def _load_state_bins(record, path: Path) -> StateBins | None:
    if record is None:
        return None
    if not isinstance(record, dict) or set(record) != {"bins", "low", "high"}:
        raise ValueError(f"{path}: `state` must hold exactly `bins`, `low` and `high`, got {record!r}")
    if not isinstance(record["bins"], int) or isinstance(record["bins"], bool):
        raise ValueError(f"{path}: `state.bins` must be an integer, got {record['bins']!r}")
    if not all(isinstance(record[key], list) and all(isinstance(v, int | float) and not isinstance(v, bool)
                                                     for v in record[key]) for key in ("low", "high")):
        raise ValueError(f"{path}: `state.low` and `state.high` must be lists of numbers")
    return StateBins.checked(record["low"], record["high"], record["bins"])


class SavedWithActionTokens:
    """What a vla run's model folders are saved with: its processor (or tokenizer), and its action bins beside it."""

    def __init__(self, saved_with, tokens: ActionTokenizer):
        self.saved_with, self.tokens = saved_with, tokens

    def save_pretrained(self, folder, **kwargs) -> None:
        self.saved_with.save_pretrained(folder, **kwargs)
        save_action_tokens(self.tokens, Path(folder))


def saving_action_tokens(tokens: ActionTokenizer, saved_with, run_dir: Path | None) -> SavedWithActionTokens:
    """The bins written to `run_dir` now (rank 0's; None on the other ranks), and to each model folder saved."""
    if run_dir is not None:
        save_action_tokens(tokens, run_dir)
    return SavedWithActionTokens(saved_with, tokens)


def episode_runner(cfg: Config, tokenizer, processor) -> VLAEpisodes:
    """The RL episode runner of the `vla` section (the model must be a vision-language model)."""
    vla = cfg.vla
    _check_vision_language(cfg, processor)
    tokens = action_tokenizer(vla, tokenizer, model=cfg.model.name_or_path)
    logger.info("vla: %s, %d action dimensions x %d bins (%s), chunks of %d (%d executed), at most %d chunks an episode",
                vla.env, tokens.dims, tokens.bins, vla.binning, tokens.chunk, vla.execute or tokens.chunk, vla.max_chunks)
    return VLAEpisodes(vla.env, lambda: make_env(vla.env, vla.env_kwargs, vla.instruction), tokens,
                       Prompter(tokenizer, processor, vla.state, tokens.state), vla.max_chunks, vla.reward, execute=vla.execute)


def _check_vision_language(cfg: Config, processor) -> None:
    if processor is None:
        raise ValueError(f"the `vla` section needs a vision-language model (one with a processor); "
                         f"{cfg.model.name_or_path} is a text model")


def initial_state_seeds(cfg: Config) -> tuple[list[int], list[int]]:
    """Training and held-out reset seeds (`vla.seed_offset`, `rl.task_size`, `rl.validation_size`)."""
    offset = cfg.vla.seed_offset
    held_out = 100 if cfg.rl.validation_size is None else cfg.rl.validation_size
    return (list(range(offset, offset + cfg.rl.task_size)),
            list(range(VALIDATION_SEEDS + offset, VALIDATION_SEEDS + offset + held_out)))


def initial_state_prompts(cfg: Config, train: bool = True, limit: int | None = None) -> tuple[list, list]:
    """The training and held-out initial states as prompts (text and frames; the processor encodes them later). An
    evaluation asks for the first `limit` held-out ones alone (`train` False): each state is a simulator reset and a
    frame, so making `rl.task_size` training states it would not play costs a slow simulator many seconds."""
    train_seeds, held_out = initial_state_seeds(cfg)
    env = make_env(cfg.vla.env, cfg.vla.env_kwargs, cfg.vla.instruction)
    prompter = Prompter(None, None, cfg.vla.state, state_bins(cfg.vla, cfg.model.name_or_path))
    try:
        return (initial_prompts(env, prompter, train_seeds if train else [], f"{cfg.vla.env} (train)"),
                initial_prompts(env, prompter, held_out[:limit], f"{cfg.vla.env} (held out)"))
    finally:
        env.close()


def demonstration_reader(cfg: Config, tokenizer, processor):
    """`data.train` entries of format `lerobot` -> training examples: each frame's prompt (its cameras, its
    episode's instruction, its state), then the action chunk that starts at it as action tokens, the only trained
    tokens. A chunk running past the episode's end repeats its last action (the robot holds still)."""
    _check_vision_language(cfg, processor)
    first = cfg.data.train[0]
    datasets = {first.path: read_dataset(Path(first.path))}  # read once: the bins' and the examples' source
    tokens = action_tokenizer(cfg.vla, tokenizer, datasets[first.path], cfg.model.name_or_path)
    prompter = Prompter(tokenizer, processor, cfg.vla.state, tokens.state)
    logger.info("vla: %d action dimensions x %d bins (%s), chunks of %d", tokens.dims, tokens.bins, cfg.vla.binning,
                tokens.chunk)

    def read(spec: DatasetSpec) -> list[Example]:
        dataset = datasets.pop(spec.path, None) or read_dataset(Path(spec.path))
        if dataset.action_dim != tokens.dims:
            raise ValueError(f"{spec.path}: actions of {dataset.action_dim} dimensions, but the action tokens have "
                             f"{tokens.dims}")
        examples = []
        for episode in dataset.episodes:
            actions = np.stack([frame.action for frame in episode.frames])
            last = len(actions) - 1
            for t, frame in enumerate(episode.frames):
                chunk = actions[[min(t + k, last) for k in range(tokens.chunk)]]
                where = f"{spec.path} episode {episode.index} frame {frame.index}"
                prompt, vision = prompter.encode(Observation(list(frame.images.values()), frame.state),
                                                 cfg.vla.instruction or episode.task, where, frame.index + 1)
                action_ids = tokens.encode(chunk)
                examples.append(Example([Sequence(prompt + action_ids, [False] * len(prompt) + [True] * len(action_ids),
                                                  vision)]))
            if spec.max_rows is not None and len(examples) >= spec.max_rows:
                return examples[: spec.max_rows]
        return examples

    return read, tokens


def record_demonstrations(env_name: str, episodes: int, folder: Path, *, seed: int = 0, max_steps: int = 64,
                          env_kwargs: dict | None = None, instruction: str | None = None,
                          noise: float = 0.0) -> tuple[Path, float]:
    """`episodes` demonstrations of a built-in environment's scripted expert, from reset seeds seed, seed + 1, ...,
    written as a LeRobot dataset; returns the folder and the expert's success rate. Checked before anything runs:
    at least one episode, and a folder that does not exist yet (or is empty).

    `noise` > 0 records what the expert would do from the states a policy's errors lead to (DART, Laskey et al.,
    arXiv:1703.09327): each step executes the expert's action plus Gaussian noise of `noise` times the action
    space's half-width (clipped into the space), and records the expert's own action as the label. Without it an
    expert that goes straight to its goal shows a cloned policy no state off that path, so the policy cannot come
    back from one (panda-reach: docs/benchmarks.md)."""
    if episodes < 1 or max_steps < 1:
        raise ValueError(f"demonstrations need at least 1 episode of at least 1 step, got {episodes} of {max_steps}")
    if not (np.isfinite(noise) and noise >= 0):
        raise ValueError(f"demonstration noise must be a finite number >= 0 (a fraction of the action space's "
                         f"half-width), got {noise}")
    refuse_to_overwrite(folder)
    env = make_env(env_name, env_kwargs, instruction)
    spread = noise * (env.high - env.low) / 2  # the noise's standard deviation in each action dimension
    records, successes = [], 0
    try:
        for episode in range(episodes):
            observation, task = env.reset(seed + episode)
            act = expert(env_name, env_kwargs)  # one per episode: PushT's remembers the push it is making
            perturb = np.random.default_rng([seed + episode])  # each episode's noise its own: it repeats alone
            frames, states, actions = [], [], []
            for _ in range(max_steps):
                action = np.asarray(act(env.info), dtype=np.float64)
                frames.append([np.asarray(image) for image in observation.images])
                states.append(observation.state)
                actions.append(action.astype(np.float32))
                if noise:
                    action = np.clip(action + spread * perturb.standard_normal(action.shape), env.low, env.high)
                transition = env.step(action, f"demonstration {episode}")
                observation = transition.observation
                if transition.success or transition.done:
                    successes += transition.success
                    break
            cameras = {f"observation.images.camera{k}" if len(frames[0]) > 1 else "observation.image":
                       np.stack([f[k] for f in frames]) for k in range(len(frames[0]))}
            records.append(EpisodeRecord(task, cameras, None if states[0] is None else np.stack(states).astype(np.float32),
                                         np.stack(actions)))
    finally:
        env.close()
    return write_dataset(folder, records, fps=10, robot_type=env_name), successes / max(episodes, 1)
