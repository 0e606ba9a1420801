"""Stand-ins for tests/system/test_ray.py, imported inside Ray actors (so in a module of their own)."""

from __future__ import annotations

import os

from oxrl.cluster.workers import RolloutWorker

LOWER_HALF_REWARD = '''
def lower_half(prompt, completion, completion_ids):
    """The share of sampled token ids in the lower half of the vocabulary: learnable by a bias on the logits."""
    return sum(i < 24576 for i in completion_ids) / max(1, len(completion_ids))
'''


class StaleRolloutWorker(RolloutWorker):
    """Takes part in every broadcast but keeps its old weights: the probe must catch it."""

    def receive_weights(self, specs, bucket_bytes, probe, version):
        for _ in self.channel.receive(specs, bucket_bytes):
            pass
        self.synced = True
        return self.engine.probe_logprobs(probe).tolist()


class SlowRolloutWorker(RolloutWorker):
    """Samples after a pause: long enough to be killed with a request in flight."""

    def generate(self, prompts, params, vision=None, version=0):
        import time

        time.sleep(5.0)
        return super().generate(prompts, params, vision, version)


def grpo_update_on_a_ray_rank(cfg, remote):
    """tests/distributed_worker.py's update on fixed rollouts, as one rank of a Ray trainer group."""
    from oxrl.training.build import build_strategy
    from tests.distributed_worker import grpo_update

    strategy = build_strategy(cfg)
    try:
        return {"rank": strategy.rank, "world": strategy.world_size, "pid": os.getpid(), **grpo_update(cfg, strategy)}
    finally:
        strategy.close()


def run_rl_noting_nodes(cfg, remote):
    """oxrl.runner.run_rl as a Ray trainer rank, and the node id of this rank and of every rollout and reward worker
    (asked of the workers themselves, while they still run)."""
    import ray

    from oxrl.runner import run_rl

    result = run_rl(cfg, remote)
    node_of = lambda actor: ray.get(actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))  # noqa: E731
    return {"result": result, "trainer": ray.get_runtime_context().get_node_id(),
            "rollout": [node_of(actor) for actor in remote.rollout], "reward": [node_of(actor) for actor in remote.reward]}


class SlowRoundsRolloutWorker(RolloutWorker):
    """Its engine pauses 0.5 s before each round of decoding after the first: a request of a few rounds lasts long
    enough for a sync to land in it (`ray.interruptible`)."""

    def __init__(self, cfg, index):
        import time

        from oxrl.cluster.interruptible import InterruptibleEngine

        class SlowRounds(InterruptibleEngine):
            def _next_round(self, *args):
                time.sleep(0.5)
                return super()._next_round(*args)

        super().__init__(cfg, index)
        self.engine = SlowRounds(self.model, self.tokenizer, cfg.rl.rollout.max_batch_size,
                                 autocast=self.engine.autocast, decode=cfg.rl.rollout.decode, inbox=self.inbox)
