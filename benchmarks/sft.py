"""SFT throughput on CPU: oxRL's own loop pieces vs TRL's SFTTrainer, same data, same settings.

    .venv/bin/python benchmarks/sft.py                       # default: 1 warm-up + 3 timed steps each
    .venv/bin/python benchmarks/sft.py --steps 3 --skip-trl  # quick check of oxRL alone
    .venv/bin/python benchmarks/sft.py --model DIR --steps 1 --warmup-steps 0 --tokens-per-step 576   # a tiny model

What is measured. SmolLM2-135M-Instruct (the bundled alias; `--model` names another), fp32, on CPU. The data are synthetic
single-turn chats built deterministically (seeded, no network), with total lengths drawn uniformly
from 64..512 tokens, rendered with the model's real chat template and tokenized by oxRL's own data
pipeline (so the loss masks are oxRL's: assistant content + end-of-turn token). Each optimizer
step takes the next K examples, K = round(--tokens-per-step / 288), the mean length; lengths are
stratified within a step so that every step, not only the average, holds about that many non-pad
tokens. Both libraries see exactly the same K examples in the same order at every step, one
forward/backward per step (no gradient accumulation), AdamW at a constant lr with grad-norm
clipping at 1.0, no gradient checkpointing, no autocast.

* oxRL: `pack` (padding-free: whole examples end to end in one row, position ids restarting per
  sequence) + `get_objective("sft")` + `run_micro_batches` + `SingleDevice.step()`.
* TRL: `SFTTrainer` on the same weights, loaded with transformers' plain sdpa attention, what a TRL user gets
  (oxRL's packed kernel refuses a packed row that did not come from oxRL's packer), on the same token ids and
  masks (as a pre-tokenized dataset with a `completion_mask`), `padding_free=True` by default (TRL's padding-free
  collator: the K examples flattened into one row with restarting position ids, exactly oxRL's layout), or its
  default right-padding with `--trl-mode padded`. Its other defaults stay (fused AdamW, its fused lm_head loss, its
  per-step metrics), since that is what a TRL user gets.

Each trainer runs in its own fresh child process (spawned one after the other, never at the same
time), so that its peak RSS (ru_maxrss, which is per process and never reset) is its own and
neither run inherits the other's allocator state. The first `--warmup-steps` optimizer steps
are excluded from the timing. Reported: non-pad tokens/s over the timed steps, MFU against this
machine's fp32 matmul peak (measured before and after the runs; the best is used), and peak RSS.
The first step's loss and gradient norm of both trainers are printed side by side: same weights
and same batch, so they must agree (a check that both train on the same tokens).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/sft.py`: make `oxrl` and `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (MODEL, PRECISIONS, DecoderShape, MatmulPeak, add_model_argument, add_precision_argument,
                               format_bytes, in_fresh_process, machine_summary, measure_matmul_peak, mfu, peak_rss_bytes,
                               print_table, quiet_child, spread, trainer_step_clock, training_flops, usable_cores)

MIN_LENGTH, MAX_LENGTH = 64, 512
# Common English words, each a single token (with its leading space) for SmolLM2's tokenizer, so
# that a message of n words is ~n tokens and the drawn lengths are met to within a few tokens.
WORDS = ("the of and to in is it that for on with as was at by be this have from or one had but not what all were "
         "when we there can an your which their said if do will each about how up out them then she many some so "
         "these would other into has more her two like him see time could no make than first been its who now people "
         "my made over did down only way find use may water long little very after words called just where most know").split()


@dataclass
class RunSpec:
    """Everything a child process needs to train; plain data, so it pickles cheaply."""

    steps: list[list[tuple[list[int], list[bool]]]]  # per optimizer step: (input_ids, loss_mask) per example
    lr: float
    threads: int
    trl_mode: str = "padding_free"
    precision: str = "fp32"
    model: str = MODEL


@dataclass
class RunResult:
    step_seconds: list[float]
    losses: list[float]
    grad_norms: list[float]
    peak_rss: int
    shape: DecoderShape
    notes: dict[str, str] = field(default_factory=dict)


def step_lengths(per_step: int, num_steps: int, rng: random.Random) -> list[int]:
    """Target token lengths, uniform on [MIN_LENGTH, MAX_LENGTH], stratified within each step.

    Step s draws one length from each of `per_step` equal slices of the range, in shuffled order:
    every length is still uniform over the whole range, but each step's total stays close to
    per_step * mean, so "about --tokens-per-step tokens per step" holds for every step, not only
    on average.
    """
    span = MAX_LENGTH - MIN_LENGTH
    lengths = []
    for _ in range(num_steps):
        step = [MIN_LENGTH + round((slot + rng.random()) * span / per_step) for slot in range(per_step)]
        rng.shuffle(step)
        lengths.extend(step)
    return lengths


def synthetic_chat(length: int, template_overhead: int, rng: random.Random) -> list[dict[str, str]]:
    """A single-turn chat whose rendering is about `length` tokens."""
    content_tokens = max(2, length - template_overhead)
    user_tokens = max(1, round(content_tokens * rng.uniform(0.2, 0.6)))  # prompts shorter than answers, mostly
    assistant_tokens = max(1, content_tokens - user_tokens)
    return [
        {"role": "user", "content": " ".join(rng.choices(WORDS, k=user_tokens))},
        {"role": "assistant", "content": " ".join(rng.choices(WORDS, k=assistant_tokens))},
    ]


def build_steps(model: str, tokens_per_step: int, num_steps: int, seed: int) -> list[list[tuple[list[int], list[bool]]]]:
    """Tokenize synthetic chats with oxRL's pipeline and group them K per optimizer step."""
    from oxrl.config.schema import ModelConfig
    from oxrl.data.formats import parse_row
    from oxrl.data.tokenize import ExampleTokenizer
    from oxrl.models.load import load_tokenizer

    row_tokenizer = ExampleTokenizer(load_tokenizer(ModelConfig(name_or_path=model)))

    def tokenize(index: int, messages: list[dict[str, str]]) -> tuple[list[int], list[bool]]:
        parsed = parse_row("messages", {"messages": messages}, location="synthetic", row=index, chat_template=True)
        sequence = row_tokenizer.example(parsed, source="synthetic", location="synthetic", row=index).sequences[0]
        return sequence.input_ids, sequence.loss_mask

    # The template's own tokens (system prompt, role headers) for a 1-word user and 1-word answer.
    overhead = len(tokenize(0, [{"role": "user", "content": "the"}, {"role": "assistant", "content": "the"}])[0]) - 2
    per_step = max(1, round(tokens_per_step / ((MIN_LENGTH + MAX_LENGTH) / 2)))
    rng = random.Random(seed)
    lengths = step_lengths(per_step, num_steps, rng)
    examples = [tokenize(i + 1, synthetic_chat(length, overhead, rng)) for i, length in enumerate(lengths)]
    return [examples[i : i + per_step] for i in range(0, len(examples), per_step)]


