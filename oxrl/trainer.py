"""The three-line Python API.

    from oxrl import Trainer
    Trainer(model="smollm2-135m-instruct").train(task="math")
    Trainer(model="path/to/model", algorithm="dpo").train(data="pairs.jsonl", **{"train.optim.lr": 5e-7})
    Trainer(model=my_model, tokenizer=my_tokenizer, algorithm="sft", callbacks=[print]).train(data=[{"messages": ...}])

A task preset (`oxrl.config.presets`) or a `Config` supplies a complete config; `data`, `algorithm` and dotted
overrides refine it. The result is the same as `oxrl train` with the equivalent YAML file. Without
a `run.name` override every `train` call gets a new run directory (`RunResult.run_dir`); with one, a
second call is refused unless `run.resume` or `run.overwrite` says what to do with the first run.
Unless `lora.enabled` is given, a model whose full fine-tune would not fit this machine's memory (the
estimate of oxrl/models/memory.py) trains LoRA adapters instead, and the log says so.

What is not a file is written under the run directory first, so that the run reads files like any other and its
`config.yaml` can run it again or resume it: rows (a list of dicts, or a `datasets.Dataset`) to `inputs/train.jsonl`,
a model object to `inputs/model/`, a tokenizer object to `inputs/tokenizer/`. `callbacks` are called on rank 0 with
(step, metrics) each time the run logs a step's metrics (`logging.every`; RL's held-out pass before training is step
0), metric names as the trackers get them (oxrl/logging/metrics.py `tracker_name`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from oxrl.config.load import apply_override, load_config, saved_form
from oxrl.config.presets import task_preset
from oxrl.config.schema import Config
from oxrl.runner import RunResult, run

logger = logging.getLogger(__name__)

Callback = Callable[[int, dict[str, float]], None]


def lora_first(cfg: Config) -> bool:
    """LoRA when a full fine-tune would not fit this machine and LoRA would (oxrl.models.fit.choose_lora).
    Only in one process: under torchrun the ranks share the machine's memory, which this one-device estimate does
    not weigh (LoRA itself trains sharded: docs/distributed.md)."""
    from oxrl.models.fit import choose_lora, run_devices
    from oxrl.models.source import ModelNotFoundError

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return False
    import torch

    device = torch.device("cuda" if cfg.run.device != "cpu" and torch.cuda.is_available() else "cpu")
    try:
        return choose_lora(cfg, run_devices(device, 1))
    except (ModelNotFoundError, OSError) as error:
        logger.info("memory: cannot read the model's shape (%s): training as configured", error)
        return False


class CallbackError(RuntimeError):
    """A `Trainer` callback raised: the run stopped at that step (its checkpoints so far are kept)."""


class StepCallbacks:
    """`Trainer(callbacks=...)` as a tracker of the run's MetricsLogger (oxrl/logging/metrics.py `EXTRA_TRACKERS`):
    called where every logged row already goes, so the loops know nothing of them."""

    def __init__(self, callbacks: Sequence[Callback]):
        self.callbacks = list(callbacks)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for callback in self.callbacks:
            try:
                callback(step, dict(metrics))
            except Exception as error:  # the user's code: stop the run, naming it (its traceback is chained)
                name = getattr(callback, "__qualname__", None) or repr(callback)
                raise CallbackError(f"callback {name} raised {type(error).__name__} at step {step}: {error}") from error

    def close(self, failed: bool) -> None:
        """Nothing to close."""


class Trainer:
    def __init__(self, model: str | Any | None = None, algorithm: str | None = None, *, config: Config | None = None,
                 tokenizer: str | Any | None = None, callbacks: Sequence[Callback] = (), **overrides: Any):
        """`model`: a name or path, or a transformers model object (saved under the run directory, with `tokenizer`
        or, without one, the tokenizer its `name_or_path` names). `config`: a `Config` to start from instead of a
        task preset (`model` and `algorithm`, when given, replace its own). `tokenizer`: a name, a path or a
        tokenizer (or processor) object. `callbacks`: functions of (step, metrics), called on rank 0 as the run logs.
        `overrides` are dotted config keys, e.g. `**{"run.output_dir": "runs", "lora.enabled": True}`."""
        if model is None and config is None:
            raise ValueError("Trainer needs a model (a name, a path or a transformers model) or a config")
        for index, callback in enumerate(callbacks):
            if not callable(callback):
                raise TypeError(f"Trainer callbacks[{index}] is a {type(callback).__name__}, not a function of "
                                "(step, metrics)")
        self.model, self.algorithm, self.base, self.tokenizer = model, algorithm, config, tokenizer
        self.callbacks = list(callbacks)
        self.overrides = overrides

    def config(self, task: str | None = None, data: str | list[str] | None = None, **overrides: Any) -> Config:
        """The validated config of `train(task, data, **overrides)`, where `data` names files (rows and objects are
        written by `train`, which then names them here)."""
        return self._config(task, data, overrides)

    def _config(self, task: str | None, data: str | list[str] | None, overrides: dict[str, Any],
                probe_memory: bool = True) -> Config:
        """`config`; `probe_memory=False` skips the LoRA-first estimate (`lora_first`), which reads the model."""
        if not _names_files(data):
            raise TypeError("Trainer.config takes data as file names; rows (a list of dicts or a datasets.Dataset) are "
                            "written under the run directory by Trainer.train")
        if task is not None and self.base is not None:
            raise ValueError("Trainer: give a task preset or a config, not both (a config is a whole recipe)")
        tree = task_preset(task) if task is not None else saved_form(self.base) if self.base is not None else {}
        if isinstance(self.model, str):
            tree.setdefault("model", {})["name_or_path"] = self.model
        if isinstance(self.tokenizer, str):
            tree.setdefault("model", {})["tokenizer"] = self.tokenizer
        if self.algorithm is not None:
            tree.setdefault("algorithm", {})["name"] = self.algorithm
        if data is not None:
            paths = [data] if isinstance(data, str) else list(data)
            tree.setdefault("data", {})["train"] = [{"path": p} for p in paths]
            for key in ("task", "task_size", "task_config"):  # files replace a generated task and its options
                tree.get("rl", {}).pop(key, None)
        for key, value in {**self.overrides, **overrides}.items():
            apply_override(tree, key.split("."), value)
        cfg = load_config(None, base=tree)
        if probe_memory and "enabled" not in tree.get("lora", {}) and lora_first(cfg):
            apply_override(tree, ["lora", "enabled"], True)
            cfg = load_config(None, base=tree)
        return cfg

    def train(self, task: str | None = None, data: Any = None, **overrides: Any) -> RunResult:
        """Train; `data`: file names, or rows (a list of dicts, a `datasets.Dataset`). The result holds the run
        directory, the final model's folder, every logged row of metrics.jsonl (`metrics`) and the losses."""
        from oxrl.logging.metrics import EXTRA_TRACKERS

        settings = {**overrides}
        objects = [given for given in (self.model, self.tokenizer) if not isinstance(given, (str, type(None)))]
        if objects or not _names_files(data):  # written under the run directory first
            data, settings = self._write_inputs(task, data, settings)
        cfg = self._config(task, data, settings)
        token = EXTRA_TRACKERS.set((StepCallbacks(self.callbacks),)) if self.callbacks else None
        try:
            result = run(cfg)
        finally:
            if token is not None:
                EXTRA_TRACKERS.reset(token)
        return with_metrics(result)

    def _write_inputs(self, task: str | None, data: Any, settings: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """Rows and objects written to `<run>/inputs/` (the run is named here, so that its directory is known); the
        data and settings that name them. Resuming, rows must be those the run started with."""
        from oxrl.training.run_dir import default_run_name, run_dir_for

        placeholder = Trainer(self.model if isinstance(self.model, str) else "(a model object)", self.algorithm,
                              config=self.base, **self.overrides)
        draft = placeholder._config(task, data if _names_files(data) else None, settings,
                                    probe_memory=False)  # for its name, output_dir and resume only
        name = draft.run.name or default_run_name(draft.algorithm.name, draft.run.output_dir)
        inputs = run_dir_for(draft.run.output_dir, name) / "inputs"
        resuming = draft.run.resume is not False
        settings = {**settings, "run.name": name}
        if not _names_files(data):
            data = str(write_rows(data, inputs / "train.jsonl", resuming))
        if not isinstance(self.model, (str, type(None))):
            settings["model.name_or_path"] = str(self._save_model(inputs / "model", resuming))
            if self.tokenizer is None:  # the tokenizer the model was loaded with, where it says (a hub id or folder)
                settings["model.tokenizer"] = getattr(self.model, "name_or_path", "") or None
                if settings["model.tokenizer"] is None:
                    raise ValueError("Trainer(model=<a model object>) needs tokenizer= (a name, a path or a "
                                     "tokenizer): the model does not say where its tokenizer is")
        elif not isinstance(self.tokenizer, (str, type(None))):
            settings["model.tokenizer"] = str(_save_once(inputs / "tokenizer", resuming,
                                                         lambda out: _save_tokenizer(self.tokenizer, draft, out)))
        return data, settings

    def _save_model(self, folder: Path, resuming: bool) -> Path:
        """The model object as a Hugging Face folder, with the tokenizer object when there is one."""
        from oxrl.models.save import save_hf_folder

        tokenizer = None if isinstance(self.tokenizer, (str, type(None))) else self.tokenizer
        return _save_once(folder, resuming, lambda out: save_hf_folder(self.model, tokenizer, out))


def _save_tokenizer(tokenizer, draft: Config, folder: Path) -> None:
    """A tokenizer object in a folder of its own, beside its model's config.json: oxRL loads a tokenizer from a Hugging
    Face folder, which a folder without a config is not (oxrl/models/source.py)."""
    from oxrl.models.load import load_config as load_model_config

    load_model_config(draft.model).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _names_files(data: Any) -> bool:
    """Whether `data` is None or names files (the config takes those as they are)."""
    return data is None or isinstance(data, str) or isinstance(data, (list, tuple)) and bool(data) and all(
        isinstance(item, str) for item in data)


def _save_once(folder: Path, resuming: bool, save: Callable[[Path], Any]) -> Path:
    """`save(folder)`, unless a resumed run already has it (the run continues from what it started with)."""
    if resuming and folder.is_dir():
        logger.info("%s: kept from the run's start (resuming)", folder)
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    save(folder)
    return folder


def write_rows(rows: Any, path: Path, resuming: bool = False) -> Path:
    """Rows (a list of dicts, or a `datasets.Dataset`) as JSON lines at `path`. Unchanged rows are not rewritten;
    a resumed run given other rows than it started with is refused."""
    if hasattr(rows, "to_list") and hasattr(rows, "column_names"):  # a datasets.Dataset
        rows = rows.to_list()
    if not isinstance(rows, (list, tuple)) or not rows:
        raise TypeError(f"Trainer data: expected file names, a non-empty list of dicts or a datasets.Dataset, got "
                        f"{type(rows).__name__}{' (empty)' if isinstance(rows, (list, tuple)) else ''}")
    lines = []
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise TypeError(f"Trainer data, row {index}: expected a dict of columns, got {type(row).__name__}")
        try:
            lines.append(json.dumps(row, ensure_ascii=False) + "\n")
        except (TypeError, ValueError) as error:
            raise TypeError(f"Trainer data, row {index}: not JSON ({error}); save such rows with "
                            "Dataset.save_to_disk and pass the folder's path") from None
    text = "".join(lines)
    if path.is_file() and path.read_text() == text:
        return path
    if resuming and path.exists():
        raise ValueError(f"{path}: the rows given differ from those the run started with; a resumed run trains on "
                         "the same data (pass the same rows, or start a new run)")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    partial.replace(path)
    logger.info("data: %d rows written to %s", len(lines), path)
    return path


def with_metrics(result: RunResult) -> RunResult:
    """`result` with the rows of its metrics.jsonl, and for RL (whose loop keeps no losses) the logged steps'
    losses."""
    from oxrl.logging.metrics import read_metrics

    metrics = read_metrics(result.run_dir)
    losses = result.losses or [row["loss"] for row in metrics if row["step"] > 0 and "loss" in row]
    return replace(result, metrics=metrics, losses=losses)
