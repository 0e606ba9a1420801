"""Built-in rollout engine on transformers `generate` (batched, KV cache), colocated with the trainer.

It samples from the training model object itself (`rl.rollout.precision: trainer`), so weights are always current
and `sync_weights` has nothing to copy; or from a bf16 copy of it (`bf16`, oxrl/rollout/bf16_copy.py) that
`sync_weights` overwrites after every update. Under FSDP2 or ZeRO-3 the model's weights are sharded and every
decoding step gathers them, a collective: `synced=True` keeps every rank decoding until the slowest rank's rows are
done (transformers' `synced_gpus`), so the ranks never deadlock.

The `n` samples of a prompt share its prefix: each prompt is run through the model once (its
KV cache), the cache is repeated n times, and `generate` continues from it, so prefill costs one
forward per prompt instead of n (27% of a GRPO step's generation for SmolLM2 at n = 8).

Sampling draws one uniform number per row (oxrl/rollout/sampling.py) instead of `generate`'s `torch.multinomial`,
which draws one per vocabulary entry: the same distribution, a sixth of a CPU decoding step less.

Rows that finished leave the batch: `generate` runs `ROUND_TOKENS` tokens at a time, and between rounds the finished
rows are dropped from the batch and from the KV cache (`batch_select_indices`), so a few long rows no longer keep
every finished one decoding to the longest. On 2 CPU cores the GRPO demo's 64 held-out prompts, decoded greedily by
the untrained model (rows of 41 tokens on average, up to 64), took 16.4 s in rounds against 20.0 s in one call, with
the same tokens; shorter rows save more (benchmarks/rows_leave.py, docs/benchmarks.md).

From the training model it computes in the trainer's precision (`autocast`, the strategy's: bf16 autocast where
`train.mixed_precision` says so), so the log-probs it reports are of the numbers the trainer recomputes; from the
bf16 copy the log-probs are the copy's, and the RL loop reports their gap to the trainer's every step.

Prompts with images (vision-language models) share the prefill too: the prefix forward takes each prompt's
image tensors once (laid out as the processor lays out a batch), so the image features are computed once per
prompt, and the cache holds them. For multimodal-RoPE models (Qwen-VL) oxRL computes every row's 3-D positions
itself (`padded_positions`, the model's own `get_rope_index`) and hands them to both the prefix forward and
`generate`, which extends them by one per new token; nothing rests on position offsets a model keeps from an
earlier call.

On CUDA the engine decodes from a static KV cache with each step compiled and replayed as a CUDA graph
(oxrl/rollout/static_decode.py, `rl.rollout.decode`): `generate`'s dynamic cache is launch-bound there. Rows do not
leave a static cache, so that path keeps every row to the end of the call; the CPU keeps `generate` and its rounds.

Weights that diverged (e.g. one update with far too high a learning rate) give inf/NaN logits;
sampling from them would fail deep inside `generate` ("probability tensor contains either inf,
nan or element < 0", a device-side assert on GPU) and greedy decoding would silently pick junk.
`FiniteLogits` checks every decoding step's scores first and raises `NonFiniteError` instead.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache, LogitsProcessor, LogitsProcessorList
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from oxrl.data.types import VisionInputs, batch_vision
from oxrl.models.model_inputs import cache_keyword, image_token_ids, padded_positions, rope_index_owner, token_type_inputs
from oxrl.training.nonfinite import HINT, NonFiniteError
from oxrl.rollout.base import Completion, SamplingParams
from oxrl.rollout.bf16_copy import bf16_copy, refresh
from oxrl.rollout.sampling import sampling_processors

if TYPE_CHECKING:
    from oxrl.rollout.static_decode import StaticDecoder

# Tokens a row decodes between checks for finished rows (a host sync; in `HFEngine._decode` also one `generate` call,
# in `StaticDecoder` one check of its finished flags): a finished row decodes at most this many steps past its end.
ROUND_TOKENS = 8


def rows_can_leave(cache) -> bool:
    """Whether rows can be dropped from `cache` (`batch_select_indices`): a dynamic cache of key/value layers only.
    A layer that also keeps other per-row state (linear attention, indexed chunks) would be cut wrongly."""
    return isinstance(cache, DynamicCache) and all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer)
                                                    for layer in cache.layers)


class FiniteLogits(LogitsProcessor):
    """Raises `NonFiniteError` when a row's next-token scores hold NaN or +inf, or are all -inf (masked
    tokens are -inf, which is fine while some token is left)."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        best = scores.amax(dim=-1)  # [B]; NaN when a row holds one, +inf or -inf in the other bad cases
        if not bool(torch.isfinite(best).all()):
            raise diverged()
        return scores


