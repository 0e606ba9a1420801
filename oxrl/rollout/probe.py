"""The weight-sync check: a fixed probe sequence scored by the trainer and by what a rollout engine samples from.

After every weight sync the mean |trainer - engine| log-prob gap on the probe must stay within a tolerance, else
`WeightSyncError`: an engine that silently kept old weights would sample off-policy. Used by the colocated vLLM
engine (oxrl/rollout/vllm_engine.py) and by every Ray rollout worker (oxrl/cluster/remote_engine.py).
"""

from __future__ import annotations

import torch

from oxrl.models.logprobs import token_logprobs
from oxrl.data.types import Example, Sequence, pack

PROBE_LENGTH = 64  # tokens scored after every sync
# float32: SmolLM2-135M on CPU agrees to ~1e-5 (a stale tied lm_head after a 1e-5 lr step gave 5e-4).
DEFAULT_TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 5e-2}


class WeightSyncError(RuntimeError):
    """After a weight sync, a rollout engine's log-probs of the probe disagree with the trainer's."""


def probe_ids(model, tokenizer) -> list[int]:
    """The probe: PROBE_LENGTH token ids drawn from a fixed seed, the same in every process, from the tokenizer's base
    vocabulary (no added tokens: a vision-language model's image tokens would need images)."""
    vocab = min(tokenizer.vocab_size, model.config.get_text_config().vocab_size)
    return torch.randint(vocab, (PROBE_LENGTH,), generator=torch.Generator().manual_seed(0)).tolist()


@torch.no_grad()
def trainer_probe_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log p(ids[t] | ids[<t]) for t >= 1 under the trainer's model, at temperature 1, returned in fp32 [len - 1].
    Computed in the weights' own precision whatever autocast the calling thread is under: an interruptible worker's
    sampling thread takes new weights (and scores the probe) inside its engine's autocast, the trainer outside any."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    batch = pack([Example([Sequence(ids, [False] + [True] * (len(ids) - 1))])]).to(device)
    with torch.autocast(device.type, enabled=False):
        values = token_logprobs(model, batch)[1:].float().cpu()
    model.train(was_training)
    return values
