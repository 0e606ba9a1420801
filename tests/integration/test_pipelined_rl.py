"""Pipelined RL (`rl.max_staleness` = k) in one process: the schedule, the version that sampled every step, k = 0 as
the synchronous loop, exact repeats, learning from stale samples, and a resume with steps sampled ahead."""

import copy
import json
import re

import pytest
import torch

import oxrl.loops.rl as rl_loop
from oxrl.config.schema import Config
from oxrl.loops.pipeline import RolloutPipeline, sampling_version
from oxrl.loops.rl import sync, train_rl
from oxrl.loops.rl_update import score_logprobs
from oxrl.loops.rl import global_metrics, rollout_metrics
from oxrl.loops.rl import estimate, sample, score
from oxrl.loops.rl_update import update
from oxrl.rewards.combine import build_reward_fn
from oxrl.rollout.hf import HFEngine
from tests.conftest import make_tiny_llama, rl_handles
from tests.integration.test_rl_loop import NO_VALIDATION, prompts, rl_config
from tests.integration.test_rollout_hf import TinyTokenizer

DECOUPLED = {"off_policy_correction": "decoupled", "off_policy_cap": 4.0}
SEVENS = "tests.integration.test_rl_loop:share_of_sevens"  # learnable
VARIED = "tests.integration.test_online:varied"  # differs inside every group from the first step: every update moves


def handles(tmp_path, steps: int, reward: str = VARIED, **rl):
    cfg = rl_config(tmp_path, "dr_grpo", **rl)
    cfg.train.max_steps = steps
    torch.manual_seed(0)
    model = make_tiny_llama()
    return rl_handles(cfg, model, HFEngine(model, TinyTokenizer()), build_reward_fn([{"name": reward}]))


def weights(model) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def test_the_schedule_samples_step_t_from_version_t_minus_k():
    assert [sampling_version(step, 0) for step in range(5)] == [0, 1, 2, 3, 4]
    assert [sampling_version(step, 2) for step in range(5)] == [0, 0, 0, 1, 2]


def test_the_pipeline_starts_every_step_when_the_live_weights_are_its_version():
    live = {"version": 0}
    started = []

    def begin(batch, step):
        started.append((step, live["version"]))
        return step

    pipeline = RolloutPipeline(2, 5, lambda step: None, begin, lambda sampling: (rl_loop.Rollout([], torch.zeros(0), [],
                                                                                                  torch.zeros(0)), {}))
    for step in range(5):
        live["version"] = step  # the loop has made `step` updates
        assert pipeline.take(step).version == sampling_version(step, 2)
    assert started == [(0, 0), (1, 0), (2, 0), (3, 1), (4, 2)]


def test_max_staleness_0_is_the_synchronous_loop_bitwise(tmp_path):
    """train_rl with k = 0 against the stages called by hand in the synchronous order: the same metrics and weights."""
    piped = handles(tmp_path / "piped", 3)
    result = train_rl(piped, prompts(), NO_VALIDATION, tmp_path / "piped" / "run")

    h = handles(tmp_path / "hand", 3)
    from oxrl.data.sampler import StepSampler
    from oxrl.training.optim import build_optimizer, build_scheduler

    cfg = h.cfg
    optimizer = build_optimizer(h.model, cfg.train.optim, fused=h.strategy.fused_optimizer)
    h.policy = h.strategy.prepare(h.model, optimizer, build_scheduler(optimizer, 3, cfg.train.optim))
    h.policy.train()
    sampler = StepSampler(8, cfg.rl.prompts_per_step, cfg.run.seed, shuffle=cfg.data.shuffle)
    for step in range(3):
        rollout, metrics = sample(h, prompts().subset(sampler.step_indices(step)), step + 1)
        metrics.update(score(h, rollout))
        estimate(h, rollout)
        metrics = global_metrics(h.strategy, {**metrics, **rollout_metrics(rollout)}, rollout.rewards)
        metrics.update(update(h, rollout, step + 1))
        sync(h, step + 1)
    for key in ("reward/mean", "loss", "grad_norm", "entropy", "logprob_mismatch/mean_abs"):
        assert result.final_metrics[key] == metrics[key], key
    mine, theirs = weights(piped.model), weights(h.model)
    assert all(torch.equal(mine[name], theirs[name]) for name in mine)


