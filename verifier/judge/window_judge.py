"""The judge's side of the timed windows (`verifier.judge.clock`): fresh inputs written into the
shared arena (`verifier.judge.arena`) right before each window; right after, the outputs of the
window's last call and of `RANDOM_CHECKS` calls chosen then (every call has its own output slot,
and which ones are checked is drawn after the worker said "d", so it must have written them all)
and every input are checked. It runs in the verifier process (cpu) or in the referee on the
worker's GPU (`verifier.judge.referee`): never in a process that runs candidate code.

On a GPU (the referee's judge, `verifier.judge.referee`) this `WindowJudge` lays out one output
slot per call in the device arena, draws the checked calls after "d" and clones their slots
before any reference runs (a device arena has no pull; the clone is the snapshot). The GPU form
of the fill attack is a persistent kernel launched before "t" that spins on the arena's input
sets and computes as they land; no cpu meter sees device time. The judge therefore draws a
window's inputs in its own memory (staging no worker maps) and publishes them with one burst of
device copies at the end of its fill, right before "w": the inputs exist in the arena only for
the time of that burst (a copy of the window's inputs at device bandwidth), so that is all such a
kernel can overlap, where it had the whole fill (the draws) before. Closing that last gap would
put the publish inside the timed window with its time deducted as `copy_s` is (the deduction
is then again what a kernel can overlap), or meter the device by the run's own kernels (CUPTI
in the referee): left open, bounded by the burst and the physics floor. A window's deep check
clones every slot where they fit in DEEP_CLONE_BYTES.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from verifier.judge import decide
from verifier.judge.arena import ALIGN, Arena, fill, plan, views
from verifier.judge.construct import DEVICE
from verifier.judge.tensors import clone, same

POOL_MAX = 256  # input sets a window cycles over, each fresh for every window; a window has
# no more calls than sets (`verifier.judge.clock`), so no call repeats a set a cache could answer
COPY_PROBE_BYTES = 256 << 20  # the largest output copy the judge times as it is
_COPIES: dict[tuple[str, int, int], float] = {}  # (device, output bytes, slots) -> fastest


def fastest_copy(device: str, out_bytes: int, measured: float, slots: int = 1) -> float:
    """The fastest output copy this process has timed for `out_bytes` on `device` (into one of
    `slots` cold destinations): the copy is deducted once per timed call (at most half a
    window), so a copy timed while something else loaded the host or the device (a concurrent
    run, a kernel still running on the GPU) must not lower a later candidate's runtime; load
    only ever slows a copy."""
    key = (device, int(out_bytes), int(slots))
    _COPIES[key] = min(measured, _COPIES.get(key, measured))
    return _COPIES[key]


def cold_copy_s(nbytes: int, slots: int, passes: int = 5) -> float:
    """Seconds per copy of `nbytes` from one hot buffer into `slots` distinct destinations of a
    shared file mapping, cycled: the fastest of `passes` timed passes (one untimed first)."""
    import ctypes
    import mmap
    import os

    import torch

    size = max(1, int(nbytes))
    stride = -(-size // ALIGN) * ALIGN
    slots = max(1, int(slots))
    fd = os.memfd_create("ks-copy-probe", os.MFD_CLOEXEC)  # never shown to a worker
    try:
        os.ftruncate(fd, slots * stride)
        mm = mmap.mmap(fd, slots * stride, flags=mmap.MAP_SHARED,
                       prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    try:
        dst = torch.frombuffer(mm, dtype=torch.uint8, count=slots * stride)
        base, src = dst.data_ptr(), torch.ones(size, dtype=torch.uint8)
        move, first = ctypes.memmove, src.data_ptr()
        best = float("inf")
        for k in range(passes + 1):
            t0 = time.perf_counter()
            for i in range(slots):
                move(base + i * stride, first, size)
            if k:
                best = min(best, (time.perf_counter() - t0) / slots)
        del dst
    finally:
        mm.close()
    return best


RANDOM_CHECKS = 2  # calls besides the last whose outputs the judge checks, drawn after "d"
DEEP_CLONE_BYTES = 64 << 20  # a device window's deep check clones every slot up to this
DEEP_CHECKS = 48  # calls a deep check compares besides the last, drawn after "d" (a window
# that skipped a tenth of its calls passes 48 draws 0.6% of the time; each is a reference call)


def sets_for(set_bytes: int, out_bytes: int, budget_bytes: int) -> int:
    """How many input sets (each with its call's output slot) a window cycles over: as many as
    the budget holds (the arena's set and slot, the judge's pristine copy of the set), at most
    POOL_MAX, at least one. The baselines use the same count, so a reference and a candidate
    read equally cold (or warm) inputs."""
    return int(max(1, min(POOL_MAX, budget_bytes // max(2 * set_bytes + out_bytes, 1))))


def queued_copy_s(device: str, out_bytes: int, copies: int = 16) -> float:
    """One output copy on a device as a worker makes it inside a window: one of many queued
    copies (a synchronize after each would be charged as a copy: the worker synchronizes once
    per window, and this is deducted once per call). Above COPY_PROBE_BYTES a copy that size,
    scaled (a copy that large runs at the device's bandwidth, and a GB-sized task has no room
    for two more outputs)."""
    import torch

    n = max(1, min(int(out_bytes), COPY_PROBE_BYTES))
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    _synchronize(device)
    t0 = time.perf_counter()
    for _ in range(copies):
        dst.copy_(src)
    _synchronize(device)
    return (time.perf_counter() - t0) / copies * max(1.0, out_bytes / n)


def _synchronize(device: str) -> None:
    import torch

    if device != "cpu":
        getattr(torch, device.split(":")[0]).synchronize()


class CheckParts:
    """Where a check's time goes (the referee's profile: "draws", "reference", ...), with no
    synchronization of its own: on a device, events recorded on the judge's stream between
    the parts (the device's timeline: a part's kernels and the host's enqueueing of them,
    whichever is later) and read once the check's last comparison has read its result on the
    host (each comparison does: `tensors.same`, `device_compare.compare`), so every event is
    complete by then; on the cpu (or a device without timing events), the host clock."""

    def __init__(self, device: str) -> None:
        import torch

        kind = getattr(torch, device.split(":")[0], None) if device != "cpu" else None
        self._event = getattr(kind, "Event", None)
        self.labels: list[str] = []
        self.points: list[Any] = [self._now()]

    def _now(self) -> Any:
        if self._event is None:
            return time.perf_counter()
        event = self._event(enable_timing=True)
        event.record()
        return event

    def done(self, label: str) -> None:
        """The time since the last point is `label`'s."""
        self.labels.append(label)
        self.points.append(self._now())

    def seconds(self, into: dict[str, float]) -> dict[str, float]:
        """Each part's seconds added to `into`."""
        if self._event is not None:
            self.points[-1].synchronize()  # complete already: recorded before a host read
        for label, a, b in zip(self.labels, self.points, self.points[1:], strict=False):
            into[label] = into.get(label, 0.0) + (
                b - a if self._event is None else a.elapsed_time(b) / 1e3)
        return into