def run_oxrl(spec: RunSpec) -> RunResult:
    import torch

    from oxrl.config.schema import ModelConfig, OptimConfig
    from oxrl.data.types import Example, Sequence
    from oxrl.training.optim import build_optimizer, build_scheduler
    from oxrl.training.allocator import keep_freed_memory
    from oxrl.training.strategy import SingleDevice
    from oxrl.loops.objectives import get_objective
    from oxrl.loops.sl import run_micro_batches
    from oxrl.models.load import load_model

    quiet_child(spec.threads)
    device = torch.device("cpu")
    model = load_model(ModelConfig(name_or_path=spec.model, dtype="float32"), device)
    optim_cfg = OptimConfig(lr=spec.lr, schedule="constant", max_grad_norm=1.0)
    optimizer = build_optimizer(model, optim_cfg)
    keep_freed_memory()  # as `oxrl train` does on a CPU (run.keep_freed_memory)
    strategy = SingleDevice(device, mixed_precision=PRECISIONS[spec.precision], max_grad_norm=optim_cfg.max_grad_norm)
    strategy.prepare(model, optimizer, build_scheduler(optimizer, len(spec.steps), optim_cfg))
    objective = get_objective("sft")
    steps = [[Example([Sequence(ids, mask)]) for ids, mask in step] for step in spec.steps]
    model.train()

    step_seconds, losses, grad_norms = [], [], []
    for examples in steps:
        started = time.perf_counter()
        # One packed micro-batch per step: all K examples in one padding-free row.
        sums, _ = run_micro_batches(objective, model, examples, len(examples), strategy)
        grad_norms.append(strategy.step())
        step_seconds.append(time.perf_counter() - started)
        losses.append(float(sums["loss"]))
    return RunResult(step_seconds, losses, grad_norms, peak_rss_bytes(), DecoderShape.of(model),
                     {"optimizer": f"torch.optim.AdamW (foreach={optimizer.defaults.get('foreach')})"})