@pytest.mark.parametrize("k", [1, 2])
def test_every_step_is_sampled_by_its_scheduled_version(tmp_path, monkeypatch, k):
    """The engine's log-probs of each step's samples are those of the weights of version max(0, t - k), to float
    rounding, and not those of the live weights the update starts from once the lag is positive."""
    h = handles(tmp_path, 5, max_staleness=k, **DECOUPLED)
    versions, seen = {}, []
    one_step = rl_loop.one_step

    def recording(h_, sampled, step):
        versions[step - 1] = weights(h_.model)  # the live weights at the start of step `step`: version step - 1
        seen.append(sampled)
        return one_step(h_, sampled, step)

    monkeypatch.setattr(rl_loop, "one_step", recording)
    train_rl(h, prompts(), NO_VALIDATION, tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    probe = copy.deepcopy(h.model)
    for sampled, row in zip(seen, rows):
        assert sampled.version == sampled.rollout.version == sampling_version(sampled.step, k)
        assert row["off_policy/version_lag"] == min(sampled.step, k)
        engine = torch.cat([torch.tensor(c.logprobs) for c in sampled.rollout.completions])
        probe.load_state_dict(versions[sampled.version])
        scheduled = torch.cat(score_logprobs(probe, sampled.rollout.completions, 8, 1.0))
        assert torch.allclose(engine, scheduled, atol=1e-5)
        probe.load_state_dict(versions[sampled.step])
        live = torch.cat(score_logprobs(probe, sampled.rollout.completions, 8, 1.0))
        if sampled.step > sampled.version:
            assert (engine - live).abs().max() > 1e-3
        else:
            assert torch.allclose(engine, live, atol=1e-5)
        assert (row["logprob_mismatch/mean_abs"] > 1e-4) == (sampled.step > sampled.version)


def test_the_same_seed_and_k_repeat_a_run_exactly(tmp_path):
    runs = []
    for name in ("first", "second"):
        h = handles(tmp_path / name, 4, max_staleness=2, **DECOUPLED)
        result = train_rl(h, prompts(), NO_VALIDATION, tmp_path / name / "run")
        rows = [json.loads(line) for line in (tmp_path / name / "run" / "metrics.jsonl").read_text().splitlines()]
        timings = ("time", "seconds", "per_s")
        runs.append(([{k: v for k, v in row.items() if not any(word in k for word in timings)} for row in rows],
                     weights(h.model), result.rewards))
    (rows_a, weights_a, rewards_a), (rows_b, weights_b, rewards_b) = runs
    assert rows_a == rows_b and rewards_a == rewards_b
    assert all(torch.equal(weights_a[name], weights_b[name]) for name in weights_a)
    assert all(row["logprob_mismatch/mean_abs"] > 1e-4 for row in rows_a[1:])  # the samples are off-policy indeed


@pytest.mark.parametrize("correction", ["decoupled", "tis", "mask"])
def test_a_tiny_model_learns_from_samples_two_versions_old(tmp_path, correction):
    h = handles(tmp_path, 16, SEVENS, max_staleness=2, off_policy_correction=correction, off_policy_cap=4.0)
    result = train_rl(h, prompts(), NO_VALIDATION, tmp_path / "run")
    first, last = sum(result.rewards[:4]) / 4, sum(result.rewards[-4:]) / 4
    assert last > first + 0.2, result.rewards


def test_online_dpo_trains_on_samples_one_version_old(tmp_path):
    from tests.integration.test_online import run

    result, metrics, _ = run(tmp_path, "online_dpo", SEVENS,
                             rl={"max_staleness": 1}, preference={"beta": 0.5},
                             train={"max_steps": 20, "micro_batch_size_per_device": 8,
                                    "optim": {"lr": 2e-2, "schedule": "constant", "max_grad_norm": 1.0}})
    assert [m["off_policy/version_lag"] for m in metrics] == [0.0] + [1.0] * (len(metrics) - 1)
    assert sum(result.rewards[-3:]) / 3 > sum(result.rewards[:3]) / 3 + 0.2, result.rewards


# ----------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize("rl, message", [
    ({"max_staleness": 1}, "rl.max_staleness = 1 trains `dr_grpo` on samples up to 1 policy versions old: set "
                           "rl.off_policy_correction"),
    ({"accept_uncorrected": True}, "rl.accept_uncorrected = True is not read by `dr_grpo`"),
    ({"max_staleness": 1, "off_policy_correction": "tis", "accept_uncorrected": True},
     "rl.accept_uncorrected = True is not read by `dr_grpo` \\(rl.max_staleness is 1; rl.off_policy_correction "
         "is 'tis'\\)"),
    ({"off_policy_cap": 3.0}, "rl.off_policy_cap = 3.0 is not read by `dr_grpo` \\(rl.off_policy_correction is 'none'\\)"),
    ({"max_staleness": 1, **DECOUPLED, "strict_on_policy": True}, "choose one"),
    ({"tis_cap": 2.0}, "`rl.tis_cap` moved: set `rl.off_policy_correction: tis` and `rl.off_policy_cap: 2.0`"),
    ({"max_staleness": -1}, "greater than or equal to 0"),
])
def test_settings_of_pipelined_rl_that_cannot_work_are_refused(tmp_path, rl, message):
    with pytest.raises(ValueError, match=message):
        rl_config(tmp_path, "dr_grpo", **rl)


