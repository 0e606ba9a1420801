"""Measured peak training memory vs oxRL's estimate (oxrl/models/memory.py), case by case.

    .venv/bin/python benchmarks/memory_estimate.py                 # the cases of this machine (CUDA if present, else CPU)
    .venv/bin/python benchmarks/memory_estimate.py --device cpu    # CPU cases only
    .venv/bin/python benchmarks/memory_estimate.py --device all    # CPU, then CUDA
    .venv/bin/python benchmarks/memory_estimate.py --device cpu --model DIR --tokens 64   # a tiny model, short rows

What is run. For each case, in a fresh child process (this script re-invoked with `--case NAME`), the
loop the estimate describes: `load_model` (oxRL's loader: dtype, LoRA, gradient checkpointing as a
config sets them), AdamW from `build_optimizer`, one packed row of 4 random sequences (`pack`, the
first token of each untrained), then 2 optimizer steps of 2 micro-batches each: `token_logprobs` ->
mean loss -> backward, so the first micro-batch's gradients are held while the second one's
activations exist (the estimate counts both), then `step()` and `zero_grad(set_to_none=True)`.

* CPU: the bundled SmolLM2-135M-Instruct in fp32 (`--model` names another; `--tokens` sets every case's row length). Measured = peak RSS (ru_maxrss) minus the RSS just
  before the model loads (the Python process, torch and transformers are not part of the estimate).
  The child runs with MALLOC_MMAP_THRESHOLD_=1048576: by default glibc raises its mmap threshold (up
  to 32 MiB) the first time a large block is freed, and from then on large tensors come from the heap,
  whose freed pages stay resident; RSS would then report the allocator's high-water mark, not the live
  tensors. A fixed 1 MiB threshold gives every tensor of 1 MiB or more its own mmap, unmapped when
  freed, so RSS follows live memory like the estimate does.
* CUDA: a randomly initialised model of Qwen2.5-0.5B-Instruct's shape (the registry's config, saved
  as safetensors to a temp folder and loaded from there by `load_model`), so the dtype is the GPU
  default (bf16 parameters), under `torch.autocast("cuda", bfloat16)` as oxRL's strategies run.
  Measured = `torch.cuda.max_memory_allocated()`, the peak statistics reset before anything loads,
  so weights count. The CUDA context and the caching allocator's slack are not in it (nor in the
  estimate); `reserved` shows what the allocator held.

The estimate of each case is built from the TrainingPlan of what the child really ran: its packed
tokens, the trained positions (the logits that reach the lm_head), the parameter dtype, autocast,
LoRA and gradient checkpointing. tokens/s is the forward + backward of one micro-batch (the first
micro-batch, a warm-up, left out; optimizer steps not timed), for information.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/memory_estimate.py`: make `oxrl` and `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import add_model_argument, cpu_model, current_rss_bytes, peak_rss_bytes, print_table

CUDA_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"  # its registry shape, randomly initialised
SEQUENCES = 4  # per packed row
STEPS, MICRO_BATCHES = 2, 2
GIB = 1024**3
RESULT_PREFIX = "RESULT "


@dataclass(frozen=True)
class Case:
    name: str
    device: str  # cpu | cuda
    tokens: int  # packed tokens of one micro-batch
    lora: bool = False
    checkpointing: bool = False
    bf16_autocast: bool = False


CASES = [
    Case("cpu full fp32 1k", "cpu", 1024),
    Case("cpu lora fp32 1k", "cpu", 1024, lora=True),
    Case("cpu full+ckpt fp32 1k", "cpu", 1024, checkpointing=True),
    Case("cuda full bf16 4k", "cuda", 4096, bf16_autocast=True),
    Case("cuda full bf16 16k", "cuda", 16384, bf16_autocast=True),
    Case("cuda lora bf16 16k", "cuda", 16384, lora=True, bf16_autocast=True),
    Case("cuda full+ckpt bf16 16k", "cuda", 16384, checkpointing=True, bf16_autocast=True),
]


def run_case(case: Case, source: str) -> dict:
    """The child's work: train as the module docstring says on the model at `source`, return the peak, the estimate
    and the speed."""
    import torch

    from oxrl.models.logprobs import token_logprobs
    from oxrl.config.schema import LoraConfig, ModelConfig, OptimConfig
    from oxrl.data.types import Example, Sequence, pack
    from oxrl.models.fit import model_shape
    from oxrl.models.load import load_model
    from oxrl.models.memory import TrainingPlan, estimate_memory
    from oxrl.training.optim import build_optimizer

    torch.manual_seed(0)
    device = torch.device(case.device)
    if device.type == "cuda":
        torch.cuda.init()
        torch.cuda.reset_peak_memory_stats()
    base_rss = current_rss_bytes()

    model_cfg = ModelConfig(name_or_path=source, gradient_checkpointing=case.checkpointing)
    model = load_model(model_cfg, device, LoraConfig(enabled=case.lora))
    model.train()
    optimizer = build_optimizer(model, OptimConfig(lr=1e-5))
    vocab = model.config.vocab_size
    length = case.tokens // SEQUENCES
    batch = pack([Example([Sequence(torch.randint(0, vocab, (length,)).tolist(), [False] + [True] * (length - 1))])
                  for _ in range(SEQUENCES)]).to(device)
    trained = int(batch.loss_mask.sum())

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    seconds = []
    for _ in range(STEPS):
        for _ in range(MICRO_BATCHES):
            synchronize()
            started = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=case.bf16_autocast):
                logprobs = token_logprobs(model, batch)  # [T]
            loss = -logprobs.sum() / trained
            loss.backward()
            synchronize()
            seconds.append(time.perf_counter() - started)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    if device.type == "cuda":
        measured, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    else:
        measured, reserved = peak_rss_bytes() - base_rss, 0
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    plan = TrainingPlan(tokens_per_micro_batch=batch.input_ids.shape[1], logit_tokens=trained, dtype=dtype,
                        bf16_autocast=case.bf16_autocast, lora=case.lora, gradient_checkpointing=case.checkpointing,
                        dense_attention_mask=case.device == "cuda")
    estimate = estimate_memory(model_shape(ModelConfig(name_or_path=source)), plan)
    return {"measured": measured, "reserved": reserved, "estimate": estimate.total, "breakdown": estimate.lines()[0],
            "dtype": dtype, "tokens_per_s": case.tokens / statistics.median(seconds[1:])}


def save_random_model(folder: str) -> None:
    """Qwen2.5-0.5B's shape from the registry, random weights, written as bf16 safetensors."""
    import torch
    from transformers import AutoModelForCausalLM

    from oxrl.models.registry import find_model, load_registry

    torch.manual_seed(0)
    config = find_model(CUDA_MODEL, load_registry()).transformers_config()
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)


