"""The calculator agent recipe (docs/agents.md): its SFT traces fit the RL run they prepare.

The traces must be episodes the RL run could have produced: the user turn is the RL prompt, the call
ends where sampling stops and gets the result the environment writes, and the answer scores 1.0.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
from pathlib import Path

import pytest

from oxrl.config.load import load_config
from oxrl.data.rl_tasks import prompt_template
from oxrl.loops.rl_setup import load_prompts

ROOT = Path(__file__).resolve().parents[2]
SFT_CONFIG = ROOT / "examples/sft_smollm2_calculator_traces.yaml"
RL_CONFIG = ROOT / "examples/grpo_smollm2_calculator_agent.yaml"
TRACES = ROOT / "examples/data/calculator_traces.jsonl"
EXPRESSION = re.compile(r"<calc>(\d+)([+-])(\d+)</calc>")


def _module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _in_the_repository(monkeypatch):
    """The configs name their files relative to the repository root, where their commands run."""
    monkeypatch.chdir(ROOT)


@pytest.fixture(scope="module")
def traces() -> list[dict]:
    return [json.loads(line) for line in TRACES.read_text().splitlines()]


@pytest.fixture(scope="module")
def calculator():
    return _module(ROOT / "examples/envs/calculator.py")


def _split(content: str) -> tuple[str, str, str]:
    """(the call the model samples, the environment's text, the model's answer) of a trace's assistant turn;
    the newline after `</calc>` is the one the sampled call does not have (make_calculator_traces.py)."""
    action = content[: content.index("</calc>") + len("</calc>")]
    environment_text = content[len(action) + 1: content.index("</result>\n") + len("</result>\n")]
    return action, environment_text, content[len(action) + 1 + len(environment_text):]


def test_the_file_is_what_the_generator_writes_and_the_generator_is_deterministic(traces):
    generator = _module(ROOT / "examples/data/make_calculator_traces.py")
    assert generator.build() == generator.build() == traces, "regenerate calculator_traces.jsonl"
    assert len({json.dumps(row["messages"][0]) for row in traces}) == len(traces), "each question once"


def test_user_turns_are_the_rl_prompts(traces):
    cfg = load_config(RL_CONFIG)
    template = prompt_template(cfg.rl)
    held_out = load_prompts(cfg, cfg.rl)[1]
    for row in traces:
        a, symbol, b = EXPRESSION.search(row["messages"][-1]["content"]).groups()
        assert row["messages"][:-1] == template.messages(f"What is {a}{symbol}{b}?")
        assert int(a) <= cfg.rl.task_config["max_operand"] and int(b) <= int(a) or symbol == "+"
    # The RL task renders its questions with the same template: a held-out prompt has the traces' form.
    question = re.match(r"What is \d+[+-]\d+\?", held_out[0].messages[-1]["content"]).group(0)
    assert held_out[0].messages == template.messages(question)


def test_no_held_out_question_is_a_trace(traces):
    cfg = load_config(RL_CONFIG)
    held_out = load_prompts(cfg, cfg.rl)[1]
    assert len(held_out) == cfg.rl.validation_size
    prompts = {json.dumps(row["messages"][:-1]) for row in traces}
    assert not [p.messages for p in held_out if json.dumps(p.messages) in prompts]


def test_each_trace_is_an_episode_the_environment_scores_1(traces, calculator):
    for row in traces:
        content = row["messages"][-1]["content"]
        a, symbol, b = EXPRESSION.search(content).groups()
        answer = str(int(a) + int(b) if symbol == "+" else int(a) - int(b))
        action, environment_text, final = _split(content)
        assert content == f"{action}\n{environment_text}{final}"
        state, extra_info = "<|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n", {"answer": answer}
        called = asyncio.run(calculator.step(state, action, dict(extra_info)))
        assert not called["done"] and called["reward"] == 0.0
        assert called["next_state"] == state + action + environment_text == state + action + f"<result>{answer}</result>\n"
        answered = asyncio.run(calculator.step(called["next_state"], final, called["extra_info"]))
        assert answered["done"] and answered["reward"] == answered["score"] == 1.0, content


def test_the_call_ends_on_a_token_boundary(traces, smollm2_tokenizer):
    """SFT tokenises the whole assistant text: its call must end on a token of its own, so that a model that
    learnt it stops sampling exactly at `</calc>` (`</calc><result>` would end the call inside the token `><`)."""
    for row in traces[:50]:
        content = row["messages"][-1]["content"]
        action = _split(content)[0]
        ids, call = smollm2_tokenizer.encode(content), smollm2_tokenizer.encode(action)
        assert ids[: len(call)] == call, content


def test_both_configs_load_and_chain(traces):
    sft, rl = load_config(SFT_CONFIG), load_config(RL_CONFIG)
    # Files named relative to the config resolve beside it, from any working directory.
    assert [Path(spec.path) for spec in sft.data.train] == [ROOT / "examples/data/calculator_traces.jsonl"]
    assert rl.model.name_or_path == f"{sft.run.output_dir}/{sft.run.name}/final", "GRPO starts from the SFT model"
    assert Path(rl.rl.env.path) == ROOT / "examples/envs/calculator.py" and rl.rl.rollout.stop == ["</calc>"]
    assert rl.rl.validation_every is not None
