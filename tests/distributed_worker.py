"""Scenarios that tests/system/test_distributed.py runs under `torchrun --nproc_per_node 2` (gloo, CPU).

    torchrun --nproc_per_node 2 -m tests.distributed_worker SCENARIO OUT_DIR

Rank 0 writes OUT_DIR/result.json. The same helpers run the single-device baselines inside the
test process, so both sides train exactly the same configuration on the same data.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch

from oxrl.config.schema import Config
from oxrl.data.types import Example, Sequence
from oxrl.training.build import build_strategy
from oxrl.training.strategy import Strategy
from oxrl.loops.objectives import get_objective
from oxrl.loops.sl import train_offline
from oxrl.models.reference import FrozenModel
from tests.conftest import make_tiny_critic, make_tiny_llama, rl_handles
from tests.integration.test_preference_training import preference_pairs

PROBE_IDS = [[1, 5, 9, 12, 30, 7, 2]]


def varied_copy_task(n: int = 16) -> list[Example]:
    """`a.. | a..` copy sequences of UNEQUAL lengths, so the ranks' token counts differ."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        half = torch.randint(3, 40, (2 + i % 5,), generator=g).tolist()
        ids = [1] + half + [5] + half
        out.append(Example([Sequence(ids, [False] * (len(half) + 2) + [True] * len(half))]))
    return out


def config(out: Path, algorithm: str = "sft", strategy: dict | None = None, **train) -> Config:
    return Config.model_validate({
        "run": {"name": algorithm, "output_dir": str(out), "seed": 0, "device": "cpu"},
        "model": {"name_or_path": "unused"},
        "data": {"train": [{"path": "unused"}]},
        "algorithm": {"name": algorithm},
        **({"preference": {"beta": 0.5}} if algorithm == "dpo" else {}),  # a setting sft does not read is an error
        # Warmup + cosine + weight decay: a resume that loses any state changes the losses.
        # fp32: layouts agree to 1e-5 in fp32 arithmetic (bf16 rounds differently in each).
        "train": {"global_batch_size": 4, "micro_batch_size_per_device": 1, "max_steps": 4, "mixed_precision": "no",
                  "optim": {"lr": 3e-3, "schedule": "cosine", "warmup_steps": 1, "weight_decay": 0.1}, **train},
        "strategy": strategy or {"name": "single"},
        "checkpoint": {"every": 2, "keep_last": 5, "save_final": False},
        "logging": {"progress_bar": False, "plot": False},
    })


def grad_norms(run_dir: Path) -> list[float]:
    return logged(run_dir, "grad_norm")


def train_sft(cfg: Config, strategy: Strategy, run_dir: Path, model=None, checkpointing: bool = False):
    from oxrl.models.load import enable_activation_checkpointing

    model = model if model is not None else make_tiny_llama()
    if checkpointing:
        enable_activation_checkpointing(model)
    result = train_offline(cfg, get_objective("sft"), model, None, varied_copy_task(), [], strategy, run_dir)
    return model, result.losses


def train_dpo(cfg: Config, strategy: Strategy, run_dir: Path, model=None) -> list[float]:
    model = model if model is not None else make_tiny_llama()
    reference = FrozenModel(copy.deepcopy(model).eval().requires_grad_(False))
    reference.model = strategy.prepare_frozen(reference.model)
    result = train_offline(cfg, get_objective("dpo", cfg.preference), model, None, preference_pairs(8), [], strategy,
                           run_dir, reference)
    return result.losses


def fixed_rollouts(rank: int, world_size: int):
    """8 fixed completions (4 prompts x 2) with fixed rewards: this rank's whole groups, with the
    prompt indices counted per rank, as the engine returns them."""
    from oxrl.rollout.base import Completion

    g = torch.Generator().manual_seed(2)
    prompts = [[1] + torch.randint(3, 100, (2 + p,), generator=g).tolist() for p in range(4)]
    share = len(prompts) // world_size
    completions, rewards = [], []
    for p, prompt in enumerate(prompts):
        for k in range(2):
            ids = torch.randint(3, 100, (2 + (p + k) % 4,), generator=g).tolist()
            if rank * share <= p < (rank + 1) * share:
                completions.append(Completion(p - rank * share, prompt, ids, [0.0] * len(ids), "length", ""))
                rewards.append(float((p + k) % 3))
    return completions, torch.tensor(rewards)


def probe_logits(model) -> list:
    """Logits of a fixed sequence (every rank runs the forward: sharded weights are gathered)."""
    model.eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor(PROBE_IDS), use_cache=False).logits.float().tolist()