def run_in_child(case: Case, source: str) -> dict | str:
    """One case in its own process: its peak is its own. Returns the result, or why it failed."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="1048576")  # why: module docstring
    command = [sys.executable, str(Path(__file__).resolve()), "--case", case.name, "--source", source,
               "--tokens", str(case.tokens)]
    child = subprocess.run(command, env=env, capture_output=True, text=True)
    for line in child.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line.removeprefix(RESULT_PREFIX))
    tail = (child.stderr or child.stdout).strip().splitlines()[-5:]
    print(f"[{case.name}] child failed (exit {child.returncode}):\n  " + "\n  ".join(tail))
    return "OOM" if any("OutOfMemory" in line for line in tail) else f"failed ({child.returncode})"


def machine_lines(devices: set[str]) -> list[str]:
    import torch
    import transformers

    lines = [f"cpu: {cpu_model()}", f"torch {torch.__version__}, transformers {transformers.__version__}"]
    if "cuda" in devices:
        lines.append(f"gpu: {torch.cuda.get_device_name(0)} "
                     f"({torch.cuda.get_device_properties(0).total_memory / GIB:.1f} GiB)")
    return lines


def report(results: list[tuple[Case, dict | str]]) -> None:
    rows, breakdowns = [], []
    for case, result in results:
        if isinstance(result, str):
            rows.append({"case": case.name, "estimate GiB": "", "measured GiB": result, "measured/estimate": "",
                         "reserved GiB": "", "tokens/s": ""})
            continue
        rows.append({
            "case": case.name,
            "estimate GiB": f"{result['estimate'] / GIB:.2f}",
            "measured GiB": f"{result['measured'] / GIB:.2f}",
            "measured/estimate": f"{result['measured'] / result['estimate']:.2f}",
            "reserved GiB": f"{result['reserved'] / GIB:.2f}" if result["reserved"] else "-",
            "tokens/s": f"{result['tokens_per_s']:.0f}",
        })
        breakdowns.append(f"  {case.name} ({result['dtype']}): {result['breakdown']}")
    print_table(rows, title="Peak training memory per device: measured vs oxrl.models.memory.estimate_memory")
    print("\nEstimate terms:")
    print("\n".join(breakdowns))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda", "all"), default="auto",
                        help="which cases: auto = CUDA's when a GPU is present, else CPU's")
    parser.add_argument("--tokens", type=int, default=None, help="packed tokens of every case's micro-batch "
                        f"(default: each case's own); a multiple of {SEQUENCES}")
    add_model_argument(parser)  # the CPU cases' model
    parser.add_argument("--case", help=argparse.SUPPRESS)  # internal: run one case in this process
    parser.add_argument("--source", help=argparse.SUPPRESS)  # internal: the case's model
    args = parser.parse_args()
    if args.tokens is not None and (args.tokens < 2 * SEQUENCES or args.tokens % SEQUENCES):
        parser.error(f"--tokens must be a multiple of {SEQUENCES} and at least {2 * SEQUENCES}, not {args.tokens}")

    def sized(case: Case) -> Case:
        return case if args.tokens is None else dataclasses.replace(case, tokens=args.tokens)

    if args.case:
        case = next(c for c in CASES if c.name == args.case)
        print(RESULT_PREFIX + json.dumps(run_case(sized(case), args.source)), flush=True)
        return

    import torch

    wanted = {"auto": {"cuda" if torch.cuda.is_available() else "cpu"}, "all": {"cpu", "cuda"}}.get(args.device, {args.device})
    cases = [sized(c) for c in CASES if c.device in wanted]
    print("\n".join(machine_lines(wanted)))
    print(f"cases: {', '.join(f'{c.name} ({c.tokens} tokens)' for c in cases)}; {SEQUENCES} sequences per packed row, "
          f"{STEPS} steps x {MICRO_BATCHES} micro-batches")
    results = []
    with tempfile.TemporaryDirectory(prefix="oxrl-memory-") as folder:
        if "cuda" in wanted:
            save_random_model(folder)
        for case in cases:
            started = time.perf_counter()
            results.append((case, run_in_child(case, folder if case.device == "cuda" else args.model)))
            print(f"[{case.name}] done in {time.perf_counter() - started:.0f} s", flush=True)
    report(results)


if __name__ == "__main__":
    main()
