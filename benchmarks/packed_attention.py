"""Forward + backward time of one packed row: transformers' sdpa vs oxRL's per-sequence kernel.

    .venv/bin/python benchmarks/packed_attention.py                    # ~2k tokens, 8 sequences
    .venv/bin/python benchmarks/packed_attention.py --layers 4 --repeats 5   # a quicker look
    .venv/bin/python benchmarks/packed_attention.py --model DIR --tokens 64 --sequences 2 --warmup 0 --repeats 1

What is measured. A SmolLM2-135M-shaped Llama (the bundled model's config.json, or `--model`'s; random weights,
fp32, on CPU) trains on one packed row of `--tokens` random tokens split into `--sequences`
sequences of seeded random lengths (position ids restarting per sequence, every token but each
sequence's first trained): the SFT objective's loss and its backward, exactly as oxRL's loops
run it. Under "sdpa" transformers builds the T x T block-diagonal mask and SDPA computes every
score; under `oxrl_packed_sdpa` each sequence gets its own causal SDPA call. Both models hold the
same weights, so their losses must agree (printed). The two kernels alternate, after
`--warmup` untimed steps each, and the table reports the median and the best of `--repeats`
timed steps. On a shared machine the numbers move with other processes' load (printed).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/packed_attention.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.common import add_model_argument, machine_summary, print_table


def sequence_lengths(total: int, count: int, generator: torch.Generator) -> list[int]:
    """`count` lengths summing to `total`, each between half and 1.5x the mean."""
    weights = 0.5 + torch.rand(count, generator=generator)
    lengths = (weights / weights.sum() * total).long().clamp(min=2)
    lengths[-1] += total - int(lengths.sum())
    return lengths.tolist()


def packed_row(total: int, count: int, vocab_size: int, seed: int):
    from oxrl.data.types import Example, Sequence, pack

    generator = torch.Generator().manual_seed(seed)
    examples = []
    for length in sequence_lengths(total, count, generator):
        ids = torch.randint(3, vocab_size, (length,), generator=generator).tolist()
        examples.append(Example([Sequence(ids, [False] + [True] * (length - 1))]))
    return pack(examples)


def timed_step(model, batch, objective) -> tuple[float, float]:
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    loss = objective.compute(model, batch, normaliser=objective.count_units(batch)).loss
    loss.backward()
    return time.perf_counter() - start, loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--layers", type=int, default=None, help="fewer decoder layers for a quick look")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    add_model_argument(parser)
    args = parser.parse_args()

    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from oxrl.loops.objectives import get_objective
    from oxrl.models.packed_attention import PACKED_ATTENTION, use_packed_attention
    from oxrl.models.source import resolve_source

    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    config = AutoConfig.from_pretrained(resolve_source(args.model).path)
    if args.layers is not None:
        config.num_hidden_layers = args.layers
    torch.manual_seed(args.seed)
    sdpa_model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    packed_model = copy.deepcopy(sdpa_model)
    if not use_packed_attention(packed_model):
        raise SystemExit(f"{PACKED_ATTENTION} does not apply to this model (see the log)")
    models = {"sdpa": sdpa_model, PACKED_ATTENTION: packed_model}

    batch = packed_row(args.tokens, args.sequences, config.vocab_size, args.seed)
    lengths = torch.bincount(batch.seq_index).tolist()
    objective = get_objective("sft")
    seconds: dict[str, list[float]] = {name: [] for name in models}
    losses: dict[str, float] = {}
    for step in range(args.warmup + args.repeats):
        for name, model in models.items():  # alternate, so that a load spike hits both
            elapsed, losses[name] = timed_step(model, batch, objective)
            print(f"{'warm-up' if step < args.warmup else 'timed'} step {step}, {name}: {elapsed:.2f} s", flush=True)
            if step >= args.warmup:
                seconds[name].append(elapsed)

    for key, value in machine_summary().items():
        print(f"{key}: {value}")
    print(f"model: {args.model} config, random weights, {config.num_hidden_layers} layers, fp32")
    print(f"row: {args.tokens} tokens, {len(lengths)} sequences {lengths}")
    print_table([
        {
            "attention": name,
            "median s": f"{statistics.median(times):.2f}",
            "best s": f"{min(times):.2f}",
            "tokens/s (median)": f"{args.tokens / statistics.median(times):.0f}",
            "loss": f"{losses[name]:.6f}",
        }
        for name, times in seconds.items()
    ], title=f"forward + backward, {args.repeats} timed steps after {args.warmup} warm-up")
    speedup = statistics.median(seconds["sdpa"]) / statistics.median(seconds[PACKED_ATTENTION])
    loss_difference = abs(losses["sdpa"] - losses[PACKED_ATTENTION])
    print(f"\nspeed-up (median): {speedup:.2f}x; |loss difference| = {loss_difference:.2e}")


if __name__ == "__main__":
    main()
