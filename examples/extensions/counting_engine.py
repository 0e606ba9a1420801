"""A rollout engine as an extension: the built-in `hf` engine, wrapped to count what it samples.

    extensions: [examples/extensions/counting_engine.py]
    rl: {rollout: {engine: counting_hf}}

Any object with the `RolloutEngine` methods (oxrl/rollout/base.py: generate, sync_weights, offload,
close) is an engine; the factory gets what the built-in factories get. Its `sync_weights` metrics land
in the step's metrics, so the counts show in metrics.jsonl as `engine/calls` and `engine/sampled_tokens`.
"""

from oxrl.extensions import register_engine
from oxrl.rollout.build import ENGINES


class CountingEngine:
    def __init__(self, inner):
        self.inner = inner
        self.calls = 0
        self.sampled_tokens = 0

    def generate(self, prompts, params, vision=None):
        completions = self.inner.generate(prompts, params, vision)
        self.calls += 1
        self.sampled_tokens += sum(c.num_sampled for c in completions)
        return completions

    def sync_weights(self, model):
        return {**self.inner.sync_weights(model), "engine/calls": float(self.calls),
                "engine/sampled_tokens": float(self.sampled_tokens)}

    def offload(self):
        self.inner.offload()

    def close(self):
        self.inner.close()


@register_engine("counting_hf")
def counting_hf(rollout, model, tokenizer, strategy, seed, processor=None):
    return CountingEngine(ENGINES["hf"](rollout, model, tokenizer, strategy, seed, processor))
