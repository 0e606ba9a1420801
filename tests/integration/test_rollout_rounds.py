"""Finished rows leave the batch between rounds of `generate` (oxrl/rollout/hf.py `HFEngine._decode`).

Greedy decoding in rounds must give exactly what one `generate` call gives, row for row; sampled rows must report
the log-probs of exactly their tokens; a stop string that ends exactly at a round's end must end its row; and the
rows must really leave (each call decodes only the unfinished ones)."""

import pytest
import torch

import oxrl.rollout.hf as hf
from oxrl.models.logprobs import token_logprobs_from_logits
from oxrl.rollout.base import SamplingParams
from oxrl.rollout.hf import HFEngine, rows_can_leave
from tests.conftest import make_tiny_llama
from tests.integration.test_rollout_hf import TinyTokenizer

PROMPTS = [[1, 5, 6, 7, 8, 9], [1, 9], [1, 4, 4], [1, 30, 31], [1, 77], [1, 12, 13, 14], [1, 100], [1, 64, 65]]


def greedy_tokens(model, prompts: list[list[int]], steps: int) -> list[list[int]]:
    with torch.no_grad():
        return [model.generate(input_ids=torch.tensor([p]), max_new_tokens=steps, do_sample=False, pad_token_id=0,
                               eos_token_id=[])[0, len(p):].tolist() for p in prompts]


def ending_tokens(model) -> set[int]:
    """Tokens that, taken as EOS, end the tiny model's greedy rows at many different lengths (some never)."""
    rows = greedy_tokens(model, PROMPTS, 24)
    first = {}
    for row in rows:
        for position, token in enumerate(row):
            first.setdefault(token, set()).add(position)
    # the token whose first appearances are spread most
    token = max(first, key=lambda t: (len(first[t]), -min(first[t])))
    return {token}


def engine_calls(engine: HFEngine, monkeypatch) -> list[int]:
    """Records the number of rows of every `generate` call the engine's model gets."""
    sizes = []
    original = engine.model.generate

    def counting(*args, **kwargs):
        sizes.append(kwargs["input_ids"].shape[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(engine.model, "generate", counting)
    return sizes


@pytest.mark.parametrize("n", [1, 3])
def test_greedy_rounds_give_exactly_one_calls_tokens(monkeypatch, n):
    model = make_tiny_llama(seed=3).eval()
    eos = ending_tokens(model)
    one_call = HFEngine(model, TinyTokenizer())
    one_call.eos_ids = eos
    params = SamplingParams(n=n, temperature=0.0, max_new_tokens=20)
    monkeypatch.setattr(hf, "ROUND_TOKENS", 20)
    whole = one_call.generate(PROMPTS, params)
    monkeypatch.setattr(hf, "ROUND_TOKENS", 3)
    rounds = HFEngine(model, TinyTokenizer())
    rounds.eos_ids = eos
    sizes = engine_calls(rounds, monkeypatch)
    split = rounds.generate(PROMPTS, params)
    lengths = sorted(len(c.completion_ids) for c in whole)
    assert lengths[0] <= 3 and lengths[-1] > 9, lengths  # rows end in the first round, and rows go on for rounds
    assert [(c.prompt_index, c.completion_ids, c.finish_reason) for c in split] == \
        [(c.prompt_index, c.completion_ids, c.finish_reason) for c in whole]
    for a, b in zip(split, whole):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=1e-5)
    # Every round decodes only the rows still going: as many as have not finished before it.
    expected = [sum(len(c.completion_ids) > 3 * r or c.finish_reason == "length" and 3 * r < 20 for c in whole)
                for r in range(len(sizes))]
    assert sizes == expected and sizes[-1] < sizes[0], (sizes, lengths)


def test_sampled_rows_report_their_own_tokens_log_probs_across_rounds(monkeypatch):
    torch.manual_seed(0)
    model = make_tiny_llama(seed=3).eval()
    monkeypatch.setattr(hf, "ROUND_TOKENS", 3)
    engine = HFEngine(model, TinyTokenizer())
    engine.eos_ids = ending_tokens(model)
    completions = engine.generate(PROMPTS[:4], SamplingParams(n=4, temperature=0.7, max_new_tokens=16))
    assert len({len(c.completion_ids) for c in completions}) > 2  # rows of many lengths: some left early
    for c in completions:
        ended = [i for i, token in enumerate(c.completion_ids) if token in engine.eos_ids]
        assert ended == ([len(c.completion_ids) - 1] if c.finish_reason == "eos" else [])
        assert c.finish_reason == "eos" or len(c.completion_ids) == 16
        ids = torch.tensor(c.prompt_ids + c.completion_ids)
        with torch.no_grad():
            logits = model(ids[None]).logits[0] / 0.7
        recomputed = token_logprobs_from_logits(logits, ids)[len(c.prompt_ids):]
        torch.testing.assert_close(torch.tensor(c.logprobs), recomputed, atol=1e-4, rtol=1e-4)


def test_a_stop_string_that_ends_a_round_ends_its_row(monkeypatch, smollm2_tokenizer):
    """With rounds of 2 tokens, a stop string completed by a round's last token must still end the row (the next
    call's stop check looks only at tokens it adds), exactly where one call ends it, and as a stop, not an EOS."""
    model = make_tiny_llama(vocab_size=len(smollm2_tokenizer), seed=5).eval()
    prompts = [smollm2_tokenizer.encode(text) for text in ("Hello there", "2 + 2 =", "A list:", "Why")]
    rows = greedy_tokens(model, prompts, 12)
    # A stop string: the text of tokens 3-4 of a row (completed at the end of its second 2-token round).
    stop = smollm2_tokenizer.decode(rows[0][2:4])
    assert stop.strip(), stop
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=12, stop=[stop])
    results = []
    # The fixture's pad token is an EOS token: a stopped row's padding must not make it an EOS-ended one.
    assert smollm2_tokenizer.pad_token_id in HFEngine(model, smollm2_tokenizer).eos_ids
    for per_round in (12, 2):
        monkeypatch.setattr(hf, "ROUND_TOKENS", per_round)
        engine = HFEngine(model, smollm2_tokenizer)
        results.append([(c.completion_ids, c.finish_reason) for c in engine.generate(prompts, params)])
    assert results[1] == results[0]
    assert results[0][0] == (rows[0][:4], "stop")


def test_only_key_value_layers_let_rows_leave():
    from transformers import DynamicCache, LlamaConfig

    plain = DynamicCache(config=LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                            intermediate_size=64))
    assert rows_can_leave(plain)
    assert not rows_can_leave(None)
    mixed = DynamicCache(config=LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                            intermediate_size=64, layer_types=["full_attention", "linear_attention"]))
    assert not rows_can_leave(mixed)
