"""Weight sync: after an update vLLM samples from the new weights, a stale engine raises, LoRA syncs merged."""

import pytest
import torch

from oxrl.config.schema import LoraConfig
from oxrl.loops.rl_update import score_logprobs
from oxrl.models.lora import add_lora
from oxrl.rollout.base import SamplingParams
from oxrl.rollout.build import VLLM_INSTALL_HINT
from tests.vllm.conftest import make_model

pytest.importorskip("vllm", reason=f"vLLM is not installed: {VLLM_INSTALL_HINT}")
from oxrl.rollout.vllm_engine import WeightSyncError  # noqa: E402

PROMPTS = [[1, 5, 6, 7], [1, 9]]
PARAMS = SamplingParams(n=4, temperature=0.8, max_new_tokens=10)


def sft_step(model, lr: float) -> None:
    """One optimizer step that raises the likelihood of a fixed sequence (moves the log-probs a lot)."""
    ids = torch.tensor([[1, 7, 7, 7, 7, 7, 7, 7, 7]])
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    model.eval()


def assert_engine_samples_from(engine, model) -> None:
    completions = engine.generate(PROMPTS, PARAMS)
    for c, trainer in zip(completions, score_logprobs(model, completions, 8, PARAMS.temperature)):
        torch.testing.assert_close(torch.tensor(c.logprobs), trainer, atol=1e-4, rtol=1e-4)


def test_sync_after_an_update_and_a_stale_engine_is_caught(engine):
    model = make_model(3)
    engine.sync_weights(model)
    assert engine.check_sync(model) < 1e-4
    sft_step(model, lr=1e-2)
    # Not synced yet: vLLM still holds the old weights, and the probe says so.
    with pytest.raises(WeightSyncError, match="not sampling from the weights being trained"):
        engine.check_sync(model)
    engine.sync_weights(model)
    assert engine.check_sync(model) < 1e-4
    assert_engine_samples_from(engine, model)


def test_tied_embeddings_sync(tied_engine):
    """vLLM 0.32's reload_weights leaves a tied lm_head stale; the engine keeps an untied copy in vLLM."""
    model = make_model(6, tied=True)
    tied_engine.sync_weights(model)
    sft_step(model, lr=1e-2)  # moves the shared embedding / output matrix
    assert model.lm_head.weight is model.model.embed_tokens.weight
    with pytest.raises(WeightSyncError):
        tied_engine.check_sync(model)
    tied_engine.sync_weights(model)
    assert tied_engine.check_sync(model) < 1e-4
    assert_engine_samples_from(tied_engine, model)


def test_lora_syncs_the_merged_policy_and_leaves_the_trainer_untouched(engine):
    model = add_lora(make_model(4), LoraConfig(enabled=True, rank=4, alpha=8.0))
    engine.sync_weights(model)  # B = 0: the merged weights are the base weights
    sft_step(model, lr=5e-2)
    assert any(p.abs().sum() > 0 for n, p in model.named_parameters() if "lora_B" in n)
    live = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(WeightSyncError):
        engine.check_sync(model)  # the adapters moved the policy; vLLM has not seen them
    engine.sync_weights(model)
    assert engine.check_sync(model) < 1e-4
    assert_engine_samples_from(engine, model)
    # Merging happened in new tensors: base weights and adapters of the live model are exactly as before.
    assert all(torch.equal(p, live[n]) for n, p in model.named_parameters())
