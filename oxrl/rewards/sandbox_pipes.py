"""The sandboxed program's stdin, stdout and stderr: pipes, never descriptors of the trainer's files.

A descriptor of a host file is a handle on that file's inode: through it the program could `fchmod`
the file (when the trainer is root, the sandbox's uid owns what root owns, so it could make the file
set-uid and world-writable for the length of the call) or lock it. A pipe holds nothing on the host.
One thread per call moves the bytes (`PipedStdio.start`): it feeds the input and reads both outputs,
keeping the first `keep_bytes` of each. The program may write up to `limit_bytes` to each (the file-size
limit it had when its outputs were files); beyond that the trainer closes its end, so further writes
fail with EPIPE, and the trainer spends nothing more on them.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import threading

CHUNK = 1 << 16
EOF_WAIT_S = 5.0  # after the program ended: how long the outputs may take to reach end-of-file


class PipedStdio:
    """The pipes of one call: `popen` goes to `subprocess.Popen`, then `start`, then `finish` once it ended."""

    popen = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}

    def __init__(self, stdin: bytes, keep_bytes: int, limit_bytes: int):
        self.stdin = stdin
        self.keep_bytes = keep_bytes
        self.limit_bytes = limit_bytes
        self.kept = {"stdout": bytearray(), "stderr": bytearray()}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, process: subprocess.Popen) -> None:
        self._thread = threading.Thread(target=self._pump, args=(process,), name="oxrl-sandbox-stdio", daemon=True)
        self._thread.start()

    def finish(self) -> tuple[str, str]:
        """(stdout, stderr) as text, once the program and everything holding its outputs have ended."""
        if self._thread is not None:
            self._thread.join(EOF_WAIT_S)
            self._stop.set()  # something still holds a write end (it should not): stop reading it
            self._thread.join()
        return tuple(bytes(self.kept[name]).decode("utf-8", errors="replace") for name in ("stdout", "stderr"))

    def _pump(self, process: subprocess.Popen) -> None:
        streams = {process.stdout.fileno(): ("stdout", process.stdout), process.stderr.fileno(): ("stderr", process.stderr)}
        written = {"stdout": 0, "stderr": 0}
        pending = memoryview(self.stdin)
        with selectors.DefaultSelector() as selector:
            if pending:
                os.set_blocking(process.stdin.fileno(), False)
                selector.register(process.stdin.fileno(), selectors.EVENT_WRITE, ("stdin", process.stdin))
            else:
                process.stdin.close()
            for fd, data in streams.items():
                selector.register(fd, selectors.EVENT_READ, data)
            try:
                while selector.get_map() and not self._stop.is_set():
                    for key, _ in selector.select(timeout=0.1):
                        name, stream = key.data
                        if name == "stdin":
                            try:
                                pending = pending[os.write(key.fd, pending[:CHUNK]):]
                            except BlockingIOError:
                                continue  # the pipe filled between select and write
                            except BrokenPipeError:
                                pending = pending[:0]  # the program stopped reading: the rest is not wanted
                            done = not pending
                        else:
                            chunk = os.read(key.fd, CHUNK)
                            room = self.keep_bytes - len(self.kept[name])
                            self.kept[name] += chunk[:max(room, 0)]
                            written[name] += len(chunk)
                            done = not chunk or written[name] >= self.limit_bytes
                        if done:
                            selector.unregister(key.fd)
                            stream.close()
            finally:
                for key in list(selector.get_map().values()):
                    key.data[1].close()