def grpo_update(cfg: Config, strategy: Strategy, model=None) -> dict:
    """One `update` (rl.epochs = 2 optimizer steps) on fixed rollouts; advantages of two estimators."""
    from oxrl.loops.rl_update import score_logprobs
    from oxrl.loops.rl import Rollout, estimate
    from oxrl.loops.rl_update import update
    from oxrl.training.optim import build_optimizer, build_scheduler

    model = model if model is not None else make_tiny_llama()
    h = rl_handles(cfg, model, None, strategy=strategy)
    optimizer = build_optimizer(model, cfg.train.optim)
    h.policy = strategy.prepare(model, optimizer, build_scheduler(optimizer, 4, cfg.train.optim))
    completions, rewards = fixed_rollouts(strategy.data_rank, strategy.data_size)
    advantages = {}
    for name in ("grpo", "reinforce_pp"):
        rollout = Rollout.of(completions, rewards)
        estimate(replace(h, cfg=h.cfg.model_copy(update={"rl": h.cfg.rl.model_copy(update={"advantage": name})})), rollout)
        advantages[name] = torch.stack([a[0] for a in rollout.advantages])  # one value per completion
    rollout = Rollout.of(completions, rewards)
    estimate(h, rollout)
    rollout.old_logprobs = score_logprobs(h.policy, completions, cfg.train.micro_batch_size_per_device, cfg.rl.rollout.temperature)
    metrics = update(h, rollout, step=1)
    gathered = {name: torch.cat(strategy.gather_objects(a)).tolist() for name, a in advantages.items()}
    return {"metrics": metrics, "advantages": gathered, "logits": probe_logits(h.policy)}


def ppo_update(cfg: Config, strategy: Strategy, out: Path) -> dict:
    """PPO on fixed rollouts: critic values, GAE over every rank's tokens, 2 policy + critic steps."""
    from oxrl.loops.rl import prepare
    from oxrl.loops.rl import Rollout, estimate, score
    from oxrl.loops.rl_update import update

    h = rl_handles(cfg, make_tiny_llama(), None, strategy=strategy, critic_model=make_tiny_critic(seed=3))
    prepare(h, 4, out)
    completions, rewards = fixed_rollouts(strategy.rank, strategy.world_size)
    rollout = Rollout.of(completions, rewards)
    score(h, rollout)
    estimate(h, rollout)
    metrics = update(h, rollout, step=1)
    h.critic.model.eval()
    with torch.no_grad():
        critic_probe = h.critic.model(input_ids=torch.tensor(PROBE_IDS), use_cache=False).logits.float().tolist()
    per_rank = strategy.gather_objects([a.tolist() for a in rollout.advantages] + [r.tolist() for r in rollout.returns])
    return {"metrics": metrics, "advantages_and_returns": per_rank, "logits": probe_logits(h.policy),
            "critic": critic_probe}


def ppo_config(out: Path, strategy: dict | None = None) -> Config:
    return rl_config(out, strategy, "ppo", critic_lr=1e-2)


def rl_config(out: Path, strategy: dict | None = None, algorithm: str = "grpo", **rl) -> Config:
    return Config.model_validate({
        "run": {"name": algorithm, "output_dir": str(out), "seed": 0, "device": "cpu"},
        "model": {"name_or_path": "unused"},
        "algorithm": {"name": algorithm},
        "rl": {"prompts_per_step": 4, "epochs": 2, "rollout": {"n": 2, "max_new_tokens": 4, "temperature": 1.0}, **rl},
        "train": {"max_steps": 2, "micro_batch_size_per_device": 2, "mixed_precision": "no",  # fp32: as in `config`
                  "optim": {"lr": 1e-2, "schedule": "constant"}},
        "strategy": strategy or {"name": "single"},
        "checkpoint": {"every": 2, "save_final": False},
        "logging": {"progress_bar": False, "plot": False},
    })


