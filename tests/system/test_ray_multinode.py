"""`run.launcher: ray` across nodes: a real multi-node Ray cluster on this machine (`ray.cluster_utils.Cluster`: one
raylet per node, each with its own resources and node id), the driver attaching to it with `ray.address`.

    nodes     head (no CPUs), `trainers` {trainer_node}, `workers` {rollout_node, reward_node}; `solo` {solo} for the
              one-node comparison only
    layouts   `ray.<group>.resources` pins each group to its node: the trainer, rollout and reward actors run on the
              nodes named, the weights cross a node boundary at every sync, and the run equals the same run with
              every group on one node (metrics of every step, final weights)
    failures  a node lost mid-run (`_lose_node`: its raylet and every process it started killed at once, as in a real
              loss, then `cluster.remove_node`) and a
              replacement added: a lost rollout + reward node is restarted there and the run goes on; a lost trainer
              node makes the driver rebuild the groups and continue from the last checkpoint by itself
              (`ray.trainer_restarts`); either way the run equals the uninterrupted one and the checkpoints written
              before the loss are kept as they were. The chaos test (slow) kills nodes at seeded random steps of a
              pipelined run (rl.max_staleness 1: a step is always in flight when the rollout node goes).

Times measured on 2 CPU cores shared with other jobs (load average 11-15), most of each run being Ray workers
importing torch: the cluster and the run across nodes (a fixture) ~225 s; the one-node comparison 73 s; the lost
rollout + reward node 159 s; the lost trainer node 133 s; the pure and refusal tests < 1 s; slow: the chaos test
~200 s (its reference run included), the node never replaced ~130 s (cluster start included).
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import yaml

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")

from oxrl.config.schema import Config  # noqa: E402
from tests.conftest import save_tiny_model  # noqa: E402
from tests.ray_workers import LOWER_HALF_REWARD  # noqa: E402
from tests.system.test_rl_resume import rows_by_step  # noqa: E402

pytestmark = [pytest.mark.system, pytest.mark.distributed]

REPO = Path(__file__).resolve().parents[2]

STEPS = 4
COMPARED = ("reward/mean", "reward/std", "loss", "grad_norm", "response_length/mean", "lr", "weight_sync/probe_gap")
TRAINER = {"trainer_node": 1.0}
WORKERS = {"rollout_node": 1.0, "reward_node": 1.0}


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    # Each raylet and worker inherits this process's environment: one torch thread each on 2 shared cores.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        patch.setenv("PYTHONPATH", str(REPO))
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
        cluster.nodes_by_role = {"trainers": cluster.add_node(num_cpus=1, resources=TRAINER),
                                 "workers": cluster.add_node(num_cpus=1, resources=WORKERS)}
        cluster.wait_for_nodes()
        yield cluster
        cluster.shutdown()


@pytest.fixture(scope="module")
def base(tmp_path_factory, smollm2_tokenizer, cluster) -> dict:
    tmp = tmp_path_factory.mktemp("multinode")
    save_tiny_model(tmp / "model", smollm2_tokenizer)
    (tmp / "reward.py").write_text(LOWER_HALF_REWARD)
    return {
        "run": {"name": "multi", "output_dir": str(tmp / "runs"), "seed": 5, "device": "cpu", "launcher": "ray"},
        "model": {"name_or_path": str(tmp / "model")},
        "algorithm": {"name": "grpo"},
        "rl": {"task": "arithmetic", "task_size": 16, "validation_size": 0, "prompts_per_step": 2,
               "rollout": {"n": 2, "max_new_tokens": 4, "temperature": 1.0},
               "rewards": [{"name": f"{tmp / 'reward.py'}:lower_half"}]},
        "train": {"max_steps": STEPS, "micro_batch_size_per_device": 4, "mixed_precision": "no",
                  "optim": {"lr": 2e-1, "schedule": "cosine", "warmup_steps": 1, "weight_decay": 0.1}},
        "ray": {"address": cluster.address, "node_wait_s": 240, "trainers": {"count": 1, "cpus": 0.5, "resources": TRAINER},
                "rollout": {"count": 1, "cpus": 0.25, "resources": {"rollout_node": 1.0}},
                "reward": {"count": 1, "cpus": 0.25, "resources": {"reward_node": 1.0}}},
        "checkpoint": {"every": 1, "keep_last": 10, "save_final": True},
        "logging": {"progress_bar": False, "plot": False},
    }


def _tree(base: dict, name: str, **sections) -> dict:
    cfg = {key: dict(value) for key, value in base.items()}
    for key, value in sections.items():
        cfg[key] = {**cfg[key], **value}
    cfg["run"]["name"] = name
    return cfg


def _config(base: dict, name: str, **sections) -> Config:
    return Config.model_validate(_tree(base, name, **sections))


def _train(cfg: Config) -> Path:
    from oxrl.runner import run

    assert not ray.is_initialized()  # the run's driver attaches to the cluster itself (ray.address)
    run(cfg)
    return Path(cfg.run.output_dir) / cfg.run.name


def _train_noting_nodes(cfg: Config) -> tuple[Path, dict]:
    """The run, and the node id of its trainer, rollout and reward workers (tests/ray_workers.py)."""
    from oxrl.cluster.driver import run_on_ray
    from tests.ray_workers import run_rl_noting_nodes

    assert not ray.is_initialized()
    nodes = run_on_ray(cfg, run_rl_noting_nodes)
    return Path(cfg.run.output_dir) / cfg.run.name, nodes


def _final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {name: tensor for path in sorted((run_dir / "final").glob("*.safetensors")) for name, tensor in load_file(path).items()}


def assert_same_run(run_dir: Path, reference: Path, keys=COMPARED) -> None:
    rows, expected = rows_by_step(run_dir), rows_by_step(reference)
    assert sorted(rows) == sorted(expected) == list(range(1, STEPS + 1))
    for step in expected:
        for key in keys:
            assert rows[step][key] == pytest.approx(expected[step][key], rel=1e-5, abs=1e-6), (step, key)
    steps = [int(line.split('"step": ')[1].split(",")[0]) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)), steps  # every step once: rows a lost attempt logged after its checkpoint were rewound
    weights, wanted = _final_weights(run_dir), _final_weights(reference)
    assert weights.keys() == wanted.keys() and weights
    for name in wanted:
        torch.testing.assert_close(weights[name], wanted[name], atol=1e-6, rtol=1e-5)


@pytest.fixture(scope="module")
def across_nodes(base) -> tuple[Path, dict]:
    return _train_noting_nodes(_config(base, "multi"))


@pytest.fixture(scope="module")
def uninterrupted(across_nodes) -> Path:
    return across_nodes[0]


def _logged(run_dir: Path) -> set[int]:
    return set(rows_by_step(run_dir)) if (run_dir / "metrics.jsonl").exists() else set()


def _lose_node(cluster, role: str) -> None:
    """The node of `role` lost as a machine is: its raylet and every process it started (workers, agents) get SIGKILL
    together. `cluster.remove_node` alone stops the raylet only; its workers live on for about a second and answer
    calls, time enough on a fast machine for a trainer to finish the run before its loss is seen."""
    node = cluster.nodes_by_role[role]
    raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
    for process in [raylet, *raylet.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):  # a worker that exited on its own meanwhile
            process.kill()
    cluster.remove_node(node, allow_graceful=False)  # reaps the raylet and whatever of the node is left


def _run_with_losses(cluster, base: dict, name: str, kills: list[tuple[int, str]], **sections) -> tuple[Path, str]:
    """`oxrl train` (a driver process attached with ray.address) while this process removes a node as soon as the
    run has logged and checkpointed each `(step, role)`'s step, adding a node with the same resources 2 s later
    (Ray starts nodes from a main thread: the run is the other process). The run's directory and its log."""
    tree = _tree(base, name, **sections)
    run_dir = Path(tree["run"]["output_dir"]) / name
    config = run_dir.parent / f"{name}.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump(tree))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    log = run_dir.parent / f"{name}.log"
    stamps: dict[str, tuple[int, int]] = {}
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, "-m", "oxrl", "train", str(config)], env=env, stdout=out,
                                   stderr=subprocess.STDOUT)
        try:
            for step, role in kills:
                deadline = time.monotonic() + 900
                while not (run_dir / "checkpoints" / f"step_{step:06d}").is_dir() or step not in _logged(run_dir):
                    assert process.poll() is None, f"the run ended before step {step}:\n{log.read_text()[-3000:]}"
                    assert time.monotonic() < deadline, f"no step {step} after 900 s"
                    time.sleep(0.05)
                stamps.update({str(p.relative_to(run_dir)): (p.stat().st_ino, p.stat().st_mtime_ns)
                               for p in (run_dir / "checkpoints").rglob("*") if p.is_file()})
                _lose_node(cluster, role)
                time.sleep(2.0)  # the run notices the loss before a replacement joins
                cluster.nodes_by_role[role] = cluster.add_node(num_cpus=1, resources=TRAINER if role == "trainers" else WORKERS)
            assert process.wait(timeout=900) == 0, log.read_text()[-4000:]
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    # Nothing written before a loss was lost or written over: every checkpoint file then is the same file now.
    for relative, stamp in stamps.items():
        path = run_dir / relative
        assert path.is_file() and (path.stat().st_ino, path.stat().st_mtime_ns) == stamp, relative
    return run_dir, log.read_text()


