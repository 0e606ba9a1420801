"""`reward_model`: a trained reward model's score of each completion, as in RLHF (Ouyang et al., "Training
language models to follow instructions with human feedback", arXiv:2203.02155, section 3.5: the policy is
optimised with PPO against the scalar output of a reward model trained on human comparisons).

    rl:
      rewards:
        - name: reward_model
          kwargs: {path: runs/my-rm/final, device: cuda:1, batch_size: 16, normalize: true}

The reward model is any one-output sequence classifier: oxRL's own (`algorithm.name: rm` saves one as
the HF folder `<run>/final`, see `oxrl.models.reward_model`) or a Hugging Face reward model. What it
scores is the conversation `[user: prompt, assistant: completion]` rendered through the REWARD MODEL's
chat template (no generation prompt), tokenized without adding special tokens (the template writes
them), exactly as oxRL trains a reward model on chat rows. Without a chat template it scores
`prompt + completion`, with the tokenizer's special tokens and an eos appended, as oxRL trains one on
plain rows. The reward model's tokenizer is used, never the policy's: they may differ.

Conversations are scored `batch_size` at a time in right-padded batches; the model pools at each
row's last token that is not the pad token (transformers' own pooling), so padding does not change a
score. The config's `pad_token_id` is set when it has none (the tokenizer's pad token, else eos).

kwargs (all but `path` optional):

- `path`: a folder or hub id of the reward model (its tokenizer must be there too);
- `device`: `auto` (cuda when available, else cpu), `cpu`, `cuda`, `cuda:1`, ...: the reward model's own
  device, apart from the policy's;
- `dtype`: `auto` (bfloat16 on cuda, float32 on cpu), `float32` or `bfloat16`;
- `batch_size` (16): conversations per forward pass;
- `max_length` (null: the model's `max_position_embeddings`): a longer conversation is an ERROR naming
  the sample, not truncated: a score of a cut conversation is the score of another conversation. With
  `rl.on_reward_error: zero` such a sample scores 0 and is counted instead (the batch is then scored one
  sample at a time, so with `normalize` each is standardised alone: that step's samples all score 0);
- `normalize` (false): standardise the batch's scores, (s - mean) / (std + 1e-6) with the population
  std; a batch is one RL step's completions (reward models' scales are arbitrary, a fixed weight
  of the raw score is not);
- `trust_remote_code` (false): run the model repository's own code.

The model and tokenizer load once per process and setting (`_load_scorer` is cached); `preflight`
checks the kwargs and loads them when the reward is built, so a wrong path or a folder that holds no
sequence classifier stops the run before the policy loads.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oxrl.rewards.base import batched

logger = logging.getLogger(__name__)

DTYPE_CHOICES = ("auto", "float32", "bfloat16")
NORMALIZE_EPS = 1e-6
WHAT = "reward 'reward_model'"


@batched
def reward_model_reward(
    prompts: list[str],
    completions: list[str],
    *,
    path: str,
    device: str = "auto",
    dtype: str = "auto",
    batch_size: int = 16,
    max_length: int | None = None,
    normalize: bool = False,
    trust_remote_code: bool = False,
) -> list[float]:
    scorer = _scorer(path, device, dtype, trust_remote_code)
    scores = scorer.scores([scorer.encode(p, c) for p, c in zip(prompts, completions)], batch_size,
                           max_length or scorer.max_positions)
    return standardised(scores) if normalize else scores


def check_reward_model_reward(**kwargs: Any) -> None:
    """`reward_model_reward.preflight`: check the kwargs and load the model, before the policy loads."""
    path = kwargs.get("path")
    if not isinstance(path, str) or not path:
        raise ValueError(f"{WHAT} needs `path`, the folder or hub id of a one-output sequence classifier; got {path!r}")
    from oxrl.config.run_outputs import missing_run_output

    missing = missing_run_output("rl.rewards: reward_model's kwargs.path", path)  # an `rm` run not yet trained here
    if missing is not None:
        raise ValueError(missing)
    if kwargs.get("dtype", "auto") not in DTYPE_CHOICES:
        raise ValueError(f"{WHAT}: dtype must be one of {DTYPE_CHOICES}, got {kwargs['dtype']!r}")
    batch_size, max_length = kwargs.get("batch_size", 16), kwargs.get("max_length")
    if not _is_count(batch_size):
        raise ValueError(f"{WHAT}: batch_size must be a positive integer, got {batch_size!r}")
    if max_length is not None and not _is_count(max_length):  # null: the model's context
        raise ValueError(f"{WHAT}: max_length must be a positive integer or null, got {max_length!r}")
    for name in ("normalize", "trust_remote_code"):
        if not isinstance(kwargs.get(name, False), bool):
            raise ValueError(f"{WHAT}: {name} must be true or false, got {kwargs[name]!r}")
    _scorer(path, kwargs.get("device", "auto"), kwargs.get("dtype", "auto"), kwargs.get("trust_remote_code", False))


reward_model_reward.preflight = check_reward_model_reward  # type: ignore[attr-defined]


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def standardised(scores: list[float]) -> list[float]:
    """(s - mean) / (std + 1e-6) over the batch, std the population one (a batch of one scores 0)."""
    mean = sum(scores) / len(scores)
    std = (sum((s - mean) ** 2 for s in scores) / len(scores)) ** 0.5
    return [(s - mean) / (std + NORMALIZE_EPS) for s in scores]


@dataclass
class _Scorer:
    """A loaded reward model and its tokenizer."""

    model: Any  # a transformers *ForSequenceClassification, eval mode
    tokenizer: Any
    device: Any  # torch.device
    pad_token_id: int
    max_positions: int | None  # the model's context, the default `max_length`
    path: str

    def encode(self, prompt: str, completion: str) -> list[int]:
        """Token ids of the conversation as the reward model reads it (module docstring)."""
        if self.tokenizer.chat_template:
            conversation = [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
            text = self.tokenizer.apply_chat_template(conversation, tokenize=False)
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        ids = list(self.tokenizer(prompt + completion)["input_ids"])
        eos = self.tokenizer.eos_token_id
        return ids if eos is None or (ids and ids[-1] == eos) else ids + [eos]

    def scores(self, sequences: list[list[int]], batch_size: int, max_length: int | None) -> list[float]:
        import torch

        too_long = [(i, len(ids)) for i, ids in enumerate(sequences) if max_length is not None and len(ids) > max_length]
        if too_long:
            index, length = too_long[0]
            raise ValueError(f"{WHAT}: {len(too_long)} of {len(sequences)} conversations are longer than max_length "
                             f"{max_length} tokens of {self.path!r} (sample {index + 1}: {length}); conversations are "
                             "not truncated: raise max_length up to the model's context, or shorten prompts/completions")
        out: list[float] = []
        with torch.inference_mode():
            for start in range(0, len(sequences), batch_size):
                chunk = sequences[start:start + batch_size]
                longest = max(len(ids) for ids in chunk)
                input_ids = torch.full((len(chunk), longest), self.pad_token_id, dtype=torch.long)
                attention_mask = torch.zeros_like(input_ids)
                for row, ids in enumerate(chunk):  # right padding
                    input_ids[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
                    attention_mask[row, :len(ids)] = 1
                logits = self.model(input_ids=input_ids.to(self.device),
                                    attention_mask=attention_mask.to(self.device)).logits  # [B, 1]
                out.extend(logits[:, 0].float().cpu().tolist())
        return out


def _scorer(path: str, device: str, dtype: str, trust_remote_code: bool) -> _Scorer:
    """The cached scorer of these settings (`auto` resolved first, so `auto` and `cuda` share one model)."""
    from oxrl.models.source import ModelNotFoundError

    local = Path(path).expanduser()
    key_path = str(local.resolve()) if local.exists() else path
    try:
        return _load_scorer(key_path, str(_resolve_device(device)), dtype, trust_remote_code)
    except ModelNotFoundError as error:
        raise ModelNotFoundError(f"{WHAT}: {error}") from error


def _resolve_device(name: str):
    """The torch device `name` means (`auto`: cuda, the process's current one, when available, else cpu)."""
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"{WHAT}: device must be auto, cpu, cuda or cuda:N, got {name!r}") from error
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            raise ValueError(f"{WHAT}: device {name!r} asked for, but this machine has {count} CUDA device(s)")
    elif device.type != "cpu":
        raise ValueError(f"{WHAT}: device must be auto, cpu, cuda or cuda:N, got {name!r}")
    return device