def run_trl(spec: RunSpec) -> RunResult:
    import torch
    import trl
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import SFTConfig, SFTTrainer

    from oxrl.config.schema import ModelConfig
    from oxrl.models.load import load_model, load_tokenizer

    quiet_child(spec.threads)
    # The same weights as oxRL's run, with transformers' plain sdpa: TRL's padding-free collator passes restarting
    # position ids without oxRL's packed layout, which oxRL's packed kernel (its `auto` default) refuses to guess.
    model_cfg = ModelConfig(name_or_path=spec.model, dtype="float32", attn_implementation="sdpa")
    model = load_model(model_cfg, torch.device("cpu"))
    shape = DecoderShape.of(model)  # before TRL wraps the forward
    tokenizer = load_tokenizer(model_cfg)
    examples = [example for step in spec.steps for example in step]
    dataset = Dataset.from_dict({
        "input_ids": [ids for ids, _ in examples],
        "completion_mask": [[int(m) for m in mask] for _, mask in examples],
    })

    clock = trainer_step_clock()
    # transformers 5.x renamed gradient_checkpointing (TRL defaults it to True) to activation_checkpointing.
    checkpointing_flag = ("activation_checkpointing" if "activation_checkpointing" in SFTConfig.__dataclass_fields__
                          else "gradient_checkpointing")
    with tempfile.TemporaryDirectory() as output_dir:
        config = SFTConfig(
            output_dir=output_dir, max_steps=len(spec.steps), per_device_train_batch_size=len(spec.steps[0]),
            gradient_accumulation_steps=1, learning_rate=spec.lr, lr_scheduler_type="constant", warmup_steps=0,
            weight_decay=0.0, max_grad_norm=1.0, use_cpu=True, bf16=spec.precision == "bf16", fp16=False,
            **{checkpointing_flag: False},  # TRL's default is on; oxRL's is off
            # TRL refuses max_length with padding-free and no packing; our examples are <= 512 tokens anyway.
            padding_free=spec.trl_mode == "padding_free", max_length=None,
            completion_only_loss=True,  # train exactly oxRL's loss_mask
            train_sampling_strategy="sequential",  # the same K examples per step as oxRL
            logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, seed=0,
        )
        trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer, callbacks=[clock])
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    notes = {"trl": trl.__version__, "mode": spec.trl_mode, "optimizer": str(getattr(config.optim, "value", config.optim)),
             "activation checkpointing": str(model.is_activation_checkpointing if hasattr(model, "is_activation_checkpointing")
                                             else model.is_gradient_checkpointing)}
    return RunResult(clock.step_seconds, [e["loss"] for e in logs], [e.get("grad_norm", float("nan")) for e in logs],
                     peak_rss_bytes(), shape, notes)


def tokens_per_second(result: RunResult, spec: RunSpec, warmup: int) -> float:
    timed_tokens = sum(len(ids) for step in spec.steps[warmup:] for ids, _ in step)
    return timed_tokens / sum(result.step_seconds[warmup:])


def summarize(name: str, result: RunResult, spec: RunSpec, warmup: int, peak: MatmulPeak) -> dict[str, str]:
    timed_seconds = sum(result.step_seconds[warmup:])
    timed_lengths = [len(ids) for step in spec.steps[warmup:] for ids, _ in step]
    row = {
        "trainer": name,
        "non-pad tokens/s": f"{tokens_per_second(result, spec, warmup):.1f}",
        "s/step": f"{timed_seconds / len(spec.steps[warmup:]):.2f}",
        "s/step median (min..max)": spread(result.step_seconds[warmup:]),
        "MFU": f"{mfu(training_flops(result.shape, timed_lengths), timed_seconds, peak):.1%}",
        "peak RSS": format_bytes(result.peak_rss),
        "step-1 loss": f"{result.losses[0]:.5f}",
        "step-1 grad norm": f"{result.grad_norms[0]:.4f}",
    }
    if len(result.losses) > 1:
        row[f"step-{len(result.losses)} loss"] = f"{result.losses[-1]:.5f}"
    return row


