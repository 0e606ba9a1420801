"""Measure the peak memory of a few SmolLM2 training steps on the CPU, in a process of its own.

Run by tests/integration/test_memory.py as `python -m tests.memory_probe TOKENS LORA CHECKPOINTING`; prints one JSON line
with the peak resident memory above what the process held before the model loaded. The caller sets
MALLOC_MMAP_THRESHOLD_ so that glibc hands large freed blocks back to the system: resident memory then
follows the live tensors, which is what the estimate counts (glibc's default keeps freed blocks in its heap
and resident memory can stay far above what is in use).
"""

from __future__ import annotations

import json
import resource
import sys

import torch

from benchmarks.common import current_rss_bytes
from oxrl.models.logprobs import token_logprobs
from oxrl.config.schema import LoraConfig, ModelConfig, OptimConfig
from oxrl.data.types import Example, Sequence, pack
from oxrl.models.load import load_model
from oxrl.training.optim import build_optimizer

SEQUENCES = 4  # packed in one micro-batch
# The peak is the second micro-batch's backward of the second step: the weights, the first micro-batch's gradients
# and AdamW's moments are held while that micro-batch's activations are. What allocates the gradients and the
# moments does not change their size, so every pass before it runs on a few tokens; only it has the tokens measured.
WARM_TOKENS = 8


def main(tokens: int, lora: bool, checkpointing: bool) -> dict:
    torch.manual_seed(0)
    before = current_rss_bytes()
    model = load_model(ModelConfig(name_or_path="smollm2-135m-instruct", gradient_checkpointing=checkpointing),
                       torch.device("cpu"), LoraConfig(enabled=lora))
    model.train()
    optimizer = build_optimizer(model, OptimConfig(lr=1e-5))

    def backward(tokens: int):
        length = tokens // SEQUENCES
        batch = pack([Example([Sequence(torch.randint(0, model.config.vocab_size, (length,)).tolist(),
                                        [False] + [True] * (length - 1))]) for _ in range(SEQUENCES)])
        (-token_logprobs(model, batch).sum() / batch.loss_mask.sum()).backward()
        return batch

    backward(WARM_TOKENS * SEQUENCES)  # step 1: gradients, then AdamW's moments
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    backward(WARM_TOKENS * SEQUENCES)  # step 2, micro-batch 1: its gradients are held ...
    batch = backward(tokens)  # ... through micro-batch 2's forward and backward
    optimizer.step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"peak_above_start": peak - before, "trained_tokens": int(batch.loss_mask.sum())}


if __name__ == "__main__":
    tokens, lora, checkpointing = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3] == "1"
    sys.stdout.write(json.dumps(main(tokens, lora, checkpointing)) + "\n")