def rl_loop_smoke(cfg: Config, strategy: Strategy, run_dir: Path, critic: bool = False, model=None) -> dict:
    """train_rl end to end: sampling from the FSDP2-sharded policy (synced decoding), gathered advantages."""
    from oxrl.data.types import RLPromptBatch
    from oxrl.loops.rl import train_rl
    from oxrl.rewards.combine import build_reward_fn
    from oxrl.rollout.hf import HFEngine
    from tests.integration.test_rollout_hf import TinyTokenizer

    model = model if model is not None else make_tiny_llama()
    ids = [[1, 3 + i, 4 + i] for i in range(8)]
    prompts = RLPromptBatch(ids, [" ".join(map(str, p)) for p in ids], [{} for _ in ids], [f"row {i}" for i in ids])
    engine = HFEngine(model, TinyTokenizer(), synced=strategy.shards_parameters)
    reward = build_reward_fn([{"name": "tests.integration.test_rl_loop:share_of_sevens"}])
    h = rl_handles(cfg, model, engine, reward, strategy, critic_model=make_tiny_critic(seed=3) if critic else None)
    result = train_rl(h, prompts, RLPromptBatch([], [], [], []), run_dir)
    return {"rewards": result.rewards, "metrics": result.final_metrics}


def scenario_fsdp2_sft(out: Path) -> dict:
    fsdp = {"name": "fsdp2"}
    cfg = config(out, strategy=fsdp)
    strategy = build_strategy(cfg)
    model, losses = train_sft(cfg, strategy, out / "plain")
    strategy.save_hf_folder(None, out / "hf")
    logits = probe_logits(model)
    short = config(out, strategy=fsdp, max_steps=2)
    short.checkpoint.every = None
    _, checkpointed = train_sft(short, build_strategy(short), out / "checkpointed", checkpointing=True)
    resumed_cfg = config(out, strategy=fsdp)
    resumed_cfg.run.resume = str(out / "plain" / "checkpoints" / "step_000002")
    _, resumed = train_sft(resumed_cfg, build_strategy(resumed_cfg), out / "resumed", model=make_tiny_llama(seed=123))
    # Resumed with a third of the peak lr (an accepted config change): the new schedule applies from step 3.
    lower_cfg = config(out, strategy=fsdp)
    lower_cfg.train.optim.lr = 1e-3
    lower_cfg.run.resume = resumed_cfg.run.resume
    train_sft(lower_cfg, build_strategy(lower_cfg), out / "lower_lr", model=make_tiny_llama(seed=123))
    return {"losses": losses, "grad_norms": grad_norms(out / "plain"), "logits": logits,
            "checkpointed": checkpointed, "resumed": resumed,
            "lr": logged(out / "plain", "lr"), "lower_lr": logged(out / "lower_lr", "lr")}


def train_vlm_sft(cfg: Config, strategy: Strategy, run_dir: Path, folder: Path) -> list[float]:
    """SFT of a tiny Qwen2-VL (saved in `folder` by rank 0) on 8 image rows whose image sizes, hence image-token
    counts and 3-D rotary positions, differ."""
    from transformers import AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

    from oxrl.data.formats import Chat
    from oxrl.data.tokenize import ExampleTokenizer
    from tests.conftest import bundled_gguf
    from tests.vlm_fixtures import COLOURS, save_tiny_qwen2_vl, shape_image

    from oxrl.training import distributed

    gguf = bundled_gguf()
    if strategy.is_main:
        save_tiny_qwen2_vl(folder, AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name))
    distributed.barrier()
    processor = AutoProcessor.from_pretrained(folder)
    rows = ExampleTokenizer(processor.tokenizer, processor)
    colours = list(COLOURS)
    examples = []
    for i in range(8):
        chat = Chat([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]},
                     {"role": "assistant", "content": colours[i % 4]}], first_trained=1)
        image = shape_image(colours[i % 4], size=(56 + 28 * (i % 3), 56), seed=i)
        examples.append(Example([rows.sequence(chat, location="worker", row=i, images=[image])]))
    model = AutoModelForImageTextToText.from_pretrained(folder)
    return train_offline(cfg, get_objective("sft"), model, None, examples, [], strategy, run_dir).losses


def scenario_fsdp2_vlm_sft(out: Path) -> dict:
    cfg = config(out, strategy={"name": "fsdp2"}, max_steps=3, global_batch_size=4, micro_batch_size_per_device=2)
    losses = train_vlm_sft(cfg, build_strategy(cfg), out / "vlm_sft", out / "vlm")
    return {"losses": losses, "grad_norms": grad_norms(out / "vlm_sft")}


