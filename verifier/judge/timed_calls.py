"""The worker's side of timing: it measures nothing (the judge's clock owns the runtime,
`verifier.judge.clock`), it serves the judge's timed windows on the inputs the judge writes into the
shared arena, and it records which aten ops every call ran. A process that never runs candidate
code uses `baselines` to time the reference the judge's way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from verifier.judge.op_trace import OpNames


def serve_timed_windows(job: dict[str, Any], new: Any, backend: Any) -> set[str]:
    """Serve the judge's timed windows (`verifier.judge.clock`) on the inputs it writes into the
    shared arena; the aten ops the timed calls ran (every call traced, as in the trials).
    Nothing is measured here: the judge's clock owns the runtime."""
    from verifier.judge.arena import Arena, fill, views
    from verifier.judge.clock import open_worker_pipes, serve_windows

    spec = job.get("arena")
    pipes = open_worker_pipes() if spec else None
    if spec is None or pipes is None:  # no judge for this run: it gets no runtime
        return set()
    arena = Arena.attach(spec.get("path") or job["arena_fd"], int(spec["nbytes"]),
                         backend.device())
    try:
        sets = [views(arena, layout) for layout in spec["sets"]]
        slots = [views(arena, layout) for layout in spec["outs"]]
        with OpNames() as ops:
            serve_windows(pipes, new, sets, lambda i, out: fill(slots[i], out),
                          backend.synchronize)
        sets = slots = None
    finally:
        arena.close()
    return ops


def baselines(res: Any, job: dict[str, Any], backend: Any, ref: Any,
               make_inputs: Callable[[int], list[Any]]) -> None:
    """Eager (and torch.compile) baselines timed as the judge times candidates
    (`time_reference`); only a process that never ran candidate code runs
    this (a fresh sandboxed child; on a GPU the referee)."""
    opts = job["options"]
    try:
        res.data.update(time_reference(
            ref, make_inputs, backend.synchronize,
            bool(opts.get("torch_compile_baseline")) and backend.torch_compile_supported(),
            int(job.get("arena_budget") or 16 << 20)))
    except Exception as exc:  # a reference that cannot be timed is the task's problem
        res.finish("task_error", f"timing the reference failed: {type(exc).__name__}: {exc}")


def time_reference(ref: Any, make_inputs: Callable[[int], list[Any]],
                   synchronize: Callable[[], None], torch_compile: bool = False,
                   budget_bytes: int = 16 << 20) -> dict[str, Any]:
    """Eager (and torch.compile) baselines of the reference module `ref`, timed as the judge
    times candidates (as many input sets as its arena would hold, every call under the same
    op recorder); only a process that never ran candidate code calls this."""
    import torch

    from verifier.judge.arena import fill, plan
    from verifier.judge.clock import time_windows
    from verifier.judge.tensors import clone
    from verifier.judge.window_judge import sets_for

    draws = [10_000]
    sample = make_inputs(draws[0])
    with torch.no_grad():
        first = ref(*sample)
    pool = sets_for(plan(sample)[1], plan(first)[1], budget_bytes)
    sets: list[list[Any]] = [sample]

    def refresh(n: int) -> None:  # fresh inputs for every window, drawn outside the clock
        draws[0] += pool
        sets[:] = [make_inputs(draws[0] + i) for i in range(max(1, min(n, pool)))]

    scratch = clone(first)
    keep = lambda out: fill(scratch, out)  # noqa: E731 - the output copied once
    with torch.no_grad(), OpNames():
        eager = time_windows(ref, sets, refresh, synchronize, keep, pool)
        figures = {"eager_us": eager["runtime_us"], "eager_iqr_us": eager["iqr_us"],
                   "eager_windows": {**eager, "sets": pool}}
        if torch_compile:
            compiled = time_windows(torch.compile(ref), sets, refresh, synchronize, keep, pool)
            figures.update(compiled_us=compiled["runtime_us"], compiled_windows=compiled)
    return figures
