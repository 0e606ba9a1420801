"""Knowledge distillation: the packed loss is the per-sequence KL over trained tokens with the
logits shifted like the log-probs, and a student trained on it moves toward its teacher."""

import pytest
import torch

from oxrl.config.schema import ModelConfig, PreferenceConfig
from oxrl.data.types import Example, Sequence, pack
from oxrl.training.strategy import SingleDevice
from oxrl.loops.objectives import get_objective
from oxrl.loops.sl import run_micro_batches, train_offline
from oxrl.models.reference import FrozenModel, load_teacher
from tests.conftest import make_tiny_llama
from tests.integration.test_preference_training import preference_config
from tests.integration.test_tiny_training import copy_task


def _teacher():
    return FrozenModel(make_tiny_llama(seed=1).eval().requires_grad_(False))


def _forward_kl_per_sequence(student, teacher, examples: list[Example]) -> torch.Tensor:
    """Reference: each sequence alone; logits at t-1 predict token t; KL(p_T || p_S) summed over trained t."""
    total = torch.zeros(())
    for example in examples:
        seq = example.sequences[0]
        ids = torch.tensor([seq.input_ids])
        log_s = torch.log_softmax(student(input_ids=ids).logits[0, :-1], -1)
        with torch.no_grad():
            log_t = torch.log_softmax(teacher(input_ids=ids).logits[0, :-1], -1)
        trained = torch.tensor(seq.loss_mask[1:])
        total = total + (log_t.exp() * (log_t - log_s)).sum(-1)[trained].sum()
    return total


def test_packed_kd_loss_equals_the_per_sequence_kl():
    examples = copy_task(3)
    teacher, student = _teacher(), make_tiny_llama()
    batch = pack(examples)
    out = get_objective("kd_forward").compute(student, batch, normaliser=float(batch.num_loss_tokens), reference=teacher)
    expected = _forward_kl_per_sequence(make_tiny_llama(), teacher.model, examples) / batch.num_loss_tokens
    torch.testing.assert_close(out.loss, expected, atol=1e-6, rtol=1e-5)
    assert get_objective("kd_forward").count_units(batch) == 12  # trained tokens, not sequences


def test_kd_accumulation_is_exact():
    examples, teacher = copy_task(4), _teacher()

    def grads(micro_size):
        model = make_tiny_llama()
        run_micro_batches(get_objective("kd_jsd"), model, examples, micro_size, SingleDevice(torch.device("cpu"), "no"), teacher)
        return {n: p.grad for n, p in model.named_parameters()}

    whole, split = grads(4), grads(1)
    for key in whole:
        torch.testing.assert_close(split[key], whole[key], atol=1e-6, rtol=1e-5, msg=key)


@pytest.mark.parametrize("name", ["kd_forward", "kd_reverse"])
def test_student_moves_toward_the_teacher(tmp_path, name):
    cfg = preference_config(tmp_path, name, {"teacher": "unused"}, max_steps=6, optim={"lr": 3e-3, "schedule": "constant"})
    teacher = _teacher()
    result = train_offline(cfg, get_objective(name, cfg.preference), make_tiny_llama(), None, copy_task(8), [],
                           SingleDevice(torch.device("cpu"), "no"), tmp_path / "run", teacher)
    assert result.losses[-1] < 0.8 * result.losses[0]
    assert result.final_metrics["distill/divergence"] == pytest.approx(result.losses[-1], rel=1e-6)


def test_kd_needs_a_teacher_path_and_the_same_vocabulary(tmp_path):
    with pytest.raises(ValueError, match="preference.teacher"):
        preference_config(tmp_path, "kd_forward")
    make_tiny_llama(vocab_size=64).save_pretrained(tmp_path / "small_vocab")
    with pytest.raises(ValueError, match="same tokenizer and vocabulary"):
        load_teacher(str(tmp_path / "small_vocab"), ModelConfig(name_or_path="student"), make_tiny_llama(), torch.device("cpu"))


def test_temperature_reaches_the_loss():
    examples, teacher = [Example([Sequence([1, 5, 9, 4], [False, True, True, True])])], _teacher()
    batch, student = pack(examples), make_tiny_llama()
    cold = get_objective("kd_forward").compute(student, batch, 3.0, teacher).loss
    warm = get_objective("kd_forward", PreferenceConfig(temperature=4.0)).compute(student, batch, 3.0, teacher).loss
    assert warm < cold  # softer distributions are closer
