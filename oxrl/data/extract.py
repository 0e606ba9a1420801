"""Pull the answer out of a model's completion (the code: `oxrl.data.code_blocks`).

Hand-written brace matching instead of a regex for `\\boxed{...}`: answers nest braces
(`\\boxed{\\frac{1}{2}}`), and the original oxRL's `"\\boxed{"` regex was broken by `\\b` (a word
boundary in a regex). Everything here returns the *last* match: models restate intermediate results
before the final one.
"""

from __future__ import annotations

import re

BOXED_COMMANDS = ("\\boxed", "\\fbox")
# A number, with thousands separators and decimals. The minus sign counts only when it is not a
# binary minus: "12-7" ends in the number 7, not -7.
NUMBER_PATTERN = re.compile(r"(?:(?<![\w.)\]}])-)?\d+(?:,\d{3})*(?:\.\d+)?")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`, or `\\boxed 5`), None when there is none."""
    start = max(text.rfind(command) for command in BOXED_COMMANDS)
    while start >= 0:
        command = next(c for c in BOXED_COMMANDS if text.startswith(c, start))
        content = _boxed_argument(text, start + len(command))
        if content is not None:
            return content
        # An unbalanced or empty box: try the one before it.
        start = max(text.rfind(c, 0, start) for c in BOXED_COMMANDS)
    return None


def _boxed_argument(text: str, position: int) -> str | None:
    rest = text[position:]
    if rest.startswith("{"):
        depth = 0
        for index, char in enumerate(rest):
            if char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
                if depth == 0:
                    content = rest[1:index].strip()
                    return content or None
        return None  # never closed: a truncated completion
    if rest.startswith(" "):  # `\boxed 5`: the argument is the next token
        token = rest.split(maxsplit=1)[0] if rest.strip() else ""
        token = token.rstrip(".,;$")
        return token or None
    return None  # `\boxedfoo` is some other command


def tag_content(text: str, tag: str) -> str | None:
    """Stripped content of the last `<tag>...</tag>`, None when there is none (or it is empty)."""
    matches = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, flags=re.DOTALL)
    if not matches:
        return None
    return matches[-1].strip() or None


def last_number(text: str) -> str | None:
    """The last number in `text`, thousands separators removed ("1,000" -> "1000")."""
    matches = NUMBER_PATTERN.findall(text)
    return matches[-1].replace(",", "") if matches else None


def final_answer(text: str, answer_tag: str = "answer", prefer: str = "boxed") -> str | None:
    """The completion's final answer: its last `\\boxed{}`, else its last `<answer>` tag, else its last number.

    `prefer="tag"` looks at the `<answer>` tag first: with a `<think>...</think><answer>...</answer>`
    prompt a `\\boxed{}` inside the thinking is a draft, the tag is the answer.
    """
    if prefer not in ("boxed", "tag"):
        raise ValueError(f"prefer must be 'boxed' or 'tag', got {prefer!r}")
    boxed, tagged = last_boxed(text), tag_content(text, answer_tag)
    first, second = (boxed, tagged) if prefer == "boxed" else (tagged, boxed)
    if first is not None:
        return first
    if second is not None:
        return second
    return last_number(text)
