"""Interruptible generation (oxrl/cluster/interruptible.py), in one process: weights that arrive while a request is
being sampled are taken at the next round of decoding, every later token is sampled, and scored, by them (the KV
cache recomputed under them), each token is tagged with how many updates newer than its request's weights sampled it,
and a delivery returns the probe under the weights it brought only once they are in the model."""

import copy
import threading

import pytest
import torch

import oxrl.rollout.hf as hf
from oxrl.cluster.interruptible import InterruptibleEngine, WeightInbox
from oxrl.data.types import Example, Sequence, pack
from oxrl.loops.rl_update import score_logprobs
from oxrl.models.logprobs import token_logprobs
from oxrl.rollout.base import SamplingParams
from oxrl.rollout.hf import HFEngine
from oxrl.rollout.probe import trainer_probe_logprobs
from tests.conftest import make_tiny_llama
from tests.integration.test_rollout_hf import TinyTokenizer

PROMPTS = [[1, 5, 6, 7, 8, 9], [1, 9], [1, 4, 4], [1, 30, 31]]
PARAMS = SamplingParams(n=2, temperature=0.8, max_new_tokens=12)
PROBE = [1, 40, 41, 42, 43]


def nudged(model, seed: int):
    """A copy of `model` after an update: every weight moved a little."""
    other = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.2)
    return other


def engine_of(model, cls=InterruptibleEngine):
    holder = {}
    inbox = WeightInbox(model, lambda ids: holder["engine"].probe_logprobs(ids))
    engine = holder["engine"] = cls(model, TinyTokenizer(), inbox=inbox)
    engine.eos_ids = {127}  # (rare: rows run on past the first rounds)
    return engine


def test_without_new_weights_it_samples_exactly_what_the_hf_engine_samples():
    model = make_tiny_llama(seed=3).eval()
    plain = HFEngine(model, TinyTokenizer())
    plain.eos_ids = {127}
    torch.manual_seed(0)
    expected = plain.generate(PROMPTS, PARAMS)
    torch.manual_seed(0)
    got = engine_of(model).generate(PROMPTS, PARAMS)
    assert [(c.completion_ids, c.logprobs) for c in got] == [(c.completion_ids, c.logprobs) for c in expected]
    assert all(c.newer_by == [0] * len(c.completion_ids) for c in got)


def test_weights_that_arrive_mid_request_sample_every_later_token_with_their_own_log_probs(monkeypatch):
    """A sync lands after the first round of 4 tokens: tokens 0-3 are the old weights' samples, 4 on the new ones',
    each with its log-prob under the weights that sampled it, as the trainer scores it (the cache of the old weights
    would give other numbers from token 4 on)."""
    monkeypatch.setattr(hf, "ROUND_TOKENS", 4)
    old = make_tiny_llama(seed=3).eval()
    new = nudged(old, 1)

    class ArrivesAfterTheFirstRound(InterruptibleEngine):
        def _next_round(self, model, input_ids, attention, cache, decoded):
            if decoded == 4:  # what `deliver` stages from the weight thread
                self.inbox.staged = (new.state_dict(), 1, PROBE)
            return super()._next_round(model, input_ids, attention, cache, decoded)

    engine = engine_of(copy.deepcopy(old), ArrivesAfterTheFirstRound)
    torch.manual_seed(0)
    completions = engine.generate(PROMPTS, PARAMS, since=0)
    assert engine.inbox.version == 1 and engine.inbox.staged is None
    assert max(len(c.completion_ids) for c in completions) > 4  # (not vacuous: rows went on past the swap)
    before, after = score_logprobs(old, completions, 8, 0.8), score_logprobs(new, completions, 8, 0.8)
    for c, by_old, by_new in zip(completions, before, after):
        length = len(c.completion_ids)
        assert c.newer_by == [0] * min(4, length) + [1] * (length - 4)
        expected = torch.cat([by_old[:4], by_new[4:]])
        torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)
    # the weights are the new ones for good; the next request counts from the version it was submitted under
    torch.testing.assert_close(trainer_probe_logprobs(engine.model, PROBE), trainer_probe_logprobs(new, PROBE))
    later = engine.generate(PROMPTS[:1], PARAMS, since=1)
    assert all(set(c.newer_by) == {0} for c in later)


