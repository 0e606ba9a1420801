"""A rollout engine as an extension: the built-in `hf` engine, wrapped to count what it samples.

    extensions: [examples/extensions/counting_engine.py]
    rl: {rollout: {engine: counting_hf, engine_params: {prefix: counts}}}

Any object with the `RolloutEngine` methods (oxrl/rollout/base.py: generate, sync_weights, offload,
close) is an engine; the factory gets what the built-in factories get, and the engine's own parameters
last. Its `sync_weights` metrics land in the step's metrics, so the counts show in metrics.jsonl as
`<prefix>/calls` and `<prefix>/sampled_tokens`.
"""

from dataclasses import dataclass

from oxrl.extensions import register_engine
from oxrl.rollout.build import ENGINES


@dataclass(frozen=True)
class CountingParams:
    prefix: str = "engine"  # the metrics' name before the `/`


class CountingEngine:
    def __init__(self, inner, prefix: str):
        self.inner = inner
        self.prefix = prefix
        self.calls = 0
        self.sampled_tokens = 0

    def generate(self, prompts, params, vision=None):
        completions = self.inner.generate(prompts, params, vision)
        self.calls += 1
        self.sampled_tokens += sum(c.num_sampled for c in completions)
        return completions

    def sync_weights(self, model):
        return {**self.inner.sync_weights(model), f"{self.prefix}/calls": float(self.calls),
                f"{self.prefix}/sampled_tokens": float(self.sampled_tokens)}

    def offload(self):
        self.inner.offload()

    def close(self):
        self.inner.close()


@register_engine("counting_hf", params=CountingParams)
def counting_hf(rollout, model, tokenizer, strategy, seed, processor, own: CountingParams):
    return CountingEngine(ENGINES["hf"](rollout, model, tokenizer, strategy, seed, processor), own.prefix)
