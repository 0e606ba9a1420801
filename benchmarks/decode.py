"""Sampling speed of the built-in `hf` engine against this machine's memory-bandwidth bound.

    .venv/bin/python benchmarks/decode.py                     # batch 1 and 32, fp32 and bf16, 64 new tokens
    .venv/bin/python benchmarks/decode.py --batch 1 --repeats 3
    .venv/bin/python benchmarks/decode.py --model DIR --batch 1 --new-tokens 4 --repeats 1 --bandwidth-gib 0.0625

What is measured. SmolLM2-135M-Instruct (the bundled alias; `--model` names another), CPU, `HFEngine.generate` on one arithmetic prompt
(`n` = batch samples of it, temperature 1) with its end-of-sequence ids emptied, so every row decodes exactly
`--new-tokens` tokens. fp32 = the weights as they are; bf16 autocast = under the trainer's bf16 autocast, as the
engine samples from the training model when `train.mixed_precision: bf16`; bf16 copy = the engine's own bf16 copy
(`rl.rollout.precision: bf16`, the default on a CPU with native bf16; eager attention).

The bound. Decoding one token for a batch reads every weight once (the KV cache is small next to 135M weights at
these lengths), so a step takes at least weight bytes / memory bandwidth, and tokens/s <= batch x bandwidth / weight
bytes. Bandwidth is measured on the spot as the best of 5 copies of a 1 GiB fp32 tensor (read + write: 2 GiB moved
per copy; `--bandwidth-gib` sets the size). fp32 reads 4 bytes a weight; under autocast the matmul weights are cast to bf16 once per `generate` call
and read as 2 bytes afterwards. Reported: median and range of `--repeats` timed calls after one untimed call.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/decode.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.common import add_model_argument, machine_summary, print_table


def copy_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
    """Best bytes/s of `dst.copy_(src)` on a `gib`-GiB fp32 tensor (each copy reads and writes it)."""
    src = torch.randn(int(gib * 2**30) // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = 0.0
    for _ in range(repeats):
        started = time.perf_counter()
        dst.copy_(src)
        best = max(best, 2 * src.numel() * 4 / (time.perf_counter() - started))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bandwidth-gib", type=float, default=1.0, help="size of the tensor the bandwidth copies")
    add_model_argument(parser)
    parser.add_argument("--keep-freed-memory", action=argparse.BooleanOptionalAction, default=True,
                        help="glibc malloc keeps freed memory, as `oxrl train` does on a CPU (default: on)")
    args = parser.parse_args()

    from oxrl.config.schema import ModelConfig
    from oxrl.data.rl_tasks import RLPrompt, encode_prompts
    from oxrl.models.load import load_model, load_tokenizer
    from oxrl.rollout.base import SamplingParams
    from oxrl.rollout.hf import HFEngine
    from oxrl.training.allocator import keep_freed_memory
    from oxrl.models.precision import autocast_for

    torch.set_num_threads(args.threads)
    cfg = ModelConfig(name_or_path=args.model, dtype="float32")
    tokenizer = load_tokenizer(cfg)
    model = load_model(cfg, torch.device("cpu")).eval()
    prompt = encode_prompts([RLPrompt(messages=[{"role": "user", "content": "What is 7+5? Explain."}])], tokenizer).prompt_ids
    weights = sum(p.numel() for p in model.parameters())
    bandwidth = copy_bandwidth(args.bandwidth_gib)
    print("machine:", machine_summary())
    print(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s; {weights / 1e6:.1f}M weights; prompt {len(prompt[0])} tokens")
    rows = []
    if args.keep_freed_memory:
        keep_freed_memory()  # what `oxrl train` does on a CPU (run.keep_freed_memory)
    for precision, weight_bytes in (("fp32", 4), ("bf16 autocast", 2), ("bf16 copy", 2)):
        engine = HFEngine(model, tokenizer, max_batch_size=max(args.batch), autocast=autocast_for(
            "bf16" if precision == "bf16 autocast" else "no", "cpu"), sample_in_bf16=precision == "bf16 copy")
        engine.eos_ids = {-1}  # no token ends a row: every row decodes exactly --new-tokens tokens
        for batch in args.batch:
            params = SamplingParams(n=batch, temperature=1.0, max_new_tokens=args.new_tokens)
            engine.generate(prompt, params)
            seconds = []
            for _ in range(args.repeats):
                started = time.perf_counter()
                engine.generate(prompt, params)
                seconds.append(time.perf_counter() - started)
            tokens = batch * args.new_tokens
            bound = batch * bandwidth / (weights * weight_bytes)
            rows.append({"weights": precision, "batch": batch,
                         "tokens/s median (min..max)": f"{tokens / statistics.median(seconds):.1f} "
                                                       f"({tokens / max(seconds):.1f}..{tokens / min(seconds):.1f})",
                         "bandwidth bound tokens/s": f"{bound:.1f}",
                         "share of bound": f"{tokens / statistics.median(seconds) / bound:.0%}"})
    print_table(rows, f"HFEngine.generate, {args.new_tokens} new tokens, {args.repeats} timed calls")


if __name__ == "__main__":
    main()
