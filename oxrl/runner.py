"""One run, start to finish: config -> run directory -> tokenizer -> inputs -> model -> loop -> save.

Every kind of run, offline (`OfflineRun`), RL and online (`RLRun`), goes through the one lifecycle `run_in`;
a kind says only how it reads its inputs, loads its models and trains. Everything that can fail on bad input
(config, algorithm name, run directory, data rows, prompts, rewards) fails before the model is loaded or any
step is computed. The run directory is claimed (locked, checked: oxrl/training/run_dir.py) before anything is
written; `config.yaml` is written once the inputs are read.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from oxrl.config.load import save_config
from oxrl.config.schema import Config
from oxrl.models.fit import log_memory_estimate
from oxrl.training.model_card import model_card

logger = logging.getLogger(__name__)


@dataclass
class RunResult:
    run_dir: Path
    final_model_dir: Path | None
    losses: list[float]
    final_metrics: dict[str, float]
    samples: dict[str, list[dict]] = field(default_factory=dict)
    metrics: list[dict] = field(default_factory=list)  # metrics.jsonl's rows, every logged step (filled by oxrl.trainer)


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@contextmanager
def claimed_run(cfg: Config, strategy):
    """Yield (config with `run.name` resolved, run directory), the directory locked by rank 0 until the
    block ends, its log copied to `<run>/train.log`, and every RNG seeded. Rank 0 picks the default name and checks the directory; the other
    ranks take its name and fail with its error, so that none waits in a collective for a rank that left."""
    from oxrl.logging.run_log import run_logged
    from oxrl.training.run_dir import RunDirError, claim_run_dir, default_run_name, run_dir_for

    name = cfg.run.name or (default_run_name(cfg.algorithm.name, cfg.run.output_dir) if strategy.is_main else None)
    lock, error = None, None
    if strategy.is_main:
        try:
            lock = claim_run_dir(run_dir_for(cfg.run.output_dir, name), _named(cfg, name), _check_samples_ahead)
        except Exception as caught:  # raised below, once the other ranks have heard of it
            error = caught
    name, message = strategy.world_objects((name, None if error is None else str(error)))[0]
    if error is not None:
        raise error
    if message is not None:
        raise RunDirError(f"rank 0 could not claim the run directory: {message}")
    cfg = _named(cfg, name)
    set_seed(cfg.run.seed)
    run_dir = run_dir_for(cfg.run.output_dir, name)
    try:
        with run_logged(run_dir, strategy.is_main):  # <run>/train.log; a failure's traceback in failure.txt
            yield cfg, run_dir
    finally:
        if lock is not None:
            lock.release()


def _check_samples_ahead(path: Path, step: int) -> None:
    """A resumed checkpoint's rank_state file: a pipelined RL run's samples ahead, checked before the model loads
    (oxrl/loops/pipeline_state.py, loaded by such a resume only)."""
    from oxrl.loops.pipeline_state import check_samples_ahead

    check_samples_ahead(path, step)


def _named(cfg: Config, name: str) -> Config:
    return cfg.model_copy(update={"run": cfg.run.model_copy(update={"name": name})})


def write_config(cfg: Config, run_dir: Path, is_main: bool) -> None:
    """The resolved config, written (by rank 0) once the inputs are checked; the console gets a summary of it."""
    if is_main:
        save_config(cfg, run_dir / "config.yaml")
        logger.info("%s", config_summary(cfg, run_dir))


def config_summary(cfg: Config, run_dir: Path) -> str:
    """Two lines: where the run and its whole config are, and what it runs with the settings that differ from
    the defaults (a whole config is some 180 lines, too many to read at every start). A `vla` run gets a third, its
    whole `vla` section: the section's defaults (bins, chunk, reward) shape the run as much as what was changed."""
    from oxrl.config.load import model_name, non_default_settings

    skipped = {"run.name", "run.output_dir", "algorithm.name", "model.name_or_path"}  # said on the first line
    changed = ", ".join(f"{key}={_short(value)}" for key, value, _ in non_default_settings(cfg)
                        if key not in skipped and key.split(".")[0] != "vla")
    vla = "\n  vla: " + ", ".join(f"{k}={_short(v)}" for k, v in cfg.vla.model_dump(mode="json").items()) if cfg.vla else ""
    return (f"run directory {run_dir} (the whole config: {run_dir / 'config.yaml'})\n"
            f"  {cfg.algorithm.name} on {model_name(cfg)}; changed from the defaults: {changed or 'nothing'}{vla}")


