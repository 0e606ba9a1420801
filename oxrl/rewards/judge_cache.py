"""The `judge` reward's memory of judgements: in memory, and optionally in a JSONL file.

A judgement is keyed by the judge's identity (endpoint or model, served name, token budget) and the
rendered judge prompt, hashed (sha256), so a file never holds the prompts themselves. The file is read
when the cache opens and appended to, one line per judgement, as judgements arrive: a run that resumes,
or one that asks again about the same completions, does not pay for them twice. A line cut short by a
crash is skipped (with a warning) when the file is read back.

The file is read as data files are (`oxrl.files`, `oxrl.nesting`): a path that is not a regular file (a
FIFO would wait forever, /dev/zero never end, a folder), a file larger than MAX_CACHE_BYTES, text that is not
UTF-8 or a line nested deeper than any judgement (which Python's JSON parser cannot read) is refused when the
judge is built, before any model loads, with one line naming the file (and the line).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from pathlib import Path

logger = logging.getLogger(__name__)

MAX_CACHE_BYTES = 1 << 30  # ~500,000 judgements of 2 KB; a larger cache is read whole into memory at every start


def judgement_key(identity: str, prompt: str) -> str:
    return hashlib.sha256(f"{identity}\n{prompt}".encode()).hexdigest()


class JudgementCache:
    def __init__(self, path: str | Path | None = None):
        self.path = Path(path).expanduser() if path is not None else None
        self.replies: dict[str, str] = {}
        self._lock = threading.Lock()
        if self.path is not None and (self.path.exists() or self.path.is_symlink()):
            self._read(self.path)

    def get(self, identity: str, prompt: str) -> str | None:
        return self.replies.get(judgement_key(identity, prompt))

    def put(self, identity: str, prompt: str, reply: str) -> None:
        key = judgement_key(identity, prompt)
        with self._lock:
            self.replies[key] = reply
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a", encoding="utf-8") as file:
                    file.write(json.dumps({"key": key, "judge": identity, "reply": reply}) + "\n")

    def _read(self, path: Path) -> None:
        from oxrl.nesting import MAX_JSON_DEPTH, too_deep
        from oxrl.files import InputFileError, read_bounded

        where = f"reward 'judge': cache_path {path}"
        try:
            data = read_bounded(path, MAX_CACHE_BYTES, "a judgement cache")
        except InputFileError as error:
            raise ValueError(f"{where}: {error}: it names a JSONL file of judgements (or a new one)") from None
        except OSError as error:  # not found behind a symlink, no permission, a symlink loop
            raise ValueError(f"{where}: cannot be read: {error.strerror or error}") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            line = data.count(b"\n", 0, error.start) + 1
            raise ValueError(f"{where}, line {line}: not UTF-8 text (byte {error.start}): is it a judgement cache?") from None
        skipped = 0
        for number, line in enumerate(text.splitlines(), start=1):
            if too_deep(line.encode()):
                raise ValueError(f"{where}, line {number}: its arrays and objects nest more than {MAX_JSON_DEPTH} "
                                 "levels deep, which no judgement does: is it a judgement cache? Remove the line")
            try:
                entry = json.loads(line)
                key, reply = entry["key"], entry["reply"]
            except (ValueError, KeyError, TypeError):
                skipped += 1
                continue
            if isinstance(key, str) and isinstance(reply, str):
                self.replies[key] = reply
            else:
                skipped += 1
        if skipped:
            logger.warning("judge cache %s: skipped %d unreadable line(s)", path, skipped)
        logger.info("judge cache %s: %d judgement(s) read", path, len(self.replies))
