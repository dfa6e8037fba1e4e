"""The worker's side of timing: it measures nothing (the judge's clock owns the runtime,
`verifier.clock`), it serves the judge's timed windows on the inputs the judge writes into the
shared arena, and it records which aten ops every call ran. A process that never runs candidate
code uses `baselines` to time the reference the judge's way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from verifier.op_trace import OpNames


def serve_timed_windows(job: dict[str, Any], new: Any, backend: Any) -> set[str]:
    """Serve the judge's timed windows (`verifier.clock`) on the inputs it writes into the
    shared arena; the aten ops the timed calls ran (every call traced, as in the trials).
    Nothing is measured here: the judge's clock owns the runtime."""
    from verifier.arena import Arena, fill, views
    from verifier.clock import open_worker_pipes, serve_windows

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
    (`verifier.clock.time_reference`); only a process that never ran candidate code runs
    this (a fresh sandboxed child; on a GPU the referee)."""
    from verifier.clock import time_reference

    opts = job["options"]
    try:
        res.data.update(time_reference(
            ref, make_inputs, backend.synchronize,
            bool(opts.get("torch_compile_baseline")) and backend.torch_compile_supported(),
            int(job.get("arena_budget") or 16 << 20)))
    except Exception as exc:  # a reference that cannot be timed is the task's problem
        res.finish("task_error", f"timing the reference failed: {type(exc).__name__}: {exc}")
