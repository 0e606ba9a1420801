"""GRPO throughput on CPU: oxRL's `train_rl` vs TRL's GRPOTrainer, same prompts, same settings.

    .venv/bin/python benchmarks/grpo.py                       # 4 prompts x 8, 32 new tokens, 1 warm-up + 3 timed steps
    .venv/bin/python benchmarks/grpo.py --preset dr_grpo      # Dr. GRPO on both sides
    .venv/bin/python benchmarks/grpo.py --steps 2 --skip-trl  # quick check of oxRL alone
    .venv/bin/python benchmarks/grpo.py --model DIR --steps 1 --warmup-steps 0 --prompts-per-step 1 --n 2 --max-new-tokens 4
    ~/.cache/oxrl/venv-vllm-cpu/bin/python benchmarks/grpo.py --engine vllm --skip-trl   # oxRL sampling with vLLM
    (vLLM needs its own environment on CPU: `bash scripts/setup_vllm_cpu.sh` creates it)

What is measured. SmolLM2-135M-Instruct (the bundled alias, loaded from oxRL's cached safetensors
folder by both libraries; `--model` names another), fp32, CPU, on oxRL's generated `arithmetic` task ("What is 12+7?" in a
chat prompt asking for a `\\boxed{}` answer) scored by oxRL's `math` reward. Each step takes the
next `--prompts-per-step` prompts (no shuffling, so both libraries see the same prompts in the same
order), samples `--n` completions of each (temperature 1, at most `--max-new-tokens` tokens, stop
at end-of-turn), scores them, and makes ONE optimizer step on all of them (one rollout, one update:
TRL's `num_iterations=1`, oxRL's `rl.epochs=1, rl.mini_batches=1`), with beta = 0 (no reference
model on either side), AdamW at a constant lr, grad-norm clipping at 1.0, no gradient
checkpointing, no autocast, transformers `generate` for sampling (`--engine vllm`: oxRL samples with its
colocated vLLM engine instead, weights synced and checked after every update; TRL keeps `generate`).

* oxRL: `oxrl.loops.rl.train_rl` wired as `oxrl.runner.run_rl` wires it (HFEngine, SingleDevice),
  all of a step's completions generated in one `generate` call and trained in one packed
  (padding-free) forward/backward (`rollout.max_batch_size` = `micro_batch_size_per_device` =
  prompts x n), with oxRL's default attention on CPU (per-sequence SDPA over the packed row).
  Its per-step metrics give the split: `time/generate`, `time/reward`, `time/logprobs` (the
  advantages, plus a no-grad old-log-prob pass only when a step makes several updates: with one
  update per rollout, as here, the update's own log-probs are the old ones), `time/train`.
* TRL: `GRPOTrainer` with a `datasets.Dataset` whose `prompt` column holds the same chat messages
  (TRL renders them with the same chat template: the prompt ids are checked equal to oxRL's) and
  whose `answer` column feeds the same reward function, wrapped for TRL's
  `(prompts, completions, **columns) -> list[float]` signature. `per_device_train_batch_size` =
  prompts x n, `num_generations` = n, `gradient_accumulation_steps` = 1, transformers' stock sdpa
  attention on its padded batches. Its other defaults stay (its optimizer, its fused lm_head
  that projects only completion positions, and, because generation and update are aligned, no
  separate old-log-prob pass). The split is timed by
  wrapping three of the trainer's own methods on the instance (measurement only): `_generate`,
  `_calculate_rewards`, and `_generate_and_score_completions` (whatever it spends beyond the first
  two is reported in the old-log-probs column: advantages, padding, metrics); train = the rest.

Presets map to the same maths on both sides: `grpo` = group-std-scaled advantages and a per-
sequence token mean (TRL `scale_rewards="group"`, `loss_type="grpo"`); `dr_grpo` = unscaled
advantages and a token mean over the step (TRL `scale_rewards="none"`, `loss_type="dapo"`, which
is oxRL's `dr_grpo` aggregation; TRL's own `dr_grpo` divides by a constant instead).

Step time is the wall clock between consecutive optimizer-step ends on both sides (oxRL: the
timestamps of its metrics records; TRL: a callback), so generation, rewards, update and each
library's own bookkeeping are all inside it; the first `--warmup-steps` steps are excluded.
Completions/s = completions per step x timed steps / timed seconds; generated tokens/s counts the
tokens actually sampled (completions that stop early are shorter, so this normalises for the two
libraries drawing different samples). Each trainer runs in its own fresh spawned process, one
after the other, so its peak RSS (ru_maxrss) is its own. The machine is shared: read the load
average printed before and after, and repeat a run before trusting a ratio.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

if __package__ in (None, ""):  # run as `python benchmarks/grpo.py`: make `oxrl` and `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (MODEL, PRECISIONS, add_model_argument, add_precision_argument, format_bytes,
                               in_fresh_process, load_average, machine_summary, peak_rss_bytes, print_table, quiet_child,
                               spread, trainer_step_clock, usable_cores)

PHASES = ("generate", "reward", "old logprobs", "train")
# oxRL's per-step metric for each phase (see oxrl/loops/rl.py `collect` and `train_rl`).
OXRL_PHASE_METRICS = {"generate": "time/generate", "reward": "time/reward", "old logprobs": "time/logprobs",
                      "train": "time/train"}
# GRPOTrainer methods timed for the split: sampling, rewards, and the whole rollout they are part of.
TRL_TIMED_METHODS = ("_generate", "_calculate_rewards", "_generate_and_score_completions")
# The TRL options that give the same advantage estimator and loss aggregation as each oxRL preset.
TRL_PRESETS = {
    "grpo": {"scale_rewards": "group", "loss_type": "grpo"},
    "dr_grpo": {"scale_rewards": "none", "loss_type": "dapo"},
}


@dataclass
class RunSpec:
    """Everything a child process needs; plain data (a pydantic config and prompts), so it pickles."""

    cfg: Any  # oxrl.config.schema.Config
    prompts: list[Any]  # oxrl.data.rl_tasks.RLPrompt, in step order
    warmup_steps: int
    threads: int


@dataclass
class RunResult:
    step_seconds: list[float]  # wall clock between consecutive optimizer-step ends
    phase_seconds: dict[str, list[float]]  # PHASES -> per step
    mean_lengths: list[float]  # mean generated tokens per completion, per step
    rewards: list[float]  # mean reward per step
    peak_rss: int
    notes: dict[str, str] = field(default_factory=dict)


def benchmark_config(preset: str, prompts_per_step: int, n: int, max_new_tokens: int, steps: int, lr: float, seed: int,
                     engine: str = "hf", precision: str = "fp32", model: str = MODEL):
    """oxRL's config for the run; TRL's settings are derived from it, so the two cannot drift apart."""
    from oxrl.config.schema import Config

    completions = prompts_per_step * n
    return Config.model_validate({
        "run": {"name": "grpo-benchmark", "seed": seed, "device": "cpu"},
        "model": {"name_or_path": model, "dtype": "float32"},
        "algorithm": {"name": preset},
        "data": {"shuffle": False},  # step s takes prompts s*P .. s*P+P-1, as TRL's unshuffled sampler does
        "rl": {
            "task": "arithmetic", "task_size": prompts_per_step * steps, "validation_size": 0,
            "prompts_per_step": prompts_per_step,
            # equal precision: fp32 samples from the fp32 weights (TRL's sampler), bf16 from the engine's bf16 copy
            # (the `hf` engine's setting; vLLM samples in its own dtype)
            "rollout": {"engine": engine, "n": n, "temperature": 1.0, "max_new_tokens": max_new_tokens,
                        "max_batch_size": completions,
                        **({"precision": "trainer" if precision == "fp32" else "bf16"} if engine == "hf" else {})},
            "kl_coef": 0.0, "epochs": 1, "mini_batches": 1,
        },
        "train": {
            "max_steps": steps, "micro_batch_size_per_device": completions,
            "mixed_precision": PRECISIONS[precision],
            "optim": {"lr": lr, "schedule": "constant", "max_grad_norm": 1.0, "weight_decay": 0.0},
        },
        "checkpoint": {"save_final": False},
        "logging": {"progress_bar": False, "plot": False},
    })


def run_oxrl(spec: RunSpec) -> RunResult:
    import torch

    from oxrl.training.allocator import keep_freed_memory
    from oxrl.training.strategy import SingleDevice
    from oxrl.logging.metrics import read_metrics
    from oxrl.data.types import RLPromptBatch
    from oxrl.loops.rl import RLHandles, train_rl
    from oxrl.config.rl_presets import resolve
    from oxrl.data.rl_tasks import encode_prompts
    from oxrl.loops.rl_setup import reward_function
    from oxrl.models.load import load_model, load_tokenizer
    from oxrl.rollout.build import build_engine
    from oxrl.runner import set_seed

    quiet_child(spec.threads)
    cfg = spec.cfg
    rl = resolve(cfg.algorithm.name, cfg.rl)
    device = torch.device("cpu")
    tokenizer = load_tokenizer(cfg.model)
    train = encode_prompts(spec.prompts, tokenizer)
    model = load_model(cfg.model, device)
    keep_freed_memory()  # as `oxrl train` does on a CPU (run.keep_freed_memory)
    strategy = SingleDevice(device, cfg.train.mixed_precision, cfg.train.optim.max_grad_norm)
    engine = build_engine(rl.rollout, model, tokenizer, strategy, cfg.run.seed)
    no_validation = RLPromptBatch([], [], [], [])
    set_seed(cfg.run.seed)
    with tempfile.TemporaryDirectory() as run_dir:
        try:
            handles = RLHandles(cfg.model_copy(update={"rl": rl}), model, strategy, engine, reward_function(cfg, rl),
                                tokenizer=tokenizer)
            train_rl(handles, train, no_validation, Path(run_dir))
        finally:
            engine.close()
        records = read_metrics(Path(run_dir))
    # Step 1 has no previous step end: its own `time/step` stands in (it is a warm-up step anyway).
    step_seconds = [records[0]["time/step"]] + [b["time"] - a["time"] for a, b in zip(records, records[1:])]
    phases = {phase: [r[metric] for r in records] for phase, metric in OXRL_PHASE_METRICS.items()}
    notes = {"preset": f"{cfg.algorithm.name} (advantage {rl.advantage}, aggregation {rl.aggregation})",
             "load avg at end": load_average()}
    return RunResult(step_seconds, phases, [r["response_length/mean"] for r in records], [r["reward/mean"] for r in records],
                     peak_rss_bytes(), notes)


def trl_reward(reward_fn, field_names: list[str]) -> Callable[..., list[float]]:
    """oxRL's reward function with TRL's signature: chat prompts/completions in, one float per completion out.

    oxRL scores the last user message and the completion text (see `oxrl.data.rl_tasks.encode_prompts`);
    TRL passes conversational prompts and completions as message lists and the dataset's other
    columns (here the gold `answer`) as keyword lists, one entry per completion."""

    def math(prompts, completions, **columns) -> list[float]:
        prompt_texts = [prompt[-1]["content"] for prompt in prompts]
        completion_texts = [completion[-1]["content"] for completion in completions]
        fields = [{name: columns[name][i] for name in field_names} for i in range(len(completions))]
        return list(reward_fn(prompt_texts, completion_texts, fields).totals)

    return math


class PhaseClock:
    """Per-call seconds of some of a trainer's methods, by wrapping them on the instance (timing only)."""

    def __init__(self) -> None:
        self.seconds: dict[str, list[float]] = {}

    def wrap(self, owner: object, method: str) -> None:
        original = getattr(owner, method)
        calls = self.seconds.setdefault(method, [])

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                calls.append(time.perf_counter() - started)

        setattr(owner, method, timed)


