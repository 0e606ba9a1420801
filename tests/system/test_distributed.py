"""1 rank == 2 ranks: FSDP2 and DeepSpeed ZeRO under torchrun (gloo, CPU), against the single-device run.

Each `distributed` test launches `torchrun --standalone --nproc_per_node 2` on a scenario of
tests/distributed_worker.py (once per module, shared by the tests that read it) and compares its
numbers with the same training run in this process on one device. Tolerance: 1e-5 absolute on
fp32 losses, gradient norms and logits; the runs differ only in summation order (the ranks' data
split, gradient reduce-scatter), which moves the fp32 results by ~1e-7.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from oxrl.data.sampler import balanced_split
from oxrl.training.build import resolve_strategy_name
from oxrl.models.precision import cpu_has_native_bf16
from oxrl.training.strategy import SingleDevice
from tests import distributed_worker as worker
from tests.conftest import make_tiny_llama

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-5
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None


def torchrun(args: list[str], timeout: int = 300, processes: int = 2) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes), *args]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")


def run_scenario(name: str, factory, processes: int = 2, args: tuple[str, ...] = ()) -> tuple[dict, Path]:
    out = factory.mktemp(name)
    torchrun(["-m", "tests.distributed_worker", name, str(out), *args], processes=processes)
    return json.loads((out / "result.json").read_text()), out


def single() -> SingleDevice:
    return SingleDevice(torch.device("cpu"), "no", max_grad_norm=1.0)


def assert_close(a, b, tol: float = TOL, rtol: float = 0.0) -> None:
    torch.testing.assert_close(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64), atol=tol, rtol=rtol)


# ----------------------------------------------------------------------------- cheap, no processes


def test_balanced_split_gives_equal_counts_balanced_tokens_and_is_deterministic():
    items = list(range(8))
    sizes = [40, 3, 35, 5, 30, 8, 2, 9]
    shares = [balanced_split(items, sizes, rank, 2) for rank in range(2)]
    assert [len(s) for s in shares] == [4, 4]
    assert sorted(shares[0] + shares[1]) == items
    loads = [sum(sizes[i] for i in s) for s in shares]
    contiguous = [sum(sizes[:4]), sum(sizes[4:])]
    assert max(loads) - min(loads) < max(contiguous) - min(contiguous)
    assert shares == [balanced_split(items, sizes, rank, 2) for rank in range(2)]  # same split on resume
    assert all(s == sorted(s) for s in shares)  # each share keeps the batch order
    assert balanced_split(items, sizes, 0, 1) == items
    with pytest.raises(ValueError, match="divide"):
        balanced_split(items[:7], sizes[:7], 0, 2)


def test_strategy_auto_is_fsdp2_only_with_several_processes():
    assert resolve_strategy_name("auto", 1) == "single" and resolve_strategy_name("auto", 2) == "fsdp2"
    assert resolve_strategy_name("deepspeed", 2) == "deepspeed"
    with pytest.raises(ValueError, match="valid"):
        resolve_strategy_name("ddp", 2)


def test_sharded_strategy_without_torchrun_names_the_fix(tmp_path, monkeypatch):
    from oxrl.training.build import build_strategy

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="torchrun"):
        build_strategy(worker.config(tmp_path, strategy={"name": "fsdp2"}))


def test_deepspeed_config_follows_ours_and_merges_the_override(tmp_path):
    from oxrl.config.schema import StrategyConfig, TrainConfig
    from oxrl.training.deepspeed_strategy import deepspeed_config

    override = tmp_path / "ds.json"
    override.write_text(json.dumps({"zero_optimization": {"reduce_bucket_size": 1000}, "gradient_clipping": 0.5}))
    train = TrainConfig(micro_batch_size_per_device=2)
    config = deepspeed_config(StrategyConfig(name="deepspeed", zero_stage=3, cpu_offload=True, deepspeed_config=str(override)),
                              train, bf16=False)
    assert config["train_micro_batch_size_per_gpu"] == 2 and config["gradient_accumulation_steps"] == 1
    assert config["managed_gradient_accumulation"] is False  # our loop owns accumulation
    assert config["zero_optimization"] == {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                           "offload_param": {"device": "cpu"}, "reduce_bucket_size": 1000}
    assert config["gradient_clipping"] == 0.5
    with pytest.raises(FileNotFoundError, match="deepspeed_config"):
        deepspeed_config(StrategyConfig(deepspeed_config=str(tmp_path / "missing.json")), train, bf16=False)


def test_doctor_reports_strategies():
    from oxrl.doctor import report

    text = report()
    assert "strategy single" in text and "strategy fsdp2" in text and "strategy deepspeed" in text


# ----------------------------------------------------------------------------- FSDP2, 2 processes


@pytest.fixture(scope="module")
def sft_baseline(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft_single")
    model, losses = worker.train_sft(worker.config(out), single(), out / "plain")
    return {"model": model, "losses": losses, "grad_norms": worker.grad_norms(out / "plain")}


@pytest.fixture(scope="module")
def fsdp2_sft(tmp_path_factory):
    return run_scenario("fsdp2_sft", tmp_path_factory)


@pytest.mark.distributed
def test_fsdp2_sft_two_ranks_match_one(fsdp2_sft, sft_baseline):
    result, _ = fsdp2_sft
    assert len(result["losses"]) == 4
    assert_close(result["losses"], sft_baseline["losses"])
    assert_close(result["grad_norms"], sft_baseline["grad_norms"])


@pytest.mark.distributed
def test_fsdp2_activation_checkpointing_changes_nothing(fsdp2_sft):
    result, _ = fsdp2_sft
    assert_close(result["checkpointed"], result["losses"][:2], tol=1e-6)


@pytest.mark.distributed
def test_fsdp2_resume_matches_the_uninterrupted_run(fsdp2_sft):
    result, out = fsdp2_sft
    assert_close(result["resumed"], result["losses"][2:], tol=1e-6)
    logged = [json.loads(line)["step"] for line in (out / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert logged == [3, 4]
    # A changed peak lr on resume is the lr used (not the checkpoint's): the same schedule, a third as high.
    assert_close([lr / 3 for lr in result["lr"][2:]], result["lower_lr"], tol=1e-12)
    state = out / "plain" / "checkpoints" / "step_000002" / "training_state"
    assert (state / "sharded").is_dir() and (state / "rng.pt").is_file() and (state / "rng_rank1.pt").is_file()


@pytest.mark.distributed
def test_fsdp2_saved_folders_load_in_plain_transformers(fsdp2_sft, sft_baseline):
    from transformers import AutoModelForCausalLM

    result, out = fsdp2_sft
    ids = torch.tensor(worker.PROBE_IDS)
    expected = sft_baseline["model"].eval()(input_ids=ids).logits
    for folder in (out / "hf", out / "plain" / "checkpoints" / "step_000004"):
        loaded = AutoModelForCausalLM.from_pretrained(folder)
        assert json.loads((folder / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
        logits = loaded(input_ids=ids).logits
        assert_close(logits.tolist(), result["logits"])  # the sharded model, as it was in the 2 processes
        assert_close(logits.tolist(), expected.tolist())  # the single-device model after the same training


@pytest.mark.distributed
def test_fsdp2_vision_language_sft_two_ranks_match_one(tmp_path_factory):
    result, _ = run_scenario("fsdp2_vlm_sft", tmp_path_factory)
    out = tmp_path_factory.mktemp("vlm_single")
    cfg = worker.config(out, max_steps=3, global_batch_size=4, micro_batch_size_per_device=2)
    losses = worker.train_vlm_sft(cfg, single(), out / "vlm_sft", out / "vlm")
    assert_close(result["losses"], losses)
    # Norms near 3 over 3M parameters, their squares summed per shard then across ranks: fp32 order moves ~1e-5.
    assert_close(result["grad_norms"], worker.grad_norms(out / "vlm_sft"), rtol=3e-5)


@pytest.fixture(scope="module")
def dpo_baseline(tmp_path_factory):
    out = tmp_path_factory.mktemp("dpo_single")
    return worker.train_dpo(worker.config(out, "dpo", max_steps=3), single(), out / "dpo")


# fsdp2_chunked_dpo: policy and frozen reference both sharded, every row's log-probs from the chunked output layer.
@pytest.mark.distributed
@pytest.mark.parametrize("scenario", ["fsdp2_dpo", "fsdp2_chunked_dpo"])
def test_fsdp2_dpo_two_ranks_match_one(scenario, tmp_path_factory, dpo_baseline):
    result, _ = run_scenario(scenario, tmp_path_factory)
    assert_close(result["losses"], dpo_baseline)
    assert result["losses"][-1] < result["losses"][0]


@pytest.fixture(scope="module")
def fsdp2_grpo(tmp_path_factory):
    return run_scenario("fsdp2_grpo", tmp_path_factory)


@pytest.mark.distributed
def test_fsdp2_grpo_update_on_fixed_rollouts_matches_one_rank(fsdp2_grpo, tmp_path):
    result, _ = fsdp2_grpo
    baseline = worker.grpo_update(worker.rl_config(tmp_path), single())
    # Groups sit whole on one rank; REINFORCE++ whitens over the batch, which the gather makes global.
    for name in ("grpo", "reinforce_pp"):
        assert_close(result["update"]["advantages"][name], baseline["advantages"][name], tol=1e-6)
    for key in ("loss", "grad_norm", "clip_frac_high", "approx_kl"):
        assert_close(result["update"]["metrics"][key], baseline["metrics"][key])
    assert_close(result["update"]["logits"], baseline["logits"])  # the weights after the 2 optimizer steps


@pytest.mark.distributed
def test_fsdp2_rl_loop_samples_from_the_sharded_policy(fsdp2_grpo):
    result, out = fsdp2_grpo
    assert len(result["loop"]["rewards"]) == 2
    # The engine sampled from the sharded model (synced decoding) and the trainer scores the same tokens alike.
    assert result["loop"]["metrics"]["logprob_mismatch/mean_abs"] < 1e-4
    assert (out / "loop" / "checkpoints" / "step_000002" / "training_state" / "sharded").is_dir()


def assert_ppo_matches_one_rank(result: dict, tmp_path: Path, tol: float = TOL) -> None:
    baseline = worker.ppo_update(worker.ppo_config(tmp_path), single(), tmp_path / "one")
    # GAE whitens over every rank's tokens: the gathered advantages and returns are one process's.
    ranks = [row for rank in result["update"]["advantages_and_returns"] for row in rank]
    one = [row for rank in baseline["advantages_and_returns"] for row in rank]
    assert len(ranks) == len(one) == 16  # 8 completions' advantages, then returns, however the ranks split them
    for a, b in zip(sorted(ranks), sorted(one)):
        assert_close(a, b, tol=1e-5)
    for key in ("loss", "grad_norm", "critic/loss", "critic/grad_norm", "critic/abs_error"):
        assert result["update"]["metrics"][key] == pytest.approx(baseline["metrics"][key], abs=tol), (key, result["update"]["metrics"], baseline["metrics"])
    assert_close(result["update"]["logits"], baseline["logits"], tol=tol)  # the policy after its steps
    assert_close(result["update"]["critic"], baseline["critic"], tol=tol)  # the critic after its steps


@pytest.mark.distributed
def test_fsdp2_ppo_with_a_sharded_critic_matches_one_process(tmp_path_factory, tmp_path):
    result, out = run_scenario("fsdp2_ppo", tmp_path_factory)
    assert_ppo_matches_one_rank(result, tmp_path)
    assert len(result["loop"]["rewards"]) == 2 and result["loop"]["metrics"]["critic/loss"] > 0
    assert (out / "loop" / "checkpoints" / "step_000002" / "critic").is_dir()  # the critic is checkpointed


@pytest.mark.distributed
@pytest.mark.skipif(not HAS_DEEPSPEED, reason="deepspeed is not installed (pip install -e '.[deepspeed]')")
def test_deepspeed_zero3_ppo_matches_one_process(tmp_path_factory, tmp_path):
    result, _ = run_scenario("deepspeed_ppo", tmp_path_factory)
    assert_ppo_matches_one_rank(result, tmp_path)


# ----------------------------------------------------------------------------- DeepSpeed, 2 processes


@pytest.mark.distributed
@pytest.mark.skipif(not HAS_DEEPSPEED, reason="deepspeed is not installed (pip install -e '.[deepspeed]')")
def test_deepspeed_zero2_and_zero3_match_one_rank_and_resume(tmp_path_factory, sft_baseline):
    from transformers import AutoModelForCausalLM

    result, out = run_scenario("deepspeed_sft", tmp_path_factory)
    assert_close(result["zero2"], sft_baseline["losses"])
    assert_close(result["zero3"], sft_baseline["losses"])
    assert_close(result["resumed"], result["zero3"][2:], tol=1e-6)
    ids = torch.tensor(worker.PROBE_IDS)
    for stage in ("zero2", "zero3"):
        loaded = AutoModelForCausalLM.from_pretrained(out / stage / "checkpoints" / "step_000004")
        assert_close(loaded(input_ids=ids).logits.tolist(), sft_baseline["model"].eval()(input_ids=ids).logits.tolist())


@pytest.mark.distributed
@pytest.mark.parametrize("scenario", ["fsdp2_chunked_sft",
                                      pytest.param("deepspeed_chunked_sft", marks=pytest.mark.skipif(
                                          not HAS_DEEPSPEED, reason="deepspeed is not installed"))])
def test_chunked_output_layer_on_sharded_weights_matches_the_whole_logits_on_one_rank(scenario, tmp_path_factory,
                                                                                      sft_baseline):
    # The sharded output layer is called once per chunk outside the model's forward, and again when its chunk is
    # recomputed in the backward: FSDP2 and ZeRO-3 must gather its weights both times and reduce its gradient.
    result, _ = run_scenario(scenario, tmp_path_factory)
    assert_close(result["losses"], sft_baseline["losses"])
    assert_close(result["grad_norms"], sft_baseline["grad_norms"])


# ----------------------------------------------------------------------------- the CLI under torchrun


def cli_sft_config(tmp_path: Path, tokenizer, mixed_precision: str) -> Path:
    """A 3-step SFT config of a tiny Llama with the bundled tokenizer, for `oxrl train` in one process or under torchrun."""
    model = make_tiny_llama(vocab_size=len(tokenizer))
    model.config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    rows = [{"messages": [{"role": "user", "content": f"What is {i}+{i * 3}?"},
                          {"role": "assistant", "content": "The answer is " + str(4 * i) + "." * (1 + i % 4)}]} for i in range(20)]
    (tmp_path / "chat.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    config = {
        "run": {"name": "cli", "output_dir": str(tmp_path / "runs"), "device": "cpu"},
        "model": {"name_or_path": str(tmp_path / "model")},
        "data": {"train": [{"path": str(tmp_path / "chat.jsonl")}], "validation_fraction": 0.2, "max_length": 64},
        "algorithm": {"name": "sft"},
        "train": {"global_batch_size": 4, "micro_batch_size_per_device": 1, "max_steps": 3, "eval_every": 3,
                  "mixed_precision": mixed_precision, "optim": {"lr": 1e-3}},
        "checkpoint": {"every": 3},
        "logging": {"progress_bar": False, "plot": False},
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run_metrics(tmp_path: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "runs" / name / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.distributed
def test_torchrun_oxrl_train_matches_one_process(tmp_path, smollm2_tokenizer):
    from oxrl.cli import main

    path = cli_sft_config(tmp_path, smollm2_tokenizer, "no")  # fp32: the two layouts agree to 1e-5
    torchrun(["-m", "oxrl", "train", str(path), "run.name=two", "strategy.name=auto"])
    assert main(["train", str(path), "run.name=one"]) == 0
    two, one = run_metrics(tmp_path, "two"), run_metrics(tmp_path, "one")
    assert [r["step"] for r in two] == [1, 2, 3]  # written once, by rank 0
    for key in ("loss", "val/loss"):
        assert_close([r[key] for r in two if key in r], [r[key] for r in one if key in r])
    # A 49k-row embedding's gradient summed in another order (and other thread counts): relative 1e-5.
    assert_close([r["grad_norm"] for r in two], [r["grad_norm"] for r in one], tol=0.0, rtol=1e-5)
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tmp_path / "runs" / "two" / "final")


@pytest.mark.distributed
@pytest.mark.parametrize("mesh", ["tp", "cp"])
def test_torchrun_oxrl_train_on_a_mesh_matches_one_process(mesh, tmp_path, smollm2_tokenizer):
    """`oxrl train` end to end under torchrun with `strategy.mesh.tp=2` or `cp=2`: the loaded model split or its
    rows split, the same losses as one process, and a final folder that loads in plain transformers."""
    from transformers import AutoModelForCausalLM

    from oxrl.cli import main

    path = cli_sft_config(tmp_path, smollm2_tokenizer, "no")
    torchrun(["-m", "oxrl", "train", str(path), "run.name=mesh", "strategy.name=fsdp2", f"strategy.mesh.{mesh}=2"])
    assert main(["train", str(path), "run.name=one"]) == 0
    meshed, one = run_metrics(tmp_path, "mesh"), run_metrics(tmp_path, "one")
    for key in ("loss", "val/loss"):
        assert_close([r[key] for r in meshed if key in r], [r[key] for r in one if key in r])
    assert_close([r["grad_norm"] for r in meshed], [r["grad_norm"] for r in one], tol=0.0, rtol=1e-5)
    saved = yaml.safe_load((tmp_path / "runs" / "mesh" / "config.yaml").read_text())
    assert saved["strategy"]["mesh"][mesh] == 2
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "runs" / "mesh" / "final")
    expected = AutoModelForCausalLM.from_pretrained(tmp_path / "runs" / "one" / "final")
    ids = torch.tensor(worker.PROBE_IDS)
    assert_close(final(input_ids=ids).logits.tolist(), expected(input_ids=ids).logits.tolist())


@pytest.mark.distributed
@pytest.mark.skipif(not cpu_has_native_bf16(), reason="`auto` is bf16 only on a CPU with native bf16")
@pytest.mark.parametrize("strategy", ["fsdp2", pytest.param("deepspeed", marks=pytest.mark.skipif(
    not HAS_DEEPSPEED, reason="deepspeed is not installed"))])
def test_torchrun_with_the_default_precision_trains_in_bf16_like_one_process(strategy, tmp_path, smollm2_tokenizer):
    # `train.mixed_precision: auto` is bf16 on this CPU: FSDP2's bf16 parameter policy and DeepSpeed's bf16 mode over
    # gloo follow one process under bf16 autocast to bf16's rounding (measured: losses 7e-5, gradient norms 4e-4
    # relative).
    from oxrl.cli import main

    path = cli_sft_config(tmp_path, smollm2_tokenizer, "auto")
    torchrun(["-m", "oxrl", "train", str(path), "run.name=two", f"strategy.name={strategy}"])
    assert main(["train", str(path), "run.name=one"]) == 0
    assert main(["train", str(path), "run.name=fp32", "train.mixed_precision=no"]) == 0
    two, one, fp32 = run_metrics(tmp_path, "two"), run_metrics(tmp_path, "one"), run_metrics(tmp_path, "fp32")
    for key in ("loss", "val/loss", "grad_norm"):
        assert_close([r[key] for r in two if key in r], [r[key] for r in one if key in r], tol=0.0, rtol=2e-3)
    # It really computed in bf16: fp32 layouts agree to TOL (above), bf16 moves step 1's loss by ~7e-5.
    assert abs(two[0]["loss"] - fp32[0]["loss"]) > TOL
    assert two[-1]["loss"] < two[0]["loss"]


# ----------------------------------------------------------------------------- non-finite steps, lost ranks


def assert_nan_step_skipped_everywhere(result: dict, out: Path) -> None:
    """Rank 1 alone had NaN losses at step 2: both ranks skipped it, so step 2's weights are step 1's."""
    from safetensors.torch import load_file

    assert result["skipped_on_every_rank"] == [1, 1]
    assert result["nonfinite_steps"] == [0, 1, 1]
    assert math.isnan(result["losses"][1]) and math.isfinite(result["losses"][2])
    step_1, step_2, step_3 = (load_file(out / "run" / "checkpoints" / f"step_{s:06d}" / "model.safetensors") for s in (1, 2, 3))
    assert all(torch.equal(step_1[k], step_2[k]) for k in step_1)
    assert any(not torch.equal(step_2[k], step_3[k]) for k in step_2)


@pytest.mark.distributed
def test_fsdp2_skips_a_step_that_is_nan_on_one_rank_on_every_rank(tmp_path_factory):
    result, out = run_scenario("fsdp2_nonfinite", tmp_path_factory)
    assert_nan_step_skipped_everywhere(result, out)


@pytest.mark.distributed
@pytest.mark.skipif(not HAS_DEEPSPEED, reason="deepspeed is not installed (pip install -e '.[deepspeed]')")
def test_deepspeed_skips_a_step_that_is_nan_on_one_rank_on_every_rank(tmp_path_factory):
    result, out = run_scenario("deepspeed_nonfinite", tmp_path_factory)
    assert_nan_step_skipped_everywhere(result, out)


@pytest.mark.distributed
@pytest.mark.parametrize("scenario", ["dead_rank", "stuck_rank"])
def test_a_lost_rank_ends_the_collective_with_an_error_within_the_timeout(tmp_path_factory, scenario):
    """strategy.collective_timeout_s bounds every collective: a rank that exited or hangs makes the
    others fail (gloo: lost peer, or timed out) instead of waiting forever."""
    out = tmp_path_factory.mktemp(scenario)
    torchrun(["-m", "tests.distributed_worker", scenario, str(out)], timeout=180)
    result = json.loads((out / "result.json").read_text())
    assert result["outcome"] != "returned" and "Error" in result["outcome"]
    assert result["seconds"] < worker.COLLECTIVE_TIMEOUT_S + 10
    if scenario == "stuck_rank":  # alive but silent: only the timeout ends the wait
        assert result["seconds"] > worker.COLLECTIVE_TIMEOUT_S - 1


# ----------------------------------------------------------------------------- tensor and context parallel

# Scenario -> processes: TP2, CP2, FSDP2 x TP2 and FSDP2 x CP2 (tests/distributed_worker.py `mesh_runs`).
MESHES = {"mesh_tp2": 2, "mesh_cp2": 2, "mesh_dp2_tp2": 4, "mesh_dp2_cp2": 4, "mesh_tp2_families": 2}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """SFT, DPO and a GRPO update in this process on one device (transformers' sdpa attention, whole logits)."""
    out = tmp_path_factory.mktemp("mesh_single")
    model, sft = worker.train_sft(worker.config(out), single(), out / "sft")
    dpo = worker.train_dpo(worker.config(out, "dpo", max_steps=3), single(), out / "dpo")
    return {"sft": {"losses": sft, "grad_norms": worker.grad_norms(out / "sft"), "logits": worker.probe_logits(model)},
            "dpo": {"losses": dpo, "grad_norms": worker.grad_norms(out / "dpo")},
            "grpo": worker.grpo_update(worker.rl_config(out), single())}


@pytest.fixture(scope="module")
def mesh_run(tmp_path_factory):
    """Each mesh scenario's result and folder, run once for the tests that read it."""
    done: dict[str, tuple[dict, Path]] = {}

    def run(name: str) -> tuple[dict, Path]:
        if name not in done:
            done[name] = run_scenario(name, tmp_path_factory, processes=MESHES[name])
        return done[name]

    return run


@pytest.mark.distributed
def test_vocabulary_parallel_logprobs_entropy_and_gradient_equal_the_whole_vocabularys(tmp_path_factory):
    result, _ = run_scenario("vocab_parallel", tmp_path_factory)
    logits = torch.tensor(result["logits"], requires_grad=True)
    targets, weights = torch.tensor(result["targets"]), torch.tensor(result["weights"])
    logp = logits.log_softmax(-1)
    logprobs, entropy = logp.gather(-1, targets[:, None])[:, 0], -(logp.exp() * logp).sum(-1)
    loss = (weights * logprobs).sum() + (weights.flip(0) * entropy).sum()
    loss.backward()
    assert_close(result["logprobs"], logprobs.tolist(), tol=1e-6)
    assert_close(result["entropy"], entropy.tolist(), tol=1e-6)
    assert_close(result["loss"], float(loss), tol=1e-5)
    assert_close(result["gradient"], logits.grad.tolist(), tol=1e-6)  # each rank's half, side by side


@pytest.mark.distributed
def test_tensor_parallel_trains_each_family_it_splits_like_one_process(mesh_run, tmp_path):
    """The architecture matrix under TP2: Llama (and with tied embeddings), Qwen2, Qwen3 (per-head norms), the MoE
    families (experts whole on every rank), Mistral, Gemma 2/3, Phi-3 (fused projections), SmolLM3 train 2 SFT steps
    as on one device."""
    from tests.integration.test_architectures import INSTALLED

    result, out = mesh_run("mesh_tp2_families")
    assert not result["refused"]
    assert set(result["trained"]) == {*INSTALLED, "llama_tied"}
    assert {"llama", "qwen2", "qwen3", "qwen2_moe", "mistral", "phi3"} <= set(result["trained"])
    for name, meshed in result["trained"].items():
        cfg = worker.config(tmp_path, max_steps=2)
        alone = worker.family_sft(cfg, single(), out / name, tmp_path / name)
        assert_close(meshed["losses"], alone["losses"])
        assert_close(meshed["grad_norms"], alone["grad_norms"], rtol=1e-5)


@pytest.mark.distributed
@pytest.mark.parametrize("scenario", [name for name in MESHES if name != "mesh_tp2_families"])
def test_mesh_trains_like_one_process(scenario, mesh_run, one_process):
    """Losses, gradient norms and the weights after the steps (the logits they give) within 1e-5 of one process,
    for SFT, DPO and a GRPO update, every row's log-probs from the vocabulary-parallel or row-splitting path."""
    from transformers import AutoModelForCausalLM

    result, out = mesh_run(scenario)
    tp, cp = (2, 1) if "tp2" in scenario else (1, 2)
    assert result["layout"] == [tp, cp]
    split = set(result["split_parameters"])
    if tp == 2:  # every projection of the family's plan, the embedding and the output layer
        assert {"model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight",
                "model.embed_tokens.weight", "lm_head.weight"} <= split
        assert "model.norm.weight" not in split
    else:
        assert not split
    for objective in ("sft", "dpo"):
        assert_close(result[objective]["losses"], one_process[objective]["losses"])
        assert_close(result[objective]["grad_norms"], one_process[objective]["grad_norms"])
    assert_close(result["sft"]["logits"], one_process["sft"]["logits"])
    assert_close(result["sft"]["checkpointed"], one_process["sft"]["losses"][:2])  # activation checkpointing
    grpo, baseline = result["grpo"], one_process["grpo"]
    for key in ("loss", "grad_norm", "approx_kl", "entropy"):
        assert_close(grpo["metrics"][key], baseline["metrics"][key])
    assert_close(grpo["logits"], baseline["logits"])  # the weights after the update's 2 optimizer steps
    # The HF folder is the whole model, gathered from every rank's slices and shards.
    loaded = AutoModelForCausalLM.from_pretrained(out / "hf").eval()
    assert_close(loaded(input_ids=torch.tensor(worker.PROBE_IDS)).logits.tolist(), one_process["sft"]["logits"])
    # Sampling from the split model: the engine's log-probs are the trainer's.
    assert len(result["loop"]["rewards"]) == 2
    assert result["loop"]["metrics"]["logprob_mismatch/mean_abs"] < 1e-4


@pytest.mark.distributed
def test_a_checkpoint_resumes_under_another_mesh(mesh_run, one_process, tmp_path_factory):
    """Saved at FSDP2 x TP2 (4 processes), resumed in one; saved in one, resumed at TP2 x CP2: steps 3 and 4 as
    the uninterrupted run's, though the resumed run starts from other weights."""
    uninterrupted = one_process["sft"]["losses"]
    _, meshed = mesh_run("mesh_dp2_tp2")
    alone, _ = run_scenario("mesh_sft", tmp_path_factory, processes=1,
                            args=("{}", str(meshed / "sft" / "checkpoints" / "step_000002")))
    assert_close(alone["losses"], uninterrupted[2:])
    fresh, fresh_out = run_scenario("mesh_sft", tmp_path_factory, processes=1, args=("{}",))
    assert_close(fresh["losses"], uninterrupted)
    back, _ = run_scenario("mesh_sft", tmp_path_factory, processes=4,
                           args=('{"tp": 2, "cp": 2}', str(fresh_out / "sft" / "checkpoints" / "step_000002")))
    assert_close(back["losses"], uninterrupted[2:])
