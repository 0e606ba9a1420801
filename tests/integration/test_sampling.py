"""The `hf` engine's sampler (one uniform per row, inverse CDF) and its bf16 copy of the policy."""

import math
from types import SimpleNamespace

import pytest
import torch

from oxrl.config.schema import RolloutConfig
from oxrl.rollout import build
from oxrl.rollout.base import SamplingParams
from oxrl.rollout.bf16_copy import bf16_copy, refresh
from oxrl.rollout.hf import HFEngine
from oxrl.models import precision
from oxrl.rollout.sampling import InverseCDFDraw, inverse_cdf_draw, sampling_processors
from tests.conftest import make_tiny_llama
from tests.integration.test_rollout_hf import TinyTokenizer

NEG = float("-inf")


def test_the_draw_is_the_first_token_whose_cumulative_probability_exceeds_the_uniform():
    # probabilities 1/8, 1/4, 1/8, 1/2: cumulative 0.125, 0.375, 0.5, 1 (exact in binary)
    scores = torch.tensor([1.0, 2.0, 1.0, 4.0]).log().expand(6, 4)
    uniform = torch.tensor([0.0, 0.1, 0.2, 0.45, 0.6, 0.99])
    assert inverse_cdf_draw(scores, uniform).tolist() == [0, 0, 1, 2, 3, 3]


def test_a_token_of_probability_zero_is_never_drawn():
    # masked first and last tokens, as top-k / suppressed image tokens leave them: even u = 0 and u -> 1 miss them
    scores = torch.tensor([[NEG, 0.0, NEG, 0.0, NEG]]).expand(4, 5)
    uniform = torch.tensor([0.0, 0.49, 0.51, 1.0 - 2**-24])
    assert inverse_cdf_draw(scores, uniform).tolist() == [1, 1, 3, 3]


def test_draws_follow_the_softmax_distribution():
    torch.manual_seed(0)
    probabilities = torch.tensor([0.05, 0.3, 0.01, 0.24, 0.4])
    draws = 200_000
    tokens = inverse_cdf_draw(probabilities.log().expand(draws, 5), torch.rand(draws))
    frequency = torch.bincount(tokens, minlength=5).double() / draws
    sigma = (probabilities.double() * (1 - probabilities.double()) / draws).sqrt()
    assert ((frequency - probabilities.double()).abs() < 5 * sigma).all(), (frequency, probabilities)


def test_the_processor_leaves_only_the_drawn_token_finite():
    torch.manual_seed(0)
    scores = torch.randn(3, 10)
    out = InverseCDFDraw()(torch.zeros(3, 1, dtype=torch.long), scores.clone())
    assert (torch.isfinite(out).sum(-1) == 1).all() and (out[torch.isfinite(out)] == 0).all()


def apply(processors, scores):
    ids = torch.zeros(scores.shape[0], 1, dtype=torch.long)
    for processor in processors:
        scores = processor(ids, scores)
    return scores.argmax(-1)


@pytest.mark.parametrize("top_k, top_p", [(1, 1.0), (0, 0.05)])
def test_top_k_1_or_a_tiny_top_p_always_draws_the_most_likely_token(top_k, top_p):
    torch.manual_seed(0)
    scores = torch.randn(64, 50)
    assert torch.equal(apply(sampling_processors(1.0, top_k, top_p), scores.clone()), scores.argmax(-1))


def test_temperature_sharpens_what_is_drawn():
    # logits log(1), log(3): at T = 1 the second token has p = 3/4; at T = 0.5 p = 9/10 (3^2 / (1 + 3^2))
    torch.manual_seed(0)
    draws = 100_000
    scores = torch.tensor([0.0, math.log(3.0)]).expand(draws, 2).clone()
    for temperature, expected in [(1.0, 0.75), (0.5, 0.9)]:
        share = apply(sampling_processors(temperature, 0, 1.0), scores.clone()).double().mean().item()
        assert abs(share - expected) < 5 * math.sqrt(expected * (1 - expected) / draws)


def test_the_engine_samples_from_the_model_distribution():
    """One new token for 3,000 samples of one prompt, through `generate`: the frequencies are softmax(logits / T)."""
    torch.manual_seed(0)
    model = make_tiny_llama(vocab_size=16, seed=1).eval()
    prompt = [1, 5, 6, 7]
    with torch.no_grad():
        probabilities = torch.softmax(model(torch.tensor([prompt])).logits[0, -1].double() / 0.7, -1)
    draws = 3000
    engine = HFEngine(model, TinyTokenizer(), max_batch_size=draws)
    completions = engine.generate([prompt], SamplingParams(n=draws, temperature=0.7, max_new_tokens=1))
    # a drawn pad token (id 0) ends the row, and the engine trims trailing pads: an empty completion
    drawn = [c.completion_ids[0] if c.completion_ids else 0 for c in completions]
    frequency = torch.bincount(torch.tensor(drawn), minlength=16).double() / draws
    sigma = (probabilities * (1 - probabilities) / draws).sqrt()
    assert ((frequency - probabilities).abs() < 5 * sigma + 1e-3).all(), (frequency, probabilities)
    # and the log-prob it reports is the model's
    kept = [c for c in completions if c.completion_ids]
    logprobs = torch.tensor([c.logprobs[0] for c in kept]).double()
    expected = probabilities.log()[[c.completion_ids[0] for c in kept]]
    torch.testing.assert_close(logprobs, expected, atol=1e-5, rtol=1e-5)


