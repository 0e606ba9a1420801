"""Packed (padding-free) == padded: logits, loss and gradients."""

import torch

from oxrl.models.logprobs import forward_logits, selected_logprobs, token_logprobs
from oxrl.data.types import Example, Sequence, pack
from oxrl.loops.objectives import get_objective
from tests.conftest import make_tiny_llama


def _examples(seed: int = 1) -> list[Example]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for length in (5, 9, 3, 7):
        ids = torch.randint(3, 128, (length,), generator=g).tolist()
        mask = [False] + [i >= length // 2 for i in range(1, length)]
        out.append(Example([Sequence(ids, mask)]))
    return out


def _padded_reference(model, examples):
    """Plain right-padded batch with an attention mask: the textbook way."""
    longest = max(e.num_tokens for e in examples)
    ids = torch.zeros(len(examples), longest, dtype=torch.long)
    attn = torch.zeros(len(examples), longest, dtype=torch.long)
    mask = torch.zeros(len(examples), longest, dtype=torch.bool)
    for row, e in enumerate(examples):
        seq = e.sequences[0]
        ids[row, : len(seq)] = torch.tensor(seq.input_ids)
        attn[row, : len(seq)] = 1
        mask[row, : len(seq)] = torch.tensor(seq.loss_mask)
    logits = model(input_ids=ids, attention_mask=attn).logits
    logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    trained = mask[:, 1:]
    loss = -(logp * trained).sum() / trained.sum()
    return logits, attn, loss


def test_packed_logits_equal_padded_logits():
    model = make_tiny_llama().eval()
    examples = _examples()
    padded_logits, attn, _ = _padded_reference(model, examples)
    packed_logits = forward_logits(model, pack(examples))
    pieces = [padded_logits[row, : int(attn[row].sum())] for row in range(len(examples))]
    torch.testing.assert_close(packed_logits, torch.cat(pieces), atol=1e-5, rtol=1e-5)


def test_packed_loss_and_gradients_equal_padded():
    examples = _examples()
    padded_model = make_tiny_llama()
    packed_model = make_tiny_llama()
    _, _, padded_loss = _padded_reference(padded_model, examples)
    padded_loss.backward()

    batch = pack(examples)
    objective = get_objective("sft")
    out = objective.compute(packed_model, batch, normaliser=objective.count_units(batch))
    out.loss.backward()
    torch.testing.assert_close(out.loss, padded_loss, atol=1e-6, rtol=1e-6)
    for (name, a), (_, b) in zip(padded_model.named_parameters(), packed_model.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_chunked_logprobs_equal_log_softmax():
    logits = torch.randn(11, 50)
    ids = torch.randint(0, 50, (11,))
    chunked = torch.cat([torch.zeros(1), selected_logprobs(logits[:-1], ids[1:], chunk_size=3)])
    direct = torch.log_softmax(logits[:-1], -1).gather(-1, ids[1:, None])[:, 0]
    assert chunked[0] == 0
    torch.testing.assert_close(chunked[1:], direct)


def test_sequences_do_not_attend_across_the_pack():
    # Changing the first sequence must not change the second sequence's log-probs.
    model = make_tiny_llama().eval()
    a, b = _examples()[:2]
    other = Example([Sequence([7] * a.num_tokens, a.sequences[0].loss_mask)])
    # Index 0 of `b` is the (never trained) prediction across the boundary; skip it.
    first = token_logprobs(model, pack([a, b]))[a.num_tokens + 1 :]
    second = token_logprobs(model, pack([other, b]))[other.num_tokens + 1 :]
    torch.testing.assert_close(first, second, atol=1e-6, rtol=1e-6)


def test_logprobs_at_selected_positions_equal_full_logits():
    # token_logprobs projects only the target positions through the lm_head; same values.
    from oxrl.models.logprobs import token_logprobs_from_logits

    model = make_tiny_llama().eval()
    batch = pack(_examples())
    full = token_logprobs_from_logits(forward_logits(model, batch), batch.input_ids[0])
    selected = token_logprobs(model, batch)
    mask = batch.loss_mask[0]
    torch.testing.assert_close(selected[mask], full[mask], atol=1e-6, rtol=1e-6)
    assert torch.all(selected[~mask] == 0)
