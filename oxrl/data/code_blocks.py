"""Pull the program out of a model's completion: its last fenced code block (the `code` reward's input).

Apart from `oxrl.data.extract` so that only a run that scores code reads it.
"""

from __future__ import annotations

import re

LANGUAGE_PATTERN = re.compile(r"[\w+-]*")  # a fence's language tag: the start of its info line
FENCE = "```"
LANGUAGE_TAGS = {"python": ("python", "py", "python3")}


def extract_code(text: str, language: str = "python") -> str | None:
    """The last fenced code block in `language` (```python ... ```), else the last fenced block of any language.

    An unclosed block (a completion cut at the token limit) does not count: running half a program
    tells nothing.
    """
    blocks = code_blocks(text)
    if not blocks:
        return None
    tagged = [code for lang, code in blocks if lang.lower() in LANGUAGE_TAGS.get(language, (language,))]
    # Untagged blocks are most likely the requested language too; blocks tagged with another one are not.
    untagged = [code for lang, code in blocks if not lang]
    chosen = tagged or untagged
    return chosen[-1] if chosen else None


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language tag, code) of each closed fenced block, in order.

    A scan with `str.find`, linear in the text: the regex it replaces re-scanned the rest of the line from
    every backtick, quadratic in a run of backticks (1.6 s at 48,000). A block is a fence, the rest of its
    line (the tag: the line's leading word characters, `+` and `-`), a newline, then everything up to the
    next fence.
    """
    blocks = []
    position = 0
    while (start := text.find(FENCE, position)) >= 0:
        line_end = text.find("\n", start + len(FENCE))
        close = -1 if line_end < 0 else text.find(FENCE, line_end + 1)
        if close < 0:
            break  # a later fence would need a newline and a closing fence after this one's: there are none
        language = LANGUAGE_PATTERN.match(text, start + len(FENCE), line_end).group()
        blocks.append((language, text[line_end + 1:close]))
        position = close + len(FENCE)
    return blocks
