"""Peak memory per rank at a fixed row length, without and with context (or tensor) parallel (CPU, gloo).

    .venv/bin/python benchmarks/context_parallel_memory.py                  # 16,384-token rows: cp 1, cp 2
    .venv/bin/python benchmarks/context_parallel_memory.py --layouts 1x1 2x1 1x2 --tokens 8192   # cp x tp
    .venv/bin/python benchmarks/context_parallel_memory.py --tokens 2048 --steps 2 --hidden 64  # a quick look that it runs

For each layout it launches `torchrun --nproc_per_node cp x tp` on itself (`--worker`): FSDP2 with `strategy.mesh`
(1x1: FSDP2 alone in one process) trains SFT steps on one packed row of `--tokens` tokens (sequences of 1,024
tokens, every token trained) through oxRL's own forward (`token_logprobs`, packed attention) on a 4-layer
Llama-shaped model (hidden 512 or `--hidden`, MLP 4 x hidden, 8 heads, 2 key-value heads, vocabulary 8,192) in fp32. Each rank reports
the growth of its peak resident memory (ru_maxrss) over the steps, against its peak before the first step: what the
step's activations, logits and gathered keys and values added on top of the model, its states and the libraries;
and the median time of a step. Memory is the CPU's RAM here; the activations it measures are the terms
oxrl/models/memory.py estimates for a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as `python benchmarks/context_parallel_memory.py`
    sys.path.insert(0, str(ROOT))


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(tokens: int, steps: int, hidden: int, cp: int, tp: int, out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from oxrl.config.schema import StrategyConfig
    from oxrl.data.types import Example, Sequence, pack
    from oxrl.models.logprobs import token_logprobs
    from oxrl.models.packed_attention import use_packed_attention
    from oxrl.training.distributed import all_gather_objects, init_distributed
    from oxrl.training.fsdp import FSDP2Strategy

    torch.set_num_threads(1)
    env = init_distributed("cpu", process_group=True)
    strategy = FSDP2Strategy(env, StrategyConfig(name="fsdp2", mesh={"cp": cp, "tp": tp}), "no", max_grad_norm=1.0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=8192, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=4,
                                         num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False,
                                         max_position_embeddings=1024))
    use_packed_attention(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    model = strategy.prepare(model, optimizer)
    g = torch.Generator().manual_seed(1)
    row = pack([Example([Sequence(torch.randint(3, 8192, (1024,), generator=g).tolist(), [False] + [True] * 1023)])
                for _ in range(tokens // 1024)])
    before = peak_mib()
    seconds = []
    for _ in range(steps):
        started = time.perf_counter()
        logprobs = token_logprobs(model, row)
        loss = -(logprobs * row.loss_mask[0]).sum() / row.num_loss_tokens
        strategy.backward(loss)
        strategy.step(float(loss))
        seconds.append(time.perf_counter() - started)
    growth = all_gather_objects(peak_mib() - before)
    if env.rank == 0:
        out.write_text(json.dumps({"growth_mib": growth, "step_s": seconds}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=512, help="the model's width (a multiple of its 8 heads)")
    parser.add_argument("--layouts", nargs="+", default=["1x1", "2x1"], help="cp x tp of each run")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # cpxtp, when launched by torchrun
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        cp, tp = map(int, args.worker.split("x"))
        worker(args.tokens, args.steps, args.hidden, cp, tp, args.out)
        return
    from benchmarks.common import machine_summary, print_table, spread

    rows = []
    for layout in args.layouts:
        cp, tp = map(int, layout.split("x"))
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder) / "result.json"
            env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                            str(cp * tp), __file__, "--worker", layout, "--tokens", str(args.tokens), "--steps",
                            str(args.steps), "--hidden", str(args.hidden), "--out", str(out)], env=env, check=True, capture_output=True, text=True)
            result = json.loads(out.read_text())
        steps = result["step_s"][1:] or result["step_s"]  # the first step also warms the allocator
        rows.append({"layout": f"cp {cp} x tp {tp}", "row tokens": f"{args.tokens:,}",
                     "tokens per rank": f"{args.tokens // cp:,}",
                     "peak growth per rank, MiB": " / ".join(f"{g:,.0f}" for g in result["growth_mib"]),
                     "step s, median (min..max)": spread(steps)})
    print_table([machine_summary()])
    print_table(rows, title=f"peak memory per rank, {args.steps} SFT steps on one {args.tokens:,}-token row, by layout")


if __name__ == "__main__":
    main()
