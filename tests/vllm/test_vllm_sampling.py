"""vLLM samples like HFEngine: exact ids, temperature-scaled log-probs of the sampled tokens, finish reasons."""

import pytest
import torch

from oxrl.loops.rl_update import score_logprobs
from oxrl.rollout.base import SamplingParams
from oxrl.rollout.build import VLLM_INSTALL_HINT
from oxrl.rollout.hf import HFEngine
from tests.vllm.conftest import EOS, make_model

pytest.importorskip("vllm", reason=f"vLLM is not installed: {VLLM_INSTALL_HINT}")

PROMPTS = [[1, 5, 6, 7], [1, 9], [1, 40, 41, 42, 43, 44]]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_the_trainers(engine, temperature):
    model = make_model(0)
    engine.sync_weights(model)
    completions = engine.generate(PROMPTS, SamplingParams(n=4, temperature=temperature, max_new_tokens=12))
    assert [c.prompt_index for c in completions] == [0] * 4 + [1] * 4 + [2] * 4  # grouped by prompt, in order
    for c in completions:
        assert c.prompt_ids == PROMPTS[c.prompt_index]
        assert len(c.logprobs) == len(c.completion_ids) >= 1
        assert c.finish_reason == ("eos" if c.completion_ids[-1] == EOS else "length")
    # The trainer's own log-probs of exactly these ids, divided by the same temperature.
    recomputed = score_logprobs(model, completions, 8, temperature)
    for c, trainer in zip(completions, recomputed):
        torch.testing.assert_close(torch.tensor(c.logprobs), trainer, atol=1e-4, rtol=1e-4)
    # Samples differ between completions of one prompt (n really samples).
    assert len({tuple(c.completion_ids) for c in completions[:4]}) > 1


def test_greedy_equals_hf_generate(engine, tokenizer):
    model = make_model(1)
    engine.sync_weights(model)
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=10)
    ours = engine.generate(PROMPTS, params)
    reference = HFEngine(model, tokenizer).generate(PROMPTS, params)
    for v, h in zip(ours, reference):
        assert v.completion_ids == h.completion_ids
        assert v.text == h.text and v.finish_reason == h.finish_reason
        torch.testing.assert_close(torch.tensor(v.logprobs), torch.tensor(h.logprobs), atol=1e-4, rtol=1e-4)


def eos_prone(model, strength: float):
    """Make EOS likely at every step: residual dimension 0 is a constant 1 (set in every embedding,
    written by no layer), so after the final norm it is large, and only EOS's lm_head row reads it."""
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0] = 0.0
            layer.mlp.down_proj.weight[0] = 0.0
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[EOS, 0] = strength
    return model


def test_stop_strings_eos_and_length_finish_reasons(engine, tokenizer):
    model = eos_prone(make_model(2), strength=0.4)
    engine.sync_weights(model)
    max_new = 8
    completions = engine.generate(PROMPTS, SamplingParams(n=8, temperature=1.0, max_new_tokens=max_new, stop=["7"], seed=0))  # seeded: the same draws whatever ran before
    reasons = {c.finish_reason for c in completions}
    assert reasons == {"eos", "stop", "length"}, [(c.text, c.finish_reason) for c in completions]
    for c in completions:
        assert c.text == tokenizer.decode(c.completion_ids, skip_special_tokens=True)
        if c.finish_reason == "eos":
            assert c.completion_ids[-1] == EOS and EOS not in c.completion_ids[:-1]
        elif c.finish_reason == "stop":  # kept in the completion, ended by its last token
            assert "7" in c.text and "7" not in tokenizer.decode(c.completion_ids[:-1], skip_special_tokens=True)
        else:
            assert len(c.completion_ids) == max_new and EOS not in c.completion_ids and "7" not in c.text
    recomputed = score_logprobs(model, completions, 8, 1.0)
    for c, trainer in zip(completions, recomputed):
        torch.testing.assert_close(torch.tensor(c.logprobs), trainer, atol=1e-4, rtol=1e-4)
