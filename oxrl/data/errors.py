"""The one error type for bad input data: it names the file, the row and the field."""

from __future__ import annotations


class DataError(ValueError):
    """A problem with the input data, located as precisely as we can.

    The message reads `data/x.jsonl, row 12, field 'answer': expected a string, got null`; `row`
    (1-based) and `field` are None when the problem is with the whole file or the whole row.
    """

    def __init__(self, path: str, row: int | None, field: str | None, problem: str):
        self.path = path
        self.row = row
        self.field = field
        self.problem = problem
        location = [str(path)]
        if row is not None:
            location.append(f"row {row}")
        if field is not None:
            location.append(f"field {field!r}")
        super().__init__(f"{', '.join(location)}: {problem}")

    def __reduce__(self):  # keep the four arguments through pickling (multiprocessing, DataLoader workers)
        return (type(self), (self.path, self.row, self.field, self.problem))
