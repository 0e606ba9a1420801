"""benchmarks/vla_simulators.py's first-action diagnostic, against bins counted by hand, and its `--digits smollm2`
policy (tests/vlm_fixtures.py's `pretrained_digits`), and its refusal of GRPO settings no run could take."""

import sys

import numpy as np
import pytest

from benchmarks.vla_simulators import bins_off, main
from oxrl.vla.action_tokens import ActionTokenizer


def test_the_first_action_is_scored_in_bins_against_the_median_and_the_agents_own_position():
    tokens = ActionTokenizer.uniform(np.zeros(2), np.full(2, 80.0), bins=8, first_id=100, chunk=2)  # 10 px a bin
    expert = np.array([[1, 2], [3, 2], [5, 6]])  # the expert's first action's bins; its median [3, 2] is off 2, 0, 6
    predicted = np.array([[1, 3], [3, 2], [7, 6]])  # off by 1, 0 and 2 bins in all: 3 / 6 entries
    # the agent at (15, 25), (31, 29), (65, 20) px: bins (1, 2), (3, 2), (6, 2), off by 0, 0 and 1 + 4: 5 / 6
    states = np.array([[15.0, 25.0, 0.5], [31.0, 29.0, 0.5], [65.0, 20.0, 0.5]])
    assert bins_off(tokens, predicted, expert, states) == {"model": 0.5, "median": 1.333, "agent_position": 0.833}
    assert bins_off(tokens, expert, expert) == {"model": 0.0, "median": 1.333}  # no states: no agent-position baseline


def test_pretrained_digits_gives_the_random_policys_digit_tokens_smollm2s_geometry_and_nothing_else(smollm2_tokenizer):
    import torch

    from tests.conftest import bundled_gguf
    from tests.vlm_fixtures import gguf_embeddings, tiny_qwen2_vl

    gguf = bundled_gguf()
    random, _ = tiny_qwen2_vl(smollm2_tokenizer, width="vllm", seed=3)
    transplanted, _ = tiny_qwen2_vl(smollm2_tokenizer, width="vllm", seed=3, digits=gguf)
    before, after = random.get_input_embeddings().weight.detach(), transplanted.get_input_embeddings().weight.detach()
    digits = [smollm2_tokenizer.convert_tokens_to_ids(str(digit)) for digit in range(10)]
    assert (before != after).any(dim=1).nonzero().flatten().tolist() == digits  # those 10 rows, no other
    ratio = torch.pdist(after[digits].double()) / torch.pdist(gguf_embeddings(gguf, digits))
    assert torch.allclose(ratio, ratio.mean(), rtol=1e-4)  # every distance scaled alike: the same geometry
    assert torch.pdist(after[digits]).mean() == pytest.approx(torch.pdist(before[digits]).mean().item(), rel=1e-5)
    assert torch.allclose(after[digits].mean(0), before[digits].mean(0), atol=1e-6)  # around the random rows' mean
    # what the transplant is for: SmolLM2's digit embeddings are ordered by value, the random ones are not
    def first_component_follows_the_values(rows: torch.Tensor) -> float:
        centred = rows.double() - rows.double().mean(0)
        component = centred @ torch.linalg.svd(centred, full_matrices=False).Vh[0]
        return abs(torch.corrcoef(torch.stack([component, torch.arange(10.0, dtype=torch.float64)]))[0, 1].item())

    assert first_component_follows_the_values(after[digits]) > 0.9
    assert first_component_follows_the_values(before[digits]) < 0.5


@pytest.mark.parametrize("bad", [["--episodes-per-state", "1"], ["--prompts-per-step", "0"], ["--validate-every", "0"]])
def test_grpo_settings_no_run_could_take_are_refused_before_any_demonstration_is_recorded(bad, tmp_path, monkeypatch,
                                                                                           capsys):
    monkeypatch.setattr(sys, "argv", ["vla_simulators.py", "panda-reach", "--out", str(tmp_path / "vla"), *bad])
    with pytest.raises(SystemExit):
        main()
    assert "--episodes-per-state >= 2" in capsys.readouterr().err and not (tmp_path / "vla").exists()