def test_the_bf16_copy_is_frozen_tied_and_leaves_the_trainer_alone():
    model = make_tiny_llama(tie_word_embeddings=True)
    replica = bf16_copy(model)
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in replica.parameters())
    assert replica.lm_head.weight is replica.model.embed_tokens.weight  # still tied: one tensor to refresh
    assert not replica.training
    rotary = dict(replica.named_buffers())["model.rotary_emb.inv_freq"]
    assert rotary.dtype == torch.float32  # position angles keep fp32
    assert all(p.dtype == torch.float32 and p.requires_grad for p in model.parameters())


def test_refresh_copies_the_trainer_weights_into_the_copy():
    model = make_tiny_llama()
    replica = bf16_copy(model)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)  # an "update"
    stale = [p.clone() for p in replica.parameters()]
    refresh(replica, model)
    for old, new, source in zip(stale, replica.parameters(), model.parameters()):
        assert torch.equal(new, source.to(torch.bfloat16)) and not torch.equal(old, new)


def sampled(engine, prompts, seed=0):
    torch.manual_seed(seed)
    return [c.completion_ids for c in engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=6))]


def test_a_bf16_engine_samples_from_its_copy_until_the_sync():
    model = make_tiny_llama(seed=2)
    engine = HFEngine(model, TinyTokenizer(), sample_in_bf16=True)
    prompts = [[1, 5, 6, 7], [1, 9]]
    before = sampled(engine, prompts)
    torch.manual_seed(1)
    with torch.no_grad():  # the trainer's update
        for parameter in model.parameters():
            parameter.add_(0.5 * torch.randn_like(parameter))
    assert sampled(engine, prompts) == before  # not synced: the same draws from the old weights
    engine.sync_weights(model)
    after = sampled(engine, prompts)
    fresh = HFEngine(model, TinyTokenizer(), sample_in_bf16=True)  # a copy made from the updated weights
    assert after == sampled(fresh, prompts) and after != before


def test_a_bf16_engine_decodes_greedily_with_the_trained_weights():
    """Held-out accuracy is the trained model's: greedy decoding skips the copy (and needs no sync)."""
    model = make_tiny_llama(seed=3)
    engine, exact = HFEngine(model, TinyTokenizer(), sample_in_bf16=True), HFEngine(model, TinyTokenizer())
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=6)
    prompts = [[1, 5, 6, 7], [1, 9], [1, 4, 4]]
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.5 * torch.randn_like(parameter))
    for ours, reference in zip(engine.generate(prompts, greedy), exact.generate(prompts, greedy)):
        assert ours.completion_ids == reference.completion_ids
        assert ours.logprobs == reference.logprobs


def test_a_bf16_engine_reports_the_log_probs_of_its_copy():
    torch.manual_seed(0)
    model = make_tiny_llama(seed=4)
    engine = HFEngine(model, TinyTokenizer(), sample_in_bf16=True)
    for c in engine.generate([[1, 5, 6, 7]], SamplingParams(n=4, temperature=1.0, max_new_tokens=6)):
        ids = torch.tensor(c.prompt_ids + c.completion_ids)
        with torch.no_grad():
            logits = engine.copy(ids[None]).logits[0, len(c.prompt_ids) - 1 : -1].float()
        recomputed = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.completion_ids)[:, None])[:, 0]
        # bf16: the cached decode and the one-pass recompute round differently
        torch.testing.assert_close(torch.tensor(c.logprobs), recomputed, atol=5e-2, rtol=0)


def strategy(device="cpu", shards=False):
    return SimpleNamespace(device=torch.device(device), shards_parameters=shards, world_size=1)


@pytest.mark.parametrize("native, device, shards, expected", [
    (True, "cpu", False, True), (False, "cpu", False, False), (True, "cuda", False, False), (True, "cpu", True, False),
])
def test_auto_decodes_in_bf16_on_a_cpu_with_native_bf16_and_whole_weights(monkeypatch, native, device, shards, expected):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native)
    assert build.samples_in_bf16(RolloutConfig(), strategy(device, shards)) is expected
    assert build.samples_in_bf16(RolloutConfig(precision="trainer"), strategy(device, shards)) is False


def test_bf16_with_sharded_weights_is_refused():
    assert build.samples_in_bf16(RolloutConfig(precision="bf16"), strategy()) is True
    with pytest.raises(ValueError, match="rl.rollout.precision `bf16`.*shards"):
        build.samples_in_bf16(RolloutConfig(precision="bf16"), strategy(shards=True))


def test_strict_on_policy_and_ray_workers_sample_from_the_trained_weights():
    from oxrl.config.schema import Config, RLConfig

    grpo = {"model": {"name_or_path": "m"}, "algorithm": {"name": "grpo"}}
    assert Config(**grpo, rl={"strict_on_policy": True}).engine_precision == "trainer"  # auto gives way
    assert Config(**grpo, run={"launcher": "ray"}).engine_precision == "trainer"  # (the workers' probe check)
    assert Config(**grpo).engine_precision == "auto"
    with pytest.raises(ValueError, match="strict_on_policy.*bf16"):
        RLConfig(strict_on_policy=True, rollout={"precision": "bf16"})
