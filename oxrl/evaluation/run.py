"""`oxrl eval`: measure a model, and optionally a baseline on the same prompts, without training.

    oxrl eval MODEL [--task NAME | --data FILE ...] [--reward SPEC ...] [--n K] [--temperature T]
              [--max-new-tokens N] [--limit N] [--engine hf|vllm] [--baseline MODEL] [--out FILE.jsonl]
              [--seed S] [--config CFG.yaml] [--set KEY=VALUE ...] [--trust-config-code]

Everything becomes the `Config` that `oxrl train` reads, so prompts, rewards and sampling mean what
they mean in training, and the RL loop's own functions do the work:

- the config is `--config`, else the run's saved `config.yaml` when MODEL is a run directory, else
  empty; the flags and then the `--set` overrides refine it. A saved `config.yaml` is data, not the user's: a
  setting of it that names code (an extension, a reward or environment file, ...) is refused before anything is
  imported unless `--trust-config-code`, or a flag or `--set` replaces it (oxrl/config/trust.py);
- MODEL is a model folder, a run directory (its `final/`, else its latest checkpoint), a `.gguf`
  file, a hub id or the bundled alias `smollm2-135m-instruct`;
- prompts (`eval_prompts`): with `--data`, every row of the files; otherwise the held-out prompts
  the RL loop validates on (`load_prompts`): a generated task's (`rl.task`, `rl.task_size`,
  `rl.validation_size`, `run.seed`), or the config's `data.validation` or held-out `data.train` rows.
  `--limit N` keeps the first N;
- rewards: `rl.rewards` (`--reward`), else the task's default (`reward_function`); the first reward
  decides correctness (oxrl/loops/rl.py);
- a greedy pass (T = 0, one sample per prompt, `sampling_params(cfg, greedy=True)`: what the RL loop's
  `evaluate` runs) and, with `--n K` > 1, a sampled pass of K samples per prompt at
  `rl.rollout.temperature` for pass@k. Each pass is `sample_and_reward` then `summarise`, as in the
  loop, so `greedy/accuracy` is the `val/accuracy` a training run logs for the same model and prompts.
  `greedy/accuracy_ci95_low` and `_high` bound it (Wilson's score interval over the prompts): 24 held-out robot
  episodes at 50% success are anywhere from 31% to 69%, which a single number hides;
- a config with a `vla` section plays episodes in its simulator; their greedy pass is also written as a video
  (oxrl/vla/video.py): to `--video FILE.gif`, else, when MODEL is a run directory, to `<run dir>/eval_episodes.gif`
  (a `--baseline`'s beside it, `.baseline.gif`).
"""

from __future__ import annotations

import errno
import gc
import json
import logging
import math
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from oxrl.config.names import SAMPLING_ALGORITHMS
from oxrl.config.schema import Config, DataConfig, RLConfig
from oxrl.data.rl_tasks import RLPrompt
from oxrl.evaluation.request import EvalRequest
from oxrl.loops.rl import correct_flags, summarise

logger = logging.getLogger(__name__)

DEFAULT_ALGORITHM = "dr_grpo"  # a Config needs one; evaluation reads only its model, data, rl and run sections


@dataclass
class ModelReport:
    label: str  # MODEL as given
    path: str  # the folder, file or hub id loaded
    metrics: dict[str, float]  # greedy/<metric>, sampled/<metric>, sampled/pass@k (metrics.summarise)


@dataclass
class EvalResult:
    reports: list[ModelReport]
    description: str  # prompts, sampling, rewards: the table's heading


def model_location(name: str) -> tuple[str, Path | None]:
    """(the model MODEL names, the run directory it names or None). A run directory is a folder with run
    outputs and no config.json: its `final/` model, else its latest complete checkpoint."""
    from oxrl.training.checkpoint import latest_checkpoint
    from oxrl.training.run_dir import holds_run
    from oxrl.models.source import ModelNotFoundError

    path = Path(name).expanduser()
    if not path.is_dir() or (path / "config.json").is_file() or (path / "adapter_config.json").is_file() or not holds_run(path):
        return name, None
    if (path / "final").is_dir():
        logger.info("%s is a run directory: evaluating its final model %s", path, path / "final")
        return str(path / "final"), path
    latest = latest_checkpoint(path)
    if latest is None:
        raise ModelNotFoundError(f"{path} is a run directory with no final/ model and no complete checkpoint to evaluate")
    logger.info("%s is a run directory without final/: evaluating its latest checkpoint %s", path, latest)
    return str(latest), path


