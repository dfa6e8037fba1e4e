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
    from verifier.arena import Arena, views
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
            serve_windows(pipes, new, sets, slot_filler(slots), backend.synchronize)
        sets = slots = None
    finally:
        arena.close()
    return ops


def _spans(obj: Any) -> list[tuple[int, int]]:
    """(first byte, end) of the memory every tensor in `obj` (nested lists, tuples) covers."""
    import torch

    if isinstance(obj, list | tuple):
        return [e for x in obj for e in _spans(x)]
    if not isinstance(obj, torch.Tensor) or not obj.numel():
        return []
    first, size = obj.data_ptr(), obj.element_size()
    if obj.is_contiguous():
        return [(first, first + obj.numel() * size)]
    dims = list(zip(obj.shape, obj.stride(), strict=True))
    first += sum((n - 1) * st for n, st in dims if st < 0) * size
    return [(first, first + (sum((n - 1) * abs(st) for n, st in dims) + 1) * size)]


def slot_filler(slots: list[Any]) -> Callable[[int, Any], None]:
    """`put(i, out)`: a timed call's output copied into its slot, unless it lies in the judge's
    output slots: an output computed in place in its slot makes the copy a no-op (torch skips
    a copy of memory onto itself) that the judge deducts all the same (`verifier.clock`), up to
    half a window; no honest kernel knows where its slot is (an output that is a view of its
    input, in the arena's input sets, is copied as any other)."""
    from verifier.arena import fill
    from verifier.clock import RefusedOutput

    spans = _spans(slots)  # the slots follow the input sets: one range
    lo, hi = (min(a for a, _ in spans), max(b for _, b in spans)) if spans else (0, 0)

    import torch

    def put(i: int, out: Any) -> None:
        if isinstance(out, torch.Tensor) and out.is_contiguous():  # the common case, cheaply
            first = out.data_ptr()
            inside = first < hi and lo < first + out.nbytes
        else:
            inside = any(a < hi and lo < b for a, b in _spans(out))
        if inside:
            raise RefusedOutput("a timed call returned memory of the judge's output slots "
                                "(written in place, its copy into the slot would be skipped "
                                "and still deducted)")
        fill(slots[i], out)

    return put


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
