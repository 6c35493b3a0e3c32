"""The processes the testbed starts (switches, agents, the controller): started with their
output in a log file of the run directory, checked while waiting for them to come up, and
stopped by PID, never by name.

Each one runs in a session of its own (Ctrl-C at the terminal reaches only the testbed, which
then stops them in order) and gets SIGTERM if the testbed process dies before stopping it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from testbed.errors import UserError

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


class ComponentError(UserError):
    """A component did not come up: the message names it and ends with its log's tail."""

    def __init__(self, name: str, what: str, log: Path | None):
        self.component = name
        tail = log_tail(log) if log is not None else ""
        msg = f"{name}: {what}"
        if log is not None:
            msg += f"\n--- last lines of {log} ---\n{tail or '(empty)'}"
        super().__init__(msg)


def log_tail(path: Path | None, lines: int = 20) -> str:
    if path is None or not path.exists():
        return ""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 16384))
        text = f.read().decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def _child_setup(nice: int) -> Callable[[], None]:
    def setup() -> None:
        # a session of its own: out of reach of the terminal's Ctrl-C, and (with the kernel's
        # autogroup scheduling) a CPU share of its own rather than a slice of the testbed's
        os.setsid()
        # SIGTERM when the testbed dies: nothing it started outlives it unnoticed
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if nice:
            os.nice(nice)
            # under autogroup scheduling nice only ranks threads within a session: the
            # session's own weight is its autogroup's nice (this new session's alone)
            try:
                with open("/proc/self/autogroup", "w") as f:
                    f.write(str(nice))
            except OSError:
                pass

    return setup


class Component:
    """One started process. `name` is what errors and progress call it."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        nice: int = 0,
    ):
        self.name = name
        self.argv = list(argv)
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                preexec_fn=_child_setup(nice),
            )  # noqa: PLW1509

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def check(self) -> None:
        """Raise ComponentError if the process has exited."""
        rc = self.proc.poll()
        if rc is not None:
            raise ComponentError(self.name, f"exited with status {rc}", self.log)

    def wait_until(
        self, ready: Callable[[], bool], timeout: float, what: str, poll: float = 0.1
    ) -> None:
        """Wait for `ready()` while the process lives; ComponentError on exit or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            self.check()
            try:
                if ready():
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ComponentError(self.name, f"not {what} after {timeout:g} s", self.log)
            time.sleep(poll)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout`. Returns the exit status."""
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def wait_all(
    components: Sequence[Component], ready: Callable[[Component], bool], timeout: float, what: str
) -> None:
    """Wait until `ready(c)` for every component; the first one that exits or is late fails
    the wait, named."""
    deadline = time.monotonic() + timeout
    pending = list(components)
    while pending:
        for c in list(pending):
            c.check()
            try:
                if ready(c):
                    pending.remove(c)
            except OSError:
                pass
        if pending and time.monotonic() > deadline:
            c = pending[0]
            raise ComponentError(c.name, f"not {what} after {timeout:g} s", c.log)
        if pending:
            time.sleep(0.1)
