"""Batch 8 x accumulation 1 == batch 1 x accumulation 8 (fp32 gradients to 1e-6)."""

import torch

from oxrl.training.strategy import SingleDevice
from oxrl.loops.objectives import get_objective
from oxrl.loops.sl import run_micro_batches
from tests.integration.test_packing import _examples
from tests.conftest import make_tiny_llama


def _grads(micro_size: int, objective_name: str):
    model = make_tiny_llama()
    examples = _examples(1) + _examples(2)  # 8 examples of unequal lengths and masks
    strategy = SingleDevice(torch.device("cpu"), "no")
    sums, _ = run_micro_batches(get_objective(objective_name), model, examples, micro_size, strategy)
    return sums["loss"], {n: p.grad.clone() for n, p in model.named_parameters()}


def test_accumulation_is_exact_for_sft_and_cpt():
    for name in ("sft", "cpt"):
        loss_8x1, grads_8x1 = _grads(8, name)
        loss_1x8, grads_1x8 = _grads(1, name)
        loss_2x4, grads_2x4 = _grads(2, name)
        assert abs(loss_8x1 - loss_1x8) < 1e-6 and abs(loss_8x1 - loss_2x4) < 1e-6
        for key in grads_8x1:
            torch.testing.assert_close(grads_1x8[key], grads_8x1[key], atol=1e-6, rtol=0)
            torch.testing.assert_close(grads_2x4[key], grads_8x1[key], atol=1e-6, rtol=0)


def test_per_micro_batch_normalisation_would_differ():
    # Guard that the test above can fail: the common bug, each micro-batch divided by its own token count
    # and the micro-batch losses averaged, gives another loss on these unequal micro-batches.
    from oxrl.data.sampler import micro_batches
    from oxrl.data.types import pack

    model, objective = make_tiny_llama(), get_objective("sft")
    examples = _examples(1) + _examples(2)
    right, _ = run_micro_batches(objective, model, examples, 8, SingleDevice(torch.device("cpu"), "no"), train=False)
    with torch.no_grad():
        parts = [pack(mb) for mb in micro_batches(examples, 2)]
        wrong = sum(float(objective.compute(model, b, objective.count_units(b)).loss) for b in parts) / len(parts)
    assert abs(right["loss"] - wrong) > 1e-3, (right["loss"], wrong)
