"""`oxrl` / `python -m oxrl`: train, eval, config-reference, doctor."""

from __future__ import annotations

import argparse
import errno
import logging
import sys
from pathlib import Path

logger = logging.getLogger("oxrl.cli")


def _cmd_train(args: argparse.Namespace) -> int:
    from oxrl.config.load import load_config
    from oxrl.runner import run

    cfg = load_config(args.config, args.overrides)
    result = run(cfg)
    logger.info("done: %s", result.run_dir)
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from oxrl.evaluation.run import EvalRequest, evaluate_models, format_table

    request = EvalRequest(model=args.model, baseline=args.baseline, config=args.config, task=args.task, data=args.data,
                          rewards=args.reward, n=args.n, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                          limit=args.limit, engine=args.engine, seed=args.seed, out=args.out, overrides=args.set)
    sys.stdout.write(format_table(evaluate_models(request)))
    return 0


def _cmd_config_reference(args: argparse.Namespace) -> int:
    from oxrl.config.reference import config_reference

    sys.stdout.write(config_reference())
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from oxrl.doctor import report

    sys.stdout.write(report())
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from oxrl.logging.bug_report import write_bug_report

    path = write_bug_report(Path(args.run_dir))
    logger.info("wrote %s: check it holds nothing private, then paste it into an issue", path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="oxrl", description="Post-training for language models: SFT, preference optimisation, RL.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train from a YAML config", description="Train from a YAML config, with dotted overrides.")
    train.add_argument("config", help="path to the YAML config")
    train.add_argument("overrides", nargs="*", help="dotted overrides such as train.optim.lr=1e-6 data.max_length=512")
    train.set_defaults(func=_cmd_train)
    add_eval_parser(sub)
    ref = sub.add_parser("config-reference", help="print the reference of every config field (markdown)",
                         description="Print the reference of every config field, generated from the schema.")
    ref.set_defaults(func=_cmd_config_reference)
    report = sub.add_parser("report", help="write a bug report of a run (Markdown, to paste into an issue)",
                            description="Write <run dir>/bug_report.md: versions, hardware, the run's config, its last "
                            "log lines and the traceback that stopped it. Reads only this machine; sends nothing.")
    report.add_argument("run_dir", help="the run directory, e.g. runs/grpo-20261123-0612")
    report.set_defaults(func=_cmd_report)
    doctor = sub.add_parser("doctor", help="report usable hardware and backends", description="Report which devices, strategies and backends are usable here, and why not. Changes nothing.")
    doctor.set_defaults(func=_cmd_doctor)
    return parser


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
    ev.add_argument("--seed", type=int, help="seed of the task's prompts and of sampling (default: the config's, 0)")
    ev.add_argument("--config", metavar="CFG.yaml", help="RL config whose data, rl and run sections to use (MODEL replaces its model)")
    ev.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="dotted config override, e.g. --set rl.task_config.max_operand=20; repeatable")
    ev.set_defaults(func=_cmd_eval)


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
    from oxrl.logging.setup import setup_logging

    setup_logging()
    args = build_parser().parse_args(argv)  # first: `oxrl --help` and usage errors import no torch
    from oxrl.config.load import ConfigError
    from oxrl.data.errors import DataError
    from oxrl.training.folders import OutputWriteError
    from oxrl.training.run_dir import RunDirError
    from oxrl.rewards.base import RewardTimeoutError
    from oxrl.rewards.sandbox import SandboxUnavailableError
    from oxrl.rollout.build import MissingDependencyError

    try:
        return args.func(args)
    except (ConfigError, DataError, FileNotFoundError, ValueError, MissingDependencyError, RunDirError,
            SandboxUnavailableError, RewardTimeoutError) as error:
        # Input or set-up problems: the message is the whole story, so no traceback.
        logger.error("%s", error)
        return 2
    except OSError as error:
        if not (isinstance(error, OutputWriteError) or error.errno in OUTPUT_ERRNOS):
            raise
        logger.error("%s", describe_os_error(error))
        return 2


if __name__ == "__main__":
    sys.exit(main())
