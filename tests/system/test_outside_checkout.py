"""oxRL outside its source tree: a config finds its data files beside it from any working directory, and a wheel
built from the checkout, installed in a fresh virtual environment, runs `oxrl doctor`, an example of the checkout
from another directory, and refuses a run whose optional package is missing in one line, before the model loads.

The fresh environment reuses this one's installed packages (a folder of links to them, minus oxRL itself and
math-verify) instead of downloading them: the test runs offline in about half a minute. tests/system/test_wheel.py
(slow) installs the wheel with its dependencies from the package index.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

from oxrl.config.load import load_config
from tests.conftest import save_tiny_model

ROOT = Path(__file__).resolve().parents[2]
LEFT_OUT = ("oxrl", "__editable__", "math_verify", "math-verify")  # prefixes of site-packages entries not linked


def test_a_configs_files_are_found_beside_it_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(ROOT / "examples" / "dpo_smollm2_arithmetic.yaml")
    assert cfg.data.train[0].path == str(ROOT / "examples" / "data" / "arithmetic_preferences_train.jsonl")
    assert load_config(ROOT / "examples" / "grpo_smollm2_calculator.yaml").rl.env.path == str(
        ROOT / "examples" / "envs" / "calculator.py")
    # A path found from the working directory keeps its meaning; a bundled name and an override are left as given.
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "arithmetic_preferences_train.jsonl").write_text("")
    cfg = load_config(ROOT / "examples" / "dpo_smollm2_arithmetic.yaml", ["data.validation=[{path: mine.jsonl}]"])
    assert cfg.data.train[0].path == "data/arithmetic_preferences_train.jsonl"
    assert cfg.data.validation[0].path == "mine.jsonl"
    assert load_config(ROOT / "examples" / "sft_smollm2_chat.yaml").data.train[0].path == "bundled:chat_sft.jsonl"


def _run(args: list, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _fresh_environment(tmp_path: Path, wheel: Path) -> Path:
    """A new venv holding the wheel, which sees this venv's packages through links, oxRL and math-verify left out."""
    venv = tmp_path / "venv"
    assert _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path).returncode == 0
    python = venv / "bin" / "python"
    installed = _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index",
                      "--no-compile", wheel], tmp_path)
    assert installed.returncode == 0, installed.stderr
    links = tmp_path / "deps"
    links.mkdir()
    for entry in Path(site.getsitepackages()[0]).iterdir():
        if not entry.name.startswith(LEFT_OUT) and entry.suffix != ".pth":
            (links / entry.name).symlink_to(entry)
    own = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path).stdout.strip())
    (own / "reused.pth").write_text(f"{links}\n")  # after the venv's own site-packages: the wheel's oxrl comes first
    return venv


def test_a_wheel_runs_outside_the_checkout(tmp_path, smollm2_tokenizer):
    source = tmp_path / "source"  # the package's own files only, so that the build writes nothing into the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "oxrl", source / "oxrl", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    built = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", source,
                  "-w", tmp_path / "dist"], tmp_path)
    assert built.returncode == 0, built.stderr
    venv = _fresh_environment(tmp_path, next((tmp_path / "dist").glob("oxrl-*.whl")))
    oxrl = venv / "bin" / "oxrl"
    work = tmp_path / "work"
    work.mkdir()
    where = _run([venv / "bin" / "python", "-c", "import oxrl; print(oxrl.__file__)"], work).stdout.strip()
    assert Path(where).is_relative_to(venv), where

    doctor = _run([oxrl, "doctor"], work)
    assert doctor.returncode == 0, doctor.stderr
    assert "math-verify    missing    math rewards: pip install 'math-verify>=0.7' (oxRL's `rl` extra)" in doctor.stdout
    assert "oxrl[" not in doctor.stdout and "Setting accelerator" not in doctor.stdout

    model = save_tiny_model(tmp_path / "tiny", smollm2_tokenizer)
    small = [f"model.name_or_path={model}", f"run.output_dir={work / 'runs'}", "train.max_steps=1",
             "train.global_batch_size=4", "train.micro_batch_size_per_device=4",
             "logging.samples=[]", "logging.sample_max_new_tokens=48",  # the default: without samples it is not read
             "logging.progress_bar=false", "logging.plot=false"]
    dpo = _run([oxrl, "train", ROOT / "examples" / "dpo_smollm2_arithmetic.yaml", *small], work)
    assert dpo.returncode == 0, dpo.stderr[-3000:]
    rows = [json.loads(line) for line in (work / "runs" / "dpo-smollm2-arithmetic" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1]

    grpo = _run([oxrl, "train", ROOT / "examples" / "grpo_smollm2_arithmetic.yaml", f"model.name_or_path={model}",
                 f"run.output_dir={work / 'runs'}"], work)
    assert grpo.returncode == 2
    assert grpo.stderr.strip().splitlines()[-1].endswith(
        "ERROR oxrl.cli: the `math` reward needs math-verify, which is not installed: pip install 'math-verify>=0.7' "
        "(oxRL's `rl` extra)")
    assert "Traceback" not in grpo.stderr and "loaded" not in grpo.stderr
    assert not (work / "runs" / "grpo-smollm2-arithmetic").exists()