# ---- layouts across nodes ----------------------------------------------------------------------------------------

def test_a_groups_resources_are_in_each_of_its_bundles():
    from oxrl.cluster.placement import placements
    from oxrl.config.schema import RayConfig

    cfg = RayConfig.model_validate({"trainers": {"count": 2, "resources": TRAINER},
                                    "rollout": {"count": 1, "cpus": 0.5, "resources": {"rollout_node": 0.5}},
                                    "reward": {"count": 1, "cpus": 0.25, "resources": {"reward_node": 1}}})
    trainers, rollout, reward = placements(cfg)
    assert trainers.bundles == [{"CPU": 1.0, "trainer_node": 1.0}] * 2
    assert rollout.bundles == [{"CPU": 0.5, "rollout_node": 0.5}] and reward.bundles == [{"CPU": 0.25, "reward_node": 1.0}]
    colocated = placements(cfg.model_copy(update={"layout": "colocated"}))[0]
    # Bundle 0 holds trainer 0 and rollout worker 0: it goes where both groups' resources are.
    assert colocated.bundles == [{"CPU": 1.5, "trainer_node": 1.0, "rollout_node": 0.5}, {"CPU": 1.0, "trainer_node": 1.0}]
    with pytest.raises(ValueError, match="`GPU` is not a custom resource: set it with cpus/gpus"):
        RayConfig.model_validate({"rollout": {"resources": {"GPU": 1}}})
    with pytest.raises(ValueError, match="resource `trainer_node` = 0.0: each amount must be > 0"):
        RayConfig.model_validate({"trainers": {"resources": {"trainer_node": 0}}})