def run_trl(spec: RunSpec) -> RunResult:
    import torch
    import trl
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from oxrl.config.rl_presets import resolve
    from oxrl.loops.rl_setup import reward_function
    from oxrl.models.load import load_model, load_tokenizer

    quiet_child(spec.threads)
    cfg = spec.cfg
    rl = resolve(cfg.algorithm.name, cfg.rl)
    completions = rl.prompts_per_step * rl.rollout.n
    # The same cached folder and dtype as oxRL's, with transformers' stock sdpa: oxRL's per-sequence
    # kernel for packed rows (its CPU default) would only ever delegate TRL's padded batches to sdpa.
    model = load_model(cfg.model.model_copy(update={"attn_implementation": "sdpa"}), torch.device("cpu"))
    tokenizer = load_tokenizer(cfg.model)
    field_names = sorted({name for prompt in spec.prompts for name in prompt.fields})
    dataset = Dataset.from_list([{"prompt": prompt.messages, **prompt.fields} for prompt in spec.prompts])

    clock = trainer_step_clock()  # TRL generates inside the step: the clock holds all of it
    # transformers 5.x renamed gradient_checkpointing (TRL defaults it to True) to activation_checkpointing.
    checkpointing_flag = ("activation_checkpointing" if "activation_checkpointing" in GRPOConfig.__dataclass_fields__
                          else "gradient_checkpointing")
    with tempfile.TemporaryDirectory() as output_dir:
        config = GRPOConfig(
            output_dir=output_dir, max_steps=cfg.train.max_steps, seed=cfg.run.seed,
            per_device_train_batch_size=completions, gradient_accumulation_steps=1, num_generations=rl.rollout.n,
            num_iterations=rl.epochs, max_completion_length=rl.rollout.max_new_tokens,
            temperature=rl.rollout.temperature, top_p=rl.rollout.top_p, top_k=rl.rollout.top_k,
            beta=rl.kl_coef, epsilon=rl.eps_low, epsilon_high=rl.eps_high, **TRL_PRESETS[cfg.algorithm.name],
            learning_rate=cfg.train.optim.lr, lr_scheduler_type="constant", warmup_steps=0,
            weight_decay=cfg.train.optim.weight_decay, max_grad_norm=cfg.train.optim.max_grad_norm,
            use_vllm=False, use_cpu=True, bf16=cfg.train.mixed_precision == "bf16", fp16=False,
            **{checkpointing_flag: False},
            shuffle_dataset=False,  # the same prompts per step as oxRL
            logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(model=model, reward_funcs=trl_reward(reward_function(cfg, rl), field_names), args=config,
                              train_dataset=dataset, processing_class=tokenizer, callbacks=[clock])
        trainer.remove_callback(PrinterCallback)
        phases = PhaseClock()
        for method in TRL_TIMED_METHODS:
            phases.wrap(trainer, method)
        trainer.train()
    generate, reward, collect = (phases.seconds[method] for method in TRL_TIMED_METHODS)
    logs = [entry for entry in trainer.state.log_history if "completions/mean_length" in entry]
    phase_seconds = {
        "generate": generate,
        "reward": reward,
        "old logprobs": [c - g - r for c, g, r in zip(collect, generate, reward)],
        "train": [s - c for s, c in zip(clock.step_seconds, collect)],
    }
    notes = {"trl": trl.__version__, "loss_type": config.loss_type, "scale_rewards": str(config.scale_rewards),
             "optimizer": str(getattr(config.optim, "value", config.optim)), "load avg at end": load_average()}
    return RunResult(clock.step_seconds, phase_seconds, [e["completions/mean_length"] for e in logs],
                     [e["reward"] for e in logs], peak_rss_bytes(), notes)


def check_prompt_ids(spec: RunSpec) -> bool:
    """TRL renders chat prompts with one batched `apply_chat_template(add_generation_prompt=True)`;
    oxRL's `encode_prompts` renders them one by one. Same ids = both libraries generate from the same prompts."""
    from oxrl.data.rl_tasks import encode_prompts
    from oxrl.models.load import load_tokenizer

    tokenizer = load_tokenizer(spec.cfg.model)
    ours = encode_prompts(spec.prompts, tokenizer).prompt_ids
    theirs = tokenizer.apply_chat_template([p.messages for p in spec.prompts], add_generation_prompt=True,
                                           tokenize=True, return_dict=True)["input_ids"]
    return [list(ids) for ids in theirs] == ours


def summarize(name: str, result: RunResult, completions_per_step: int, warmup: int) -> dict[str, str]:
    timed = slice(warmup, None)
    seconds = sum(result.step_seconds[timed])
    steps = len(result.step_seconds[timed])
    generated = sum(length * completions_per_step for length in result.mean_lengths[timed])
    row = {"trainer": name, "s/step": f"{seconds / steps:.2f}", "s/step median (min..max)": spread(result.step_seconds[timed])}
    row.update({f"{phase} s": f"{sum(result.phase_seconds[phase][timed]) / steps:.2f}" for phase in PHASES})
    row.update({
        "completions/s": f"{completions_per_step * steps / seconds:.2f}",
        "generated tokens/s": f"{generated / seconds:.1f}",
        "mean length": f"{sum(result.mean_lengths[timed]) / steps:.1f}",
        "reward": f"{sum(result.rewards[timed]) / steps:.3f}",
        "peak RSS": format_bytes(result.peak_rss),
    })
    return row


def completions_per_second(result: RunResult, completions_per_step: int, warmup: int) -> float:
    return completions_per_step * len(result.step_seconds[warmup:]) / sum(result.step_seconds[warmup:])


def fastest_completions_per_second(result: RunResult, completions_per_step: int, warmup: int) -> float:
    """From the fastest timed step: other processes on a shared machine only ever slow a step down,
    so the fastest one is the least disturbed (the same reasoning as the best-of matmul peak)."""
    return completions_per_step / min(result.step_seconds[warmup:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=tuple(TRL_PRESETS), default="grpo")
    parser.add_argument("--steps", type=int, default=3, help="timed optimizer steps (after the warm-up)")
    parser.add_argument("--warmup-steps", type=int, default=1, help="untimed optimizer steps first")
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--n", type=int, default=8, help="completions per prompt (the group size)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=usable_cores(), help="torch intra-op threads (default: usable cores)")
    parser.add_argument("--skip-trl", action="store_true", help="run oxRL only")
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf",
                        help="oxRL's rollout engine; `vllm` needs vLLM importable (on CPU: run this script with the python of the venv that scripts/setup_vllm_cpu.sh creates)")
    add_model_argument(parser)
    add_precision_argument(parser)
    args = parser.parse_args()
    if args.steps < 1 or args.warmup_steps < 0 or args.n < 2 or args.prompts_per_step < 1:
        parser.error("--steps >= 1, --warmup-steps >= 0, --n >= 2 (a group needs two samples), --prompts-per-step >= 1")

    import torch

    from oxrl.config.rl_presets import resolve
    from oxrl.loops.rl_setup import load_prompts

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    total_steps = args.warmup_steps + args.steps
    if args.engine == "vllm":
        from oxrl.rollout.build import require_vllm

        try:
            require_vllm()
        except ImportError as error:
            parser.error(f"--engine vllm: {error}")
    cfg = benchmark_config(args.preset, args.prompts_per_step, args.n, args.max_new_tokens, total_steps, args.lr, args.seed,
                           args.engine, args.precision, args.model)
    prompts, _ = load_prompts(cfg, resolve(cfg.algorithm.name, cfg.rl))
    spec = RunSpec(cfg, prompts, args.warmup_steps, args.threads)
    completions_per_step = args.prompts_per_step * args.n
    print(f"GRPO settings: preset {args.preset}, oxRL engine {args.engine}, {args.prompts_per_step} prompts x {args.n} completions per step, "
          f"max {args.max_new_tokens} new tokens, temperature 1.0, lr {args.lr}, beta 0, 1 update per rollout, "
          f"{args.warmup_steps} warm-up + {args.steps} timed steps; first prompt: {prompts[0].messages[-1]['content']!r}")
    print(f"machine before: {machine_summary()}")

    results = {"oxRL": in_fresh_process(run_oxrl, spec)}
    if not args.skip_trl:
        try:
            import trl  # noqa: F401  (only to know whether it is installed; it runs in the child)
        except ImportError:
            print("TRL is not importable in this environment: running oxRL only (pip install trl to compare)")
        else:
            print(f"prompt token ids identical in oxRL and TRL: {check_prompt_ids(spec)}")
            results["TRL"] = in_fresh_process(run_trl, spec)

    print(f"machine after: {machine_summary()}")
    for name, result in results.items():
        notes = ", ".join(f"{k}: {v}" for k, v in result.notes.items())
        per_step = "; ".join(f"{phase} {[round(x, 1) for x in result.phase_seconds[phase]]}" for phase in PHASES)
        print(f"{name}: {notes}\n  seconds per step (warm-up first): total {[round(x, 1) for x in result.step_seconds]}; {per_step}")
    rows = [summarize(name, result, completions_per_step, args.warmup_steps) for name, result in results.items()]
    print_table(rows, title=f"GRPO {args.model} {args.precision} CPU, seconds per timed step ({args.steps} after {args.warmup_steps} warm-up)")
    if len(results) == 2:
        ratios = [measure(results["oxRL"], completions_per_step, args.warmup_steps)
                  / measure(results["TRL"], completions_per_step, args.warmup_steps)
                  for measure in (completions_per_second, fastest_completions_per_second)]
        print(f"\noxRL / TRL completions/s: {ratios[0]:.2f}x over all timed steps, {ratios[1]:.2f}x fastest step vs "
              f"fastest step  (target >= 2x)")
    print(f"whole run: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
