"""`oxrl` / `python -m oxrl`: train, eval, config-reference, report, doctor, models, recipe, onboard."""

from __future__ import annotations

import argparse
import errno
import logging
import sys
from pathlib import Path

logger = logging.getLogger("oxrl.cli")


def _cmd_train(args: argparse.Namespace) -> int:
    from oxrl.training.signals import install, restore, stop_at_once

    # SIGTERM and Ctrl-C stop at once until training starts; the training loop finishes its step (signals.py).
    previous = install(stop_at_once)
    try:
        from oxrl.config.load import load_config
        from oxrl.runner import run

        cfg = load_config(args.config, args.overrides)
        result = run(cfg)
    finally:
        restore(previous)
    logger.info("done: %s", result.run_dir)
    return 0


def continue_command(args: argparse.Namespace, run_dir: Path) -> str:
    """The `oxrl train` command that resumes the run in `run_dir`, stopped by a signal: the same config and
    overrides, with the run's name (a default name is new at every start) and run.resume=true."""
    import shlex

    kept = [o for o in args.overrides if not o.startswith(("run.name=", "run.resume=", "run.overwrite="))]
    return shlex.join(["oxrl", "train", args.config, *kept, f"run.name={run_dir.name}", "run.resume=true"])


def _elsewhere(name: str):
    """The handler `name` of oxrl/commands.py, imported when its command runs: a training run reads none of them."""
    def run(args: argparse.Namespace) -> int:
        from oxrl import commands

        return getattr(commands, name)(args)

    return run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="oxrl", description="Post-training for language models: SFT, preference optimisation, RL.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train from a YAML config", description="Train from a YAML config, with dotted overrides.")
    train.add_argument("config", help="path to the YAML config")
    train.add_argument("overrides", nargs="*", help="dotted overrides such as train.optim.lr=1e-6 data.max_length=512")
    train.set_defaults(func=_cmd_train)
    add_eval_parser(sub)
    ref = sub.add_parser("config-reference", help="print the reference of every config field, or of those one run "
                         "reads (markdown)", description="Print the reference of every config field, generated from "
                         "the schema; with a CONFIG (or --algorithm), only the settings that run reads, with their "
                         "values.")
    ref.add_argument("config", nargs="?", help="a YAML config: list only what its run reads")
    ref.add_argument("overrides", nargs="*", help="dotted overrides, as `oxrl train` takes them")
    ref.add_argument("--algorithm", help="an algorithm at its defaults, e.g. dapo: list only what its run reads")
    ref.set_defaults(func=_elsewhere("config_reference"))
    report = sub.add_parser("report", help="write a bug report of a run (Markdown, to paste into an issue)",
                            description="Write <run dir>/bug_report.md: versions, hardware, the run's config, its last "
                            "log lines and the traceback that stopped it. Reads only this machine; sends nothing.")
    report.add_argument("run_dir", help="the run directory, e.g. runs/grpo-20261123-0612")
    report.set_defaults(func=_elsewhere("report"))
    doctor = sub.add_parser("doctor", help="report usable hardware and backends", description="Report which devices, strategies and backends are usable here, and why not. Changes nothing.")
    doctor.set_defaults(func=_elsewhere("doctor"))
    add_model_parsers(sub)
    from oxrl.config.names import ROBOT_ENVIRONMENTS  # names only: no torch

    demos = sub.add_parser("demos", help="record a built-in simulator's scripted demonstrations (a LeRobot dataset)",
                           description="Record EPISODES demonstrations of a built-in environment's scripted expert, from "
                           "reset seeds SEED, SEED + 1, ..., as a LeRobot dataset folder for `sft` (docs/vla.md).")
    demos.add_argument("env", choices=list(ROBOT_ENVIRONMENTS), help="the environment")
    demos.add_argument("--out", required=True, metavar="DIR", help="the dataset folder to create (must not exist)")
    demos.add_argument("--episodes", type=int, default=64, help="demonstrations to record (default 64)")
    demos.add_argument("--seed", type=int, default=0, help="the first reset seed (default 0)")
    demos.add_argument("--max-steps", type=int, default=64, help="actions per demonstration at most (default 64)")
    demos.add_argument("--env-kwargs", metavar="JSON", help="the environment's keyword arguments, as in vla.env_kwargs")
    demos.add_argument("--noise", type=float, default=0.0, help="DART: noise on executed actions (x half their range)")
    demos.set_defaults(func=_elsewhere("demos"))
    return parser


