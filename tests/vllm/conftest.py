"""The vLLM tier: one tiny random Llama and one vLLM engine shared by every test (vLLM starts slowly on CPU).

vLLM's CPU attention needs a head size it has kernels for (32, 64, ...), so the model is 2 heads of 32.
The tokenizer is a real `tokenizers` word-level one over the numbers 4..127 ("7 12 7"), so vLLM can
detokenize for stop strings and rewards can read words, as in tests/integration/test_rl_loop.py.

Tests re-point the shared engine at their own model with `engine.sync_weights(model)`: a sync writes
every weight, so any model of this architecture (plain or LoRA) can be loaded into it.
"""

from __future__ import annotations

import pytest
import torch

from oxrl.rollout.build import VLLM_INSTALL_HINT

VOCAB = 128
PAD, BOS, EOS, UNK = 0, 1, 2, 3


def number_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD, "<s>": BOS, "</s>": EOS, "<unk>": UNK, **{f"\u2581{i}": i for i in range(4, VOCAB)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    core.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")


def make_model(seed: int = 0, tied: bool = False):
    """A 2-layer Llama, fp32, random weights; `tied` shares the embedding with the lm_head (as SmolLM2 does)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         tie_word_embeddings=tied, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tokenizer():
    return number_tokenizer()


def start_engine(model, tokenizer):
    pytest.importorskip("vllm", reason=f"vLLM is not installed: {VLLM_INSTALL_HINT}")
    from oxrl.config.schema import VLLMConfig
    from oxrl.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(model, tokenizer, VLLMConfig(max_model_len=256, kv_cache_gib=0.25), seed=0)


@pytest.fixture(scope="session")
def engine(tokenizer):
    engine = start_engine(make_model(0), tokenizer)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def tied_engine(tokenizer):
    """vLLM's model architecture is fixed at start-up, and tying is part of it: a tied model needs its own engine."""
    engine = start_engine(make_model(0, tied=True), tokenizer)
    yield engine
    engine.close()