def test_groups_run_on_the_nodes_their_resources_name_and_equal_one_node(cluster, base, across_nodes):
    uninterrupted, nodes = across_nodes
    trainer_node, worker_node = cluster.nodes_by_role["trainers"].node_id, cluster.nodes_by_role["workers"].node_id
    assert nodes["trainer"] == trainer_node and nodes["rollout"] == [worker_node] and nodes["reward"] == [worker_node]
    assert trainer_node != worker_node  # every weight sync crossed a node boundary
    assert all(row["weight_sync/probe_gap"] < 1e-4 for row in rows_by_step(uninterrupted).values())
    # The same run with every group on one node (its `solo` resource): the same metrics and final weights.
    solo = cluster.add_node(num_cpus=1, resources={"solo": 3.0})
    try:
        one = {group: {"resources": {"solo": 1.0}} for group in ("trainers", "rollout", "reward")}
        run_dir = _train(_config(base, "solo", ray={**base["ray"], **{g: {**base["ray"][g], **v} for g, v in one.items()}}))
    finally:
        cluster.remove_node(solo)
    assert_same_run(run_dir, uninterrupted)


def test_a_group_whose_resource_no_node_has_fails_before_anything_starts(cluster, base):
    from oxrl.cluster.placement import PlacementError

    cfg = _config(base, "nowhere", ray={**base["ray"], "rollout": {"count": 1, "cpus": 0.25, "resources": {"tpu_node": 1.0}}})
    with pytest.raises(PlacementError, match=r"worker group `rollout`: a worker needs 1 tpu_node on one node, and the "
                                             r"largest node of the cluster has 0; lower ray.rollout.resources.tpu_node"):
        _train(cfg)
    assert not (Path(cfg.run.output_dir) / "nowhere" / "metrics.jsonl").exists()


