"""Regenerate the plain-text corpus of continued pre-training: `python examples/data/make_arithmetic_text.py`.

`text` rows (deterministic, seeded), each a short paragraph that works one sum out in words the way
a textbook would, e.g.

    {"text": "To add 38 and 45, add the tens first: 30 + 40 = 70. Then add the units: 8 + 5 = 13.
              Together, 70 + 13 = 83, so 38 + 45 = 83."}

`cpt` trains every token of such text (there is no prompt to mask), which is what continued
pre-training on a domain corpus does; examples/cpt_smollm2_text.yaml reads the file.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUTPUT = Path(__file__).parent / "arithmetic_text.jsonl"
ROWS = 400
SEED = 4321


def addition(rng: random.Random) -> str:
    a, b = rng.randint(11, 99), rng.randint(11, 99)
    tens, units = a // 10 * 10 + b // 10 * 10, a % 10 + b % 10
    return (f"To add {a} and {b}, add the tens first: {a // 10 * 10} + {b // 10 * 10} = {tens}. Then add the units: "
            f"{a % 10} + {b % 10} = {units}. Together, {tens} + {units} = {a + b}, so {a} + {b} = {a + b}.")


def subtraction(rng: random.Random) -> str:
    a, b = sorted((rng.randint(20, 99), rng.randint(11, 60)), reverse=True)
    step = b // 10 * 10
    return (f"To subtract {b} from {a}, take away the tens first: {a} - {step} = {a - step}. Then take away the "
            f"units: {a - step} - {b % 10} = {a - b}. So {a} - {b} = {a - b}.")


def multiplication(rng: random.Random) -> str:
    a, b = rng.randint(11, 49), rng.randint(3, 9)
    tens, units = a // 10 * 10 * b, a % 10 * b
    return (f"To multiply {a} by {b}, split {a} into {a // 10 * 10} and {a % 10}. {a // 10 * 10} x {b} = {tens} and "
            f"{a % 10} x {b} = {units}. Adding the parts, {tens} + {units} = {a * b}, so {a} x {b} = {a * b}.")


def division(rng: random.Random) -> str:
    b, q = rng.randint(2, 9), rng.randint(11, 40)
    a = b * q
    return (f"To divide {a} by {b}, ask how many times {b} fits into {a}. Since {b} x {q} = {a}, it fits {q} times "
            f"exactly, so {a} / {b} = {q}.")


KINDS = [addition, subtraction, multiplication, division]


def build_rows(seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    rows, seen = [], set()
    while len(rows) < ROWS:
        text = KINDS[len(rows) % len(KINDS)](rng)
        if text not in seen:
            seen.add(text)
            rows.append({"text": text})
    rng.shuffle(rows)
    return rows


def files() -> dict[Path, list[dict]]:
    return {OUTPUT: build_rows()}


def main() -> None:
    for path, rows in files().items():
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        print(f"wrote {len(rows)} rows to {path}")


if __name__ == "__main__":
    main()
