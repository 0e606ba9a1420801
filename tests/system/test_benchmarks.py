"""Every script in benchmarks/ runs, at its smallest setting on a tiny random model (no hub), to its printed table.

Benchmarks that no test runs break silently (a changed signature or default, a kernel TRL's half cannot take), and
the README's figures come from them. So each script here runs as a user starts it (`python benchmarks/x.py ...`,
a fresh process, both halves of a side-by-side), and its table is read back: its columns, one row per side, and
where a script prints the first step's loss, the two sides agree on it (same weights, same tokens). A script whose
dependency is missing (TRL, Ray, a CUDA device, bubblewrap, the PushT simulator, lerobot's venv) skips, saying which. The list of
scripts is the folder's: a new script without an entry in SMOKE fails `test_every_benchmark_has_a_smoke_run`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch
import yaml

from tests.conftest import save_tiny_model

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
HELPERS = {"__init__.py", "common.py"}  # shared tools, not scripts
TRL_MISSING = "TRL is not installed: the script's TRL half cannot run (`make test` installs it with the dev extra)"
RAY_MISSING = "Ray is not installed (pip install -e '.[ray]')"
HUNG_AFTER_S = 600  # a script still running after this is hung; the whole tier takes minutes


def scripts() -> list[str]:
    return sorted(path.name for path in BENCHMARKS.glob("*.py") if path.name not in HELPERS)


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[dict[str, str]]

    def column(self, name: str) -> list[str]:
        return [row[name] for row in self.rows]


def tables(output: str) -> list[Table]:
    """The Markdown tables `benchmarks.common.print_table` printed, each with the line above it as its title."""
    found, lines = [], output.splitlines()
    index = 0
    while index < len(lines):
        if lines[index].startswith("| ") and index + 1 < len(lines) and lines[index + 1].startswith("|-"):
            columns = [cell.strip() for cell in lines[index].strip("|").split("|")]
            rows, end = [], index + 2
            # rows up to the first line that is not one, or the header of a table printed right after this one
            while (end < len(lines) and lines[end].startswith("| ")
                   and not (end + 1 < len(lines) and lines[end + 1].startswith("|-"))):
                rows.append(dict(zip(columns, (cell.strip() for cell in lines[end].strip("|").split("|")))))
                end += 1
            found.append(Table(lines[index - 1] if index else "", columns, rows))
            index = end
        else:
            index += 1
    return found


def run_script(name: str, *args: object) -> str:
    """`python benchmarks/<name> args...` from the repository root: its stdout, or a failure showing its output's end.
    The timeout only ends a hung script: on a busy shared machine a smoke run takes several times its quiet time."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run([sys.executable, str(BENCHMARKS / name), *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=HUNG_AFTER_S)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"benchmarks/{name} {' '.join(map(str, args))} exited {done.returncode}:\n{output[-6000:]}"
    return done.stdout


def table(output: str, title_starts: str) -> Table:
    matching = [t for t in tables(output) if t.title.startswith(title_starts)]
    assert len(matching) == 1, f"expected one table titled {title_starts!r}, found {[t.title for t in tables(output)]}"
    return matching[0]


def assert_same_number(values: list[str], tolerance: float, what: str) -> None:
    numbers = [float(v) for v in values]
    assert max(numbers) - min(numbers) <= tolerance * max(1.0, abs(numbers[0])), f"{what} differ: {values}"


