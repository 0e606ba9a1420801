"""The Ray launcher (oxrl/cluster): worker groups on placement groups, the weight group, the shared sampling.

Ray's local cluster starts in seconds on CPU; every test here uses the tiny random Llama. What is checked:
the pure parts by hand (buckets, slices, layouts, a step's split over trainer ranks); the weight broadcast
between processes; the probe catching a stale rollout worker; a killed rollout worker restarted and the step
sampled again identically; a Ray trainer group of 2 (FSDP2, DeepSpeed ZeRO-3) updating exactly like one
process; whole runs (reward rising, reproducible, kill -9 of the driver then resume); attaching to a cluster
that `ray start --head` runs; layouts the cluster cannot hold failing fast.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")

from oxrl.cluster.placement import PlacementError, Placement, check_fits, placements, reserve  # noqa: E402
from oxrl.cluster.remote_engine import RemoteWorkers, WorkerError, slices  # noqa: E402
from oxrl.cluster.weight_channel import (  # noqa: E402
    GroupAddress, TensorSpec, WeightChannel, free_port, plan_buckets, specs_of,
)
from oxrl.config.schema import Config, RayConfig  # noqa: E402
from oxrl.rollout.base import SamplingParams  # noqa: E402
from oxrl.rollout.probe import WeightSyncError  # noqa: E402
from tests.conftest import save_tiny_model  # noqa: E402
from tests.ray_workers import LOWER_HALF_REWARD  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


# ---- pure parts ---------------------------------------------------------------------------------------------

def test_buckets_group_consecutive_tensors_of_one_dtype_up_to_the_limit():
    specs = [TensorSpec("a", (4,), "float32"), TensorSpec("b", (2, 2), "float32"), TensorSpec("c", (10,), "float32"),
             TensorSpec("d", (1,), "bfloat16"), TensorSpec("e", (3,), "bfloat16"), TensorSpec("f", (1,), "float32")]
    # 32 bytes: a (16) + b (16) fill one; c (40) is larger than a bucket: alone; d (2) + e (6) share (bf16);
    # f is float32 after bf16: a new bucket.
    assert plan_buckets(specs, 32) == [[0, 1], [2], [3, 4], [5]]
    assert plan_buckets(specs, 10**6) == [[0, 1, 2], [3, 4], [5]]


def test_slices_are_consecutive_and_differ_by_at_most_one():
    assert slices(7, 3) == [range(0, 3), range(3, 5), range(5, 7)]
    assert slices(2, 3) == [range(0, 1), range(1, 2)]  # an idle worker gets nothing
    assert slices(0, 2) == []


def _ray_cfg(**groups) -> RayConfig:
    return RayConfig.model_validate(groups)


def test_disaggregated_and_colocated_layouts():
    cfg = _ray_cfg(trainers={"count": 2, "cpus": 2, "gpus": 1}, rollout={"count": 2, "cpus": 1, "gpus": 1},
                   reward={"count": 1, "cpus": 4})
    trainers, rollout, reward = placements(cfg)
    assert trainers.bundles == [{"CPU": 2, "GPU": 1}] * 2 and rollout.bundles == [{"CPU": 1, "GPU": 1}] * 2
    assert reward.bundles == [{"CPU": 4}] and reward.workers == [(0, 4, 0)]
    colocated = placements(cfg.model_copy(update={"layout": "colocated", "rollout": cfg.rollout.model_copy(update={"count": 1})}))
    trainers, rollout = colocated[:2]
    # Bundle 0 holds trainer 0 and rollout worker 0, sharing its GPU; bundle 1 trainer 1 alone.
    assert trainers.bundles == [{"CPU": 3, "GPU": 1}, {"CPU": 2, "GPU": 1}]
    assert trainers.workers == [(0, 2, 0.5), (1, 2, 1)] and rollout.workers == [(0, 1, 0.5)] and rollout.bundles == []


def test_a_layout_the_cluster_cannot_hold_names_the_group_and_the_resource():
    groups = placements(_ray_cfg(trainers={"count": 2, "cpus": 1, "gpus": 1}, rollout={"count": 1, "cpus": 1}))
    with pytest.raises(PlacementError, match="worker group `trainers`: a worker needs 1 GPU on one node, and the largest node"):
        check_fits(groups, [{"CPU": 16.0}])
    with pytest.raises(PlacementError, match=r"need 3 CPU in all and the cluster has 2"):
        check_fits(placements(_ray_cfg(trainers={"count": 2}, rollout={"count": 1})), [{"CPU": 2.0}])
    check_fits(placements(_ray_cfg(trainers={"count": 2}, rollout={"count": 1})), [{"CPU": 2.0}, {"CPU": 1.0}])


def _config(tmp_path: Path, **overrides) -> Config:
    base = {"run": {"name": "ray", "output_dir": str(tmp_path), "launcher": "ray"}, "model": {"name_or_path": "unused"},
            "algorithm": {"name": "grpo"}, "rl": {"prompts_per_step": 4}}
    for key, value in overrides.items():
        base[key] = {**base.get(key, {}), **value}
    return Config.model_validate(base)


@pytest.mark.parametrize("overrides, message", [
    ({"algorithm": {"name": "sft"}, "data": {"train": [{"path": "x.jsonl"}]}, "rl": {"prompts_per_step": 8}},
     "runs the RL loop"),  # (rl at its defaults: an offline run reads no `rl` setting)
    ({"ray": {"layout": "colocated", "trainers": {"count": 1}, "rollout": {"count": 2}}}, "must be <= ray.trainers.count"),
    ({"ray": {"trainers": {"count": 3}}}, "must be a multiple of ray.trainers.count"),
    ({"run": {"launcher": "local"}, "ray": {"rollout": {"count": 2}}}, "read only with run.launcher: ray"),
    ({"algorithm": {"name": "spin"}}, "`spin` runs in one local process"),
    ({"ray": {"rollout_split": "steps", "rollout": {"count": 2}}}, r"set rl.max_staleness >= 1 \(at 0 one step"),
    ({"ray": {"rollout_split": "steps", "rollout": {"count": 3}},
      "rl": {"max_staleness": 1, "off_policy_correction": "decoupled"}},
     r"at most 2 steps are sampled at once, so 1 of the ray.rollout.count = 3 workers would sit idle"),
    ({"ray": {"interruptible": True}}, r"ray.interruptible .* needs rl.max_staleness >= 1 \(it is 0\)"),
    ({"ray": {"interruptible": True, "rollout_split": "steps"},
      "rl": {"max_staleness": 1, "off_policy_correction": "decoupled"}}, r"ray.rollout_split `prompts` \(it is `steps`\)"),
    ({"rl": {"rollout": {"precision": "bf16"}}}, r"rl.rollout.precision `bf16` .* is for one process: Ray's rollout "
                                                r"workers decode from the model itself"),
])
def test_layouts_the_config_refuses(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        _config(tmp_path, **overrides)


def test_a_run_directory_in_use_or_holding_a_run_fails_before_ray_starts(tmp_path):
    from oxrl.cluster.driver import run_on_ray
    from oxrl.training.run_dir import RunDirError, RunLock

    cfg = _config(tmp_path)
    run_dir = tmp_path / "ray"
    run_dir.mkdir()
    lock = RunLock(run_dir).acquire()  # another run is using it
    try:
        with pytest.raises(RunDirError, match=f"in use by process {os.getpid()}"):
            run_on_ray(cfg, entry=None)
    finally:
        lock.release()
    (run_dir / "metrics.jsonl").write_text("{}\n")  # a finished run's output: kept unless resumed or overwritten
    with pytest.raises(RunDirError, match="already holds a run"):
        run_on_ray(cfg, entry=None)
    assert not ray.is_initialized() and (run_dir / "metrics.jsonl").read_text() == "{}\n"


def test_a_step_sampled_for_every_rank_is_split_into_whole_groups_balanced_by_tokens():
    from oxrl.data.types import RLPromptBatch
    from oxrl.loops.rl import rank_share
    from oxrl.rewards.combine import RewardOutput
    from oxrl.rollout.base import Completion

    prompts = [[1] * 2, [1] * 2, [1] * 2, [1] * 2]
    lengths = [[9, 9], [1, 1], [2, 2], [8, 8]]  # prompt + completion tokens per group: 22, 6, 8, 20
    completions = [Completion(p, prompts[p], [5] * n, [0.0] * n, "length", "") for p, group in enumerate(lengths) for n in group]
    batch = RLPromptBatch(prompts, ["a", "b", "c", "d"], [{}] * 4, ["r0", "r1", "r2", "r3"])
    scored = RewardOutput([float(i) for i in range(8)], {"r": [float(i) for i in range(8)]}, {"r": 0}, {"r": 0.1})
    shares = [rank_share(batch, completions, scored, rank, 2) for rank in (0, 1)]
    # Largest first onto the lighter rank: 22 -> 0, 20 -> 1, 8 -> 1 (20 < 22), 6 -> 0: tokens 28 and 28.
    assert [s[0].prompt_texts for s in shares] == [["a", "b"], ["c", "d"]]
    assert [c.prompt_index for c in shares[1][1]] == [0, 0, 1, 1]  # renumbered within the share
    assert shares[0][2].totals == [0.0, 1.0, 2.0, 3.0] and shares[1][2].totals == [4.0, 5.0, 6.0, 7.0]
    assert RewardOutput.concat([shares[0][2], shares[1][2]]).totals == scored.totals


# ---- the weight group between processes ----------------------------------------------------------------------

def _address(port: int, world_size: int, timeout_s: float = 20) -> GroupAddress:
    return GroupAddress("127.0.0.1", port, world_size, generation=1, timeout_s=timeout_s, backend="gloo")


def _receive(port: int, rank: int, specs, queue) -> None:
    channel = WeightChannel(_address(port, 3), rank)
    buffer = io.BytesIO()  # bytes, not tensors: a tensor put on a queue is shared through a file this process removes
    torch.save({name: tensor.clone() for name, tensor in channel.receive(specs, bucket_bytes=64)}, buffer)
    queue.put((rank, buffer.getvalue()))


def test_weights_broadcast_in_buckets_reach_every_member_exactly():
    state = {"w": torch.randn(5, 7), "b": torch.randn(30), "h": torch.randn(3).to(torch.bfloat16), "i": torch.arange(4)}
    specs = specs_of(state)
    port = free_port()
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    members = [context.Process(target=_receive, args=(port, rank, specs, queue)) for rank in (1, 2)]
    for member in members:
        member.start()
    WeightChannel(_address(port, 3), 0).send(state, specs, bucket_bytes=64)
    received = {rank: torch.load(io.BytesIO(data)) for rank, data in (queue.get(timeout=60) for _ in members)}
    for member in members:
        member.join(timeout=30)
    for rank in (1, 2):
        assert set(received[rank]) == set(state)
        for name, tensor in state.items():
            assert received[rank][name].dtype == tensor.dtype and torch.equal(received[rank][name], tensor)


def test_a_missing_member_ends_the_group_with_an_error_not_a_hang():
    started = time.monotonic()
    with pytest.raises(RuntimeError):  # gloo's rendezvous gives up after the timeout
        WeightChannel(_address(free_port(), 2, timeout_s=3), 0)
    assert time.monotonic() - started < 30


# ---- Ray actors (a private local cluster) ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def ray_cluster():
    # `local`: a private instance even where `ray start` left a cluster on this machine (tests/system/test_ray_runs.py).
    ray.init(address="local", num_cpus=4, include_dashboard=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}})
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def model_cfg(tmp_path_factory, smollm2_tokenizer) -> Config:
    folder = save_tiny_model(tmp_path_factory.mktemp("ray") / "model", smollm2_tokenizer)
    cfg = _config(folder.parent, model={"name_or_path": str(folder)}, rl={"rollout": {"n": 2, "max_new_tokens": 6}},
                  ray={"rollout": {"count": 2}, "sync_bucket_mb": 0.05},  # 50 KB buckets: the sync takes many
                  train={"mixed_precision": "no"})  # fp32: workers' log-probs are the trainer's to 1e-4
    return cfg


def _engine(cfg: Config, classes, restarts: int = 1, lora: bool = False, **settings):
    """The trainer's RayRolloutEngine in this process (a one-device trainer) over rollout actors of `classes`;
    `settings`: of the `ray` section."""
    from oxrl.config.schema import LoraConfig
    from oxrl.models.load import load_model, load_tokenizer
    from oxrl.training.strategy import SingleDevice

    from oxrl.cluster.interruptible import ACTOR_OPTIONS

    settings = cfg.ray.model_copy(update={"max_restarts": restarts, **settings})
    cfg = cfg.model_copy(update={"ray": settings})  # what the driver gives the workers
    beside = ACTOR_OPTIONS if settings.interruptible else {}
    actors = [(ray.remote(**beside)(cls) if beside else ray.remote(cls)).options(
        num_cpus=0.5, max_restarts=restarts, max_task_retries=0).remote(cfg, i) for i, cls in enumerate(classes)]
    model = load_model(cfg.model, torch.device("cpu"), LoraConfig(enabled=True, rank=4) if lora else None)
    strategy = SingleDevice(torch.device("cpu"), "no")
    strategy.prepare(model, None)
    engine = RemoteWorkers(actors, [], settings).engine(model, load_tokenizer(cfg.model), strategy, "float32", None)
    return engine, model, actors


def _nudge(model, seed: int) -> None:
    """An update: every weight moves a little."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)


