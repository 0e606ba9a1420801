"""Every saved model folder holds a model card (README.md); `run.push_to_hub` uploads `final/` through huggingface_hub's
public API (a fake client here, through oxRL's own seam `oxrl.training.hub.hub_api`: no network)."""

import logging
from pathlib import Path

import pytest
import yaml

from oxrl.config.load import ConfigError, load_config
from oxrl.runner import run
from oxrl.training.model_card import paper_of
from tests.integration.test_runner import _write_config, tiny_model_dir  # noqa: F401 (a fixture)

TOKEN = "hf_fakeTokenThatMustNeverBeLogged123"


def _front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---", 2)[1])


class FakeHfApi:
    def __init__(self, fail: bool = False):
        self.calls, self.fail = [], fail

    def create_repo(self, repo_id, *, private, exist_ok, repo_type):
        self.calls.append(("create_repo", repo_id, {"private": private, "exist_ok": exist_ok}))
        return f"https://huggingface.co/{repo_id}"

    def upload_folder(self, *, repo_id, folder_path, repo_type, commit_message):
        if self.fail:
            raise OSError(f"401 Client Error: Unauthorized (Authorization: Bearer {TOKEN})\nmore detail")
        self.calls.append(("upload_folder", repo_id, {"folder": Path(folder_path),
                                                       "files": sorted(p.name for p in Path(folder_path).iterdir())}))


def test_a_tiny_sft_run_writes_a_model_card_in_final_and_every_checkpoint(tmp_path, tiny_model_dir):
    result = run(load_config(_write_config(tmp_path, tiny_model_dir)))
    card = (result.final_model_dir / "README.md").read_text()
    meta = _front_matter(card)
    assert meta["library_name"] == "transformers" and meta["tags"] == ["oxrl", "sft"]
    assert meta["datasets"] == ["chat.jsonl"] and "base_model" not in meta  # a local folder is no Hub id
    assert "trained with **sft**" in card and "## Data" in card and "chat.jsonl" in card
    # The results are the last metrics of the run, validation included (eval_every 2, 4 steps).
    assert f"| loss | {result.final_metrics['loss']:.6g} |" in card and "| val/loss |" in card
    assert "AutoModelForCausalLM.from_pretrained" in card
    config = yaml.safe_load(card.split("```yaml\n", 1)[1].split("```", 1)[0])
    assert config["algorithm"]["name"] == "sft" and config["train"]["max_steps"] == 4
    checkpoints = sorted((result.run_dir / "checkpoints").iterdir())
    assert checkpoints and all((c / "README.md").is_file() for c in checkpoints)
    assert "at step 4" in (checkpoints[-1] / "README.md").read_text()


def test_the_card_names_a_hub_base_model_and_the_papers_arxiv_id():
    from oxrl.training.model_card import model_card

    cfg = load_config(None, base={"model": {"name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"},
                                  "algorithm": {"name": "dpo"}, "data": {"train": [{"path": "trl-lib/ultrafeedback"}]}})
    card = model_card(cfg, {"loss": 0.5})
    meta = _front_matter(card)
    assert meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and meta["datasets"] == ["trl-lib/ultrafeedback"]
    assert "arXiv:2305.18290" in card and paper_of("grpo") == "2402.03300" and paper_of("sft") is None


def test_push_to_hub_uploads_final_to_a_private_repo_and_never_logs_the_token(tmp_path, tiny_model_dir, monkeypatch,
                                                                               oxrl_log):
    fake = FakeHfApi()
    tokens = []
    monkeypatch.setattr("oxrl.training.hub.hub_api", lambda token: tokens.append(token) or fake)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    oxrl_log.set_level(logging.INFO)
    cfg = load_config(_write_config(tmp_path, tiny_model_dir, run={"push_to_hub": True, "hub_model_id": "me/tiny-sft"},
                                    train={"max_steps": 1}, checkpoint={"every": None, "keep_last": 2}))
    result = run(cfg)
    assert tokens == [TOKEN]
    assert fake.calls[0] == ("create_repo", "me/tiny-sft", {"private": True, "exist_ok": True})
    assert fake.calls[1][0:2] == ("upload_folder", "me/tiny-sft") and fake.calls[1][2]["folder"] == result.final_model_dir
    assert {"README.md", "config.json", "model.safetensors"} <= set(fake.calls[1][2]["files"])
    assert 'from_pretrained("me/tiny-sft")' in (result.final_model_dir / "README.md").read_text()
    assert "pushed" in oxrl_log.text and TOKEN not in oxrl_log.text
    assert TOKEN not in (result.run_dir / "train.log").read_text()


def test_a_failed_push_keeps_final_and_says_so_in_one_line_without_the_token(tmp_path, tiny_model_dir, monkeypatch):
    from oxrl.training.hub import HubPushError

    monkeypatch.setattr("oxrl.training.hub.hub_api", lambda token: FakeHfApi(fail=True))
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    cfg = load_config(_write_config(tmp_path, tiny_model_dir, run={"push_to_hub": True, "hub_model_id": "me/tiny-sft"},
                                    train={"max_steps": 1}, checkpoint={"every": None, "keep_last": 2}))
    with pytest.raises(HubPushError) as raised:
        run(cfg)
    message = str(raised.value)
    assert "\n" not in message and "me/tiny-sft" in message and "401 Client Error" in message and TOKEN not in message
    final = tmp_path / "runs" / "tiny" / "final"
    assert f"kept in {final}" in message and (final / "model.safetensors").is_file() and (final / "README.md").is_file()


@pytest.mark.parametrize("settings, error", [
    ({"push_to_hub": True}, "run.push_to_hub: true needs run.hub_model_id"),
    ({"push_to_hub": True, "hub_model_id": "no-owner"}, "run.hub_model_id must be `owner/name`"),
    ({"push_to_hub": True, "hub_model_id": "a/b--c"}, "run.hub_model_id must be `owner/name`"),
    ({"hub_model_id": "me/x"}, "run.hub_model_id"),  # not read without push_to_hub
])
def test_bad_hub_settings_are_refused_before_anything_runs(settings, error):
    with pytest.raises(ConfigError, match=error.replace(".", r"\.").replace("`", ".")):
        load_config(None, base={"model": {"name_or_path": "m"}, "algorithm": {"name": "sft"}, "run": settings})


def test_push_to_hub_needs_the_final_model():
    with pytest.raises(ConfigError, match="checkpoint.save_final: false writes none"):
        load_config(None, base={"model": {"name_or_path": "m"}, "algorithm": {"name": "sft"},
                                "run": {"push_to_hub": True, "hub_model_id": "me/x"},
                                "checkpoint": {"save_final": False}})
