"""The data contract between `oxrl.data` and the training loops.

A row of a dataset becomes one `Example`: one or more token `Sequence`s that must be trained
together (SFT/CPT: one; a preference pair: chosen then rejected). Micro-batches are
`PackedBatch`es: several whole examples laid end to end in a single row, padding-free, with
position ids restarting at 0 for each sequence (the rotary positions) and each sequence's place in the row
(`Segment`), which oxRL's packed attention kernel reads so that attention stays within a sequence
(transformers' own sdpa and eager instead derive a block-diagonal mask from the position ids).

A sequence of a vision-language row also carries its images (`VisionInputs`): the decoded images and the
model processor's tensors for them. Packing concatenates those of every sequence in the row, in order, the
way the model's processor would for several images of one prompt (`concat_vision`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class VisionInputs:
    """A prompt's images: decoded (what vLLM takes) and as the model's processor made them (what the model takes:
    `pixel_values` and, by family, `image_grid_thw` or `pixel_attention_mask`). The sequence's `input_ids` already
    hold the image tokens the processor expanded each placeholder into."""

    images: list  # PIL images, in placeholder order
    tensors: dict[str, torch.Tensor]

    # Processor outputs that are per token (the ids, and what a model recomputes from them), not image tensors.
    TOKEN_OUTPUTS = ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids")

    @classmethod
    def from_processor(cls, images: list, encoded) -> VisionInputs:
        """The images and the image tensors of one prompt's processor output."""
        return cls(images, {key: value for key, value in encoded.items() if key not in cls.TOKEN_OUTPUTS})

    @classmethod
    def expand(cls, processor, text: str, images: list) -> tuple[list[int], VisionInputs]:
        """`text`'s ids with each image placeholder expanded by the processor into its image's tokens, and the images
        with the processor's tensors for them."""
        encoded = processor(text=[text], images=[images], add_special_tokens=False, return_tensors="pt")
        return encoded["input_ids"][0].tolist(), cls.from_processor(images, encoded)


# Processor outputs laid out [batch, images, ...] (Idefics3 / SmolVLM); every other image tensor is laid out
# [images or patches, ...] (Qwen2-VL's flat patches and `image_grid_thw`, LLaVA's and Gemma 3's `pixel_values`).
_BATCH_FIRST_NDIM = {"pixel_values": 5, "pixel_attention_mask": 4}


def concat_vision(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The image tensors of several sequences as the processor lays out one prompt with all their images."""
    if not parts:
        return {}
    out = {}
    for key in parts[0]:
        tensors = [part[key] for part in parts]
        dim = 1 if tensors[0].ndim == _BATCH_FIRST_NDIM.get(key) else 0
        out[key] = torch.cat(tensors, dim=dim)
    return out


def batch_vision(parts: list[dict[str, torch.Tensor] | None]) -> dict[str, torch.Tensor]:
    """The image tensors of a padded batch, one row per part (None: a row without images), as the processor lays
    out a batch: flat tensors concatenated; [batch, images, ...] tensors padded with all-zero images (which the
    model drops) to the row with the most."""
    present = [part for part in parts if part is not None]
    if not present:
        return {}
    out = {}
    for key, first in present[0].items():
        if first.ndim != _BATCH_FIRST_NDIM.get(key):
            out[key] = torch.cat([part[key] for part in present])
            continue
        most = max(part[key].shape[1] for part in present)
        rows = first.new_zeros(len(parts), most, *first.shape[2:])
        for row, part in enumerate(parts):
            if part is not None:
                rows[row, : part[key].shape[1]] = part[key][0]
        out[key] = rows
    return out


@dataclass
class Sequence:
    input_ids: list[int]
    # loss_mask[t] is True when token t is trained, i.e. predicted from tokens < t. The first
    # token of a sequence has no prediction and is always False.
    loss_mask: list[bool]
    vision: VisionInputs | None = None  # a vision-language sequence's images

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.loss_mask):
            raise ValueError(f"input_ids ({len(self.input_ids)}) and loss_mask ({len(self.loss_mask)}) differ in length")
        if self.loss_mask and self.loss_mask[0]:
            raise ValueError("the first token of a sequence cannot be trained: nothing predicts it")

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class Example:
    sequences: list[Sequence]
    # Per-example scalars an objective needs (e.g. KTO's `label`); the same keys for every
    # example of a dataset.
    fields: dict[str, float] = field(default_factory=dict)
    source: str = ""  # dataset name, for counts and error messages
    row: int = -1  # row number in its source file (1-based)

    @property
    def num_tokens(self) -> int:
        return sum(len(s) for s in self.sequences)

    @property
    def num_loss_tokens(self) -> int:
        return sum(sum(s.loss_mask) for s in self.sequences)


@dataclass(frozen=True)
class Segment:
    """Where one sequence of a packed row lies: `length` tokens from row position `start`. A continuation
    (`pack(share_prefixes=True)`) also reads the first `shared` tokens of the sequence laid at row position `root`,
    the prefix it shares; attention kernels take the row's boundaries from these, never from its position ids."""

    start: int
    length: int
    shared: int = 0
    root: int = 0


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # [1, T] long
    position_ids: torch.Tensor  # [1, T] long, restarting at 0 for each sequence
    loss_mask: torch.Tensor  # [1, T] bool
    seq_index: torch.Tensor  # [T] long: index of the sequence each token belongs to
    seq_example: torch.Tensor  # [S] long: index of the example each sequence belongs to
    seq_role: torch.Tensor  # [S] long: position of the sequence inside its example (0 = chosen, 1 = rejected)
    fields: dict[str, torch.Tensor]  # per-example tensors [E]
    num_examples: int
    segments: tuple[Segment, ...]  # each sequence's place in the row, in row order (the packer's own boundaries)
    vision: dict[str, torch.Tensor] = field(default_factory=dict)  # image tensors of the row's sequences, in order
    # [T] long: the row position whose logits predict each token; None means the one before it. Differs only at the
    # first token of a continuation (`pack(share_prefixes=True)`), predicted by the end of the prefix it shares.
    predictor: torch.Tensor | None = None

    @property
    def num_sequences(self) -> int:
        return int(self.seq_example.numel())

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum())

    def to(self, device: torch.device | str) -> "PackedBatch":
        return PackedBatch(
            input_ids=self.input_ids.to(device),
            position_ids=self.position_ids.to(device),
            loss_mask=self.loss_mask.to(device),
            seq_index=self.seq_index.to(device),
            seq_example=self.seq_example.to(device),
            seq_role=self.seq_role.to(device),
            fields={k: v.to(device) for k, v in self.fields.items()},
            num_examples=self.num_examples,
            segments=self.segments,
            vision={k: v.to(device) for k, v in self.vision.items()},
            predictor=None if self.predictor is None else self.predictor.to(device),
        )