PARAMS = SamplingParams(n=2, temperature=1.0, max_new_tokens=6, seed=11)
PROMPTS = [[1, 30, 40], [1, 50], [1, 60, 70, 80]]


def test_every_sync_is_verified_on_every_worker_and_a_stale_worker_is_caught(ray_cluster, model_cfg):
    from oxrl.cluster.workers import RolloutWorker
    from tests.ray_workers import StaleRolloutWorker

    engine, model, actors = _engine(model_cfg, [RolloutWorker, RolloutWorker])
    try:
        for step in range(2):
            _nudge(model, step)
            metrics = engine.sync_weights(model)
            assert metrics["weight_sync/probe_gap"] < 1e-5  # fp32 copies of the same weights
        # What the workers sample with is the trainer's policy: their log-probs are the trainer's own.
        from oxrl.loops.rl_update import score_logprobs

        completions = engine.generate(PROMPTS, PARAMS)
        assert [c.prompt_index for c in completions] == [0, 0, 1, 1, 2, 2]
        recomputed = score_logprobs(model, completions, 8, 1.0)
        for c, logprobs in zip(completions, recomputed):
            torch.testing.assert_close(torch.tensor(c.logprobs), logprobs, atol=1e-4, rtol=0)
    finally:
        for actor in actors:
            ray.kill(actor)
    engine, model, actors = _engine(model_cfg, [RolloutWorker, StaleRolloutWorker])
    try:
        engine.sync_weights(model)  # both still hold the initial weights: no gap yet
        _nudge(model, 5)
        with pytest.raises(WeightSyncError, match="rollout worker 1: .* not sampling from the weights being trained"):
            engine.sync_weights(model)
    finally:
        for actor in actors:
            ray.kill(actor)


