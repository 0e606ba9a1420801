"""The rollout-engine interface: prompts in, sampled completions (ids, log-probs, finish reason) out.

The RL loop talks only to this interface, so the built-in transformers engine and a vLLM engine
are interchangeable. Training always uses `completion_ids` exactly as sampled: text is never
re-tokenised; in multi-turn episodes the environment's tokens ride along in `completion_ids` but are
masked out (`loss_mask`), and `logprobs` covers the sampled tokens only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from oxrl.data.types import VisionInputs


@dataclass
class SamplingParams:
    n: int = 8  # completions per prompt
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    # Seeds this call's sampling where the engine takes a seed (Ray rollout workers, vLLM: prompt i of the call
    # uses seed + i), so a layout samples the same run to run and on resume. None: the engine's own RNG.
    seed: int | None = None
    # The only ids that may be sampled (a VLA's action tokens, oxrl/vla/action_tokens.py), EOS included only if
    # listed; None: any. Log-probs stay those of the whole vocabulary, as the trainer computes them.
    allowed_token_ids: list[int] | None = None


@dataclass
class Completion:
    prompt_index: int  # index of the prompt in the `generate` call
    prompt_ids: list[int]
    completion_ids: list[int]  # exactly the sampled tokens, up to and including EOS / the stop string (multi-turn: + env tokens)
    logprobs: list[float]  # engine's log-prob of each SAMPLED token under softmax(logits / temperature)
    finish_reason: Literal["eos", "length", "stop"]
    text: str  # decoded completion, for rewards and logs (multi-turn: actions and environment text in order)
    # Multi-turn episodes (oxrl/loops/multiturn.py) interleave environment-written tokens with the
    # sampled ones. loss_mask[t] says whether completion_ids[t] was sampled (trained, has a log-prob in
    # `logprobs`) or written by the environment (never trained). None: every token was sampled.
    loss_mask: list[bool] | None = None
    # Positions in completion_ids where the model's context restarted from scratch (an environment
    # state that did not extend the conversation): tokens from there on never saw the earlier ones.
    context_starts: list[int] = field(default_factory=list)
    # A vision-language prompt's images (its `prompt_ids` hold their expanded image tokens): the trainer's
    # forward takes them with the prompt.
    vision: VisionInputs | None = None
    # The images of each restarted context (one per `context_starts` entry; a VLA episode's later frames), or empty.
    context_vision: list[VisionInputs | None] = field(default_factory=list)
    # Interruptible generation (`ray.interruptible`, oxrl/cluster/interruptible.py): for each sampled token, how many
    # updates newer than its request's weights the weights that sampled it were (its `logprobs` entry is theirs).
    # None: the request's weights sampled them all.
    newer_by: list[int] | None = None

    def __post_init__(self) -> None:
        if self.loss_mask is not None and len(self.loss_mask) != len(self.completion_ids):
            raise ValueError(f"loss_mask ({len(self.loss_mask)}) and completion_ids ({len(self.completion_ids)}) differ in length")
        if len(self.logprobs) != self.num_sampled:
            raise ValueError(f"a completion needs one engine log-prob per sampled token: {len(self.logprobs)} "
                             f"log-probs for {self.num_sampled} sampled tokens")
        if any(not 0 < start < len(self.completion_ids) for start in self.context_starts):
            raise ValueError(f"context_starts {self.context_starts} must lie inside the completion (1..{len(self.completion_ids) - 1})")
        if self.newer_by is not None and len(self.newer_by) != self.num_sampled:
            raise ValueError(f"newer_by ({len(self.newer_by)}) needs one value per sampled token ({self.num_sampled})")
        if self.context_vision and len(self.context_vision) != len(self.context_starts):
            raise ValueError(f"context_vision ({len(self.context_vision)}) needs one entry per context start "
                             f"({len(self.context_starts)})")

    @property
    def num_sampled(self) -> int:
        """Tokens the engine sampled (the trained ones); environment-written tokens are not counted."""
        return len(self.completion_ids) if self.loss_mask is None else sum(self.loss_mask)

    @property
    def sampled_ids(self) -> list[int]:
        """The sampled token ids in order, without environment-written tokens."""
        if self.loss_mask is None:
            return list(self.completion_ids)
        return [token for token, sampled in zip(self.completion_ids, self.loss_mask) if sampled]


class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 vision: list[VisionInputs | None] | None = None) -> list[Completion]:
        """`params.n` completions per prompt, grouped by prompt in order. `vision`: each prompt's images (None for a
        text prompt), which every completion of the prompt carries."""
        ...

    def sync_weights(self, model) -> dict[str, float]:
        """Make the engine sample from `model`'s current weights; returns metrics of the sync (may be empty)."""
        ...

    def offload(self) -> None:
        """The rollout phase is over (all of a step's turns sampled): free the memory the trainer needs until the
        next `generate` or `sync_weights`, which bring it back (vLLM sleeps on GPU; a no-op elsewhere)."""
        ...

    def close(self) -> None:
        """Release what the engine holds (processes, files). Call it when done: a vLLM engine left to
        interpreter exit can hang a spawned process, which joins its children before vLLM shuts down."""
        ...


@runtime_checkable
class Submits(Protocol):
    """An engine whose sampling runs elsewhere (Ray rollout workers): it takes a request and returns at once, so the
    trainer can update while it samples (`rl.max_staleness`, oxrl/loops/pipeline.py). Requests run in order,
    each from the weights the engine held when it was submitted: a `sync_weights` after a `submit` applies
    to later requests only."""

    def submit(self, prompts: list[list[int]], params: SamplingParams,
               vision: list[VisionInputs | None] | None = None) -> int:
        """Start sampling as `generate` would; returns a ticket for `collect`."""
        ...

    def collect(self, ticket: int) -> list[Completion]:
        """The completions of a submitted request, waiting for them if need be."""
        ...
