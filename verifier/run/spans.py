"""Seconds one execution slot spent in each step of a job, beside the worker's own phases
(which cover only the worker's side): the benchmarks' profile (`--profile`: `slot <step> s`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class Spans(dict):
    """step -> seconds, summed over the job's runs (a run made again adds to the same steps)."""

    @contextmanager
    def __call__(self, step: str) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            self[step] = self.get(step, 0.0) + time.monotonic() - began
