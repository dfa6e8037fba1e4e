"""The worker's side of timing: it measures nothing (the judge's clock owns the runtime,
`verifier.clock`), it serves the judge's timed windows on the inputs the judge writes into the
shared arena, and it records which aten ops every call ran. A process that never runs candidate
code uses `baselines` to time the reference the judge's way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LABEL = "ks-candidate"  # the candidate's own calls in a profile that also holds others


class OpNames:
    """The names of the aten ops run inside it (only those under `LABEL`, when `label`),
    recorded by torch's profiler: its C++ record hooks cost ~nothing per op, where a Python
    dispatch mode costs ~15 us, so every timed call can be traced without slowing it."""

    def __init__(self, label: bool = False) -> None:
        self.label = label

    def __enter__(self) -> set[str]:
        import torch

        self.names: set[str] = set()
        self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        self.prof.__enter__()
        return self.names

    def __exit__(self, *exc: Any) -> None:
        self.prof.__exit__(*exc)
        for e in self.prof.events():
            if not e.name.startswith("aten::"):
                continue
            parent = e.cpu_parent
            while self.label and parent is not None and parent.name != LABEL:
                parent = parent.cpu_parent
            if not self.label or parent is not None:
                self.names.add(e.name)


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
