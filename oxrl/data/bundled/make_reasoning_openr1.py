"""Regenerate `reasoning_openr1.jsonl`: `python oxrl/data/bundled/make_reasoning_openr1.py` (deterministic).

Multi-step word problems in Open-R1's math format (OpenR1-Math-220k's columns): `problem`, and a
worked `solution` whose last `\\boxed{}` is the answer, e.g.

    {"problem": "Solve for x: 7x + 12 = 61.",
     "solution": "Subtract 12 from both sides: 7x = 61 - 12 = 49. Divide both sides by 7: x = 49 / 7 = 7.
                  The answer is $\\boxed{7}$."}

The `reasoning` task of the Python API (`Trainer(...).train(task="reasoning")`, oxrl/config/presets.py)
trains on it. Eight kinds of problem, two to four steps each (change after a purchase, a linear
equation, ages, distance at two speeds, two discounts, consecutive integers, a rectangle from its
perimeter, two numbers from their sum and difference), and one with a fraction for an answer (a
probability in lowest terms), so that the reward's equivalence check is exercised beyond integers.
Every answer is exact; no problem appears twice.
"""

from __future__ import annotations

import json
import random
from fractions import Fraction
from pathlib import Path

OUTPUT = Path(__file__).with_name("reasoning_openr1.jsonl")
ROWS = 400
SEED = 2025
NAMES = ["Maya", "Liam", "Ava", "Noah", "Zara", "Omar", "Lena", "Ravi", "Chen", "Sofia", "Ines", "Kofi"]
ITEMS = [("notebook", "notebooks"), ("pencil case", "pencil cases"), ("mug", "mugs"), ("ticket", "tickets"),
         ("book", "books"), ("plant", "plants")]


def boxed(answer: object) -> str:
    return f"The answer is $\\boxed{{{answer}}}$."


def change(rng: random.Random) -> tuple[str, str]:
    name, (item, items) = rng.choice(NAMES), rng.choice(ITEMS)
    count, price, extra = rng.randint(2, 9), rng.randint(2, 15), rng.randint(1, 9)
    cost = count * price + extra
    bill = next(b for b in (20, 50, 100, 200) if b > cost)
    problem = (f"{name} buys {count} {items} at ${price} each and a pen for ${extra}. "
               f"{name} pays with a ${bill} bill. How much change, in dollars, does {name} get?")
    solution = (f"The {items} cost {count} x {price} = {count * price} dollars. With the pen the total is "
                f"{count * price} + {extra} = {cost} dollars. The change is {bill} - {cost} = {bill - cost} dollars. "
                + boxed(bill - cost))
    return problem, solution


def linear_equation(rng: random.Random) -> tuple[str, str]:
    a, x, b = rng.randint(2, 12), rng.randint(-15, 25), rng.randint(1, 60)
    c = a * x + b
    problem = f"Solve for x: {a}x + {b} = {c}."
    solution = (f"Subtract {b} from both sides: {a}x = {c} - {b} = {c - b}. "
                f"Divide both sides by {a}: x = {c - b} / {a} = {x}. " + boxed(x))
    return problem, solution


def ages(rng: random.Random) -> tuple[str, str]:
    older, younger = rng.sample(NAMES, 2)
    young, times, years = rng.randint(2, 15), rng.randint(2, 5), rng.randint(2, 10)
    old = times * young
    total = old + young + 2 * years
    problem = (f"{older} is {times} times as old as {younger}. In {years} years the sum of their ages will be "
               f"{total}. How old is {older} now?")
    solution = (f"Let {younger}'s age be y, so {older}'s age is {times}y. In {years} years their ages add up to "
                f"{times}y + {years} + y + {years} = {times + 1}y + {2 * years} = {total}. "
                f"So {times + 1}y = {total - 2 * years} and y = {young}. {older} is {times} x {young} = {old}. "
                + boxed(old))
    return problem, solution


def distance(rng: random.Random) -> tuple[str, str]:
    v, t1, w, t2 = rng.randint(4, 12) * 10, rng.randint(1, 5), rng.randint(4, 12) * 10, rng.randint(1, 5)
    problem = (f"A train travels at {v} km/h for {t1} hours, then at {w} km/h for {t2} hours. "
               "How many kilometres does it travel in total?")
    solution = (f"First part: {v} x {t1} = {v * t1} km. Second part: {w} x {t2} = {w * t2} km. "
                f"Total: {v * t1} + {w * t2} = {v * t1 + w * t2} km. " + boxed(v * t1 + w * t2))
    return problem, solution


