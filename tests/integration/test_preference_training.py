"""Pairwise preference objectives and KTO on a tiny random model: one forward for both sides,
exact accumulation, and training that moves the margin the right way."""

import json

import pytest
import torch

from oxrl.algorithms.preference import DPOParams, PreferenceInput, dpo_loss
from oxrl.config.schema import Config, PreferenceConfig, rules_of
from oxrl.data.types import Example, Sequence, pack
from oxrl.training.strategy import SingleDevice
from oxrl.loops.objectives import get_objective
from oxrl.loops.preference_objectives import mismatched_pairs
from oxrl.loops.sl import run_micro_batches, train_offline
from oxrl.models.reference import FrozenModel
from tests.conftest import make_tiny_llama


def preference_pairs(n: int, seed: int = 0) -> list[Example]:
    """Random prompts; chosen ends `... 7 8`, rejected `... 9 10`, of unequal lengths."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = [1] + torch.randint(11, 120, (3 + i % 4,), generator=g).tolist()
        middle = torch.randint(11, 120, (1 + i % 3,), generator=g).tolist()
        chosen, rejected = middle + [7, 8, 2], middle[:1] + [9, 10, 2]
        out.append(Example([Sequence(prompt + chosen, [False] * len(prompt) + [True] * len(chosen)),
                            Sequence(prompt + rejected, [False] * len(prompt) + [True] * len(rejected))]))
    return out


def kto_examples(n: int, seed: int = 0) -> list[Example]:
    pairs = preference_pairs(n, seed)
    return [Example([pair.sequences[i % 2]], {"label": float(i % 2 == 0)}) for i, pair in enumerate(pairs)]


def preference_config(tmp_path, name: str = "dpo", preference: dict | None = None, **train) -> Config:
    return Config.model_validate({
        "run": {"name": name, "output_dir": str(tmp_path), "seed": 0},
        "model": {"name_or_path": "unused"},
        "data": {"train": [{"path": "unused"}]},
        "algorithm": {"name": name},
        # beta 0.5 where the objective reads it (a setting it does not read is a config error)
        "preference": {**({"beta": 0.5} if name in rules_of(PreferenceConfig, "beta")[0].by else {}), **(preference or {})},
        "train": {"global_batch_size": 4, "micro_batch_size_per_device": 2, "max_steps": 8,
                  "optim": {"lr": 1e-2, "schedule": "constant"}, **train},
        "logging": {"progress_bar": False, "plot": False},
    })


def _padded_sequence_logps(model, sequences: list[Sequence]) -> torch.Tensor:
    """Textbook route: a right-padded batch with an attention mask, log-softmax, gather. [N]."""
    longest = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), longest, dtype=torch.long)
    attn = torch.zeros_like(ids)
    mask = torch.zeros(len(sequences), longest, dtype=torch.bool)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)], attn[row, : len(seq)] = torch.tensor(seq.input_ids), 1
        mask[row, : len(seq)] = torch.tensor(seq.loss_mask)
    logp = torch.log_softmax(model(input_ids=ids, attention_mask=attn).logits[:, :-1].float(), -1)
    return (logp.gather(-1, ids[:, 1:, None])[..., 0] * mask[:, 1:]).sum(-1)


def test_packed_pair_in_one_forward_equals_two_separate_forwards():
    examples = preference_pairs(3)
    reference = FrozenModel(make_tiny_llama(seed=1))
    packed_model, separate_model = make_tiny_llama(), make_tiny_llama()
    batch = pack(examples)
    out = get_objective("dpo").compute(packed_model, batch, normaliser=3.0, reference=reference)
    out.loss.backward()

    chosen = _padded_sequence_logps(separate_model, [e.sequences[0] for e in examples])
    rejected = _padded_sequence_logps(separate_model, [e.sequences[1] for e in examples])
    ref = reference.sequence_logps(batch)
    tokens = torch.tensor([[float(sum(s.loss_mask)) for s in e.sequences] for e in examples])
    expected = dpo_loss(PreferenceInput(chosen, rejected, tokens[:, 0], tokens[:, 1], ref[0::2], ref[1::2]), DPOParams())
    (expected.loss / 3.0).backward()
    torch.testing.assert_close(out.loss, expected.loss / 3.0, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out.metrics["rewards/margins"], expected.metrics["rewards/margins"] / 3.0, atol=1e-6, rtol=1e-6)
    for (name, a), (_, b) in zip(separate_model.named_parameters(), packed_model.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("name", ["dpo", "ipo", "simpo", "orpo"])
def test_accumulation_is_exact(name):
    """Global batch 4 in one micro-batch == four micro-batches of 1 (loss, metrics, gradients)."""
    examples = preference_pairs(4)
    reference = FrozenModel(make_tiny_llama(seed=1))  # a different model, so the log-ratios are not 0

    def run(micro_size):
        model = make_tiny_llama()
        sums, _ = run_micro_batches(get_objective(name), model, examples, micro_size, SingleDevice(torch.device("cpu"), "no"), reference)
        return sums, {n: p.grad.clone() for n, p in model.named_parameters()}

    (sums_4x1, grads_4x1), (sums_1x4, grads_1x4) = run(4), run(1)
    assert sums_4x1.keys() == sums_1x4.keys() and "rewards/accuracy" in sums_4x1
    for key in sums_4x1:
        assert sums_1x4[key] == pytest.approx(sums_4x1[key], abs=1e-6, rel=1e-6), key
    for key in grads_4x1:
        # fp32 summation order differs; IPO gradients are ~30, so a relative tolerance too.
        torch.testing.assert_close(grads_1x4[key], grads_4x1[key], atol=1e-6, rtol=1e-5, msg=key)


def test_dpo_raises_the_margin_of_a_tiny_model(tmp_path):
    train_set = preference_pairs(8)
    model = make_tiny_llama()
    reference = FrozenModel(make_tiny_llama().eval().requires_grad_(False))  # same init as the policy
    cfg = preference_config(tmp_path, eval_every=8)
    result = train_offline(cfg, get_objective("dpo", cfg.preference), model, None, train_set, preference_pairs(4, seed=5),
                           SingleDevice(torch.device("cpu"), "no"), tmp_path / "run", reference)
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-6)  # policy == reference at step 1
    assert steps[-1]["rewards/margins"] > 1.0 and steps[-1]["rewards/accuracy"] == 1.0
    assert result.losses[-1] < 0.5 * result.losses[0]
    assert result.final_metrics["val/rewards/accuracy"] == 1.0  # held-out pairs ranked right


def test_kto_builds_mismatched_pairs_from_prompts_and_next_completions():
    examples = kto_examples(3)
    kl_batch = mismatched_pairs(pack(examples))
    assert kl_batch.num_sequences == 3
    ids = torch.split(kl_batch.input_ids[0], torch.bincount(kl_batch.seq_index).tolist())
    for i, seq in enumerate(ids):
        own, following = examples[i].sequences[0], examples[(i + 1) % 3].sequences[0]
        prompt_len, next_prompt_len = own.loss_mask.index(True), following.loss_mask.index(True)
        assert seq.tolist() == own.input_ids[:prompt_len] + following.input_ids[next_prompt_len:]
    assert mismatched_pairs(pack(examples[:1])) is None


def test_kto_trains(tmp_path):
    model = make_tiny_llama()
    reference = FrozenModel(make_tiny_llama().eval().requires_grad_(False))
    cfg = preference_config(tmp_path, "kto")
    result = train_offline(cfg, get_objective("kto", cfg.preference), model, None, kto_examples(8), [],
                           SingleDevice(torch.device("cpu"), "no"), tmp_path / "run", reference)
    last = result.final_metrics
    assert result.losses[-1] < result.losses[0]
    assert last["rewards/desirable"] / last["count/desirable"] > last["rewards/undesirable"] / last["count/undesirable"]
    assert last["kl"] >= 0.0 and last["count/desirable"] == pytest.approx(0.5)


def test_pairwise_objectives_reject_single_sequence_examples():
    with pytest.raises(ValueError, match=r"\[chosen, rejected\]"):
        get_objective("simpo").compute(make_tiny_llama(), pack(kto_examples(2)), normaliser=2.0)
