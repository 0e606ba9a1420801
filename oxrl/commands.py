"""The `oxrl` commands other than `train` (oxrl/cli.py builds their parsers and imports this module when one runs)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

logger = logging.getLogger("oxrl.cli")


def eval(args: argparse.Namespace) -> int:
    from oxrl.evaluation.request import EvalRequest

    # The flags are checked first: a bad one costs no torch import.
    request = EvalRequest(model=args.model, baseline=args.baseline, config=args.config, task=args.task, data=args.data,
                          rewards=args.reward, n=args.n, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                          limit=args.limit, engine=args.engine, seed=args.seed, out=args.out, video=args.video,
                          overrides=args.set, trust_config_code=args.trust_config_code)
    from oxrl.evaluation.run import evaluate_models, format_table

    sys.stdout.write(format_table(evaluate_models(request)))
    return 0


def config_reference(args: argparse.Namespace) -> int:
    from oxrl.config.load import load_config
    from oxrl.config.reference import config_reference, run_reference
    from oxrl.logging.redaction import redact

    if args.config is not None and "=" in args.config and not Path(args.config).exists():
        args.overrides, args.config = [args.config, *args.overrides], None  # `--algorithm dpo key=value`: no CONFIG
    if args.config is None and args.algorithm is None:
        if args.overrides:
            raise ValueError("config-reference takes overrides only with a CONFIG or --algorithm: they change a run")
        sys.stdout.write(config_reference())
        return 0
    if args.config is not None:
        if args.algorithm is not None:
            raise ValueError(f"give a CONFIG or --algorithm, not both (set algorithm.name={args.algorithm} to change "
                             f"{args.config}'s)")
        cfg, source = load_config(args.config, args.overrides), args.config
    else:  # the algorithm at its defaults: the model is the one setting with none
        cfg = load_config(None, ["model.name_or_path=<your model>", f"algorithm.name={args.algorithm}",
                                 *args.overrides])
        source = f"--algorithm {args.algorithm}"
    sys.stdout.write(redact(run_reference(cfg, source)))  # a value may hold a secret (a URL's token, say)
    return 0


def doctor(args: argparse.Namespace) -> int:
    from oxrl.doctor import report

    sys.stdout.write(report())
    return 0


def demos(args: argparse.Namespace) -> int:
    import json

    from oxrl.vla.build import record_demonstrations

    kwargs = json.loads(args.env_kwargs) if args.env_kwargs else {}
    folder, success = record_demonstrations(args.env, args.episodes, Path(args.out), seed=args.seed,
                                            max_steps=args.max_steps, env_kwargs=kwargs, noise=args.noise)
    logger.info("wrote %d demonstrations of %s to %s (the scripted expert succeeded in %.0f%%)", args.episodes, args.env,
                folder, 100 * success)
    return 0


def report(args: argparse.Namespace) -> int:
    from oxrl.logging.bug_report import write_bug_report

    path = write_bug_report(Path(args.run_dir))
    logger.info("wrote %s: check it holds nothing private, then paste it into an issue", path)
    return 0


def onboard(args: argparse.Namespace) -> int:
    from oxrl.onboard import model_slug, onboard
    from oxrl.onboard_report import format_report

    out_dir = Path(args.out) if args.out else Path("oxrl-onboard") / model_slug(args.model)
    report = onboard(args.model, out_dir, trust_remote_code=args.trust_remote_code, smoke=not args.no_smoke)
    sys.stdout.write(format_report(report))
    return 1 if report.failed else 0


def models(args: argparse.Namespace) -> int:
    from oxrl.models.catalog import format_catalog

    sys.stdout.write(format_catalog(args.registry))
    return 0


def recipe(args: argparse.Namespace) -> int:
    from oxrl.models.hardware import available_memory, parse_devices
    from oxrl.models.recipe import recipe

    devices = parse_devices(args.gpus) if args.gpus else available_memory()
    text = recipe(args.model, args.task, devices, args.algorithm, args.registry).yaml()
    if args.out:
        Path(args.out).write_text(text)
        logger.info("wrote %s", args.out)
    else:
        sys.stdout.write(text)
    return 0