def eval_config(request: EvalRequest, model_path: str, run_dir: Path | None) -> Config:
    """The config file (module docstring), then the flags, then the `--set` overrides. A run directory's config.yaml
    is data: a setting of it that names code is refused unless `trust_config_code`, or the flags or `--set` set it."""
    from oxrl.config.load import apply_override, load_config, parse_override
    from oxrl.config.trust import as_data

    source, saved = request.config, False
    if source is None and run_dir is not None and (run_dir / "config.yaml").is_file():
        source, saved = str(run_dir / "config.yaml"), True
        logger.info("prompts, rewards and sampling as in the run's %s (flags and --set override them)", source)
    given = {".".join(keys): value for keys, value in map(parse_override, request.overrides)}
    if request.rewards:
        given = {"rl.rewards": [{"name": name} for name in request.rewards], **given}
    tree = {"algorithm": {"name": DEFAULT_ALGORITHM}}
    if source is not None:
        screen = as_data(given) if saved and not request.trust_config_code else None
        tree = load_config(source, screen=screen).model_dump(mode="json")
    if tree["algorithm"]["name"] not in SAMPLING_ALGORITHMS:
        # An offline run's config: evaluation samples, so it keeps what sampling reads (the model, the seed, the
        # `rl` section) under the default RL algorithm; the offline sections would be settings nobody reads.
        tree = {"run": tree["run"], "model": tree["model"], "rl": tree["rl"], "algorithm": {"name": DEFAULT_ALGORITHM},
                **({"vla": tree["vla"]} if tree.get("vla") else {})}
    given = {"rl.rollout.temperature": request.temperature, "rl.rollout.max_new_tokens": request.max_new_tokens,
             "rl.rollout.engine": request.engine, "run.seed": request.seed}
    flags = {"model.name_or_path": model_path, "rl.rollout.n": request.n, "strategy.name": "single",
             **{key: value for key, value in given.items() if value is not None}}
    unset = {key: RLConfig.model_fields[key].get_default(call_default_factory=True) for key in ("task_size", "task_config")}
    if request.task is not None:  # a task replaces the config's prompt files (and another task's options)
        flags.update({"rl.task": request.task, "data.train": [], "data.validation": [],
                      "data.validation_fraction": DataConfig().validation_fraction, "data.num_examples": None})
        if request.task != tree.get("rl", {}).get("task"):
            flags["rl.task_config"] = unset["task_config"]
    if request.data:  # files replace the config's task (and with it the task's default reward and options)
        flags.update({"rl.task": None, **{f"rl.{key}": value for key, value in unset.items()}})
    if request.rewards:
        flags["rl.rewards"] = [{"name": name} for name in request.rewards]
    for key, value in flags.items():
        apply_override(tree, key.split("."), value)
    return load_config(None, request.overrides, base=tree)


