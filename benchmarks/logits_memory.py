"""Peak memory of one log-prob forward + backward on a long row of a large-vocabulary model: whole logits vs chunked.

    .venv/bin/python benchmarks/logits_memory.py                       # 151,936-token vocabulary, 8,192 tokens
    .venv/bin/python benchmarks/logits_memory.py --tokens 2048 --entropy

What is measured. A tiny Qwen2 (2 layers, hidden 64, untied lm_head) with Qwen2's 151,936-token vocabulary, random
weights, fp32, CPU. One packed row of `--tokens` random tokens in 8 sequences, every token but each sequence's first
trained, goes through `oxrl.models.logprobs.token_logprobs` (with `--entropy`, also the entropy, as the RL
losses ask) and the backward of the sum. "whole logits" sets `FULL_LOGITS_ELEMENTS` above N x V, so the model's
own [N, V] logits are used, as oxRL did before oxrl/models/lm_head.py; "chunked" is the default, which projects
`CHUNK_ELEMENTS` logits at a time. Each runs in its own fresh process, so its peak RSS (ru_maxrss) is its own; the
model alone (loaded, before the forward) is printed as the baseline. The log-probs of both must agree (printed).
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/logits_memory.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.common import current_rss_bytes, format_bytes, in_fresh_process, machine_summary, peak_rss_bytes, print_table

VOCAB = 151_936  # Qwen2 / Qwen2.5 / Qwen3


@dataclass
class Spec:
    chunked: bool
    tokens: int
    entropy: bool
    threads: int


@dataclass
class Result:
    model_rss: int
    peak_rss: int
    seconds: float
    logprob_sum: float


def run(spec: Spec) -> Result:
    from transformers import AutoConfig, AutoModelForCausalLM

    from oxrl.models import lm_head
    from oxrl.models.logprobs import token_logprobs
    from oxrl.data.types import Example, Sequence, pack

    torch.set_num_threads(spec.threads)
    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen2", vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=spec.tokens,
                                  tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    if not spec.chunked:
        lm_head.FULL_LOGITS_ELEMENTS = 2**62
    length = spec.tokens // 8
    batch = pack([Example([Sequence(torch.randint(0, VOCAB, (length,)).tolist(), [False] + [True] * (length - 1))])
                  for _ in range(8)])
    model_rss = current_rss_bytes()
    started = time.perf_counter()
    out = token_logprobs(model, batch, with_entropy=spec.entropy)
    logprobs = out[0] if spec.entropy else out
    loss = logprobs.sum() + (out[1].sum() if spec.entropy else 0.0)
    loss.backward()
    return Result(model_rss, peak_rss_bytes(), time.perf_counter() - started, float(logprobs.sum()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--entropy", action="store_true", help="also the entropy (RL losses)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print("machine:", machine_summary())
    rows = []
    for chunked in (False, True):
        name = "chunked" if chunked else "whole logits"
        try:
            result = in_fresh_process(run, Spec(chunked, args.tokens, args.entropy, args.threads))
        except BrokenProcessPool:  # the kernel's OOM killer ended the child
            rows.append({"log-probs": name, "model loaded": "-", "peak RSS": "killed: out of memory", "peak - model": "-",
                         "forward+backward s": "-", "sum of log-probs": "-"})
            continue
        rows.append({"log-probs": name, "model loaded": format_bytes(result.model_rss),
                     "peak RSS": format_bytes(result.peak_rss), "peak - model": format_bytes(result.peak_rss - result.model_rss),
                     "forward+backward s": f"{result.seconds:.1f}", "sum of log-probs": f"{result.logprob_sum:.3f}"})
    print_table(rows, f"{VOCAB:,}-token vocabulary, {args.tokens:,} tokens, entropy: {args.entropy}")


if __name__ == "__main__":
    main()
