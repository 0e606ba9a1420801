"""The factory: which `Strategy` this process trains with (oxrl/training/strategy.py).

It lives apart from the interface so that the implementations (fsdp.py, deepspeed_strategy.py)
import the base class without the base module importing them back.
"""

from __future__ import annotations

import logging

from oxrl.config.names import STRATEGY_NAMES
from oxrl.config.schema import StrategyConfig, as_written
from oxrl.models import precision
from oxrl.training import distributed
from oxrl.training.allocator import keep_freed_memory
from oxrl.training.strategy import SingleDevice, Strategy

logger = logging.getLogger(__name__)


def resolve_strategy_name(name: str, world_size: int) -> str:
    """`auto`: FSDP2 when several processes were launched, else a single device."""
    if name not in STRATEGY_NAMES:
        raise ValueError(f"unknown strategy.name {name!r}; valid: {', '.join(STRATEGY_NAMES)}")
    if name == "auto":
        return "fsdp2" if world_size > 1 else "single"
    return name


def build_strategy(cfg) -> Strategy:
    """The strategy of `cfg.strategy` for this process (joins torchrun's process group when launched by it)."""
    launched = distributed.launched_world_size()
    name = resolve_strategy_name(cfg.strategy.name, launched)
    if name == "single" and launched > 1:
        raise ValueError(f"strategy.name `single` trains in one process, but {launched} were launched: "
                         "use `fsdp2` or `deepspeed` (or `auto`)")
    # Setting -> who reads it under torchrun: in one process (`auto` there) the config could not tell it is unread.
    readers = {"cpu_offload": "fsdp2 or deepspeed", "reshard_after_forward": "fsdp2", "mesh": "fsdp2"}
    defaults = StrategyConfig()
    unread = [f"strategy.{key} = {as_written(getattr(cfg.strategy, key))!r} (read by {reader})"
              for key, reader in readers.items() if name == "single" and getattr(cfg.strategy, key) != getattr(defaults, key)]
    if unread:
        raise ValueError(f"{'; '.join(unread)}: not read in one process (strategy `single`), which shards nothing; "
                         "launch several processes with torchrun")
    env = distributed.init_distributed(cfg.run.device, process_group=name != "single",
                                       timeout_s=cfg.strategy.collective_timeout_s)
    if env.rank == 0:
        logger.debug("%s", precision.describe(cfg.train.mixed_precision, env.device.type))  # train.log, not the console
    if env.device.type == "cpu" and cfg.run.keep_freed_memory:
        keep_freed_memory()
    if name == "single":
        return SingleDevice(env.device, cfg.train.mixed_precision, cfg.train.optim.max_grad_norm,
                            cfg.train.max_nonfinite_steps)
    if name == "fsdp2":
        from oxrl.training.fsdp import FSDP2Strategy

        return FSDP2Strategy(env, cfg.strategy, cfg.train.mixed_precision, cfg.train.optim.max_grad_norm,
                             cfg.train.max_nonfinite_steps)
    from oxrl.training.deepspeed_strategy import DeepSpeedStrategy

    return DeepSpeedStrategy(env, cfg.strategy, cfg.train)