def logged(run_dir: Path, key: str) -> list[float]:
    return [json.loads(line)[key] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def scenario_fsdp2_dpo(out: Path) -> dict:
    cfg = config(out, "dpo", {"name": "fsdp2"}, max_steps=3)
    return {"losses": train_dpo(cfg, build_strategy(cfg), out / "dpo")}


def scenario_fsdp2_grpo(out: Path) -> dict:
    cfg = rl_config(out, {"name": "fsdp2"})
    return {"update": grpo_update(cfg, build_strategy(cfg)), "loop": rl_loop_smoke(cfg, build_strategy(cfg), out / "loop")}


def scenario_fsdp2_ppo(out: Path) -> dict:
    cfg = ppo_config(out, {"name": "fsdp2"})
    return {"update": ppo_update(cfg, build_strategy(cfg), out / "update"),
            "loop": rl_loop_smoke(cfg, build_strategy(cfg), out / "loop", critic=True)}


def scenario_deepspeed_ppo(out: Path) -> dict:
    cfg = ppo_config(out, {"name": "deepspeed", "zero_stage": 3})
    return {"update": ppo_update(cfg, build_strategy(cfg), out / "update")}


def scenario_deepspeed_sft(out: Path) -> dict:
    results = {}
    for stage in (2, 3):
        cfg = config(out, strategy={"name": "deepspeed", "zero_stage": stage})
        _, results[f"zero{stage}"] = train_sft(cfg, build_strategy(cfg), out / f"zero{stage}")
    resumed_cfg = config(out, strategy={"name": "deepspeed", "zero_stage": 3})
    resumed_cfg.run.resume = str(out / "zero3" / "checkpoints" / "step_000002")
    _, results["resumed"] = train_sft(resumed_cfg, build_strategy(resumed_cfg), out / "resumed", model=make_tiny_llama(seed=123))
    return results


def chunk_every_row() -> None:
    """Send every row down oxrl/models/lm_head.py's chunked path, 3 positions a chunk (the tiny vocabulary's
    logits would otherwise always be held whole), so the sharded output layer runs once per chunk and again in its
    recomputed backward."""
    from oxrl.models import lm_head

    lm_head.FULL_LOGITS_ELEMENTS = 0
    lm_head.CHUNK_ELEMENTS = 3 * make_tiny_llama().config.vocab_size


def chunked_sft(out: Path, strategy: dict) -> dict:
    chunk_every_row()
    cfg = config(out, strategy=strategy)
    _, losses = train_sft(cfg, build_strategy(cfg), out / "run")
    return {"losses": losses, "grad_norms": grad_norms(out / "run")}


def scenario_fsdp2_chunked_sft(out: Path) -> dict:
    return chunked_sft(out, {"name": "fsdp2"})


def scenario_deepspeed_chunked_sft(out: Path) -> dict:
    return chunked_sft(out, {"name": "deepspeed", "zero_stage": 3})


def scenario_fsdp2_chunked_dpo(out: Path) -> dict:
    chunk_every_row()  # the frozen reference too: sharded, scored without gradient through the chunked path
    return scenario_fsdp2_dpo(out)


def train_with_a_nan_step(cfg: Config, run_dir: Path) -> dict:
    """SFT where rank 1 alone gets NaN losses at step 2 (2 micro-batches per rank per step): every rank
    must skip that update, and the run goes on."""
    from oxrl.algorithms.output import LossOutput
    from oxrl.loops.sl import Objective

    import itertools

    strategy = build_strategy(cfg)
    sft = get_objective("sft")
    calls = itertools.count()

    def compute(model, batch, normaliser, reference=None) -> LossOutput:
        out = sft.compute(model, batch, normaliser, reference)
        if strategy.rank == 1 and next(calls) // 2 == 1:
            nan = torch.tensor(float("nan"))
            return LossOutput(out.loss * nan, {**out.metrics, "loss": out.metrics["loss"] * nan})
        return out

    result = train_offline(cfg, Objective("sft", sft.count_units, compute), make_tiny_llama(), None,
                           varied_copy_task(), [], strategy, run_dir)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()] if strategy.is_main else []
    return {"losses": result.losses, "nonfinite_steps": [row["train/nonfinite_steps"] for row in rows],
            "skipped_on_every_rank": strategy.gather_objects(strategy.nonfinite.skipped)}


def nan_step_config(out: Path, strategy: dict) -> Config:
    cfg = config(out, strategy=strategy, max_steps=3)
    cfg.checkpoint.every = 1
    return cfg


def scenario_fsdp2_nonfinite(out: Path) -> dict:
    return train_with_a_nan_step(nan_step_config(out, {"name": "fsdp2"}), out / "run")


def scenario_deepspeed_nonfinite(out: Path) -> dict:
    return train_with_a_nan_step(nan_step_config(out, {"name": "deepspeed", "zero_stage": 3}), out / "run")


