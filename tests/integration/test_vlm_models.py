"""Vision-language models on the model side: they load with their processor, freeze_vision freezes exactly the
vision tower and projector, LoRA adapts only the language model, and saved folders load back and generate."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import (AutoModelForImageTextToText, AutoProcessor, Gemma3ForConditionalGeneration,
                          Idefics3ForConditionalGeneration, LlamaForCausalLM, Qwen2VLForConditionalGeneration)

from oxrl.config.schema import LoraConfig, ModelConfig
from oxrl.models.load import is_vision_language, load_config, load_model, load_processor, load_tokenizer
from oxrl.models.lora import lora_target_modules
from oxrl.models.save import save_hf_folder
from tests.conftest import save_tiny_model
from tests.vlm_fixtures import SAVERS, shape_image

CPU = torch.device("cpu")
CLASSES = {"qwen2_vl": Qwen2VLForConditionalGeneration, "idefics3": Idefics3ForConditionalGeneration,
           "gemma3": Gemma3ForConditionalGeneration}
# Listed by hand from the models' modules: Qwen2-VL's projector (`merger`) sits inside its vision tower.
VISION = {"qwen2_vl": ("model.visual.",), "idefics3": ("model.vision_model.", "model.connector."),
          "gemma3": ("model.vision_tower.", "model.multi_modal_projector.")}
LANGUAGE = {"qwen2_vl": "model.language_model.", "idefics3": "model.text_model.", "gemma3": "model.language_model."}
LINEAR_PER_LAYER = 7  # q, k, v, o, gate, up, down
PROMPT = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]}]


@pytest.fixture(scope="module", params=sorted(SAVERS))
def vlm(request, tmp_path_factory, smollm2_tokenizer):
    """(family, its saved folder)."""
    family = request.param
    return family, SAVERS[family](tmp_path_factory.mktemp(family), smollm2_tokenizer)


def image_prompt(processor) -> dict[str, torch.Tensor]:
    text = processor.apply_chat_template(PROMPT, add_generation_prompt=True)
    return processor(text=[text], images=[[shape_image("red")]], return_tensors="pt")


def test_vlm_loads_as_image_text_to_text_with_its_processor(vlm):
    family, folder = vlm
    cfg = ModelConfig(name_or_path=str(folder))
    assert is_vision_language(load_config(cfg))
    model = load_model(cfg, CPU)
    assert type(model) is CLASSES[family]  # AutoModelForCausalLM does not know these configs
    tokenizer = load_tokenizer(cfg)
    processor = load_processor(cfg, tokenizer)
    assert processor.tokenizer is tokenizer
    assert processor.image_processor is not None
    own = load_processor(cfg)  # loads load_tokenizer's tokenizer itself
    assert own.tokenizer.get_vocab() == tokenizer.get_vocab() and own.tokenizer.pad_token_id == tokenizer.pad_token_id


def test_chat_template_override_reaches_processor_and_tokenizer(vlm):
    _, folder = vlm
    template = "{% for message in messages %}[{{ message['role'] }}]{% endfor %}"
    cfg = ModelConfig(name_or_path=str(folder), chat_template=template)
    processor = load_processor(cfg)
    assert processor.chat_template == template and processor.tokenizer.chat_template == template


def test_text_model_has_no_processor_and_loads_as_before(tmp_path, smollm2_tokenizer):
    cfg = ModelConfig(name_or_path=str(save_tiny_model(tmp_path / "m", smollm2_tokenizer)))
    assert not is_vision_language(load_config(cfg))
    assert load_processor(cfg) is None
    model = load_model(cfg, CPU)
    assert type(model) is LlamaForCausalLM and all(p.requires_grad for p in model.parameters())
    with pytest.raises(ValueError, match="freeze_vision is set but .* is not a vision-language model"):
        load_model(ModelConfig(name_or_path=cfg.name_or_path, freeze_vision=True), CPU)


def test_freeze_vision_freezes_exactly_the_vision_tower_and_projector(vlm):
    family, folder = vlm
    model = load_model(ModelConfig(name_or_path=str(folder), freeze_vision=True), CPU)
    names = [name for name, _ in model.named_parameters()]
    vision = {name for name in names if name.startswith(VISION[family])}
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    assert vision and frozen == vision
    trainable = set(names) - frozen
    assert trainable == {name for name in names if name.startswith(LANGUAGE[family]) or name.startswith("lm_head.")}
    assert all(p.requires_grad for p in load_model(ModelConfig(name_or_path=str(folder)), CPU).parameters())


def test_lora_all_linear_adapts_only_the_language_model(vlm):
    family, folder = vlm
    model = load_model(ModelConfig(name_or_path=str(folder)), CPU, LoraConfig(enabled=True))
    adapted = {name.removeprefix("base_model.model.").removesuffix(".lora_A")
               for name, _ in model.named_modules() if name.endswith(".lora_A")}
    layers = model.get_base_model().config.get_text_config().num_hidden_layers
    assert len(adapted) == LINEAR_PER_LAYER * layers
    assert all(name.startswith(LANGUAGE[family]) for name in adapted)
    assert not any(name.startswith(VISION[family]) or name.startswith("lm_head") for name in adapted)
    assert {name for name, p in model.named_parameters() if p.requires_grad} == {
        name for name, _ in model.named_parameters() if ".lora_" in name}


def test_explicit_lora_targets_are_passed_through(vlm, tiny_llama):
    _, folder = vlm
    model = load_model(ModelConfig(name_or_path=str(folder)), CPU)
    assert lora_target_modules(model, ["q_proj", "v_proj"]) == ["q_proj", "v_proj"]
    assert lora_target_modules(tiny_llama, "all-linear") == "all-linear"  # a causal LM: peft's own rule


def _logits(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).logits


def _reload_and_compare(out, expected: torch.Tensor, batch) -> None:
    loaded = AutoModelForImageTextToText.from_pretrained(out).eval()
    processor = AutoProcessor.from_pretrained(out)
    again = image_prompt(processor)
    assert again.keys() == batch.keys() and all(torch.equal(again[key], batch[key]) for key in batch)
    torch.testing.assert_close(_logits(loaded, again), expected)
    with torch.no_grad():
        generated = loaded.generate(**again, max_new_tokens=4, do_sample=False)
    assert generated.shape == (1, again["input_ids"].shape[1] + 4)


def test_saved_vlm_loads_back_with_its_processor_and_generates(vlm, tmp_path):
    _, folder = vlm
    cfg = ModelConfig(name_or_path=str(folder), dtype="float32")
    model, processor = load_model(cfg, CPU).eval(), load_processor(cfg)
    batch = image_prompt(processor)
    save_hf_folder(model, processor, tmp_path / "out")
    _reload_and_compare(tmp_path / "out", _logits(model, batch), batch)


def test_lora_merged_save_of_a_vlm_loads_back(vlm, tmp_path):
    _, folder = vlm
    cfg = ModelConfig(name_or_path=str(folder), dtype="float32")
    model, processor = load_model(cfg, CPU, LoraConfig(enabled=True)).eval(), load_processor(cfg)
    torch.manual_seed(1)
    with torch.no_grad():  # lora_B starts at zero: give the adapters a delta for the merge to carry
        for name, parameter in model.named_parameters():
            if ".lora_B." in name:
                parameter.normal_(std=0.5)
    batch = image_prompt(processor)
    expected = _logits(model, batch)
    assert not torch.allclose(expected, _logits(AutoModelForImageTextToText.from_pretrained(folder).eval(), batch))
    save_hf_folder(model, processor, tmp_path / "merged", lora_save="merged")
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    _reload_and_compare(tmp_path / "merged", expected, batch)


def test_saving_a_vlm_with_only_its_tokenizer_warns(vlm, tmp_path, oxrl_log):
    _, folder = vlm
    cfg = ModelConfig(name_or_path=str(folder))
    save_hf_folder(load_model(cfg, CPU), load_tokenizer(cfg), tmp_path / "out")
    assert "not its processor" in oxrl_log.text


@pytest.mark.parametrize("family", ["paligemma", "mllama"])
def test_a_family_packed_rows_would_compute_wrongly_is_refused_before_its_weights_load(tmp_path, family):
    from transformers import AutoConfig

    from oxrl.models.load import UnsupportedModelError

    AutoConfig.for_model(family).save_pretrained(tmp_path)  # a config only: refused before any weights are read
    with pytest.raises(UnsupportedModelError, match=f"{family}: .*not supported yet"):
        load_model(ModelConfig(name_or_path=str(tmp_path)), CPU)


def test_a_size_not_counted_before_loading_is_said_in_one_line(vlm, oxrl_log):
    """Qwen2-VL's language model has no causal-LM class of its own to count on the meta device: the log says so in
    transformers' first line, not its list of every class it knows."""
    family, folder = vlm
    with oxrl_log.at_level(logging.INFO, logger="oxrl"):
        load_model(ModelConfig(name_or_path=str(folder)), CPU)
    said = [line for line in oxrl_log.text.splitlines() if "not counted before loading" in line]
    if family == "qwen2_vl":
        assert len(said) == 1 and "Unrecognized configuration class" in said[0], oxrl_log.text[-2000:]
        assert "Model type should be one of" not in oxrl_log.text
    else:  # counted
        assert not said
