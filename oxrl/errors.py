"""The one error type the command line prints as one line.

A `UserError` says everything a user needs (what is wrong, in which file or setting, and what to do),
so `oxrl` prints its message and exits 2, with no traceback. Each layer keeps its own subclasses beside
the code that raises them; this module imports nothing, so that catching them loads none of that code.
"""


class UserError(Exception):
    """An input or set-up problem whose message is the whole story (exit 2, one line)."""


# What the command line reports as the user's own mistake, in one line and never as a possible bug: a UserError, a
# missing file, and a ValueError (config and data errors, ConfigError and DataError, are ValueErrors).
USER_ERRORS = (UserError, FileNotFoundError, ValueError)
