"""The `reward_model` reward: its scores are the saved model's own forward, padding and batching do not
change them, a wrong path fails when the reward is built, and RLHF end to end (an oxRL-trained reward
model, then GRPO against it) raises the reward model's score of the policy's samples and of held-out
greedy completions.

The models use a word-level tokenizer of a few dozen words built here (no download, no GGUF), so that
a tiny random policy samples every word often enough for RL to find the preferred one."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch

from oxrl.rewards.combine import REWARDS, build_reward_fn
from oxrl.rewards.reward_model_reward import _load_scorer, reward_model_reward
from tests.conftest import make_tiny_llama, save_tiny_model

SPECIALS = ["<pad>", "<s>", "<|im_start|>", "<|im_end|>", "<unk>"]
NEUTRAL = ["red", "blue", "cat", "dog", "sun", "tree", "one", "two", "three"]
PREFERRED = "good"  # the reward model is trained to prefer completions that say it
WORDS = ["user", "assistant", PREFERRED, *NEUTRAL, "say", "tell", "me", "about", "a", "the", "word", "please", "it"]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|>{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant{% endif %}")

PROMPTS = ["say a word", "tell me about the sun", "say it", "tell me a word about a cat", "please say one word"]
COMPLETIONS = ["good dog", "red", "blue cat sun tree one two", "good good good", "the dog"]


def word_tokenizer(chat_template: bool = True, pad: bool = True):
    """A fast word-level tokenizer (pad id 0, eos `<|im_end|>`) with a ChatML-like template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="<|im_end|>",
                                        unk_token="<unk>", additional_special_tokens=["<|im_start|>"],
                                        **({"pad_token": "<pad>"} if pad else {}))
    tokenizer.chat_template = CHATML if chat_template else None
    return tokenizer


def save_classifier(folder: Path, tokenizer, num_labels: int = 1, pad_token_id: int | None = 0, seed: int = 0) -> Path:
    """A tiny random Llama sequence classifier sized to `tokenizer`, saved with it."""
    from transformers import LlamaForSequenceClassification

    config = make_tiny_llama(vocab_size=len(tokenizer)).config
    config.num_labels, config.pad_token_id, config.eos_token_id = num_labels, pad_token_id, tokenizer.eos_token_id
    torch.manual_seed(seed)
    LlamaForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def own_forward(folder: Path, prompt: str, completion: str) -> float:
    """The saved model's own transformers forward on one conversation, rendered as the module documents."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model, tokenizer = AutoModelForSequenceClassification.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    if tokenizer.chat_template:
        conversation = [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
        ids = tokenizer(tokenizer.apply_chat_template(conversation, tokenize=False), add_special_tokens=False)["input_ids"]
        assert ids[-1] == tokenizer.eos_token_id and "assistant" in tokenizer.decode(ids)  # the template was used
    else:
        ids = tokenizer(prompt + completion)["input_ids"] + [tokenizer.eos_token_id]
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, 0].item()


@pytest.mark.parametrize("chat_template", [True, False])
def test_scores_are_the_saved_models_own_forward_on_the_rendered_conversation(tmp_path, chat_template):
    folder = save_classifier(tmp_path / "rm", word_tokenizer(chat_template))
    scores = reward_model_reward(PROMPTS, COMPLETIONS, path=str(folder))
    expected = [own_forward(folder, p, c) for p, c in zip(PROMPTS, COMPLETIONS)]
    assert scores == pytest.approx(expected, abs=1e-5)
    assert len(set(scores)) == len(scores)  # a random head does tell them apart: the comparison means something


@pytest.mark.parametrize("pad_in", ["config", "tokenizer", "eos"])
def test_padding_and_batch_size_do_not_change_the_scores(tmp_path, pad_in):
    """Completions of different lengths, so batches are padded; the pad id comes from the model's config, else the
    tokenizer's pad token, else eos (which then also ends every conversation: pooled at the token before it)."""
    tokenizer = word_tokenizer(pad=pad_in != "eos")
    folder = save_classifier(tmp_path / "rm", tokenizer, pad_token_id=0 if pad_in == "config" else None)
    one = reward_model_reward(PROMPTS, COMPLETIONS, path=str(folder), batch_size=1)
    assert reward_model_reward(PROMPTS, COMPLETIONS, path=str(folder), batch_size=8) == pytest.approx(one, abs=1e-5)
    assert reward_model_reward(PROMPTS, COMPLETIONS, path=str(folder), batch_size=2) == pytest.approx(one, abs=1e-5)
    scorer = _load_scorer(str(folder.resolve()), "cpu", "auto", False)
    assert scorer.model.config.pad_token_id == (0 if pad_in != "eos" else tokenizer.eos_token_id)


def test_normalize_standardises_over_the_batch(tmp_path):
    folder = save_classifier(tmp_path / "rm", word_tokenizer())
    raw = reward_model_reward(PROMPTS, COMPLETIONS, path=str(folder))
    normalized = reward_model_reward(PROMPTS, COMPLETIONS, path=str(folder), normalize=True)
    mean, std = sum(raw) / len(raw), statistics.pstdev(raw)
    assert normalized == pytest.approx([(s - mean) / (std + 1e-6) for s in raw], abs=1e-6)
    assert statistics.fmean(normalized) == pytest.approx(0.0, abs=1e-6)
    assert statistics.pstdev(normalized) == pytest.approx(std / (std + 1e-6), abs=1e-6)  # 1 but for the epsilon
    assert std > 1e-3  # a random head's scores spread enough that the epsilon hardly counts
    assert reward_model_reward(PROMPTS[:1], COMPLETIONS[:1], path=str(folder), normalize=True) == [0.0]


def test_a_conversation_longer_than_max_length_is_refused_not_cut(tmp_path):
    folder = save_classifier(tmp_path / "rm", word_tokenizer())
    with pytest.raises(ValueError, match=r"1 of 2 conversations are longer than max_length 10 .*sample 2"):
        reward_model_reward(["say it", "say it"], ["good", "red " * 20], path=str(folder), max_length=10)


def test_bad_paths_and_settings_fail_when_the_reward_is_built(tmp_path):
    tokenizer = word_tokenizer()
    missing = tmp_path / "no_such_rm"
    with pytest.raises(FileNotFoundError, match=f"reward 'reward_model'.*{missing}"):
        build_reward_fn([{"name": "reward_model", "kwargs": {"path": str(missing)}}])
    policy = save_tiny_model(tmp_path / "policy", tokenizer)  # a causal LM: transformers would add a random head
    with pytest.raises(ValueError, match=f"{policy}.* is not a one-output sequence classifier"):
        build_reward_fn([{"name": "reward_model", "kwargs": {"path": str(policy)}}])
    two_labels = save_classifier(tmp_path / "two", tokenizer, num_labels=2)
    with pytest.raises(ValueError, match=f"{two_labels}.* is not a one-output sequence classifier.*num_labels 2"):
        build_reward_fn([{"name": "reward_model", "kwargs": {"path": str(two_labels)}}])
    folder = str(save_classifier(tmp_path / "rm", tokenizer))
    for kwargs, message in [({}, "needs `path`"), ({"path": folder, "dtype": "float16"}, "dtype must be one of"),
                            ({"path": folder, "batch_size": 0}, "batch_size must be a positive integer"),
                            ({"path": folder, "normalize": "yes"}, "normalize must be true or false"),
                            ({"path": folder, "device": "tpu"}, "device must be auto, cpu, cuda or cuda:N"),
                            ({"path": folder, "batchsize": 4}, r"takes no argument\(s\) \['batchsize'\]")]:
        with pytest.raises(ValueError, match=message):
            build_reward_fn([{"name": "reward_model", "kwargs": kwargs}])


def test_the_model_loads_once_when_the_reward_is_built(tmp_path, caplog):
    folder = save_classifier(tmp_path / "rm", word_tokenizer())
    _load_scorer.cache_clear()
    with caplog.at_level("INFO", logger="oxrl.rewards.reward_model_reward"):
        reward_fn = build_reward_fn([{"name": "reward_model", "kwargs": {"path": str(folder), "device": "cpu"}}])
        assert _load_scorer.cache_info().misses == 1  # preflight loaded it, before any policy would
        for _ in range(2):
            out = reward_fn(PROMPTS, COMPLETIONS)
        reward_model_reward(PROMPTS, COMPLETIONS, path=str(folder), device="auto")  # auto is cpu here: the same model
    assert _load_scorer.cache_info().misses == 1 and _load_scorer.cache_info().hits >= 3
    loaded = [r.getMessage() for r in caplog.records if "loaded on" in r.getMessage()]
    assert len(loaded) == 1 and str(folder) in loaded[0] and "on cpu" in loaded[0]
    assert "reward_model" in REWARDS and out.metrics()["reward/reward_model/failures"] == 0


# --- end to end: train a reward model with oxRL, then RL against it --------------------------------------

def preference_rows(count: int, seed: int = 0) -> list[dict]:
    """Chosen: three neutral words, one of them replaced by the preferred word; rejected: the three words."""
    import random

    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        words = rng.sample(NEUTRAL, 3)
        chosen = list(words)
        chosen[rng.randrange(3)] = PREFERRED
        rows.append({"prompt": rng.choice(PROMPTS), "chosen": " ".join(chosen), "rejected": " ".join(words)})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def chat_rows(texts: list[str]) -> list[dict]:
    """RL prompts as one-turn chats, rendered with the policy's chat template like the reward model's data."""
    return [{"messages": [{"role": "user", "content": text}]} for text in texts]


