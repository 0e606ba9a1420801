"""`report.md`: one page on a finished run, written by rank 0 beside `curves.png` (when `logging.plot` is on).

What ran (run name, algorithm, model, every config key whose value differs from the schema's default),
how long it took (wall time, steps, time per step, throughput from metrics.jsonl), what it achieved (RL:
held-out accuracy before and after; offline objectives: train/validation loss at the start and the end)
and a few completions from the start and the end (RL: from the first and last training steps; offline:
the `logging.samples` prompts answered before and after training).
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Any

from oxrl.config.load import NOT_SET, REQUIRED, model_name, non_default_settings
from oxrl.config.schema import Config
from oxrl.logging.metrics import read_metrics
from oxrl.logging.plot import plot_curves

# Metrics shown at the start and the end in the results table, when the run logged them.
RL_RESULT_KEYS = ("reward/mean",)
OFFLINE_RESULT_KEYS = ("loss", "val/loss", "rewards/accuracy", "val/rewards/accuracy", "val/rewards/margins")


def write_report(run_dir: Path, cfg: Config, wall_time_s: float, accuracy: tuple[float | None, float | None] | None = None,
                 samples: dict[str, list[dict]] | None = None) -> Path:
    """`curves.png` and `report.md` in `run_dir`. `accuracy` is RL's held-out (before, after); `samples` holds
    RL's {"first", "last"} step samples or the offline {"before", "after"} answers."""
    records = read_metrics(run_dir)
    curves = plot_curves(run_dir, title=headline(cfg))
    finished = time.strftime("%Y-%m-%d %H:%M")
    lines = [f"# {cfg.run.name}", "", f"**{cfg.algorithm.name}** on **{model_name(cfg)}**, finished {finished}", ""]
    lines += ["![training curves](curves.png)" if curves is not None else
              "_No curves.png: no logged metric changed during the run._", ""]
    lines += _results(records, accuracy) + _timings(records, wall_time_s) + _config_section(cfg)
    lines += _samples_section(samples or {})
    path = Path(run_dir) / "report.md"
    path.write_text("\n".join(lines).rstrip() + "\n")
    return path


def headline(cfg: Config) -> str:
    return f"{cfg.run.name} · {cfg.algorithm.name} · {model_name(cfg)}"


def _results(records: list[dict], accuracy: tuple[float | None, float | None] | None) -> list[str]:
    """RL (`accuracy` given, if only (None, None)): held-out accuracy and reward; offline: losses and such."""
    rows = []
    if accuracy is not None and accuracy[0] is not None:
        before, after = accuracy
        rows.append(f"| held-out accuracy (greedy) | {before:.1%} | {'—' if after is None else f'{after:.1%}'} |")
    for key in RL_RESULT_KEYS if accuracy is not None else OFFLINE_RESULT_KEYS:
        points = [(r["step"], r[key]) for r in records if key in r and _finite(r[key])]
        if not points:
            continue
        if not key.startswith("val/") and len(points) >= 10:  # noisy per step: the first/last tenth's mean
            k = len(points) // 10
            first, last = _mean([v for _, v in points[:k]]), _mean([v for _, v in points[-k:]])
            rows.append(f"| {key} (mean of the first / last {k} logged steps) | {first:.4g} | {last:.4g} |")
        else:
            rows.append(f"| {key} (step {points[0][0]} / step {points[-1][0]}) | {points[0][1]:.4g} | {points[-1][1]:.4g} |")
    if not rows:
        return []
    return ["## Results", "", "| | start | end |", "|---|---|---|", *rows, ""]


def _timings(records: list[dict], wall_time_s: float) -> list[str]:
    steps = [r for r in records if r["step"] > 0]
    rows = [f"| wall time (loading, evaluation and saving included) | {_duration(wall_time_s)} |"]
    if steps:
        rows.append(f"| optimizer steps | {steps[-1]['step']} |")
    if len(steps) > 1 and steps[-1]["step"] > steps[0]["step"]:
        per_step = (steps[-1]["time"] - steps[0]["time"]) / (steps[-1]["step"] - steps[0]["step"])
        rows.append(f"| mean time per step (between the first and last logged steps) | {per_step:.3g} s |")
    for key in ("tokens_per_s", "completions_per_s"):
        values = [r[key] for r in steps if key in r and _finite(r[key])]
        if values:
            rows.append(f"| {key} (mean over logged steps) | {_mean(values):.4g} |")
    return ["## Timings", "", "| | |", "|---|---|", *rows, ""]


def _config_section(cfg: Config) -> list[str]:
    rows = [f"| `{key}` | {_shown(value)} | {_shown(default)} |" for key, value, default in non_default_settings(cfg)]
    return ["## Config: what differs from the defaults", "", "Full config: `config.yaml`.", "",
            "| key | value | default |", "|---|---|---|", *rows, ""]


def _samples_section(samples: dict[str, list[dict]]) -> list[str]:
    lines = []
    if samples.get("first") or samples.get("last"):  # RL: sampled completions of training steps
        lines += ["## Sample completions", ""]
        for part in ("first", "last"):
            if not samples.get(part):
                continue
            lines += [f"### {part.capitalize()} training step (step {samples[part][0]['step']})", ""]
            for sample in samples[part]:
                lines += ["**prompt**", "", fenced(sample["prompt"]), "",
                          f"**completion** (reward {sample['reward']:.3g})", "", fenced(sample["completion"]), ""]
    if samples.get("before") and samples.get("after"):  # logging.samples answered greedily
        lines += ["## Sample answers (greedy, before / after training)", ""]
        for before, after in zip(samples["before"], samples["after"]):
            lines += ["**prompt**", "", fenced(before["prompt"]), "", "**before**", "", fenced(before["completion"]), "",
                      "**after**", "", fenced(after["completion"]), ""]
    return lines


def fenced(text: str, language: str = "text") -> str:
    """A code block that shows `text` verbatim, whatever backticks it holds."""
    longest = max(map(len, re.findall("`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{language}\n{text}\n{fence}"


def _shown(value: Any) -> str:
    if value in (REQUIRED, NOT_SET):
        return f"*{value.strip('()')}*"
    text = json.dumps(value)
    text = text if len(text) <= 120 else text[:117] + "..."
    return "`" + text.replace("|", "\\|") + "`"


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s" if minutes else f"{seconds:.1f} s"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
