"""Multi-turn episodes with vLLM rollouts: the trained tokens are exactly vLLM's samples, environment
tokens are masked, and the trainer's log-probs of the sampled tokens equal vLLM's in every context."""

import pytest
import torch

from oxrl.loops.rl_update import score_logprobs
from oxrl.loops.rl_update import completion_example
from oxrl.rollout.base import SamplingParams
from oxrl.rollout.build import VLLM_INSTALL_HINT
from oxrl.loops.multiturn import load_environment, run_episodes
from tests.integration.test_multiturn import EXTENDING, RESTARTING, RecordingEngine, env_file
from tests.vllm.conftest import make_model

pytest.importorskip("vllm", reason=f"vLLM is not installed: {VLLM_INSTALL_HINT}")

PROMPTS = [[1, 4, 5], [1, 6]]
PARAMS = SamplingParams(n=2, temperature=1.0, max_new_tokens=3)


@pytest.mark.parametrize("source, restarts", [(EXTENDING, 0), (RESTARTING, 1)])
def test_multi_turn_episodes_train_exactly_vllms_samples(engine, tokenizer, tmp_path, source, restarts):
    model = make_model(3)
    engine.sync_weights(model)
    recording = RecordingEngine(engine)
    env = load_environment(env_file(tmp_path, source), 2, tokenizer)
    episodes = run_episodes(recording, env, PROMPTS, [{}, {}], PARAMS)
    assert len(recording.calls) == 2 and episodes.metrics()["context_restarts/mean"] == restarts
    trainer = score_logprobs(model, episodes.completions, micro_size=4, temperature=1.0)
    for k, completion in enumerate(episodes.completions):
        actions = [completions[k] for _, completions in recording.calls]
        assert completion.sampled_ids == [t for a in actions for t in a.completion_ids]
        trained = [t for s in completion_example(completion).sequences for t, m in zip(s.input_ids, s.loss_mask) if m]
        assert trained == completion.sampled_ids  # environment tokens (9 9 / 7 7 7) are never trained
        assert not completion.loss_mask[len(actions[0].completion_ids)]  # the first env token is masked
        torch.testing.assert_close(trainer[k], torch.tensor(completion.logprobs), atol=1e-4, rtol=1e-4)
