"""The one runner: what is pending, resuming by content hash, batching, writing parts.

Every key is a content hash and readers keep the first record per key, so a stage that skips
the keys already written, and writes each batch as one Parquet part as soon as it is done, loses
at most the batch in flight when killed, and a resumed run reads back what an uninterrupted one
would have written. The CLI's `run_*` commands call this module directly; `flows/` calls the
same pending functions and `Stage.run` inside Prefect tasks.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Protocol, TypeVar

from pipeline.config import GenerateConfig
from pipeline.stage import Stage, StageContext, StageOutput
from pipeline.workspace import Run, Workspace
from schemas import Candidate, Rejection, Task, Verdict
from verifier.protocol import CORRECT_STATUSES

T = TypeVar("T")

GENERATOR_PREFIX = {"template": "template:", "openai": "llm:", "hf": "hf:"}


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

    Calling it with a count is the `progress` callback `run_batches` and the stage loops take.
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


def batches(items: list[T], size: int) -> list[list[T]]:
    """Consecutive batches of at most `size` items (the unit of work and of writing)."""
    size = max(1, size)
    return [items[i:i + size] for i in range(0, len(items), size)]


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


def run_batches(stage: Stage, items: list, ctx: StageContext, run: Run, *, size: int,
                progress: Callable[[int], None] | None = None) -> Counter[str]:
    """Run `stage` over `items` batch by batch, writing each batch's records and rejections."""
    counts: Counter[str] = Counter()
    for batch in batches(items, size):
        out = stage.run(batch, ctx)
        write_output(run, out)
        counts.update(out.counts)
        if progress is not None:
            progress(len(batch))
    return counts


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


# --- what is pending -----------------------------------------------------------------------------


def generate_pending(ws: Workspace, tasks: list[Task], backend: str, cfg: GenerateConfig,
                     names: dict[str, str] | None = None) -> dict[str, list[Task]]:
    """For each configured generator, the `tasks` it still owes an answer on `backend`.

    The one notion of "pending" for first attempts (the generate flow; the CLI's `run_generate`
    for LLM groups, while it offers templates every task again). `template`: a task is answered
    by a template candidate or a generate rejection (`no_template`, ...). `openai`/`hf`: by `cfg.samples` candidates of that generator
    (`names[gen]`: its exact generator name, e.g. `llm:coder`, else any of its kind); a rejection
    for an unreachable LLM is no answer, so the next run asks again. `import` owes every task (its
    file is read whole and candidate ids dedupe); `mutate` needs verdicts and has no entry.
    """
    names = names or {}
    cands = ws.read_table(Candidate).select(["task_id", "backend", "turn", "generator"]).to_pylist()
    rejs = ws.read_table(Rejection).select(["stage", "item_id", "reason"]).to_pylist()
    rejected = {r["item_id"] for r in rejs
                if r["stage"] == "generate" and not r["reason"].startswith("llm")}
    have: Counter[tuple[str, str]] = Counter()
    for c in cands:
        if c["backend"] != backend or c["turn"] != 0:
            continue
        for gen, prefix in GENERATOR_PREFIX.items():
            name = names.get(gen)
            if c["generator"] == name if name else c["generator"].startswith(prefix):
                have[(c["task_id"], gen)] += 1
    pending: dict[str, list[Task]] = {}
    for gen in cfg.generators:
        if gen == "template":
            pending[gen] = [t for t in tasks
                            if not have[(t.task_id, gen)] and t.task_id not in rejected]
        elif gen in GENERATOR_PREFIX:
            pending[gen] = [t for t in tasks if have[(t.task_id, gen)] < cfg.samples]
        elif gen == "import":
            pending[gen] = list(tasks)
    return pending


def tasks_pending_generation(tasks: list[Task], pending: dict[str, list[Task]]) -> list[Task]:
    """The `tasks` some per-task generator still owes, in order (a flow batch runs them all).

    `import` counts only when it is the only generator: its file is read whole on every run.
    """
    owing = [g for g in pending if g != "import"] or list(pending)
    ids = {t.task_id for g in owing for t in pending[g]}
    return [t for t in tasks if t.task_id in ids]