def discounts(rng: random.Random) -> tuple[str, str]:
    price, first, second = rng.randint(2, 30) * 20, rng.choice([10, 20, 25, 50]), rng.choice([10, 20, 50])
    after_first = price * (100 - first) // 100
    if after_first * (100 - second) % 100:
        return discounts(rng)  # keep every price a whole number of dollars
    final = after_first * (100 - second) // 100
    problem = (f"A jacket costs ${price}. Its price is cut by {first}%, and the sale price is then cut by a "
               f"further {second}%. What is the final price in dollars?")
    solution = (f"After the first cut the price is {price} x {100 - first}/100 = {after_first} dollars. After the "
                f"second it is {after_first} x {100 - second}/100 = {final} dollars. " + boxed(final))
    return problem, solution


def consecutive(rng: random.Random) -> tuple[str, str]:
    count, first = rng.choice([3, 4, 5]), rng.randint(-20, 80)
    total = count * first + count * (count - 1) // 2
    problem = f"The sum of {count} consecutive integers is {total}. What is the largest of them?"
    offsets = " + ".join(f"(n + {i})" if i else "n" for i in range(count))
    solution = (f"Call the smallest n. Then {offsets} = {count}n + {count * (count - 1) // 2} = {total}, so "
                f"{count}n = {total - count * (count - 1) // 2} and n = {first}. The largest is n + {count - 1} = "
                f"{first + count - 1}. " + boxed(first + count - 1))
    return problem, solution


def rectangle(rng: random.Random) -> tuple[str, str]:
    width, more = rng.randint(2, 30), rng.randint(1, 15)
    length, perimeter = width + more, 2 * (2 * width + more)
    problem = (f"A rectangle is {more} cm longer than it is wide, and its perimeter is {perimeter} cm. "
               "What is its area in square centimetres?")
    solution = (f"Let the width be w; the length is w + {more}. The perimeter is 2(w + w + {more}) = 4w + {2 * more} "
                f"= {perimeter}, so 4w = {perimeter - 2 * more} and w = {width}. The length is {length}. "
                f"The area is {width} x {length} = {width * length}. " + boxed(width * length))
    return problem, solution


def sum_and_difference(rng: random.Random) -> tuple[str, str]:
    small, gap = rng.randint(1, 40), rng.randint(1, 30)
    big = small + gap
    problem = (f"The sum of two numbers is {big + small} and their difference is {gap}. "
               "What is their product?")
    solution = (f"Adding the two equations, twice the larger number is {big + small} + {gap} = {2 * big}, so it is "
                f"{big}. The smaller is {big + small} - {big} = {small}. Their product is {big} x {small} = "
                f"{big * small}. " + boxed(big * small))
    return problem, solution


def probability(rng: random.Random) -> tuple[str, str]:
    red, blue, green = rng.randint(1, 12), rng.randint(1, 12), rng.randint(0, 8)
    total = red + blue + green
    chance = Fraction(red + blue, total)
    if chance.denominator == 1:
        return probability(rng)  # a certainty is no question
    problem = (f"A bag holds {red} red, {blue} blue and {green} green marbles. One marble is drawn at random. "
               "What is the probability that it is red or blue? Give it as a fraction in lowest terms.")
    solution = (f"There are {red} + {blue} + {green} = {total} marbles, of which {red} + {blue} = {red + blue} are "
                f"red or blue. The probability is {red + blue}/{total} = {chance.numerator}/{chance.denominator}. "
                + boxed(f"\\frac{{{chance.numerator}}}{{{chance.denominator}}}"))
    return problem, solution


KINDS = [change, linear_equation, ages, distance, discounts, consecutive, rectangle, sum_and_difference, probability]


def build_rows(seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    rows, seen = [], set()
    while len(rows) < ROWS:
        problem, solution = KINDS[len(rows) % len(KINDS)](rng)  # the kinds in turn, evenly
        if problem not in seen:
            seen.add(problem)
            rows.append({"problem": problem, "solution": solution})
    rng.shuffle(rows)
    return rows


def files() -> dict[Path, list[dict]]:
    return {OUTPUT: build_rows()}


if __name__ == "__main__":
    for path, rows in files().items():
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
