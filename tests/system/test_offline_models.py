"""A model name the hub cannot serve fails in seconds, not after minutes of huggingface_hub's retries: with the hub
out of reach (HF_ENDPOINT at a closed local port, HF_HUB_OFFLINE unset) a mistyped alias is one error naming it, the
near miss and HF_HUB_OFFLINE=1; a model in the local cache still loads from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import save_tiny_model

ROOT = Path(__file__).resolve().parents[2]
# Times each load in the child itself: the interpreter's start and imports are not what the test bounds.
LOADS = """
import json, sys, time
from oxrl.config.schema import ModelConfig
from oxrl.models.load import load_tokenizer

out = {}
for name in sys.argv[1:]:
    started = time.monotonic()
    try:
        out[name] = {"loaded": type(load_tokenizer(ModelConfig(name_or_path=name))).__name__}
    except FileNotFoundError as error:
        out[name] = {"error": str(error)}
    out[name]["seconds"] = time.monotonic() - started
print("RESULT " + json.dumps(out))
"""


def test_an_unreachable_hub_fails_a_mistyped_alias_in_seconds_and_a_cached_model_loads(tmp_path, smollm2_tokenizer):
    cache = tmp_path / "hub"
    snapshot = cache / "models--acme--tiny" / "snapshots" / "0123abcd"
    save_tiny_model(snapshot, smollm2_tokenizer)
    (cache / "models--acme--tiny" / "refs").mkdir()
    (cache / "models--acme--tiny" / "refs" / "main").write_text("0123abcd")
    env = {key: value for key, value in os.environ.items() if key != "HF_HUB_OFFLINE"}
    env.update(PYTHONPATH=str(ROOT), HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_CACHE=str(cache), HF_HOME=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", LOADS, "smollm2-135m-instrct", "acme/tiny"], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))[7:])

    mistyped = out["smollm2-135m-instrct"]
    assert mistyped["seconds"] < 5, mistyped
    assert "`smollm2-135m-instrct`" in mistyped["error"] and "did you mean `smollm2-135m-instruct`?" in mistyped["error"]
    assert "HF_HUB_OFFLINE=1" in mistyped["error"] and "http://127.0.0.1:9" in mistyped["error"]
    assert out["acme/tiny"].get("loaded"), out["acme/tiny"]  # from the cache, the hub being out of reach
    assert out["acme/tiny"]["seconds"] < 5
    assert result.stderr.count("Retrying") == 0 and "retry" not in result.stderr.lower()