def test_stale_samples_uncorrected_are_trained_only_when_accepted(tmp_path):
    assert rl_config(tmp_path, "dr_grpo", max_staleness=1, accept_uncorrected=True).rl.accept_uncorrected
    assert rl_config(tmp_path, "dr_grpo", tis_cap=None).rl.off_policy_correction == "none"  # a saved config's default


# ----------------------------------------------------------------------------------------------- resume


def test_a_resume_trains_on_the_samples_the_checkpoint_holds_and_repeats_the_run(tmp_path, smollm2_tokenizer):
    from oxrl.runner import run as run_config
    from tests.conftest import save_tiny_model
    from tests.system.test_rl_resume import COMPARED, rows_by_step

    save_tiny_model(tmp_path / "model", smollm2_tokenizer)
    tree = {
        "run": {"name": "full", "output_dir": str(tmp_path / "runs"), "seed": 3, "device": "cpu"},
        "model": {"name_or_path": str(tmp_path / "model")},
        "algorithm": {"name": "grpo"},
        "rl": {"task": "arithmetic", "task_size": 16, "validation_size": 0, "prompts_per_step": 2,
               "rollout": {"n": 4, "max_new_tokens": 8, "temperature": 1.0}, "max_staleness": 2, **DECOUPLED,
               "rewards": [{"name": "tests.integration.test_online:varied"}]},
        "train": {"max_steps": 5, "micro_batch_size_per_device": 4,
                  "optim": {"lr": 1e-2, "schedule": "cosine", "warmup_steps": 1, "weight_decay": 0.1}},
        "checkpoint": {"every": 2, "keep_last": 5, "save_final": False},
        "logging": {"progress_bar": False, "plot": False},
    }
    run_config(Config.model_validate(tree))
    checkpoint = tmp_path / "runs" / "full" / "checkpoints" / "step_000002"
    ahead = json.loads((checkpoint / "training_state" / "rank_state.json").read_text())["pipeline"]
    assert [record["step"] + 1 for record in ahead["sampled"]] == [3, 4]  # k = 2 steps sampled ahead of step 2
    assert [record["version"] for record in ahead["sampled"]] == [0, 1]  # versions max(0, t - 2) of steps t = 2, 3
    tree["run"].update(name="resumed", resume=str(checkpoint))
    run_config(Config.model_validate(tree))
    full, resumed = rows_by_step(tmp_path / "runs" / "full"), rows_by_step(tmp_path / "runs" / "resumed")
    assert sorted(resumed) == [3, 4, 5]
    for step in (3, 4, 5):
        for key in COMPARED + ("off_policy/version_lag", "logprob_mismatch/mean_abs"):
            assert resumed[step][key] == pytest.approx(full[step][key], rel=1e-6, abs=1e-6), (step, key)

    tree["rl"]["max_staleness"] = 1
    tree["run"].update(name="other_k", accept_config_changes=True)  # (else refused as any changed setting is)
    with pytest.raises(ValueError, match="written with rl.max_staleness = 2: resume with that value, not 1"):
        run_config(Config.model_validate(tree))

    from oxrl.training.checkpoint_files import CheckpointError

    record = ahead["sampled"][0]["completions"][0]
    record["logprobs"] = record["logprobs"][:-1]  # a damaged file: one log-prob short
    (checkpoint / "training_state" / "rank_state.json").write_text(json.dumps({"pipeline": ahead}))
    tree["rl"]["max_staleness"] = 2
    tree["run"].update(name="damaged")
    with pytest.raises(CheckpointError, match=r"step_000002/training_state/rank_state.json: damaged checkpoint file "
                                              r"\(pipeline.sampled\[0\].completions\[0\] is inconsistent: a completion "
                                              r"needs one engine log-prob per sampled token"):
        run_config(Config.model_validate(tree))

    # The run rewound to that checkpoint: refused before the rewind deletes its later checkpoints or metrics rows.
    run_dir = tmp_path / "runs" / "full"
    checkpoints, metrics = sorted(p.name for p in (run_dir / "checkpoints").iterdir()), (run_dir / "metrics.jsonl").read_text()
    assert checkpoints == ["step_000002", "step_000004", "step_000005"]
    tree["run"].update(name="full", resume=str(checkpoint))
    with pytest.raises(CheckpointError, match=r"step_000002/training_state/rank_state.json: damaged checkpoint file"):
        run_config(Config.model_validate(tree))
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == checkpoints
    assert (run_dir / "metrics.jsonl").read_text() == metrics