def diverged() -> NonFiniteError:
    """The error for logits that hold inf/NaN, raised where decoding finds them."""
    return NonFiniteError(f"the policy's next-token logits hold inf/NaN: its weights have diverged, so nothing can be "
                          f"sampled from them. Fix: {HINT}")


def static_decode_refusal(model, synced: bool) -> str | None:
    """Why `model` cannot decode from a static cache here, or None when it can."""
    if synced:
        return "sharded weights decode under `generate`'s synced_gpus, every rank each step"
    if image_token_ids(model):
        return "vision-language prompts carry images and positions of their own"
    if not rows_can_leave(DynamicCache(config=model.config)):
        return "the model's cache holds more than keys and values (linear attention, sliding windows)"
    return None


def static_decoder(model, decode: str, synced: bool) -> StaticDecoder | None:
    """`rl.rollout.decode` resolved for `model`: a `StaticDecoder` (`static`, `compiled`; `auto` on CUDA where it
    applies), or None for `generate`."""
    on_cuda = next(model.parameters()).device.type == "cuda"
    if decode == "generate" or (decode == "auto" and not on_cuda):
        return None
    refusal = static_decode_refusal(model, synced)
    if decode == "auto" and refusal is not None:
        return None
    if refusal is not None:
        raise ValueError(f"rl.rollout.decode={decode!r} cannot apply to {type(model).__name__}: {refusal}; "
                         "valid choices here: 'generate' or 'auto'")
    from oxrl.rollout.static_decode import StaticDecoder  # (static-cache decoding: loaded only where it runs)

    return StaticDecoder(decode != "static", ROUND_TOKENS)  # `compiled`, and `auto` on CUDA, compile the step


