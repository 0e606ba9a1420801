"""Chunked log-probs and entropy from final hidden states (oxrl/models/lm_head.py): values by hand, equality with
the full-logits path (values and gradients), no [N, V] tensor kept for the backward, and the head's self-check."""

from __future__ import annotations

import math

import pytest
import torch

from oxrl.models import lm_head
from oxrl.models.lm_head import OutputHead, chunked_logprobs


def head_of(weight: torch.Tensor, **transform) -> OutputHead:
    projection = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    with torch.no_grad():
        projection.weight.copy_(weight)
    return OutputHead(projection, "test", **transform)


def test_logprob_and_entropy_by_hand():
    # logits = [ln 2, 0, 0] -> p = [1/2, 1/4, 1/4]; log p(0) = -ln 2, log p(1) = -2 ln 2;
    # entropy = 1/2 ln 2 + 2 * 1/4 * ln 4 = 3/2 ln 2.
    head = head_of(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]))
    hidden = torch.tensor([[math.log(2), 0.0], [math.log(2), 0.0]])
    logprobs, entropy = chunked_logprobs(head, hidden, torch.tensor([0, 1]), with_entropy=True)
    torch.testing.assert_close(logprobs, torch.tensor([-math.log(2), -2 * math.log(2)]))
    torch.testing.assert_close(entropy, torch.full((2,), 1.5 * math.log(2)))


def test_temperature_multiplier_and_softcap_by_hand():
    # Projection [2 ln 2, 0]; multiplier 1/2 -> [ln 2, 0]; no cap; temperature 1/2 -> [2 ln 2, 0] -> p = [4/5, 1/5].
    head = head_of(torch.tensor([[1.0], [0.0]]), multiplier=0.5)
    logprobs, _ = chunked_logprobs(head, torch.tensor([[2 * math.log(2)]]), torch.tensor([1]), temperature=0.5)
    torch.testing.assert_close(logprobs, torch.tensor([math.log(1 / 5)]))
    # Cap 1: logits = tanh([3, 0]) = [tanh 3, 0] -> log p(1) = -log(1 + e^tanh 3).
    capped = head_of(torch.tensor([[1.0], [0.0]]), softcap=1.0)
    logprobs, _ = chunked_logprobs(capped, torch.tensor([[3.0]]), torch.tensor([1]))
    torch.testing.assert_close(logprobs, torch.tensor([-math.log(1 + math.exp(math.tanh(3.0)))]))


def full_path(head: OutputHead, hidden, targets, temperature):
    logp = (head.logits(hidden).float() / temperature).log_softmax(-1)
    return logp.gather(-1, targets[:, None])[:, 0], -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("transform", [{}, {"multiplier": 0.25}, {"softcap": 2.0}])
def test_chunks_equal_the_full_logits_in_values_and_gradients(monkeypatch, transform):
    monkeypatch.setattr(lm_head, "CHUNK_ELEMENTS", 3 * 50)  # 3 rows of a 50-token vocabulary per chunk
    torch.manual_seed(0)
    weight, hidden, targets = torch.randn(50, 8), torch.randn(10, 8), torch.randint(0, 50, (10,))
    upstream = torch.randn(10), torch.randn(10)
    results = []
    for path in (full_path, lambda *args: chunked_logprobs(*args, with_entropy=True)):
        head = head_of(weight, **transform)
        states = hidden.clone().requires_grad_()
        logprobs, entropy = path(head, states, targets, 0.7)
        (logprobs @ upstream[0] + entropy @ upstream[1]).backward()
        results.append((logprobs.detach(), entropy.detach(), states.grad, head.projection.weight.grad))
    for full, chunked in zip(*results):
        torch.testing.assert_close(chunked, full, atol=1e-5, rtol=1e-5)


def test_no_tensor_of_all_rows_by_vocabulary_is_kept_for_the_backward(monkeypatch):
    monkeypatch.setattr(lm_head, "CHUNK_ELEMENTS", 4 * 1000)
    head = head_of(torch.randn(1000, 16))
    hidden = torch.randn(64, 16, requires_grad=True)
    saved: list[int] = []

    def pack(tensor):
        saved.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logprobs, entropy = chunked_logprobs(head, hidden, torch.randint(0, 1000, (64,)), with_entropy=True)
        (logprobs.sum() + entropy.sum()).backward()
    assert saved and max(saved) <= 16 * 1000  # the weight itself; a chunk's logits are 4 x 1000, all rows' 64 x 1000
    # the same hook sees the full path keep [64, 1000]: the measurement can fail
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        full_path(head, hidden, torch.randint(0, 1000, (64,)), 1.0)[0].sum().backward()
    assert max(saved) >= 64 * 1000


def test_a_head_that_does_not_reproduce_the_model_logits_is_an_error():
    head = head_of(torch.randn(5, 3), multiplier=0.5)
    hidden = torch.randn(1, 3)
    head.check(hidden, head.logits(hidden))  # its own logits pass
    with pytest.raises(ValueError, match="'test' model.*does not know"):
        head.check(hidden, head.projection(hidden))  # a model without the multiplier
