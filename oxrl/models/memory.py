"""Peak training memory per device, estimated from a model's shape before anything loads.

Everything is bytes on ONE device (a GPU, or the CPU's RAM), for the layout oxRL would really build:

    static   = weights + optimizer state [+ reference model] [+ autocast weight copies] [+ rollout copy]
    dynamic  = gradients + activations + logits
    peak     = static + dynamic                                   (no colocated vLLM)
             = static + max(dynamic, vLLM share)                  (vLLM colocated and asleep while training)

with P parameters, L trainable LoRA parameters, b bytes per parameter (the model dtype), D devices
sharding the states (FSDP2 and ZeRO-3 shard weights, gradients and optimizer state; ZeRO-2 all but the
weights; `single` shards nothing):

- weights: P*b / D, plus under FSDP2/ZeRO-3 two gathered decoder layers (the one computing and the one
  prefetched) and the parameters outside the layers (embeddings, final norm, output layer) in the compute
  dtype: FSDP2 keeps that root unit gathered from the forward to the end of the backward, and ZeRO-3 gathers
  the output layer at the peak, where the logits are computed (for ZeRO-3 this term is an upper bound).
  LoRA adds L*b.
- gradients: P*b / D (full fine-tune), L*b (LoRA). Counted in full: with gradient accumulation the
  second micro-batch's backward starts with every gradient of the first already held.
- optimizer: AdamW's two moments in the parameter dtype, 2*P*b / D (torch AdamW keeps them in the
  parameter's dtype); DeepSpeed's bf16 optimizer keeps fp32 master weights and moments, 12*P / D
  (arXiv 1910.02054, Sec. 3.1). LoRA: 2*L*b.
- autocast weight copies: bf16 autocast over fp32 weights caches one bf16 copy of every weight that
  requires grad for the forward and backward, 2*P (full fine-tune, unsharded strategies).
- activations: what autograd keeps per token of one decoder layer (Llama-style block with RMSNorm,
  rotary embedding, SDPA and a gated MLP), in elements: each of the two norms keeps its input, the
  normalised input and the weighted output (3h, the last cast to the compute dtype under autocast);
  attention keeps the rotated queries, keys, values, its output and the output projection's input
  (3*Hd + 2*KVd); the gated MLP keeps the gate, the activation, the up projection and their product
  (4*I). Norms are fp32 whatever the autocast (transformers' RMSNorm upcasts); the rest is in the
  compute dtype. Times tokens x layers; with gradient checkpointing, each layer's input (h per token)
  plus one layer recomputed in full.
- logits: only the positions that predict a trained token reach the lm_head (oxRL's `logits_to_keep`);
  per such token and vocabulary entry: the fp32 log-softmax cross-entropy keeps, and in backward the
  gradient of the logits and the chunk being added into it, in the compute dtype: 4 + 2 x compute bytes
  (the bf16 logits are not kept, and their fp32 copy lives one chunk at a time). Above
  FULL_LOGITS_ELEMENTS trained tokens x vocabulary the logits are never whole (oxrl/models/lm_head.py):
  the kept hidden states (tokens x h x compute) and one checkpointed chunk of CHUNK_ELEMENTS logits, which
  holds them in the compute dtype and as fp32 log-softmax, its exponential and their gradients at once
  (16 + 2 x compute bytes each).
- attention mask: on CUDA oxRL's packed kernel gives way to transformers' sdpa, which is handed a dense
  [T, T] mask for a packed row of T tokens; the memory-efficient kernel keeps it as a compute-dtype bias
  in every layer: compute x T^2 x layers (one layer under checkpointing), plus the boolean mask, T^2.
  Measured on an H100 (docs/models.md); on CPU the packed kernel runs each sequence alone, with no mask.
- tensor parallel (`strategy.mesh.tp`, t ranks split each layer): the states stay P*b / D per rank (FSDP2 shards
  over D / t ranks what tensor parallel has split t ways), but for a mixture of experts' E expert parameters, which
  stay whole on each tensor-parallel rank: (P + E (t - 1)) * b / D; the gathered layers and root unit are 1/t of theirs,
  attention and MLP activations 1/t (the norms' stay whole: no sequence parallel), and the logits are never whole
  (the chunked term below, on each rank's vocabulary slice).
- context parallel (`strategy.mesh.cp`, c ranks split each row): activations and logits of T / c tokens, plus in each
  layer autograd keeps (one layer under checkpointing) the keys and values gathered for the whole row and the copy
  each run of queries attends to, 4 x T x KVd / t in the compute dtype.
- reference model: P*b for the objectives that need one, except under LoRA (the reference is the
  base model with the adapters switched off: no second copy). FSDP2 shards it like the policy, P*b / D,
  and keeps its root unit gathered after its first forward (in b); DeepSpeed keeps it whole on every rank.
- critic (PPO with a separate critic): a full fine-tune's weights, gradients and AdamW moments of a model
  of the same shape, 4*P*b / D; its activations come at another time than the policy's.
- rollout copy: the `hf` engine's bf16 copy of the policy (`rl.rollout.precision`), 2*P.
- vLLM share: `gpu_memory_utilization` x the device's memory, the pool vLLM claims for its weights and
  KV cache when colocated; asleep (`sleep_between_phases`) it frees it while the trainer runs.

The formula leaves out the framework itself (CUDA context and kernels, ~0.5-1 GiB per GPU; the Python
process and its libraries on CPU) and allocator fragmentation; `fits` keeps a margin for them.
tests/integration/test_memory.py measures SmolLM2-135M's real peak on the CPU against it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from oxrl.models.lm_head import CHUNK_ELEMENTS, FULL_LOGITS_ELEMENTS
from oxrl.models.hardware import Devices
from oxrl.models.shape import ModelShape, ModelTooLargeError

GIB = 1024**3
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
SHARDING_STRATEGIES = ("fsdp2", "deepspeed")


def weights_sharded(strategy: str, zero_stage: int | None) -> bool:
    """Whether `strategy` keeps only a shard of the weights on each rank (FSDP2, ZeRO-3), gathering them per layer
    (`zero_stage`: deepspeed's; None for another strategy)."""
    return strategy == "fsdp2" or (strategy == "deepspeed" and zero_stage == 3)


@dataclass(frozen=True)
class TrainingPlan:
    """What the run will do, in the terms the estimate needs (built from a Config by `oxrl.models.fit.training_plan`)."""

    tokens_per_micro_batch: int  # packed tokens of one forward pass on one device
    logit_tokens: int | None = None  # positions that reach the lm_head (trained tokens); None: all of them
    dtype: str = "float32"  # parameter dtype
    bf16_autocast: bool = False
    strategy: str = "single"  # single | fsdp2 | deepspeed
    zero_stage: int = 3
    devices: int = 1  # ranks sharding the states
    cpu_offload: bool = False
    gradient_checkpointing: bool = False
    lora: bool = False
    lora_rank: int = 16
    lora_targets: tuple[str, ...] | str = "all-linear"
    reference: bool = False  # a frozen reference model (DPO family, KL-regularised RL)
    critic: bool = False  # PPO's separate critic: a second trained copy of the model
    dense_attention_mask: bool = False  # CUDA sdpa over packed rows (module docstring)
    vllm_share_bytes: int = 0  # memory a colocated vLLM claims on the device
    vllm_sleeps: bool = True
    rollout_copy: bool = False  # the `hf` engine samples from a bf16 copy of the policy (rl.rollout.precision)
    tp: int = 1  # tensor-parallel ranks (strategy.mesh.tp)
    cp: int = 1  # context-parallel ranks (strategy.mesh.cp)


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int
    gradients: int
    optimizer: int
    autocast_copies: int
    activations: int
    logits: int
    reference: int
    critic: int
    vllm: int
    vllm_sleeps: bool = True
    rollout_copy: int = 0

    @property
    def static(self) -> int:
        return self.weights + self.optimizer + self.reference + self.critic + self.autocast_copies + self.rollout_copy

    @property
    def dynamic(self) -> int:
        return self.gradients + self.activations + self.logits

    @property
    def total(self) -> int:
        if self.vllm_sleeps:
            return self.static + max(self.dynamic, self.vllm)
        return self.static + self.dynamic + self.vllm

    def lines(self) -> list[str]:
        parts = [f"{field.name} {gib(getattr(self, field.name))}" for field in fields(self)
                 if field.name != "vllm_sleeps" and getattr(self, field.name)]
        return [f"peak {gib(self.total)} per device: " + ", ".join(parts)]


def gib(size: float) -> str:
    return f"{size / GIB:.2f} GiB"


def refuse_oversized(needed: int, devices: Devices, what: str, remedies: str) -> None:
    """A ModelTooLargeError when `needed` bytes are more than one of `devices` has. The message is `what` (the
    model and what needs the bytes, e.g. "m: its weights take"), the size, the device's, and `remedies`."""
    if needed > devices.total:
        device = "the RAM available now" if devices.kind == "cpu" else f"one {devices.name}"
        raise ModelTooLargeError(
            f"{what} {gib(needed)}, more than the {gib(devices.total)} of {device}: refused before anything was "
            f"allocated. {remedies}, or set model.allow_oversized: true to load it anyway")


def estimate_memory(shape: ModelShape, plan: TrainingPlan) -> MemoryEstimate:
    """Peak bytes on one device for `plan` (the module docstring derives each term)."""
    b = BYTES[plan.dtype]
    compute = 2 if plan.bf16_autocast or plan.dtype != "float32" else 4
    sharded = plan.strategy in SHARDING_STRATEGIES and plan.devices > 1
    shards = plan.devices if sharded else 1
    weight_shards = shards if weights_sharded(plan.strategy, plan.zero_stage) else 1
    deepspeed_bf16 = plan.strategy == "deepspeed" and plan.bf16_autocast

    # Under tensor parallel a mixture of experts' experts stay whole on each of the t ranks: FSDP2 alone shards them.
    held = shape.parameters + shape.expert_parameters * (plan.tp - 1)
    weights = held * b // weight_shards
    if weight_shards > 1:
        weights += (2 * shape.largest_layer_parameters + shape.outside_layers_parameters) * compute // plan.tp
    if plan.lora:
        trainable = shape.lora_parameters(plan.lora_rank, plan.lora_targets)
        weights += trainable * b
        gradients, optimizer = trainable * b, 2 * trainable * b
    elif deepspeed_bf16:
        gradients, optimizer = shape.parameters * 2 // shards, 12 * shape.parameters // shards
    else:
        gradients, optimizer = held * b // shards, 2 * held * b // shards
    if plan.cpu_offload and sharded:
        weights -= held * b // weight_shards  # on the host; the gathered layers stay
        gradients, optimizer = 0, 0
    autocast_copies = 2 * shape.parameters if plan.bf16_autocast and b == 4 and not plan.lora and not sharded else 0
    reference = 0
    if plan.reference and not plan.lora:
        fsdp2 = plan.strategy == "fsdp2" and sharded
        reference = shape.parameters * b // shards + shape.outside_layers_parameters * b if fsdp2 else shape.parameters * b
    critic = shape.parameters * b * 4 // shards if plan.critic else 0
    return MemoryEstimate(
        weights=weights, gradients=gradients, optimizer=optimizer, autocast_copies=autocast_copies,
        activations=activation_bytes(shape, plan, compute), logits=logit_bytes(shape, plan, compute),
        reference=reference, critic=critic, vllm=plan.vllm_share_bytes, vllm_sleeps=plan.vllm_sleeps,
        rollout_copy=2 * shape.parameters if plan.rollout_copy else 0)


def layer_activation_bytes(shape: ModelShape, compute: int, tp: int = 1) -> int:
    """Bytes autograd keeps per token in one decoder layer (module docstring), on one of `tp` tensor-parallel ranks."""
    norms = 2 * (2 * 4 + compute) * shape.hidden
    attention = (3 * shape.attention_width + 2 * shape.kv_width) * compute // tp
    mlp = 4 * shape.mlp_width * compute // tp
    return norms + attention + mlp


def activation_bytes(shape: ModelShape, plan: TrainingPlan, compute: int) -> int:
    tokens = -(-plan.tokens_per_micro_batch // plan.cp)  # this rank's share of the row
    kept_layers = 1 if plan.gradient_checkpointing else shape.layers
    mask = tokens * tokens * (compute * kept_layers + 1) if plan.dense_attention_mask else 0
    per_layer = layer_activation_bytes(shape, compute, plan.tp)
    gathered = 4 * plan.tokens_per_micro_batch * shape.kv_width // plan.tp * compute * kept_layers if plan.cp > 1 else 0
    if plan.gradient_checkpointing:
        residual = 4 if plan.dtype == "float32" else 2  # the stream between layers, in the parameter dtype
        return tokens * (shape.layers * shape.hidden * residual + per_layer) + mask + gathered
    return tokens * shape.layers * per_layer + mask + gathered


def logit_bytes(shape: ModelShape, plan: TrainingPlan, compute: int) -> int:
    tokens = plan.tokens_per_micro_batch if plan.logit_tokens is None else plan.logit_tokens
    tokens = -(-tokens // plan.cp)
    if tokens * shape.vocab > FULL_LOGITS_ELEMENTS or plan.tp * plan.cp > 1:  # chunked through the output layer
        return tokens * shape.hidden * compute + CHUNK_ELEMENTS * (16 + 2 * compute)
    return tokens * shape.vocab * (4 + 2 * compute)
