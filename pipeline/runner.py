"""The local executor of the plan (`pipeline.plan`): runs stage batches here and writes parts.

Every key is a content hash and readers keep the first record per key, so a stage that skips
the keys already written, and writes each batch as one Parquet part as soon as it is done, loses
at most the batch in flight when killed, and a resumed run reads back what an uninterrupted one
would have written. The step commands run the plan's steps on a `LocalExecutor`; `flows/` runs
the same steps on Prefect tasks and reuses `LocalExecutor` for the sequential stages.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Protocol, TypeVar

from pipeline.config import Config
from pipeline.plan import batches, pin_backend
from pipeline.stage import Stage, StageContext, StageOutput
from pipeline.stages import StageSet, load_stages
from pipeline.workspace import Run, Workspace
from schemas import Rejection

T = TypeVar("T")


# --- progress ------------------------------------------------------------------------------------


class ProgressSink(Protocol):
    """Where stage progress goes (the CLI's rich bars); stages only ever see `StageProgress`."""

    def start(self, key: int, stage: str, total: int | None) -> None: ...

    def advance(self, key: int, n: int) -> None: ...

    def finish(self, key: int) -> None: ...


_sink: ProgressSink | None = None
_keys = iter(range(1, 1 << 62))
_lock = threading.Lock()


def set_progress_sink(sink: ProgressSink | None) -> ProgressSink | None:
    """Send every stage's progress to `sink` (None: nowhere); returns the previous sink."""
    global _sink
    previous, _sink = _sink, sink
    return previous


class StageProgress:
    """Items done of one stage out of `total` (None: not known ahead), reported to the sink.

    Calling it with a count is the `progress` callback the executors' batch loops take.
    """

    def __init__(self, stage: str, total: int | None):
        with _lock:
            self.key = next(_keys)
        self.stage, self.total, self.done = stage, total, 0
        self.sink = _sink
        if self.sink is not None:
            self.sink.start(self.key, stage, total)

    def __call__(self, n: int = 1) -> None:
        self.done += n
        if self.sink is not None:
            self.sink.advance(self.key, n)

    def close(self) -> None:
        if self.sink is not None:
            self.sink.finish(self.key)
            self.sink = None

    def __enter__(self) -> StageProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- batches -------------------------------------------------------------------------------------


def write_new(run: Run, records: list, done: set[str], key: str) -> list:
    """Write the records whose key is not in `done` yet (and add them to it); returns them."""
    fresh = []
    for r in records:
        k = getattr(r, key)
        if k not in done:
            done.add(k)
            fresh.append(r)
    if fresh:
        run.write(fresh)
    return fresh


def stream_batches(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive batches of at most `size` items of a stream whose length is not known ahead."""
    it = iter(items)
    while batch := list(islice(it, max(1, size))):
        yield batch


def run_stream(stage: Stage, items: Iterable, ctx: StageContext, run: Run, *, size: int,
               done: set[str], done_rejections: set[str]) -> Counter[str]:
    """Run `stage` over a stream (sources read as they go), writing only keys not yet written.

    A source cannot say what is pending before it is read, so resume happens after the stage:
    records whose key is in `done` (rejections: `done_rejections`) are counted `existing` and
    not written again. Counts: the stage's own, plus `written`, `existing` and `rejections`.
    """
    counts: Counter[str] = Counter(written=0, existing=0, rejections=0)
    for batch in stream_batches(items, size):
        out = stage.run(batch, ctx)
        fresh = write_new(run, out.records, done, stage.output.KEY)
        counts["written"] += len(fresh)
        counts["existing"] += len(out.records) - len(fresh)
        counts["rejections"] += len(write_new(run, out.rejections, done_rejections,
                                              Rejection.KEY))
        counts.update(out.counts)
    return counts


def write_output(run: Run, out: StageOutput) -> None:
    """One batch's records and rejections, one part each."""
    run.write(out.records)
    run.write(out.rejections)


# --- the local executor --------------------------------------------------------------------------


def _ticking(items: Iterable[T], progress: Callable[[int], None]) -> Iterator[T]:
    for item in items:
        progress(1)  # as each item is read, not when its batch is written
        yield item


@dataclass
class LocalExecutor:
    """Runs the plan's stage batches in this process, one after another (`pipeline.plan`).

    `rows` gets one row per stage run (label, seconds, counts): the build's per-stage table.
    `on_verdict` is called with every verdict as the verifier decides it (the CLI's --json).
    """

    ws: Workspace
    cfg: Config
    backend: str
    stages: StageSet
    run: Run
    on_verdict: Callable[[Any], None] | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    _done: dict[type, set[str]] = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        return self.run.run_id

    def write(self, records: list) -> int:
        """Write the records whose key is not in the workspace yet; returns how many."""
        if not records:
            return 0
        cls = type(records[0])
        if cls not in self._done:
            self._done[cls] = self.ws.done_keys(cls)
        return len(write_new(self.run, records, self._done[cls], cls.KEY))

    def stream(self, stage: str, read: Callable[[], Iterable[Any]], ctx: StageContext
               ) -> Counter[str]:
        """A source stream through a sequential stage (see `run_stream`)."""
        st, t0 = self.stages.stage(stage), time.perf_counter()
        with StageProgress(stage, None) as progress:
            counts = run_stream(st, _ticking(read(), progress), ctx, self.run,
                                size=st.batch_size(self.cfg),
                                done=self.ws.done_keys(st.output),
                                done_rejections=self.ws.done_keys(Rejection))
        counts[st.output.TABLE] = counts.pop("written")
        self._row(stage, t0, counts)
        return counts

    def sequential(self, stage: str, items: list, ctx: StageContext) -> Counter[str]:
        """Batches in order, on the stage's pool (opened once for all of them)."""
        st, t0 = self.stages.stage(stage), time.perf_counter()
        groups = batches(items, st.batch_size(self.cfg))
        with st.pool(self.cfg) as pool:
            ctx.pool = pool
            counts = self._run(stage, st, groups, [ctx] * len(groups))
        self._row(stage, t0, counts, items=len(items))
        return counts

    def map(self, label: str, stage: str, groups: list[list], contexts: list[StageContext]
            ) -> Counter[str]:
        """Independent batches, here, one after another."""
        st, t0 = self.stages.stage(stage), time.perf_counter()
        counts = self._run(label, st, groups, contexts)
        self._row(label, t0, counts, items=sum(len(g) for g in groups))
        return counts

    def _run(self, label: str, st: Stage, groups: list[list], contexts: list[StageContext]
             ) -> Counter[str]:
        counts: Counter[str] = Counter({st.output.TABLE: 0, "rejections": 0})
        with StageProgress(label, sum(len(g) for g in groups)) as progress:
            for batch, ctx in zip(groups, contexts, strict=True):
                if self.on_verdict is not None and st.output.TABLE == "verdicts":
                    ctx.progress = self.on_verdict
                out = st.run(batch, ctx)
                counts.update(out.counts)
                counts[st.output.TABLE] += self.write(out.records)
                counts["rejections"] += self.write(out.rejections)
                progress(len(batch))
        return counts

    def _row(self, label: str, t0: float, counts: Counter[str], **extra: int) -> None:
        self.rows.append({"stage": label, "seconds": round(time.perf_counter() - t0, 2),
                          **extra, **counts})


def local_executor(ws: Workspace, cfg: Config, *, stages: str | None = None,
                   on_verdict: Callable[[Any], None] | None = None) -> LocalExecutor:
    """A local executor on a new run of `ws`, with the config's backend pinned (what a step
    command runs its step on)."""
    st = load_stages(stages)
    cfg, backend = pin_backend(cfg, st)
    return LocalExecutor(ws, cfg, backend, st, ws.new_run(), on_verdict=on_verdict)
