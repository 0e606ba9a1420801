"""Regenerate `chat_sft.jsonl`: `python oxrl/data/bundled/make_chat_sft.py` (deterministic).

A small `messages` dataset for a visible before/after SFT demo: the assistant always answers in
one distinctive style, "The answer is X.", for arithmetic (160 rows), short facts (24 rows) and
a few multi-turn follow-ups (16 rows). Untrained, SmolLM2-135M-Instruct answers "What is 12+7?"
with a sentence of its own (often wrong); after SFT it should say "The answer is 19."
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUTPUT = Path(__file__).with_name("chat_sft.jsonl")

FACTS = [
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Japan?", "Tokyo"),
    ("What is the capital of Italy?", "Rome"),
    ("What is the capital of Spain?", "Madrid"),
    ("What is the capital of Germany?", "Berlin"),
    ("What is the capital of Canada?", "Ottawa"),
    ("What is the capital of Australia?", "Canberra"),
    ("What is the capital of Egypt?", "Cairo"),
    ("What is the capital of Norway?", "Oslo"),
    ("What is the capital of Portugal?", "Lisbon"),
    ("What is the capital of Greece?", "Athens"),
    ("What is the capital of Kenya?", "Nairobi"),
    ("How many days are in a week?", "7"),
    ("How many legs does a spider have?", "8"),
    ("How many minutes are in an hour?", "60"),
    ("How many sides does a hexagon have?", "6"),
    ("How many hours are in a day?", "24"),
    ("How many months are in a year?", "12"),
    ("What is the chemical symbol for gold?", "Au"),
    ("What is the chemical symbol for water?", "H2O"),
    ("Which planet is known as the Red Planet?", "Mars"),
    ("What is the largest planet in the solar system?", "Jupiter"),
    ("Who wrote Romeo and Juliet?", "William Shakespeare"),
    ("What is the freezing point of water in degrees Celsius?", "0"),
]

OPERATIONS = {
    # operation: (question templates, operand range)
    "add": (["What is {a}+{b}?", "What is {a} + {b}?", "How much is {a} plus {b}?", "Add {a} and {b}."], (1, 60)),
    "subtract": (["What is {a}-{b}?", "What is {a} minus {b}?", "Subtract {b} from {a}."], (1, 60)),
    "multiply": (["What is {a}*{b}?", "What is {a} times {b}?", "Multiply {a} by {b}."], (2, 12)),
}

FOLLOW_UPS = [
    ("And if you add {c} to that?", lambda x, c: x + c),
    ("Now multiply that by {c}.", lambda x, c: x * c),
    ("What if you subtract {c} from it?", lambda x, c: x - c),
]


def answer(value: object) -> str:
    return f"The answer is {value}."


def chat(*turns: str) -> dict:
    roles = ["user", "assistant"] * len(turns)
    return {"messages": [{"role": role, "content": text} for role, text in zip(roles, turns)]}


def arithmetic_question(rng: random.Random) -> tuple[str, int]:
    operation = rng.choice(sorted(OPERATIONS))
    templates, (low, high) = OPERATIONS[operation]
    a, b = rng.randint(low, high), rng.randint(low, high)
    if operation == "subtract" and a < b:  # keep answers non-negative
        a, b = b, a
    value = {"add": a + b, "subtract": a - b, "multiply": a * b}[operation]
    return rng.choice(templates).format(a=a, b=b), value


def build_rows(seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows, seen = [], set()
    while len(rows) < 160:
        question, value = arithmetic_question(rng)
        if question not in seen:
            seen.add(question)
            rows.append(chat(question, answer(value)))
    rows.extend(chat(question, answer(fact)) for question, fact in FACTS)
    for _ in range(16):
        question, value = arithmetic_question(rng)
        follow_up, func = rng.choice(FOLLOW_UPS)
        c = rng.randint(2, 9)
        rows.append(chat(question, answer(value), follow_up.format(c=c), answer(func(value, c))))
    rng.shuffle(rows)
    return rows


if __name__ == "__main__":
    OUTPUT.write_text("".join(json.dumps(row) + "\n" for row in build_rows()))
