"""`oxrl onboard MODEL`: a read-only check of a model before anyone spends GPU hours on it.

Each check is a small function returning a `CheckResult` (pass / warn / fail and a one-line reason):

* chat template (oxrl/onboard_template.py): the assistant mask, the generation prompt, prefix
  stability, eos / pad / end of turn.
* a 2-layer truncated copy (the real first two layers' weights), saved under `out_dir/truncated/`, on
  which: packed rows == each sequence alone under eager attention; LoRA's default targets; a one-step SFT
  and a one-step GRPO run through the real runner.
* a memory estimate of full fine-tuning and LoRA against this machine's memory.

Nothing of the user's is written or deleted: everything goes under `out_dir`. The report and the registry
entry are rendered by `oxrl.onboard_report`.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import torch

from oxrl.config.schema import LoraConfig, ModelConfig
from oxrl.models.load import load_model, load_tokenizer
from oxrl.models.source import ModelSource, from_pretrained_or_explain, resolve_source
from oxrl.onboard_report import FAIL, PASS, WARN, CheckResult, OnboardReport, write_report
from oxrl.onboard_template import (CONVERSATION, check_assistant_mask, check_eos_and_pad,
                                          check_generation_prompt, check_has_chat_template, check_prefix_stable,
                                          conversation_for, end_of_turn_token)

logger = logging.getLogger(__name__)

TRUNCATED_LAYERS = 2
PACKED_TOLERANCE = 1e-4


class NotATextModelError(ValueError):
    """The model is not a text-only causal LM (e.g. a vision-language model): oxRL cannot train it yet."""


def onboard(model: str, out_dir: Path, trust_remote_code: bool = False, smoke: bool = True) -> OnboardReport:
    """Run every check on `model` (hub id, local folder, .gguf file or bundled alias); write
    `out_dir/report.md` and `out_dir/registry_entry.yaml`. Raises ModelNotFoundError or NotATextModelError
    when there is nothing to check; every other problem is a failed check in the report."""
    from oxrl.models.shape import ModelShape

    source = resolve_source(model)
    config = load_text_config(source, trust_remote_code)
    tokenizer = load_tokenizer(ModelConfig(name_or_path=model, trust_remote_code=trust_remote_code))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shape = ModelShape.from_config(config, trust_remote_code)
    report = OnboardReport(model, out_dir, config, shape.parameters)
    logger.info("onboarding %s (%s, %.2fB parameters); everything is written under %s", model, config.model_type,
                shape.parameters / 1e9, out_dir)

    report.chat_template = str(tokenizer.chat_template) if tokenizer.chat_template else None
    messages = conversation_for(tokenizer)
    report.end_of_turn = end_of_turn_token(tokenizer, messages)
    eot = report.end_of_turn
    report.checks += [check_has_chat_template(tokenizer),
                      guarded("assistant_mask", check_assistant_mask, tokenizer, messages, eot),
                      guarded("generation_prompt", check_generation_prompt, tokenizer, messages, eot),
                      guarded("prefix_stable", check_prefix_stable, tokenizer, messages),
                      check_eos_and_pad(tokenizer, eot, generation_eos_ids(source, config))]

    report.checks.append(check_memory(shape))
    truncated = out_dir / "truncated"
    report.checks.append(guarded("truncated_copy", make_truncated_copy, source, config, tokenizer, truncated,
                                 trust_remote_code))
    if report.checks[-1].status != FAIL:  # the remaining checks all run on the truncated copy
        report.checks.append(guarded("packed_attention", check_packed_attention, truncated, trust_remote_code))
        report.checks.append(guarded("lora_targets", check_lora_targets, truncated, trust_remote_code))
        if smoke:
            report.checks += [smoke_sft(truncated, out_dir, trust_remote_code),
                              smoke_grpo(truncated, out_dir, trust_remote_code)]
    write_report(report)
    return report


# --- model and config ---------------------------------------------------------------------------------------


def model_slug(model: str) -> str:
    """A folder name for `model`: a local path's last part, a hub id's `owner--name`."""
    path = Path(model).expanduser()
    return path.name if path.exists() else model.strip("/").replace("/", "--")


def load_text_config(source: ModelSource, trust_remote_code: bool):
    """The model's transformers config; refuses what oxRL cannot train (vision-language, not a causal LM)."""
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, AutoConfig

    config = from_pretrained_or_explain(AutoConfig, source, "config", trust_remote_code=trust_remote_code)
    if getattr(config, "vision_config", None) is not None:
        raise NotATextModelError(f"{source.path} is a vision-language model ({config.model_type}): oxRL trains text "
                                 "models only so far")
    remote_causal = "AutoModelForCausalLM" in (getattr(config, "auto_map", None) or {})
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING and not remote_causal:
        raise NotATextModelError(f"{source.path} ({config.model_type}) is not a causal language model: oxRL trains "
                                 "text models only so far")
    return config


