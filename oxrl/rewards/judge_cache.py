"""The `judge` reward's memory of judgements: in memory, and optionally in a JSONL file.

A judgement is keyed by the judge's identity (endpoint or model, served name, token budget) and the
rendered judge prompt, hashed (sha256), so a file never holds the prompts themselves. The file is read
when the cache opens and appended to, one line per judgement, as judgements arrive: a run that resumes,
or one that asks again about the same completions, does not pay for them twice. A line cut short by a
crash is skipped (with a warning) when the file is read back.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from pathlib import Path

logger = logging.getLogger(__name__)


def judgement_key(identity: str, prompt: str) -> str:
    return hashlib.sha256(f"{identity}\n{prompt}".encode()).hexdigest()


class JudgementCache:
    def __init__(self, path: str | Path | None = None):
        self.path = Path(path).expanduser() if path is not None else None
        self.replies: dict[str, str] = {}
        self._lock = threading.Lock()
        if self.path is not None and self.path.exists():
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
        skipped = 0
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
                self.replies[entry["key"]] = entry["reply"]
            except (ValueError, KeyError, TypeError):
                skipped += 1
        if skipped:
            logger.warning("judge cache %s: skipped %d unreadable line(s)", path, skipped)
        logger.info("judge cache %s: %d judgement(s) read", path, len(self.replies))