def _set(path: str, value):
    """An edit of a pipeline state: the value at `path` (keys and indices, dot-separated) replaced by `value`."""
    def edit(state: dict) -> None:
        *parents, last = [int(key) if key.isdigit() else key for key in path.split(".")]
        holder = state
        for key in parents:
            holder = holder[key]
        holder[last] = value(holder[last]) if callable(value) else value
    return edit


# (the damage, the field and problem the refusal names). The tiny model's vocabulary is 128 token ids.
DAMAGED_SAMPLES = {
    "a token id outside the vocabulary": (_set("sampled.0.completions.0.completion_ids.0", 128),
                                          r"sampled\[0\]\.completions\[0\]\.completion_ids\[0\] is 128, not an "
                                          r"integer 0\.\.127"),
    "a negative token id": (_set("sampled.1.completions.2.completion_ids.0", -1),
                            r"sampled\[1\]\.completions\[2\]\.completion_ids\[0\] is -1"),
    "a token_rewards row one short": (_set("sampled.0.token_rewards.1", lambda row: row[:-1]),
                                      r"sampled\[0\]\.token_rewards\[1\] holds \d+ values, not \d+"),
    "a reward beyond float32": (_set("sampled.0.rewards.3", 1e308),
                                r"sampled\[0\]\.rewards\[3\] is 1e\+308, not a finite float32 number"),
    "a NaN log-prob": (_set("sampled.1.completions.0.logprobs.0", float("nan")),
                       r"sampled\[1\]\.completions\[0\]\.logprobs\[0\] is nan, not a finite"),
    "a reward as text": (_set("sampled.0.rewards.0", "1.0"), r"sampled\[0\]\.rewards\[0\] is '1\.0'"),
    "replaced prompt ids": (_set("sampled.0.completions.0.prompt_ids", [1, 2, 3]),
                            r"sampled\[0\]\.completions\[0\]\.prompt_ids are not the ids of prompt 0 of the step's"),
    "a prompt index outside the step": (_set("sampled.0.completions.0.prompt_index", 9),
                                        r"sampled\[0\]\.completions\[0\]\.prompt_index is 9, not an integer 0\.\.3"),
    "rows of another step": (_set("sampled.0.rows", [99]), r"sampled\[0\]\.rows\[0\] is 99, not one of the step's"),
    "another version": (_set("sampled.1.version", 3), r"sampled\[1\]\.version is 3, not 1, the version the schedule"),
    "a step not sampled ahead": (_set("sampled.0.step", 7), r"sampled\[0\]\.step is 8 \(1-based\), not one of"),
    "a metric as text": (_set("sampled.0.metrics", {"reward/mean": "high"}), r"sampled\[0\]\.metrics is"),
    "a finish reason oxRL never writes": (_set("sampled.0.completions.0.finish_reason", "won"),
                                          r"sampled\[0\]\.completions\[0\]\.finish_reason is 'won', not one of"),
    "completions not a list": (_set("sampled.0.completions", {"0": {}}), r"sampled\[0\]\.completions is .*not a list"),
    "a lost completion field": (_set("sampled.0.completions.0", lambda c: {k: v for k, v in c.items() if k != "text"}),
                                r"sampled\[0\]\.completions\[0\] has no 'text'"),
    "a step missing": (_set("sampled", lambda records: records[:1]), r"pipeline\.sampled holds 1 steps, not the 2"),
    "next_step out of the schedule": (_set("next_step", 40), r"pipeline\.next_step is 40, not a step from 2 to 4"),
    # interruptible generation's tags: step 4 (0-based 3) is scheduled for version 1, so its tokens are 0..2 newer
    "tokens newer than the step's update": (
        _set("sampled.1.completions.0", lambda c: {**c, "newer_by": [3] * len(c["logprobs"])}),
        r"sampled\[1\]\.completions\[0\]\.newer_by are \[3, .*not numbers of updates from 0 to 2"),
    "a token's tag missing": (_set("sampled.0.completions.1", lambda c: {**c, "newer_by": [0] * (len(c["logprobs"]) - 1)}),
                              r"sampled\[0\]\.completions\[1\] is inconsistent: newer_by \(\d+\) needs one value per"),
    "a tag as text": (_set("sampled.0.completions.0", lambda c: {**c, "newer_by": ["1"] * len(c["logprobs"])}),
                      r"sampled\[0\]\.completions\[0\]\.newer_by\[0\] is '1', not an integer"),
}