# ---- losing a node -------------------------------------------------------------------------------------------

def test_a_lost_rollout_and_reward_node_is_replaced_and_the_run_equals_the_uninterrupted_one(cluster, base, uninterrupted):
    run_dir, log = _run_with_losses(cluster, base, "workers_lost", [(2, "workers")])
    assert "rollout worker 0 died during" in log
    assert_same_run(run_dir, uninterrupted)


def test_a_lost_trainer_node_is_rebuilt_from_the_last_checkpoint_by_the_driver(cluster, base, uninterrupted):
    run_dir, log = _run_with_losses(cluster, base, "trainer_lost", [(2, "trainers")], ray={**base["ray"], "trainer_restarts": 1})
    assert "trainer rank 0 died" in log and "trainer restart 1 of ray.trainer_restarts = 1" in log
    assert_same_run(run_dir, uninterrupted)


@pytest.mark.slow
def test_nodes_lost_at_seeded_random_steps_of_a_pipelined_run_leave_it_unchanged(cluster, base):
    """rl.max_staleness 1: the rollout workers sample step t + 1 while the trainer updates step t, so the rollout
    node is lost with a step in flight; that step is sampled again from the weights it was scheduled under."""
    pipelined = {**base["rl"], "max_staleness": 1, "off_policy_correction": "decoupled", "off_policy_cap": 4.0}
    reference = _train(_config(base, "pipelined", rl=pipelined))
    # The trainer node goes with two steps still to run: with one left, a pipelined run (its last step already
    # sampled) can finish before the node is removed, and then nothing is restarted.
    chosen = random.Random(2026)
    worker_step = chosen.randint(1, 2)
    trainer_step = chosen.randint(worker_step + 1, STEPS - 2)
    kills = [(worker_step, "workers"), (trainer_step, "trainers")]
    run_dir, log = _run_with_losses(cluster, base, "chaos", kills, rl=pipelined, ray={**base["ray"], "trainer_restarts": 1})
    # (Whether the driver calls the lost rollout worker before the trainer node goes, and logs it, depends on timing:
    # the groups are rebuilt at the trainer's loss either way.)
    assert "trainer restart 1 of ray.trainer_restarts = 1" in log, log[-3000:]
    assert_same_run(run_dir, reference, COMPARED + ("off_policy/version_lag", "logprob_mismatch/mean_abs"))


@pytest.mark.slow
def test_a_lost_node_no_node_replaces_within_node_wait_s_stops_the_run_naming_the_worker(cluster, base):
    tree = _tree(base, "never_replaced", ray={**base["ray"], "node_wait_s": 20})
    run_dir = Path(tree["run"]["output_dir"]) / "never_replaced"
    config = run_dir.parent / "never_replaced.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump(tree))
    process = subprocess.Popen([sys.executable, "-m", "oxrl", "train", str(config)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 900
        while 1 not in _logged(run_dir):
            assert process.poll() is None and time.monotonic() < deadline, "the run ended or hung before step 1"
            time.sleep(0.05)
        _lose_node(cluster, "workers")
        output, _ = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
        cluster.nodes_by_role["workers"] = cluster.add_node(num_cpus=1, resources=WORKERS)  # for the tests after
    assert process.returncode != 0
    assert "rollout worker 0 was not back within ray.node_wait_s = 20s of its restart" in output, output[-3000:]
    assert (run_dir / "checkpoints" / "step_000001").is_dir()  # what it wrote before is kept