@pytest.mark.parametrize("decode, static", [("static", True), ("generate", False)])
def test_a_rollout_worker_decodes_as_rl_rollout_decode_says(model_cfg, decode, static):
    """`rl.rollout.decode` reaches a rollout worker's engine: `static`, a static KV cache, as the engine in one
    process. (On a CPU the two decoders' log-probs agree to a unit in the last place, as do two processes', so which
    one sampled cannot be told from the samples: the engine is looked at.)"""
    from oxrl.cluster.workers import RolloutWorker

    cfg = model_cfg.model_copy(update={"rl": model_cfg.rl.model_copy(update={
        "rollout": model_cfg.rl.rollout.model_copy(update={"decode": decode})})})
    worker = RolloutWorker(cfg, 0)  # (built in this process: the engine is made by the constructor)
    assert (worker.engine.static is not None) is static


def test_lora_adapters_reach_the_workers_merged_into_their_plain_weights(ray_cluster, model_cfg):
    from oxrl.cluster.workers import RolloutWorker
    from oxrl.rollout.probe import trainer_probe_logprobs

    engine, model, actors = _engine(model_cfg, [RolloutWorker], lora=True)
    try:
        engine.sync_weights(model)
        before = trainer_probe_logprobs(model, engine.probe)
        generator = torch.Generator().manual_seed(3)
        with torch.no_grad():  # an update moves only the adapters
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.add_(torch.randn(p.shape, generator=generator) * 0.3)
        assert (trainer_probe_logprobs(model, engine.probe) - before).abs().mean() > 1e-3  # the policy moved
        assert engine.sync_weights(model)["weight_sync/probe_gap"] < 1e-5  # and the plain worker moved with it
    finally:
        ray.kill(actors[0])


