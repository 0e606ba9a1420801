"""A calculator tool for arithmetic questions, as a multi-turn environment in RL2's format.

    rl.env.path: examples/envs/calculator.py       (with rl.task: arithmetic, whose rows carry `answer`)

Each turn the model either calls the calculator or answers:

- an action that ends with `<calc>EXPRESSION</calc>` (set `rollout.stop: ["</calc>"]` so sampling stops
  there) gets `<result>VALUE</result>` appended and the model goes on in the same assistant message;
- anything else ends the episode: reward and score 1.0 when its last `\\boxed{}` equals
  `extra_info["answer"]` (numerically), else 0.0.

The expression is model-written text, so it is never executed: it is parsed with `ast` and only
numbers, + - * / **, unary minus/plus and parentheses are evaluated, with bounds on the length of the
expression, the size of every intermediate value and the exponent.
"""

from __future__ import annotations

import ast
import math
import operator
import re

from oxrl.data.extract import last_boxed

CALL = re.compile(r"<calc>(.*?)</calc>\s*$", re.DOTALL)  # a calculator call that ends the action
MAX_EXPRESSION_CHARS = 120
MAX_MAGNITUDE = 1e12  # every intermediate value stays within this
MAX_EXPONENT = 10

BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
          ast.Pow: operator.pow}
UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class CalculatorError(ValueError):
    """The expression is not plain bounded arithmetic."""


def evaluate(expression: str) -> float:
    """The value of an arithmetic expression, or CalculatorError; names, calls, attributes and every
    other Python construct are rejected by the parser walk, never evaluated."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise CalculatorError(f"not an arithmetic expression ({error.msg})") from error
    return _value(tree.body)


def _value(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):  # not bool, str, complex
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise CalculatorError("division by zero")
        if isinstance(node.op, ast.Pow) and (abs(right) > MAX_EXPONENT or (left == 0 and right < 0)):
            raise CalculatorError(f"exponent outside [-{MAX_EXPONENT}, {MAX_EXPONENT}] or 0 to a negative power")
        if isinstance(node.op, ast.Pow) and left < 0 and right != int(right):
            raise CalculatorError("a negative number to a fractional power")
        return _bounded(BINARY[type(node.op)](left, right))
    raise CalculatorError(f"only numbers, + - * / ** and parentheses are allowed, not {type(node).__name__}")


def _bounded(value: float) -> float:
    if not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
        raise CalculatorError(f"a value beyond +-{MAX_MAGNITUDE:g}")
    return value


def show(value: float) -> str:
    """12.0 -> "12", 3.5 -> "3.5", 1/3 -> "0.333333"."""
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def is_correct(answer: str | None, gold: str) -> bool:
    if answer is None:
        return False
    try:
        return math.isclose(float(answer.replace(",", "").strip()), float(gold), rel_tol=0, abs_tol=1e-6)
    except ValueError:
        return False


async def step(state: str, action: str, extra_info: dict) -> dict:
    """RL2's environment step: a calculator call continues the episode, anything else is the answer."""
    call = CALL.search(action)
    if call is not None:
        try:
            result = show(evaluate(call.group(1)))
        except CalculatorError as error:
            result = f"error: {error}"
        return {"next_state": state + action + f"<result>{result}</result>\n", "reward": 0.0, "score": 0.0,
                "done": False, "extra_info": extra_info}
    correct = float(is_correct(last_boxed(action), str(extra_info["answer"])))
    return {"next_state": None, "reward": correct, "score": correct, "done": True, "extra_info": extra_info}