def eos_token_ids(model, tokenizer) -> set[int]:
    """Tokens that end a completion: the tokenizer's EOS and the model's generation-config EOS ids
    (chat models often end a turn with a token that is not the tokenizer's EOS)."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)  # an id, a list or None
    ids = {tokenizer.eos_token_id, *([configured] if isinstance(configured, int) else configured or [])}
    return {i for i in ids if i is not None}


class HFEngine:
    def __init__(self, model, tokenizer, max_batch_size: int = 64, synced: bool = False, autocast=nullcontext,
                 sample_in_bf16: bool = False, decode: str = "auto"):
        self.model = model
        self.static = static_decoder(model, decode, synced)  # None: `generate`
        self.synced = synced
        # `sample_in_bf16`: sample from a bf16 copy refreshed at every sync (oxrl/rollout/bf16_copy.py). Greedy
        # decoding (held-out accuracy) and, without the copy, sampling run on `model` itself under the trainer's
        # autocast (a context factory: `Strategy.autocast`), so held-out accuracy is the trained weights'.
        self.copy = bf16_copy(model) if sample_in_bf16 else None
        self.autocast = autocast
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)
        self.never_sampled = image_token_ids(model) or None  # a vision-language model's image tokens

    def network(self, params: SamplingParams):
        """What decodes with `params`, and the precision context it runs in: the bf16 copy samples (as it is), the
        training model decodes greedily and samples when there is no copy (under the trainer's autocast)."""
        if self.copy is not None and params.temperature > 0:
            return self.copy, nullcontext
        return self.model, self.autocast

    def sync_weights(self, model) -> dict[str, float]:
        if model is not self.model:
            raise ValueError("HFEngine samples from the training model itself; pass that same model object")
        if self.copy is not None:
            refresh(self.copy, model)
        return {}

    def probe_logprobs(self, ids: list[int]) -> torch.Tensor:
        """log p(ids[t] | ids[<t]) for t >= 1 under the model this engine samples from (oxrl/rollout/probe.py)."""
        from oxrl.rollout.probe import trainer_probe_logprobs  # (the weight-sync check's probe)

        return trainer_probe_logprobs(self.model if self.copy is None else self.copy, ids)

    def offload(self) -> None:
        """Nothing to free: the engine is the training model."""

    def close(self) -> None:
        """Nothing to release: the engine is the training model."""

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 vision: list[VisionInputs | None] | None = None) -> list[Completion]:
        per_call = max(1, self.max_batch_size // params.n)  # whole prompts (all n samples) per `generate` call
        vision = vision if vision is not None else [None] * len(prompts)
        out: list[Completion] = []
        model, precision = self.network(params)
        with precision():
            for start in range(0, len(prompts), per_call):
                out.extend(self._generate_batch(model, list(enumerate(prompts))[start : start + per_call], params, vision))
        return out

    @staticmethod
    def _positions(model, input_ids: torch.Tensor, attention: torch.Tensor, images: dict[str, torch.Tensor]):
        """The rows' [4, B, L] positions for a multimodal-RoPE model with images, else None (`generate`'s own)."""
        owner = rope_index_owner(model) if images else None
        return None if owner is None else padded_positions(owner, input_ids, attention, images.get("image_grid_thw"))

    def _generate_batch(self, model, prompts: list[tuple[int, list[int]]], params: SamplingParams,
                        vision: list[VisionInputs | None]) -> list[Completion]:
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        width = max(len(ids) for _, ids in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for row, (_, ids) in enumerate(prompts):  # left padding, so every row ends where generation starts
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            attention[row, width - len(ids) :] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        prompt_vision = [vision[index] for index, _ in prompts]
        images = {k: v.to(device) for k, v in batch_vision([None if v is None else v.tensors for v in prompt_vision]).items()}
        positions = self._positions(model, input_ids, attention, images)
        static = self.static is not None and not images  # a static cache prefills every row itself
        prefix = None if static else self._shared_prefix(model, input_ids, attention, params.n, images, positions)
        requests = [request for request in prompts for _ in range(params.n)]  # grouped by prompt
        input_ids, attention = input_ids.repeat_interleave(params.n, 0), attention.repeat_interleave(params.n, 0)
        extra = {} if positions is None else {"position_ids": positions.repeat_interleave(params.n, -2)}
        extra.update(token_type_inputs(model, input_ids))  # Gemma 3: its image tokens' two-way attention
        if prefix is None:  # (n = 1: the rows are the prompts) `generate` encodes the images itself
            extra.update(images)
        warpers = sampling_processors(params.temperature, params.top_k, params.top_p, params.allowed_token_ids)
        if static:
            new_tokens, token_logprobs = self.static.decode(model, input_ids, attention, params, warpers,
                                                            lambda rows: self._finished(list(rows), params), diverged)
        else:
            # Finished rows leave between rounds only for text rows of a plain KV cache on one process: image rows
            # carry positions and image inputs of their own length, and sharded weights need every rank decoding
            # every step.
            if prefix is None and not images and not self.synced:
                empty = DynamicCache(config=model.config)  # what `generate` would make, made here to check its layers
                prefix = empty if rows_can_leave(empty) else None
            rounds = not images and positions is None and not self.synced and rows_can_leave(prefix)
            new_tokens, token_logprobs = self._decode(model, input_ids, attention, prefix, params,
                                                      [FiniteLogits(), *warpers], extra, rounds)
        model.train(was_training)
        return [self._completion(index, ids, new_tokens[row], token_logprobs[row], params, vision[index])
                for row, (index, ids) in enumerate(requests)]

    def _decode(self, model, input_ids: torch.Tensor, attention: torch.Tensor, cache, params: SamplingParams,
                processors: list[LogitsProcessor], extra: dict[str, torch.Tensor],
                rounds: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's new tokens [B, L] (pad after its end) and their log-probs [B, L] (0 after it), from `generate`.

        With `rounds`, `generate` runs `ROUND_TOKENS` at a time and the rows that finished leave the batch (and the
        KV cache) before the next round: a batch decodes as many steps as its longest row, and on a CPU a step costs
        in proportion to its rows, so a few long rows no longer keep every finished one decoding. Greedy decoding
        gives exactly the tokens of one call; sampling draws from the same distributions."""
        rows = input_ids.shape[0]
        tokens: list[list[torch.Tensor]] = [[] for _ in range(rows)]
        logprobs: list[list[torch.Tensor]] = [[] for _ in range(rows)]
        alive = torch.arange(rows)
        scale = params.temperature if params.temperature > 0 else 1.0
        per_round = ROUND_TOKENS if rounds else params.max_new_tokens
        decoded = 0
        while decoded < params.max_new_tokens and alive.numel():
            budget = min(per_round, params.max_new_tokens - decoded)
            generated = model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                **{cache_keyword(model): cache},
                max_new_tokens=budget,
                # Sampling draws in `processors` (oxrl/rollout/sampling.py) and the greedy pick is the draw; the
                # model's own generation-config warpers are switched off so that none runs twice.
                do_sample=False, temperature=None, top_p=None, top_k=None,
                stop_strings=params.stop or None,
                tokenizer=self.tokenizer if params.stop else None,
                pad_token_id=self.pad_id,
                eos_token_id=sorted(self.eos_ids),
                output_logits=True,
                return_dict_in_generate=True,
                synced_gpus=self.synced,
                logits_processor=LogitsProcessorList(processors),
                suppress_tokens=self.never_sampled,
                **extra,
            )
            new = generated.sequences[:, input_ids.shape[1]:]  # [alive, <= budget]
            # Raw logits of each step -> log-prob of the drawn token under softmax(logits / T), one step at a time
            # where the logits are: no [B, L, V] stack, no copy of it to the CPU.
            new_logprobs = torch.stack([torch.log_softmax(step.float() / scale, -1).gather(-1, new[:, t, None])[:, 0]
                                        for t, step in enumerate(generated.logits)], dim=1)
            for position, row in enumerate(alive.tolist()):
                tokens[row].append(new[position].cpu())
                logprobs[row].append(new_logprobs[position].cpu())
            decoded += new.shape[1]
            if new.shape[1] < budget:  # `generate` stopped early: every row has finished
                break
            going = torch.nonzero(~self._finished([torch.cat(tokens[row]) for row in alive.tolist()], params))[:, 0]
            cache = getattr(generated, cache_keyword(model))
            cache.batch_select_indices(going.to(new.device))
            input_ids = generated.sequences[going]
            attention = torch.cat([attention, attention.new_ones(attention.shape[0], new.shape[1])], 1)[going]
            extra = token_type_inputs(model, input_ids)
            alive = alive[going]
            cache = self._next_round(model, input_ids, attention, cache, decoded)
        width = max(sum(piece.numel() for piece in row) for row in tokens)
        out_tokens = torch.full((rows, width), self.pad_id, dtype=torch.long)
        out_logprobs = torch.zeros(rows, width)
        for row in range(rows):
            ids, values = torch.cat(tokens[row]), torch.cat(logprobs[row])
            out_tokens[row, : ids.numel()], out_logprobs[row, : values.numel()] = ids, values
        return out_tokens, out_logprobs

    def _next_round(self, model, input_ids: torch.Tensor, attention: torch.Tensor, cache, decoded: int):
        """The cache the next round continues from, `decoded` tokens into the rows; None: `generate` prefills the rows
        anew (a seam: interruptible generation takes new weights here, oxrl/cluster/interruptible.py)."""
        return cache

    def _holds_stop(self, ids: list[int], stops: list[str]) -> bool:
        """Whether the text of `ids` holds one of `stops`."""
        return bool(stops) and any(stop in self.tokenizer.decode(ids) for stop in stops)

    def _stop_end(self, ids: list[int], stops: list[str]) -> int | None:
        """The length of the shortest prefix of `ids` whose text holds one of `stops` (None: none does)."""
        if not self._holds_stop(ids, stops):
            return None
        return next(end for end in range(1, len(ids) + 1) if self._holds_stop(ids[:end], stops))

    def _finished(self, rows: list[torch.Tensor], params: SamplingParams) -> torch.Tensor:
        """[B] whether each row's tokens so far end its completion: an EOS among them, or a stop string in its text
        (`generate` pads a row after its stop string, and one that ends a round is caught here)."""
        eos = torch.tensor(sorted(self.eos_ids))
        return torch.tensor([bool(torch.isin(ids, eos).any()) or self._holds_stop(ids.tolist(), params.stop)
                             for ids in rows], dtype=torch.bool)

    @staticmethod
    def _shared_prefix(model, input_ids: torch.Tensor, attention: torch.Tensor, n: int, images: dict[str, torch.Tensor],
                       positions: torch.Tensor | None):
        """The KV cache of every prompt but its last token (a prompt's last token is never an image's), computed once
        with the prompts' images and repeated n times (None when there is nothing to share); `generate` then runs only
        the last prompt token and the new ones."""
        if n == 1 or input_ids.shape[1] < 2:
            return None
        if positions is None:  # the positions `generate` gives left-padded rows (real tokens so far), so the cache matches
            positions = (attention.cumsum(-1) - 1).clamp(min=0)
        prefix = model(input_ids=input_ids[:, :-1], attention_mask=attention[:, :-1],
                            position_ids=positions[..., :-1], use_cache=True, logits_to_keep=1, **images,
                            **token_type_inputs(model, input_ids[:, :-1]))
        prefix = getattr(prefix, cache_keyword(model))
        prefix.batch_repeat_interleave(n)
        return prefix

    def _completion(self, index: int, prompt_ids: list[int], tokens: torch.Tensor, logprobs: torch.Tensor,
                    params: SamplingParams, vision: VisionInputs | None) -> Completion:
        ids = tokens.tolist()
        eos = next((position + 1 for position, token in enumerate(ids) if token in self.eos_ids), None)  # its end
        length, reason = (len(ids), "length") if eos is None else (eos, "eos")
        # A row ended by a stop string is padded while others finish, and the pad token may be an EOS token: the
        # stop string's end comes first, and nothing after it was sampled.
        stop_end = self._stop_end(ids[:length], params.stop)
        if stop_end is not None:
            length, reason = stop_end, "stop"
        ids = ids[:length]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(index, list(prompt_ids), ids, logprobs[: len(ids)].tolist(), reason, text, vision=vision)
