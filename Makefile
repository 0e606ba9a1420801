# Two commands do all the set-up on a fresh machine:
#   make demo   RL-trains (GRPO) the bundled SmolLM2-135M-Instruct on arithmetic, on CPU
#   make test   runs the test suite (what CI runs)
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: env demo demo-sft test test-fast docs

env:
	VENV=$(VENV) EXTRAS=dev bash scripts/setup_env.sh

demo: env
	$(PY) -m oxrl train examples/grpo_smollm2_arithmetic.yaml

demo-sft: env
	$(PY) -m oxrl train examples/sft_smollm2_chat.yaml

test: env
	$(PY) -m pytest -q -rs tests

test-fast: env
	$(PY) -m pytest -q -m "not slow and not distributed" tests

docs: env
	$(PY) -m oxrl config-reference > docs/config_reference.md
