"""GPU numbers for oxRL on one CUDA device: SFT throughput in bf16, and GRPO step time with the `hf` engine.

    python benchmarks/gpu.py                                      # both parts, sdpa, 16k tokens per step
    python benchmarks/gpu.py --part sft --tokens-per-step 8192 16384 24576 --attn sdpa flash_attention_2
    python benchmarks/gpu.py --part sft --profile                 # + torch.profiler's top ops of one step
    python benchmarks/gpu.py --part grpo
    python benchmarks/gpu.py --tokenizer PATH                     # no network: a folder with tokenizer files

What is measured. A randomly initialised model of the shape of Qwen/Qwen2.5-0.5B-Instruct (the shape
from oxRL's registry, `find_model(...).transformers_config()`, no download), saved once as a
safetensors folder and loaded by `oxrl.models.load.load_model` as every run loads a model: bf16
parameters on the GPU (`model.dtype: auto`). The tokenizer saved beside it is SmolLM2's (the bundled
model's, or `--tokenizer`): only GRPO needs one, and it decodes the ids it knows (ids past its 49k
vocabulary decode to nothing; a random model's text is garbage either way).

* SFT (`--part sft`): oxRL's own loop pieces, as benchmarks/sft.py uses them: `pack` (one padding-free
  row per optimizer step, position ids restarting per sequence) + `get_objective("sft")` +
  `run_micro_batches` + `SingleDevice(cuda, mixed_precision="auto").step()` (bf16 autocast, AdamW on
  the bf16 parameters, grad-norm clipping at 1.0). Synthetic rows: random token ids, lengths uniform
  on 256..2048, the loss on the second half of each sequence; each step holds exactly
  `--tokens-per-step` non-pad tokens (the last sequence of a step is cut to fit). `--warmup-steps`
  untimed steps, then `--steps` timed ones, each between two `torch.cuda.synchronize()`. Reported:
  tokens/s (median and min..max over the timed steps), MFU = model FLOPs (benchmarks/common.py's
  `training_flops`: 6 * N_matmul per token + attention over each sequence's own length) / step
  seconds / peak, against the bf16 matmul peak measured here (best of large square bf16 matmuls,
  timed with CUDA events) and against the H100 SXM datasheet (989 TFLOP/s dense bf16), and
  `torch.cuda.max_memory_allocated`. Each (attention, tokens) run is a fresh spawned process; one
  that fails (e.g. out of memory) is reported and the others go on. `flash_attention_2` runs only
  where the `flash_attn` package imports. `--profile` adds one untimed step under torch.profiler:
  kernel time split into attention / matmul / other (by kernel name) and the top ops.
* GRPO (`--part grpo`): the real runner, `oxrl.runner.run`, on a config tree built from the `math`
  preset (Dr. GRPO on the generated `arithmetic` task, math reward), with the random model,
  `run.device: cuda`, `rl.rollout.engine: hf`, `--prompts-per-step` x `--n` completions of at most
  `--max-new-tokens` tokens per step (a random model rarely stops early: nearly every completion is
  that long), all generated in one `generate` call and trained in one packed micro-batch, no
  validation, no checkpoints. Reported from the run's metrics.jsonl, over steps 2.. (step 1 warms
  up): `time/generate`, `time/train` (update + weight sync), `time/step` (the whole step: generate,
  reward, advantages, update) as median and min..max, and completions/s. A random model earns
  reward 0, so every advantage is 0 and the loss and gradient are 0: the update still runs its
  forward, backward and optimizer step, so its time is real; only learning is absent.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/gpu.py`: make `oxrl` and `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import DecoderShape, MatmulPeak, format_bytes, in_fresh_process, mfu, print_table, training_flops

MODEL_SHAPE = "Qwen/Qwen2.5-0.5B-Instruct"
TOKENIZER_FALLBACK = "smollm2-135m-instruct"  # the bundled model: its tokenizer is on disk without a network
MIN_LENGTH, MAX_LENGTH = 256, 2048
H100_SXM_BF16_DENSE = 989e12  # NVIDIA H100 SXM datasheet, dense bf16 tensor-core FLOP/s
PEAK_SIZES = (4096, 8192, 16384)
GRPO_PHASES = {"generate s": "time/generate", "train s": "time/train", "step s": "time/step"}


def measure_bf16_peak(sizes: tuple[int, ...] = PEAK_SIZES, repeats: int = 5, calls: int = 10) -> MatmulPeak:
    """Best FLOP/s of square bf16 `n x n @ n x n` matmuls on the current CUDA device (CUDA events).

    common.measure_matmul_peak's method on the GPU: best-of over sizes and repeats, each timing
    `calls` back-to-back matmuls so that launch overhead is amortised.
    """
    import torch

    best = MatmulPeak(0.0, 0, 0)
    for n in sizes:
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        torch.mm(a, b, out=out)
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                torch.mm(a, b, out=out)
            end.record()
            end.synchronize()
            flops = calls * 2.0 * n**3 / (start.elapsed_time(end) / 1e3)
            if flops > best.flops_per_s:
                best = MatmulPeak(flops, n, 0)
        del a, b, out
    torch.cuda.empty_cache()
    return best


def save_random_model(folder: Path, tokenizer_source: str | None) -> None:
    """The registry's Qwen2.5-0.5B shape with random weights (seed 0), and a tokenizer, as a safetensors folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from oxrl.config.schema import ModelConfig
    from oxrl.models.load import load_tokenizer
    from oxrl.models.registry import find_model, load_registry

    config = find_model(MODEL_SHAPE, load_registry()).transformers_config()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer = (AutoTokenizer.from_pretrained(tokenizer_source) if tokenizer_source
                 else load_tokenizer(ModelConfig(name_or_path=TOKENIZER_FALLBACK)))
    tokenizer.save_pretrained(folder)