def add_model_parsers(sub) -> None:
    registry_help = "a registry file to add (e.g. the registry_entry.yaml `oxrl onboard` wrote); repeatable"
    models = sub.add_parser("models", help="list the model registry and what fits which hardware",
                            description="List the models oxRL has recipes for (oxrl/models/registry.yaml): family, size, "
                            "context, whether the family is in oxRL's architecture matrix, and the layout a "
                            "fine-tune needs on common GPUs, from the memory estimate.")
    models.add_argument("--registry", action="append", default=[], metavar="FILE", help=registry_help)
    models.set_defaults(func=_elsewhere("models"))
    rec = sub.add_parser("recipe", help="print a ready config for a model, a task and your hardware",
                         description="Print a config for MODEL on --task that fits --gpus: the strategy for the device "
                         "count and the first of full fine-tune, + activation checkpointing, LoRA, LoRA + checkpointing "
                         "(each with the task's micro-batch, then halves of it) that the memory estimate says fits.")
    rec.add_argument("model", help="a registry name (`oxrl models`), a local model folder or a hub id")
    rec.add_argument("--task", required=True, help="a task preset: math, countdown, reasoning or chat")
    rec.add_argument("--gpus", metavar="SPEC", help="COUNTxSIZE such as 8x80GB or 1x24GB, or `cpu` (default: this machine)")
    rec.add_argument("--algorithm", help="replace the task's algorithm (e.g. grpo, ppo, dpo)")
    rec.add_argument("--out", metavar="FILE.yaml", help="write the config there instead of printing it")
    rec.add_argument("--registry", action="append", default=[], metavar="FILE", help=registry_help)
    rec.set_defaults(func=_elsewhere("recipe"))
    onboard = sub.add_parser(
        "onboard", help="check a model before training it (chat template, attention, LoRA, memory, 1-step runs)",
        description="Check MODEL read-only before spending GPU hours on it: its chat template (assistant mask, "
        "generation prompt, prefix stability, eos/pad), packed attention and LoRA targets on a 2-layer truncated copy, "
        "a memory estimate for this machine, and one SFT and one GRPO step on the copy. Writes report.md, "
        "registry_entry.yaml and the copy under --out; changes nothing of MODEL. Exit code 1 when a check fails.")
    onboard.add_argument("model", help="hub id, local Hugging Face folder, .gguf file or bundled alias")
    onboard.add_argument("--out", metavar="DIR", help="output folder (default: ./oxrl-onboard/<model>)")
    onboard.add_argument("--trust-remote-code", action="store_true",
                         help="allow the model's own code from the hub to run (off unless you trust it)")
    onboard.add_argument("--no-smoke", action="store_true", help="skip the one-step SFT and GRPO runs")
    onboard.set_defaults(func=_elsewhere("onboard"))


