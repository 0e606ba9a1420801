"""Regenerate the arithmetic preference pairs: `python examples/data/make_arithmetic_preferences.py`.

Chat-format preference rows (deterministic, seeded): a user question, a correct assistant answer
(`chosen`) and the same answer with a typical mistake (`rejected`), one of three kinds drawn
uniformly: a units slip (off by 1 or 2), a carry/borrow slip (off by 10), or the result of the
wrong operation (a - b asked a + b, and so on), e.g.

    {"messages": [{"role": "user", "content": "What is 38 + 45?"}],
     "chosen": [{"role": "assistant", "content": "38 + 45 = 83"}],
     "rejected": [{"role": "assistant", "content": "38 + 45 = 73"}]}

Chosen and rejected differ only in the final number, so a pair is ranked right only by a model
that prefers the correct result. The test file holds questions (operand pairs) that the training
file never asks. Untrained, SmolLM2-135M-Instruct ranks a fair share of the held-out pairs wrong.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
TRAIN_FILE, TEST_FILE = HERE / "arithmetic_preferences_train.jsonl", HERE / "arithmetic_preferences_test.jsonl"
TRAIN_ROWS, TEST_ROWS = 480, 120
SEED = 1234

OPERATIONS = {
    # symbol: (question templates, operand range, result)
    "+": (["What is {a} + {b}?", "Compute {a} + {b}.", "How much is {a} plus {b}?"], (10, 99), lambda a, b: a + b),
    "-": (["What is {a} - {b}?", "Compute {a} - {b}.", "How much is {a} minus {b}?"], (10, 99), lambda a, b: a - b),
    "*": (["What is {a} * {b}?", "Compute {a} * {b}.", "How much is {a} times {b}?"], (2, 12), lambda a, b: a * b),
}
SLIPS = {"units": (1, -1, 2, -2), "carry": (10, -10)}
WRONG_OPERATION = {"+": "-", "-": "+", "*": "+"}


def question(rng: random.Random, symbol: str) -> tuple[int, int]:
    low, high = OPERATIONS[symbol][1]
    a, b = rng.randint(low, high), rng.randint(low, high)
    return (max(a, b), min(a, b)) if symbol == "-" else (a, b)  # no negative results


def row(rng: random.Random, symbol: str, a: int, b: int) -> dict:
    templates, _, result = OPERATIONS[symbol]
    correct = result(a, b)
    kind = rng.choice(["units", "carry", "operation"])
    wrong = OPERATIONS[WRONG_OPERATION[symbol]][2](a, b) if kind == "operation" else -1
    if wrong == correct or wrong < 0:  # 2 * 2 == 2 + 2, a - b < 0: fall back to a slip
        kind = "units"
    if kind != "operation":
        wrong = correct + rng.choice([m for m in SLIPS[kind] if correct + m >= 0])
    answer = f"{a} {symbol} {b} = {{}}"
    return {
        "messages": [{"role": "user", "content": rng.choice(templates).format(a=a, b=b)}],
        "chosen": [{"role": "assistant", "content": answer.format(correct)}],
        "rejected": [{"role": "assistant", "content": answer.format(wrong)}],
    }


def build() -> tuple[list[dict], list[dict]]:
    rng = random.Random(SEED)
    seen: set[tuple[str, int, int]] = set()
    rows: list[dict] = []
    while len(rows) < TRAIN_ROWS + TEST_ROWS:
        symbol = rng.choice(list(OPERATIONS))
        a, b = question(rng, symbol)
        if (symbol, a, b) in seen:
            continue  # each question once, so no test question is also a training question
        seen.add((symbol, a, b))
        rows.append(row(rng, symbol, a, b))
    return rows[:TRAIN_ROWS], rows[TRAIN_ROWS:]


def main() -> None:
    train, test = build()
    for path, rows in ((TRAIN_FILE, train), (TEST_FILE, test)):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"wrote {len(rows)} rows to {path}")


if __name__ == "__main__":
    main()
