"""A built-in simulator's scripted demonstrator (`oxrl.vla.envs.expert`) on the real simulator: its success rate, best
score and speed over reset seeds, and the share of episodes it finishes within a few step budgets.

    .venv/bin/python benchmarks/experts.py pusht                              # seeds 0..95, as `oxrl demos` records
    .venv/bin/python benchmarks/experts.py pusht --held-out --episodes 24     # the VLA benchmark's held-out states
    .venv/bin/python benchmarks/experts.py panda-push --episodes 60 --max-steps 100

Each episode runs as `record_demonstrations` runs it (the environment with its frames, one expert an episode,
stopped at success) for at most --max-steps actions (PushT's own limit is 300, panda-gym's 50). The score is the
episode's best: for PushT LeRobot's coverage of the goal (success = coverage > 95%), for panda-push its dense reward,
minus the cube's distance to the target in metres (success = within 5 cm). Prints one JSON line an
episode and a summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as `python benchmarks/experts.py`: make `oxrl` importable
    sys.path.insert(0, str(ROOT))

BUDGETS = (50, 100, 120, 150, 200, 300)  # step budgets whose success rate the summary gives


def episode(name: str, seed: int, max_steps: int) -> dict:
    """One episode from reset seed `seed`: success, best score, the actions taken, and the seconds."""
    from oxrl.vla.envs import expert, make_env

    env = make_env(name)
    try:
        env.reset(seed)
        act = expert(name)
        best, success, steps, planning = -float("inf"), False, 0, 0.0
        started = time.perf_counter()
        for steps in range(1, max_steps + 1):
            before = time.perf_counter()
            action = act(env.info)
            planning += time.perf_counter() - before
            transition = env.step(action, f"seed {seed}")
            # PushT's coverage (its reward is coverage / 0.95, capped at 1); else the reward
            best = max(best, float(transition.info.get("coverage", transition.reward)))
            success = transition.success
            if transition.success or transition.done:
                break
        return {"seed": seed, "success": success, "score": round(best, 4), "steps": steps,
                "seconds": round(time.perf_counter() - started, 2),
                "expert_seconds_per_step": round(planning / steps, 4)}
    finally:
        env.close()


def main() -> None:
    from oxrl.config.names import ROBOT_ENVIRONMENTS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("env", choices=[name for name in ROBOT_ENVIRONMENTS if name != "reach"],
                        help="the built-in simulator")
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
        results.append(episode(args.env, seed, args.max_steps))
        print(json.dumps(results[-1]), flush=True)
    score = [r["score"] for r in results]
    steps = [r["steps"] for r in results if r["success"]]
    seconds = sum(r["seconds"] for r in results)
    print(json.dumps({"summary": {
        "env": args.env, "seeds": f"{first}..{first + args.episodes - 1}", "max_steps": args.max_steps,
        "success": round(sum(r["success"] for r in results) / len(results), 3),
        "score_mean": round(statistics.mean(score), 4),
        "score_std": round(statistics.pstdev(score), 4), "score_min": min(score),
        "steps_to_success": {"median": statistics.median(steps), "max": max(steps)} if steps else None,
        "success_within": {budget: round(sum(s <= budget for s in steps) / len(results), 3)
                           for budget in BUDGETS if budget <= args.max_steps},
        "seconds_per_episode": round(seconds / len(results), 2),
        "seconds_per_step": round(seconds / sum(r["steps"] for r in results), 4),
        "expert_seconds_per_step": round(sum(r["expert_seconds_per_step"] * r["steps"] for r in results)
                                         / sum(r["steps"] for r in results), 4)}}))


if __name__ == "__main__":
    main()
