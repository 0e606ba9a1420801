"""The built-in rollout engine returns exactly the sampled tokens with their log-probs."""

import pytest
import torch

from oxrl.models.logprobs import token_logprobs_from_logits
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


def _left_padded_prompts():
    return [[1, 5, 6, 7, 8, 9], [1, 9], [1, 4, 4]]


def test_static_cache_decoding_gives_generates_tokens_and_logprobs_greedily():
    # The CUDA path (a static KV cache, every row kept to the end) run eagerly on a CPU: 14 tokens span two host
    # checks, prompts of three widths are left-padded, and each prompt's 2 rows prefill on their own.
    model = make_tiny_llama(seed=3).eval()
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=14)
    reference = HFEngine(model, TinyTokenizer(), decode="generate").generate(_left_padded_prompts(), params)
    static = HFEngine(model, TinyTokenizer(), decode="static")
    assert static.static is not None and not static.static.compile_step
    got = static.generate(_left_padded_prompts(), params)
    assert [c.completion_ids for c in got] == [c.completion_ids for c in reference]
    assert [c.finish_reason for c in got] == [c.finish_reason for c in reference]
    assert sum(len(c.completion_ids) for c in got) > 3 * 2 * 4  # not a trivial run of early EOS
    for mine, theirs in zip(got, reference):
        torch.testing.assert_close(torch.tensor(mine.logprobs), torch.tensor(theirs.logprobs), atol=1e-5, rtol=1e-5)


def test_static_cache_sampling_reports_the_models_logprobs_and_stops():
    torch.manual_seed(0)
    model = make_tiny_llama()
    engine = HFEngine(model, TinyTokenizer(), decode="static")
    params = SamplingParams(n=3, temperature=0.7, top_k=50, max_new_tokens=10)
    for c in engine.generate([[1, 5, 6, 7], [1, 9]], params):
        assert 1 <= len(c.completion_ids) <= 10 and len(c.logprobs) == len(c.completion_ids)
        assert c.finish_reason == ("eos" if c.completion_ids[-1] == 2 else "length")
        assert 2 not in c.completion_ids[:-1]  # nothing after the EOS that ended it
        ids = torch.tensor(c.prompt_ids + c.completion_ids)
        with torch.no_grad():
            logits = model(ids[None]).logits[0] / 0.7
        recomputed = token_logprobs_from_logits(logits, ids)[len(c.prompt_ids) :]
        torch.testing.assert_close(torch.tensor(c.logprobs), recomputed, atol=1e-4, rtol=1e-4)
    # A stop string ends the completion where its text first holds it (the third token's number here).
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=12)
    free = engine.generate([[1, 5, 6]], greedy)[0].completion_ids
    assert len(free) >= 3 and 2 not in free[:3]
    stop = str(free[2])
    end = next(k for k in range(1, len(free) + 1) if stop in TinyTokenizer().decode(free[:k]))
    stopped = engine.generate([[1, 5, 6]], SamplingParams(n=1, temperature=0.0, max_new_tokens=12, stop=[stop]))[0]
    assert stopped.finish_reason == "stop" and stopped.completion_ids == free[:end]


def test_diverged_weights_are_an_error_on_the_static_path():
    from oxrl.training.nonfinite import NonFiniteError

    model = make_tiny_llama()
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))
    engine = HFEngine(model, TinyTokenizer(), decode="static")
    with pytest.raises(NonFiniteError, match="diverged"):
        engine.generate([[1, 5]], SamplingParams(n=1, temperature=1.0, max_new_tokens=4))


def test_decode_choice():
    model = make_tiny_llama()
    assert HFEngine(model, TinyTokenizer()).static is None  # `auto` on a CPU: generate, rows leaving
    with pytest.raises(ValueError, match="rl.rollout.decode='compiled'.*sharded.*valid choices"):
        HFEngine(model, TinyTokenizer(), synced=True, decode="compiled")


def test_the_static_cache_is_reused_emptied_across_calls():
    model = make_tiny_llama(seed=3).eval()
    engine = HFEngine(model, TinyTokenizer(), decode="static")
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=9)
    first = engine.generate(_left_padded_prompts(), params)
    cache = engine.static.caches[model][1]
    again = engine.generate(_left_padded_prompts(), params)  # the same cache object, emptied: the same completions
    assert engine.static.caches[model][1] is cache
    assert [c.completion_ids for c in again] == [c.completion_ids for c in first]
    assert [c.logprobs for c in again] == [c.logprobs for c in first]
    engine.generate([[1, 5]], params)  # another shape: another cache
    assert engine.static.caches[model][1] is not cache