def eval_prompts(cfg: Config, data_files: list[str], limit: int | None) -> tuple[list[RLPrompt], str]:
    """The prompts to evaluate on (module docstring), and where they come from in words."""
    from oxrl.data.rl_prompts import read_rl_prompts
    from oxrl.data.rl_tasks import prompt_template
    from oxrl.loops.rl_setup import load_prompts

    rl = cfg.rl
    if cfg.vla is not None and data_files:
        raise ValueError(f"--data {data_files[0]}: a config with a `vla` section is evaluated on its simulator's held-out "
                         "initial states (rl.validation_size of them), not on prompt files")
    if data_files:
        template = prompt_template(rl)
        prompts = [prompt for path in data_files for prompt in read_rl_prompts(path, template=template)]
        source = ", ".join(data_files)
    elif cfg.vla is not None:  # the held-out states alone, no more than `limit`
        from oxrl.vla.build import initial_state_prompts

        prompts = initial_state_prompts(cfg, train=False, limit=limit)[1]
        source = f"{cfg.vla.env}: {len(prompts)} held-out initial states"
    elif rl.task is None and not cfg.data.train:
        raise ValueError("nothing to evaluate on: give --task (e.g. arithmetic) or --data FILE, or a --config or run "
                         "directory whose config names them")
    else:
        prompts = load_prompts(cfg, rl)[1]
        source = f"{rl.task} held-out, seed {cfg.run.seed}" if rl.task is not None else "the config's validation prompts"
        if not prompts:
            raise ValueError(f"no held-out prompts to evaluate on ({source}): set rl.validation_size above 0, or give "
                             "--data FILE to evaluate on every row of a file")
    if limit is not None:
        if limit > len(prompts):
            logger.warning("--limit %d: there are only %d prompts (%s)", limit, len(prompts), source)
        prompts = prompts[:limit]
    return prompts, source


def evaluate_models(request: EvalRequest) -> EvalResult:
    """Check every input, then evaluate MODEL (and the baseline) on the same prompts; rows to `request.out`."""
    from oxrl.training.build import build_strategy
    from oxrl.loops.rl_setup import reward_function
    from oxrl.models.source import resolve_source
    from oxrl.rollout.build import check_engine

    model_path, run_dir = model_location(request.model)
    resolve_source(model_path)  # a missing folder or file fails now, before any work
    baseline = model_location(request.baseline)[0] if request.baseline is not None else None
    if baseline is not None:
        resolve_source(baseline)
    cfg = eval_config(request, model_path, run_dir)
    prompts, source = eval_prompts(cfg, request.data, request.limit)
    video = _video_path(request, cfg, run_dir)
    reward_fn = reward_function(cfg, cfg.rl)  # None with an episode runner: episodes reward themselves
    strategy = build_strategy(cfg)
    check_engine(cfg.rl.rollout, strategy)
    if cfg.rl.rollout.n > 1 and cfg.rl.rollout.temperature == 0:
        logger.warning("--n %d at temperature 0 repeats the greedy completion: pass@k is the greedy accuracy; "
                       "set --temperature above 0", cfg.rl.rollout.n)
    description = _describe(cfg, len(prompts), source, reward_fn)
    logger.info("evaluating on %s", description)
    models = [(request.model, cfg, video)]
    if baseline is not None:
        # The baseline is loaded with its own tokenizer: the same prompt texts, its own token ids.
        model = cfg.model.model_copy(update={"name_or_path": baseline, "tokenizer": None})
        models.append((request.baseline, cfg.model_copy(update={"model": model}),
                       None if video is None else video.with_suffix(".baseline.gif")))
    reports = []
    with _SampleWriter(request.out) as writer:
        for label, model_cfg, film_to in models:
            reports.append(_evaluate_model(label, model_cfg, prompts, reward_fn, strategy, writer, film_to))
            gc.collect()  # the model just evaluated goes before the next one loads
    return EvalResult(reports, description)


def _video_path(request: EvalRequest, cfg: Config, run_dir: Path | None) -> Path | None:
    """Where the greedy episodes' video goes (module docstring); `--video` without a `vla` section is refused."""
    if request.video is not None:
        if cfg.vla is None:
            raise ValueError(f"--video {request.video}: only a config with a `vla` section plays episodes to film")
        return Path(request.video)
    return run_dir / "eval_episodes.gif" if cfg.vla is not None and run_dir is not None else None