def test_weights_taken_mid_request_answer_the_probe_as_the_trainer_scores_it_outside_autocast(monkeypatch):
    """The sampling thread takes new weights, and scores the probe, inside its engine's autocast (bf16 where the
    trainer trains in it); the trainer scores the probe outside any. The answer must be the weights' own numbers:
    bf16 rounding read as a gap put SmolLM2-135M's syncs at 0.043-0.051 against the tolerance of 0.05, and a run
    stopped with WeightSyncError."""
    monkeypatch.setattr(hf, "ROUND_TOKENS", 4)
    model = make_tiny_llama(seed=3).eval()
    new = nudged(model, 5)

    class ArrivesAfterTheFirstRound(InterruptibleEngine):
        def _next_round(self, model, input_ids, attention, cache, decoded):
            if decoded == 4:
                self.inbox.staged = (new.state_dict(), 1, PROBE)
            return super()._next_round(model, input_ids, attention, cache, decoded)

    holder = {}
    inbox = WeightInbox(model, lambda ids: holder["engine"].probe_logprobs(ids))
    bf16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731 (the engine takes a context factory)
    engine = holder["engine"] = ArrivesAfterTheFirstRound(model, TinyTokenizer(), inbox=inbox, autocast=bf16)
    engine.eos_ids = {127}
    torch.manual_seed(0)
    engine.generate(PROMPTS, PARAMS, since=0)
    assert inbox.version == 1  # taken on the sampling thread, inside the engine's autocast
    expected = trainer_probe_logprobs(new, PROBE)
    torch.testing.assert_close(torch.tensor(inbox.probed), expected, atol=0, rtol=0)
    with bf16():  # (not vacuous: under the engine's autocast the same weights give other numbers)
        rounded = token_logprobs(new, pack([Example([Sequence(PROBE, [False] + [True] * 4)])]))[1:].float()
    assert not torch.equal(rounded, expected)


def test_a_request_that_starts_after_a_sync_counts_it():
    """Submitted under version 0, sampled once version 2 is in (a sync landed while it waited): 2 for every token."""
    model = make_tiny_llama(seed=3).eval()
    engine = engine_of(model)
    engine.inbox.deliver(nudged(model, 2).state_dict(), 2, PROBE)  # idle: applied at once
    completions = engine.generate(PROMPTS[:2], PARAMS, since=0)
    assert all(c.newer_by == [2] * len(c.completion_ids) for c in completions)


def test_a_delivery_waits_for_the_sampling_thread_and_answers_the_probe_under_the_weights_it_brought():
    model = make_tiny_llama(seed=3).eval()
    new = nudged(model, 3)
    before = trainer_probe_logprobs(model, PROBE)
    inbox = WeightInbox(model, lambda ids: trainer_probe_logprobs(model, ids))
    answer = {}
    with inbox.sampling():  # a request is being sampled: the model is its thread's
        receiver = threading.Thread(target=lambda: answer.setdefault("probe", inbox.deliver(new.state_dict(), 5, PROBE)))
        receiver.start()
        receiver.join(timeout=0.5)
        assert receiver.is_alive() and inbox.version == 0  # staged, waiting for the sampler's next round
        torch.testing.assert_close(trainer_probe_logprobs(model, PROBE), before)
        assert inbox.take()  # the next round: in they go
        receiver.join(timeout=10)
        assert not receiver.is_alive() and inbox.version == 5
        assert not inbox.take()  # nothing more staged
    expected = trainer_probe_logprobs(new, PROBE)
    assert not torch.allclose(expected, before)
    torch.testing.assert_close(torch.tensor(answer["probe"]), expected)


def test_weights_staged_by_the_end_of_a_request_go_in_as_it_ends():
    model = make_tiny_llama(seed=3).eval()
    new = nudged(model, 4)
    inbox = WeightInbox(model, lambda ids: trainer_probe_logprobs(model, ids))
    receiver = threading.Thread(target=lambda: inbox.deliver(new.state_dict(), 1, PROBE))
    with inbox.sampling():
        receiver.start()
        receiver.join(timeout=0.5)
        assert receiver.is_alive()
    receiver.join(timeout=10)
    assert not receiver.is_alive() and inbox.version == 1
    torch.testing.assert_close(trainer_probe_logprobs(model, PROBE), trainer_probe_logprobs(new, PROBE))


@pytest.mark.parametrize("newer_by, lag", [([[0, 0], [1, 1, 1]], 1 - 3 / 5), ([[0, 0, 0]], 1.0), ([[1, 1]], 0.0)])
def test_the_fresher_tokens_share_and_lag_by_hand(newer_by, lag):
    """Step 3 (0-based) trains on samples scheduled for version 2 (k = 1): a token one update newer lags 0."""
    from oxrl.loops.pipeline import fresher_tokens
    from oxrl.loops.rl import Rollout
    from oxrl.rollout.base import Completion

    completions = [Completion(0, [1], [5] * len(n), [-1.0] * len(n), "length", "", newer_by=n) for n in newer_by]
    rollout = Rollout.of(completions, torch.zeros(len(completions)))
    rollout.version = 2
    tokens = [v for n in newer_by for v in n]
    metrics = fresher_tokens(rollout, 3)
    assert metrics["off_policy/fresher_tokens"] == pytest.approx(sum(v > 0 for v in tokens) / len(tokens))
    assert metrics["off_policy/token_version_lag"] == pytest.approx(lag)
    assert fresher_tokens(Rollout.of([Completion(0, [1], [5], [-1.0], "eos", "")], torch.zeros(1)), 3) == {}