def packed_tiny_llama(seed: int = 0):
    """The tiny Llama on oxRL's packed attention, as a run loads it (context parallel runs on that kernel)."""
    from oxrl.models.packed_attention import use_packed_attention

    model = make_tiny_llama(seed=seed)
    use_packed_attention(model)
    return model


def mesh_runs(out: Path, mesh: dict) -> dict:
    """SFT (4 steps), DPO (3 steps) and one GRPO update (2 optimizer steps) under `strategy.mesh`, every row's
    log-probs through the vocabulary-parallel (tp) or row-splitting (cp) path."""
    from oxrl.models.model_inputs import layout_of

    strategy = {"name": "fsdp2", "mesh": mesh}
    sft_cfg = config(out, strategy=strategy)
    sft_strategy = build_strategy(sft_cfg)
    model, sft = train_sft(sft_cfg, sft_strategy, out / "sft", model=packed_tiny_llama())
    sft_strategy.save_hf_folder(None, out / "hf")  # gathered whole from every rank's slices and shards
    layout = layout_of(model)
    split = [name for name, p in model.named_parameters() if "tp" in (getattr(p, "device_mesh", None) and
                                                                       p.device_mesh.mesh_dim_names or ())]
    short = config(out, strategy=strategy, max_steps=2)
    short.checkpoint.every = None
    _, checkpointed = train_sft(short, build_strategy(short), out / "checkpointed", model=packed_tiny_llama(),
                                checkpointing=True)  # each layer recomputed in the backward, its collectives too
    dpo_cfg = config(out, "dpo", strategy, max_steps=3)
    dpo = train_dpo(dpo_cfg, build_strategy(dpo_cfg), out / "dpo", model=packed_tiny_llama())
    grpo_cfg = rl_config(out, strategy)
    grpo = grpo_update(grpo_cfg, build_strategy(grpo_cfg), model=packed_tiny_llama())
    loop = rl_loop_smoke(grpo_cfg, build_strategy(grpo_cfg), out / "loop", model=packed_tiny_llama())
    return {"sft": {"losses": sft, "grad_norms": grad_norms(out / "sft"), "logits": probe_logits(model),
                    "checkpointed": checkpointed},
            "dpo": {"losses": dpo, "grad_norms": grad_norms(out / "dpo")}, "grpo": grpo, "loop": loop,
            "layout": [layout.tp_size, layout.cp_size], "split_parameters": split}


def family_sft(cfg: Config, strategy: Strategy, folder: Path, run_dir: Path) -> dict:
    """2 SFT steps of the tiny model saved in `folder`, loaded as `oxrl train` loads it."""
    from tests.integration.test_architectures import load

    _, losses = train_sft(cfg, strategy, run_dir, model=load(str(folder)))
    return {"losses": losses, "grad_norms": grad_norms(run_dir)}


def scenario_mesh_tp2_families(out: Path) -> dict:
    """The architecture matrix's families (tests/integration/test_architectures.py) and a tied Llama under tensor
    parallel 2: each family tensor parallel can split trains; each it cannot is named with the reason."""
    from transformers import AutoConfig

    from oxrl.models.shape import tensor_parallel_refusal
    from oxrl.training import distributed
    from tests.integration.test_architectures import INSTALLED, save_tiny

    results, refused = {}, {}
    for name in [*INSTALLED, "llama_tied"]:
        if distributed.init_distributed("cpu").is_main:
            if name == "llama_tied":  # the output layer tied to the embeddings, as SmolLM2's and Gemma's are
                make_tiny_llama(tie_word_embeddings=True).save_pretrained(out / name)
            else:
                save_tiny(name, out / name)
        distributed.barrier()
        refusal = tensor_parallel_refusal(AutoConfig.from_pretrained(out / name), 2)
        if refusal:
            refused[name] = refusal
            continue
        cfg = config(out, strategy={"name": "fsdp2", "mesh": {"tp": 2}}, max_steps=2)
        results[name] = family_sft(cfg, build_strategy(cfg), out / name, out / f"{name}_run")
    return {"trained": results, "refused": refused}


