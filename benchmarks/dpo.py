"""DPO on CPU: oxRL vs TRL's DPOTrainer throughput, and a real-model held-out check.

    .venv/bin/python benchmarks/dpo.py speed                        # 1 warm-up + 3 timed steps each, 8 pairs/step
    .venv/bin/python benchmarks/dpo.py speed --steps 2 --skip-trl   # oxRL alone
    .venv/bin/python benchmarks/dpo.py speed --model DIR --steps 1 --warmup-steps 0 --pairs-per-step 2   # a tiny model
    .venv/bin/python benchmarks/dpo.py heldout                      # examples/dpo_smollm2_arithmetic.yaml, before/after

`speed`. SmolLM2-135M-Instruct (the bundled alias; `--model` names another), fp32, CPU, DPO (sigmoid loss, beta 0.1) with
a frozen reference model run every step in both libraries. Synthetic chats (seeded): a user
prompt of 16..160 words and two assistant answers of 8..96 words each (one token per word), built
with the model's real chat template. Both libraries train exactly the same tokens: oxRL's data
pipeline masks the answer + `<|im_end|>`; TRL gets the rendered prompt text and `answer<|im_end|>`
as plain strings, which it tokenizes to the same ids (its step-1 loss and gradient norm must equal
oxRL's, printed side by side as a check). Each step takes the next K pairs, one forward/backward,
AdamW at a constant lr, grad-norm clipping at 1.0, no gradient checkpointing, no autocast.

* oxRL: all K pairs (2K sequences) packed padding-free into one row + `get_objective("dpo")` +
  `run_micro_batches` + `SingleDevice.step()`; reference = `FrozenModel` of a deep copy.
* TRL: `DPOTrainer` on the same weights loaded with transformers' plain sdpa attention (oxRL's packed kernel reads
  only oxRL's packed rows), the same deep copy as `ref_model`; its collator right-pads the 2K
  sequences to the longest (TRL 1.16 disabled `padding_free` for DPO), its fused lm_head log-probs.

Each trainer runs in its own fresh spawned process, one after the other, so its peak RSS is its
own. Reported: pairs/s (wall clock) and pairs per CPU-second (process CPU time over all its
threads) over the timed steps, and peak RSS. The machine is a shared 2-core VM: other processes
steal time, which moves wall-clock numbers by 2-4x between minutes; CPU time moves much less
(not zero: shared caches and cores), so compare the CPU-time ratio and repeat a run before
trusting any ratio.

`heldout`. Trains with `oxrl.runner.run` on the example config (dotted overrides accepted) and
measures, on its validation pairs, how often the model itself gives the correct answer a higher
log-probability than the near-miss (sum over answer tokens), before and after training; also
prints the run's `val/rewards/accuracy` (DPO's implicit-reward ranking, 0 before training).
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/dpo.py`: make `oxrl` and `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (MODEL, PRECISIONS, add_model_argument, add_precision_argument, format_bytes,
                               in_fresh_process, machine_summary, peak_rss_bytes, print_table, quiet_child, spread,
                               trainer_step_clock, usable_cores)

EXAMPLE_CONFIG = Path(__file__).resolve().parents[1] / "examples" / "dpo_smollm2_arithmetic.yaml"
WORDS = ("the of and to in is it that for on with as was at by be this have from or one had but not what all were "
         "when we there can an your which their said if do will each about how up out them then she many some so").split()


@dataclass
class Pair:
    prompt_text: str  # rendered chat prompt, ending with the assistant header (TRL's input)
    chosen_text: str  # answer + end-of-turn token (TRL's input)
    rejected_text: str
    sequences: list[tuple[list[int], list[bool]]]  # oxRL's tokens and masks: chosen, rejected


@dataclass
class SpeedSpec:
    steps: list[list[Pair]]
    lr: float
    beta: float
    threads: int
    precision: str = "fp32"
    model: str = MODEL


@dataclass
class SpeedResult:
    step_seconds: list[float]
    step_cpu_seconds: list[float]  # process CPU time (all threads): less sensitive to other processes than wall time
    losses: list[float]
    grad_norms: list[float]
    peak_rss: int
    notes: dict[str, str] = field(default_factory=dict)


def synthetic_pairs(model: str, count: int, seed: int) -> list[Pair]:
    from oxrl.config.schema import ModelConfig
    from oxrl.data.formats import parse_row
    from oxrl.data.tokenize import ExampleTokenizer
    from oxrl.models.load import load_tokenizer

    tokenizer = load_tokenizer(ModelConfig(name_or_path=model))
    row_tokenizer = ExampleTokenizer(tokenizer)
    end_of_turn = "<|im_end|>"
    rng = random.Random(seed)
    pairs = []
    for index in range(count):
        prompt = [{"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(16, 160)))}]
        chosen, rejected = (" ".join(rng.choices(WORDS, k=rng.randint(8, 96))) for _ in range(2))
        row = {"messages": prompt, "chosen": chosen, "rejected": rejected}
        parsed = parse_row("preference", row, location="synthetic", row=index + 1, chat_template=True)
        example = row_tokenizer.example(parsed, source="synthetic", location="synthetic", row=index + 1)
        prompt_text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        pairs.append(Pair(prompt_text, chosen + end_of_turn, rejected + end_of_turn,
                          [(s.input_ids, s.loss_mask) for s in example.sequences]))
    return pairs


def _load_policy(spec: SpeedSpec, attn_implementation: str = "auto"):
    import torch

    from oxrl.config.schema import ModelConfig
    from oxrl.models.load import load_model

    torch.manual_seed(0)
    quiet_child(spec.threads)
    return load_model(ModelConfig(name_or_path=spec.model, dtype="float32", attn_implementation=attn_implementation),
                      torch.device("cpu"))


def run_oxrl(spec: SpeedSpec) -> SpeedResult:
    import torch

    from oxrl.config.schema import OptimConfig, PreferenceConfig
    from oxrl.data.types import Example, Sequence
    from oxrl.training.optim import build_optimizer, build_scheduler
    from oxrl.training.allocator import keep_freed_memory
    from oxrl.training.strategy import SingleDevice
    from oxrl.loops.objectives import get_objective
    from oxrl.loops.sl import run_micro_batches
    from oxrl.models.reference import build_reference

    model = _load_policy(spec)
    optim_cfg = OptimConfig(lr=spec.lr, schedule="constant", max_grad_norm=1.0)
    optimizer = build_optimizer(model, optim_cfg)
    keep_freed_memory()  # as `oxrl train` does on a CPU (run.keep_freed_memory)
    strategy = SingleDevice(torch.device("cpu"), mixed_precision=PRECISIONS[spec.precision], max_grad_norm=1.0)
    strategy.prepare(model, optimizer, build_scheduler(optimizer, len(spec.steps), optim_cfg))
    reference = build_reference("frozen_copy", model, [], 1, strategy)
    objective = get_objective("dpo", PreferenceConfig(beta=spec.beta))
    model.train()
    step_seconds, step_cpu_seconds, losses, grad_norms = [], [], [], []
    for pairs in spec.steps:
        examples = [Example([Sequence(ids, mask) for ids, mask in pair.sequences]) for pair in pairs]
        started, cpu_started = time.perf_counter(), time.process_time()
        sums, _ = run_micro_batches(objective, model, examples, len(examples), strategy, reference)
        grad_norms.append(strategy.step())
        step_seconds.append(time.perf_counter() - started)
        step_cpu_seconds.append(time.process_time() - cpu_started)
        losses.append(sums["loss"])
    return SpeedResult(step_seconds, step_cpu_seconds, losses, grad_norms, peak_rss_bytes())


def run_trl(spec: SpeedSpec) -> SpeedResult:
    import trl
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import DPOConfig, DPOTrainer

    from oxrl.config.schema import ModelConfig
    from oxrl.models.load import load_tokenizer

    # transformers' plain sdpa: TRL's padded batches come without oxRL's packed layout, which its kernel refuses to guess
    model = _load_policy(spec, attn_implementation="sdpa")
    reference = copy.deepcopy(model).eval().requires_grad_(False)  # the same frozen copy oxRL uses
    pairs = [pair for step in spec.steps for pair in step]
    dataset = Dataset.from_dict({"prompt": [p.prompt_text for p in pairs], "chosen": [p.chosen_text for p in pairs],
                                 "rejected": [p.rejected_text for p in pairs]})

    clock = trainer_step_clock()  # includes TRL's collation, like oxRL's timing
    with tempfile.TemporaryDirectory() as output_dir:
        config = DPOConfig(
            output_dir=output_dir, max_steps=len(spec.steps), per_device_train_batch_size=len(spec.steps[0]),
            gradient_accumulation_steps=1, learning_rate=spec.lr, lr_scheduler_type="constant", warmup_steps=0,
            weight_decay=0.0, max_grad_norm=1.0, beta=spec.beta, loss_type=["sigmoid"], use_cpu=True, bf16=spec.precision == "bf16",
            fp16=False, gradient_checkpointing=False, max_length=None, precompute_ref_log_probs=False,
            train_sampling_strategy="sequential", logging_steps=1, report_to="none", save_strategy="no",
            disable_tqdm=True, dataloader_num_workers=0, seed=0,
        )
        trainer = DPOTrainer(model=model, ref_model=reference, args=config, train_dataset=dataset,
                             processing_class=load_tokenizer(ModelConfig(name_or_path=spec.model)), callbacks=[clock])
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    return SpeedResult(clock.step_seconds, clock.step_cpu_seconds, [e["loss"] for e in logs], [e.get("grad_norm", float("nan")) for e in logs],
                       peak_rss_bytes(), {"trl": trl.__version__, "optimizer": str(config.optim)})


def speed(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    pairs = synthetic_pairs(args.model, args.pairs_per_step * (args.warmup_steps + args.steps), args.seed)
    spec = SpeedSpec([pairs[i : i + args.pairs_per_step] for i in range(0, len(pairs), args.pairs_per_step)],
                     args.lr, args.beta, args.threads, args.precision, args.model)
    lengths = [len(ids) for pair in pairs for ids, _ in pair.sequences]
    print(f"data: {len(pairs)} synthetic pairs, {args.pairs_per_step} per step, sequence lengths {min(lengths)}..{max(lengths)} "
          f"(mean {sum(lengths) / len(lengths):.0f})")
    results = {"oxRL": in_fresh_process(run_oxrl, spec)}
    if not args.skip_trl:
        try:
            import trl  # noqa: F401  (only to know whether it is installed; it runs in the child)
        except ImportError:
            print("TRL is not importable in this environment: running oxRL only (pip install trl to compare)")
        else:
            results["TRL DPOTrainer"] = in_fresh_process(run_trl, spec)
    print(f"\nmachine: {machine_summary()}")
    rows = []
    for name, result in results.items():
        notes = ", ".join(f"{k}: {v}" for k, v in result.notes.items())
        print(f"{name}: {notes}; step seconds {[round(s, 2) for s in result.step_seconds]}, "
              f"CPU seconds {[round(s, 2) for s in result.step_cpu_seconds]}")
        seconds = sum(result.step_seconds[args.warmup_steps :])
        cpu_seconds = sum(result.step_cpu_seconds[args.warmup_steps :])
        rows.append({"trainer": name, "pairs/s": f"{args.pairs_per_step * args.steps / seconds:.3f}",
                     "pairs/CPU-s": f"{args.pairs_per_step * args.steps / cpu_seconds:.3f}",
                     "s/step": f"{seconds / args.steps:.2f}",
                     "s/step median (min..max)": spread(result.step_seconds[args.warmup_steps :]), "peak RSS": format_bytes(result.peak_rss),
                     "step-1 loss": f"{result.losses[0]:.5f}", "step-1 grad norm": f"{result.grad_norms[0]:.4f}",
                     f"step-{len(result.losses)} loss": f"{result.losses[-1]:.5f}"})
    print_table(rows, title=f"DPO {args.model} {args.precision} CPU, {args.steps} timed steps after {args.warmup_steps} warm-up")
    if len(rows) == 2:
        print(f"\noxRL / TRL pairs/s: {float(rows[0]['pairs/s']) / float(rows[1]['pairs/s']):.2f}x wall, "
              f"{float(rows[0]['pairs/CPU-s']) / float(rows[1]['pairs/CPU-s']):.2f}x CPU time")


def ranking_accuracy(model, examples, micro_size: int = 16) -> tuple[float, float]:
    """(fraction of pairs whose chosen answer has the higher log-prob, mean log-prob margin) under `model`."""
    import torch

    from oxrl.models.logprobs import sequence_sums, token_logprobs
    from oxrl.data.types import pack

    margins = []
    model.eval()
    with torch.no_grad():
        for start in range(0, len(examples), micro_size):
            batch = pack(examples[start : start + micro_size])
            logps = sequence_sums(token_logprobs(model, batch), batch)
            margins.append(logps[batch.seq_role == 0] - logps[batch.seq_role == 1])
    margin = torch.cat(margins)
    return float((margin > 0).float().mean()), float(margin.mean())


def heldout(args: argparse.Namespace) -> None:
    import torch

    from oxrl.config.load import load_config
    from oxrl.data.build import load_examples
    from oxrl.models.load import load_model, load_tokenizer
    from oxrl.runner import run

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    cfg = load_config(EXAMPLE_CONFIG, ["run.overwrite=true", *args.overrides])  # a benchmark re-runs afresh
    tokenizer = load_tokenizer(cfg.model)
    held_out = load_examples(cfg.data.model_copy(update={"train": cfg.data.validation, "validation": []}), tokenizer,
                             seed=cfg.run.seed).train
    before = ranking_accuracy(load_model(cfg.model, torch.device("cpu")), held_out)
    result = run(cfg)
    final = load_model(cfg.model.model_copy(update={"name_or_path": str(result.final_model_dir)}), torch.device("cpu"))
    after = ranking_accuracy(final, held_out)
    print(f"\n{len(held_out)} held-out pairs; model's own ranking (log p(correct) > log p(near-miss)):")
    print_table([{"": "before", "accuracy": f"{before[0]:.3f}", "mean log-prob margin": f"{before[1]:.3f}"},
                 {"": "after", "accuracy": f"{after[0]:.3f}", "mean log-prob margin": f"{after[1]:.3f}"}])
    implicit = {k: round(v, 4) for k, v in result.final_metrics.items() if k.startswith("val/")}
    print(f"DPO implicit-reward metrics on the held-out pairs after training: {implicit}")
    print(f"whole run: {time.perf_counter() - started:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fast = sub.add_parser("speed", help="pairs/s and peak RSS, oxRL vs TRL")
    fast.add_argument("--steps", type=int, default=3, help="timed optimizer steps (after the warm-up)")
    fast.add_argument("--warmup-steps", type=int, default=1, help="untimed optimizer steps first")
    fast.add_argument("--pairs-per-step", type=int, default=8)
    fast.add_argument("--skip-trl", action="store_true", help="run oxRL only")
    fast.add_argument("--lr", type=float, default=1e-6)
    fast.add_argument("--beta", type=float, default=0.1)
    fast.add_argument("--seed", type=int, default=0)
    add_model_argument(fast)
    add_precision_argument(fast)
    check = sub.add_parser("heldout", help="held-out ranking accuracy before/after the example DPO run")
    check.add_argument("overrides", nargs="*", help="dotted overrides of examples/dpo_smollm2_arithmetic.yaml")
    for command in (fast, check):
        command.add_argument("--threads", type=int, default=usable_cores(), help="torch intra-op threads")
    args = parser.parse_args()
    if args.command == "speed" and (args.steps < 1 or args.warmup_steps < 0):
        parser.error("--steps must be >= 1 and --warmup-steps >= 0")
    speed(args) if args.command == "speed" else heldout(args)


if __name__ == "__main__":
    main()
