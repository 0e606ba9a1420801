"""GPU numbers for oxRL on one CUDA device: the equality checks of its CUDA kernels, SFT throughput in bf16, and
GRPO step time with the `hf` engine. The default is the whole prepared run (about 6 minutes on an H100/H200):

    python benchmarks/gpu.py                                      # checks; SFT 8k/16k/32k + sdpa at 16k; GRPO both decodes
    python benchmarks/gpu.py --part checks                        # only the equality checks
    python benchmarks/gpu.py --part sft --tokens-per-step 8192 16384 24576 --attn auto sdpa flash_attention_2
    python benchmarks/gpu.py --part sft --profile                 # + torch.profiler's top ops of one step
    python benchmarks/gpu.py --part grpo --decode compiled generate
    python benchmarks/gpu.py --tokenizer PATH                     # no network: a folder with tokenizer files

* Checks (`--part checks`), on a small random Qwen2 (4 layers, GQA, head dim 64): a packed row (sequences of their
  own, and a GRPO-like group whose completions continue a shared prompt) through oxRL's packed kernel gives the
  log-probs of each sequence run alone through transformers' sdpa: in fp32 with TF32 off (the FlexAttention path)
  to 1e-4, and in bf16 (varlen FlashAttention) within bf16's rounding; the bf16 gradients of the packed kernel and of
  transformers' sdpa on the same row point the same way (cosine). Then the `hf` engine's compiled static-cache
  decoding against `generate` at temperature 0 on 16 left-padded rows: fp32 (TF32 off) tokens equal and log-probs
  to 1e-4 (in bf16 the GRPO part reports the engine/trainer log-prob mismatch). `tests/system/test_gpu.py` asserts the
  same functions.

What is measured. A randomly initialised model of the shape of Qwen/Qwen2.5-0.5B-Instruct (the shape
from oxRL's registry, `find_model(...).transformers_config()`, no download), saved once as a
safetensors folder and loaded by `oxrl.models.load.load_model` as every run loads a model: bf16
parameters on the GPU (`model.dtype: auto`). The tokenizer saved beside it is SmolLM2's (the bundled
model's, or `--tokenizer`): only GRPO needs one, and it decodes the ids it knows (ids past its 49k
vocabulary decode to nothing; a random model's text is garbage either way).

* SFT (`--part sft`, `--attn auto` = oxRL's packed kernel, varlen FlashAttention in bf16): oxRL's own loop pieces, as benchmarks/sft.py uses them: `pack` (one padding-free
  row per optimizer step, position ids restarting per sequence) + `get_objective("sft")` +
  `run_micro_batches` + `SingleDevice(cuda, mixed_precision="auto").step()` (bf16 autocast, AdamW on
  the bf16 parameters, grad-norm clipping at 1.0). Synthetic rows: random token ids, lengths uniform
  on 256..2048, the loss on the second half of each sequence; each step holds exactly
  `--tokens-per-step` non-pad tokens (the last sequence of a step is cut to fit). `--warmup-steps`
  untimed steps, then `--steps` timed ones, each between two `torch.cuda.synchronize()`. Reported:
  tokens/s (median and min..max over the timed steps), MFU = model FLOPs (benchmarks/common.py's
  `training_flops`: 6 * N_matmul per token + attention over each sequence's own length) / step
  seconds / peak, against the bf16 matmul peak measured here (best of large square bf16 matmuls,
  timed with CUDA events) and against the H100 SXM datasheet (989 TFLOP/s dense bf16), and
  `torch.cuda.max_memory_allocated`. Each (attention, tokens) run is a fresh spawned process; one
  that fails (e.g. out of memory) is reported and the others go on. `flash_attention_2` runs only
  where the `flash_attn` package imports. `--profile` adds one untimed step under torch.profiler:
  kernel time split into attention / matmul / other (by kernel name) and the top ops.
* GRPO (`--part grpo`): the real runner, `oxrl.runner.run`, on a config tree built from the `math`
  preset (Dr. GRPO on the generated `arithmetic` task, math reward), with the random model,
  `run.device: cuda`, `rl.rollout.engine: hf`, `--prompts-per-step` x `--n` completions of at most
  `--max-new-tokens` tokens per step (a random model rarely stops early: nearly every completion is
  that long), all generated in one `generate` call and trained in one packed micro-batch, no
  validation, no checkpoints. Reported from the run's metrics.jsonl, over steps 2.. (step 1 warms
  up): `time/generate`, `time/train` (update + weight sync), `time/step` (the whole step: generate,
  reward, advantages, update) as median and min..max, and completions/s. A random model earns
  reward 0, so every advantage is 0 and the loss and gradient are 0: the update still runs its
  forward, backward and optimizer step, so its time is real; only learning is absent. Step 1 (compiling the
  decoding step, warming kernels) is reported apart and left out of the medians.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/gpu.py`: make `oxrl` and `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import DecoderShape, MatmulPeak, format_bytes, in_fresh_process, mfu, print_table, training_flops

MODEL_SHAPE = "Qwen/Qwen2.5-0.5B-Instruct"
TOKENIZER_FALLBACK = "smollm2-135m-instruct"  # the bundled model: its tokenizer is on disk without a network
MIN_LENGTH, MAX_LENGTH = 256, 2048
H100_SXM_BF16_DENSE = 989e12  # NVIDIA H100 SXM datasheet, dense bf16 tensor-core FLOP/s
PEAK_SIZES = (4096, 8192, 16384)
GRPO_PHASES = {"generate s": "time/generate", "train s": "time/train", "step s": "time/step"}


def measure_bf16_peak(sizes: tuple[int, ...] = PEAK_SIZES, repeats: int = 5, calls: int = 10) -> MatmulPeak:
    """Best FLOP/s of square bf16 `n x n @ n x n` matmuls on the current CUDA device (CUDA events).

    common.measure_matmul_peak's method on the GPU: best-of over sizes and repeats, each timing
    `calls` back-to-back matmuls so that launch overhead is amortised.
    """
    import torch

    best = MatmulPeak(0.0, 0, 0)
    for n in sizes:
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        torch.mm(a, b, out=out)
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                torch.mm(a, b, out=out)
            end.record()
            end.synchronize()
            flops = calls * 2.0 * n**3 / (start.elapsed_time(end) / 1e3)
            if flops > best.flops_per_s:
                best = MatmulPeak(flops, n, 0)
        del a, b, out
    torch.cuda.empty_cache()
    return best


def save_random_model(folder: Path, tokenizer_source: str | None) -> None:
    """The registry's Qwen2.5-0.5B shape with random weights (seed 0), and a tokenizer, as a safetensors folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from oxrl.config.schema import ModelConfig
    from oxrl.models.load import load_tokenizer
    from oxrl.models.registry import find_model, load_registry

    config = find_model(MODEL_SHAPE, load_registry()).transformers_config()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer = (AutoTokenizer.from_pretrained(tokenizer_source) if tokenizer_source
                 else load_tokenizer(ModelConfig(name_or_path=TOKENIZER_FALLBACK)))
    tokenizer.save_pretrained(folder)


