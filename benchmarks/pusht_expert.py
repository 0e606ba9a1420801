"""The scripted PushT demonstrator (`oxrl.vla.pusht_expert.PushTExpert`) on the real simulator: its success rate, best
coverage and speed over reset seeds, and the share of episodes it finishes within a few step budgets.

    .venv/bin/python benchmarks/pusht_expert.py                              # seeds 0..95, as `oxrl demos` records
    .venv/bin/python benchmarks/pusht_expert.py --held-out --episodes 24     # the VLA benchmark's held-out states
    .venv/bin/python benchmarks/pusht_expert.py --episodes 3 --max-steps 100

Each episode runs as `record_demonstrations` runs it (the `pusht` environment with its frames, one expert an
episode, stopped at success) for at most --max-steps actions (PushT's own limit is 300). The score is LeRobot's:
the episode's best coverage of the goal, and success = coverage > 95%. Prints one JSON line an episode and a summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as `python benchmarks/pusht_expert.py`: make `oxrl` importable
    sys.path.insert(0, str(ROOT))

BUDGETS = (100, 120, 150, 200, 300)  # step budgets whose success rate the summary gives


def episode(seed: int, max_steps: int) -> dict:
    """One episode from reset seed `seed`: success, best coverage, the actions taken, and the seconds."""
    from oxrl.vla.envs import expert, make_env

    env = make_env("pusht")
    try:
        env.reset(seed)
        act = expert("pusht")
        best, success, steps, planning = 0.0, False, 0, 0.0
        started = time.perf_counter()
        for steps in range(1, max_steps + 1):
            before = time.perf_counter()
            action = act(env.info)
            planning += time.perf_counter() - before
            transition = env.step(action, f"seed {seed}")
            best = max(best, float(transition.info.get("coverage", 0.0)))
            success = transition.success
            if transition.success or transition.done:
                break
        return {"seed": seed, "success": success, "coverage": round(best, 4), "steps": steps,
                "seconds": round(time.perf_counter() - started, 2),
                "expert_seconds_per_step": round(planning / steps, 4)}
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=96)
    parser.add_argument("--max-steps", type=int, default=300, help="actions an episode at most")
    parser.add_argument("--first-seed", type=int, default=0, help="reset seed of the first episode")
    parser.add_argument("--held-out", action="store_true",
                        help="start at the VLA benchmark's held-out seeds (oxrl.vla.build.VALIDATION_SEEDS)")
    args = parser.parse_args()

    from oxrl.vla.build import VALIDATION_SEEDS

    first = VALIDATION_SEEDS + args.first_seed if args.held_out else args.first_seed
    results = []
    for seed in range(first, first + args.episodes):
        results.append(episode(seed, args.max_steps))
        print(json.dumps(results[-1]), flush=True)
    coverage = [r["coverage"] for r in results]
    steps = [r["steps"] for r in results if r["success"]]
    seconds = sum(r["seconds"] for r in results)
    print(json.dumps({"summary": {
        "seeds": f"{first}..{first + args.episodes - 1}", "max_steps": args.max_steps,
        "success": round(sum(r["success"] for r in results) / len(results), 3),
        "coverage_mean": round(statistics.mean(coverage), 4),
        "coverage_std": round(statistics.pstdev(coverage), 4), "coverage_min": min(coverage),
        "steps_to_success": {"median": statistics.median(steps), "max": max(steps)} if steps else None,
        "success_within": {budget: round(sum(s <= budget for s in steps) / len(results), 3)
                           for budget in BUDGETS if budget <= args.max_steps},
        "seconds_per_episode": round(seconds / len(results), 2),
        "seconds_per_step": round(seconds / sum(r["steps"] for r in results), 4),
        "expert_seconds_per_step": round(sum(r["expert_seconds_per_step"] * r["steps"] for r in results)
                                         / sum(r["steps"] for r in results), 4)}}))


if __name__ == "__main__":
    main()