@pytest.fixture(scope="module")
def pipelined_run(tmp_path_factory):
    """A 4-step run with rl.max_staleness 2 and checkpoints at steps 2 and 4: its folder, to rewind to step 2."""
    root = tmp_path_factory.mktemp("pipelined")
    h = handles(root, 4, max_staleness=2, **DECOUPLED)
    h.cfg.checkpoint.every, h.cfg.checkpoint.keep_last = 2, 5
    train_rl(h, prompts(), NO_VALIDATION, root / "run")
    return root / "run"


@pytest.mark.parametrize("damage", list(DAMAGED_SAMPLES))
def test_a_resume_refuses_damaged_samples_ahead_naming_the_file_and_the_field(tmp_path, pipelined_run, damage):
    """Every value of rank_state.json is checked against the resuming run before a step trains or a row of
    metrics.jsonl is dropped: a rewind to step 2 of a 4-step run, refused, leaves the run as it was."""
    from oxrl.training.checkpoint_files import CheckpointError

    run_dir, path, problem = _damaged_copy(tmp_path, pipelined_run, damage)
    metrics_before = (run_dir / "metrics.jsonl").read_text()
    h = handles(tmp_path, 4, max_staleness=2, **DECOUPLED)
    h.cfg.run.resume = str(path.parent.parent)
    with pytest.raises(CheckpointError) as refused:
        train_rl(h, prompts(), NO_VALIDATION, run_dir)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: damaged checkpoint file (pipeline."), message
    assert re.search(problem, message), message
    assert (run_dir / "metrics.jsonl").read_text() == metrics_before  # nothing trained, no row dropped



def _damaged_copy(tmp_path, pipelined_run, damage):
    """A copy of the 4-step pipelined run whose step-2 rank_state.json carries `damage` (DAMAGED_SAMPLES): its run
    directory, that file, and the pattern the refusal must match."""
    import shutil

    edit, problem = DAMAGED_SAMPLES[damage]
    run_dir = tmp_path / "run"
    shutil.copytree(pipelined_run, run_dir)
    path = run_dir / "checkpoints" / "step_000002" / "training_state" / "rank_state.json"
    state = json.loads(path.read_text())
    edit(state["pipeline"])
    path.write_text(json.dumps(state))
    return run_dir, path, problem


def _file_bytes(folder) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("damage", ["a token id outside the vocabulary", "replaced prompt ids"])
def test_a_rewind_refused_on_its_samples_ahead_keeps_every_later_checkpoint(tmp_path, pipelined_run, damage):
    """A rewind to step 2 of a 4-step run, as `oxrl train` makes it: the run directory claimed (the checkpoint
    checked: the token ids against its config.json, before the model loads), then the loop (the prompts checked
    against the run's data). Either refusal names the file and the field, and leaves the step-4 checkpoint, the one a
    rewind abandons, byte for byte."""
    from oxrl.loops.pipeline_state import check_samples_ahead
    from oxrl.training.checkpoint_files import CheckpointError
    from oxrl.training.run_dir import claim_run_dir

    run_dir, path, problem = _damaged_copy(tmp_path, pipelined_run, damage)
    later, metrics = _file_bytes(run_dir / "checkpoints" / "step_000004"), (run_dir / "metrics.jsonl").read_bytes()
    h = handles(tmp_path, 4, max_staleness=2, **DECOUPLED)
    h.cfg.run.resume = str(path.parent.parent)
    with pytest.raises(CheckpointError) as refused:
        claim_run_dir(run_dir, h.cfg, check_samples_ahead).release()
        assert damage == "replaced prompt ids", "the claim let a token id outside the vocabulary through"
        train_rl(h, prompts(), NO_VALIDATION, run_dir)  # (the prompts are the run's data: checked once it has them)
    message = str(refused.value)
    assert message.startswith(f"{path}: damaged checkpoint file (pipeline."), message
    assert re.search(problem, message), message
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000002", "step_000004"]
    assert _file_bytes(run_dir / "checkpoints" / "step_000004") == later and later
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics


def test_a_rewind_that_passes_every_check_drops_the_later_checkpoints_then_trains(tmp_path, pipelined_run, oxrl_log):
    import shutil

    from oxrl.loops.pipeline_state import check_samples_ahead
    from oxrl.training.run_dir import claim_run_dir

    run_dir = tmp_path / "run"
    shutil.copytree(pipelined_run, run_dir)
    h = handles(tmp_path, 4, max_staleness=2, **DECOUPLED)
    h.cfg.checkpoint.every, h.cfg.checkpoint.keep_last = 2, 5
    h.cfg.run.resume = str(run_dir / "checkpoints" / "step_000002")
    claim_run_dir(run_dir, h.cfg, check_samples_ahead).release()
    assert (run_dir / "checkpoints" / "step_000004").is_dir()  # the claim deletes nothing: the loop checks first
    train_rl(h, prompts(), NO_VALIDATION, run_dir)
    assert "removed the later checkpoints step_000004 (the abandoned continuation)" in oxrl_log.text
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000002", "step_000004"]
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