def pack(examples: list[Example], share_prefixes: bool = False) -> PackedBatch:
    """Lay whole examples end to end in one row (no padding).

    With `share_prefixes`, a sequence that begins with untrained tokens of the last sequence laid in full (its
    "root": a DPO pair's prompt, a GRPO group's prompt) is laid as a continuation: only its own tokens, positions
    going on from the shared prefix. Its log-probs are those of the whole sequence, for a forward that runs the
    prefix once. Only oxRL's packed attention kernel reads this layout (`prefix_sharing`)."""
    ids: list[int] = []
    pos: list[int] = []
    mask: list[bool] = []
    seq_index: list[int] = []
    seq_example: list[int] = []
    seq_role: list[int] = []
    vision: list[dict[str, torch.Tensor]] = []
    predictor: list[int] = []
    segments: list[Segment] = []
    root, root_start = None, 0
    for e_idx, example in enumerate(examples):
        for role, seq in enumerate(example.sequences):
            s_idx = len(seq_example)
            if seq.vision is not None:
                vision.append(seq.vision.tensors)
            shared = shared_prefix(root, seq) if share_prefixes and seq.vision is None else 0
            if shared:  # the first own token is predicted by the prefix's last one, in the root
                predictor.extend([root_start + shared - 1, *range(len(ids), len(ids) + len(seq) - shared - 1)])
            else:
                root, root_start = seq, len(ids)
                predictor.extend(range(len(ids) - 1, len(ids) + len(seq) - 1))
            segments.append(Segment(len(ids), len(seq) - shared, shared, root_start if shared else 0))
            ids.extend(seq.input_ids[shared:])
            pos.extend(range(shared, len(seq)))
            mask.extend(seq.loss_mask[shared:])
            seq_index.extend([s_idx] * (len(seq) - shared))
            seq_example.append(e_idx)
            seq_role.append(role)
    keys = examples[0].fields.keys() if examples else ()
    fields = {k: torch.tensor([float(e.fields[k]) for e in examples]) for k in keys}
    sharing = predictor != list(range(-1, len(ids) - 1))
    return PackedBatch(
        input_ids=torch.tensor([ids], dtype=torch.long),
        position_ids=torch.tensor([pos], dtype=torch.long),
        loss_mask=torch.tensor([mask], dtype=torch.bool),
        seq_index=torch.tensor(seq_index, dtype=torch.long),
        seq_example=torch.tensor(seq_example, dtype=torch.long),
        seq_role=torch.tensor(seq_role, dtype=torch.long),
        fields=fields,
        num_examples=len(examples),
        segments=tuple(segments),
        vision=concat_vision(vision),
        predictor=torch.tensor(predictor, dtype=torch.long) if sharing else None,
    )


def shared_prefix(root: Sequence | None, seq: Sequence) -> int:
    """How many leading tokens `seq` can take from `root`: their common prefix, untrained in `seq`, leaving `seq` at
    least one token of its own; 0 when that is less than 2 (nothing worth sharing)."""
    if root is None or root.vision is not None:
        return 0
    limit = min(len(root), len(seq) - 1)
    shared = 0
    while shared < limit and root.input_ids[shared] == seq.input_ids[shared] and not seq.loss_mask[shared]:
        shared += 1
    return shared if shared >= 2 else 0


@dataclass
class RLPromptBatch:
    """RL prompts ready for a rollout engine: token ids (chat template and generation header applied),
    the text the rewards see, each row's other fields (e.g. `answer`) and where it came from (file:row)."""

    prompt_ids: list[list[int]]
    prompt_texts: list[str]
    fields: list[dict]
    origins: list[str]
    vision: list[VisionInputs | None] | None = None  # each prompt's images (vision-language prompts), else None
    rows: list[int] | None = None  # each prompt's row in the batch it is a subset of (None: its own rows)

    def subset(self, indices: list[int]) -> RLPromptBatch:
        """The prompts at `indices`, remembering their rows in the whole batch (`rows`)."""
        rows = [self.rows[i] for i in indices] if self.rows is not None else list(indices)
        return RLPromptBatch([self.prompt_ids[i] for i in indices], [self.prompt_texts[i] for i in indices],
                             [self.fields[i] for i in indices], [self.origins[i] for i in indices],
                             None if self.vision is None else [self.vision[i] for i in indices], rows)
