"""`train.mixed_precision`: the `auto` rule, native bf16 detection on CPUs, and what bf16 autocast
does to a short run's loss curve and to the rollout engine's log-probs next to the trainer's."""

import pytest
import torch

from oxrl.loops.objectives import get_objective
from oxrl.loops.sl import run_micro_batches
from oxrl.rollout.base import SamplingParams
from oxrl.rollout.hf import HFEngine
from oxrl.models import precision
from oxrl.models.precision import autocast_for, cpu_has_native_bf16, describe, uses_bf16
from oxrl.training.strategy import SingleDevice
from tests.conftest import make_tiny_llama
from tests.integration.test_rollout_hf import TinyTokenizer
from tests.integration.test_packing import _examples

CPU = torch.device("cpu")


@pytest.mark.parametrize("text, native", [
    ("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_tile\n", True),
    ("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw\n", False),  # AVX-512 without its BF16 extension
    ("processor\t: 0\nflags\t\t: fpu amx_bf16 amx_tile\n", True),
    ("processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n", True),  # Arm
    ("processor\t: 0\nFeatures\t: fp asimd crc32\n", False),
])
def test_native_bf16_is_read_from_the_cpu_flags(tmp_path, text, native):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(text)
    assert cpu_has_native_bf16(str(cpuinfo)) is native


def test_no_cpuinfo_means_no_native_bf16(tmp_path):
    assert cpu_has_native_bf16(str(tmp_path / "absent")) is False


@pytest.mark.parametrize("native", [True, False], ids=["native_bf16_cpu", "other_cpu"])
def test_the_auto_rule(monkeypatch, native):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native)
    assert uses_bf16("bf16", "cpu") and uses_bf16("auto", "cuda")
    assert not uses_bf16("no", "cuda") and not uses_bf16("no", "cpu")
    assert uses_bf16("auto", "cpu") is native
    assert not uses_bf16("auto", "mps")
    assert describe("no", "cuda") == "train.mixed_precision=no: fp32 (set)"
    assert describe("auto", "cuda") == "train.mixed_precision=auto: bf16 autocast, fp32 master weights (a GPU)"
    if native:
        assert describe("auto", "cpu") == ("train.mixed_precision=auto: bf16 autocast, fp32 master weights "
                                           "(auto: this CPU has native bf16)")
        assert describe("no", "cpu").endswith("train.mixed_precision=bf16 computes about 1.6x faster")
    else:
        assert describe("auto", "cpu") == "train.mixed_precision=auto: fp32 (auto: this CPU has no native bf16)"
    assert SingleDevice(CPU, "bf16").use_bf16_autocast and not SingleDevice(CPU, "no").use_bf16_autocast
    assert SingleDevice(CPU, "auto").use_bf16_autocast is native


def _sft_losses(mixed_precision: str, steps: int = 12) -> tuple[list[float], torch.nn.Module]:
    model = make_tiny_llama(seed=0)
    strategy = SingleDevice(CPU, mixed_precision, max_grad_norm=1.0)
    strategy.prepare(model, torch.optim.AdamW(model.parameters(), lr=3e-3))
    examples = _examples(1) + _examples(2)
    losses = []
    for _ in range(steps):
        sums, _ = run_micro_batches(get_objective("sft"), model, examples, 4, strategy)
        strategy.step()
        losses.append(sums["loss"])
    return losses, model


def test_a_short_bf16_run_follows_the_fp32_loss_curve_with_fp32_master_weights():
    """12 SFT steps of a tiny Llama: bf16 autocast's losses stay within 2% of fp32's at every step (measured:
    at most 0.03% on a 2-core AVX512-BF16 CPU), the weights and optimizer state stay fp32, and the loss falls as far."""
    fp32, _ = _sft_losses("no")
    bf16, model = _sft_losses("bf16")
    assert bf16 != fp32  # the bf16 run really computed in bf16
    for step, (low, full) in enumerate(zip(bf16, fp32)):
        assert abs(low - full) <= 0.02 * full, (step, low, full)
    assert bf16[-1] < 0.8 * bf16[0] and fp32[-1] < 0.8 * fp32[0]
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_the_hf_engine_samples_in_the_trainers_precision():
    """Under bf16 autocast the engine's log-probs are of the numbers a bf16 trainer recomputes: their gap is a
    fraction of the gap to an fp32 engine's (which reads the same weights in another precision). Measured on a
    2-core AVX512-BF16 CPU: 0 per token for the bf16 engine, 3.6e-4 for an fp32 one."""
    from oxrl.models.logprobs import token_logprobs
    from oxrl.data.types import Example, Sequence, pack

    model = make_tiny_llama(seed=1).eval()
    prompts = [[1, 5, 9, 13], [1, 7, 2]]
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=8)

    def gap(engine_precision: str) -> float:
        torch.manual_seed(0)
        engine = HFEngine(model, TinyTokenizer(), autocast=autocast_for(engine_precision, "cpu"))
        completions = engine.generate(prompts, params)
        total, count = 0.0, 0
        for c in completions:
            ids = c.prompt_ids + c.completion_ids
            mask = [False] * len(c.prompt_ids) + [True] * len(c.completion_ids)
            batch = pack([Example([Sequence(ids, mask)])])
            with torch.no_grad(), autocast_for("bf16", "cpu")():  # the bf16 trainer
                trainer = token_logprobs(model, batch)[batch.loss_mask[0]]
            total += float((trainer - torch.tensor(c.logprobs)).abs().sum())
            count += len(c.logprobs)
        return total / count

    same, other = gap("bf16"), gap("no")
    assert same < 0.5 * other, (same, other)


def test_a_bare_no_in_yaml_or_an_override_means_fp32(tmp_path):
    """YAML reads `no` as false; `mixed_precision: no` must still mean `no`, not a type error."""
    from oxrl.config.load import load_config

    path = tmp_path / "cfg.yaml"
    path.write_text("model: {name_or_path: m}\nalgorithm: {name: sft}\ndata: {train: [{path: x.jsonl}]}\n"
                    "train: {mixed_precision: no}\n")
    assert load_config(path).train.mixed_precision == "no"
    assert load_config(path, ["train.mixed_precision=bf16"]).train.mixed_precision == "bf16"
    assert load_config(path, ["train.mixed_precision=no"]).train.mixed_precision == "no"
