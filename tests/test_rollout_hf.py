"""The built-in rollout engine returns exactly the sampled tokens with their log-probs."""

import torch

from oxrl.algorithms.logprobs import token_logprobs_from_logits
from oxrl.rollout.base import SamplingParams
from oxrl.rollout.hf import HFEngine
from tests.conftest import make_tiny_llama


class TinyTokenizer:
    """Just enough of a tokenizer for the engine: ids <-> space-joined numbers."""

    eos_token_id = 2
    pad_token_id = 0

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(str(i) for i in ids if not (skip_special_tokens and i in (0, 2)))


def test_n_completions_per_prompt_with_matching_logprobs():
    torch.manual_seed(0)
    model = make_tiny_llama()
    engine = HFEngine(model, TinyTokenizer())
    prompts = [[1, 5, 6, 7], [1, 9]]
    params = SamplingParams(n=3, temperature=0.7, max_new_tokens=6)
    completions = engine.generate(prompts, params)
    assert [c.prompt_index for c in completions] == [0, 0, 0, 1, 1, 1]
    for c in completions:
        assert c.prompt_ids == prompts[c.prompt_index]
        assert 1 <= len(c.completion_ids) <= 6 and len(c.logprobs) == len(c.completion_ids)
        assert c.finish_reason == ("eos" if c.completion_ids[-1] == 2 else "length")
        # Recompute with an unpadded forward of prompt + completion: same log-probs (temperature-scaled).
        ids = torch.tensor(c.prompt_ids + c.completion_ids)
        with torch.no_grad():
            logits = model(ids[None]).logits[0] / 0.7
        recomputed = token_logprobs_from_logits(logits, ids)[len(c.prompt_ids) :]
        torch.testing.assert_close(torch.tensor(c.logprobs), recomputed, atol=1e-4, rtol=1e-4)


def test_eos_ends_a_completion_and_is_kept():
    model = make_tiny_llama()
    with torch.no_grad():  # make EOS overwhelmingly likely after the first token
        model.lm_head.weight.zero_()
        model.lm_head.weight[2] = 0.0
        model.lm_head.bias = None
    engine = HFEngine(model, TinyTokenizer())
    bias = torch.full((128,), -30.0)
    bias[2] = 30.0
    model.lm_head.register_forward_hook(lambda m, i, o: o + bias)
    out = engine.generate([[1, 3]], SamplingParams(n=2, temperature=1.0, max_new_tokens=5))
    for c in out:
        assert c.completion_ids == [2] and c.finish_reason == "eos"


def test_shared_prompt_prefix_gives_what_each_prompt_alone_gives():
    """The n samples of a prompt reuse one prefill (its KV cache, repeated n times); with left padding and
    prompts of different lengths, greedy decoding still gives exactly what `generate` gives each prompt alone."""
    model = make_tiny_llama(seed=3).eval()
    engine = HFEngine(model, TinyTokenizer())
    prompts = [[1, 5, 6, 7, 8, 9], [1, 9], [1, 4, 4]]
    completions = engine.generate(prompts, SamplingParams(n=3, temperature=0.0, max_new_tokens=6))
    assert [c.prompt_index for c in completions] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for c in completions:
        alone = model.generate(input_ids=torch.tensor([c.prompt_ids]), max_new_tokens=6, do_sample=False,
                               pad_token_id=0, eos_token_id=2)[0, len(c.prompt_ids):].tolist()
        if 2 in alone:
            alone = alone[: alone.index(2) + 1]
        assert c.completion_ids == alone
        with torch.no_grad():
            logits = model(torch.tensor([c.prompt_ids + c.completion_ids])).logits[0]
        recomputed = token_logprobs_from_logits(logits, torch.tensor(c.prompt_ids + c.completion_ids))[len(c.prompt_ids):]
        torch.testing.assert_close(torch.tensor(c.logprobs), recomputed, atol=1e-4, rtol=1e-4)


def test_max_batch_size_splits_by_whole_prompts():
    model = make_tiny_llama()
    engine = HFEngine(model, TinyTokenizer(), max_batch_size=4)  # 2 prompts x n=2 per generate call
    calls = []
    original = engine._generate_batch
    engine._generate_batch = lambda model, prompts, params, vision: calls.append(len(prompts)) or original(model, prompts, params, vision)
    out = engine.generate([[1, 3], [1, 4], [1, 5]], SamplingParams(n=2, temperature=1.0, max_new_tokens=3))
    assert calls == [2, 1] and [c.prompt_index for c in out] == [0, 0, 1, 1, 2, 2]
