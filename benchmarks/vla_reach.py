"""GRPO on the built-in `reach` task over seeds, in bf16 and in fp32: the recipe tests/integration/test_vla_training.py
asserts on one seed (a tiny random Qwen2-VL cloned from 48 scripted demonstrations, then GRPO on 8 initial states x
8 episodes a step), repeated so that its held-out lift can be read against the seed spread.

    .venv/bin/python benchmarks/vla_reach.py                  # seeds 0-5 in bf16 and fp32: about 7 minutes on 2 cores
    .venv/bin/python benchmarks/vla_reach.py --lr 1e-2 --precisions bf16 --out runs/vla-reach-1e-2
    .venv/bin/python benchmarks/vla_reach.py --out /tmp/reach --seeds 0 --precisions fp32 --episodes 4 --sft-steps 1 \
        --steps 1 --held-out 2 --tokenizer DIR

`train.mixed_precision: auto` computes in bf16 on a CPU with bf16 instructions and in fp32 on one without, so a
learning claim the suite asserts has to hold in both; here each is set explicitly (`bf16`: bf16 autocast and a bf16
rollout copy, what `auto` picks on such a CPU; `fp32`: fp32 throughout, what it picks on any other). Per precision
the model is cloned once (seed 0, as in the test); each seed then runs GRPO from that clone (the seed sets the
sampling and the order of the training states). Held-out success is greedy, over the same initial states before and
after. Prints a row per run and, per precision, the lift's mean, spread and lowest value.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

from benchmarks.common import PRECISIONS  # noqa: E402  (--precision -> train.mixed_precision)

VLA = {"env": "reach", "bins": 16, "max_chunks": 4}
QUIET = {"progress_bar": False, "plot": False}
# What `auto` computes in on a CPU with and without bf16 instructions, set explicitly: train.mixed_precision as the
# other benchmarks set it, and beside it the weights the rollout samples from (rl.rollout.precision).
MIXED_PRECISION = {"auto": "auto", **PRECISIONS}
ROLLOUT_PRECISION = {"auto": "auto", "bf16": "bf16", "fp32": "trainer"}


def clone_config(out: Path, base: Path, demos: Path, *, precision: str = "auto", max_steps: int = 40) -> Path:
    """Behaviour cloning of `base` on the demonstrations in `demos` (seed 0), as a config file in `out`."""
    config = {"run": {"name": f"sft_{precision}", "output_dir": str(out / "runs"), "device": "cpu", "seed": 0},
              "model": {"name_or_path": str(base)}, "algorithm": {"name": "sft"},
              "vla": {key: VLA[key] for key in ("env", "bins")}, "logging": QUIET,  # (max_chunks: RL's)
              "data": {"train": [{"path": str(demos), "format": "lerobot"}], "max_length": 128, "validation_fraction": 0},
              "train": {"max_steps": max_steps, "global_batch_size": 16, "micro_batch_size_per_device": 16,
                        "optim": {"lr": 1e-2}, "mixed_precision": MIXED_PRECISION[precision]},
              "checkpoint": {"every": None}}
    path = out / f"sft_{precision}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def grpo_config(out: Path, model: Path, name: str, *, seed: int = 0, precision: str = "auto", held_out: int = 64,
                **train) -> Path:
    """GRPO over reach's episodes from `model`, validated greedily on `held_out` initial states before and after."""
    config = {"run": {"name": name, "output_dir": str(out / "runs"), "device": "cpu", "seed": seed},
              "model": {"name_or_path": str(model)}, "algorithm": {"name": "grpo"}, "vla": VLA, "logging": QUIET,
              "rl": {"task_size": 64, "validation_size": held_out, "prompts_per_step": 8,
                     "rollout": {"n": 8, "precision": ROLLOUT_PRECISION[precision]}, "validation_every": 100},
              "train": {"max_steps": 20, "micro_batch_size_per_device": 16, "optim": {"lr": 1e-2},
                        "mixed_precision": MIXED_PRECISION[precision], **train},
              "checkpoint": {"every": None}}
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def lift_summary(rows: list[dict]) -> dict[str, str]:
    """One precision's runs: success before, after (mean +- std, min..max) and the lift in points."""
    after = [row["after"] for row in rows]
    lifts = [row["after"] - row["before"] for row in rows]
    deviation = statistics.stdev(lifts) if len(lifts) > 1 else 0.0
    return {"runs": str(len(rows)), "before": f"{100 * rows[0]['before']:.1f}%",
            "after": f"{100 * statistics.mean(after):.1f}% ({100 * min(after):.1f}..{100 * max(after):.1f})",
            "lift (points)": f"{100 * statistics.mean(lifts):+.1f} +- {100 * deviation:.1f}",
            "lowest lift": f"{100 * min(lifts):+.1f}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/vla-reach"))
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(6)), help="GRPO's run seeds")
    parser.add_argument("--precisions", nargs="+", choices=("bf16", "fp32"), default=["bf16", "fp32"])
    parser.add_argument("--lr", type=float, default=3e-3, help="GRPO's learning rate (the test's)")
    parser.add_argument("--steps", type=int, default=20, help="GRPO steps (the test's)")
    parser.add_argument("--episodes", type=int, default=48, help="scripted demonstrations cloned")
    parser.add_argument("--sft-steps", type=int, default=40)
    parser.add_argument("--held-out", type=int, default=64, help="held-out initial states evaluated")
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="a folder with tokenizer files (default: the bundled SmolLM2's, read from its GGUF file)")
    args = parser.parse_args()

    from benchmarks.common import machine_summary, print_table
    from oxrl.cli import main as oxrl_main
    from oxrl.config.load import load_config
    from oxrl.logging.setup import setup_logging
    from oxrl.runner import run
    from tests.conftest import smollm2_tokenizer
    from tests.vlm_fixtures import save_tiny_qwen2_vl

    setup_logging()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.tokenizer is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    else:
        tokenizer = smollm2_tokenizer.__wrapped__()
    base = save_tiny_qwen2_vl(out / "base", tokenizer)
    if oxrl_main(["demos", "reach", "--episodes", str(args.episodes), "--out", str(out / "demos")]) != 0:
        raise RuntimeError(f"oxrl demos reach could not record {args.episodes} demonstrations in {out / 'demos'}")

    runs, summaries = [], []
    for precision in args.precisions:
        cloned = run(load_config(clone_config(out, base, out / "demos", precision=precision,
                                              max_steps=args.sft_steps))).final_model_dir
        rows = []
        for seed in args.seeds:
            name = f"grpo_{precision}_seed{seed}"
            started = time.perf_counter()
            result = run(load_config(grpo_config(out, cloned, name, seed=seed, precision=precision,
                                                 held_out=args.held_out, max_steps=args.steps,
                                                 optim={"lr": args.lr})))
            summary = json.loads((result.run_dir / "summary.json").read_text())
            rows.append({"before": summary["accuracy_before"], "after": summary["accuracy_after"]})
            runs.append({"precision": precision, "seed": str(seed),
                         "before": f"{100 * summary['accuracy_before']:.1f}%",
                         "after": f"{100 * summary['accuracy_after']:.1f}%",
                         "lift (points)": f"{100 * (summary['accuracy_after'] - summary['accuracy_before']):+.1f}",
                         "seconds": f"{time.perf_counter() - started:.0f}"})
            print(json.dumps({"stage": name, **runs[-1]}), flush=True)
        summaries.append({"precision": precision, **lift_summary(rows)})

    setting = f"lr {args.lr:g}, {args.steps} steps, {args.held_out} held-out initial states"
    print_table(runs, f"GRPO on reach from the cloned model, each run ({setting})")
    print_table(summaries, f"GRPO on reach over seeds {', '.join(map(str, args.seeds))} ({setting})")
    print_table([{"machine": key, "value": value} for key, value in machine_summary().items()], "Machine")


if __name__ == "__main__":
    main()
