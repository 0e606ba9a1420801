"""One home for secrets: values that must never be written to a log line, `failure.txt` or a bug report.

A secret is a value oxRL was told is one, `register_secret(value)` (the judge registers the API key it
reads from the variable `api_key_env` names), or the value of an environment variable whose NAME looks
like a secret's (`*_KEY`, `*_TOKEN`, `*_PASSWD`, `*SECRET*`, `*PASSWORD*`, `*CREDENTIAL*`: `HF_TOKEN`,
`WANDB_API_KEY`, `AWS_SECRET_ACCESS_KEY`, ...). `redact(text)` replaces every one with `***`, in every form a
server echoing a header may write it (`oxrl.logging.secret_forms`): escaped, percent-encoded, as HTML references,
in base64.

It is applied where text is written, before it is written: by `RedactingFilter` on oxRL's log handlers
(the console and `<run>/train.log`), by the writer of `failure.txt`, and by `oxrl report`; code that puts
a server's reply into an error message (the judge) redacts it there too, so an exception raised past
every handler (Python's own traceback print) holds no secret either.

Values shorter than `MIN_SECRET_CHARS` are not redacted: replacing them would blank ordinary words
("EMPTY", the placeholder key local servers accept), and so short a value guards nothing.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import traceback
from collections.abc import Iterable

MASK = "***"
MIN_SECRET_CHARS = 6
SECRET_NAME = re.compile(r"(_KEY|_TOKEN|_PASSWD)$|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)

# Process-wide on purpose: a secret registered by a reward must be redacted by every handler and writer in
# the process, none of which the reward knows. Only ever added to.
_REGISTERED: set[str] = set()


def register_secret(value: str) -> None:
    """From now on, `value` is redacted wherever oxRL writes text."""
    if len(value) >= MIN_SECRET_CHARS:
        _REGISTERED.add(value)


def secret_values(extra: Iterable[str] = ()) -> list[str]:
    """Every value to redact, longest first (so that no part of a longer one survives)."""
    values = set(_REGISTERED) | {v for v in extra if len(v) >= MIN_SECRET_CHARS}
    values |= {value for name, value in os.environ.items() if SECRET_NAME.search(name) and len(value) >= MIN_SECRET_CHARS}
    return sorted(values, key=lambda value: (-len(value), value))


def redact(text: str, extra: Iterable[str] = ()) -> str:
    """`text` with every secret (and `extra` values), in every written form, replaced by `***`."""
    if not (values := secret_values(extra)):
        return text
    from oxrl.logging.secret_forms import masked  # read only where there is a secret to look for

    return masked(text, tuple(values), MASK)


class RedactingFilter(logging.Filter):
    """Redacts a record's message, traceback and stack before any handler formats it; drops nothing."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a malformed log call: left for the handler, which reports it
            return True
        record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def print_redacted_traceback(kind: type[BaseException], error: BaseException, trace) -> None:
    """A `sys.excepthook` for the `oxrl` command: Python's own traceback print, redacted. An error that no
    handler catches (another library's, quoting a header it was given) is printed past every log filter."""
    sys.stderr.write(redact("".join(traceback.format_exception(kind, error, trace))))
