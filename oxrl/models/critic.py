"""PPO's critic as a model: a causal LM backbone with a one-output token-classification head
(`AutoModelForTokenClassification`, num_labels=1), loaded from the policy's weights or `rl.critic_model`."""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)


def load_critic(path: str, device: torch.device, trust_remote_code: bool = False):
    """The checkpoint at `path` as a one-output token classifier: its backbone, and a new value head
    (scaled to start near V = 0) unless the checkpoint already has one.

    Loading a causal LM this way leaves its LM head unused and the value head missing, which is the
    point, so transformers' table of missing/unexpected keys is not shown for it (`no_key_report`), nor its
    "Loading weights" bar: the keys come back through the documented `output_loading_info=True` instead, where any
    other missing or unused key is logged as a warning.
    """
    from transformers import AutoConfig, AutoModelForTokenClassification

    from oxrl.logging.quiet import no_key_report, no_progress_bars

    with no_key_report(), no_progress_bars():
        config = AutoConfig.from_pretrained(path, num_labels=1, trust_remote_code=trust_remote_code)
        # A token classifier puts dropout (0.1 unless the config says otherwise) before its head: a value model
        # trained with it would fit noisy values and score others than it trains, so it is off.
        config.classifier_dropout = 0.0
        critic, info = AutoModelForTokenClassification.from_pretrained(
            path, config=config, dtype=torch.float32, trust_remote_code=trust_remote_code, output_loading_info=True)
    backbone = critic.base_model_prefix + "."
    head = {name for name, _ in critic.named_parameters() if not name.startswith(backbone)}
    missing, unused = set(info["missing_keys"]), set(info["unexpected_keys"])
    strays = sorted(missing - head) + sorted(key for key in unused if key.startswith(backbone))
    if strays:
        logger.warning("critic %s: %d backbone weight(s) missing from or unused in the checkpoint: %s", path,
                       len(strays), ", ".join(strays[:10]) + (" ..." if len(strays) > 10 else ""))
    new_head = sorted(missing & head)
    if new_head:
        with torch.no_grad():  # start near V = 0 so early advantages are the rewards themselves
            for name, parameter in critic.named_parameters():
                if name in new_head and name.endswith("weight"):
                    parameter.mul_(0.01)
        logger.info("critic: %s with a new value head (%s), initialised near 0", path, ", ".join(new_head))
    else:
        logger.info("critic: %s with its own value head", path)
    return critic.to(device)
