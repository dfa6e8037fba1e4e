"""The worker's side of timing: it measures nothing (the judge's clock owns the runtime,
`verifier.judge.clock`), it serves the judge's timed windows on the inputs the judge writes into the
shared arena, and it records which aten ops every call ran. A process that never runs candidate
code serves the same windows with the reference as its forward (`serve_baseline`: the eager and
torch.compile baselines by the candidates' very method, cpu), or times the reference itself
(`baselines`: where no judge maps its arena, and the GPU referee)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from verifier.judge.op_trace import OpNames


def serve_timed_windows(job: dict[str, Any], new: Any, backend: Any,
                        report: bytes = b"") -> set[str]:
    """Serve the judge's timed windows (`verifier.judge.clock`) on the inputs it writes into the
    shared arena; the aten ops the timed calls ran (every call traced, as in the trials).
    Nothing is measured here: the judge's clock owns the runtime. `report`: the trials' report,
    sent with "t" (`verifier.judge.clock_serve.serve_windows`)."""
    from verifier.judge.arena import Arena, views
    from verifier.judge.clock_serve import open_worker_pipes, serve_windows

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
            serve_windows(pipes, new, sets, slot_filler(slots), backend.synchronize,
                          report)
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
    a copy of memory onto itself) that the judge deducts all the same (`verifier.judge.clock`), up to
    half a window; no honest kernel knows where its slot is (an output that is a view of its
    input, in the arena's input sets, is copied as any other)."""
    from verifier.judge.arena import fill
    from verifier.judge.clock_serve import RefusedOutput

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


def serve_baseline(res: Any, job: dict[str, Any], backend: Any, ref: Any,
                   make_inputs: Callable[[int], list[Any]]) -> None:
    """The reference (`baseline_forward` "compiled": its torch.compile) served to the judge's
    timed windows exactly as a candidate's forward is (`serve_timed_windows`): cross-process
    fresh inputs, one output copy per call, the same deduction, so a speedup compares two
    figures of one method; only a process that never ran candidate code runs this."""
    import torch

    forward = torch.compile(ref) if job.get("baseline_forward") == "compiled" else ref
    try:
        with torch.no_grad():
            for k in range(2):  # warm (compiled: the compile), as a candidate after its trials
                forward(*make_inputs(k))
            backend.synchronize()
            serve_timed_windows(job, forward, backend)
    except Exception as exc:  # a reference that cannot be timed is the task's problem
        res.finish("task_error", f"timing the reference failed: {type(exc).__name__}: {exc}")


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


def reference_sizes(ref: Any, make_inputs: Callable[[int], list[Any]]) -> dict[str, int]:
    """One input set's bytes and one output's, as the judge's arena lays them out (`plan`): the
    reference called once, nothing timed (what a GPU slot needs to choose how a baseline is
    timed, `verifier.run.gpu_runner.GpuRunner.baseline`)."""
    import torch

    from verifier.judge.arena import plan

    sample = make_inputs(10_000)
    with torch.no_grad():
        out = ref(*sample)
    return {"set_bytes": plan(sample)[1], "out_bytes": plan(out)[1]}


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
    del sample

    def refresh(n: int) -> None:  # fresh inputs for every window, drawn outside the clock
        draws[0] += pool
        sets.clear()  # the last window's sets go first: a GB-sized set is held once
        sets.extend(make_inputs(draws[0] + i) for i in range(max(1, min(n, pool))))

    scratch = clone(first)
    del first
    keep = lambda out: fill(scratch, out)  # noqa: E731 - the output copied once
    with torch.no_grad(), OpNames():
        eager = time_windows(ref, sets, refresh, synchronize, keep, pool)
        figures = {"eager_us": eager["runtime_us"], "eager_iqr_us": eager["iqr_us"],
                   "eager_windows": {**eager, "sets": pool, "set_bytes": plan(sets[0])[1],
                                     "out_bytes": plan(scratch)[1]}}
        if torch_compile:
            compiled = time_windows(torch.compile(ref), sets, refresh, synchronize, keep, pool)
            figures.update(compiled_us=compiled["runtime_us"], compiled_windows=compiled)
    return figures