def test_a_killed_rollout_worker_is_restarted_and_the_step_sampled_again_alike(ray_cluster, model_cfg, oxrl_log):
    from oxrl.cluster.workers import RolloutWorker

    engine, model, actors = _engine(model_cfg, [RolloutWorker, RolloutWorker], restarts=1)
    try:
        _nudge(model, 1)
        engine.sync_weights(model)
        before = engine.generate(PROMPTS, PARAMS)
        os.kill(ray.get(actors[1].ready.remote()), signal.SIGKILL)
        after = engine.generate(PROMPTS, PARAMS)  # worker 1 restarts from the initial weights: it must get the new ones
        assert [(c.completion_ids, c.logprobs) for c in after] == [(c.completion_ids, c.logprobs) for c in before]
        assert "rollout worker 1 died during sampling" in oxrl_log.text
        os.kill(ray.get(actors[1].ready.remote()), signal.SIGKILL)
        with pytest.raises(WorkerError, match=r"rollout worker 1 died during sampling and its ray.max_restarts \(1\) restarts are spent"):
            engine.generate(PROMPTS, PARAMS)
    finally:
        for actor in actors:
            ray.kill(actor)


def test_a_submitted_request_samples_from_the_weights_it_was_submitted_under(ray_cluster, model_cfg):
    """Pipelined RL's contract (rollout.base.Submits): a sync after a submit applies to later requests only."""
    from oxrl.cluster.workers import RolloutWorker
    from oxrl.loops.rl_update import score_logprobs

    engine, model, actors = _engine(model_cfg, [RolloutWorker, RolloutWorker])
    try:
        engine.sync_weights(model)
        old = {name: value.clone() for name, value in model.state_dict().items()}
        first = engine.submit(PROMPTS, PARAMS)
        _nudge(model, 2)
        engine.sync_weights(model)  # queued behind the request in flight
        second = engine.submit(PROMPTS, PARAMS)
        newer, older = engine.collect(second), engine.collect(first)
        for completions, weights in ((newer, model.state_dict()), (older, old)):
            probe = _engine_free_copy(model, weights)
            for c, logprobs in zip(completions, score_logprobs(probe, completions, 8, 1.0)):
                torch.testing.assert_close(torch.tensor(c.logprobs), logprobs, atol=1e-4, rtol=0)
        assert [c.completion_ids for c in newer] != [c.completion_ids for c in older] or \
            [c.logprobs for c in newer] != [c.logprobs for c in older]
    finally:
        for actor in actors:
            ray.kill(actor)


