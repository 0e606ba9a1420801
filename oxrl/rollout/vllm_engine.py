"""vLLM rollout engine, colocated with the trainer: `vllm.LLM` in the trainer's process.

Same contract as HFEngine (oxrl/rollout/base.py): prompts go in as token ids (never re-tokenised),
completions come back as exactly the sampled ids with each sampled token's log-prob under
softmax(logits / temperature). vLLM is started with `logprobs_mode="processed_logprobs"`, so the
log-prob it returns is of the distribution it sampled from (after temperature), not of the raw
logits. With `top_p < 1` or `top_k > 0` that distribution is also truncated and renormalised: the
honest behaviour log-prob, which then differs from HFEngine's untruncated one.

Weights reach vLLM through public vLLM APIs only. In the trainer's process (one path on every platform):

    trainer weights (LoRA merged on the fly) --save_pretrained--> <sync_dir>/weights-<k>/   (/dev/shm)
    llm.collective_rpc("reload_weights", kwargs={"weights_path": ...}); then the prefix and encoder caches are reset

In a Ray rollout worker (`weight_backend`: the backend oxrl/cluster/vllm_transfer.py registers), straight from trainer rank 0's broadcast into vLLM's processes
through vLLM's weight-transfer API (`join_weight_group`, `receive_broadcast`; oxrl/cluster/vllm_transfer.py).

and every sync is VERIFIED: a fixed probe sequence is scored by the trainer (its own forward) and by
vLLM (`prompt_logprobs`); a mean gap above the tolerance raises WeightSyncError instead of letting a
stale engine sample silently. A sync whose update moved the probe by less than the tolerance cannot
be told apart from a failed one, but a persistently stale engine drifts past it within a few steps.

Prompts with images (vision-language models) go to vLLM as `{"prompt_token_ids", "multi_modal_data"}`. vLLM
0.32 expands each image placeholder of the ids itself and has no way to be told the ids are already expanded:
handed oxRL's prompt ids (each placeholder already expanded by the processor) it would expand the first image
token again and leave the rest as plain tokens. So each image's expanded tokens are turned back into its one
placeholder token first (`unexpanded_prompt`), and vLLM's expansion is checked to give back exactly the ids the
trainer scores. vLLM loads the processor from the folder it started from, so a vision-language model's engine is
given the processor and saves it there.

On GPU, vLLM sleeps between phases (weights offloaded, KV cache freed) so the trainer has the memory,
where the platform supports sleep mode; on CPU sleep is a no-op and is not called.
"""

from __future__ import annotations

import gc
import logging
import shutil
import tempfile
import time
import weakref
from dataclasses import asdict
from pathlib import Path

import torch

from oxrl.models.model_inputs import image_token_ids
from oxrl.config.schema import VLLMConfig
from oxrl.data.types import VisionInputs
from oxrl.models.load import is_vision_language
from oxrl.models.load import is_peft
from oxrl.models.lora import merged_state_dict
from oxrl.models.value_head import without_value_head
from oxrl.logging.quiet import no_progress_bars
from oxrl.rollout.base import Completion, SamplingParams
from oxrl.rollout.hf import eos_token_ids
from oxrl.rollout.probe import DEFAULT_TOLERANCE, WeightSyncError, probe_ids, trainer_probe_logprobs  # noqa: F401 (re-exported)

logger = logging.getLogger(__name__)

CPU_KV_CACHE_GIB = 1.0


