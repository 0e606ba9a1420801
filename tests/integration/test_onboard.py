"""`oxrl onboard`: every check on tiny local folders (no network). A good tiny Llama passes every check and
gets a parseable registry entry; templates that break the generation prompt, the prefix property or are
missing are reported as failures of exactly those checks, with the rest still run; the user's folder is
left byte-for-byte unchanged."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
import yaml

from oxrl.models.source import ModelNotFoundError
from oxrl.onboard import NotATextModelError, onboard, truncated_config
from oxrl.onboard_template import check_eos_and_pad
from oxrl.onboard_report import FAIL, PASS, WARN

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHATML_WITHOUT_GENERATION_PROMPT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)
# Renders only the last assistant turn (as templates that strip earlier turns' reasoning do, in the extreme).
CHATML_DROPPING_EARLIER_ANSWERS = (
    "{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LAYERS = 3  # more than the truncated copy's 2, so the truncation is real


def save_llama(folder: Path, tokenizer, chat_template: str | None = CHATML, weights: bool = True) -> Path:
    """A 3-layer random Llama sized to `tokenizer`, saved with it and `chat_template` (None: no template)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id)
    if weights:
        LlamaForCausalLM(config).save_pretrained(folder)
    else:
        config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if chat_template is None:
        (folder / "chat_template.jinja").unlink(missing_ok=True)
        settings = json.loads((folder / "tokenizer_config.json").read_text())
        settings.pop("chat_template", None)
        (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    else:
        (folder / "chat_template.jinja").write_text(chat_template)
    return folder


def folder_hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def statuses(report) -> dict[str, str]:
    return {check.name: check.status for check in report.checks}


def detail(report, name: str) -> str:
    return next(check.detail for check in report.checks if check.name == name)


@pytest.fixture(scope="module")
def good(tmp_path_factory, smollm2_tokenizer):
    """A good tiny Llama onboarded once (smoke runs included): (model folder, its hashes before, report)."""
    folder = save_llama(tmp_path_factory.mktemp("model") / "tiny-llama", smollm2_tokenizer)
    before = folder_hashes(folder)
    report = onboard(str(folder), tmp_path_factory.mktemp("onboard"))
    return folder, before, report


def test_a_good_model_passes_every_check(good):
    _, _, report = good
    results = statuses(report)
    assert [name for name, status in results.items() if status == FAIL] == []
    # The memory check depends on this machine (and warns where the full fine-tune does not fit).
    assert all(status == PASS for name, status in results.items() if name != "memory"), results
    assert {"chat_template", "assistant_mask", "generation_prompt", "prefix_stable", "eos_pad", "truncated_copy",
            "packed_attention", "lora_targets", "sft_smoke", "grpo_smoke"} <= set(results)
    assert "'<|im_end|>'" in detail(report, "assistant_mask")
    assert "oxrl_packed_sdpa" in detail(report, "packed_attention")


def test_the_report_and_registry_entry_are_written(good):
    from transformers import AutoModelForCausalLM

    folder, _, report = good
    text = (report.out_dir / "report.md").read_text()
    assert "| packed_attention | pass |" in text and "<\\|im_end\\|>" in text  # pipes escaped in the table
    (entry,) = yaml.safe_load((report.out_dir / "registry_entry.yaml").read_text())["models"]
    with torch.device("meta"):
        parameters = sum(p.numel() for p in AutoModelForCausalLM.from_config(report.config).parameters())
    assert entry["name"] == str(folder) and entry["family"] == "llama" and entry["modality"] == "text"
    assert entry["params_b"] == pytest.approx(parameters / 1e9, rel=1e-3) and entry["context"] == 256
    assert set(entry["lora_targets"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert entry["config"]["num_hidden_layers"] == LAYERS and entry["config"]["num_key_value_heads"] == 2
    assert entry["chat_template"] == "ChatML; end of turn <|im_end|>; prefix-stable"
    assert entry["onboarded"]["checks"] == statuses(report)
    # The entry joins the registry as it is, and a recipe for the folder reads it.
    from oxrl.models.hardware import parse_devices
    from oxrl.models.recipe import recipe
    from oxrl.models.registry import load_registry, read_registry_file

    (loaded,) = read_registry_file(report.out_dir / "registry_entry.yaml")
    assert loaded.name == str(folder) and loaded in load_registry([report.out_dir / "registry_entry.yaml"])
    cooked = recipe(str(folder), "chat", parse_devices("cpu"), registry_files=[report.out_dir / "registry_entry.yaml"])
    assert cooked.tree["model"]["name_or_path"] == str(folder) and "chat template: ChatML" in cooked.yaml()


def test_the_truncated_copy_holds_the_first_two_layers_weights(good):
    from safetensors.torch import load_file

    folder, _, report = good
    original, truncated = load_file(folder / "model.safetensors"), load_file(report.out_dir / "truncated" / "model.safetensors")
    assert json.loads((report.out_dir / "truncated" / "config.json").read_text())["num_hidden_layers"] == 2
    assert not any(key.startswith("model.layers.2.") for key in truncated)
    assert set(truncated) == {key for key in original if not key.startswith("model.layers.2.")}
    for key, tensor in truncated.items():
        torch.testing.assert_close(tensor, original[key], rtol=0, atol=0)


def test_onboarding_leaves_the_users_folder_unchanged(good):
    folder, before, _ = good
    assert folder_hashes(folder) == before


def test_a_template_without_generation_prompt_fails_that_check_and_the_rest_runs(tmp_path, smollm2_tokenizer):
    folder = save_llama(tmp_path / "model", smollm2_tokenizer, CHATML_WITHOUT_GENERATION_PROMPT)
    report = onboard(str(folder), tmp_path / "out", smoke=False)
    results = statuses(report)
    assert results["generation_prompt"] == FAIL and "no generation prompt" in detail(report, "generation_prompt")
    assert results["prefix_stable"] == PASS and results["packed_attention"] == PASS and results["lora_targets"] == PASS
    # Without a generation prompt the assistant header is trained too: flagged, and why.
    assert results["assistant_mask"] == WARN and "<|im_start|>assistant" in detail(report, "assistant_mask")
    (entry,) = yaml.safe_load((tmp_path / "out" / "registry_entry.yaml").read_text())["models"]
    assert "failed: generation_prompt" in entry["chat_template"]


def test_an_unstable_prefix_is_reported_with_where_it_breaks(tmp_path, smollm2_tokenizer):
    folder = save_llama(tmp_path / "model", smollm2_tokenizer, CHATML_DROPPING_EARLIER_ANSWERS)
    report = onboard(str(folder), tmp_path / "out")
    results = statuses(report)
    assert results["prefix_stable"] == FAIL
    assert "the first 3 messages is not a prefix" in detail(report, "prefix_stable")  # the first answer, dropped
    assert results["assistant_mask"] == FAIL and "not prefix-stable" in detail(report, "assistant_mask")
    assert results["generation_prompt"] == PASS  # only the earlier turns differ
    assert results["sft_smoke"] == PASS and results["grpo_smoke"] == PASS  # one-turn rows and prompts still train
    assert "| prefix_stable | fail |" in (tmp_path / "out" / "report.md").read_text()


def test_a_folder_without_chat_template_fails_the_template_checks(tmp_path, smollm2_tokenizer):
    folder = save_llama(tmp_path / "model", smollm2_tokenizer, chat_template=None)
    report = onboard(str(folder), tmp_path / "out")
    results = statuses(report)
    assert "model.chat_template" in detail(report, "chat_template")
    assert all(results[name] == FAIL for name in ("chat_template", "assistant_mask", "generation_prompt", "prefix_stable"))
    assert results["packed_attention"] == PASS  # the model checks still run
    # A one-step run that raises is a failed check with its error's first line, not a crash.
    assert results["sft_smoke"] == FAIL and "chat template" in detail(report, "sft_smoke")
    (entry,) = yaml.safe_load((tmp_path / "out" / "registry_entry.yaml").read_text())["models"]
    assert entry["chat_template"].startswith("none")


def test_a_config_only_folder_gets_a_random_truncated_copy(tmp_path, smollm2_tokenizer):
    folder = save_llama(tmp_path / "model", smollm2_tokenizer, weights=False)
    report = onboard(str(folder), tmp_path / "out", smoke=False)
    assert statuses(report)["truncated_copy"] == PASS and "RANDOM weights" in detail(report, "truncated_copy")
    assert statuses(report)["packed_attention"] == PASS


def test_a_missing_model_raises_model_not_found(tmp_path):
    with pytest.raises(ModelNotFoundError, match="not found"):
        onboard(str(tmp_path / "no-such-model"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_vision_language_model_is_refused_in_one_line(tmp_path):
    from transformers import LlavaConfig

    LlavaConfig().save_pretrained(tmp_path / "vlm")
    with pytest.raises(NotATextModelError, match="oxRL trains text models only so far"):
        onboard(str(tmp_path / "vlm"), tmp_path / "out")


def test_per_layer_config_lists_are_cut_with_the_layers():
    from transformers import Qwen2Config

    config = Qwen2Config(num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2)
    short = truncated_config(config)
    assert short.num_hidden_layers == 2 and short.layer_types == ["sliding_attention", "full_attention"]
    assert config.num_hidden_layers == 4 and len(config.layer_types) == 4  # the original is untouched


def test_an_end_of_turn_that_is_not_eos_must_be_a_generation_stop_token(smollm2_tokenizer):
    eos = smollm2_tokenizer.eos_token  # <|im_end|>
    assert check_eos_and_pad(smollm2_tokenizer, eos, set()).status == PASS
    other = "<|im_start|>"  # stands in for a template whose turns end with a token other than eos
    other_id = smollm2_tokenizer.convert_tokens_to_ids(other)
    unstoppable = check_eos_and_pad(smollm2_tokenizer, other, {smollm2_tokenizer.eos_token_id})
    assert unstoppable.status == FAIL and "would not stop at the end of a turn" in unstoppable.detail
    assert check_eos_and_pad(smollm2_tokenizer, other, {smollm2_tokenizer.eos_token_id, other_id}).status == PASS


def test_the_default_output_folder_is_named_after_the_model(tmp_path):
    from oxrl.onboard import model_slug

    (tmp_path / "SmolLM2-1.7B").mkdir()
    assert model_slug(str(tmp_path / "SmolLM2-1.7B")) == "SmolLM2-1.7B"
    assert model_slug("Qwen/Qwen3-0.6B") == "Qwen--Qwen3-0.6B"


def test_a_smoke_runs_damaged_metrics_line_fails_that_check_naming_the_file_and_line(tmp_path, monkeypatch):
    """The smoke checks read the loss through oxrl/logging/metrics.py: a damaged row is its one-line error, reported
    as the check's failure; a torn last line (a write cut short) is dropped, as a resume drops it."""
    import oxrl.runner
    from oxrl.logging.metrics import MetricsFileError
    from oxrl.onboard import last_logged_loss, smoke_grpo
    from oxrl.runner import RunResult

    run_dir = tmp_path / "runs" / "grpo"  # where smoke_grpo's run writes
    run_dir.mkdir(parents=True)
    metrics = run_dir / "metrics.jsonl"
    metrics.write_text('{"step": 1, "loss": 2.5}\n{"step": "2", "loss": 1.5}\n')
    monkeypatch.setattr(oxrl.runner, "run", lambda cfg: RunResult(run_dir, None, [], {}))  # (the run, done)
    result = smoke_grpo(tmp_path / "model", tmp_path, False)
    assert result.status == FAIL, result
    assert f'{metrics}, line 2: not a metrics row oxRL writes (its step is "2", not an integer)' in result.detail, \
        result.detail
    with pytest.raises(MetricsFileError, match="line 2"):
        last_logged_loss(run_dir)
    metrics.write_text('{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')
    assert last_logged_loss(run_dir) == 1.5