def _short(value, limit: int = 60) -> str:
    """At most `limit` characters on one line: a string's newlines and other control characters (a prompt
    template's) are escaped as JSON escapes them (`\\n`), its quotes dropped."""
    text = json.dumps(value, ensure_ascii=False)[1:-1] if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def save_final(strategy, tokenizer, run_dir: Path, lora_save: str, card: str | None = None) -> Path | None:
    """`<run>/final`: written into `.final.partial` and renamed when complete, so a failed save leaves no
    half-written `final/` (nor removes an older one). Every rank calls it; the path on rank 0. `card`: the text of
    its README.md (oxrl/training/model_card.py)."""
    from oxrl.training.folders import publish_folder, writing_folder

    partial, final = run_dir / ".final.partial", run_dir / "final"
    if strategy.is_main and partial.exists():
        shutil.rmtree(partial)
    with writing_folder(partial, final, remove_on_error=strategy.is_main):
        written = strategy.save_hf_folder(tokenizer, partial, lora_save=lora_save)
        if written is not None and card is not None:
            (partial / "README.md").write_text(card)
        return publish_folder(partial, final) if written is not None else None


def run_rl(cfg: Config, remote=None) -> RunResult:
    """RL with verifiable rewards: prompts and rewards are checked before the model loads. `remote`: this process is
    a trainer rank of a Ray run (oxrl/cluster), whose rollout and reward workers it samples and scores through."""
    from oxrl.rollout.build import check_engine
    from oxrl.training.build import build_strategy

    strategy = build_strategy(cfg)
    if remote is None:
        check_engine(cfg.rl.rollout, strategy)  # e.g. vLLM missing: fail before any model loads
    with claimed_run(cfg, strategy) as (cfg, run_dir):
        return run_in(run_dir, cfg, strategy, RLRun(cfg, strategy, remote))


@dataclass
class Trained:
    """What a run's training returned, in the terms the lifecycle reports."""

    losses: list[float]
    final_metrics: dict[str, float]
    samples: dict[str, list[dict]] = field(default_factory=dict)  # RL: the first and last steps' completions
    summary: dict | None = None  # RL: summary.json, with the held-out accuracy before and after

    @property
    def accuracy(self) -> tuple[float | None, float | None] | None:
        """RL's held-out accuracy (before, after), either None when not measured; None for offline runs."""
        return None if self.summary is None else (self.summary["accuracy_before"], self.summary["accuracy_after"])


def run_in(run_dir: Path, cfg: Config, strategy, job) -> RunResult:
    """One run's lifecycle, the same for every kind (`OfflineRun`, `RLRun`): tokenizer -> inputs read and checked
    -> memory estimate -> config.yaml -> models -> answers before -> train -> final folder -> answers after ->
    samples, summary and report (rank 0)."""
    from oxrl.models.load import load_processor, load_tokenizer
    from oxrl.training.signals import StopSignals

    started = time.monotonic()
    tokenizer = load_tokenizer(cfg.model)
    processor = load_processor(cfg.model, tokenizer)  # a vision-language model's; None for a text model
    saved_with = processor or tokenizer  # what checkpoints and the final folder are saved with
    row_tokens = job.read_inputs(tokenizer, processor)  # bad input stops the run here, before any model loads
    log_memory_estimate(cfg, strategy.device, strategy.world_size, row_tokens)
    write_config(cfg, run_dir, strategy.is_main)
    if job.action_tokens is not None:  # a VLA's action bins (oxrl/vla): in the run folder and every model folder
        from oxrl.vla.build import saving_action_tokens

        saved_with = saving_action_tokens(job.action_tokens, saved_with, run_dir if strategy.is_main else None)
    model = job.load(tokenizer, processor, saved_with)
    answers: dict[str, list[dict]] = {}
    try:
        answers["before"] = answer_samples(cfg, model, tokenizer)
        # SIGTERM, Ctrl-C: stop when a step ends (a Ray trainer rank leaves its signals to Ray, which stops its actors)
        with StopSignals(strategy, cfg.checkpoint.on_signal, catch=cfg.run.launcher != "ray") as stop:
            trained = job.train(run_dir, stop)
        final_dir = save_final(strategy, saved_with, run_dir, cfg.lora.save_mode,
                               model_card(cfg, trained.final_metrics)) if cfg.checkpoint.save_final else None
        answers["after"] = answer_samples(cfg, model, tokenizer)
    finally:
        job.close()
        strategy.close()
    answers = answers if cfg.logging.samples else {}
    summary = {"summary": [trained.summary]} if trained.summary is not None else {}
    if not strategy.is_main:
        return RunResult(run_dir, None, trained.losses, trained.final_metrics, {**summary, **answers})
    write_samples(run_dir, answers)
    if trained.summary is not None:
        (run_dir / "summary.json").write_text(json.dumps(trained.summary, indent=1))
    before, after = trained.accuracy or (None, None)
    if before is not None:
        logger.info("held-out accuracy: %.1f%% before -> %.1f%% after training", 100 * before, 100 * (after or 0.0))
    samples = {**trained.samples, **answers}
    if cfg.logging.plot:
        from oxrl.logging.report import write_report

        write_report(run_dir, cfg, time.monotonic() - started, trained.accuracy, samples)
    if cfg.run.push_to_hub:  # last: a failed upload loses nothing the run wrote
        from oxrl.training.hub import push_final

        push_final(cfg, final_dir)
    return RunResult(run_dir, final_dir, trained.losses, trained.final_metrics, {**summary, **samples})