def describe_data(spec: RunSpec) -> str:
    lengths = [len(ids) for step in spec.steps for ids, _ in step]
    trained = sum(sum(mask) for step in spec.steps for _, mask in step)
    # What right-padding each step's K examples to the longest of them would add (TRL's padded mode).
    padded = sum(len(step) * max(len(ids) for ids, _ in step) for step in spec.steps)
    return (f"{len(lengths)} synthetic chats, {len(spec.steps[0])} per step, lengths {min(lengths)}..{max(lengths)} "
            f"(mean {sum(lengths) / len(lengths):.0f}); per step on average {sum(lengths) / len(spec.steps):.0f} non-pad "
            f"tokens, {trained / len(spec.steps):.0f} of them trained; padding to the longest would add "
            f"{padded / sum(lengths) - 1:.0%} pad tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="timed optimizer steps (after the warm-up)")
    parser.add_argument("--warmup-steps", type=int, default=1, help="untimed optimizer steps first")
    parser.add_argument("--tokens-per-step", type=int, default=2048, help="about this many non-pad tokens per optimizer step")
    parser.add_argument("--threads", type=int, default=usable_cores(), help="torch intra-op threads (default: usable cores)")
    parser.add_argument("--skip-trl", action="store_true", help="run oxRL only")
    parser.add_argument("--trl-mode", choices=("padding_free", "padded"), default="padding_free",
                        help="TRL batch layout: its padding-free collator (oxRL's layout) or its default right-padding")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    add_model_argument(parser)
    add_precision_argument(parser)
    args = parser.parse_args()
    if args.steps < 1 or args.warmup_steps < 0:
        parser.error("--steps must be >= 1 and --warmup-steps >= 0")

    import torch

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    steps = build_steps(args.model, args.tokens_per_step, args.warmup_steps + args.steps, args.seed)
    spec = RunSpec(steps, args.lr, args.threads, args.trl_mode, args.precision, args.model)
    print(f"data: {describe_data(spec)}")
    print(f"machine before: {machine_summary()}")
    # MFU against the peak of the dtype the matmuls run in: bf16 under autocast.
    peak_dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    peaks = [measure_matmul_peak(dtype=peak_dtype)]

    results = {"oxRL": in_fresh_process(run_oxrl, spec)}
    if not args.skip_trl:
        try:
            import trl  # noqa: F401  (only to know whether it is installed; it runs in the child)
        except ImportError:
            print("TRL is not importable in this environment: running oxRL only (pip install trl to compare)")
        else:
            results[f"TRL ({args.trl_mode})"] = in_fresh_process(run_trl, spec)
    peaks.append(measure_matmul_peak(dtype=peak_dtype))
    peak = max(peaks, key=lambda p: p.flops_per_s)

    print(f"machine after: {machine_summary()}")
    print(f"{args.precision} matmul peak: {peak.flops_per_s / 1e9:.1f} GFLOP/s (best of square {peak.size}^3 matmuls, "
          f"{peak.threads} threads; "
          f"before the runs {peaks[0].flops_per_s / 1e9:.1f}, after {peaks[1].flops_per_s / 1e9:.1f})")
    for name, result in results.items():
        notes = ", ".join(f"{k}: {v}" for k, v in result.notes.items())
        print(f"{name}: {notes}; step seconds {[round(s, 2) for s in result.step_seconds]}")
    rows = [summarize(name, result, spec, args.warmup_steps, peak) for name, result in results.items()]
    print_table(rows, title=f"SFT {args.model} {args.precision} CPU, {args.steps} timed steps after {args.warmup_steps} warm-up")
    if len(results) == 2:
        oxrl_result, trl_result = results.values()
        warmup = args.warmup_steps
        ratio = tokens_per_second(oxrl_result, spec, warmup) / tokens_per_second(trl_result, spec, warmup)
        print(f"\noxRL / TRL non-pad tokens/s: {ratio:.2f}x  (target >= 1.5x)")
    print(f"whole run: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
