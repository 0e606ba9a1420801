"""The rollout-engine interface: prompts in, sampled completions (ids, log-probs, finish reason) out.

The RL loop talks only to this interface, so the built-in transformers engine and a vLLM engine
are interchangeable. Training always uses `completion_ids` exactly as sampled: text is never
re-tokenised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol


@dataclass
class SamplingParams:
    n: int = 8  # completions per prompt
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 256
    stop: list[str] = field(default_factory=list)


@dataclass
class Completion:
    prompt_index: int  # index of the prompt in the `generate` call
    prompt_ids: list[int]
    completion_ids: list[int]  # exactly the sampled tokens, up to and including EOS / the stop string
    logprobs: list[float]  # engine's log-prob of each sampled token under softmax(logits / temperature)
    finish_reason: Literal["eos", "length", "stop"]
    text: str  # decoded completion, for rewards and logs


class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """`params.n` completions per prompt, grouped by prompt in order."""
        ...

    def sync_weights(self, model) -> None:
        """Make the engine sample from `model`'s current weights."""
        ...
