"""Interruptible generation (`ray.interruptible`): a weight sync reaches a rollout worker while it samples, and the
completions in flight go on under the new weights.

By default a rollout worker takes new weights only between requests (`Submits`, oxrl/rollout/base.py), so under
`ray.rollout_split: prompts` every sync waits for the step being sampled ahead, and every token of a step comes from
the version the schedule names: a run repeats exactly. Here, as in AReaL's interruptible rollouts (arXiv:2505.24298),
the sync does not wait:

    receive    the worker's weight thread takes the broadcast into a second copy of the weights (`WeightInbox`)
    swap       the sampling thread copies them into the model at its next round of decoding (every `ROUND_TOKENS`
               tokens, oxrl/rollout/hf.py) or between two batches of prompts, and recomputes its rows' KV cache under
               them (the cache of the old weights is dropped, so every later token is the new version's own sample)
    tag        each sampled token keeps the version that sampled it (`Completion.newer_by`: how many updates after
               its request's) and its log-prob under that version, the behaviour log-prob that the off-policy
               correction divides by (oxrl/algorithms/policy_loss.py `off_policy_weight`): per token, not per request
    probe      the worker answers the sync once the weights are in the model, with the probe's log-probs under them
               (oxrl/rollout/probe.py): the trainer waits at most one round of decoding, not the whole step

Tokens are only ever fresher than the schedule's version, so `rl.max_staleness` still bounds every token's lag (a
request lost with its worker is sampled again from the live weights, oxrl/cluster/remote_engine.py). What is given
up is exact repetition: where a sync lands in a completion depends on timing. Prompts with images, and the
static-cache decoder on CUDA (`rl.rollout.decode`; `generate` swaps every round there too), take new weights between
batches of `rl.rollout.max_batch_size` rows only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

import torch

from oxrl.rollout.base import Completion, SamplingParams
from oxrl.rollout.hf import HFEngine

# The Ray concurrency group of a rollout worker's weight thread: `receive_weights` runs there, beside `generate`
# (`ray.remote(**ACTOR_OPTIONS)`: Ray takes concurrency groups where the actor class is declared, not in `.options`).
WEIGHTS_GROUP = "weights"
ACTOR_OPTIONS = {"concurrency_groups": {WEIGHTS_GROUP: 1}}


class WeightInbox:
    """New weights handed from the thread that receives them to the one that samples with them. The model is only
    ever written by the thread that holds it: the sampling thread while it samples (`sampling`), else the receiver."""

    def __init__(self, model, probe: Callable[[list[int]], torch.Tensor]):
        self.model, self.probe = model, probe
        self.version = 0  # the version the model holds
        self.changed = threading.Condition()
        self.staged: tuple[dict[str, torch.Tensor], int, list[int]] | None = None
        self.probed: list[float] = []
        self.busy = False  # a request is sampling: only its thread may write the model

    def deliver(self, state: dict[str, torch.Tensor], version: int, probe_ids: list[int]) -> list[float]:
        """The receiving thread: `state` becomes the model's weights, now or at the sampler's next round; returns the
        probe's log-probs under them once they are in."""
        with self.changed:
            self.staged = (state, version, probe_ids)
            if not self.busy:
                self._apply()
            self.changed.wait_for(lambda: self.staged is None)
            return self.probed

    def take(self) -> bool:
        """The sampling thread, between rounds: whether new weights came in (and are now the model's)."""
        with self.changed:
            if self.staged is None:
                return False
            self._apply()
            return True

    @contextmanager
    def sampling(self) -> Iterator[None]:
        """Held by the sampling thread for a request: weights staged meanwhile wait for its `take` or its end."""
        with self.changed:
            if self.staged is not None:
                self._apply()
            self.busy = True
        try:
            yield
        finally:
            with self.changed:
                self.busy = False
                if self.staged is not None:
                    self._apply()

    def _apply(self) -> None:
        """(the caller holds `changed`) the staged weights into the model, then their probe."""
        state, version, probe_ids = self.staged
        own = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in state.items():
                own[name].copy_(tensor)
        self.version, self.probed, self.staged = version, self.probe(probe_ids).tolist(), None
        self.changed.notify_all()


class InterruptibleEngine(HFEngine):
    """The `hf` engine taking new weights from `inbox` between rounds of decoding; each sampled token tagged with
    the version that sampled it."""

    def __init__(self, *args, inbox: WeightInbox, **kwargs):
        super().__init__(*args, **kwargs)
        self.inbox = inbox
        self.changes: list[tuple[int, int]] = []  # (tokens decoded, the version from there on), in this batch
        self.since = 0  # the version the request being sampled was submitted under

    def generate(self, prompts: list[list[int]], params: SamplingParams, vision=None, since: int = 0) -> list[Completion]:
        """`since`: the version the request was submitted under, which each token's `newer_by` counts from (it may
        start later: a sync can land while it waits behind another request)."""
        self.since = since
        with self.inbox.sampling():
            return super().generate(prompts, params, vision)

    def _generate_batch(self, model, prompts, params, vision) -> list[Completion]:
        self.inbox.take()  # between two batches of one request too
        self.changes = [(0, self.inbox.version)]
        completions = super()._generate_batch(model, prompts, params, vision)
        return [replace(c, newer_by=self._newer_by(len(c.logprobs))) for c in completions]

    def _next_round(self, model, input_ids: torch.Tensor, attention: torch.Tensor, cache, decoded: int):
        if not self.inbox.take():
            return cache
        self.changes.append((decoded, self.inbox.version))
        return None  # `generate` prefills the rows so far again, under the new weights

    def _newer_by(self, length: int) -> list[int]:
        """How many versions after `since` sampled each of a row's first `length` tokens (the rows of a batch decode
        in step, so its changes are every row's)."""
        newer = []
        for i, (start, version) in enumerate(self.changes):
            end = self.changes[i + 1][0] if i + 1 < len(self.changes) else length
            newer.extend([version - self.since] * max(0, min(end, length) - start))
        return newer
