"""`oxrl report RUN_DIR`: a Markdown bug report of a run, to paste into an issue.

It holds the versions of oxRL and its dependencies, the hardware, the run's config (`config.yaml`), the
last lines of its log (`train.log`) and the traceback that stopped it (`failure.txt`), all read from this
machine and the run directory. Nothing is sent anywhere and the environment is not included. Secrets are
redacted before the file is written (`oxrl.logging.redaction`): the values of environment variables named like
secrets (`HF_TOKEN`, `*_API_KEY`, ...) and of those the config names as holding one (a judge's `api_key_env`),
even where an older run's log or traceback holds them.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import sys
from pathlib import Path

from oxrl.logging.redaction import redact
from oxrl.logging.report import fenced
from oxrl.logging.run_log import FAILURE_FILE, LOG_FILE

REPORT_FILE = "bug_report.md"
PACKAGES = ("oxrl", "torch", "transformers", "peft", "datasets", "accelerate", "safetensors", "deepspeed", "vllm",
            "ray", "math-verify", "reasoning-gym", "mlflow")
LOG_LINES = 60
# A config key whose value names the environment variable holding a secret, as config.yaml spells it.
SECRET_NAMED_BY = re.compile(r"\bapi_key_env:\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)")


def write_bug_report(run_dir: Path) -> Path:
    """`<run_dir>/bug_report.md`; FileNotFoundError when `run_dir` holds no oxRL run."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file() and not (run_dir / LOG_FILE).is_file():
        raise FileNotFoundError(f"{run_dir} holds no oxRL run (no config.yaml, no {LOG_FILE})")
    sections = [f"# oxRL bug report: {run_dir.name}", "", "## Versions", "", *versions(), "", "## Hardware", "",
                *hardware(), ""]
    sections += _file_section("Config (`config.yaml`)", run_dir / "config.yaml", "yaml")
    sections += _file_section(f"Last {LOG_LINES} log lines (`{LOG_FILE}`)", run_dir / LOG_FILE, "text", LOG_LINES)
    sections += _file_section(f"Traceback (`{FAILURE_FILE}`)", run_dir / FAILURE_FILE, "text")
    path = run_dir / REPORT_FILE
    path.write_text(redact("\n".join(sections), _named_secrets(run_dir / "config.yaml")), encoding="utf-8")
    return path


def _named_secrets(config_path: Path) -> list[str]:
    """The values of the environment variables that the run's config names as holding a secret (`api_key_env`)."""
    text = config_path.read_text(encoding="utf-8", errors="replace") if config_path.is_file() else ""
    return [os.environ[name] for name in SECRET_NAMED_BY.findall(text) if name in os.environ]


def versions() -> list[str]:
    lines = [f"- Python {platform.python_version()} ({sys.executable}), {platform.platform()}"]
    for name in PACKAGES:
        try:
            lines.append(f"- {name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            lines.append(f"- {name}: not installed")
    return lines


def hardware() -> list[str]:
    import torch

    lines = [f"- CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {_memory()}"]
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            lines.append(f"- CUDA {index}: {props.name}, {props.total_memory / 2**30:.1f} GiB (CUDA {torch.version.cuda})")
    else:
        lines.append("- CUDA: none")
    return lines


def _memory() -> str:
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            total_kib = int(next(line for line in meminfo if line.startswith("MemTotal:")).split()[1])
        return f"{total_kib / 2**20:.1f} GiB memory"
    except (OSError, StopIteration, ValueError):
        return "memory unknown"


def _file_section(title: str, path: Path, language: str, last_lines: int | None = None) -> list[str]:
    if not path.is_file():
        return [f"## {title}", "", "(none)", ""]
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    if last_lines is not None:
        lines = lines[-last_lines:]
    return [f"## {title}", "", fenced("\n".join(lines), language), ""]