class RLRun:
    """The RL and online algorithms in the lifecycle (`run_in`): prompts, rewards and the episode runner, then the
    policy, its reference or critic and the rollout engine, trained by the RL loop (oxrl/loops/rl.py)."""

    def __init__(self, cfg: Config, strategy, remote=None):
        """The reward functions are built (and their settings checked) here, before even the tokenizer loads."""
        from oxrl.loops.rl_setup import reward_function

        self.cfg, self.strategy, self.remote = cfg, strategy, remote
        self.action_tokens = None
        self.reward_fn = reward_function(cfg, cfg.rl)  # None with an episode runner: episodes reward themselves
        if remote is not None:
            self.reward_fn = remote.rewards(self.reward_fn, strategy)  # scored by the reward workers (or rank 0)

    def read_inputs(self, tokenizer, processor) -> int | None:
        from oxrl.loops.rl_setup import read_prompts

        self.env, self.train_prompts, self.val_prompts, row_tokens = read_prompts(self.cfg, self.strategy, tokenizer,
                                                                                  processor)
        if self.cfg.vla is not None:
            self.action_tokens = self.env.tokens
        return row_tokens

    def load(self, tokenizer, processor, saved_with):
        from oxrl.loops.rl_setup import rl_handles

        self.handles = rl_handles(self.cfg, self.strategy, tokenizer, self.reward_fn, self.env,
                                  len(self.train_prompts.prompt_ids), self.remote, processor)
        self.handles.tokenizer = saved_with
        return self.handles.model

    def train(self, run_dir: Path, stop=None) -> Trained:
        from oxrl.loops.rl import train_rl

        result = train_rl(self.handles, self.train_prompts, self.val_prompts, run_dir, stop)
        summary = {"accuracy_before": result.accuracy_before, "accuracy_after": result.accuracy_after,
                   "rewards": result.rewards}
        return Trained([], result.final_metrics, result.samples, summary)

    def close(self) -> None:
        self.handles.engine.close()


@torch.no_grad()
def answer_samples(cfg: Config, model, tokenizer) -> list[dict]:
    """Greedy answers to `logging.samples`, to show what training changed (every rank runs them: sharded weights
    are gathered by all)."""
    if not cfg.logging.samples:
        return []
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out = []
    for prompt in cfg.logging.samples:
        if tokenizer.chat_template:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                return_tensors="pt", return_dict=True)["input_ids"]
        else:
            ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        ids = ids.to(device)
        generated = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                   max_new_tokens=cfg.logging.sample_max_new_tokens, pad_token_id=tokenizer.pad_token_id)
        completion = tokenizer.decode(generated[0, ids.shape[1]:], skip_special_tokens=True)
        out.append({"prompt": prompt, "completion": completion.strip()})
    model.train(was_training)
    return out


def write_samples(run_dir: Path, samples: dict[str, list[dict]]) -> None:
    """`samples.json` and the log lines of the answers before and after training (rank 0)."""
    if not samples.get("before"):
        return
    (run_dir / "samples.json").write_text(json.dumps(samples, indent=1))
    for before, after in zip(samples["before"], samples["after"]):
        logger.info("prompt: %s\n  before: %s\n  after:  %s", before["prompt"], before["completion"], after["completion"])


