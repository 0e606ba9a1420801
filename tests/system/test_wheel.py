"""The wheel works outside the checkout: built from the package's own files, installed with its
dependencies into a fresh virtual environment, and run from another directory (`oxrl --help`,
`oxrl doctor`, a one-step training), importing `oxrl` from that environment's site-packages.

torch is installed first, as scripts/setup_env.sh does on a machine without CUDA: `torch==2.13.0`
(the CPU build lies on this machine's disk; elsewhere set OXRL_CPU_TORCH, or PIP_EXTRA_INDEX_URL to
PyTorch's CPU index). pip's cache makes the other dependencies quick after the first time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.conftest import save_tiny_model, write_chat_rows

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def sh(args: list, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    result = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{args} exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


@pytest.fixture
def scratch(tmp_path):
    """tmp_path, emptied at the end: the environment holds a whole torch (about 1 GB), and pytest keeps
    the temporary folders of its last runs, which would fill a memory-backed /tmp."""
    yield tmp_path
    shutil.rmtree(tmp_path)


def test_the_wheel_installs_and_runs_outside_the_checkout(scratch, smollm2_tokenizer):
    tmp_path = scratch
    # The package's own files only, so that the build writes nothing into the checkout.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "oxrl", source / "oxrl", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    built = sh([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", source, "-w", tmp_path / "dist"], cwd=tmp_path)
    complaints = [line for line in (built.stdout + built.stderr).lower().splitlines() if "license" in line and "deprecat" in line]
    assert not complaints  # the SPDX `license` expression, not the deprecated table
    wheel = next((tmp_path / "dist").glob("oxrl-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(info).decode()
    assert {"oxrl/py.typed", "oxrl/data/bundled/chat_sft.jsonl", "oxrl/models/registry.yaml"} <= names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "License-Expression: Apache-2.0" in metadata.splitlines()

    venv = tmp_path / "venv"
    sh([sys.executable, "-m", "venv", venv], cwd=tmp_path)
    python, oxrl = venv / "bin" / "python", venv / "bin" / "oxrl"
    sh([python, "-m", "pip", "install", "-q", "--no-compile", os.environ.get("OXRL_CPU_TORCH", "torch==2.13.0")],
       cwd=tmp_path)
    sh([python, "-m", "pip", "install", "-q", "--no-compile", wheel], cwd=tmp_path)

    work = tmp_path / "work"  # not the checkout: `oxrl` must come from the venv
    work.mkdir()
    where = sh([python, "-c", "import oxrl; print(oxrl.__file__)"], cwd=work).stdout.strip()
    assert Path(where).is_relative_to(venv) and "site-packages" in where, where
    assert not Path(where).is_relative_to(ROOT)

    assert "train" in sh([oxrl, "--help"], cwd=work).stdout
    doctor = sh([oxrl, "doctor"], cwd=work).stdout
    assert "torch 2." in doctor and "transformers" in doctor
    assert "| Qwen/Qwen3-0.6B |" in sh([oxrl, "models"], cwd=work).stdout  # the registry ships in the wheel

    save_tiny_model(work / "tiny-model", smollm2_tokenizer)
    write_chat_rows(work / "chat.jsonl", 8)
    config = {
        "run": {"name": "tiny"},  # relative paths, resolved from the working directory
        "model": {"name_or_path": "tiny-model"},
        "data": {"train": [{"path": "chat.jsonl"}], "max_length": 64},
        "algorithm": {"name": "sft"},
        "train": {"global_batch_size": 4, "micro_batch_size_per_device": 2, "max_steps": 1},
        "logging": {"progress_bar": False},
    }
    (work / "tiny.yaml").write_text(yaml.safe_dump(config))
    trained = sh([oxrl, "train", "tiny.yaml"], cwd=work)
    output = trained.stdout + trained.stderr
    run_dirs = [p.parent for p in work.rglob("metrics.jsonl")]
    assert len(run_dirs) == 1, output[-3000:]
    rows = [json.loads(line) for line in (run_dirs[0] / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    assert (run_dirs[0] / "final" / "model.safetensors").is_file()
    assert "Writing model shards" not in output and "Setting accelerator to CPU" not in output
    assert "memory: peak" in output  # the run's memory estimate, from the tiny model's own config
