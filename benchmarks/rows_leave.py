"""What dropping finished rows between rounds of `generate` saves, on the GRPO demo's own decoding.

    .venv/bin/python benchmarks/rows_leave.py                 # 5 timed calls of each
    .venv/bin/python benchmarks/rows_leave.py --repeats 3
    .venv/bin/python benchmarks/rows_leave.py --repeats 1 model.name_or_path=DIR rl.validation_size=4   # demo overrides

The `hf` engine (oxrl/rollout/hf.py) decodes `ROUND_TOKENS` tokens at a time and drops the rows that finished
before the next round. This script decodes the demo's two shapes (examples/grpo_smollm2_arithmetic.yaml) both ways,
on the bundled SmolLM2-135M-Instruct, CPU:

* held-out evaluation: the demo's 64 validation prompts, greedy, up to 64 new tokens, on the fp32 weights;
* one step's sampling: 4 training prompts x 8 samples at temperature 0.8, up to 64 new tokens, from the bf16 copy
  where this CPU has native bf16 (what `rl.rollout.precision: auto` picks), else from the fp32 weights.

"one call" sets `ROUND_TOKENS` to the whole budget (what the engine did before rounds). Greedy decoding must give the
same tokens both ways (checked); sampled rows differ from call to call, so their lengths are reported. Reported:
median and range of `--repeats` timed calls after one untimed call of each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/rows_leave.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.common import machine_summary, print_table

DEMO = Path(__file__).resolve().parents[1] / "examples" / "grpo_smollm2_arithmetic.yaml"


def timed(call, repeats: int) -> tuple[list[float], list]:
    call()
    seconds, results = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        results.append(call())
        seconds.append(time.perf_counter() - started)
    return seconds, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("overrides", nargs="*", help="dotted overrides of the demo's config (e.g. model.name_or_path=DIR)")
    args = parser.parse_args()

    import oxrl.rollout.hf as hf
    from oxrl.config.load import load_config
    from oxrl.loops.rl_setup import load_prompts
    from oxrl.data.rl_tasks import encode_prompts
    from oxrl.models.load import load_model, load_tokenizer
    from oxrl.loops.rl import sampling_params
    from oxrl.rollout.hf import HFEngine
    from oxrl.training.allocator import keep_freed_memory
    from oxrl.models.precision import samples_from_bf16_copy

    torch.set_num_threads(args.threads)
    keep_freed_memory()  # what `oxrl train` does on a CPU (run.keep_freed_memory)
    cfg = load_config(DEMO, args.overrides)
    tokenizer = load_tokenizer(cfg.model)
    model = load_model(cfg.model, torch.device("cpu")).eval()
    train, validation = load_prompts(cfg, cfg.rl)
    held_out = encode_prompts(validation, tokenizer).prompt_ids
    step = encode_prompts(train[: cfg.rl.prompts_per_step], tokenizer).prompt_ids
    copy = samples_from_bf16_copy(cfg.engine_precision, "cpu", shards_parameters=False)
    engine = HFEngine(model, tokenizer, max_batch_size=cfg.rl.rollout.max_batch_size, sample_in_bf16=copy)
    print("machine:", machine_summary())
    shapes = (("held-out, greedy, fp32", held_out, sampling_params(cfg, greedy=True)),
              (f"one step's samples, {'bf16 copy' if copy else 'fp32'}", step, sampling_params(cfg)))
    rows = []
    for name, ids, params in shapes:
        results = {}
        for label, per_round in (("one call", params.max_new_tokens), ("rounds", hf.ROUND_TOKENS)):
            hf_round = hf.ROUND_TOKENS
            hf.ROUND_TOKENS = per_round
            seconds, outputs = timed(lambda: engine.generate(ids, params), args.repeats)
            hf.ROUND_TOKENS = hf_round
            lengths = [len(c.completion_ids) for out in outputs for c in out]
            results[label] = [[c.completion_ids for c in out] for out in outputs]
            rows.append({"decoding": name, "how": label if label == "one call" else f"rounds of {per_round}",
                         "seconds median (min..max)": f"{statistics.median(seconds):.2f} "
                                                      f"({min(seconds):.2f}..{max(seconds):.2f})",
                         "completion tokens mean / max": f"{statistics.mean(lengths):.1f} / {max(lengths)}"})
        if params.temperature == 0 and results["one call"][0] != results["rounds"][0]:
            raise SystemExit(f"{name}: rounds decoded other tokens than one call")
    print_table(rows, f"HFEngine.generate on the demo's shapes, {args.repeats} timed calls each")


if __name__ == "__main__":
    main()
