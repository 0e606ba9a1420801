"""The config summary a run prints at its start: its lines stay lines, and a `vla` run shows its `vla` section."""

from pathlib import Path

from oxrl.config.load import load_config
from oxrl.runner import config_summary

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_a_prompt_template_with_newlines_is_shown_escaped_on_one_line():
    template = "Q: {question}\n{instruction}\tA:"
    cfg = load_config(EXAMPLES / "grpo_smollm2_arithmetic.yaml")
    cfg = cfg.model_copy(update={"rl": cfg.rl.model_copy(update={"prompt_template": template})})
    summary = config_summary(cfg, Path("runs/r"))
    assert len(summary.splitlines()) == 2, summary
    assert r"rl.prompt_template=Q: {question}\n{instruction}\tA:," in summary


def test_a_vla_run_shows_its_whole_vla_section_once():
    cfg = load_config(EXAMPLES / "vla_grpo_reach.yaml")
    first, changed, vla = config_summary(cfg, Path("runs/r")).splitlines()
    assert first.startswith("run directory runs/r")
    assert "vla." not in changed and "train.max_steps=30" in changed
    # Set in the example (env, bins, max_chunks) and left at their defaults (binning, chunk 1, reward): all shown.
    assert vla.startswith("  vla: env=reach, ")
    for shown in ("bins=32", "binning=uniform", "chunk=1", "max_chunks=6", "reward=success", "state=true"):
        assert shown in vla.split(", ") or f"vla: {shown}" in vla, (shown, vla)
    assert vla.split(": ", 1)[1].count("=") == len(cfg.vla.model_dump())


def test_a_run_without_vla_has_no_vla_line():
    cfg = load_config(EXAMPLES / "sft_smollm2_chat.yaml")
    assert len(config_summary(cfg, Path("runs/r")).splitlines()) == 2
    assert "vla" not in config_summary(cfg, Path("runs/r"))