# --- equality checks -------------------------------------------------------------------------------

CHECK_SEED = 0


def small_model(dtype, attn: str):
    """A small random Qwen2 on CUDA (4 layers, 8 query / 2 kv heads of 64, vocabulary 2048)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from oxrl.models.packed_attention import use_packed_attention

    config = AutoConfig.for_model("qwen2", vocab_size=2048, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                                  num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096,
                                  attention_dropout=0.0, pad_token_id=0)
    torch.manual_seed(CHECK_SEED)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype).cuda().eval()
    if attn == "packed" and not use_packed_attention(model):
        raise RuntimeError("oxRL's packed kernel declined the check model")
    return model


def check_examples(vocab: int):
    """Sequences of their own (lengths 1..700), and two groups of completions continuing a shared prompt."""
    import torch

    from oxrl.data.types import Example, Sequence

    generator = torch.Generator().manual_seed(CHECK_SEED)

    def ids(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=generator).tolist()

    examples = [Example([Sequence(ids(n), [False] * (n // 2) + [True] * (n - n // 2))]) for n in (37, 700, 2, 129, 64)]
    for prompt_length, answers in ((150, (40, 90, 7)), (33, (300, 12))):
        prompt = ids(prompt_length)
        examples += [Example([Sequence(prompt + ids(n), [False] * prompt_length + [True] * n)]) for n in answers]
    return examples


def packed_equality(dtype_name: str) -> dict[str, float | str]:
    """Max and mean |log-prob difference| between a packed row through oxRL's kernel (with shared prefixes) and each
    sequence alone through transformers' sdpa; with bf16 also the cosine of the two kernels' gradients on one row."""
    import torch

    from oxrl.models.logprobs import token_logprobs
    from oxrl.data.types import pack
    from oxrl.loops.objectives import get_objective
    from oxrl.models.packed_attention import packed_kernel

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    packed, reference = small_model(dtype, "packed"), small_model(dtype, "sdpa")
    examples = check_examples(packed.config.vocab_size)
    batch = pack(examples, share_prefixes=True).to("cuda")
    assert batch.predictor is not None, "the check row must hold continuations"
    probe = torch.zeros(1, 8, 16, 64, device="cuda", dtype=dtype)
    with torch.no_grad():  # at the trained (answer) tokens: all of a continuation's are its own
        got = token_logprobs(packed, batch)[batch.loss_mask[0]].float()
        alone = [pack([e]).to("cuda") for e in examples]
        expected = torch.cat([token_logprobs(reference, b)[b.loss_mask[0]].float() for b in alone])
    difference = (got - expected).abs()
    result: dict[str, float | str] = {"kernel": packed_kernel(probe, 64**-0.5), "max": float(difference.max()),
                                      "mean": float(difference.mean())}
    if dtype_name == "bf16":
        objective = get_objective("sft")
        row = pack(examples).to("cuda")  # no continuations: transformers' sdpa keeps the row's sequences apart itself
        gradients = []
        for model in (packed, reference):
            model.train()
            objective.compute(model, row, normaliser=objective.count_units(row)).loss.backward()
            gradients.append(torch.cat([p.grad.double().flatten() for p in model.parameters()]))
        result["grad_cosine"] = float(torch.nn.functional.cosine_similarity(*gradients, dim=0))
    return result


def decode_equality(dtype_name: str) -> dict[str, float]:
    """The `hf` engine's compiled static-cache decoding against `generate`, greedy, 16 left-padded rows of 48 tokens:
    the share of rows with identical tokens and the max |log-prob difference| over the tokens both produced."""
    import torch

    from oxrl.rollout.base import SamplingParams
    from oxrl.rollout.hf import HFEngine

    class Tokenizer:  # ids <-> numbers: all the engine needs without a stop string
        eos_token_id, pad_token_id = 1, 0

        def decode(self, ids, skip_special_tokens=False):
            return " ".join(map(str, ids))

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    model = small_model({"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name], "packed")
    generator = torch.Generator().manual_seed(CHECK_SEED)
    prompts = [torch.randint(3, model.config.vocab_size, (int(n),), generator=generator).tolist()
               for n in torch.randint(5, 60, (16,), generator=generator)]
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=48)
    started = time.perf_counter()
    compiled = HFEngine(model, Tokenizer(), decode="compiled").generate(prompts, params)
    first_call = time.perf_counter() - started
    reference = HFEngine(model, Tokenizer(), decode="generate").generate(prompts, params)
    same = [a.completion_ids == b.completion_ids for a, b in zip(compiled, reference)]
    gaps = [abs(x - y) for a, b in zip(compiled, reference) for x, y, i, j in
            zip(a.logprobs, b.logprobs, a.completion_ids, b.completion_ids) if i == j]
    return {"rows_identical": sum(same) / len(same), "max_logprob_gap": max(gaps),
            "tokens": sum(len(c.completion_ids) for c in compiled), "first_call_s": first_call}


def checks_part() -> None:
    for dtype in ("fp32", "bf16"):
        r = packed_equality(dtype)
        print(f"check packed == each sequence alone, {dtype}: kernel {r['kernel']}, |log-prob diff| max {r['max']:.2e} "
              f"mean {r['mean']:.2e}" + (f", gradient cosine vs sdpa {r['grad_cosine']:.6f}" if "grad_cosine" in r else ""),
              flush=True)
    for dtype in ("fp32",):  # bf16's gap to the trainer is what GRPO reports each step as the engine/trainer mismatch
        r = decode_equality(dtype)
        print(f"check compiled decoding == generate, {dtype}, greedy: rows identical {r['rows_identical']:.0%}, "
              f"max |log-prob gap| {r['max_logprob_gap']:.2e} over {r['tokens']} tokens (first call with compiling "
              f"{r['first_call_s']:.1f} s)", flush=True)


# --- SFT -------------------------------------------------------------------------------------------


@dataclass
class SFTSpec:
    folder: str
    attn: str
    tokens_per_step: int
    warmup: int
    steps: int
    seed: int
    profile: bool
    compile_blocks: bool = False


@dataclass
class SFTResult:
    step_seconds: list[float]  # timed steps only
    step_lengths: list[list[int]]  # per timed step: its sequence lengths
    peak_memory: int
    shape: DecoderShape
    losses: list[float]
    profile: str = ""


def synthetic_step(tokens: int, vocab: int, generator) -> list[tuple[list[int], list[bool]]]:
    """Random-id sequences, lengths uniform on [MIN_LENGTH, MAX_LENGTH], exactly `tokens` in all;
    the loss on the second half of each."""
    import torch

    rows, total = [], 0
    while total < tokens:
        length = min(int(torch.randint(MIN_LENGTH, MAX_LENGTH + 1, (1,), generator=generator)), tokens - total)
        length = max(length, 2)
        ids = torch.randint(0, vocab, (length,), generator=generator).tolist()
        rows.append((ids, [t >= length // 2 for t in range(length)]))
        total += length
    return rows


def run_sft(spec: SFTSpec) -> SFTResult:
    import torch
    import transformers

    from oxrl.config.schema import ModelConfig, OptimConfig
    from oxrl.data.types import Example, Sequence
    from oxrl.loops.objectives import get_objective
    from oxrl.loops.sl import run_micro_batches
    from oxrl.models.load import load_model
    from oxrl.training.optim import build_optimizer, build_scheduler
    from oxrl.training.strategy import SingleDevice

    transformers.utils.logging.disable_progress_bar()
    device = torch.device("cuda")
    model = load_model(ModelConfig(name_or_path=spec.folder, attn_implementation=spec.attn,
                                   compile_blocks=spec.compile_blocks), device)
    optim_cfg = OptimConfig(lr=1e-5, schedule="constant", max_grad_norm=1.0)
    optimizer = build_optimizer(model, optim_cfg)
    total = spec.warmup + spec.steps
    strategy = SingleDevice(device, mixed_precision="auto", max_grad_norm=optim_cfg.max_grad_norm)
    strategy.prepare(model, optimizer, build_scheduler(optimizer, total, optim_cfg))
    objective = get_objective("sft")
    generator = torch.Generator().manual_seed(spec.seed)
    steps = [[Example([Sequence(ids, mask)]) for ids, mask in synthetic_step(spec.tokens_per_step, model.config.vocab_size,
                                                                             generator)] for _ in range(total)]
    model.train()

    def one_step(examples) -> float:
        sums, _ = run_micro_batches(objective, model, examples, len(examples), strategy)  # one packed row
        strategy.step()
        return float(sums["loss"])

    seconds, losses = [], []
    for index, examples in enumerate(steps):
        if index == spec.warmup:
            torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
        started = time.perf_counter()
        losses.append(one_step(examples))
        torch.cuda.synchronize()
        if index >= spec.warmup:
            seconds.append(time.perf_counter() - started)
    peak_memory = torch.cuda.max_memory_allocated()
    profile = profile_step(one_step, steps[-1]) if spec.profile else ""
    lengths = [[len(e.sequences[0]) for e in step] for step in steps[spec.warmup:]]
    return SFTResult(seconds, lengths, peak_memory, DecoderShape.of(model), losses, profile)


def profile_step(one_step, examples) -> str:
    """torch.profiler over one more step: the GPU kernels' time by kind, and the top ops by CUDA time."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        started = time.perf_counter()
        one_step(examples)
        torch.cuda.synchronize()
        wall = time.perf_counter() - started
    averages = prof.key_averages()
    # Kernels only (an aten op's row repeats its kernels' time): grouped by what the kernel's name says it is.
    kinds = {"attention": 0.0, "matmul": 0.0, "log-softmax": 0.0, "other": 0.0}
    for event in averages:
        if event.device_type != DeviceType.CUDA:
            continue
        name = event.key.lower()
        kind = ("attention" if any(k in name for k in ("sdpa", "attention", "fmha", "flash", "flex")) else
                "matmul" if any(k in name for k in ("nvjet", "gemm", "cutlass", "xmma")) else
                "log-softmax" if "softmax" in name else "other")
        kinds[kind] += event.self_device_time_total / 1e6
    busy = sum(kinds.values())
    split = ", ".join(f"{kind} {seconds:.3f} s ({seconds / busy:.0%})" for kind, seconds in kinds.items())
    table = averages.table(sort_by="self_device_time_total", row_limit=20, max_name_column_width=60)
    return (f"profiled step: {wall:.3f} s wall (profiler on), {busy:.3f} s of GPU kernels ({busy / wall:.0%} busy): "
            f"{split}\n{table}")


