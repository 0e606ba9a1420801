"""The one error type the command line prints as one line, and the stop a signal asks for.

A `UserError` says everything a user needs (what is wrong, in which file or setting, and what to do),
so `oxrl` prints its message and exits 2, with no traceback. Each layer keeps its own subclasses beside
the code that raises them; this module imports nothing of oxRL's, so that catching them loads none of that code.
`RunStopped` is how a run stopped by SIGTERM or Ctrl-C leaves it (oxrl/training/signals.py raises it; the run's
log and the CLI report it), here so that the lowest layers can name it.
"""

import signal
from pathlib import Path


class UserError(Exception):
    """An input or set-up problem whose message is the whole story (exit 2, one line)."""


# What the command line reports as the user's own mistake, in one line and never as a possible bug: a UserError, a
# missing file, and a ValueError (config and data errors, ConfigError and DataError, are ValueErrors).
USER_ERRORS = (UserError, FileNotFoundError, ValueError)


class RunStopped(BaseException):
    """A run stopped by SIGTERM or SIGINT. A BaseException, like KeyboardInterrupt, so that no `except Exception`
    on the way up takes it for a failure to handle."""

    def __init__(self, signum: int, step: int | None = None, checkpoint: Path | None = None):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        self.run_dir: Path | None = None  # set on the way out of the run (oxrl/logging/run_log.py)
        where = f"after step {step}" if step is not None else "at once"
        saved = f", checkpoint {checkpoint}" if checkpoint is not None else ""
        super().__init__(f"stopped by {signal.Signals(signum).name} {where}{saved}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM
