"""The Ray driver of a `run.launcher: ray` run: `oxrl train cfg.yaml` with the `ray` section's worker groups.

    check     the config's prompts and rewards are read, and a named run's directory is checked (in use by
              another run, or holding one), before any worker starts: bad input fails here
    attach    to `ray.address` (a cluster `ray start --head` runs) or start a private Ray instance
    place     every group's placement group fits the cluster, or PlacementError naming the group
    start     rollout workers and reward workers, then the trainer ranks, which run the RL loop
    watch     the first trainer that fails or dies stops the run; every worker is ended with it
    rebuild   a trainer that died (its node lost): with `ray.trainer_restarts` left, every group is placed and started
              again, on whatever nodes hold the resources now, and the run continues from its last checkpoint

Ray is the control plane only: weights move over torch.distributed groups (the trainers' own, and the weight
group of oxrl/cluster/weight_channel.py), never through Ray's object store; prompts, completions and rewards
travel as task arguments and results. Ray restarts a dead rollout or reward worker (`ray.max_restarts`), on another
node when its node was lost; a trainer that dies ends the attempt, which the driver continues from the last
checkpoint `ray.trainer_restarts` times (a resume is exact: the run repeats the uninterrupted one), then the run
stops and `run.resume: true` continues it.
"""

from __future__ import annotations

import logging
import os
import sys

from oxrl.cluster.interruptible import ACTOR_OPTIONS
from oxrl.cluster.placement import check_fits, placements, reserve
from oxrl.cluster.remote_engine import RemoteWorkers, WorkerError
from oxrl.cluster.workers import RewardWorker, RolloutWorker, TrainerWorker
from oxrl.config.schema import Config
from oxrl.dependencies import MissingDependencyError, install_hint

logger = logging.getLogger(__name__)

MIN_RAY = (2, 40)
INSTALL_HINT = f"install it with `{install_hint('ray')}`"


class TrainerDiedError(RuntimeError):
    """A trainer rank's process died: the run stopped at its last checkpoint. `what`: which rank, and why."""

    def __init__(self, message: str, what: str):
        super().__init__(message)
        self.what = what

    @classmethod
    def of(cls, rank: int, error: Exception) -> TrainerDiedError:
        what = f"trainer rank {rank} died ({error})"
        return cls(f"{what}; the run stopped (ray.trainer_restarts spent or 0). Its last checkpoint is kept: run the "
                   "same config with run.resume: true to continue it", what)


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
    if cfg.ray.trainer_restarts and not cfg.run.name:  # a run the driver may continue needs its directory known now
        from oxrl.training.run_dir import default_run_name

        cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={
            "name": default_run_name(cfg.algorithm.name, cfg.run.output_dir)})})
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
    try:
        restarts = 0
        while True:
            try:
                return _attempt(ray, cfg, entry, rebuilt=restarts > 0)
            except TrainerDiedError as error:
                if restarts >= cfg.ray.trainer_restarts:
                    raise
                restarts += 1
                logger.warning("%s; rebuilding the worker groups and continuing from the last checkpoint (trainer "
                               "restart %d of ray.trainer_restarts = %d)", error.what, restarts, cfg.ray.trainer_restarts)
                # The run's own directory, from its newest checkpoint (none yet: from the start, rows rewritten).
                cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"resume": True, "overwrite": False})})
    finally:
        if started_here:
            ray.shutdown()


def _attempt(ray, cfg: Config, entry, rebuilt: bool):
    """Place and start every group, run the trainers to the end; every worker and placement group is ended with it.
    A rebuilt attempt (after a trainer died) waits up to `ray.node_wait_s` for nodes with the resources to join."""
    actors, groups = [], []
    try:
        layout = placements(cfg.ray)
        if not rebuilt:  # (after a lost node the cluster may be short until a replacement joins: reserve waits)
            check_fits(layout, [node["Resources"] for node in ray.nodes() if node["Alive"]])
        reserved = {}
        for placement in layout:
            if placement.bundles:
                reserved[placement.group] = reserve(
                    placement, cfg.ray.node_wait_s if rebuilt else cfg.ray.placement_timeout_s)
                groups.append(reserved[placement.group])
        reserved.setdefault("rollout", reserved["trainers"])  # colocated: in the trainers' bundles
        by_group = {p.group: p for p in layout}
        logger.info("Ray %s: %d trainer rank(s), %d rollout worker(s) (`%s` engine), %d reward worker(s), %s; cluster %s; "
                    "nodes per group %s", ray.__version__, cfg.ray.trainers.count, cfg.ray.rollout.count,
                    cfg.rl.rollout.engine, cfg.ray.reward.count, cfg.ray.layout, ray.cluster_resources(),
                    {group: _nodes_of(ray, pg) for group, pg in reserved.items()})

        def start(cls, group: str, index: int, *args, restarts: int = 0, **declared):
            bundle, cpus, gpus = by_group[group].workers[index]
            actor = (ray.remote(**declared)(cls) if declared else ray.remote(cls)).options(
                num_cpus=cpus, num_gpus=gpus, max_restarts=restarts,
                # Reward workers hold no state: Ray retries their calls itself. A rollout worker's retry
                # needs the current weights first, which the trainer does (oxrl/cluster/remote_engine.py).
                max_task_retries=restarts if cls is RewardWorker else 0,
                scheduling_strategy=ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(
                    reserved[group], placement_group_bundle_index=bundle),
            ).remote(*args)
            actors.append(actor)
            return actor

        beside = ACTOR_OPTIONS if cfg.ray.interruptible else {}  # weights received while sampling
        rollout = [start(RolloutWorker, "rollout", i, cfg, i, restarts=cfg.ray.max_restarts, **beside)
                   for i in range(cfg.ray.rollout.count)]
        reward = [start(RewardWorker, "reward", i, cfg, restarts=cfg.ray.max_restarts) for i in range(cfg.ray.reward.count)]
        _wait_started(ray, rollout, cfg.ray.call_timeout_s)
        trainers = [start(TrainerWorker, "trainers", rank, rank, cfg.ray.trainers.count)
                    for rank in range(cfg.ray.trainers.count)]
        master = ray.get(trainers[0].rendezvous.remote())
        remote = RemoteWorkers(rollout, reward, cfg.ray, keep_versions=cfg.rl.max_staleness > 0)
        return _watch(ray, [t.run.remote(entry, cfg, remote, master) for t in trainers])
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        for group in groups:
            ray.util.remove_placement_group(group)


def _nodes_of(ray, group) -> list[str]:
    """The node id (first 8 hex digits) holding each bundle of a placement group."""
    table = ray.util.placement_group_table(group)
    return [str(node)[:8] for _, node in sorted(table.get("bundles_to_node_id", {}).items())]


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
            raise TrainerDiedError.of(rank, error) from error
        except ray.exceptions.RayTaskError as error:
            _died_meanwhile(ray, runs, pending)  # a rank's collective broke because another rank died: that death
            cause = getattr(error, "cause", None)
            raise (cause if isinstance(cause, Exception) else error) from None
    return results[0]


def _died_meanwhile(ray, runs: list, pending: list, grace_s: float = 10.0) -> None:
    """TrainerDiedError when one of the other ranks died (seen within `grace_s`): their failure is its consequence."""
    done, _ = ray.wait(pending, num_returns=len(pending), timeout=grace_s) if pending else ([], [])
    for ref in done:
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError as error:
            raise TrainerDiedError.of(runs.index(ref), error) from error
        except ray.exceptions.RayTaskError:
            continue
