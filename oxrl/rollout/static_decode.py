"""Decoding from a static KV cache, one compiled forward per token: the `hf` engine's path on CUDA.

On a GPU, `generate` with a dynamic cache is bound by kernel launches, not by compute: for 64 rows of a 0.5B model
each token took about 18 ms (docs/benchmarks.md, "GPU"), hundreds of small kernels a step, each launched from
Python. A static cache (`transformers.StaticCache`: keys and values preallocated for the whole completion and
written in place at `cache_position`) gives every decoding step the same shapes and the same addresses, so the step
(the model's forward for one token per row) can run under `torch.compile(mode="reduce-overhead")`, which fuses it
and replays it as a CUDA graph: one launch for the step. This is the recipe of transformers' static-cache
documentation and of gpt-fast.

What stays as in `HFEngine._decode`: the sampling processors (temperature, top-k, top-p, the inverse-CDF draw), the
greedy pick as the draw, the log-prob of the drawn token taken from the raw logits on the device at each step, the
check that the logits are finite, EOS and stop strings ending a completion. What differs, because the cache has
one shape for the whole call:

* no row leaves the batch: a finished row decodes on until every row has finished or the token budget is spent,
  which is checked every `round_tokens` steps (the engine's `ROUND_TOKENS`: one host sync) together with the
  finite-logits flag; the engine cuts each completion at its EOS or stop string, as it does for `generate`'s padded rows;
* prompts are not prefilled once per prompt and repeated: every row runs its prompt (one forward; on a GPU the
  prefill is a small part of the call);
* cache lengths are rounded up to `CACHE_BUCKET`, so that rollouts whose prompts differ by a few tokens reuse one
  compiled step instead of compiling another.

The compiled step and the last cache belong to the model object and are kept as long as it lives
(`WeakKeyDictionary`); the optimizer updates the weights in place, so a CUDA graph recorded before an update reads
the updated weights.
"""

from __future__ import annotations

import math
import weakref

import torch
from transformers import StaticCache

from oxrl.models.model_inputs import cache_keyword
from oxrl.rollout.base import SamplingParams

# Cache lengths are multiples of this many tokens (prompt + completion), so nearby prompt widths share a compilation.
CACHE_BUCKET = 128


class StaticDecoder:
    """Decodes a left-padded batch from a `StaticCache`; with `compile_step`, each step under `torch.compile`."""

    def __init__(self, compile_step: bool, round_tokens: int):
        self.compile_step = compile_step
        self.round_tokens = round_tokens  # steps between host checks of the finished and finite flags
        self.steps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its compiled forward
        self.caches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> ((rows, length), its cache)

    def cache_for(self, model, rows: int, length: int) -> StaticCache:
        """A cache of `rows` x `length` for `model`: the last one, emptied, when its shape matches. The compiled step
        is specialised on the cache object it was traced with, so a new cache per call would recompile and record
        its CUDA graph again (what transformers' `generate` avoids the same way)."""
        shape, cache = self.caches.get(model, (None, None))
        if shape == (rows, length):
            cache.reset()
            return cache
        cache = StaticCache(config=model.config, max_cache_len=length)
        self.caches[model] = ((rows, length), cache)
        return cache

    def step_function(self, model):
        """The forward that decodes one token per row: the model's own, or its compiled form (made once per model)."""
        if not self.compile_step:
            return model
        if model not in self.steps:
            # "reduce-overhead": CUDA graphs. Not fullgraph: a family whose forward breaks the graph somewhere still
            # decodes (its pieces replayed as graphs) instead of failing.
            self.steps[model] = torch.compile(model.forward, mode="reduce-overhead")
        return self.steps[model]

    @torch.no_grad()
    def decode(self, model, input_ids: torch.Tensor, attention: torch.Tensor, params: SamplingParams, processors,
               finished, not_finite) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's new tokens [B, L] and their log-probs [B, L] (on the CPU), L <= `params.max_new_tokens`.

        `processors` turn raw scores into what the greedy pick takes (sampling's warpers and draw; none for greedy),
        `finished(rows)` says which rows' tokens so far end their completion, and `not_finite()` is raised when a
        step's logits hold inf/NaN."""
        rows, width = input_ids.shape
        budget = params.max_new_tokens
        length = math.ceil((width + budget) / CACHE_BUCKET) * CACHE_BUCKET
        cache = self.cache_for(model, rows, length)
        # One mask of the cache's whole length for every call: the prompt's padding is off, every later slot on (the
        # causal mask at `cache_position` hides the slots not written yet), so every step sees the same shapes.
        mask = attention.new_ones(rows, length)
        mask[:, :width] = attention
        positions = (attention.cumsum(-1) - 1).clamp(min=0)  # as `generate` numbers left-padded rows
        with_cache = {cache_keyword(model): cache, "use_cache": True}
        logits = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, **with_cache,
                       cache_position=torch.arange(width, device=input_ids.device), logits_to_keep=1).logits[:, -1]
        step = self.step_function(model)
        scale = params.temperature if params.temperature > 0 else 1.0
        next_position = positions[:, -1:] + 1
        finite = torch.ones((), dtype=torch.bool, device=input_ids.device)
        tokens, logprobs = [], []
        for t in range(budget):
            raw = logits.float()  # read before the next step: a replayed graph overwrites its outputs
            finite &= torch.isfinite(raw.amax(dim=-1)).all()
            scores = raw
            for processor in processors:
                scores = processor(None, scores)
            token = scores.argmax(dim=-1)
            tokens.append(token)
            logprobs.append(torch.log_softmax(raw / scale, dim=-1).gather(-1, token[:, None])[:, 0])
            last = t + 1 == budget
            if (t + 1) % self.round_tokens == 0 or last:
                if not bool(finite):
                    raise not_finite()
                if last or bool(finished(torch.stack(tokens, 1).cpu()).all()):
                    break
            cache_position = torch.full((1,), width + t, dtype=torch.long, device=input_ids.device)
            logits = step(input_ids=token[:, None], attention_mask=mask, position_ids=next_position + t,
                          cache_position=cache_position, **with_cache).logits[:, -1]
        return torch.stack(tokens, 1).cpu(), torch.stack(logprobs, 1).cpu()