def wilson_interval(successes: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's score interval for a success rate (Wilson 1927, JASA 22:209; z = 1.96: 95%). Unlike p +- z * se it
    stays within [0, 1] and is not empty at 0 or `total` successes, the rates a few robot episodes often give."""
    if total < 1 or not 0 <= successes <= total:
        raise ValueError(f"a success rate needs 0 <= successes <= total and total >= 1, got {successes} of {total}")
    p, z2 = successes / total, z * z
    centre = (p + z2 / (2 * total)) / (1 + z2 / total)
    half = z / (1 + z2 / total) * math.sqrt(p * (1 - p) / total + z2 / (4 * total * total))
    return max(0.0, centre - half), min(1.0, centre + half)


def _evaluate_model(label: str, cfg: Config, prompts: list[RLPrompt], reward_fn, strategy, writer: _SampleWriter,
                    video: Path | None = None) -> ModelReport:
    from oxrl.loops.rl import sampling_params
    from oxrl.data.rl_tasks import encode_prompts
    from oxrl.loops.rl_setup import environment
    from oxrl.models.load import load_model, load_processor, load_tokenizer
    from oxrl.rollout.build import build_engine
    from oxrl.runner import set_seed

    tokenizer = load_tokenizer(cfg.model)
    processor = load_processor(cfg.model, tokenizer)  # a vision-language model's; None for a text model
    env = environment(cfg, tokenizer, processor)
    batch = encode_prompts(prompts, tokenizer, processor=processor)
    model = load_model(cfg.model, strategy.device).requires_grad_(False)
    engine = build_engine(cfg.rl.rollout, model, tokenizer, strategy, cfg.run.seed, processor)
    passes = {"greedy": sampling_params(cfg, greedy=True)}
    if cfg.rl.rollout.n > 1:
        passes["sampled"] = sampling_params(cfg)
    metrics: dict[str, float] = {}
    try:
        for name, params in passes.items():
            set_seed(cfg.run.seed)  # both models sample from the same RNG state
            if video is not None:
                env.films = [] if name == "greedy" else None
            completions, scored = _sample_with_progress(engine, reward_fn, env, batch, params, f"{label} ({name})",
                                                        max(1, cfg.rl.rollout.max_batch_size // params.n))
            summary = summarise(completions, scored)
            if name == "sampled":
                del summary["accuracy"]  # over all samples: pass@1 exactly
            else:
                low, high = wilson_interval(sum(correct_flags(scored.components)), len(completions))
                summary.update({"accuracy_ci95_low": low, "accuracy_ci95_high": high})
                if video is not None:
                    from oxrl.vla.video import write_episodes_gif

                    logger.info("%s: %d episodes filmed to %s", label, len(env.films),
                                write_episodes_gif(env.films, video))
            metrics.update({f"{name}/{key}": value for key, value in summary.items()})
            writer.write(label, name, batch, completions, scored)
    finally:
        engine.close()
    headline = {key: metrics[key] for key in ("greedy/accuracy", f"sampled/pass@{cfg.rl.rollout.n}", "greedy/reward/mean") if key in metrics}
    logger.info("%s: %s", label, ", ".join(f"{key} {_cell(key, value)}" for key, value in headline.items()))
    return ModelReport(label, cfg.model.name_or_path, metrics)


def _sample_with_progress(engine, reward_fn, env, batch, params, what: str, chunk: int):
    """`sample_and_reward` over the batch in chunks of `chunk` prompts, with a progress bar: a pass over a few hundred
    prompts takes minutes on a CPU. `chunk` is what the `hf` engine decodes at once (rollout.max_batch_size // n
    prompts), so its calls, and the samples they draw from the seeded RNG, are the same as in one call."""
    from dataclasses import replace

    from tqdm import tqdm

    from oxrl.loops.rl import sample_and_reward
    from oxrl.rewards.combine import RewardOutput

    completions, parts = [], []
    total = len(batch.prompt_ids)
    with tqdm(total=total, desc=what, unit="prompt", dynamic_ncols=True) as bar:
        for start in range(0, total, chunk):
            indices = list(range(start, min(start + chunk, total)))
            # A seeded engine seeds prompt i of a call with seed + i: the chunk's prompts keep their own seeds.
            seeded = params if params.seed is None else replace(params, seed=params.seed + start)
            sampled, scored, _ = sample_and_reward(engine, reward_fn, env, batch.subset(indices), seeded)
            completions += [replace(c, prompt_index=c.prompt_index + start) for c in sampled]
            parts.append(scored)
            bar.update(len(indices))
    return completions, RewardOutput.concat(parts)


def _describe(cfg: Config, count: int, source: str, reward_fn) -> str:
    r = cfg.rl.rollout
    sampled = f"; sampled: {r.n} per prompt at T={r.temperature:g}" if r.n > 1 else ""
    if r.n > 1 and (r.top_p < 1 or r.top_k > 0):
        sampled += f", top_p {r.top_p:g}, top_k {r.top_k}"
    rewards = ", ".join(f"{b.label} x{b.weight:g}" for b in reward_fn.rewards) if reward_fn is not None else (
        f"environment {cfg.rl.env.path}" if cfg.vla is None else f"simulator {cfg.vla.env} (success rate)")
    return (f"{count} prompts ({source}); greedy: 1 per prompt at T=0{sampled}; at most {r.max_new_tokens} new tokens; "
            f"engine {r.engine}; rewards: {rewards}")


class _SampleWriter:
    """Every sample as a JSON line in `path` (None: nowhere). Written to `<path>.partial` and renamed when the
    evaluation is complete, so a failed one leaves no half-written file (nor removes an older one)."""

    def __init__(self, path: str | None):
        self.path = Path(path) if path is not None else None
        self.rows = 0
        self.file = None

    def __enter__(self) -> _SampleWriter:
        if self.path is not None:
            if self.path.is_dir():
                raise IsADirectoryError(errno.EISDIR, "is a folder: --out names the JSONL file to write", str(self.path))
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.partial = self.path.with_name(f"{self.path.name}.partial")
            self.file = self.partial.open("w", encoding="utf-8")
        return self

    def write(self, label: str, pass_name: str, batch, completions, scored) -> None:
        if self.file is None:
            return
        seen: Counter = Counter()
        for index, (completion, correct) in enumerate(zip(completions, correct_flags(scored.components))):
            prompt = completion.prompt_index
            row = {"model": label, "pass": pass_name, "prompt_index": prompt, "sample": seen[prompt],
                   "origin": batch.origins[prompt], "prompt": batch.prompt_texts[prompt],
                   "answer": batch.fields[prompt].get("answer"), "completion": completion.text,
                   "rewards": {name: scores[index] for name, scores in scored.components.items()},
                   "reward": scored.totals[index], "correct": correct, "finish_reason": completion.finish_reason,
                   "tokens": completion.num_sampled}
            seen[prompt] += 1
            self.file.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
            self.rows += 1

    def __exit__(self, error_type, error, traceback) -> None:
        if self.file is None:
            return
        self.file.close()
        if error_type is None:
            os.replace(self.partial, self.path)
            logger.info("%d samples written to %s", self.rows, self.path)
        else:
            self.partial.unlink(missing_ok=True)


TABLE_ORDER = ("accuracy", "pass@", "reward", "response_length", "truncated_fraction")


def format_table(result: EvalResult) -> str:
    """The metrics of every model side by side, one row per metric: correctness first, greedy before sampled."""
    keys = list(dict.fromkeys(key for report in result.reports for key in report.metrics))
    keys.sort(key=lambda key: (next((i for i, start in enumerate(TABLE_ORDER) if key.split("/", 1)[1].startswith(start)),
                                    len(TABLE_ORDER)), not key.startswith("greedy/")))
    header = ["metric", *(report.label for report in result.reports)]
    rows = [[key, *(_cell(key, report.metrics.get(key)) for report in result.reports)] for key in keys]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in [header, *rows]]
    return f"{result.description}\n\n" + "\n".join(lines) + "\n"


def _cell(key: str, value: float | None) -> str:
    if value is None:
        return "-"
    if "accuracy" in key or key.endswith("truncated_fraction") or "pass@" in key:
        return f"{100 * value:.1f}%"
    if key.endswith("length/max"):
        return f"{value:.0f}"
    if "length" in key:
        return f"{value:.1f}"
    return f"{value:.3f}"