def run_config(tmp_path: Path, name: str, model: Path, data: dict, **sections):
    from oxrl.config.load import load_config

    return load_config(None, base={
        "run": {"name": name, "output_dir": str(tmp_path / "runs"), "seed": 0, "device": "cpu"},
        "model": {"name_or_path": str(model)},
        "data": {**data, "max_length": 64},
        "logging": {"progress_bar": False, "plot": False},
        **sections,
    })


def greedy_completions(folder: Path, prompts: list[str]) -> list[str]:
    """The policy's greedy completions of chat prompts, through oxRL's own prompt encoding and HF engine."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from oxrl.data.rl_tasks import RLPrompt, encode_prompts
    from oxrl.rollout.base import SamplingParams
    from oxrl.rollout.hf import HFEngine

    tokenizer = AutoTokenizer.from_pretrained(folder)
    batch = encode_prompts([RLPrompt(messages=[{"role": "user", "content": p}]) for p in prompts], tokenizer)
    engine = HFEngine(AutoModelForCausalLM.from_pretrained(folder), tokenizer)
    return [c.text for c in engine.generate(batch.prompt_ids, SamplingParams(n=1, temperature=0.0, max_new_tokens=4))]


def test_rlhf_end_to_end_the_policy_learns_what_the_trained_reward_model_prefers(tmp_path):
    from oxrl.runner import run

    tokenizer = word_tokenizer()
    policy = save_tiny_model(tmp_path / "policy", tokenizer)
    # 1. A reward model trained with oxRL, from the policy's weights, on pairs that prefer the word "good".
    pairs = write_jsonl(tmp_path / "pairs.jsonl", preference_rows(64))
    rm = run(run_config(tmp_path, "rm", policy, {"train": [{"path": str(pairs)}]}, algorithm={"name": "rm"},
                        train={"global_batch_size": 8, "micro_batch_size_per_device": 8, "max_steps": 30,
                               "optim": {"lr": 1e-2, "schedule": "constant"}}))
    assert rm.final_metrics["rewards/accuracy"] == 1.0
    path = str(rm.final_model_dir)
    held_out = ["say a word about the tree", "tell me two", "please say it", "tell me about a red dog"]
    good, plain = reward_model_reward(["say it"] * 2, ["two good sun", "two cat sun"], path=path)
    assert good > plain + 1.0  # the preference is learnt (on words it was not trained on in these places)

    # 2. GRPO on the policy with the reward model as its only reward; held-out greedy scores before and after.
    train = write_jsonl(tmp_path / "train.jsonl", chat_rows(PROMPTS + ["tell me three", "say about the dog", "tell me it"]))
    val = write_jsonl(tmp_path / "val.jsonl", chat_rows(held_out))
    result = run(run_config(
        tmp_path, "rlhf", policy, {"train": [{"path": str(train)}], "validation": [{"path": str(val)}]},
        algorithm={"name": "rlhf"},
        rl={"prompts_per_step": 4, "validation_every": 100, "rollout": {"n": 4, "max_new_tokens": 4, "temperature": 1.0},
            "rewards": [{"name": "reward_model", "kwargs": {"path": path, "batch_size": 8}}]},
        train={"max_steps": 10, "micro_batch_size_per_device": 16,
               "optim": {"lr": 2e-2, "schedule": "constant", "max_grad_norm": 1.0}}))
    rows = {r["step"]: r for r in map(json.loads, (result.run_dir / "metrics.jsonl").read_text().splitlines())}
    rewards = [rows[step]["reward/mean"] for step in range(1, 11)]
    # (a) the reward model's score of the policy's own samples rises
    assert statistics.fmean(rewards[-3:]) > statistics.fmean(rewards[:3]) + 2.0, rewards
    # (b) held-out prompts: the loop's greedy evaluation (the reward function on greedy completions) before and after,
    assert rows[10]["val/reward"] > rows[0]["val/reward"] + 2.0, (rows[0]["val/reward"], rows[10]["val/reward"])
    # and, measured here: every held-out greedy completion scores above the initial policy's, and says the word
    before, after = greedy_completions(policy, held_out), greedy_completions(result.final_model_dir, held_out)
    before_scores = reward_model_reward(held_out, before, path=path)
    after_scores = reward_model_reward(held_out, after, path=path)
    assert all(a > b for a, b in zip(after_scores, before_scores)), (before, before_scores, after, after_scores)
    assert all(PREFERRED in completion.split() for completion in after), after