# --- SFT -------------------------------------------------------------------------------------------


@dataclass
class SFTSpec:
    folder: str
    attn: str
    tokens_per_step: int
    warmup: int
    steps: int
    seed: int
    profile: bool


@dataclass
class SFTResult:
    step_seconds: list[float]  # timed steps only
    step_lengths: list[list[int]]  # per timed step: its sequence lengths
    peak_memory: int
    shape: DecoderShape
    losses: list[float]
    profile: str = ""


def synthetic_step(tokens: int, vocab: int, generator) -> list[tuple[list[int], list[bool]]]:
    """Random-id sequences, lengths uniform on [MIN_LENGTH, MAX_LENGTH], exactly `tokens` in all;
    the loss on the second half of each."""
    import torch

    rows, total = [], 0
    while total < tokens:
        length = min(int(torch.randint(MIN_LENGTH, MAX_LENGTH + 1, (1,), generator=generator)), tokens - total)
        length = max(length, 2)
        ids = torch.randint(0, vocab, (length,), generator=generator).tolist()
        rows.append((ids, [t >= length // 2 for t in range(length)]))
        total += length
    return rows


def run_sft(spec: SFTSpec) -> SFTResult:
    import torch
    import transformers

    from oxrl.config.schema import ModelConfig, OptimConfig
    from oxrl.data.types import Example, Sequence
    from oxrl.loops.objectives import get_objective
    from oxrl.loops.sl import run_micro_batches
    from oxrl.models.load import load_model
    from oxrl.training.optim import build_optimizer, build_scheduler
    from oxrl.training.strategy import SingleDevice

    transformers.utils.logging.disable_progress_bar()
    device = torch.device("cuda")
    model = load_model(ModelConfig(name_or_path=spec.folder, attn_implementation=spec.attn), device)
    optim_cfg = OptimConfig(lr=1e-5, schedule="constant", max_grad_norm=1.0)
    optimizer = build_optimizer(model, optim_cfg)
    total = spec.warmup + spec.steps
    strategy = SingleDevice(device, mixed_precision="auto", max_grad_norm=optim_cfg.max_grad_norm)
    strategy.prepare(model, optimizer, build_scheduler(optimizer, total, optim_cfg))
    objective = get_objective("sft")
    generator = torch.Generator().manual_seed(spec.seed)
    steps = [[Example([Sequence(ids, mask)]) for ids, mask in synthetic_step(spec.tokens_per_step, model.config.vocab_size,
                                                                             generator)] for _ in range(total)]
    model.train()

    def one_step(examples) -> float:
        sums, _ = run_micro_batches(objective, model, examples, len(examples), strategy)  # one packed row
        strategy.step()
        return float(sums["loss"])

    seconds, losses = [], []
    for index, examples in enumerate(steps):
        if index == spec.warmup:
            torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
        started = time.perf_counter()
        losses.append(one_step(examples))
        torch.cuda.synchronize()
        if index >= spec.warmup:
            seconds.append(time.perf_counter() - started)
    peak_memory = torch.cuda.max_memory_allocated()
    profile = profile_step(one_step, steps[-1]) if spec.profile else ""
    lengths = [[len(e.sequences[0]) for e in step] for step in steps[spec.warmup:]]
    return SFTResult(seconds, lengths, peak_memory, DecoderShape.of(model), losses, profile)


def profile_step(one_step, examples) -> str:
    """torch.profiler over one more step: the GPU kernels' time by kind, and the top ops by CUDA time."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        started = time.perf_counter()
        one_step(examples)
        torch.cuda.synchronize()
        wall = time.perf_counter() - started
    averages = prof.key_averages()
    # Kernels only (an aten op's row repeats its kernels' time): grouped by what the kernel's name says it is.
    kinds = {"attention": 0.0, "matmul": 0.0, "other": 0.0}
    for event in averages:
        if event.device_type != DeviceType.CUDA:
            continue
        name = event.key.lower()
        kind = ("attention" if any(k in name for k in ("sdpa", "attention", "fmha", "flash")) else
                "matmul" if any(k in name for k in ("nvjet", "gemm", "cutlass", "xmma")) else "other")
        kinds[kind] += event.self_device_time_total / 1e6
    busy = sum(kinds.values())
    split = ", ".join(f"{kind} {seconds:.3f} s ({seconds / busy:.0%})" for kind, seconds in kinds.items())
    table = averages.table(sort_by="self_device_time_total", row_limit=20, max_name_column_width=60)
    return (f"profiled step: {wall:.3f} s wall (profiler on), {busy:.3f} s of GPU kernels ({busy / wall:.0%} busy): "
            f"{split}\n{table}")


def sft_row(spec: SFTSpec, result: SFTResult, measured: MatmulPeak) -> dict[str, str]:
    per_step = [sum(lengths) / s for lengths, s in zip(result.step_lengths, result.step_seconds)]
    flops = sum(training_flops(result.shape, lengths) for lengths in result.step_lengths)
    seconds = sum(result.step_seconds)
    datasheet = MatmulPeak(H100_SXM_BF16_DENSE, 0, 0)
    return {
        "attention": spec.attn,
        "tokens/step": str(spec.tokens_per_step),
        "seqs/step": f"{statistics.mean(len(lengths) for lengths in result.step_lengths):.1f}",
        "tokens/s median": f"{statistics.median(per_step):,.0f}",
        "tokens/s min..max": f"{min(per_step):,.0f}..{max(per_step):,.0f}",
        "s/step median": f"{statistics.median(result.step_seconds):.3f}",
        "MFU (measured peak)": f"{mfu(flops, seconds, measured):.1%}",
        "MFU (989 TFLOP/s)": f"{mfu(flops, seconds, datasheet):.1%}",
        "peak memory": format_bytes(result.peak_memory),
    }


def sft_part(args, folder: Path, measured: MatmulPeak) -> None:
    attns = []
    for attn in args.attn:
        if attn == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
            print("flash_attn is not importable here: flash_attention_2 skipped")
            continue
        attns.append(attn)
    rows = []
    for attn in attns:
        for tokens in args.tokens_per_step:
            spec = SFTSpec(str(folder), attn, tokens, args.warmup_steps, args.steps, args.seed, args.profile)
            try:
                result = in_fresh_process(run_sft, spec)
            except Exception as error:  # e.g. out of memory at 32k: report it and go on with the others
                print(f"SFT {attn} {tokens} tokens/step failed: {type(error).__name__}: {str(error)[:300]}")
                continue
            shape = result.shape
            print(f"SFT {attn} {tokens} tokens/step: step seconds {[round(s, 3) for s in result.step_seconds]}, "
                  f"losses {[round(x, 3) for x in result.losses]}, N_matmul {shape.matmul_params / 1e6:.1f}M, "
                  f"{shape.n_layers} layers, attention width {shape.attn_width}")
            if result.profile:
                print(result.profile)
            rows.append(sft_row(spec, result, measured))
    print_table(rows, title=f"SFT {MODEL_SHAPE} shape (random weights), bf16, {args.steps} timed steps after "
                            f"{args.warmup_steps} warm-up, one packed row per step")


# --- GRPO ------------------------------------------------------------------------------------------


def grpo_tree(folder: Path, out_dir: str, args) -> dict:
    from oxrl.config.presets import task_preset

    tree = task_preset("math")
    completions = args.prompts_per_step * args.n
    tree["run"] = {"name": "gpu-grpo", "output_dir": out_dir, "device": "cuda", "seed": args.seed}
    tree["model"] = {"name_or_path": str(folder)}
    tree["rl"].update({"prompts_per_step": args.prompts_per_step, "validation_size": 0, "validation_every": None,
                       "task_size": args.prompts_per_step * args.grpo_steps})
    tree["rl"]["rollout"].update({"engine": "hf", "n": args.n, "max_new_tokens": args.max_new_tokens,
                                  "max_batch_size": completions})
    tree["train"].update({"max_steps": args.grpo_steps, "micro_batch_size_per_device": completions})
    tree["checkpoint"] = {"save_final": False}
    tree["logging"] = {"progress_bar": False, "plot": False}
    return tree


def grpo_part(args, folder: Path) -> None:
    import torch

    from oxrl.config.load import load_config
    from oxrl.logging.metrics import read_metrics
    from oxrl.runner import run

    with tempfile.TemporaryDirectory() as out_dir:
        cfg = load_config(None, base=grpo_tree(folder, out_dir, args))
        torch.cuda.reset_peak_memory_stats()
        result = run(cfg)
        records = read_metrics(result.run_dir)
    records = [r for r in records if "time/step" in r]
    timed = records[1:]  # step 1 warms up (CUDA kernels, allocator)
    print("GRPO per step: " + "; ".join(
        f"step {r.get('step', i + 1)}: generate {r['time/generate']:.2f} s, train {r['time/train']:.2f} s, "
        f"step {r['time/step']:.2f} s, mean length {r['response_length/mean']:.0f}" for i, r in enumerate(records)))
    completions = args.prompts_per_step * args.n
    row = {"completions/step": str(completions), "max new tokens": str(args.max_new_tokens),
           "timed steps": f"{len(timed)}"}
    for name, key in GRPO_PHASES.items():
        values = [r[key] for r in timed]
        row[name] = f"{statistics.median(values):.2f} ({min(values):.2f}..{max(values):.2f})"
    row["completions/s"] = f"{completions * len(timed) / sum(r['time/step'] for r in timed):.1f}"
    row["generated tokens/s"] = f"{statistics.median(r['tokens_per_s'] for r in timed):,.0f}"
    row["peak memory"] = format_bytes(torch.cuda.max_memory_allocated())
    print_table([row], title=f"GRPO (dr_grpo, arithmetic, hf engine) {MODEL_SHAPE} shape (random weights), bf16, "
                             f"steps 2..{len(records)}: median (min..max)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("all", "sft", "grpo"), default="all")
    parser.add_argument("--tokenizer", default=None, help="folder with tokenizer files (default: the bundled model's)")
    parser.add_argument("--attn", nargs="+", default=["sdpa"], choices=("sdpa", "flash_attention_2", "eager"))
    parser.add_argument("--tokens-per-step", nargs="+", type=int, default=[16384])
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5, help="timed SFT steps")
    parser.add_argument("--profile", action="store_true", help="profile one extra SFT step with torch.profiler")
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--grpo-steps", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch
    import transformers

    if not torch.cuda.is_available():
        sys.exit("benchmarks/gpu.py needs a CUDA device")
    started = time.perf_counter()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
          f"transformers {transformers.__version__}, flash_attn importable: {importlib.util.find_spec('flash_attn') is not None}")
    measured = measure_bf16_peak()
    print(f"bf16 matmul peak: {measured.flops_per_s / 1e12:.0f} TFLOP/s measured (best of square {measured.size}^3 "
          f"matmuls); datasheet H100 SXM dense bf16: {H100_SXM_BF16_DENSE / 1e12:.0f} TFLOP/s")
    with tempfile.TemporaryDirectory() as folder:
        save_random_model(Path(folder), args.tokenizer)
        if args.part in ("all", "sft"):
            sft_part(args, Path(folder), measured)
        if args.part in ("all", "grpo"):
            grpo_part(args, Path(folder))
    print(f"whole run: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
