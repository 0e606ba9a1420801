"""Shared prompts in packed rows (`pack(share_prefixes=True)`): a DPO pair's prompt and a GRPO group's prompt run once,
the continuations' queries see it through oxRL's packed attention kernel, and every sequence's log-probs and the
gradients are those of the plain layout."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from oxrl.models.logprobs import sequence_sums, token_logprobs
from oxrl.config.schema import PreferenceConfig
from oxrl.data.types import Segment, Example, Sequence, pack
from oxrl.loops.objectives import get_objective
from oxrl.loops.rl_update import completion_example, score_logprobs
from oxrl.loops.sl import run_micro_batches
from oxrl.models.packed_attention import PACKED_ATTENTION, prefix_sharing
from oxrl.models.reference import FrozenModel, PrecomputedReference
from oxrl.rollout.base import Completion
from oxrl.training.strategy import SingleDevice
from tests.integration.test_architectures import load, save_tiny
from tests.integration.test_preference_training import preference_pairs


def test_the_layout_by_hand():
    first = Sequence([10, 11, 12, 20, 21], [False, False, False, True, True])
    second = Sequence([10, 11, 12, 30], [False, False, False, True])
    other = Sequence([40, 41, 42], [False, True, True])  # nothing in common: a root of its own
    batch = pack([Example([first, second]), Example([other])], share_prefixes=True)
    assert batch.input_ids[0].tolist() == [10, 11, 12, 20, 21, 30, 40, 41, 42]
    assert batch.position_ids[0].tolist() == [0, 1, 2, 3, 4, 3, 0, 1, 2]
    assert batch.predictor.tolist() == [-1, 0, 1, 2, 3, 2, 5, 6, 7]  # 30 is predicted by 12, the prefix's end
    assert batch.seq_index.tolist() == [0, 0, 0, 0, 0, 1, 2, 2, 2]
    assert batch.loss_mask[0].tolist() == [False, False, False, True, True, True, False, True, True]
    plain = pack([Example([first, second]), Example([other])])
    assert plain.predictor is None and plain.input_ids.shape[1] == 12


def test_a_prefix_is_shared_only_while_untrained_and_never_whole():
    ids = [10, 11, 12, 13]
    root = Example([Sequence(ids, [False, False, True, True])])
    trained_early = Example([Sequence(ids, [False, True, True, True])])  # only 1 untrained token in common: too few
    assert pack([root, trained_early], share_prefixes=True).input_ids.shape[1] == 8
    untrained = Example([Sequence(ids, [False, False, False, False])])  # all 4 in common: 3 shared, 1 left of its own
    batch = pack([root, untrained], share_prefixes=True)
    assert batch.input_ids[0].tolist() == ids + [13] and batch.position_ids[0].tolist() == [0, 1, 2, 3, 3]


def group_completions(prompts: int, n: int, seed: int = 0) -> list[Completion]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for p in range(prompts):
        prompt = [1] + torch.randint(11, 120, (4 + 3 * p,), generator=g).tolist()
        for _ in range(n):
            length = int(torch.randint(1, 6, (1,), generator=g))
            ids = torch.randint(11, 120, (length,), generator=g).tolist()
            out.append(Completion(p, prompt, ids, [0.0] * length, "length", ""))
    return out


@pytest.fixture(scope="module", params=["llama", "qwen2"])  # qwen2: grouped-query attention
def packed_model(request, tmp_path_factory):
    model = load(save_tiny(request.param, tmp_path_factory.mktemp(request.param)))
    assert model.config._attn_implementation == PACKED_ATTENTION
    return model


def test_a_group_sharing_its_prompts_gives_the_same_logprobs_and_gradients(packed_model):
    examples = [completion_example(c) for c in group_completions(3, 4)]
    results = []
    for share in (False, True):
        packed_model.zero_grad()
        batch = pack(examples, share_prefixes=share)
        sums = sequence_sums(token_logprobs(packed_model, batch, temperature=0.7), batch)
        (sums * torch.arange(1.0, 13.0)).sum().backward()
        results.append((batch.input_ids.shape[1], sums.detach(), [p.grad.clone() for p in packed_model.parameters()]))
    (plain_tokens, plain, plain_grads), (shared_tokens, shared, shared_grads) = results
    assert shared_tokens < plain_tokens / 2  # each prompt runs once, not 4 times
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=1e-5)
    for a, b in zip(shared_grads, plain_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_rl_scoring_shares_prompts_and_matches_the_plain_layout(packed_model, monkeypatch):
    completions = group_completions(2, 3, seed=1)
    shared = score_logprobs(packed_model, completions, micro_size=6, temperature=1.0)
    monkeypatch.setattr("oxrl.loops.rl_update.prefix_sharing", lambda model: False)
    plain = score_logprobs(packed_model, completions, micro_size=6, temperature=1.0)
    for a, b in zip(shared, plain):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_a_dpo_step_with_shared_prompts_equals_the_plain_one(packed_model):
    import copy

    reference = FrozenModel(copy.deepcopy(packed_model))
    policy = copy.deepcopy(packed_model)
    with torch.no_grad():  # a policy that differs from its reference, so the loss is not log 2 everywhere
        for p in policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    objective = get_objective("dpo", PreferenceConfig(beta=0.5))
    assert objective.shares_prefixes and prefix_sharing(policy) and prefix_sharing(reference)
    strategy = SingleDevice(torch.device("cpu"), "no")
    results = []
    for variant in (dataclasses.replace(objective, shares_prefixes=False), objective):
        policy.zero_grad()
        sums, tokens = run_micro_batches(variant, policy, preference_pairs(6), 3, strategy, reference)
        results.append((tokens, sums["loss"], [p.grad.clone() for p in policy.parameters()]))
    (plain_tokens, plain_loss, plain_grads), (shared_tokens, shared_loss, shared_grads) = results
    assert shared_tokens < plain_tokens
    assert abs(shared_loss - plain_loss) < 1e-5 and abs(plain_loss - 0.6931) > 1e-3
    for a, b in zip(shared_grads, plain_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_only_the_packed_kernel_reads_the_layout(tmp_path):
    assert not prefix_sharing(load(save_tiny("mistral", tmp_path / "mistral")))  # sliding windows: transformers' sdpa
    assert not prefix_sharing(PrecomputedReference({}))  # keyed by each sequence's own tokens


def test_a_continuation_of_a_prefix_no_sequence_holds_is_an_error(packed_model):
    batch = pack([Example([Sequence([1, 2, 3], [False, True, True])])])
    batch.position_ids = torch.tensor([[0, 5, 6]])  # a continuation of 5 tokens after a 1-token sequence
    batch.segments = (Segment(0, 1), Segment(1, 2, shared=5, root=0))
    with pytest.raises(ValueError, match="continues a prefix of 5 tokens"):
        token_logprobs(packed_model, batch)