def _engine_free_copy(model, weights):
    import copy

    probe = copy.deepcopy(model)
    probe.load_state_dict(weights)
    return probe


def test_a_worker_dead_under_a_step_sampled_ahead_is_sampled_again_from_that_steps_weights(ray_cluster, model_cfg,
                                                                                          oxrl_log):
    """rl.max_staleness >= 1: a request submitted under version v, its worker killed while it samples, then a sync to
    v + 1. The request is sampled again from v's weights (kept for it), exactly as it would have been, and the
    workers then hold v + 1 again."""
    from oxrl.cluster.workers import RolloutWorker
    from tests.ray_workers import SlowRolloutWorker

    engine, model, actors = _engine(model_cfg, [RolloutWorker, SlowRolloutWorker], restarts=2)
    engine.keep_versions = True  # rl.max_staleness >= 1: what the driver's RemoteWorkers says then
    try:
        expected_ticket = engine.submit(PROMPTS, PARAMS)  # version 1, undisturbed: what the request must give
        expected = engine.collect(expected_ticket)
        pid = ray.get(actors[1].ready.remote())
        ticket = engine.submit(PROMPTS, PARAMS)
        os.kill(pid, signal.SIGKILL)  # while it samples
        (_, _, refs), = engine.pending.values()
        ray.wait([refs[1]], timeout=30)  # until Ray has seen the death
        _nudge(model, 3)
        engine.sync_weights(model)  # version 2, while version 1's request is in flight
        assert sorted(engine.kept) == [1, 2]  # the weights of the request in flight are kept
        again = engine.collect(ticket)
        assert [(c.completion_ids, c.logprobs) for c in again] == [(c.completion_ids, c.logprobs) for c in expected]
        assert "rollout worker 1 died during sampling a request ahead" in oxrl_log.text
        assert "sampled again from its own version's weights" in oxrl_log.text
        assert sorted(engine.kept) == [2] and engine.groups[0].held == 2  # back on the current weights; v1 freed
        newer = engine.collect(engine.submit(PROMPTS, PARAMS))  # sampled by version 2: the live weights
        from oxrl.loops.rl_update import score_logprobs

        for c, logprobs in zip(newer, score_logprobs(model, newer, 8, 1.0)):
            torch.testing.assert_close(torch.tensor(c.logprobs), logprobs, atol=1e-4, rtol=0)
        assert engine.restarts == [0, 1]  # one death, counted once
    finally:
        for actor in actors:
            ray.kill(actor)


def _sampled(completions) -> list:
    return [(c.prompt_index, c.completion_ids, c.logprobs) for c in completions]