@functools.lru_cache(maxsize=2)
def _load_scorer(path: str, device_name: str, dtype: str, trust_remote_code: bool) -> _Scorer:
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    from oxrl.models.load import resolve_dtype
    from oxrl.models.source import from_pretrained_or_explain, resolve_source

    device = torch.device(device_name)
    source = resolve_source(path)
    if source.gguf_file:
        raise ValueError(f"{WHAT}: {path!r} is a GGUF file; a reward model must be a sequence classifier folder or hub id")
    config = from_pretrained_or_explain(AutoConfig, source, "reward model", trust_remote_code=trust_remote_code)
    classifiers = [name for name in (config.architectures or []) if name.endswith("ForSequenceClassification")]
    if not classifiers or config.num_labels != 1:
        raise ValueError(
            f"{WHAT}: {path!r} is not a one-output sequence classifier (architectures {config.architectures}, "
            f"num_labels {config.num_labels}): train one with `algorithm.name: rm` (its `<run>/final`) or name a "
            "Hugging Face reward model")
    model, info = from_pretrained_or_explain(
        AutoModelForSequenceClassification, source, "reward model", dtype=resolve_dtype(dtype, device),
        trust_remote_code=trust_remote_code, use_safetensors=True, output_loading_info=True)
    fresh = [key for key in info["missing_keys"] if "score" in key or "classifier" in key]
    if fresh:  # the head was not in the checkpoint: transformers made a random one
        raise ValueError(f"{WHAT}: {path!r} holds no trained classification head (missing {fresh}); a random head "
                         "would score at random")
    tokenizer = from_pretrained_or_explain(AutoTokenizer, source, "reward model tokenizer",
                                           trust_remote_code=trust_remote_code)
    pad = next((t for t in (model.config.pad_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id) if t is not None), None)
    if pad is None:
        raise ValueError(f"{WHAT}: {path!r} has no pad, and no eos, token id to pad batches with and pool scores at")
    model.config.pad_token_id = pad  # transformers pools at the last token that is not this one
    model.to(device).eval()
    logger.info("reward model %s loaded on %s (%s, %.1fM parameters, pad id %d, %s)", path, device,
                next(model.parameters()).dtype, sum(p.numel() for p in model.parameters()) / 1e6, pad,
                "its chat template" if tokenizer.chat_template else "no chat template: prompt + completion")
    return _Scorer(model, tokenizer, device, pad, getattr(model.config, "max_position_embeddings", None), path)