def require_module(module: str, reason: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(reason)


# --- the side-by-sides with TRL ------------------------------------------------------------------------------------


def assert_trained_the_same_tokens(result) -> None:
    """Same weights, same first batch: both sides' step-1 loss and gradient norm agree."""
    assert_same_number(result.column("step-1 loss"), 1e-4, "step-1 losses of oxRL and TRL")
    assert_same_number(result.column("step-1 grad norm"), 1e-3, "step-1 gradient norms of oxRL and TRL")


def smoke_sft(model: Path, tmp_path: Path) -> None:
    require_module("trl", TRL_MISSING)
    # 576 tokens a step: 2 chats (mean length 288), so the step's row really packs two sequences
    output = run_script("sft.py", "--model", model, "--steps", 1, "--warmup-steps", 0, "--tokens-per-step", 576)
    result = table(output, "SFT")
    assert result.columns == ["trainer", "non-pad tokens/s", "s/step", "s/step median (min..max)", "MFU", "peak RSS",
                              "step-1 loss", "step-1 grad norm"]
    assert result.column("trainer") == ["oxRL", "TRL (padding_free)"]
    assert_trained_the_same_tokens(result)
    assert "oxRL / TRL non-pad tokens/s" in output


def smoke_dpo(model: Path, tmp_path: Path) -> None:
    require_module("trl", TRL_MISSING)
    output = run_script("dpo.py", "speed", "--model", model, "--steps", 1, "--warmup-steps", 0, "--pairs-per-step", 2)
    result = table(output, "DPO")
    assert result.columns == ["trainer", "pairs/s", "pairs/CPU-s", "s/step", "s/step median (min..max)", "peak RSS",
                              "step-1 loss", "step-1 grad norm"]
    assert result.column("trainer") == ["oxRL", "TRL DPOTrainer"]
    assert_trained_the_same_tokens(result)


def smoke_grpo(model: Path, tmp_path: Path) -> None:
    require_module("trl", TRL_MISSING)
    output = run_script("grpo.py", "--model", model, "--steps", 1, "--warmup-steps", 0, "--prompts-per-step", 1,
                        "--n", 2, "--max-new-tokens", 4)
    # GRPO samples on both sides, so no loss can agree: the prompts they sample from must
    assert "prompt token ids identical in oxRL and TRL: True" in output
    result = table(output, "GRPO")
    assert result.columns == ["trainer", "s/step", "s/step median (min..max)", "generate s", "reward s",
                              "old logprobs s", "train s", "completions/s", "generated tokens/s", "mean length",
                              "reward", "peak RSS"]
    assert result.column("trainer") == ["oxRL", "TRL"]
    assert all(0 < float(length) <= 4 for length in result.column("mean length"))


# --- oxRL alone ----------------------------------------------------------------------------------------------------


def smoke_decode(model: Path, tmp_path: Path) -> None:
    output = run_script("decode.py", "--model", model, "--batch", 1, "--new-tokens", 4, "--repeats", 1,
                        "--bandwidth-gib", 0.0625)
    result = table(output, "HFEngine.generate")
    assert result.columns == ["weights", "batch", "tokens/s median (min..max)", "bandwidth bound tokens/s",
                              "share of bound"]
    assert result.column("weights") == ["fp32", "bf16 autocast", "bf16 copy"]


def smoke_logits_memory(model: Path, tmp_path: Path) -> None:
    output = run_script("logits_memory.py", "--tokens", 64)
    result = table(output, "151,936-token vocabulary")
    assert result.column("log-probs") == ["whole logits", "chunked"]
    assert_same_number(result.column("sum of log-probs"), 1e-5, "log-probs of whole and chunked logits")


def smoke_memory_estimate(model: Path, tmp_path: Path) -> None:
    output = run_script("memory_estimate.py", "--device", "cpu", "--model", model, "--tokens", 64)
    result = table(output, "Peak training memory")
    assert result.columns == ["case", "estimate GiB", "measured GiB", "measured/estimate", "reserved GiB", "tokens/s"]
    assert result.column("case") == ["cpu full fp32 1k", "cpu lora fp32 1k", "cpu full+ckpt fp32 1k"]
    assert all(float(value) > 0 for value in result.column("estimate GiB")), result.rows  # no case failed


def smoke_packed_attention(model: Path, tmp_path: Path) -> None:
    output = run_script("packed_attention.py", "--model", model, "--tokens", 64, "--sequences", 2, "--warmup", 0,
                        "--repeats", 1)
    result = table(output, "forward + backward")
    assert result.column("attention") == ["sdpa", "oxrl_packed_sdpa"]
    assert_same_number(result.column("loss"), 1e-5, "losses of transformers' sdpa and oxRL's packed kernel")


def smoke_context_parallel_memory(model: Path, tmp_path: Path) -> None:
    output = run_script("context_parallel_memory.py", "--tokens", 2048, "--steps", 2, "--hidden", 64,
                        "--layouts", "1x1", "2x1")
    result = table(output, "peak memory per rank")
    assert result.columns == ["layout", "row tokens", "tokens per rank", "peak growth per rank, MiB",
                              "step s, median (min..max)"]
    assert result.column("layout") == ["cp 1 x tp 1", "cp 2 x tp 1"]
    assert result.column("tokens per rank") == ["2,048", "1,024"]


# The demo's GRPO config, shrunk: the tiny model, 2 prompts x 2 completions of 8 tokens, 4 validation prompts.
def demo_overrides(model: Path) -> list[str]:
    return [f"model.name_or_path={model}", "rl.prompts_per_step=2", "rl.rollout.n=2", "rl.rollout.max_new_tokens=8",
            "rl.validation_size=4", "train.micro_batch_size_per_device=4"]


def smoke_rows_leave(model: Path, tmp_path: Path) -> None:
    output = run_script("rows_leave.py", "--repeats", 1, *demo_overrides(model))
    result = table(output, "HFEngine.generate on the demo's shapes")
    assert result.columns == ["decoding", "how", "seconds median (min..max)", "completion tokens mean / max"]
    assert len(result.rows) == 4 and result.column("how")[::2] == ["one call", "one call"]


def smoke_ray_overhead(model: Path, tmp_path: Path) -> None:
    require_module("ray", RAY_MISSING)
    output = run_script("ray_overhead.py", "--steps", 2, *demo_overrides(model))
    result = table(output, "demo GRPO step")
    assert result.columns == ["metric", "one process", "Ray: 1 trainer + 1 worker"]
    assert result.column("metric") == ["time/step", "time/generate", "time/train", "time/weight_sync"]
    assert "Ray overhead per step" in output


def smoke_ray_broadcast(model: Path, tmp_path: Path) -> None:
    output = run_script("ray_broadcast.py", "--params", "1e5", "--receivers", 1, 2, "--repeats", 1)
    result = table(output, "weight broadcast, gloo over loopback TCP")
    assert result.columns == ["parameters", "receivers", "bucket MB", "seconds", "ns / parameter", "MB/s per receiver"]
    assert result.column("receivers") == ["1", "2"] and all(float(s) > 0 for s in result.column("seconds"))
    assert "load average" in output


def smoke_async_rl(model: Path, tmp_path: Path) -> None:
    plot, runs = tmp_path / "plots" / "curves.png", tmp_path / "runs"  # (folders the script makes)
    curves = ["curves", *demo_overrides(model), "--seeds", 0, "--steps", 4, "--sync-steps", 2, "--every", 2,
              "--out", runs]
    output = run_script("async_rl.py", *curves, "--k", 0, 1, "--jobs", 2, "--plot", plot)
    by_steps = table(output, "held-out greedy accuracy against steps")
    assert by_steps.columns == ["setting", "step 0", "step 2", "step 4"]
    assert by_steps.column("setting") == ["k = 0", "k = 1, decoupled"]
    assert by_steps.rows[0]["step 4"] == "-" and by_steps.rows[1]["step 4"].endswith(")")  # k = 0 stops at 2 steps
    by_version = table(output, "training reward (reward/mean) by the policy version that sampled it")
    assert by_version.columns == ["setting", "versions 0..1", "versions 2..2"]  # k = 1 sampled steps 1-4 by 0, 0, 1, 2
    assert by_version.rows[0]["versions 2..2"] == "-" and 0 <= float(by_version.rows[1]["versions 2..2"]) <= 1
    at_time = table(output, "held-out greedy accuracy at the wall-clock of the same seed's k = 0 run")
    assert at_time.column("steps done")[0] == "2"  # k = 0's own last step; k = 1's is whatever it reached by then
    to_half = table(output, "minutes to the first validation at 50% held-out accuracy or more")
    assert to_half.column("setting") == ["k = 0", "k = 1, decoupled"] and len(to_half.rows[0]["minutes, per seed"]) > 0
    entropy = table(output, "the samples' mean token entropy (`entropy`) by step")
    assert entropy.columns == ["setting", "steps 1..2", "steps 3..4"] and entropy.rows[0]["steps 3..4"] == "-"
    assert float(entropy.rows[1]["steps 3..4"]) > 0
    assert plot.stat().st_size > 10_000
    again = run_script("async_rl.py", *curves, "--k", 0)  # the finished k = 0 run is read, not run again
    assert f"read again from {runs}: 1 finished run(s)" in again
    read = table(again, "held-out greedy accuracy against steps")
    assert read.columns == ["setting", "step 0", "step 2"]
    assert read.rows == [{column: by_steps.rows[0][column] for column in read.columns}]
    require_module("ray", RAY_MISSING)
    # the overrides first: `--k` takes every number after it
    output = run_script("async_rl.py", "speed", *demo_overrides(model), "--steps", 2, "--k", 1,  # (k = 0: below)
                        "--interruptible")
    result = table(output, "demo GRPO step under Ray")
    assert result.columns == ["metric", "k = 1", "k = 1, interruptible"]
    assert result.column("metric") == ["time/step", "time/generate", "time/train", "time/weight_sync",
                                       "off_policy/fresher_tokens", "off_policy/token_version_lag", "steps/min"]
    fresher, lag = result.rows[4], result.rows[5]
    assert fresher["k = 1"] == lag["k = 1"] == "-"  # tokens carry their versions only when interruptible
    assert 0 <= float(fresher["k = 1, interruptible"].split()[0]) <= 1
    assert 0 <= float(lag["k = 1, interruptible"].split()[0]) <= 1  # (k = 1: at most one update behind)
    # the finished k = 1 run read again, its twins run under Ray: the default schedule, then interruptible
    output = run_script("async_rl.py", *curves, "--k", 1, "--launch", "local", "ray", "interruptible")
    by_steps = table(output, "held-out greedy accuracy against steps")
    assert by_steps.column("setting") == ["k = 1, decoupled", "k = 1, decoupled, Ray", "k = 1, decoupled, interruptible"]
    assert all(row[f"step {step}"].endswith(")") for row in by_steps.rows[1:] for step in (0, 2, 4))
    assert by_steps.rows[1]["step 0"] == by_steps.rows[2]["step 0"] == by_steps.rows[0]["step 0"]  # before any update
    tokens = table(output, "interruptible runs: the share of tokens sampled by weights newer than their request's")
    assert tokens.column("setting") == ["k = 1, decoupled, interruptible"] and tokens.column("scheduled lag") == ["1"]
    assert 0 <= float(tokens.rows[0]["fresher tokens"].split("%")[0]) <= 100
    assert 0 <= float(tokens.rows[0]["token lag (updates)"]) <= 1
    assert all((runs / f"seed0_k1_decoupled_{launch}" / "summary.json").is_file() for launch in ("ray", "interruptible"))
    output = run_script("async_rl.py", "workers", *demo_overrides(model), "--steps", 2, "--workers", 2)
    result = table(output, "GRPO step under Ray, 1 trainer + N rollout workers taking whole steps")
    assert result.columns == ["metric", "k = 0, 1 worker", "k = 1, 2 workers"]
    assert result.column("metric") == ["time/step", "time/generate", "time/train", "steps/min", "speed-up",
                                       "ideal (a core each)"]


def smoke_sandbox(model: Path, tmp_path: Path) -> None:
    from oxrl.rewards.sandbox import SandboxUnavailableError, require_sandbox

    try:
        require_sandbox()
    except SandboxUnavailableError as error:
        pytest.skip(f"no code sandbox here: {error}")
    output = run_script("sandbox.py", "--runs", 1, "--warmup", 0, "--batch", 2, "--workers", 1)
    result = table(output, "One trivial program")
    assert result.column("mode") == ["bwrap", "none", "python -c pass", "python -s -S -B -c pass"]
    for title in ("code_reward throughput (isolation=bwrap, one", "code_reward throughput (isolation=bwrap, three"):
        assert table(output, title).column("max_workers") == ["1"]


def smoke_startup(model: Path, tmp_path: Path) -> None:
    output = run_script("startup.py", "--runs", 1, "--example-runs", 0, "--tokenizer", model)
    result = table(output, "Start-up")
    assert result.column("run") == ["oxrl --help", "tiny SFT, 1 step"]
    assert result.column("key tables") == ["0", "0"]


def smoke_vla_simulators(model: Path, tmp_path: Path) -> None:
    # panda-push: the script is the same for either simulator but for its name (and one entry of its settings),
    # and panda-push's score, being negative, is the one a wrong starting value would hide
    require_module("panda_gym", "panda-gym is not installed (pip install -e '.[vla]')")
    python = lerobot_venv()  # LeRobot's ACT beside the cloned policy, where lerobot's venv exists
    anchor = ["--lerobot-python", python] if python.is_file() else []
    output = run_script("vla_simulators.py", "panda-push", "--out", tmp_path / "vla", "--demos", 2, "--sft-steps", 1,
                        "--grpo-steps", 1, "--held-out", 1, "--max-chunks", 2, "--tokenizer", model,
                        "--seeds", 0, 1, "--state-bins", 10, "--reward", "success", "--grpo-lr", 1e-3,
                        "--execute", 1, "--digits", "smollm2", "--episodes-per-state", 2, "--validate-every", 1,
                        *anchor)
    result = json.loads(output.strip().splitlines()[-1])  # the script's results: one JSON line
    runs, summary = result["seeds"], result["summary"]
    stages = ["scripted_expert", "untrained", "behaviour_cloned", "first_action_bins",
              *(["lerobot_act"] if anchor else []), "grpo"]
    assert list(runs) == ["0", "1"] and all(list(run) == stages for run in runs.values()) and list(summary) == stages
    assert runs["0"]["scripted_expert"] == runs["1"]["scripted_expert"]  # one demonstrator, one set of states
    grpo = yaml.safe_load((tmp_path / "vla" / "seed-1" / "grpo.yaml").read_text())  # the GRPO settings asked for
    assert grpo["run"]["seed"] == 1 and grpo["train"]["optim"]["lr"] == 1e-3
    assert grpo["vla"]["reward"] == "success" and grpo["vla"]["state_bins"] == 10 and grpo["vla"]["execute"] == 1
    assert grpo["rl"]["rollout"]["n"] == 2 and grpo["rl"]["validation_every"] == 1
    for run in runs.values():  # the held-out curve: the cloned model (step 0), then each validation
        assert list(run["grpo"]["validation"]) == ["0", "1"] and len(run["grpo"]["sampled_reward"]) == 1
        assert run["grpo"]["validation"]["1"] == run["grpo"]["success"]  # the last validation is the evaluation's
        assert run["grpo"]["validation"]["0"] == run["behaviour_cloned"]["success"]
    # --digits smollm2: the policy started from the random one but for its 10 digit tokens' embeddings
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from tests.vlm_fixtures import tiny_qwen2_vl

    tokenizer = AutoTokenizer.from_pretrained(model)
    random, _ = tiny_qwen2_vl(tokenizer, width="vllm", seed=1)
    saved = load_file(tmp_path / "vla" / "seed-1" / "model" / "model.safetensors")
    (embedding,) = [saved[name] for name in saved if name.endswith("embed_tokens.weight")]
    changed = (embedding != random.get_input_embeddings().weight.detach()).any(dim=1).nonzero().flatten().tolist()
    assert tokenizer.convert_ids_to_tokens(changed) == list("0123456789")
    for stage in stages:  # the summary is the seeds' mean
        for key in set(summary[stage]) & {"success", "score", "model"}:
            assert summary[stage][key] == pytest.approx((runs["0"][stage][key] + runs["1"][stage][key]) / 2), stage
    if anchor:
        assert all(run["lerobot_act"]["steps"] >= 1 and run["lerobot_act"]["train_seconds"] > 0
                   for run in runs.values()), runs
    for run in runs.values():
        bins = run.pop("first_action_bins")  # the cloned model's first action against the expert's, in bins
        assert set(bins) == {"frames", "model", "median"} and bins["frames"] >= 2, bins  # (no agent_position: PushT's)
        assert 0.0 <= bins["model"] < 64 and 0.0 <= bins["median"] < 64, bins
        assert all({"score", "success"} <= set(stage) for stage in run.values())
        assert all(-1.0 < stage["score"] < 0.0 for stage in run.values()), run  # minus the best distance, in m
    spread = table(output, "panda-push over seeds 0, 1 (1 held-out initial states each)")
    assert spread.column("stage") == [stage for stage in stages if stage != "first_action_bins"]
    assert all(row["success"].endswith(")") and "+-" in row["success"] for row in spread.rows), spread.rows


def smoke_vla_reach(model: Path, tmp_path: Path) -> None:
    output = run_script("vla_reach.py", "--out", tmp_path / "reach", "--seeds", 0, 1, "--precisions", "fp32",
                        "--episodes", 4, "--sft-steps", 1, "--steps", 1, "--held-out", 2, "--tokenizer", model)
    runs = table(output, "GRPO on reach from the cloned model, each run (lr 0.003, 1 steps, 2 held-out")
    assert runs.column("seed") == ["0", "1"] and runs.column("precision") == ["fp32", "fp32"]
    assert len(set(runs.column("before"))) == 1  # both seeds start from the one clone, on the same initial states
    summary = table(output, "GRPO on reach over seeds 0, 1")
    assert summary.column("runs") == ["2"] and summary.rows[0]["before"] == runs.rows[0]["before"]
    config = yaml.safe_load((tmp_path / "reach" / "grpo_fp32_seed1.yaml").read_text())
    assert config["train"]["mixed_precision"] == "no" and config["rl"]["rollout"]["precision"] == "trainer"


def lerobot_venv() -> Path:
    """Where a python with lerobot is looked for (benchmarks/lerobot_anchor.py says how to make one):
    OXRL_LEROBOT_PYTHON, else the default venv's. lerobot pins its own torch: the set-up does not install it."""
    return Path(os.environ.get("OXRL_LEROBOT_PYTHON", Path.home() / ".cache/oxrl/venv-lerobot/bin/python"))


def lerobot_python() -> Path:
    """A python with lerobot, or a skip saying where none was found."""
    python = lerobot_venv()
    if not python.is_file():
        pytest.skip(f"no python with lerobot at {python} (set OXRL_LEROBOT_PYTHON; benchmarks/lerobot_anchor.py "
                    "says how to make one)")
    return python


def smoke_lerobot_anchor(model: Path, tmp_path: Path) -> None:
    python = lerobot_python()
    demos = ROOT / "examples" / "data" / "reach_demos"  # LeRobot reads oxRL's dataset as written, stats included
    for cameras_only in (False, True):  # --no-state: the diagnostic run without the state as an input
        result = subprocess.run([python, BENCHMARKS / "lerobot_anchor.py", "--demos", demos, "--env", "reach",
                                 "--seconds", "3", "--seeds", "1000000", "1000001", "--max-steps", "4", "--chunk", "2",
                                 *(["--no-state"] if cameras_only else [])],
                                capture_output=True, text=True, timeout=HUNG_AFTER_S, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-4000:]
        row = json.loads(result.stdout.strip().splitlines()[-1])
        assert row["stage"] == "lerobot_act" and row["steps"] >= 1 and 0.0 <= row["success"] <= 1.0, row
        assert row["state"] is not cameras_only, row
        assert row["score"] == row["success"], row  # reach rewards 1 on success only: the best reward is the success


def smoke_experts(model: Path, tmp_path: Path) -> None:
    require_module("gym_pusht", "the PushT simulator is not installed (pip install -e '.[vla]')")
    output = run_script("experts.py", "pusht", "--episodes", 1, "--first-seed", 3, "--max-steps", 150)
    episode, summary = (json.loads(line) for line in output.strip().splitlines()[-2:])
    assert episode["seed"] == 3 and episode["success"] and episode["score"] > 0.95, episode
    assert summary["summary"]["success"] == 1.0 and summary["summary"]["seeds"] == "3..3"
    require_module("panda_gym", "panda-gym is not installed (pip install -e '.[vla]')")
    output = run_script("experts.py", "panda-push", "--episodes", 1, "--first-seed", 1, "--max-steps", 50)
    episode, summary = (json.loads(line) for line in output.strip().splitlines()[-2:])
    assert episode["success"] and -0.05 < episode["score"] <= 0, episode  # (minus the cube's distance, in m)
    assert summary["summary"]["env"] == "panda-push" and summary["summary"]["success_within"]["50"] == 1.0


def smoke_gpu(model: Path, tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (benchmarks/gpu.py measures oxRL's CUDA kernels)")
    output = run_script("gpu.py", "--tokenizer", model, "--tokens-per-step", 2048, "--sdpa-baseline", 2048,
                        "--warmup-steps", 1, "--steps", 1, "--prompts-per-step", 2, "--n", 2, "--max-new-tokens", 8,
                        "--grpo-steps", 2, "--decode", "generate")
    assert "Traceback" not in output, output[-4000:]  # the script reports a failed part and goes on
    assert output.count("check packed == each sequence alone") == 2
    assert table(output, "SFT").column("attention") == ["auto", "sdpa"]
    assert table(output, "GRPO").column("decode") == ["generate"]


SMOKE: dict[str, Callable[[Path, Path], None]] = {
    "async_rl.py": smoke_async_rl,
    "context_parallel_memory.py": smoke_context_parallel_memory,
    "decode.py": smoke_decode,
    "dpo.py": smoke_dpo,
    "experts.py": smoke_experts,
    "lerobot_anchor.py": smoke_lerobot_anchor,
    "gpu.py": smoke_gpu,
    "grpo.py": smoke_grpo,
    "logits_memory.py": smoke_logits_memory,
    "memory_estimate.py": smoke_memory_estimate,
    "packed_attention.py": smoke_packed_attention,
    "ray_broadcast.py": smoke_ray_broadcast,
    "ray_overhead.py": smoke_ray_overhead,
    "rows_leave.py": smoke_rows_leave,
    "sandbox.py": smoke_sandbox,
    "sft.py": smoke_sft,
    "startup.py": smoke_startup,
    "vla_reach.py": smoke_vla_reach,
    "vla_simulators.py": smoke_vla_simulators,
}


def test_every_benchmark_has_a_smoke_run():
    missing = sorted(set(scripts()) - set(SMOKE))
    assert not missing, f"benchmarks without a smoke run in tests/system/test_benchmarks.py SMOKE: {missing}"
    assert not set(SMOKE) - set(scripts()), f"SMOKE names scripts benchmarks/ no longer holds: {set(SMOKE) - set(scripts())}"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, smollm2_tokenizer) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("benchmarks") / "tiny", smollm2_tokenizer)


@pytest.mark.parametrize("script", scripts())
def test_benchmark_runs_to_its_table(script, tiny_model, tmp_path):
    if script not in SMOKE:
        pytest.fail(f"benchmarks/{script} has no smoke run: add one to SMOKE in tests/system/test_benchmarks.py")
    SMOKE[script](tiny_model, tmp_path)