def test_under_rollout_split_steps_each_request_goes_whole_to_one_worker_with_its_versions_weights(ray_cluster, model_cfg):
    """`ray.rollout_split: steps`: three requests of three versions in flight at once, one on each worker; a sync
    pushes nothing, each worker takes its request's version just before sampling it, and each request samples
    exactly what one worker sharing the whole step (`prompts`, one worker) samples from that version."""
    from oxrl.cluster.workers import RolloutWorker

    engine, model, actors = _engine(model_cfg, [RolloutWorker])
    try:
        expected = []
        for version in range(3):
            _nudge(model, version)
            engine.sync_weights(model)
            expected.append(_sampled(engine.generate(PROMPTS, PARAMS)))
    finally:
        ray.kill(actors[0])
    engine, model, actors = _engine(model_cfg, [RolloutWorker] * 3, rollout_split="steps")
    try:
        tickets, syncs = [], []
        for version in range(3):
            _nudge(model, version)
            syncs.append(engine.sync_weights(model))
            tickets.append(engine.submit(PROMPTS, PARAMS))
        assert [g for g, _, _ in engine.pending.values()] == [0, 1, 2]  # three steps in flight, a worker each
        assert [group.held for group in engine.groups] == [1, 2, 3]
        assert "weight_sync/probe_gap" not in syncs[0]  # nothing was pushed before the first request
        assert all(sync["weight_sync/probe_gap"] < 1e-5 for sync in syncs[1:])  # the pushes made with each request
        assert [_sampled(engine.collect(ticket)) for ticket in tickets] == expected
        assert sorted(engine.kept) == [3]  # only the current version once nothing is in flight
    finally:
        for actor in actors:
            ray.kill(actor)


@pytest.mark.parametrize("split", ["prompts", "steps"])
def test_a_sync_waits_for_a_worker_busy_with_another_step_only_when_every_worker_shares_each_step(ray_cluster, model_cfg,
                                                                                                 split):
    """Two workers that pause 5 s before sampling, one request in flight: under `prompts` the next sync waits for it
    (both workers are sampling it); under `steps` the sync and the next request, on the idle worker, do not."""
    from oxrl.loops.rl_update import score_logprobs
    from tests.ray_workers import SlowRolloutWorker

    engine, model, actors = _engine(model_cfg, [SlowRolloutWorker] * 2, rollout_split=split)
    engine.keep_versions = True  # rl.max_staleness >= 1
    try:
        for ticket in [engine.submit(PROMPTS, PARAMS) for _ in range(2)]:  # every worker up and holding version 1
            engine.collect(ticket)
        first = engine.submit(PROMPTS, PARAMS)
        started = time.monotonic()
        _nudge(model, 7)
        engine.sync_weights(model)
        second = engine.submit(PROMPTS, PARAMS)
        waited = time.monotonic() - started
        assert waited > 4.0 if split == "prompts" else waited < 2.5, waited
        newer = engine.collect(second)
        for c, logprobs in zip(newer, score_logprobs(model, newer, 8, 1.0)):  # sampled by version 2
            torch.testing.assert_close(torch.tensor(c.logprobs), logprobs, atol=1e-4, rtol=0)
        engine.collect(first)
    finally:
        for actor in actors:
            ray.kill(actor)


def _by_version(old, new, completions) -> list[torch.Tensor]:
    """Each token's log-prob as the trainer scores it under the weights its `newer_by` names (0: `old`, 1: `new`)."""
    from oxrl.loops.rl_update import score_logprobs

    before, after = score_logprobs(old, completions, 8, 1.0), score_logprobs(new, completions, 8, 1.0)
    return [torch.where(torch.tensor(c.newer_by) > 0, b, a) for c, a, b in zip(completions, before, after)]


LONG = replace(PARAMS, max_new_tokens=40)  # five rounds of 8 tokens, 0.5 s apart (SlowRoundsRolloutWorker)


