"""The compilers this process is running, so a figure timed meanwhile is known to be loaded.

Every compiler and linker the verifier starts goes through `verifier.backends.run_tool`, which
counts it here while it runs. A CPU baseline timed while any of them ran shares the host's cores
with it and may come out slow (`verifier.run.baselines` re-times such a baseline once the batch's
compiles are over, and only the quiet figure is cached).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class ToolMark:
    """What was running when a span began: tools then, and how many had started by then."""

    running: int
    started: int


class ToolLoad:
    """A count of the tools running now and of every tool started so far."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = self._started = 0

    @contextmanager
    def running(self) -> Iterator[None]:
        """One tool's run."""
        with self._cond:
            self._running += 1
            self._started += 1
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()

    def mark(self) -> ToolMark:
        """The start of a span to ask `ran_since` about."""
        with self._cond:
            return ToolMark(self._running, self._started)

    def ran_since(self, mark: ToolMark) -> bool:
        """Whether any tool ran at some time between `mark` and now."""
        with self._cond:
            return bool(mark.running or self._running or self._started != mark.started)

    def wait_quiet(self, timeout_s: float) -> bool:
        """Wait until no tool runs (at most `timeout_s`); whether none does."""
        end = time.monotonic() + timeout_s
        with self._cond:
            return self._cond.wait_for(lambda: not self._running,
                                       timeout=max(0.0, end - time.monotonic()))


TOOL_LOAD = ToolLoad()  # every build of this process, whichever batch or thread runs it
