"""Phase 1 of the code harness, run in the sandbox: the program, then the test's calls to it; never the test itself.

Standard library only: `code_harness` runs `harness_codec.py` + this file as the sandboxed program.
It reads one JSON object from stdin, {"program": source, "imports": source, "probes": [expression,
...], "own_names": [name or null, ...]}: the program, the test's import statements, the test's calls
into the program (`add(1, 2)`, `Solution().solve([3, 1])`) and, per call, the builtin name it calls
that the program must define itself (a task that shadows `max`: without its own `max`, the call
fails rather than reach the builtin). Never an assert, never an expected value: there is nothing here for the
program to read them from. It runs the program as `__main__` in a fresh namespace (a SystemExit with
status 0 or None from its top level ends it normally), runs the imports there, evaluates each probe
and writes to the stdout it started with, one line each:

    R              the program's top level ran to its end
    V <k> <json>   probe k's value (harness_codec's format: plain data only)
    E <k> <why>    probe k raised, or its value is not plain data; `E <k> TooLarge`: its record would
                   take the output past `max_bytes` (the sandbox's `max_output_bytes`, all that is read back)

The program's own prints go to stderr. The program runs in this process, so it can write such lines
itself, or stop this script; that gains it nothing: a line is only a claim of what the program
computed, it never saw what the claim will be compared with, and the comparison happens in a process
it never runs in (`harness_check.py`).
"""

import builtins
import os

# In the sandbox this file runs after harness_codec.py's source, which defines these; imported as a
# module (tests), it takes them from there.
if "encode" not in globals():
    from oxrl.rewards.harness_codec import NotPlainData, encode

RECORD_RESERVE = 32  # bytes: more than any `E <k> <why>` line


def run_program(source: str, namespace: dict) -> bool:
    """Whether the program's top level ended normally (SystemExit with status 0 or None included)."""
    try:
        exec(compile(source, "solution.py", "exec"), namespace)
    except SystemExit as stop:
        # An exact int: a status object of the program's could answer `== 0` any way it likes.
        return stop.code is None or (type(stop.code) in (int, bool) and stop.code == 0)
    except BaseException:  # the program failed: every probe fails, which the missing R line says
        return False
    return True


def evaluate(index: int, source: str, namespace: dict) -> str:
    try:
        return f"V {index} {encode(eval(compile(source, 'test', 'eval'), namespace))}"
    except NotPlainData:
        return f"E {index} NotPlainData"
    except BaseException as error:  # SystemExit and KeyboardInterrupt too: they fail this probe only
        name = type(error).__name__
        return f"E {index} {name if name.isidentifier() else 'Exception'}"


def main() -> None:
    import json
    import sys

    request = json.loads(sys.stdin.read())
    records = os.dup(1)
    os.dup2(2, 1)  # from here on, fd 1 (and print) is stderr: the records have a descriptor of their own

    room = [request["max_bytes"]]

    def emit(line: str, index: int = -1) -> None:
        data = (line + "\n").encode("utf-8", "backslashreplace")
        # Room is kept for a short record of every probe after this one, so that each still gets a line.
        if len(data) > room[0] - RECORD_RESERVE * (len(request["probes"]) - index - 1):
            data = f"E {index} TooLarge\n".encode()
        room[0] -= len(data)
        os.write(records, data)

    namespace = {"__name__": "__main__", "__builtins__": builtins}
    if not run_program(request["program"], namespace):
        return
    emit("R")
    try:
        exec(compile(request["imports"], "test", "exec"), namespace)
    except BaseException as error:  # the test's imports failed: so does every probe
        for index in range(len(request["probes"])):
            emit(f"E {index} {type(error).__name__}", index)
        return
    for index, source in enumerate(request["probes"]):
        own = request["own_names"][index]
        if own is not None and own not in namespace:
            emit(f"E {index} NameError", index)  # the builtin of that name is not the program's answer
        else:
            emit(evaluate(index, source, namespace), index)


if __name__ == "__main__":
    main()
    # Now, not at interpreter exit: atexit handlers or threads the program left cannot hold the run
    # until its timeout (which would fail this test and skip the program's remaining ones).
    os._exit(0)