def test_interruptible_a_sync_lands_in_the_request_being_sampled_and_its_later_tokens_are_the_new_weights(
        ray_cluster, model_cfg):
    """`ray.interruptible`, rl.max_staleness >= 1: a sync made while the worker samples a request of version 1 returns
    before the request is done; the request's tokens from the next round on are sampled by version 2, each with its
    log-prob under the weights that sampled it."""
    import copy

    from tests.ray_workers import SlowRoundsRolloutWorker

    engine, model, actors = _engine(model_cfg, [SlowRoundsRolloutWorker], interruptible=True)
    engine.keep_versions = True
    try:
        engine.collect(engine.submit(PROMPTS, LONG))  # the worker up, holding version 1
        old = copy.deepcopy(model)
        ticket = engine.submit(PROMPTS, LONG)
        time.sleep(0.8)  # into its second round
        _nudge(model, 5)
        metrics = engine.sync_weights(model)
        (_, _, refs), = engine.pending.values()
        assert not ray.wait(refs, timeout=0)[0]  # the sync did not wait for the request
        assert metrics["weight_sync/probe_gap"] < 1e-5  # the worker answered under the new weights
        completions = engine.collect(ticket)
        tags = [n for c in completions for n in c.newer_by]
        assert 0 in tags and 1 in tags and set(tags) == {0, 1}, tags
        for c in completions:  # (the rows decode in step: each swaps at the same token)
            assert c.newer_by == sorted(c.newer_by)
        for c, expected in zip(completions, _by_version(old, model, completions)):
            torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)
        assert sorted(engine.kept) == [2]  # interruptible keeps only the live version
    finally:
        ray.kill(actors[0])


def test_interruptible_a_worker_killed_with_a_step_in_flight_samples_it_again_from_the_live_weights(
        ray_cluster, model_cfg, oxrl_log):
    """`ray.interruptible`: a request of version 1 whose worker is killed, then a sync to version 2: the request
    is sampled again, from version 2 (every token one update newer than its request's), without stopping the run."""
    from tests.ray_workers import SlowRolloutWorker

    engine, model, actors = _engine(model_cfg, [SlowRolloutWorker], restarts=1, interruptible=True)
    engine.keep_versions = True
    try:
        engine.collect(engine.submit(PROMPTS, PARAMS))
        pid = ray.get(actors[0].ready.remote())
        ticket = engine.submit(PROMPTS, PARAMS)
        os.kill(pid, signal.SIGKILL)  # while it pauses before sampling
        _nudge(model, 6)
        engine.sync_weights(model)
        completions = engine.collect(ticket)
        assert "sampled again from the live weights (version 2; it was submitted under 1)" in oxrl_log.text
        assert all(c.newer_by == [1] * len(c.completion_ids) for c in completions)
        for c, expected in zip(completions, _by_version(model, model, completions)):
            torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)
        assert engine.restarts == [1]
    finally:
        ray.kill(actors[0])


def test_under_rollout_split_steps_a_worker_killed_with_a_step_in_flight_is_recovered_alike(ray_cluster, model_cfg,
                                                                                           oxrl_log):
    """`steps`, rl.max_staleness >= 1: worker 0 killed while it samples a request of version 1, a sync to version 2
    and a request of it on worker 1 meanwhile: the killed request is sampled again from version 1 (kept for it),
    exactly as undisturbed, and the other requests are untouched."""
    from oxrl.cluster.workers import RolloutWorker
    from tests.ray_workers import SlowRolloutWorker

    engine, model, actors = _engine(model_cfg, [SlowRolloutWorker, RolloutWorker], restarts=1, rollout_split="steps")
    try:
        expected = _sampled(engine.collect(engine.submit(PROMPTS, PARAMS)))  # version 1 on worker 0, undisturbed
        pid = ray.get(actors[0].ready.remote())
        other = engine.submit(PROMPTS, PARAMS)  # worker 1, the least recently used
        doomed = engine.submit(PROMPTS, PARAMS)  # worker 0: the idle one
        assert [g for g, _, _ in engine.pending.values()] == [1, 0]
        os.kill(pid, signal.SIGKILL)  # while it pauses before sampling
        _nudge(model, 3)
        engine.sync_weights(model)
        newer = engine.submit(PROMPTS, PARAMS)  # version 2 goes to worker 1 (worker 0's request was given later)
        assert _sampled(engine.collect(doomed)) == expected
        assert "rollout worker 0 died during sampling" in oxrl_log.text
        assert "sampled again from its own version's weights" in oxrl_log.text
        assert _sampled(engine.collect(other)) == expected
        from oxrl.loops.rl_update import score_logprobs

        completions = engine.collect(newer)
        for c, logprobs in zip(completions, score_logprobs(model, completions, 8, 1.0)):
            torch.testing.assert_close(torch.tensor(c.logprobs), logprobs, atol=1e-4, rtol=0)
        assert engine.restarts == [1, 0] and sorted(engine.kept) == [2]
    finally:
        for actor in actors:
            ray.kill(actor)


