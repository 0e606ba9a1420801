"""Drawing the next token with one uniform number per row (inverse CDF), for transformers' `generate`.

`generate(do_sample=True)` draws with `torch.multinomial`, which on a CPU draws an exponential variate for every
vocabulary entry of every row: 34 ms a decoding step for 32 rows of SmolLM2's 49,152 entries on 2 cores, a sixth
of the step. The inverse CDF draws the same distribution from one uniform per row (softmax, cumulative sum,
binary search: under 1 ms). It plugs into `generate` through its public processor list: the engine decodes
"greedily" (`do_sample=False`) behind transformers' own temperature / top-k / top-p warpers and `InverseCDFDraw`,
which leaves only the drawn token finite, so the greedy pick is the draw. `generate`'s `output_logits` are the raw
logits, so the log-probs the engine reports are unchanged.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper


def inverse_cdf_draw(scores: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The token of each row of softmax(`scores`) whose cumulative probability first exceeds `uniform` x the row's
    total ([B, V] scores, [B] uniforms in [0, 1) -> [B] ids). A token of probability 0 (score -inf) is never drawn:
    its cumulative sum equals its predecessor's, and the search takes the first entry strictly above the target."""
    cumulative = torch.softmax(scores.float(), dim=-1).cumsum(dim=-1)
    target = uniform[:, None].to(cumulative.dtype) * cumulative[:, -1:]  # the total is 1 up to rounding
    return torch.searchsorted(cumulative, target, right=True)[:, 0].clamp(max=scores.shape[-1] - 1)


class InverseCDFDraw(LogitsProcessor):
    """Draws each row's next token from softmax(scores) and returns scores that are 0 at it and -inf elsewhere."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        drawn = inverse_cdf_draw(scores, torch.rand(scores.shape[0], device=scores.device))
        only_drawn = torch.full_like(scores, float("-inf"))
        return only_drawn.scatter_(1, drawn[:, None], 0.0)


class OnlyTokens(LogitsProcessor):
    """Scores of every id outside `allowed` set to -inf, before any warper: decoding can only pick an allowed id
    (a VLA's action tokens), greedy or sampled."""

    def __init__(self, allowed: list[int]):
        self.allowed = torch.tensor(sorted(set(allowed)), dtype=torch.long)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        allowed = self.allowed.to(scores.device)
        return torch.full_like(scores, float("-inf")).index_copy_(1, allowed, scores.index_select(1, allowed))


def sampling_processors(temperature: float, top_k: int, top_p: float,
                        allowed: list[int] | None = None) -> list[LogitsProcessor]:
    """Only the `allowed` ids (when given), then transformers' warpers in `generate`'s own order (temperature,
    top-k, top-p), then the draw. Greedy decoding (temperature 0) takes the allowed restriction alone."""
    restrict: list[LogitsProcessor] = [] if allowed is None else [OnlyTokens(allowed)]
    if temperature <= 0:
        return restrict
    processors: list[LogitsProcessor] = [*restrict, TemperatureLogitsWarper(temperature)]
    if top_k > 0:
        processors.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        processors.append(TopPLogitsWarper(top_p))
    return processors + [InverseCDFDraw()]
