"""`math`: 1.0 when the completion's final answer equals the gold answer mathematically (math-verify), else 0.0.

The final answer is the completion's last `\\boxed{}`, else its last `<answer>` tag, else its last
number (see `oxrl.data.extract.final_answer`); math-verify then decides equivalence
("0.5" == "\\frac{1}{2}", "1,000" == "1000", "x^2+1" == "1+x^2").

Threads: math-verify bounds parsing and comparison time with `signal.alarm`, which Python allows
only in the main thread (elsewhere it raises "signal only works in main thread"). In the main thread
we keep its timeouts; in any other thread we turn them off (`parsing_timeout=None`,
`timeout_seconds=None`), so a pathological expression could hold that thread. To keep that risk
small, answers longer than `MAX_ANSWER_CHARS` score 0 without being parsed.
"""

from __future__ import annotations

import threading
from typing import Any

from oxrl.dependencies import REWARD_PACKAGES, MissingDependencyError, install_hint, require
from oxrl.rewards.base import signal_timed
from oxrl.data.extract import final_answer

MAX_ANSWER_CHARS = 1000
TIMEOUT_SECONDS = 5  # math-verify's default, for parsing and for comparing


@signal_timed  # called from the main thread, it runs there under math-verify's alarms (oxrl.rewards.base)
def math_reward(
    prompt: str,
    completion: str,
    *,
    answer: Any,
    answer_tag: str = "answer",
    prefer: str = "boxed",
) -> float:
    """Score `completion` against the gold `answer` (a row field).

    `prefer="tag"` reads the `<answer_tag>` content before any `\\boxed{}` (for think/answer prompts).
    Raises ValueError when the gold answer is empty or math-verify cannot parse it: that is a data
    problem, and scoring every completion 0 would hide it.
    """
    gold_text = _gold_text(answer)
    predicted = final_answer(completion, answer_tag=answer_tag, prefer=prefer)
    if predicted is None or len(predicted) > MAX_ANSWER_CHARS:
        return 0.0
    timeout = TIMEOUT_SECONDS if threading.current_thread() is threading.main_thread() else None
    gold = _parse(gold_text, timeout)
    if not gold:
        raise ValueError(f"math-verify cannot parse the gold answer {gold_text!r}")
    prediction = _parse(predicted, timeout)
    if not prediction:
        return 0.0
    from math_verify import verify

    return 1.0 if verify(gold, prediction, timeout_seconds=timeout) else 0.0


def check_math_reward(**kwargs: Any) -> None:
    """`math_reward.preflight`: math-verify is installed (checked when the reward is built, before any model loads)."""
    require(*REWARD_PACKAGES["math"], "the `math` reward")


math_reward.preflight = check_math_reward  # type: ignore[attr-defined]


def _gold_text(answer: Any) -> str:
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise ValueError(f"the gold answer must be a string or a number, got {type(answer).__name__} {answer!r:.80}")
    text = str(answer).strip()
    if not text:
        raise ValueError("the gold answer is empty")
    return text


def _parse(text: str, timeout: int | None) -> list[Any]:
    try:
        from math_verify import parse
    except ImportError as error:
        raise MissingDependencyError(f"the `math` reward needs math-verify: {install_hint('math-verify')}") from error
    # Wrapped in $...$ so that LaTeX (\frac{1}{2}) and plain numbers both parse; a text that already
    # carries its delimiters or a \boxed{} is parsed as it is.
    latex = text if ("$" in text or "\\boxed" in text) else f"${text}$"
    return parse(latex, parsing_timeout=timeout)
