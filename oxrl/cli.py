"""`oxrl` / `python -m oxrl`: train, config-reference, doctor."""

from __future__ import annotations

import argparse
import errno
import logging
import sys

logger = logging.getLogger("oxrl.cli")


def _cmd_train(args: argparse.Namespace) -> int:
    from oxrl.config.load import load_config
    from oxrl.runner import run

    cfg = load_config(args.config, args.overrides)
    result = run(cfg)
    logger.info("done: %s", result.run_dir)
    return 0


def _cmd_config_reference(args: argparse.Namespace) -> int:
    from oxrl.config.reference import config_reference

    sys.stdout.write(config_reference())
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from oxrl.doctor import report

    sys.stdout.write(report())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="oxrl", description="Post-training for language models: SFT, preference optimisation, RL.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train from a YAML config", description="Train from a YAML config, with dotted overrides.")
    train.add_argument("config", help="path to the YAML config")
    train.add_argument("overrides", nargs="*", help="dotted overrides such as train.optim.lr=1e-6 data.max_length=512")
    train.set_defaults(func=_cmd_train)
    ref = sub.add_parser("config-reference", help="print the reference of every config field (markdown)",
                         description="Print the reference of every config field, generated from the schema.")
    ref.set_defaults(func=_cmd_config_reference)
    doctor = sub.add_parser("doctor", help="report usable hardware and backends", description="Report which devices, strategies and backends are usable here, and why not. Changes nothing.")
    doctor.set_defaults(func=_cmd_doctor)
    return parser


# Errors of the output location (full disk, read-only, a file in the way): one line naming the path.
OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR,
                           errno.EEXIST, errno.EISDIR})


def describe_os_error(error: OSError) -> str:
    """`could not write <path>: <reason>` (an OutputWriteError already reads so)."""
    from oxrl.engine.folders import OutputWriteError

    if isinstance(error, OutputWriteError) or not error.filename:
        return str(error)
    return f"could not write {error.filename}: {error.strerror}"


def main(argv: list[str] | None = None) -> int:
    from oxrl.config.load import ConfigError
    from oxrl.data.errors import DataError
    from oxrl.engine.folders import OutputWriteError
    from oxrl.engine.run_dir import RunDirError
    from oxrl.logging.setup import setup_logging
    from oxrl.rewards.base import RewardTimeoutError
    from oxrl.rewards.sandbox import SandboxUnavailableError
    from oxrl.rollout.build import MissingDependencyError

    setup_logging()
    args = build_parser().parse_args(argv)
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
