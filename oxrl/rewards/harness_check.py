"""Phase 2 of the code harness, run in the sandbox: each test's asserts against the program's values; no program code.

Standard library only: `code_harness` runs `harness_codec.py` + this file as the sandboxed program,
with one JSON object on stdin: {"nonce": str, "tests": [{"imports": source, "checks": [expression,
...], "records": phase 1's output}, ...]}. A check is one assert's condition with each call into the
program replaced by `_oxrl_probe(k)`, which returns the value phase 1 recorded for probe k, decoded
into builtin and standard-library types: the comparison, `math.isclose`, `sorted`, `set` are the
real ones, and no object of the program's takes part. The records are untrusted (the program can
write them): a malformed, missing or repeated record fails the probe it names, and so the test
whose assert needs it.

For each test it writes "<nonce> <index> pass" when phase 1 says the program ran to its end and
every check is true, else "<nonce> <index> fail <why>", on the stdout it started with; what the
checks print goes to stderr. The nonce is fresh per call and only this process is given it, so
nothing else can write a verdict that the parent accepts.
"""

import builtins
import os

# In the sandbox this file runs after harness_codec.py's source, which defines these; imported as a
# module (tests), it takes them from there.
if "decode" not in globals():
    from oxrl.rewards.harness_codec import PROBE_FUNCTION, decode

MAX_PROBES_DIGITS = 6  # a record's probe number; longer is not a record


class ProbeFailed(Exception):
    """The program gave no usable value for a call the assert needs."""


def read_records(text: str) -> tuple[bool, dict[int, str | None]]:
    """(whether the program ran to its end, probe number -> its encoded value or None when it failed)."""
    ran, values, repeated = False, {}, set()
    for line in text.splitlines():
        if line == "R":
            ran = True
            continue
        kind, _, rest = line.partition(" ")
        number, _, payload = rest.partition(" ")
        if kind not in ("V", "E") or not (number.isascii() and number.isdigit() and len(number) <= MAX_PROBES_DIGITS):
            continue  # not a record: something else the program wrote
        index = int(number)
        if index in values:
            repeated.add(index)
        values[index] = payload if kind == "V" else None
    for index in repeated:
        values[index] = None  # two claims for one call: neither counts
    return ran, values


def probe_lookup(values: dict[int, str | None]):
    def probe(index: int):
        payload = values.get(index)
        if payload is None:
            raise ProbeFailed(f"call {index} into the program gave no value")
        return decode(payload)  # afresh for every lookup, as the program's call would return a fresh value

    return probe


def judge(test: dict) -> str:
    """'pass', or 'fail <why>'."""
    ran, values = read_records(test["records"])
    if not ran:
        return "fail the program did not run to its end"
    namespace = {"__builtins__": builtins, PROBE_FUNCTION: probe_lookup(values)}
    try:
        exec(compile(test["imports"], "test", "exec"), namespace)
        for check in test["checks"]:
            if not eval(compile(check, "test", "eval"), namespace):
                return "fail an assert is false"
    except Exception as error:  # a probe without a value, or the assert itself raised: the test fails
        return f"fail {type(error).__name__}"
    return "pass"


def main() -> None:
    import json
    import sys

    request = json.loads(sys.stdin.read())
    verdicts = os.dup(1)
    os.dup2(2, 1)  # from here on, fd 1 (and print) is stderr: verdicts have a descriptor of their own
    for index, test in enumerate(request["tests"]):
        os.write(verdicts, f"{request['nonce']} {index} {judge(test)}\n".encode())


if __name__ == "__main__":
    main()
