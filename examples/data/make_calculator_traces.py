"""Regenerate the calculator tool-use traces: `python examples/data/make_calculator_traces.py`.

Chat rows (deterministic, seeded) that teach SmolLM2 the calculator protocol of
examples/envs/calculator.py before GRPO (docs/agents.md), e.g.

    {"messages": [{"role": "user", "content": "What is 412+87?\\n\\nYou may use a calculator: ..."},
                  {"role": "assistant", "content": "<calc>412+87</calc>\\n<result>499</result>\\nThe answer is \\\\boxed{499}."}]}

The user turn is exactly the prompt of the RL run (examples/grpo_smollm2_calculator_agent.yaml): the
question rendered by the RL config's own `PromptTemplate` (`rl.prompt_template`, `rl.answer_format`,
`rl.system_prompt`), so the SFT prompts and the RL prompts cannot drift apart. The questions are the
RL task's kind ("What is A+B?", "What is A-B?" with A >= B, operands up to `max_operand`), drawn from
this file's own seed, and none of them is one of the RL run's held-out questions.

The assistant turn is what a solved episode looks like: the call, the environment's
`<result>VALUE</result>\\n`, a short sentence with `\\boxed{VALUE}`. One difference: a newline follows
`</calc>`. The episode's text has none (sampling stops at `</calc>`), but SmolLM2's tokenizer merges
`><` into one token, so `</calc><result>` would teach the model to end its call with `><`; sampling
would then stop on that token (a stop string may end inside a token) and the action, `...</calc><`,
would not be a call. With the newline the call ends on the token `>`, where sampling stops.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
OUT_FILE = HERE / "calculator_traces.jsonl"
RL_CONFIG = ROOT / "examples" / "grpo_smollm2_calculator_agent.yaml"
ROWS = 400
SEED = 1234
SENTENCES = ["The answer is \\boxed{{{value}}}.", "So {expression} = {value}, and the final answer is \\boxed{{{value}}}."]


def rl_prompts(config_path: Path = RL_CONFIG):
    """The RL run's prompt template, held-out prompts and `max_operand`, read from its config."""
    from oxrl.config.load import load_config
    from oxrl.data.rl_tasks import prompt_template
    from oxrl.loops.rl_setup import load_prompts

    cfg = load_config(str(config_path))
    held_out = load_prompts(cfg, cfg.rl)[1]
    return prompt_template(cfg.rl), held_out, cfg.rl.task_config.get("max_operand", 99)


def trace(template, expression: str, value: int, sentence: str) -> dict:
    """One row: the RL prompt of `What is EXPRESSION?` and a solved episode's assistant text."""
    answer = f"<calc>{expression}</calc>\n<result>{value}</result>\n" + sentence.format(expression=expression, value=value)
    return {"messages": [*template.messages(f"What is {expression}?"), {"role": "assistant", "content": answer}]}


def build(config_path: Path = RL_CONFIG, rows: int = ROWS, seed: int = SEED) -> list[dict]:
    template, held_out, max_operand = rl_prompts(config_path)
    taken = {json.dumps(prompt.messages) for prompt in held_out}  # a held-out prompt is never a trace
    rng = random.Random(seed)
    out: list[dict] = []
    while len(out) < rows:
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        symbol = rng.choice("+-")
        if symbol == "-":
            a, b = max(a, b), min(a, b)  # as the task: no negative answers
        expression = f"{a}{symbol}{b}"
        row = trace(template, expression, a + b if symbol == "+" else a - b, rng.choice(SENTENCES))
        key = json.dumps(row["messages"][:-1])
        if key in taken:
            continue  # held out, or already a trace
        taken.add(key)
        out.append(row)
    return out


def files() -> dict[Path, list[dict]]:
    return {OUT_FILE: build()}


def main() -> None:
    for path, rows in files().items():
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"wrote {len(rows)} rows to {path}")


if __name__ == "__main__":
    main()
