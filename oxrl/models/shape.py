"""A model's shape, read from its config alone: what the memory estimate needs, before any weight loads.

The parameter counts come from building the model on PyTorch's meta device (no memory, no weights), so
they are exact for every family transformers ships (tied embeddings, fused projections, MoE experts,
q/k norms) instead of a per-family formula that would drift. Any width is free there (a vocabulary of 10^9
is counted, not allocated); a layer is a Python object built in about a millisecond, so a config with more
than MAX_LAYERS layers, more than any released model, is refused rather than built.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


MAX_LAYERS = 1000  # decoder layers; the deepest released LLMs have about 130


class ModelTooLargeError(ValueError):
    """A model its device cannot hold, refused before anything is allocated (`model.allow_oversized` overrides)."""


@dataclass(frozen=True)
class Linear:
    """One kind of linear layer, summed over the model: e.g. every layer's `q_proj`."""

    name: str  # the module name's last part, as LoRA's target_modules names it
    in_features: int
    out_features: int
    count: int


@dataclass(frozen=True)
class ModelShape:
    model_type: str
    parameters: int  # all of them, a tied embedding counted once
    largest_layer_parameters: int  # one decoder layer: FSDP2 / ZeRO-3 gather one at a time
    outside_layers_parameters: int  # embeddings, final norm, output layer: FSDP2's root unit
    layers: int
    hidden: int
    mlp_width: int  # intermediate width a token passes through (MoE: routed experts per token + shared)
    attention_width: int  # heads x head_dim
    kv_width: int  # key/value heads x head_dim
    vocab: int
    context: int | None
    linears: tuple[Linear, ...]  # the decoder layers' nn.Linear modules (not the lm_head)
    expert_parameters: int = 0  # a mixture of experts' routed experts (tensor parallel keeps them whole)
    # (tp, why tensor parallel cannot split the model over tp ranks, or None) for tp = 2, 4, 8
    tensor_parallel: tuple[tuple[int, str | None], ...] = ()

    def tensor_parallel_refusal(self, tp: int) -> str | None:
        """Why strategy.mesh.tp = `tp` cannot split this model (None: it can, or `tp` was not checked)."""
        return dict(self.tensor_parallel).get(tp)

    @classmethod
    def from_config(cls, config, trust_remote_code: bool = False) -> "ModelShape":
        """From a transformers config of a causal LM (a vision-language config's `text_config` is not read here)."""
        from transformers import AutoModelForCausalLM

        if config.num_hidden_layers > MAX_LAYERS:
            raise ModelTooLargeError(
                f"its config has num_hidden_layers={config.num_hidden_layers:,}, more than the {MAX_LAYERS:,} oxRL "
                "counts (the deepest released models have about 130): a damaged config.json? (model.allow_oversized "
                "skips this check)")
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
        base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        layer_sizes = [sum(p.numel() for p in layer.parameters()) for layer in base.layers]
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        return cls(
            model_type=config.model_type,
            parameters=sum(p.numel() for p in model.parameters()),
            largest_layer_parameters=max(layer_sizes),
            outside_layers_parameters=sum(p.numel() for p in model.parameters()) - sum(layer_sizes),
            layers=config.num_hidden_layers,
            hidden=config.hidden_size,
            mlp_width=_mlp_width(config),
            attention_width=heads * head_dim,
            kv_width=kv_heads * head_dim,
            vocab=config.vocab_size,
            context=getattr(config, "max_position_embeddings", None),
            linears=_decoder_linears(base),
            expert_parameters=sum(p.numel() for name, p in model.named_parameters() if ".experts." in name),
            tensor_parallel=tuple((tp, tensor_parallel_refusal(config, tp)) for tp in (2, 4, 8)),
        )

    def lora_parameters(self, rank: int, target_modules: list[str] | str = "all-linear") -> int:
        """Trainable parameters of LoRA rank r: r x (in + out) for each adapted linear layer.
        `all-linear` is peft's meaning: every nn.Linear of the decoder, not the lm_head."""
        return sum(rank * (linear.in_features + linear.out_features) * linear.count
                   for linear in self.linears if target_modules == "all-linear" or linear.name in target_modules)


def _mlp_width(config) -> int:
    experts_per_token = getattr(config, "num_experts_per_tok", None)
    expert_width = getattr(config, "moe_intermediate_size", None)
    if experts_per_token and expert_width:
        return experts_per_token * expert_width + (getattr(config, "shared_expert_intermediate_size", None) or 0)
    return config.intermediate_size


def _decoder_linears(decoder) -> tuple[Linear, ...]:
    kinds: dict[tuple[str, int, int], int] = {}
    for name, module in decoder.named_modules():
        if isinstance(module, torch.nn.Linear):
            key = (name.rsplit(".", 1)[-1], module.in_features, module.out_features)
            kinds[key] = kinds.get(key, 0) + 1
    return tuple(Linear(name, fan_in, fan_out, count) for (name, fan_in, fan_out), count in kinds.items())


# The kinds of entry of transformers' `base_model_tp_plan` that oxrl/models/parallel.py splits.
SUPPORTED_STYLES = ("colwise", "rowwise", "colwise_gather_output", "rowwise_split_input", "replicated_with_grad_allreduce")
# The entry that marks a mixture of experts: its experts stay whole (replicated) on every tensor-parallel rank.
EXPERTS_STYLE = "moe_tp_experts"


def tensor_parallel_plan(config) -> tuple[dict[str, str], list[str]]:
    """The family's `base_model_tp_plan` as oxRL applies it: (the entries it splits, the experts it keeps whole).
    A mixture of experts' entries (the `moe_tp_experts` module and everything under it) are left out, so its experts
    are computed whole on every rank while attention is split."""
    plan = dict(getattr(config.get_text_config(), "base_model_tp_plan", None) or {})
    experts = [name for name, style in plan.items() if style == EXPERTS_STYLE]
    kept = {name: style for name, style in plan.items()
            if not any(name == root or name.startswith(root + ".") for root in experts)}
    return kept, experts


def tensor_parallel_refusal(config, tp: int) -> str | None:
    """Why a model of `config` cannot be split over `tp` ranks by oxrl/models/parallel.py (a sentence naming the
    constraint), or None. From the config alone, so the memory estimate and `oxrl recipe` know before anything
    loads."""
    text = config.get_text_config()
    plan, experts = tensor_parallel_plan(config)
    if not plan and not experts:
        return f"the {text.model_type!r} family declares no tensor-parallel plan (transformers' base_model_tp_plan)"
    others = sorted(f"{name}: {style}" for name, style in plan.items() if style not in SUPPORTED_STYLES)
    if others:
        return (f"the {text.model_type!r} plan has entries oxRL does not split ({', '.join(others)}; it splits "
                f"{', '.join(SUPPORTED_STYLES)})")
    sizes = {"num_attention_heads": getattr(text, "num_attention_heads", None),
             "num_key_value_heads": getattr(text, "num_key_value_heads", None) or getattr(text, "num_attention_heads", None),
             "intermediate_size": getattr(text, "intermediate_size", None), "vocab_size": getattr(text, "vocab_size", None)}
    uneven = [f"{key} = {value}" for key, value in sizes.items() if isinstance(value, int) and value % tp]
    if uneven:
        return f"{', '.join(uneven)} is not divisible by strategy.mesh.tp = {tp}"
    return None