def sft_row(spec: SFTSpec, result: SFTResult, measured: MatmulPeak) -> dict[str, str]:
    per_step = [sum(lengths) / s for lengths, s in zip(result.step_lengths, result.step_seconds)]
    flops = sum(training_flops(result.shape, lengths) for lengths in result.step_lengths)
    seconds = sum(result.step_seconds)
    datasheet = MatmulPeak(H100_SXM_BF16_DENSE, 0, 0)
    return {
        "attention": spec.attn + (" + compiled blocks" if spec.compile_blocks else ""),
        "tokens/step": str(spec.tokens_per_step),
        "seqs/step": f"{statistics.mean(len(lengths) for lengths in result.step_lengths):.1f}",
        "tokens/s median": f"{statistics.median(per_step):,.0f}",
        "tokens/s min..max": f"{min(per_step):,.0f}..{max(per_step):,.0f}",
        "s/step median": f"{statistics.median(result.step_seconds):.3f}",
        "MFU (measured peak)": f"{mfu(flops, seconds, measured):.1%}",
        "MFU (989 TFLOP/s)": f"{mfu(flops, seconds, datasheet):.1%}",
        "peak memory": format_bytes(result.peak_memory),
    }


def sft_part(args, folder: Path, measured: MatmulPeak) -> None:
    attns = []
    for attn in args.attn:
        if attn == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
            print("flash_attn is not importable here: flash_attention_2 skipped")
            continue
        attns.append(attn)
    runs = [(attn, tokens) for attn in attns for tokens in args.tokens_per_step]
    runs += [("sdpa", tokens) for tokens in args.sdpa_baseline if ("sdpa", tokens) not in runs]
    rows = []
    for attn, tokens in runs:
        spec = SFTSpec(str(folder), attn, tokens, args.warmup_steps, args.steps, args.seed, args.profile,
                       args.compile_blocks and attn != "sdpa")
        try:
            result = in_fresh_process(run_sft, spec)
        except Exception as error:  # e.g. out of memory at 32k: report it and go on with the others
            print(f"SFT {attn} {tokens} tokens/step failed: {type(error).__name__}: {str(error)[:300]}", flush=True)
            continue
        shape = result.shape
        print(f"SFT {attn} {tokens} tokens/step: step seconds {[round(s, 3) for s in result.step_seconds]}, "
              f"losses {[round(x, 3) for x in result.losses]}, N_matmul {shape.matmul_params / 1e6:.1f}M, "
              f"{shape.n_layers} layers, attention width {shape.attn_width}", flush=True)
        if result.profile:
            print(result.profile)
        rows.append(sft_row(spec, result, measured))
    print_table(rows, title=f"SFT {MODEL_SHAPE} shape (random weights), bf16, {args.steps} timed steps after "
                            f"{args.warmup_steps} warm-up, one packed row per step")