def truncated_config(config, layers: int = TRUNCATED_LAYERS):
    """A copy of `config` with `layers` decoder layers; per-layer lists (e.g. `layer_types`) cut to match."""
    import copy

    short = copy.deepcopy(config)
    full_layers = config.num_hidden_layers
    for key, value in config.to_dict().items():
        if isinstance(value, list) and len(value) == full_layers and full_layers > layers:
            setattr(short, key, value[:layers])
    short.num_hidden_layers = layers
    return short


def has_weight_files(source: ModelSource) -> bool:
    """Whether there are weights to load; a hub id is assumed to have them (from_pretrained fetches them)."""
    folder = Path(source.path)
    if source.gguf_file or not folder.is_dir():
        return True
    return any(folder.glob("*.safetensors")) or any(folder.glob("*.bin"))


def make_truncated_copy(source: ModelSource, config, tokenizer, folder: Path, trust_remote_code: bool) -> CheckResult:
    """The first two layers of the real model (fp32), saved with the tokenizer as a safetensors folder:
    small enough to run every check on CPU, yet the family's own code and real weights."""
    from transformers import AutoModelForCausalLM

    short = truncated_config(config)
    if has_weight_files(source):
        model = from_pretrained_or_explain(AutoModelForCausalLM, source, "model", config=short, dtype=torch.float32,
                                           trust_remote_code=trust_remote_code)
        detail = f"first {TRUNCATED_LAYERS} of {config.num_hidden_layers} layers, real weights"
    else:  # a config-only folder: the shape can still be checked
        model = AutoModelForCausalLM.from_config(short, dtype=torch.float32, trust_remote_code=trust_remote_code)
        detail = f"{TRUNCATED_LAYERS} layers with RANDOM weights: the folder holds no weight files"
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return CheckResult("truncated_copy", PASS, f"{detail}, saved to {folder}")


def generation_eos_ids(source: ModelSource, config) -> set[int]:
    """The ids generation stops on besides the tokenizer's eos (oxRL's HF engine reads the model's generation
    config): generation_config.json's `eos_token_id`, or without that file config.json's, as transformers does."""
    from transformers import GenerationConfig

    try:
        configured = GenerationConfig.from_pretrained(source.path).eos_token_id
    except OSError:  # no generation_config.json
        configured = getattr(config, "eos_token_id", None)
    if configured is None:
        return set()
    return {configured} if isinstance(configured, int) else set(configured)


# --- running checks ----------------------------------------------------------------------------------------


def check_errors() -> tuple[type[Exception], ...]:
    """What a check can raise for a model oxRL cannot handle, or a package missing here: reported as that check's
    failure, so the report still comes out (config and data errors are ValueErrors; a template that raises, a
    jinja2 TemplateError; a missing optional package, e.g. `datasets` or `math-verify`, an ImportError)."""
    from jinja2 import TemplateError

    from oxrl.training.run_dir import RunDirError

    return (RunDirError, RuntimeError, ValueError, NotImplementedError, OSError, ImportError, TemplateError)