def test_without_restarts_a_dead_rollout_worker_stops_the_step(ray_cluster, model_cfg):
    from oxrl.cluster.workers import RolloutWorker

    engine, model, actors = _engine(model_cfg, [RolloutWorker], restarts=0)
    try:
        engine.sync_weights(model)
        os.kill(ray.get(actors[0].ready.remote()), signal.SIGKILL)
        with pytest.raises(WorkerError, match=r"rollout worker 0 died during sampling and its ray.max_restarts \(0\)"):
            engine.generate(PROMPTS, PARAMS)
    finally:
        ray.kill(actors[0])


def test_a_killed_reward_worker_is_restarted_and_its_slice_scored_again(ray_cluster, model_cfg, tmp_path):
    from oxrl.cluster.workers import RewardWorker
    from oxrl.training.strategy import SingleDevice

    (tmp_path / "reward.py").write_text(LOWER_HALF_REWARD)
    cfg = _config(tmp_path, rl={"rewards": [{"name": f"{tmp_path / 'reward.py'}:lower_half"}]})
    workers = [ray.remote(RewardWorker).options(num_cpus=0.25, max_restarts=1, max_task_retries=1).remote(cfg)
               for _ in range(2)]
    try:
        reward = RemoteWorkers([], workers, cfg.ray).rewards(None, SingleDevice(torch.device("cpu"), "no"))
        ids = [[1, 30000], [5, 6], [40000], [7, 30001, 2]]
        expected = [0.5, 1.0, 0.0, 2 / 3]
        assert reward(["p"] * 4, ["c"] * 4, None, None, ids).totals == pytest.approx(expected)
        pid = ray.get(workers[1].__ray_call__.remote(lambda self: os.getpid()))
        os.kill(pid, signal.SIGKILL)
        assert reward(["p"] * 4, ["c"] * 4, None, None, ids).totals == pytest.approx(expected)  # retried by Ray
    finally:
        for worker in workers:
            ray.kill(worker)


def test_a_group_the_cluster_cannot_place_fails_within_the_timeout(ray_cluster):
    started = time.monotonic()
    with pytest.raises(PlacementError, match=r"worker group `reward` .* could not be placed within ray.placement_timeout_s = 2s"):
        reserve(Placement("reward", [{"CPU": 3.0}, {"CPU": 3.0}], [(0, 3.0, 0.0), (1, 3.0, 0.0)]), timeout_s=2)
    assert time.monotonic() - started < 20


@pytest.mark.distributed
@pytest.mark.parametrize("strategy", [{"name": "fsdp2"}, {"name": "deepspeed", "zero_stage": 3}], ids=["fsdp2", "zero3"])
def test_a_ray_trainer_group_of_2_updates_like_one_process(ray_cluster, tmp_path, strategy):
    from oxrl.cluster.workers import TrainerWorker
    from tests import distributed_worker as worker
    from tests.ray_workers import grpo_update_on_a_ray_rank
    from tests.system.test_distributed import HAS_DEEPSPEED, assert_close, single

    if strategy["name"] == "deepspeed" and not HAS_DEEPSPEED:
        pytest.skip("deepspeed is not installed (pip install -e '.[deepspeed]')")
    trainers = [ray.remote(TrainerWorker).options(num_cpus=1).remote(rank, 2) for rank in (0, 1)]
    try:
        master = ray.get(trainers[0].rendezvous.remote())
        cfg = worker.rl_config(tmp_path / "ray", strategy)
        ranks = ray.get([t.run.remote(grpo_update_on_a_ray_rank, cfg, None, master) for t in trainers], timeout=600)
    finally:
        for trainer in trainers:
            ray.kill(trainer)
    assert [r["rank"] for r in ranks] == [0, 1] and {r["world"] for r in ranks} == {2}
    assert ranks[0]["pid"] != ranks[1]["pid"] != os.getpid()
    baseline = worker.grpo_update(worker.rl_config(tmp_path / "one"), single())
    for name in ("grpo", "reinforce_pp"):
        assert_close(ranks[0]["advantages"][name], baseline["advantages"][name], tol=1e-6)
    for key in ("loss", "grad_norm", "clip_frac_high", "approx_kl"):
        assert_close(ranks[0]["metrics"][key], baseline["metrics"][key], tol=1e-5)
    assert_close(ranks[0]["logits"], baseline["logits"], tol=1e-5)  # the weights after the update