# --- GRPO ------------------------------------------------------------------------------------------


def grpo_tree(folder: Path, out_dir: str, args, decode: str) -> dict:
    from oxrl.config.presets import task_preset

    tree = task_preset("math")
    completions = args.prompts_per_step * args.n
    tree["run"] = {"name": "gpu-grpo", "output_dir": out_dir, "device": "cuda", "seed": args.seed}
    tree["model"] = {"name_or_path": str(folder)}
    tree["rl"].update({"prompts_per_step": args.prompts_per_step, "validation_size": 0, "validation_every": None,
                       "task_size": args.prompts_per_step * args.grpo_steps})
    tree["rl"]["rollout"].update({"engine": "hf", "n": args.n, "max_new_tokens": args.max_new_tokens,
                                  "max_batch_size": completions, "decode": decode})
    tree["train"].update({"max_steps": args.grpo_steps, "micro_batch_size_per_device": completions})
    tree["checkpoint"] = {"save_final": False}
    tree["logging"] = {"progress_bar": False, "plot": False}
    return tree


@dataclass
class GRPOSpec:
    tree: dict


def run_grpo(spec: GRPOSpec) -> tuple[list[dict], int]:
    """One GRPO run in this (fresh) process: its metrics records and the peak CUDA memory."""
    import torch

    from oxrl.config.load import load_config
    from oxrl.logging.metrics import read_metrics
    from oxrl.runner import run

    cfg = load_config(None, base=spec.tree)
    torch.cuda.reset_peak_memory_stats()
    result = run(cfg)
    return [r for r in read_metrics(result.run_dir) if "time/step" in r], torch.cuda.max_memory_allocated()


