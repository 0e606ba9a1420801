"""Vision-language models train through oxRL's own runs: SFT, DPO and GRPO on a visual question (the colour of a
shape drawn in the image), with tiny random Qwen2-VL and Idefics3 models (tests/vlm_fixtures.py), image files named
by relative paths in JSONL rows, and the final folder loaded back with transformers' own classes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from oxrl.config.schema import Config
from oxrl.runner import run
from tests.vlm_fixtures import COLOURS, SAVERS, SHAPES, shape_image

COLOUR_NAMES = list(COLOURS)
QUESTION = "What colour is the shape?"
REWARD_FILE = '''
def colour(prompt, completion, answer):
    """1 when the completion names the image's colour first."""
    return float(completion.strip().lower().startswith(answer))
'''


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, smollm2_tokenizer) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vlms")
    return {family: save(root / family, smollm2_tokenizer) for family, save in SAVERS.items()}


def colour_of(index: int) -> str:
    return COLOUR_NAMES[index % len(COLOUR_NAMES)]


def draw(folder: Path, index: int) -> str:
    """Image `index` (its colour cycles, its shape, place and size vary) saved under folder/images; its relative path."""
    path = folder / "images" / f"{index}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    shape_image(colour_of(index), SHAPES[(index // 4) % 2], seed=index).save(path)
    return f"images/{index}.png"


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def sft_rows(folder: Path, indices, with_images: bool = True) -> list[dict]:
    def row(i: int) -> dict:
        if not with_images:  # the same conversation with nothing to look at
            return {"messages": [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": colour_of(i)}]}
        return {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]},
                             {"role": "assistant", "content": colour_of(i)}],
                "images": [draw(folder, i)]}

    return [row(i) for i in indices]


def config(tmp_path: Path, model_dir: Path, data: Path, algorithm: str, steps: int, **sections) -> Config:
    raw = {
        "run": {"name": algorithm, "output_dir": str(tmp_path / "runs"), "seed": 0, "device": "cpu"},
        "model": {"name_or_path": str(model_dir)},
        "data": {"train": [{"path": str(data)}], "max_length": 128},
        "algorithm": {"name": algorithm},
        "train": {"max_steps": steps, "micro_batch_size_per_device": 8,
                  "mixed_precision": "no", "optim": {"lr": 3e-3, "schedule": "constant"}},
        "checkpoint": {"save_final": True},
        "logging": {"progress_bar": False, "plot": False},
    }
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value}
    if "optim" in sections.get("train", {}):
        raw["train"]["optim"] = {"schedule": "constant", **sections["train"]["optim"]}
    return Config.model_validate(raw)


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@torch.no_grad()
def held_out_accuracy(folder: Path, images: Path, indices) -> float:
    """How often the saved model, loaded back with AutoModelForImageTextToText and AutoProcessor, ranks the right
    colour first (the answer with the highest log-likelihood) for images it never saw."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from oxrl.models.logprobs import sequence_sums, token_logprobs
    from oxrl.data.formats import Chat
    from oxrl.data.tokenize import ExampleTokenizer
    from oxrl.data.types import Example, pack

    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    processor = AutoProcessor.from_pretrained(folder)
    tokenizer = ExampleTokenizer(processor.tokenizer, processor)
    right = 0
    for i in indices:
        image = shape_image(colour_of(i), SHAPES[(i // 4) % 2], seed=i)
        answers = [Example([tokenizer.sequence(
            Chat([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]},
                  {"role": "assistant", "content": name}], first_trained=1), location="held-out", row=i, images=[image])])
            for name in COLOUR_NAMES]
        batch = pack(answers)
        scores = sequence_sums(token_logprobs(model, batch), batch)
        right += COLOUR_NAMES[int(scores.argmax())] == colour_of(i)
    return right / len(indices)


HELD_OUT = range(1000, 1024)
WARM_STEPS = 60  # SFT steps before GRPO: right about a quarter of the time (more: the reward starts higher)  # seeds never drawn for training: other places and sizes


@pytest.mark.slow
@pytest.mark.parametrize("family", list(SAVERS))
def test_sft_learns_the_colour_in_the_image(tmp_path, model_dirs, family):
    with_images = write_rows(tmp_path / "sft.jsonl", sft_rows(tmp_path, range(64)))
    result = run(config(tmp_path, model_dirs[family], with_images, "sft", 150))
    assert held_out_accuracy(result.final_model_dir, tmp_path, HELD_OUT) >= 0.75  # chance: 0.25


@pytest.mark.slow
def test_the_text_alone_cannot_tell_the_colour(tmp_path, model_dirs):
    """The control: the same rows without their images (a property of the data, shown on one family)."""
    text_only = write_rows(tmp_path / "text.jsonl", sft_rows(tmp_path, range(64), with_images=False))
    blind = run(config(tmp_path, model_dirs["qwen2_vl"], text_only, "sft", 60, run={"name": "text_only"}))
    assert held_out_accuracy(blind.final_model_dir, tmp_path, HELD_OUT) <= 0.5


@pytest.mark.slow
def test_dpo_on_image_pairs_raises_the_margin(tmp_path, model_dirs):
    rows = [{"prompt": f"<image>{QUESTION}", "chosen": colour_of(i), "rejected": colour_of(i + 1),
             "images": [draw(tmp_path, i)]} for i in range(32)]
    data = write_rows(tmp_path / "pairs.jsonl", rows)
    result = run(config(tmp_path, model_dirs["qwen2_vl"], data, "dpo", 30))
    steps = metrics(result.run_dir)
    assert steps[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-5)  # policy == reference at the first step
    assert steps[-1]["rewards/margins"] > 1.0 and steps[-1]["rewards/accuracy"] == 1.0


@pytest.mark.slow
def test_grpo_on_image_prompts_raises_the_reward(tmp_path, model_dirs):
    # A short SFT on image rows first (RL's usual warm start): the model answers with a colour name, right about a
    # quarter of the time, so the reward has room to rise.
    warm_rows = write_rows(tmp_path / "sft.jsonl", sft_rows(tmp_path, range(64)))
    warm = run(config(tmp_path, model_dirs["qwen2_vl"], warm_rows, "sft", WARM_STEPS, run={"name": "warm"}))
    prompts = [{"prompt": f"<image>{QUESTION}", "images": [draw(tmp_path, i)], "answer": colour_of(i)}
               for i in range(64)]
    data = write_rows(tmp_path / "prompts.jsonl", prompts)
    (tmp_path / "reward.py").write_text(REWARD_FILE)
    cfg = config(tmp_path, warm.final_model_dir, data, "grpo", 80,
                 rl={"prompts_per_step": 8, "validation_size": 0, "rollout": {"n": 8, "max_new_tokens": 4},
                     "rewards": [{"name": f"{tmp_path / 'reward.py'}:colour"}]},
                 train={"micro_batch_size_per_device": 32, "optim": {"lr": 1e-3}})
    rewards = [step["reward/mean"] for step in metrics(run(cfg).run_dir)]
    # Means of 8 steps x 64 completions: a standard error near 0.02, so a rise of 0.15 is no accident.
    first, last = sum(rewards[:8]) / 8, sum(rewards[-8:]) / 8
    assert last > first + 0.15, rewards


@pytest.mark.slow
def test_spin_trains_on_image_prompts(tmp_path, model_dirs):
    """SPIN's gold sequence (the row's response) is trained with its prompt's images, as the sampled one is."""
    rows = [{"prompt": f"<image>{QUESTION}", "images": [draw(tmp_path, i)], "response": colour_of(i)} for i in range(8)]
    data = write_rows(tmp_path / "spin.jsonl", rows)
    cfg = config(tmp_path, model_dirs["qwen2_vl"], data, "spin", 4,
                 online={"loss": "dpo", "gold_field": "response", "iteration_steps": 2},
                 rl={"validation_size": 0, "prompts_per_step": 4, "rollout": {"n": 1, "max_new_tokens": 4}},
                 train={"micro_batch_size_per_device": 4})
    steps = metrics(run(cfg).run_dir)
    assert len(steps) == 4 and all(math.isfinite(step["loss"]) for step in steps)
    assert steps[-1]["rewards/margins"] > steps[0]["rewards/margins"]  # the gold answers pull ahead


def test_a_separate_critic_for_a_vision_language_policy_is_refused_before_models_load(tmp_path, model_dirs):
    data = write_rows(tmp_path / "prompts.jsonl", [{"prompt": f"<image>{QUESTION}", "images": [draw(tmp_path, 0)],
                                                   "answer": "red"}])
    cfg = config(tmp_path, model_dirs["qwen2_vl"], data, "ppo", 1,
                 rl={"critic_backbone": "separate", "rollout": {"max_new_tokens": 4}})
    with pytest.raises(ValueError, match="critic_backbone `separate`.*cannot read a vision-language policy's images"):
        run(cfg)
