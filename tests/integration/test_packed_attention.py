"""The per-sequence packed kernel == transformers' sdpa (packed and padded): logits, loss, gradients,
and generation, which must fall back to exactly sdpa."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn.functional as F

from oxrl.models.logprobs import forward_logits
from oxrl.data.types import pack
from oxrl.loops.objectives import get_objective
from oxrl.models.model_inputs import forward_inputs, packed_row
from oxrl.data.types import Segment
from oxrl.models.cuda_attention import VARLEN, document_block_mask
from oxrl.models.packed_attention import (PACKED_ATTENTION, packed_causal_mask,
                                          packed_kernel, packed_sdpa_attention_forward, use_packed_attention)
from tests.conftest import make_tiny_llama
from tests.integration.test_packing import _examples, _padded_reference

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


def test_the_packer_lays_out_each_sequence_and_its_shared_prefix():
    batch = pack(_examples())
    starts = [s.start for s in batch.segments]
    assert starts == [0, *torch.tensor([s.length for s in batch.segments]).cumsum(0)[:-1].tolist()]
    assert sum(s.length for s in batch.segments) == batch.input_ids.shape[1]
    assert torch.equal(torch.bincount(batch.seq_index), torch.tensor([s.length for s in batch.segments]))
    shared = pack(_shared_prefix_examples(), share_prefixes=True)
    root, continuation = shared.segments[0], shared.segments[1]
    assert (root.shared, continuation.shared, continuation.root) == (0, 3, 0)
    assert continuation.start == root.length  # only its own tokens are laid
    assert shared.position_ids[0, continuation.start].item() == 3  # positions go on from the prefix


def _shared_prefix_examples():
    """Two answers to one 3-token prompt (the prefix is untrained), then a sequence of its own."""
    from oxrl.data.types import Example, Sequence

    prompt = [5, 6, 7]
    return [Example([Sequence(prompt + [9, 10, 11], [False] * 3 + [True] * 3),
                     Sequence(prompt + [12, 13], [False] * 3 + [True] * 2)]),
            Example([Sequence([20, 21, 22, 23], [False, True, True, True])])]


def _row(lengths, shared=None, roots=None):
    """A PackedRow of sequences of `lengths` (own tokens), laid end to end."""
    from oxrl.data.types import PackedBatch

    shared = shared or [0] * len(lengths)
    roots = roots or [0] * len(lengths)
    starts = torch.tensor([0, *lengths]).cumsum(0).tolist()
    segments = tuple(Segment(start, length, s, r) for start, length, s, r in zip(starts, lengths, shared, roots))
    batch = PackedBatch(input_ids=torch.zeros(1, sum(lengths), dtype=torch.long), position_ids=None, loss_mask=None,
                        seq_index=None, seq_example=None, seq_role=None, fields={}, num_examples=0, segments=segments)
    return packed_row(batch, "cpu")


def _masked_reference(query, key, value, row, dim):
    """One SDPA over the whole row under the explicit mask the layout means (the dense T x T reference)."""
    total = row.length
    sequence = torch.repeat_interleave(torch.arange(len(row.segments)), torch.tensor([s.length for s in row.segments]))
    q, k = torch.arange(total)[:, None], torch.arange(total)[None, :]
    root = torch.tensor([s.root for s in row.segments])[sequence][:, None]
    shared = torch.tensor([s.shared for s in row.segments])[sequence][:, None]
    mask = ((sequence[:, None] == sequence[None, :]) & (k <= q)) | ((k >= root) & (k < root + shared))
    groups = query.shape[1] // key.shape[1]
    return F.scaled_dot_product_attention(query, key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1),
                                          attn_mask=mask, scale=dim**-0.5).transpose(1, 2)


LAYOUTS = {
    "own sequences": dict(lengths=[5, 1, 9, 3]),
    # sequence 1 continues the first 4 tokens of sequence 0 (at 0), sequence 3 the first 2 of sequence 2 (at 9)
    "shared prefixes": dict(lengths=[6, 3, 7, 4], shared=[0, 4, 0, 2], roots=[0, 0, 9, 9]),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_kernel_equals_sdpa_with_the_dense_mask(layout):
    # Attention level, on a CPU: the per-sequence kernel == one SDPA over the row with the dense mask.
    row = _row(**LAYOUTS[layout])
    heads, kv_heads, dim = 4, 2, 8
    query = torch.randn(1, heads, row.length, dim)
    key, value = torch.randn(1, kv_heads, row.length, dim), torch.randn(1, kv_heads, row.length, dim)
    assert packed_kernel(query, dim**-0.5) == "sdpa"
    out, _ = packed_sdpa_attention_forward(torch.nn.Module(), query, key, value, None, scaling=dim**-0.5, packed_row=row)
    torch.testing.assert_close(out, _masked_reference(query, key, value, row, dim), **TOLERANCE)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")  # the reference path, on purpose
@pytest.mark.parametrize("layout", LAYOUTS)
def test_flex_attention_with_the_document_mask_equals_the_per_sequence_kernel(layout):
    # The CUDA fallback's mask, run by FlexAttention's reference (eager) path on a CPU.
    from torch.nn.attention.flex_attention import flex_attention

    row = _row(**LAYOUTS[layout])
    query = torch.randn(1, 4, row.length, 8)
    key, value = torch.randn(1, 2, row.length, 8), torch.randn(1, 2, row.length, 8)
    flex = flex_attention(query, key, value, block_mask=document_block_mask(row), scale=8**-0.5, enable_gqa=True)
    out, _ = packed_sdpa_attention_forward(torch.nn.Module(), query, key, value, None, scaling=8**-0.5, packed_row=row)
    torch.testing.assert_close(flex.transpose(1, 2), out, **TOLERANCE)


def test_the_kernel_choice():
    query = torch.zeros(1, 2, 4, 8)
    assert packed_kernel(query, 8**-0.5) == "sdpa"  # a CPU: per-sequence SDPA
    assert not VARLEN.applies(query, 8**-0.5)  # FlashAttention is CUDA's only, and half precision's
    if VARLEN.function is not None:  # the installed torch's keyword for causality
        assert VARLEN.causal in ({"is_causal": True}, {"window_size": (-1, 0)})


def test_the_model_receives_the_packers_layout_not_the_position_ids():
    model = _packed(make_tiny_llama())
    batch = pack(_examples())
    row = forward_inputs(model, batch)["packed_row"]
    assert [s.length for s in row.segments] == torch.bincount(batch.seq_index).tolist()
    assert "packed_row" not in forward_inputs(make_tiny_llama(), batch)  # sdpa builds its own mask


def test_no_block_diagonal_mask_is_built_for_a_packed_row():
    assert packed_causal_mask(batch_size=1, q_length=9, kv_length=9) is None
    padding = torch.tensor([[False, True, True]])
    mask = packed_causal_mask(batch_size=1, q_length=3, kv_length=3, attention_mask=padding)
    assert mask is not None and not mask[0, 0, :, 0].any()  # padding falls back to the sdpa mask


def test_missing_position_ids_is_an_error_not_cross_attention():
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="position ids"):
        packed_sdpa_attention_forward(torch.nn.Module(), q, q, q, None)


def test_a_packed_row_without_its_layout_is_an_error_not_cross_attention():
    model = _packed(make_tiny_llama())
    batch = pack(_examples())
    with pytest.raises(ValueError, match="without its layout"):
        model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False)
    one = torch.arange(6)[None]  # one ordinary sequence needs no layout
    model(input_ids=one + 3, position_ids=one, use_cache=False)


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


def test_flash_attention_2_reads_the_packers_boundaries_by_transformers_names():
    from oxrl.models.model_inputs import boundary_inputs

    model = make_tiny_llama()
    model.config._attn_implementation = "flash_attention_2"  # only the config is read: no flash-attn needed here
    batch = pack(_examples())
    got = boundary_inputs(model, batch)
    lengths = torch.bincount(batch.seq_index)
    expected = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]).int()
    assert torch.equal(got["cu_seq_lens_q"], expected) and torch.equal(got["cu_seq_lens_k"], expected)
    assert got["cu_seq_lens_q"].dtype == torch.int32  # FlashAttention's index type
    assert got["max_length_q"] == got["max_length_k"] == int(lengths.max())