def guarded(name: str, check, *args) -> CheckResult:
    try:
        return check(*args)
    except check_errors() as error:
        return CheckResult(name, FAIL, first_line(error))


def first_line(error: Exception) -> str:
    return f"{type(error).__name__}: {error}".splitlines()[0]


# --- checks on the truncated copy ----------------------------------------------------------------------------


def check_packed_attention(folder: Path, trust_remote_code: bool) -> CheckResult:
    """Three sequences packed in one row through oxRL's loader == each alone under eager attention."""
    from transformers import AutoModelForCausalLM

    from oxrl.models.logprobs import forward_logits
    from oxrl.data.types import Example, Sequence, pack

    cpu = torch.device("cpu")
    model = load_model(ModelConfig(name_or_path=str(folder), dtype="float32", trust_remote_code=trust_remote_code),
                       cpu).eval()
    kernel = model.config._attn_implementation
    eager = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32,
                                                 trust_remote_code=trust_remote_code).eval()
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    examples = [Example([Sequence(ids.tolist(), [False] + [True] * (length - 1))])
                for length in (5, 7, 9) for ids in [torch.randint(0, vocab, (length,), generator=generator)]]
    with torch.no_grad():
        packed = forward_logits(model, pack(examples))
        alone = torch.cat([eager(input_ids=torch.tensor([e.sequences[0].input_ids])).logits[0] for e in examples])
    difference = (packed - alone).abs().max().item()
    status = PASS if difference <= PACKED_TOLERANCE else FAIL
    return CheckResult("packed_attention", status, f"on CPU, kernel {kernel!r}: max |packed - alone (eager)| = "
                       f"{difference:.2e} (tolerance {PACKED_TOLERANCE:g})")


def check_lora_targets(folder: Path, trust_remote_code: bool) -> CheckResult:
    """peft's default (all-linear) adapters: both attention and MLP projections must get one."""
    from oxrl.models.lora import add_lora

    model = load_model(ModelConfig(name_or_path=str(folder), dtype="float32", trust_remote_code=trust_remote_code),
                       torch.device("cpu"))
    model = add_lora(model, LoraConfig(enabled=True))
    adapted = sorted({n.split(".lora_")[0] for n, p in model.named_parameters() if p.requires_grad and ".lora_" in n})
    suffixes = sorted({path.rsplit(".", 1)[-1] for path in adapted})
    attention = [p for p in adapted if any(part in p for part in ("attn", "attention"))]
    mlp = [p for p in adapted if any(part in p for part in ("mlp", "feed_forward", "ffn", "experts"))]
    facts = {"lora_targets": suffixes}
    if attention and mlp:
        return CheckResult("lora_targets", PASS, f"adapters on {', '.join(suffixes)}", facts)
    missing = " and ".join(what for what, found in (("attention", attention), ("MLP", mlp)) if not found)
    return CheckResult("lora_targets", FAIL, f"no adapter on the {missing} projections (got {suffixes}): set "
                       "lora.target_modules", facts)