def unverified(ws: Workspace, backend: str | None = None) -> list[Candidate]:
    """Candidates (of `backend`, or all) that have no verdict yet, in workspace order."""
    done = ws.done_keys(Verdict)
    return [c for c in ws.read(Candidate) if c.candidate_id not in done
            and (backend is None or c.backend == backend)]


def unverified_chain_ends(candidates: list[Candidate], verdicts: list[Verdict],
                          tasks: dict[str, Task], turn: int) -> list[Candidate]:
    """Chain ends at `turn - 1` still waiting for a verdict (e.g. fresh mutations).

    A repair turn verifies these first: an end without a verdict cannot be judged failing.
    """
    judged = {v.candidate_id for v in verdicts}
    return [c for c in candidates if c.turn == turn - 1
            and c.candidate_id not in judged and c.task_id in tasks]


def chains_by_task(ws: Workspace, backend: str
                   ) -> tuple[dict[str, Task], dict[str, list[Candidate]], list[Verdict]]:
    """Tasks, their candidates on `backend` grouped by task, and all verdicts."""
    tasks = {t.task_id: t for t in ws.read(Task)}
    by_task: dict[str, list[Candidate]] = {}
    for c in ws.read(Candidate):
        if c.backend == backend and c.task_id in tasks:
            by_task.setdefault(c.task_id, []).append(c)
    return tasks, by_task, ws.read(Verdict)


def task_batches(tasks: dict[str, Task], by_task: dict[str, list[Candidate]],
                 verdicts: list[Verdict], size: int
                 ) -> Iterator[tuple[list[Task], list[Candidate], list[Verdict]]]:
    """Batches of whole tasks (all their candidates and verdicts), about `size` candidates each."""
    vmap = {v.candidate_id: v for v in verdicts}
    batch_t: list[Task] = []
    batch_c: list[Candidate] = []
    for tid in sorted(by_task):
        batch_t.append(tasks[tid])
        batch_c.extend(by_task[tid])
        if len(batch_c) >= size:
            yield batch_t, batch_c, [vmap[c.candidate_id] for c in batch_c
                                     if c.candidate_id in vmap]
            batch_t, batch_c = [], []
    if batch_t:
        yield batch_t, batch_c, [vmap[c.candidate_id] for c in batch_c if c.candidate_id in vmap]


def mutation_pending(by_task: dict[str, list[Candidate]], verdicts: list[Verdict]
                     ) -> dict[str, list[Candidate]]:
    """Tasks with a correct first-attempt kernel that has no mutant yet, or whose mutants all
    verified correct (the mutate stage retries those with other kinds, up to its cap)."""
    status = {v.candidate_id: v.status for v in verdicts}
    mutants: dict[str, list[str]] = {}  # source kernel -> its mutants' ids
    for cs in by_task.values():
        for c in cs:
            if c.generator.startswith("mutate:"):
                source = str(c.meta_dict().get("fix_candidate_id", ""))
                mutants.setdefault(source, []).append(c.candidate_id)

    def open_kernel(c: Candidate) -> bool:
        if status.get(c.candidate_id) not in CORRECT_STATUSES:
            return False
        if c.generator.startswith(("mutate:", "repair:")):
            return False
        return all(status.get(m) in CORRECT_STATUSES for m in mutants.get(c.candidate_id, []))

    return {tid: cs for tid, cs in by_task.items() if any(open_kernel(c) for c in cs)}


def repair_pending(by_task: dict[str, list[Candidate]], verdicts: list[Verdict], turn: int
                   ) -> tuple[dict[str, list[Candidate]], set[str]]:
    """Tasks with a failing chain end at `turn - 1` and no follow-up yet; the answered parents."""
    vmap = {v.candidate_id: v for v in verdicts}
    has_child = {c.parent_id for cs in by_task.values() for c in cs if c.parent_id}
    todo = {tid: cs for tid, cs in by_task.items()
            if any(c.turn == turn - 1 and c.candidate_id in vmap
                   and vmap[c.candidate_id].status not in CORRECT_STATUSES
                   and c.candidate_id not in has_child for c in cs)}
    return todo, has_child
