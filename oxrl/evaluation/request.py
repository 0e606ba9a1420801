"""`oxrl eval`'s arguments, checked before anything heavy is imported: a bad flag is one line in well under a
second, not after torch's import (the evaluation itself is run.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class EvalRequest:
    """`oxrl eval`'s arguments (None: the config's value)."""

    model: str
    baseline: str | None = None
    config: str | None = None
    task: str | None = None
    data: list[str] = field(default_factory=list)
    rewards: list[str] = field(default_factory=list)
    n: int = 1
    temperature: float | None = None
    max_new_tokens: int | None = None
    limit: int | None = None
    engine: str | None = None
    seed: int | None = None
    out: str | None = None
    video: str | None = None  # a `vla` config's greedy episodes as a GIF (else `<run dir>/eval_episodes.gif`)
    overrides: list[str] = field(default_factory=list)
    # Run what a run directory's saved config.yaml names as code (extensions, reward and environment files, ...):
    # off, as that config is data anyone may have written (oxrl/config/trust.py); --config and --set are the user's.
    trust_config_code: bool = False

    def __post_init__(self) -> None:
        for flag, value, least in (("--n", self.n, 1), ("--limit", self.limit, 1),
                                   ("--max-new-tokens", self.max_new_tokens, 1), ("--temperature", self.temperature, 0)):
            if value is not None and not value >= least:
                raise ValueError(f"{flag} must be at least {least}, got {value}")
        if self.video is not None and (not self.video.lower().endswith(".gif") or Path(self.video).is_dir()):
            raise ValueError(f"--video {self.video}: name the .gif file to write")
        if self.task is not None and self.data:
            raise ValueError("give --task or --data, not both: they are two sources of prompts")