def scenario_vocab_parallel(out: Path) -> dict:
    """Log-probs, entropy and their gradient from two halves of a vocabulary (oxrl/models/parallel.py), with the
    whole logits' for the test to compare: the same loss on both ranks, each rank's gradient of its half."""
    import torch.distributed as dist

    from oxrl.models.parallel import VocabShard, vocab_parallel_logprobs
    from oxrl.training import distributed

    env = distributed.init_distributed("cpu", process_group=True)
    g = torch.Generator().manual_seed(3)
    logits, targets = torch.randn(6, 10, generator=g) * 4, torch.tensor([0, 4, 5, 9, 2, 7])
    weights = torch.randn(6, generator=g)
    half = logits[:, env.rank * 5 : (env.rank + 1) * 5].clone().requires_grad_(True)
    logprobs, entropy = vocab_parallel_logprobs(half, targets, VocabShard(dist.group.WORLD, env.rank * 5, 5), True)
    loss = (weights * logprobs).sum() + (weights.flip(0) * entropy).sum()
    loss.backward()
    return {"logits": logits.tolist(), "targets": targets.tolist(), "weights": weights.tolist(),
            "logprobs": logprobs.tolist(), "entropy": entropy.tolist(), "loss": float(loss),
            "gradient": torch.cat(distributed.all_gather_objects(half.grad), dim=1).tolist()}


def scenario_mesh_sft(out: Path, mesh: str, resume: str = "") -> dict:
    """SFT under the mesh given as JSON (`{}`: FSDP2 alone), resumed from the checkpoint `resume` when given: a
    checkpoint written under one mesh continues under another."""
    cfg = config(out, strategy={"name": "fsdp2", "mesh": json.loads(mesh)})
    if resume:
        cfg.run.resume = resume
    # A resumed run starts from other weights: the checkpoint must bring the trained ones back.
    _, losses = train_sft(cfg, build_strategy(cfg), out / "sft", model=packed_tiny_llama(seed=123 if resume else 0))
    return {"losses": losses}


def scenario_mesh_tp2(out: Path) -> dict:
    return mesh_runs(out, {"tp": 2})


def scenario_mesh_cp2(out: Path) -> dict:
    return mesh_runs(out, {"cp": 2})


def scenario_mesh_dp2_tp2(out: Path) -> dict:
    return mesh_runs(out, {"tp": 2, "dp_shard": 2})


def scenario_mesh_dp2_cp2(out: Path) -> dict:
    return mesh_runs(out, {"cp": 2, "dp_shard": 2})


COLLECTIVE_TIMEOUT_S = 5.0


def lose_a_rank(out: Path, stuck: bool) -> None:
    """Rank 1 leaves the group (exits, or hangs while alive) before a collective; rank 0 records how its
    collective ended and how long it waited. Both then exit at once: the group is broken, so nothing
    after it (main's shutdown) may touch it."""
    import os
    import time

    cfg = config(out, strategy={"name": "fsdp2", "collective_timeout_s": COLLECTIVE_TIMEOUT_S})
    strategy = build_strategy(cfg)
    strategy.all_reduce_sum(1.0)  # the group works while both ranks take part
    if strategy.rank == 1:
        deadline = time.monotonic() + 120
        while stuck and not (out / "result.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)  # alive, but never joins rank 0's collective
        os._exit(0)  # exit 0: torchrun would stop rank 0 itself after a failed rank
    started = time.monotonic()
    try:
        strategy.all_reduce_sum(1.0)
        outcome = "returned"
    except RuntimeError as error:  # gloo's timeout or lost-peer error
        outcome = f"{type(error).__name__}: {error}"
    (out / "result.json").write_text(json.dumps({"outcome": outcome, "seconds": time.monotonic() - started}))
    os._exit(0)


def scenario_dead_rank(out: Path) -> None:
    lose_a_rank(out, stuck=False)


def scenario_stuck_rank(out: Path) -> None:
    lose_a_rank(out, stuck=True)


SCENARIOS = {name[len("scenario_"):]: fn for name, fn in globals().items() if name.startswith("scenario_")}


def run_as_worker(scenario) -> None:
    """A torchrun worker's life: `scenario(out)` with argv's output folder; rank 0 writes result.json."""
    from oxrl.training import distributed

    torch.set_num_threads(1)
    out = Path(sys.argv[2])
    result = scenario(out, *sys.argv[3:])
    if distributed.init_distributed("cpu").is_main:
        (out / "result.json").write_text(json.dumps(result))
    distributed.barrier()  # leave together: gloo can abort a process whose peer tore the group down first
    distributed.shutdown()
    # Done: the parent checks result.json. A native library's teardown at interpreter exit can still abort a rank
    # whose work is complete ("terminate called without an active exception", about 1 run in 10 of the DeepSpeed
    # scenario, with result.json written), which torchrun reports as a failed run; leave without that teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main() -> None:
    run_as_worker(SCENARIOS[sys.argv[1]])

if __name__ == "__main__":
    main()