def grpo_part(args, folder: Path) -> None:
    rows = []
    for decode in args.decode:
        with tempfile.TemporaryDirectory() as out_dir:
            try:
                records, peak = in_fresh_process(run_grpo, GRPOSpec(grpo_tree(folder, out_dir, args, decode)))
            except Exception as error:  # report it and go on with the other decode
                print(f"GRPO decode={decode} failed: {type(error).__name__}: {str(error)[:600]}", flush=True)
                continue
        timed = records[1:]  # step 1 compiles the decoding step and warms CUDA kernels and the allocator
        print(f"GRPO decode={decode} per step: " + "; ".join(
            f"step {r.get('step', i + 1)}: generate {r['time/generate']:.2f} s, train {r['time/train']:.2f} s, "
            f"step {r['time/step']:.2f} s, mean length {r['response_length/mean']:.0f}, "
            f"mismatch {r.get('logprob_mismatch/mean_abs', float('nan')):.4f}" for i, r in enumerate(records)), flush=True)
        completions = args.prompts_per_step * args.n
        row = {"decode": decode, "completions/step": str(completions), "max new tokens": str(args.max_new_tokens),
               "timed steps": f"{len(timed)}", "step 1 generate s": f"{records[0]['time/generate']:.2f}"}
        for name, key in GRPO_PHASES.items():
            values = [r[key] for r in timed]
            row[name] = f"{statistics.median(values):.2f} ({min(values):.2f}..{max(values):.2f})"
        row["completions/s"] = f"{completions * len(timed) / sum(r['time/step'] for r in timed):.1f}"
        row["generated tokens/s"] = f"{statistics.median(r['tokens_per_s'] for r in timed):,.0f}"
        row["mismatch"] = f"{statistics.median(r.get('logprob_mismatch/mean_abs', float('nan')) for r in timed):.4f}"
        row["peak memory"] = format_bytes(peak)
        rows.append(row)
    print_table(rows, title=f"GRPO (dr_grpo, arithmetic, hf engine) {MODEL_SHAPE} shape (random weights), bf16, "
                            f"steps 2..{args.grpo_steps}: median (min..max)")