class VLLMEngine:
    def __init__(self, model, tokenizer, options: VLLMConfig, seed: int = 0, weight_backend: str | None = None,
                 processor=None):
        """`processor`: a vision-language model's (its image processor and `tokenizer`); None for a text model."""
        from vllm import LLM
        from vllm.platforms import current_platform

        if processor is None and is_vision_language(_base(model).config):
            raise ValueError("a vision-language model's vLLM engine needs the model's processor (`processor=`): vLLM "
                             "loads it beside the weights to turn images into the model's inputs")
        self.tokenizer = tokenizer
        self.processor = processor
        self.never_sampled = image_token_ids(_base(model))
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.dtype = options.dtype if options.dtype != "auto" else str(next(model.parameters()).dtype).removeprefix("torch.")
        self.tolerance = options.sync_check_tolerance or DEFAULT_TOLERANCE[self.dtype]
        self.can_sleep = options.sleep_between_phases and current_platform.is_sleep_mode_available()
        # vLLM 0.32's reload_weights leaves a tied lm_head at its old values (measured; the probe catches it),
        # so vLLM keeps an untied copy and every sync writes the output embedding explicitly.
        base = _base(model)
        self.tied = bool(getattr(base.config, "tie_word_embeddings", False))
        self.tied_names = ((_weight_key(base, base.get_input_embeddings()), _weight_key(base, base.get_output_embeddings()))
                           if self.tied else None)
        self.members = options.tensor_parallel_size  # its processes, each a member of a weight group
        self._in_group = False
        on_cpu = current_platform.is_cpu()
        self.root = _sync_root(options.sync_dir)
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.root, True)
        self._version = 0
        self._asleep = False
        self._last_trainer_probe: torch.Tensor | None = None
        weights = self._write_weights(model)
        self.start_folder = weights  # vLLM's model path: where it loads the config and processor from
        if processor is not None:
            with no_progress_bars():
                processor.save_pretrained(weights)
        tokenizer.save_pretrained(self.root / "tokenizer")
        _base(model).config.save_pretrained(self.root / "tokenizer")  # vLLM reads a config beside any tokenizer
        kv_gib = options.kv_cache_gib or (CPU_KV_CACHE_GIB if on_cpu else None)
        started = time.perf_counter()
        self.llm = LLM(
            model=str(weights), tokenizer=str(self.root / "tokenizer"), dtype=self.dtype, seed=seed,
            tensor_parallel_size=options.tensor_parallel_size, gpu_memory_utilization=options.gpu_memory_utilization,
            kv_cache_memory_bytes=int(kv_gib * 2**30) if kv_gib else None, max_model_len=options.max_model_len,
            enforce_eager=on_cpu if options.enforce_eager is None else options.enforce_eager,
            enable_sleep_mode=self.can_sleep, logprobs_mode="processed_logprobs",
            hf_overrides={"tie_word_embeddings": False} if self.tied else None,
            weight_transfer_config={"backend": weight_backend} if weight_backend else None,
        )
        self.probe_ids = probe_ids(_base(model), tokenizer)
        gap = self.check_sync(model)  # vLLM's own loading of the first folder is checked like every reload
        logger.info("vLLM engine started in %.1f s (%s, %s); probe gap %.2e", time.perf_counter() - started, self.dtype,
                    "sleeps between phases" if self.can_sleep else "no sleep mode", gap)

    # ---- sampling ---------------------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 vision: list[VisionInputs | None] | None = None) -> list[Completion]:
        from vllm import SamplingParams as VLLMSamplingParams

        vision = vision if vision is not None else [None] * len(prompts)
        greedy = params.temperature == 0
        sampling = VLLMSamplingParams(
            n=params.n, temperature=params.temperature, top_p=1.0 if greedy else params.top_p,
            top_k=0 if greedy else params.top_k, max_tokens=params.max_new_tokens, stop=list(params.stop) or None,
            stop_token_ids=sorted(self.eos_ids), include_stop_str_in_output=True, logprobs=0,
            # A vision-language model's image tokens are never sampled (a completion holding one would ask the
            # trainer for an image that does not exist); -100 is the lowest bias vLLM takes.
            logit_bias={token: -100.0 for token in self.never_sampled} or None,
            allowed_token_ids=params.allowed_token_ids,  # a VLA's action tokens
        )
        if params.seed is not None:  # prompt i samples from seed + i: the same draws however prompts are split up
            sampling = [sampling.clone() for _ in prompts]
            for index, each in enumerate(sampling):
                each.seed = params.seed + index
        self._wake()  # stays awake for the rollout phase's later turns; the loop calls `offload` at its end
        requests = [self._request(ids, images) for ids, images in zip(prompts, vision)]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        for index, out in enumerate(outputs):
            if vision[index] is not None and list(out.prompt_token_ids) != list(prompts[index]):
                raise RuntimeError(
                    f"vLLM expanded the images of prompt {index} into other tokens than the model's processor did "
                    f"({len(out.prompt_token_ids)} ids, not {len(prompts[index])}): its log-probs would be of another "
                    f"sequence than the trainer scores")
        return [self._completion(index, prompts[index], sample, vision[index])
                for index, out in enumerate(outputs) for sample in out.outputs]

    def _request(self, ids: list[int], vision: VisionInputs | None) -> dict:
        """vLLM's prompt: the ids, and for a prompt with images the images with their placeholders unexpanded."""
        if vision is None:
            return {"prompt_token_ids": list(ids)}
        if self.processor is None:
            raise ValueError("a prompt has images but this vLLM engine was built without a processor (a text model)")
        return {"prompt_token_ids": unexpanded_prompt(ids, vision.images, self.processor),
                "multi_modal_data": {"image": list(vision.images)}}

    def _completion(self, index: int, prompt_ids: list[int], sample, vision: VisionInputs | None) -> Completion:
        ids = list(sample.token_ids)
        # logprobs=0: each step's dict holds just the sampled token (processed_logprobs: after temperature).
        logprobs = [float(step[token].logprob) for step, token in zip(sample.logprobs, ids)]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)  # as HFEngine decodes: same text for same ids
        return Completion(prompt_index=index, prompt_ids=list(prompt_ids), completion_ids=ids, logprobs=logprobs,
                          finish_reason=_finish_reason(sample), text=text, vision=vision)

    # ---- weights ----------------------------------------------------------------------------------

    def sync_weights(self, model) -> dict[str, float]:
        """Load `model`'s current weights into vLLM, then verify them (WeightSyncError if they differ);
        returns the sync's seconds and probe gap, for the step's metrics."""
        started = time.perf_counter()
        self._wake()
        previous = self.root / f"weights-{self._version}"
        self._version += 1
        folder = self._write_weights(model)
        written = time.perf_counter()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
        self._forget_old_weights()
        self._remove_weights(previous)
        reloaded = time.perf_counter()
        gap = self.check_sync(model)
        seconds = time.perf_counter() - started
        logger.debug("vLLM weight sync %.2f s (write %.2f s, reload %.2f s, probe %.2f s); probe gap %.2e",
                     seconds, written - started, reloaded - written, time.perf_counter() - reloaded, gap)
        return {"time/weight_sync": seconds, "weight_sync/probe_gap": gap}

    def join_weight_group(self, address, rank_offset: int) -> None:
        """Every vLLM process joins the weight group `address` (a GroupAddress) as members `rank_offset` onwards
        (blocks until the whole group has met). A new generation after a restart replaces the old group."""
        if self._in_group:
            self.llm.shutdown_weight_transfer_engine()
        self.llm.init_weight_transfer_engine({"init_info": {**asdict(address), "rank_offset": rank_offset}})
        self._in_group = True

    def receive_broadcast(self, specs, bucket_bytes: int) -> None:
        """Load the weights trainer rank 0 broadcasts over the group (TensorSpecs, in order) into vLLM."""
        self._wake()
        names = [spec.name for spec in specs]
        aliases = {}
        if self.tied and self.tied_names[1] not in names:  # vLLM's untied copy of the output embedding
            embed, output = self.tied_names
            aliases = {embed: output}
        self.llm.start_weight_update()
        self.llm.update_weights({"update_info": {"names": names, "shapes": [list(spec.shape) for spec in specs],
                                                 "dtypes": [spec.dtype for spec in specs], "bucket_bytes": bucket_bytes,
                                                 "aliases": aliases}})
        self.llm.finish_weight_update()
        self._forget_old_weights()

    def _forget_old_weights(self) -> None:
        """Drop what vLLM computed with the old weights: the prefix cache's KV and the encoder cache's image
        features. vLLM 0.32's reload_weights clears its workers' encoder cache but not the scheduler's record of
        it (the next prompt with a seen image then fails with "Encoder cache miss"); the engine's reset clears both."""
        if not self.llm.reset_prefix_cache():
            raise WeightSyncError("vLLM could not reset its prefix cache after new weights: cached KV of the old weights would be reused")
        self.llm.llm_engine.reset_encoder_cache()

    def _write_weights(self, model) -> Path:
        """The trainer's weights as a Hugging Face folder (safetensors + config) under the base names."""
        folder = self.root / f"weights-{self._version}"
        base = _base(model)
        # Only the architecture's own weights: a shared PPO value head (oxrl/models/value_head.py) is not vLLM's.
        state = without_value_head(merged_state_dict(model) if is_peft(model) else dict(model.state_dict()))
        if self.tied:  # a separate tensor, so save_pretrained keeps it
            embed, output = self.tied_names
            state[output] = state[embed].clone()
        with no_progress_bars():
            base.save_pretrained(folder, state_dict=state, safe_serialization=True)
        return folder

    def _remove_weights(self, folder: Path) -> None:
        """A replaced weights folder. The one vLLM started from keeps its other files (config, processor): vLLM
        may load its processor from its model path again."""
        if folder != self.start_folder:
            shutil.rmtree(folder)
            return
        for file in folder.glob("*.safetensors*"):
            file.unlink()

    @torch.no_grad()
    def check_sync(self, model) -> float:
        """Mean |trainer - vLLM| log-prob gap on the probe sequence; raises WeightSyncError above the tolerance."""
        trainer = trainer_probe_logprobs(model, self.probe_ids)
        self._wake()
        engine = self._engine_probe_logprobs()
        gap = float((trainer - engine).abs().mean())
        drift = float((trainer - self._last_trainer_probe).abs().mean()) if self._last_trainer_probe is not None else None
        if not gap <= self.tolerance:
            moved = f"; the trainer's own probe log-probs moved by {drift:.3g} since the last sync" if drift is not None else ""
            raise WeightSyncError(
                f"vLLM's log-probs of the probe sequence differ from the trainer's by {gap:.3g} on average (tolerance "
                f"{self.tolerance}{moved}): vLLM is not sampling from the weights being trained. If vLLM computes in "
                f"lower precision than the trainer, raise rollout.vllm.sync_check_tolerance."
            )
        self._last_trainer_probe = trainer
        return gap

    def _engine_probe_logprobs(self) -> torch.Tensor:
        return self.probe_logprobs(self.probe_ids)

    def probe_logprobs(self, ids: list[int]) -> torch.Tensor:
        """log p(ids[t] | ids[<t]) for t >= 1 as vLLM computes it (what it samples from), at temperature 1."""
        from vllm import SamplingParams as VLLMSamplingParams

        self._wake()
        probe = VLLMSamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        out = self.llm.generate([{"prompt_token_ids": list(ids)}], probe, use_tqdm=False)[0]
        # prompt_logprobs[0] is None (the first token has no prefix); raw log softmax (prompts skip temperature).
        return torch.tensor([step[token].logprob for step, token in zip(out.prompt_logprobs[1:], ids[1:])])

    # ---- memory between phases --------------------------------------------------------------------

    def offload(self) -> None:
        """The rollout phase is over: on GPU, sleep (weights to CPU memory, KV cache freed) so the trainer has the
        memory; the next generate or sync wakes vLLM. A no-op where vLLM has no sleep mode (CPU)."""
        if self.can_sleep and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def _wake(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def close(self) -> None:
        """Stop vLLM and remove the weight folders; the engine cannot be used afterwards. vLLM has no
        public shutdown: its processes stop when the `LLM` is released (else at interpreter exit)."""
        self.llm = None
        gc.collect()
        self._cleanup()


def unexpanded_prompt(ids: list[int], images: list, processor) -> list[int]:
    """`ids` with each image's expanded tokens turned back into its one placeholder token, which is what vLLM
    expands. An image's expanded tokens are what the processor writes for its placeholder alone (it depends on the
    image: Qwen2-VL's count of image tokens is its grid's); images are found in order."""
    ids = list(ids)
    placeholder = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    out: list[int] = []
    start = 0
    for number, image in enumerate(images):
        block = processor(text=[processor.image_token], images=[[image]], add_special_tokens=False)["input_ids"][0]
        at = _find(ids, block, start)
        if at is None:
            raise ValueError(f"image {number} of a prompt: the {len(block)} tokens the processor expands its "
                             f"{processor.image_token} placeholder into are not in the prompt's ids after position {start}")
        out += ids[start:at] + [placeholder]
        start = at + len(block)
    return out + ids[start:]


def _find(ids: list[int], block: list[int], start: int) -> int | None:
    """The first position >= start where `block` occurs in `ids`."""
    for at in range(start, len(ids) - len(block) + 1):
        if ids[at : at + len(block)] == block:
            return at
    return None


def _finish_reason(sample) -> str:
    """vLLM says `stop` for EOS, stop tokens and stop strings alike; `stop_reason` is the string for the last."""
    if sample.finish_reason == "length":
        return "length"
    if sample.finish_reason == "stop":
        return "stop" if isinstance(sample.stop_reason, str) else "eos"
    raise RuntimeError(f"vLLM ended a completion with finish_reason {sample.finish_reason!r} (aborted?)")


def _weight_key(model, module) -> str:
    return next(f"{name}.weight" for name, candidate in model.named_modules() if candidate is module)


def _base(model):
    """The plain transformers model: the peft wrapper's base model under LoRA."""
    return model.get_base_model() if is_peft(model) else model


def _sync_root(sync_dir: str | None) -> Path:
    """A fresh folder for the weight files: memory-backed /dev/shm when there is one."""
    if sync_dir is not None:
        Path(sync_dir).mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="oxrl-vllm-", dir=sync_dir))
    shm = Path("/dev/shm")
    parent = str(shm) if shm.is_dir() and shutil.disk_usage(shm).free > 0 else None
    return Path(tempfile.mkdtemp(prefix="oxrl-vllm-", dir=parent))
