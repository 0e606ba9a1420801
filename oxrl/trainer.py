"""The three-line Python API.

    from oxrl import Trainer
    Trainer(model="smollm2-135m-instruct").train(task="math")
    Trainer(model="path/to/model", algorithm="dpo").train(data="pairs.jsonl", **{"train.optim.lr": 5e-7})

A task preset (`oxrl.config.presets`) supplies a complete config; `data`, `algorithm` and dotted
overrides refine it. The result is the same as `oxrl train` with the equivalent YAML file. Without
a `run.name` override every `train` call gets a new run directory (`RunResult.run_dir`); with one, a
second call is refused unless `run.resume` or `run.overwrite` says what to do with the first run.
Unless `lora.enabled` is given, a model whose full fine-tune would not fit this machine's memory (the
estimate of oxrl/models/memory.py) trains LoRA adapters instead, and the log says so.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from oxrl.config.load import apply_override, load_config
from oxrl.config.presets import task_preset
from oxrl.config.schema import Config
from oxrl.runner import RunResult, run

logger = logging.getLogger(__name__)


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


class Trainer:
    def __init__(self, model: str, algorithm: str | None = None, **overrides: Any):
        """`overrides` are dotted config keys, e.g. `**{"run.output_dir": "runs", "lora.enabled": True}`."""
        self.model = model
        self.algorithm = algorithm
        self.overrides = overrides

    def config(self, task: str | None = None, data: str | list[str] | None = None, **overrides: Any) -> Config:
        tree = task_preset(task) if task is not None else {}
        tree.setdefault("model", {})["name_or_path"] = self.model
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
        if "enabled" not in tree.get("lora", {}) and lora_first(cfg):
            apply_override(tree, ["lora", "enabled"], True)
            cfg = load_config(None, base=tree)
        return cfg

    def train(self, task: str | None = None, data: str | list[str] | None = None, **overrides: Any) -> RunResult:
        return run(self.config(task, data, **overrides))