def check_memory(shape) -> CheckResult:
    """Full fine-tuning and LoRA estimates against this machine's memory, at oxRL's defaults here (bf16 weights
    and autocast on a GPU, bf16 autocast on a CPU with native bf16, else fp32) and 2,048 tokens a micro-batch; not
    fitting here is a warning (the run may be meant for a bigger machine), not a failure."""
    from oxrl.models.fit import describe_fit, fits
    from oxrl.models.hardware import available_memory
    from oxrl.models.memory import TrainingPlan, estimate_memory
    from oxrl.models.precision import uses_bf16

    devices = available_memory()
    cuda = devices.kind == "cuda"
    plan = dict(tokens_per_micro_batch=2048, dtype="bfloat16" if cuda else "float32",
                bf16_autocast=uses_bf16("auto", devices.kind),
                dense_attention_mask=cuda)
    estimates = {"full": estimate_memory(shape, TrainingPlan(lora=False, **plan)),
                 "LoRA": estimate_memory(shape, TrainingPlan(lora=True, **plan))}
    lines = [f"{what} fine-tune: {describe_fit(estimate, devices)}" for what, estimate in estimates.items()]
    fitting = [what for what, estimate in estimates.items() if fits(estimate, devices)]
    summary = ", ".join(f"{what} {estimate.total / 2**30:.1f} GiB" for what, estimate in estimates.items())
    verdict = "both fit" if len(fitting) == 2 else f"only {fitting[0]} fits" if fitting else "neither fits"
    return CheckResult("memory", PASS if "full" in fitting else WARN,
                       f"{summary} vs {devices.describe()}: {verdict}", {"memory": lines})


# --- one-step runs through the real runner -------------------------------------------------------------------


def smoke_tree(folder: Path, out_dir: Path, algorithm: str, trust_remote_code: bool) -> dict:
    """The config both smokes share: one step, no checkpoint, no plot, a run directory under out_dir."""
    return {
        "run": {"name": algorithm, "output_dir": str(out_dir / "runs"), "overwrite": True},
        "model": {"name_or_path": str(folder), "trust_remote_code": trust_remote_code},
        "algorithm": {"name": algorithm},
        "train": {"max_steps": 1, "micro_batch_size_per_device": 2},
        "checkpoint": {"save_final": False},
        "logging": {"progress_bar": False, "plot": False},
    }


def smoke_sft(folder: Path, out_dir: Path, trust_remote_code: bool) -> CheckResult:
    rows = out_dir / "smoke_sft.jsonl"
    rows.write_text("".join(json.dumps({"messages": turn}) + "\n" for turn in (CONVERSATION[1:3], CONVERSATION[3:5])))
    tree = smoke_tree(folder, out_dir, "sft", trust_remote_code)
    tree["data"] = {"train": [{"path": str(rows)}], "max_length": 128}
    tree["train"]["global_batch_size"] = 2  # an RL step's size is rl.prompts_per_step x rl.rollout.n instead
    return run_smoke("sft_smoke", tree)


def smoke_grpo(folder: Path, out_dir: Path, trust_remote_code: bool) -> CheckResult:
    tree = smoke_tree(folder, out_dir, "grpo", trust_remote_code)
    tree["rl"] = {"task": "arithmetic", "task_size": 4, "validation_size": 0, "prompts_per_step": 1,
                  "rollout": {"n": 2, "max_new_tokens": 8}}
    return run_smoke("grpo_smoke", tree)


def run_smoke(name: str, tree: dict) -> CheckResult:
    """One optimizer step through `oxrl.runner.run`; pass when it finishes with a finite loss."""
    from oxrl.config.load import load_config
    from oxrl.runner import run

    try:
        result = run(load_config(None, base=tree))
        loss = last_logged_loss(result.run_dir)  # (a damaged metrics.jsonl: a MetricsFileError naming the line)
    except check_errors() as error:
        run_dir = Path(tree["run"]["output_dir"]) / tree["run"]["name"]
        return CheckResult(name, FAIL, f"{first_line(error)} (log: {run_dir / 'train.log'})")
    if loss is None or not math.isfinite(loss):
        return CheckResult(name, FAIL, f"the step's loss is {loss} ({result.run_dir / 'metrics.jsonl'})")
    return CheckResult(name, PASS, f"1 step, loss {loss:.4f} ({result.run_dir})")


def last_logged_loss(run_dir: Path) -> float | None:
    """The loss of the last row of `run_dir`'s metrics.jsonl that has one, read by oxrl/logging/metrics.py."""
    from oxrl.logging.metrics import read_metrics

    return next((float(row["loss"]) for row in reversed(read_metrics(run_dir)) if "loss" in row), None)
