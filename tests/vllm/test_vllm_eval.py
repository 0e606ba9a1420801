"""`oxrl eval --engine vllm` reports what the built-in engine reports: the same greedy completions and metrics."""

import json

import pytest

from oxrl.evaluation.run import EvalRequest, evaluate_models
from oxrl.rollout.build import VLLM_INSTALL_HINT
from tests.vllm.conftest import make_model, number_tokenizer

pytest.importorskip("vllm", reason=f"vLLM is not installed: {VLLM_INSTALL_HINT}")


# The `rl.rollout.vllm` section is read by the vLLM engine only (the `hf` run would refuse it).
VLLM_OPTIONS = {"vllm": ["rl.rollout.vllm.max_model_len=256", "rl.rollout.vllm.kv_cache_gib=0.25"], "hf": []}


def test_vllm_and_hf_evaluations_agree(tmp_path):
    model_dir = tmp_path / "model"
    make_model(3).save_pretrained(model_dir)
    number_tokenizer().save_pretrained(model_dir)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{4 + i} {7 + i} {9 + i}"}) + "\n" for i in range(6)))
    results = {}
    for engine in ("vllm", "hf"):
        out = tmp_path / f"{engine}.jsonl"
        result = evaluate_models(EvalRequest(str(model_dir), data=[str(data)], rewards=["tests.integration.test_rl_loop:share_of_sevens"],
                                             n=4, max_new_tokens=6, engine=engine, out=str(out),
                                             overrides=["train.mixed_precision=no", *VLLM_OPTIONS[engine]]))  # fp32
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        results[engine] = (result.reports[0].metrics, [r["completion"] for r in rows if r["pass"] == "greedy"])
        assert len(rows) == 6 + 6 * 4 and f"engine {engine}" in result.description
    (vllm_metrics, vllm_greedy), (hf_metrics, hf_greedy) = results["vllm"], results["hf"]
    assert vllm_greedy == hf_greedy
    greedy = [key for key in hf_metrics if key.startswith("greedy/")]
    assert {key: vllm_metrics[key] for key in greedy} == pytest.approx({key: hf_metrics[key] for key in greedy})
    assert 0.0 <= vllm_metrics["sampled/pass@4"] <= 1.0  # sampled with vLLM's own RNG: not comparable sample by sample
