"""`oxrl onboard`'s report: its checks' results, as Markdown and as a registry entry (the shape the model registry
reads). The checks themselves are in oxrl/onboard.py."""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

logger = logging.getLogger(__name__)

PASS, WARN, FAIL = "pass", "warn", "fail"

# config.json keys that describe a model's shape, copied into the registry entry when present.
SHAPE_KEYS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings", "max_position_embeddings",
              "num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")
TEMPLATE_CHECKS = ("chat_template", "assistant_mask", "generation_prompt", "prefix_stable", "eos_pad")
# A marker string of each common template family -> its name in the registry's one-line summary.
TEMPLATE_STYLES = (("<|im_start|>", "ChatML"), ("<|start_header_id|>", "Llama 3"), ("<start_of_turn>", "Gemma"),
                   ("[INST]", "Mistral [INST]"))


@dataclass
class CheckResult:
    name: str
    status: str  # PASS, WARN or FAIL
    detail: str  # one line: why
    facts: dict = field(default_factory=dict)  # what the report reuses, e.g. the LoRA targets


@dataclass
class OnboardReport:
    model: str
    out_dir: Path
    config: Any  # the transformers config of the full model
    parameters: int
    checks: list[CheckResult] = field(default_factory=list)
    chat_template: str | None = None
    end_of_turn: str | None = None

    @property
    def failed(self) -> list[CheckResult]:
        return [check for check in self.checks if check.status == FAIL]

    def fact(self, key: str, default=None):
        return next((check.facts[key] for check in self.checks if key in check.facts), default)


def format_report(report: OnboardReport) -> str:
    """The checks as a Markdown table, then the memory estimate's lines."""
    verdict = (f"{len(report.failed)} check(s) failed: {', '.join(c.name for c in report.failed)}" if report.failed
               else "no check failed")
    lines = [f"# oxrl onboard: {report.model}", "",
             f"{report.config.model_type}, {report.parameters / 1e9:.3f}B parameters; {verdict}.", "",
             "| check | result | why |", "|---|---|---|"]
    lines += [f"| {c.name} | {c.status} | {table_cell(c.detail)} |" for c in report.checks]
    memory = report.fact("memory", [])
    if memory:
        lines += ["", "## Memory estimate", "", "```", *memory, "```"]
    lines += ["", f"Registry entry: `{report.out_dir / 'registry_entry.yaml'}`", ""]
    return "\n".join(lines)


def table_cell(text: str) -> str:
    return text.replace("|", "\\|")  # a bare | would end the Markdown cell (e.g. in <|im_end|>)


def chat_template_summary(report: OnboardReport) -> str:
    """One line: the template family, its end-of-turn token, and prefix stability or what failed."""
    template = report.chat_template
    if not template:
        return "none: the tokenizer has no chat template"
    style = next((name for marker, name in TEMPLATE_STYLES if marker in template), "custom")
    statuses = {c.name: c for c in report.checks if c.name in TEMPLATE_CHECKS}
    failed = [name for name, check in statuses.items() if check.status == FAIL]
    stability = "prefix-stable" if statuses.get("prefix_stable") and statuses["prefix_stable"].status != FAIL \
        else "NOT prefix-stable"
    parts = [style, f"end of turn {report.end_of_turn}", stability] + ([f"failed: {', '.join(failed)}"] if failed else [])
    return "; ".join(parts)


def registry_entry(report: OnboardReport) -> dict:
    from oxrl import __version__

    config = report.config.to_dict()
    return {"models": [{
        "name": report.model,
        "family": report.config.model_type,
        "params_b": float(f"{report.parameters / 1e9:.4g}"),  # 4 significant digits: a tiny model is not 0
        "context": config.get("max_position_embeddings"),
        "modality": "text",
        "chat_template": chat_template_summary(report),
        "lora_targets": report.fact("lora_targets", []),
        "config": {key: config[key] for key in SHAPE_KEYS if config.get(key) is not None},
        "onboarded": {"date": datetime.date.today().isoformat(), "oxrl": __version__,
                      "checks": {c.name: c.status for c in report.checks}},
    }]}


def write_report(report: OnboardReport) -> None:
    """`report.md` and `registry_entry.yaml` in the report's out_dir."""
    (report.out_dir / "report.md").write_text(format_report(report))
    entry = registry_entry(report)
    (report.out_dir / "registry_entry.yaml").write_text(yaml.safe_dump(entry, sort_keys=False, allow_unicode=True))
    logger.info("onboard report written to %s", report.out_dir / "report.md")
