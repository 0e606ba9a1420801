"""The Ray driver of a `run.launcher: ray` run: `oxrl train cfg.yaml` with the `ray` section's worker groups.

    check     the config's prompts and rewards are read, and a named run's directory is checked (in use by
              another run, or holding one), before any worker starts: bad input fails here
    attach    to `ray.address` (a cluster `ray start --head` runs) or start a private Ray instance
    place     every group's placement group fits the cluster, or PlacementError naming the group
    start     rollout workers and reward workers, then the trainer ranks, which run the RL loop
    watch     the first trainer that fails or dies stops the run; every worker is ended with it

Ray is the control plane only: weights move over torch.distributed groups (the trainers' own, and the weight
group of oxrl/cluster/weight_channel.py), never through Ray's object store; prompts, completions and rewards
travel as task arguments and results. Ray restarts a dead rollout or reward worker (`ray.max_restarts`); a
trainer that dies ends the run, which `run.resume: true` continues from its last checkpoint.
"""

from __future__ import annotations

import logging
import os
import sys

from oxrl.cluster.placement import check_fits, placements, reserve
from oxrl.cluster.remote_engine import RemoteWorkers, WorkerError
from oxrl.cluster.workers import RewardWorker, RolloutWorker, TrainerWorker
from oxrl.config.schema import Config
from oxrl.dependencies import MissingDependencyError, install_hint

logger = logging.getLogger(__name__)

MIN_RAY = (2, 40)
INSTALL_HINT = f"install it with `{install_hint('ray')}`"


class TrainerDiedError(RuntimeError):
    """A trainer rank's process died: the run stopped at its last checkpoint."""


def require_ray():
    try:
        import ray
    except ImportError as error:
        raise MissingDependencyError(f"run.launcher is `ray` but Ray is not installed: {INSTALL_HINT}") from error
    version = tuple(int(part) for part in ray.__version__.split(".")[:2])
    if version < MIN_RAY:
        raise MissingDependencyError(f"run.launcher `ray` needs Ray >= 2.40, found {ray.__version__}: {INSTALL_HINT}")
    return ray


def run_on_ray(cfg: Config, entry):
    """Run `entry(cfg, remote)` (oxrl.runner.run_rl) on every trainer rank; rank 0's result."""
    ray = require_ray()
    _check_inputs(cfg)
    started_here = not ray.is_initialized()
    if started_here:
        # `local`, not None, for no address: None would attach to whatever cluster `ray start` left on this machine.
        # Ray's own start-up lines ("Started a local Ray instance", the notice that token authentication is on by
        # default) say nothing to an oxRL user: its `ray` logger is quiet for the start (ray.init's logging_level),
        # then back at warnings. The workers' lines (the trainers' logs) still reach this console (log_to_driver).
        ray.init(address=cfg.ray.address or "local", include_dashboard=False, log_to_driver=True,
                 logging_level=logging.ERROR,
                 runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}})
        logging.getLogger("ray").setLevel(logging.WARNING)
    actors, groups = [], []
    try:
        layout = placements(cfg.ray)
        check_fits(layout, [node["Resources"] for node in ray.nodes() if node["Alive"]])
        reserved = {}
        for placement in layout:
            if placement.bundles:
                reserved[placement.group] = reserve(placement, cfg.ray.placement_timeout_s)
                groups.append(reserved[placement.group])
        reserved.setdefault("rollout", reserved["trainers"])  # colocated: in the trainers' bundles
        by_group = {p.group: p for p in layout}
        logger.info("Ray %s: %d trainer rank(s), %d rollout worker(s) (`%s` engine), %d reward worker(s), %s; cluster %s",
                    ray.__version__, cfg.ray.trainers.count, cfg.ray.rollout.count, cfg.rl.rollout.engine,
                    cfg.ray.reward.count, cfg.ray.layout, ray.cluster_resources())

        def start(cls, group: str, index: int, *args, restarts: int = 0):
            bundle, cpus, gpus = by_group[group].workers[index]
            actor = ray.remote(cls).options(
                num_cpus=cpus, num_gpus=gpus, max_restarts=restarts,
                # Reward workers hold no state: Ray retries their calls itself. A rollout worker's retry
                # needs the current weights first, which the trainer does (oxrl/cluster/remote_engine.py).
                max_task_retries=restarts if cls is RewardWorker else 0,
                scheduling_strategy=ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(
                    reserved[group], placement_group_bundle_index=bundle),
            ).remote(*args)
            actors.append(actor)
            return actor

        rollout = [start(RolloutWorker, "rollout", i, cfg, i, restarts=cfg.ray.max_restarts)
                   for i in range(cfg.ray.rollout.count)]
        reward = [start(RewardWorker, "reward", i, cfg, restarts=cfg.ray.max_restarts) for i in range(cfg.ray.reward.count)]
        _wait_started(ray, rollout, cfg.ray.call_timeout_s)
        trainers = [start(TrainerWorker, "trainers", rank, rank, cfg.ray.trainers.count)
                    for rank in range(cfg.ray.trainers.count)]
        master = ray.get(trainers[0].rendezvous.remote())
        remote = RemoteWorkers(rollout, reward, cfg.ray)
        return _watch(ray, [t.run.remote(entry, cfg, remote, master) for t in trainers])
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        for group in groups:
            ray.util.remove_placement_group(group)
        if started_here:
            ray.shutdown()


def _check_inputs(cfg: Config) -> None:
    """Prompts and rewards read, the vLLM engine importable and the run directory free, before any worker loads a
    model. (Trainer rank 0 claims the directory for the run itself; claiming it here first gives the same error,
    e.g. another run holding it, before minutes of worker start-up.)"""
    from oxrl.loops.rl_setup import load_prompts, reward_function
    from oxrl.rollout.build import require_vllm
    from oxrl.training.run_dir import claim_run_dir, run_dir_for

    if cfg.run.name:  # (an unnamed run gets a fresh default name on rank 0: nothing to clash with)
        claim_run_dir(run_dir_for(cfg.run.output_dir, cfg.run.name), cfg).release()
    if cfg.rl.rollout.engine == "vllm":
        require_vllm()
    reward_function(cfg, cfg.rl)
    train, _ = load_prompts(cfg, cfg.rl)
    if not train:
        raise ValueError("the RL run has no training prompts (data.train or rl.task)")


def _wait_started(ray, workers: list, timeout_s: float) -> None:
    refs = [w.ready.remote() for w in workers]
    _, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    for i, ref in enumerate(refs):
        if ref in pending:
            raise WorkerError(f"rollout worker {i} did not start within ray.call_timeout_s = {timeout_s:g}s")
        try:
            ray.get(ref)
        except ray.exceptions.RayError as error:
            cause = getattr(error, "cause", None) or error
            raise WorkerError(f"rollout worker {i} could not start: {cause}") from cause


def _watch(ray, runs: list):
    """Every trainer rank's result; the first failure (an exception, or a rank that died) ends the run."""
    results: dict = {}
    pending = list(runs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        ref = done[0]
        rank = runs.index(ref)
        try:
            results[rank] = ray.get(ref)
        except ray.exceptions.RayActorError as error:
            raise TrainerDiedError(
                f"trainer rank {rank} died ({error}); the run stopped. Its last checkpoint is kept: run the same config "
                "with run.resume: true to continue it") from error
        except ray.exceptions.RayTaskError as error:
            cause = getattr(error, "cause", None)
            raise (cause if isinstance(cause, Exception) else error) from None
    return results[0]
