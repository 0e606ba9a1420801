"""`format`: 1.0 when the completion has the requested shape, else 0.0.

Default shape: `<think>...</think>` then `<answer>...</answer>`, nothing else around them but
whitespace, each tag exactly once (a second `<answer>` would let a model hedge). Tag names are
configurable (`think_tag=None` asks for the answer tag alone); `pattern` replaces the whole check
with a regex that must match the entire completion (`re.fullmatch`, `re.DOTALL`).
"""

from __future__ import annotations

import re


def format_reward(
    prompt: str,
    completion: str,
    *,
    think_tag: str | None = "think",
    answer_tag: str = "answer",
    pattern: str | None = None,
) -> float:
    if pattern is not None:
        return 1.0 if re.fullmatch(pattern, completion, flags=re.DOTALL) else 0.0
    tags = [tag for tag in (think_tag, answer_tag) if tag]
    for tag in tags:
        if completion.count(f"<{tag}>") != 1 or completion.count(f"</{tag}>") != 1:
            return 0.0
    shape = r"\s*" + r"\s*".join(rf"<{re.escape(tag)}>.*?</{re.escape(tag)}>" for tag in tags) + r"\s*"
    return 1.0 if re.fullmatch(shape, completion, flags=re.DOTALL) else 0.0