def reported(part, *args) -> None:
    """Run one part; a failure is printed with its traceback and the other parts still run (one device call
    should bring back every number it can)."""
    try:
        part(*args)
    except Exception:  # reported in full, then the next part
        traceback.print_exc()
        sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("all", "checks", "sft", "grpo"), default="all")
    parser.add_argument("--tokenizer", default=None, help="folder with tokenizer files (default: the bundled model's)")
    parser.add_argument("--attn", nargs="+", default=["auto"], choices=("auto", "sdpa", "flash_attention_2", "eager"),
                        help="`auto`: oxRL's packed kernel (varlen FlashAttention in bf16 on CUDA)")
    parser.add_argument("--tokens-per-step", nargs="+", type=int, default=[8192, 16384, 32768])
    parser.add_argument("--sdpa-baseline", nargs="*", type=int, default=[16384],
                        help="tokens per step also run with transformers' sdpa, the baseline on the same device")
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5, help="timed SFT steps")
    parser.add_argument("--profile", action="store_true", help="profile one extra SFT step with torch.profiler")
    parser.add_argument("--compile-blocks", action="store_true",
                        help="SFT with model.compile_blocks (each layer's MLP and norms compiled; not the sdpa baseline)")
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--grpo-steps", type=int, default=6)
    parser.add_argument("--decode", nargs="+", default=["compiled", "generate"], choices=("compiled", "static", "generate"),
                        help="the hf engine's decoding, one GRPO run each")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch
    import transformers

    if not torch.cuda.is_available():
        sys.exit("benchmarks/gpu.py needs a CUDA device")
    started = time.perf_counter()
    from oxrl.models.cuda_attention import VARLEN

    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
          f"transformers {transformers.__version__}, flash_attn importable: {importlib.util.find_spec('flash_attn') is not None}, "
          f"torch varlen: {VARLEN.function is not None} {getattr(VARLEN, 'causal', '')}", flush=True)
    measured = measure_bf16_peak()
    print(f"bf16 matmul peak: {measured.flops_per_s / 1e12:.0f} TFLOP/s measured (best of square {measured.size}^3 "
          f"matmuls); datasheet H100 SXM dense bf16: {H100_SXM_BF16_DENSE / 1e12:.0f} TFLOP/s")
    if args.part in ("all", "checks"):
        reported(checks_part)
    if args.part == "checks":
        return
    with tempfile.TemporaryDirectory() as folder:
        save_random_model(Path(folder), args.tokenizer)
        if args.part in ("all", "sft"):
            reported(sft_part, args, Path(folder), measured)
        if args.part in ("all", "grpo"):
            reported(grpo_part, args, Path(folder))
    print(f"whole run: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
