"""The per-sequence packed kernel == transformers' sdpa (packed and padded): logits, loss, gradients,
and generation, which must fall back to exactly sdpa."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn.functional as F

from oxrl.algorithms.logprobs import forward_logits
from oxrl.data.types import pack
from oxrl.loops.objectives import get_objective
from oxrl.models.packed_attention import (PACKED_ATTENTION, packed_causal_mask, packed_sdpa_attention_forward,
                                          packed_sequence_lengths, use_packed_attention)
from tests.conftest import make_tiny_llama
from tests.test_packing import _examples, _padded_reference

TOLERANCE = dict(atol=1e-5, rtol=1e-5)


def _packed(model):
    assert use_packed_attention(model)
    return model


def _tiny(model_type: str, num_key_value_heads: int = 2):
    """Other full-attention decoder families, tiny and random (make_tiny_llama covers Llama)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(
        model_type, vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=num_key_value_heads, head_dim=8, max_position_embeddings=512,
        attn_implementation="sdpa", pad_token_id=0,
    )
    return AutoModelForCausalLM.from_config(config)


MODELS = {
    "llama-gqa": make_tiny_llama,  # 4 heads, 2 kv heads
    "llama-mha": lambda: _tiny("llama", num_key_value_heads=4),
    "qwen2": lambda: _tiny("qwen2"),
    "qwen3": lambda: _tiny("qwen3"),  # q/k norms before attention
}


def test_sequence_lengths_follow_position_restarts():
    assert packed_sequence_lengths(torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])) == [3, 2, 4]
    assert packed_sequence_lengths(torch.tensor([4, 5, 6])) == [3]  # one sequence, offset start
    assert packed_sequence_lengths(torch.tensor([0, 1, 5, 6, 0])) == [2, 2, 1]  # any jump starts one


def test_kernel_equals_sdpa_with_block_diagonal_mask():
    # Attention level: per-sequence SDPA == one SDPA over the row with the block-diagonal causal mask.
    lengths = [5, 1, 9, 3]
    heads, kv_heads, dim = 4, 2, 8
    total = sum(lengths)
    query = torch.randn(1, heads, total, dim)
    key, value = torch.randn(1, kv_heads, total, dim), torch.randn(1, kv_heads, total, dim)
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    out, _ = packed_sdpa_attention_forward(torch.nn.Module(), query, key, value, None, scaling=dim**-0.5,
                                           position_ids=position_ids)

    sequence = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    mask = (sequence[:, None] == sequence[None, :]) & torch.ones(total, total, dtype=torch.bool).tril()
    expected = F.scaled_dot_product_attention(query, key.repeat_interleave(2, 1), value.repeat_interleave(2, 1),
                                              attn_mask=mask, scale=dim**-0.5)
    torch.testing.assert_close(out, expected.transpose(1, 2), **TOLERANCE)


def test_no_block_diagonal_mask_is_built_for_a_packed_row():
    assert packed_causal_mask(batch_size=1, q_length=9, kv_length=9) is None
    padding = torch.tensor([[False, True, True]])
    mask = packed_causal_mask(batch_size=1, q_length=3, kv_length=3, attention_mask=padding)
    assert mask is not None and not mask[0, 0, :, 0].any()  # padding falls back to the sdpa mask


def test_missing_position_ids_is_an_error_not_cross_attention():
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="position ids"):
        packed_sdpa_attention_forward(torch.nn.Module(), q, q, q, None)


@pytest.mark.parametrize("name", MODELS)
def test_packed_logits_equal_sdpa_packed_and_padded(name):
    # The mask function hands the kernel no mask for a packed row, so this also fails if the
    # kernel ever ran one causal SDPA across the whole row.
    sdpa_model = MODELS[name]().eval()
    packed_model = _packed(copy.deepcopy(sdpa_model))
    examples = _examples()
    batch = pack(examples)
    packed_logits = forward_logits(packed_model, batch)
    torch.testing.assert_close(packed_logits, forward_logits(sdpa_model, batch), **TOLERANCE)
    padded_logits, attn, _ = _padded_reference(sdpa_model, examples)
    pieces = [padded_logits[row, : int(attn[row].sum())] for row in range(len(examples))]
    torch.testing.assert_close(packed_logits, torch.cat(pieces), **TOLERANCE)


@pytest.mark.parametrize("name", ["llama-gqa", "qwen3"])
def test_packed_loss_and_gradients_equal_sdpa_packed_and_padded(name):
    examples = _examples()
    batch = pack(examples)
    objective = get_objective("sft")
    padded_model = MODELS[name]()
    sdpa_model = copy.deepcopy(padded_model)
    packed_model = _packed(copy.deepcopy(padded_model))
    _, _, padded_loss = _padded_reference(padded_model, examples)
    padded_loss.backward()
    losses = {}
    for label, model in (("sdpa", sdpa_model), ("packed", packed_model)):
        losses[label] = objective.compute(model, batch, normaliser=objective.count_units(batch)).loss
        losses[label].backward()
    torch.testing.assert_close(losses["packed"], losses["sdpa"], **TOLERANCE)
    torch.testing.assert_close(losses["packed"], padded_loss, **TOLERANCE)
    params = zip(padded_model.named_parameters(), sdpa_model.parameters(), packed_model.parameters())
    for (param_name, padded), sdpa, packed in params:
        torch.testing.assert_close(packed.grad, sdpa.grad, **TOLERANCE, msg=param_name)
        torch.testing.assert_close(packed.grad, padded.grad, **TOLERANCE, msg=param_name)


def test_with_a_kv_cache_the_row_is_sdpa_exactly():
    # transformers only detects packing without a cache; the kernel must not differ from sdpa there.
    sdpa_model = make_tiny_llama().eval()
    packed_model = _packed(copy.deepcopy(sdpa_model))
    batch = pack(_examples())
    kwargs = dict(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=True)
    torch.testing.assert_close(packed_model(**kwargs).logits, sdpa_model(**kwargs).logits, atol=0, rtol=0)


@pytest.mark.parametrize("prompt_lengths", [(3, 7, 5), (6,), (2, 6)])
def test_greedy_generation_equals_sdpa(prompt_lengths):
    sdpa_model = make_tiny_llama().eval()
    packed_model = _packed(copy.deepcopy(sdpa_model))
    g = torch.Generator().manual_seed(3)
    longest = max(prompt_lengths)
    ids = torch.zeros(len(prompt_lengths), longest, dtype=torch.long)  # left-padded with pad id 0
    attention_mask = torch.zeros_like(ids)
    for row, length in enumerate(prompt_lengths):
        ids[row, longest - length :] = torch.randint(3, 128, (length,), generator=g)
        attention_mask[row, longest - length :] = 1
    settings = dict(attention_mask=attention_mask, max_new_tokens=6, do_sample=False, output_scores=True,
                    return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
    expected = sdpa_model.generate(ids, **settings)
    got = packed_model.generate(ids, **settings)
    assert torch.equal(got.sequences, expected.sequences)
    torch.testing.assert_close(torch.stack(got.scores), torch.stack(expected.scores), atol=0, rtol=0)


def test_sliding_window_models_keep_sdpa(caplog):
    model = _tiny("mistral")  # Mistral's default sliding_window is 4096
    with caplog.at_level(logging.INFO, logger="oxrl.models.packed_attention"):
        assert not use_packed_attention(model)
    assert model.config._attn_implementation == "sdpa"
    assert "sliding-window" in caplog.text


def test_switching_uses_the_public_name():
    model = make_tiny_llama()
    assert use_packed_attention(model)
    assert model.config._attn_implementation == PACKED_ATTENTION