def add_eval_parser(sub) -> None:
    ev = sub.add_parser(
        "eval", help="evaluate a model without training it (greedy accuracy, pass@k)",
        description="Evaluate MODEL (and --baseline on the same prompts): greedy accuracy, and pass@k with --n K > 1, "
        "mean reward and completion lengths. Prompts, rewards and sampling are those of the RL config (--config, a run "
        "directory's config.yaml, or the flags): a task's held-out prompts, as RL validation uses, or every row of "
        "--data files. See docs/evaluation.md.")
    ev.add_argument("model", help="model folder, run directory (its final/, else its latest checkpoint), .gguf file, "
                    "hub id or bundled alias (smollm2-135m-instruct)")
    ev.add_argument("--task", help="generated task: arithmetic or a reasoning-gym dataset (its held-out prompts)")
    ev.add_argument("--data", action="append", default=[], metavar="FILE",
                    help="prompt file (GSM8K, OpenR1 or RL2 rows), every row evaluated; repeatable")
    ev.add_argument("--reward", action="append", default=[], metavar="SPEC",
                    help="reward as in rl.rewards[].name: math, format, code, reasoning_gym, pkg.module:fn or "
                    "file.py:fn; repeatable, the first decides correctness (default: the task's reward)")
    ev.add_argument("--n", type=int, default=1, metavar="K", help="samples per prompt for pass@k (1: greedy only; default 1)")
    ev.add_argument("--temperature", type=float, metavar="T", help="sampling temperature of the --n samples (default: the config's, 1.0)")
    ev.add_argument("--max-new-tokens", type=int, metavar="N", help="completion length limit (default: the config's, 256)")
    ev.add_argument("--limit", type=int, metavar="N", help="evaluate only the first N prompts")
    ev.add_argument("--engine", choices=["hf", "vllm"], help="rollout engine (default: the config's, hf)")
    ev.add_argument("--baseline", metavar="MODEL", help="a second model, evaluated on exactly the same prompts")
    ev.add_argument("--out", metavar="FILE.jsonl", help="write every sample (prompt, completion, rewards, correct, model)")
    ev.add_argument("--video", metavar="FILE.gif", help="a vla config's greedy episodes (default: RUN_DIR/eval_episodes.gif)")
    ev.add_argument("--seed", type=int, help="seed of the task's prompts and of sampling (default: the config's, 0)")
    ev.add_argument("--config", metavar="CFG.yaml", help="RL config whose data, rl and run sections to use (MODEL replaces its model)")
    ev.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="dotted config override, e.g. --set rl.task_config.max_operand=20; repeatable")
    ev.add_argument("--trust-config-code", action="store_true", help="run the code a run directory's saved config.yaml "
                    "names (extensions, reward and environment files, module:factory, trust_remote_code) and send to the "
                    "hosts it names (a judge's url, with your api_key_env key): off, as anyone may have written that "
                    "config; --config and --set are yours and always run")
    ev.set_defaults(func=_elsewhere("eval"))


# Errors of the output location (full disk, read-only, a file in the way): one line naming the path.
OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR,
                           errno.EEXIST, errno.EISDIR})


def describe_os_error(error: OSError) -> str:
    """`could not write <path>: <reason>` (an OutputWriteError already reads so)."""
    from oxrl.training.folders import OutputWriteError

    if isinstance(error, OutputWriteError) or not error.filename:
        return str(error)
    return f"could not write {error.filename}: {error.strerror}"


def main(argv: list[str] | None = None) -> int:
    from oxrl.logging.redaction import print_redacted_traceback
    from oxrl.logging.setup import setup_logging

    setup_logging()
    if argv is None:  # the `oxrl` command itself: a traceback nothing catches is printed redacted too
        sys.excepthook = print_redacted_traceback
    args = build_parser().parse_args(argv)  # first: `oxrl --help` and usage errors import no torch
    from oxrl.errors import USER_ERRORS
    from oxrl.training.folders import OutputWriteError
    from oxrl.errors import RunStopped

    try:
        return args.func(args)
    except USER_ERRORS as error:
        # Input or set-up problems (ConfigError and DataError are ValueErrors): the message is the whole
        # story, so no traceback.
        logger.error("%s", error)
        return 2
    except RunStopped as stop:  # SIGTERM or Ctrl-C: no failure, one line on how to continue
        if stop.run_dir is not None:
            logger.warning("%s; continue with: %s", stop, continue_command(args, stop.run_dir))
        else:  # a run stopped before it claimed its directory (or a rank other than 0, which logs no INFO)
            logger.info("%s, before the run began: nothing to resume", stop)
        return stop.exit_code
    except KeyboardInterrupt:
        logger.warning("interrupted")
        return 130
    except ModuleNotFoundError as error:
        if error.name != "torch":
            raise
        from oxrl.dependencies import TORCH_HINT

        logger.error("%s", TORCH_HINT)
        return 2
    except OSError as error:
        if not (isinstance(error, OutputWriteError) or error.errno in OUTPUT_ERRNOS):
            raise
        logger.error("%s", describe_os_error(error))
        return 2


if __name__ == "__main__":
    sys.exit(main())