def run(cfg: Config) -> RunResult:
    from oxrl.logging.setup import setup_logging

    setup_logging()
    from oxrl.preflight import check_dependencies, check_run_outputs
    from oxrl.config.rl_presets import is_rl

    check_dependencies(cfg)  # a package the config needs and lacks: one line now, not a traceback mid-run
    check_run_outputs(cfg)  # a model an earlier run makes, missing: which run, and the example that makes it
    if cfg.run.launcher == "ray":
        from oxrl.cluster.driver import run_on_ray

        return run_on_ray(cfg, run_rl)
    if is_rl(cfg.algorithm.name):
        return run_rl(cfg)
    from oxrl.loops.objectives import get_objective

    objective = get_objective(cfg.algorithm.name, cfg.preference)  # (names were checked when the config loaded)
    if not cfg.data.train:
        raise ValueError(f"algorithm `{cfg.algorithm.name}` needs training data: set data.train to a list of datasets")
    from oxrl.training.build import build_strategy

    strategy = build_strategy(cfg)
    with claimed_run(cfg, strategy) as (cfg, run_dir):
        return run_in(run_dir, cfg, strategy, OfflineRun(cfg, strategy, objective))


class OfflineRun:
    """The offline objectives in the lifecycle (`run_in`): examples, then the model and the reference or teacher
    the objective needs, trained by oxrl/loops/sl.py."""

    def __init__(self, cfg: Config, strategy, objective):
        self.cfg, self.strategy, self.objective = cfg, strategy, objective
        self.action_tokens = None

    def read_inputs(self, tokenizer, processor) -> int | None:
        from oxrl.data.build import load_examples

        cfg = self.cfg
        readers = {}
        if cfg.vla is not None:  # robot demonstrations (oxrl/vla)
            from oxrl.vla.build import demonstration_reader

            readers["lerobot"], self.action_tokens = demonstration_reader(cfg, tokenizer, processor)
        self.data = load_examples(cfg.data, tokenizer, seed=cfg.run.seed, processor=processor, readers=readers)
        longest_rows = sorted(example.num_tokens for example in self.data.train)[-cfg.train.micro_batch_size_per_device:]
        return sum(longest_rows) or None

    def load(self, tokenizer, processor, saved_with):
        from oxrl.loops.sl import examples_used

        self.saved_with = saved_with
        self.model = _load_trained_model(self.cfg, tokenizer, self.strategy.device)
        used = examples_used(self.cfg, self.data.train, self.data.validation)  # a precomputed reference scores these
        self.reference = _fixed_model(self.cfg, self.objective, self.model, used, self.strategy)
        return self.model

    def train(self, run_dir: Path, stop=None) -> Trained:
        from oxrl.loops.sl import train_offline

        result = train_offline(self.cfg, self.objective, self.model, self.saved_with, self.data.train,
                               self.data.validation, self.strategy, run_dir, self.reference, stop)
        self.reference = None  # free a frozen copy or teacher before the final folder is saved
        return Trained(result.losses, result.final_metrics)

    def close(self) -> None:
        self.reference = None


def _load_trained_model(cfg: Config, tokenizer, device: torch.device):
    """The model the objective trains: a causal LM, or for `rm` a one-output sequence classifier."""
    if cfg.algorithm.name == "rm":
        from oxrl.models.reward_model import load_reward_model

        return load_reward_model(cfg.model, device, tokenizer.pad_token_id)
    from oxrl.models.load import load_model

    return load_model(cfg.model, device, cfg.lora)


def _fixed_model(cfg: Config, objective, model, examples, strategy):
    """The reference model (DPO family, KTO) or teacher (KD) the objective needs; None when it needs none,
    so reference-free objectives (SimPO, ORPO, RM, SFT) never build or hold one."""
    if not objective.needs_reference:
        return None
    from oxrl.algorithms.distill import DISTILL_OBJECTIVES
    from oxrl.models.reference import build_reference, load_teacher

    if cfg.algorithm.name in DISTILL_OBJECTIVES:
        teacher = load_teacher(cfg.preference.teacher, cfg.model, model, strategy.device)
        teacher.model = strategy.prepare_frozen(teacher.model)  # sharded like the student
        return teacher
    return build_reference(cfg.preference.reference, model, examples, cfg.train.micro_batch_size_per_device, strategy,
                           cfg.logging.progress_bar)