class WindowJudge:
    """Fresh inputs per window in an arena both sides map; checks of what the worker left."""

    def __init__(self, task_source: str, seed: int, tol: tuple[float, float, float, float],
                 budget_bytes: int, path: str = "", construct: str = DEVICE) -> None:
        import torch

        self.model, self.get_inputs = decide.reference(task_source, seed, construct)
        self.device, self.tol = decide.DEVICE, tol
        self._seed = (1 << 40) + secrets.randbelow(1 << 40)  # unknown to the worker
        sample = self._draw()
        with decide.LOCK, torch.no_grad():
            ref_out = self.model(*clone(sample))
        _, set_bytes = plan(sample)
        _, out_bytes = plan(ref_out)
        self.out_bytes, self.set_bytes = out_bytes, set_bytes
        self.sets = sets_for(set_bytes, out_bytes, budget_bytes)
        layouts, end, self._set_spans = [], 0, []
        for _ in range(self.sets):
            layout, nxt = plan(sample, end)
            layouts.append(layout)
            self._set_spans.append((end, nxt))  # what `publish` writes of it
            end = nxt
        self._sets_end = end  # the input sets; one output slot per call follows
        out_layouts, self._out_spans = [], []
        for _ in range(self.sets):
            layout, nxt = plan(ref_out, end)
            out_layouts.append(layout)
            self._out_spans.append((end, nxt))  # the bytes the judge pulls of it
            end = nxt
        del sample, ref_out  # a GB-sized task: the arena needs their room (`verifier.judge.admission`)
        if self.device != "cpu":
            getattr(torch, self.device.split(":")[0]).empty_cache()
        self.arena = Arena.create(end, self.device, path)
        self.views = [views(self.arena, layout) for layout in layouts]
        self.slots = [views(self.arena, layout) for layout in out_layouts]
        self.spec = {"nbytes": self.arena.nbytes, "sets": layouts, "outs": out_layouts}
        self._set_seeds: list[int] = []  # each set's inputs of the last window, as seeds
        self.checked: list[int] = []  # the calls the last check compared (tests read it)
        self.stepped = False  # a window's sets published one per call (`verifier.judge.stepped`)
        self._snapped: set[int] = set()  # the calls whose slots `snapshot` read in this window
        self.parts: dict[str, float] = {}  # the last check's seconds by part (the profile)
        self.copy_s = fastest_copy(self.device, self.out_bytes,
                                   min(self._timed_copy() for _ in range(3)),
                                   self.sets if self.device == "cpu" else 1)

    def _timed_copy(self, copies: int = 16) -> float:
        """One call's output copy into its slot, as the worker makes it inside a window."""
        if self.device == "cpu":  # one thread, as the worker's copy: torch's parallel copy
            return self._memmove_s()  # waits on a preempted helper thread under load
        return queued_copy_s(self.device, self.out_bytes, copies)

    def _memmove_s(self, passes: int = 5) -> float:
        """One call's output copy into its slot as a window makes it: single-threaded, from a
        hot source (the output the call just wrote) into cold memory of the arena's kind. The
        destinations are `sets` distinct slot-sized spans of a MAP_SHARED memfd (the arena is a
        shared file mapping of 4 KB pages, the worker's slots are in it), cycled as a window
        cycles its slots, so each is as cold as a window's slot (85 x 64 KB or 5 x 1 MB do not
        stay in a 2 MB L2; a copy into a hot buffer deducted a third to a fifth of what a
        window's copy costs, and compressed every speedup toward 1). The fastest pass, per
        copy; the first pass only faults the pages in, as a worker's first window does."""
        return cold_copy_s(int(self.out_bytes), self.sets, passes)

    def _draw(self, seed: int | None = None) -> list[Any]:
        """The inputs of `seed` (a new one when None): the same tensors every time it is drawn."""
        if seed is None:
            self._seed += 1
            seed = self._seed
        with decide.LOCK:  # the global generator: a recheck seeds and draws under this lock
            return decide.make_inputs(self.get_inputs, seed)

    def fill(self, n: int) -> None:
        """Fresh inputs into the sets a window of `n` calls uses. All are drawn first, in the
        judge's own memory (no worker maps it), then published into the arena in one burst: a
        worker watching the arena sees a window's inputs only for the time of that copy
        (`verifier.judge.clock`: the GPU form). The drawn copies are dropped then: the check draws
        each set again from its seed, so a GB-sized set is held twice only while it is filled
        (`verifier.judge.admission`)."""
        # each set's seed drawn alone (its parity, signed or not, alternating as before): torch
        # seeds the host generator with a seed's low 32 bits, so consecutive seeds let a run
        # that searched 2^32 seeds for one set it saw predict every later window's inputs
        self._set_seeds = [2 * secrets.randbelow(1 << 62) + (self._seed + 1 + i) % 2
                           for i in range(max(1, min(n, self.sets)))]
        self._seed += len(self._set_seeds)
        drawn = [self._draw(seed) for seed in self._set_seeds]
        for target, inputs in zip(self.views, drawn, strict=False):
            fill(target, inputs)
        del drawn
        self._snapped = set()
        if self.stepped:  # the first set now, each later one after the call before it
            self.publish(0)
        else:
            self.arena.push(0, self._sets_end)  # cpu: into the file the worker maps
        _synchronize(self.device)

    def snapshot(self, k: int) -> None:
        """Call k's slot read now (a stepped window: as the call said it was written, before
        the next set exists), never again in this window."""
        self.arena.pull(*self._out_spans[k])
        self._snapped.add(k)

    def publish(self, k: int) -> None:
        """Set k of the window into the arena (cpu: the file the worker maps)."""
        self.arena.push(*self._set_spans[k])

    @property
    def pristine(self) -> list[Any]:
        """The last window's inputs as drawn (drawn again: nothing of them is kept)."""
        return [self._draw(seed) for seed in self._set_seeds]

    def picks(self, n: int, deep: bool = False) -> list[int]:
        """The calls of a window of `n` whose outputs are checked: the last, and RANDOM_CHECKS
        others drawn now (after "d": the worker cannot know them while it runs); `deep`: every
        call, or DEEP_CHECKS drawn (cpu: the judge's copy of the slots is its own memory; a
        device: where the clones of all slots fit in DEEP_CLONE_BYTES, beyond admission's)."""
        calls = max(1, min(n, len(self._set_seeds)))
        rest = list(range(calls - 1))
        if deep and (self.device == "cpu" or calls * self.out_bytes <= DEEP_CLONE_BYTES):
            if len(rest) <= DEEP_CHECKS:
                return [calls - 1, *rest]
            return [calls - 1, *sorted(rest.pop(secrets.randbelow(len(rest)))
                                       for _ in range(DEEP_CHECKS))]
        chosen = [rest.pop(secrets.randbelow(len(rest))) for _ in range(min(RANDOM_CHECKS,
                                                                         len(rest)))]
        return [calls - 1, *chosen]

    def check(self, n: int, deep: bool = False) -> str:
        """Why the window of `n` calls does not stand ("" when it does): the last call's output
        and those of calls drawn now against the judge's reference, every input against its
        pristine copy. `deep` (the clock's window faster than any before it, `verifier.judge.clock`):
        every call's output (`picks`: the window that sets the runtime cannot have skipped calls
        the random draw missed)."""
        import torch

        from verifier.judge.device_compare import (
            judge as _judge,  # in chunks: no fp64 copy of it all
        )

        picks = self.checked = self.picks(n, deep)
        self.parts = parts = {"draws": 0.0, "reference": 0.0, "compare": 0.0, "inputs": 0.0}
        try:  # cpu: what the worker left, read once, now (nothing it writes later counts):
            for k in picks:  # the checked outputs first, then the inputs
                if k not in self._snapped:  # (a stepped window's: read as each call ended)
                    self.arena.pull(*self._out_spans[k])
            self.arena.pull(0, self._sets_end)
        except OSError as exc:
            return f"the timed calls' arena is unreadable: {exc}"
        # a device arena has no pull: the checked outputs as they are now, before any reference
        # runs (a worker still writing after "d" must not get that time)
        # (cpu: the slots are views of the judge's private copy, pulled above)
        marks = CheckParts(self.device)  # no synchronization of its own
        seen = {k: self.slots[k] if self.device == "cpu" else clone(self.slots[k]) for k in picks}
        marks.done("clone")
        # every pick compared and every input, whatever fails first (the first failure is the
        # answer): a check that stopped at a wrong output answered the worker sooner, and a
        # worker timing its "d" to the next window's order could tell it was caught, where the
        # clock serves the planned windows after a failed check so that it cannot
        # (`verifier.judge.clock.JudgeClock.failed_check`)
        wrong: list[str] = []
        for k in picks:
            # the reference runs on one draw of the set and an fp64 second opinion on a second
            # (the reference may write its inputs): a GB-sized set is held once, as admission counts
            # (`verifier.judge.admission.judge_bytes`; a clone beside it ran an H100 out of memory)
            drawn = self._draw(self._set_seeds[k])
            marks.done("draws")
            with decide.LOCK, torch.no_grad():
                ref_out = self.model(*drawn)
            del drawn
            marks.done("reference")
            seed = self._set_seeds[k]  # drawn again only for an fp64 second opinion (a miss)
            with decide.LOCK, torch.no_grad():
                verdict, msg, _, _ = _judge(
                    self.model, lambda s=seed: decide.make_inputs(self.get_inputs, s),
                    ref_out, seen[k], self.tol)
            del ref_out
            marks.done("compare")
            if verdict != "ok":
                wrong.append(f"the output of a timed call was wrong: call {k + 1} of {n}: {msg}")
        # every set compared, each of its tensors (`same(every=True)`), before answering
        modified = [not same(target, self._draw(seed), every=True)
                    for target, seed in zip(self.views, self._set_seeds, strict=False)]
        marks.done("inputs")
        marks.seconds(parts)
        if any(modified):
            wrong.append("forward modified its input tensors during a timed call")
        return wrong[0] if wrong else ""

    def close(self) -> None:
        self.views, self.slots, self._set_seeds = [], [], []
        self.arena.close()
