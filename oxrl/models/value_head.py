"""PPO's shared-backbone critic (`rl.critic_backbone: shared`): a value head on the policy's own causal LM.

The head is a `torch.nn.Linear(hidden_size, 1)` set as the submodule `value_head` of the causal LM (plain
attribute assignment on the instance, no transformers code patched), so the policy's optimizer, strategy and
checkpoints carry it like any other parameter. It reads the final hidden state, the one the LM head reads:
`output_hidden_states=True` -> `hidden_states[-1]`, which transformers gives AFTER the final norm (checked
for Llama in transformers 5.x by tests/integration/test_shared_value_head.py: it equals the backbone's
`last_hidden_state` and the LM head on it gives the logits). The values are computed in the same forward
as the log-probs (`oxrl.models.logprobs.token_logprobs(value_head=...)`).

The head is not part of the Hugging Face architecture: `save_hf_folder` writes it beside the causal LM as
`value_head.safetensors` (keys `value_head.weight`, `value_head.bias`), so the folder loads in plain
transformers without an unexpected key, and a checkpoint's weight files restore it exactly.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from oxrl.models.load import is_peft

logger = logging.getLogger(__name__)
VALUE_HEAD = "value_head"  # the submodule's name, and the prefix of its keys
VALUE_HEAD_FILE = "value_head.safetensors"


class ValueHead(torch.nn.Linear):
    """Final hidden states [N, H] -> values [N], in fp32 whatever the autocast: value targets differ in
    digits that bf16 drops, and the head is one dot product per token."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        with torch.autocast(hidden.device.type, enabled=False):
            return super().forward(hidden.float()).squeeze(-1)


def causal_lm(model) -> torch.nn.Module:
    """The transformers causal LM itself (under a peft wrapper, its base model): the head's owner."""
    return model.get_base_model() if is_peft(model) else model


def attach_value_head(model, saved_from: str | Path | None = None) -> ValueHead:
    """Set a fp32 value head on `model` as `value_head` and return it: the one saved in `saved_from`
    (a folder holding `value_head.safetensors`) when there is one, else a new head near V = 0
    (weights N(0, initializer_range) x 0.01, bias 0: as `oxrl.models.critic.load_critic` starts a new
    head), so that early advantages are the rewards themselves."""
    lm = causal_lm(model)
    config = lm.config.get_text_config()  # (a multimodal model's language model's)
    device = next(lm.parameters()).device
    head = ValueHead(config.hidden_size, 1, device=device, dtype=torch.float32)
    saved = Path(saved_from) / VALUE_HEAD_FILE if saved_from is not None else None
    if saved is not None and saved.is_file():
        state = load_file(saved)
        head.load_state_dict({key.removeprefix(VALUE_HEAD + "."): value for key, value in state.items()})
        logger.info("shared value head: loaded from %s", saved)
    else:
        with torch.no_grad():
            head.weight.normal_(0.0, 0.01 * getattr(config, "initializer_range", 0.02))
            head.bias.zero_()
        logger.info("shared value head: new, initialised near 0")
    setattr(lm, VALUE_HEAD, head)  # a registered submodule: in parameters(), state_dict() and the optimizer
    return head


def value_head_of(model) -> ValueHead | None:
    return getattr(causal_lm(model), VALUE_HEAD, None)


def without_value_head(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A causal LM's state dict without the value head's keys: the Hugging Face architecture's own."""
    return {key: value for key, value in state.items() if not key.startswith(VALUE_HEAD + ".")}


def write_value_head(head: ValueHead, folder: str | Path) -> None:
    """`folder/value_head.safetensors`, under the keys the head has in the causal LM's state dict."""
    save_file({f"{VALUE_HEAD}.{key}": value.detach().cpu().contiguous() for key, value in head.state_dict().items()},
              Path(folder) / VALUE_HEAD_FILE)
