"""Where the worker's cpu time goes, seen from the judge's process: instruction-pointer samples.

Every fallback check inside the worker (the trials' dispatcher trace, the timed calls' profiler,
`judge_ops`) shares a process with the candidate, which can pop the mode, exclude dispatch keys
in C++ or patch the classifier. This check is made where the candidate cannot reach: the judge
(`runners._SandboxRunner`, the verifier process on the cpu backend) samples the instruction
pointer of every running thread of the run while it serves extra, untimed windows of calls on
fresh inputs (`SamplingClock`: the clock's own protocol, after its timed windows, so the
sampling's stops never touch the runtime). The run's threads are the tasks of its cpu cgroup
(`verifier.isolation.cpu_meter`), as the host sees them.

One sample of a thread: PTRACE_SEIZE, PTRACE_INTERRUPT, wait for the stop, PTRACE_GETREGS
(x86_64 `user_regs_struct.rip`), PTRACE_DETACH (a signal that arrived meanwhile is handed back
on detach), about every `INTERVAL_S`; only threads in state R are sampled (a blocked thread
computes nothing). The judge runs as root (CAP_SYS_PTRACE: the worker's own uid, dumpable or
not, and Yama do not stop it); where ptrace is refused the run is not judged here (one stderr
line, no finding). A thread that already has a tracer (a candidate that ptraces itself to
keep the judge out) cannot be seized: that is a finding, as no honest run has one.

Each rip is mapped through /proc/<tid>/maps to its object: `own` (the extension objects the
judge copied into the run's directory), `torch` (torch's libraries: aten kernels, c10, its
libgomp), `library` (numpy, openblas, mkl, any other .so under site-packages, and any object
from where a run can write: a library copied under a neutral name into its folder), `overhead`
(interpreter, libc, the dynamic loader, vdso: the system's trees and the interpreter's prefix),
`anon` (executable anonymous memory: code made at run time), `movement` (torch's copy and fill
kernels, `verifier.judge.library_work`: they count for nothing, as copy ops do in the dispatcher
trace). Under the strict fallback policy, with calls long enough to sample (`MIN_CALL_S`) and
enough samples (`MIN_SAMPLES`), `decide` finds a cheat when library compute (torch + library +
anon) holds more than `LIBRARY_SHARE` of the compute samples (those and own), or when the
candidate loaded extension objects and not one sample landed in them (the extension never
computed). An honest kernel still spends time in torch (its output's allocation, dispatch, the
harness's copy of each output into the judge's slot). Measured (cpu backend, 2 loaded cores,
strict policy), the library share of compute samples of honest CPU templates
(pipeline.candidates.templates, simd/omp/fast-math) with copies counted as library, then as
movement: ReLU 2048x1024 0.36-0.55 -> 0.05-0.08, tanh(2x+1) 1024^2 0.33-0.50 -> 0.00-0.25,
softmax 512x1024 0.17-0.36 -> 0.00-0.16, row sum of squares 0.07-0.15 (no change), matmul
256^3 0.04-0.08 -> 0.00-0.03, linear 128x512x256 0.02-0.09 -> 0.02-0.08. A fallback padded
with its own spin (numpy's BLAS, then a spin of 30% / 50% of its time) is 0.69-0.82 library:
the share was 0.85, set by the copies; it is 0.5, so a padded fallback must spin at least as
long as its library works (at most half the library's speed; reward <= 0.65, where it got 0.71,
above any honest kernel slower than 0.5x). Left open: a longer pad; arithmetic inside torch's
copy kernel (casts, a negated view's copy) is movement, as those ops are `copy` in the trace.
The round-4 fallbacks had no sample
at all in their own objects (29-50 compute samples, all in libtorch_cpu or numpy). Samples of a
thread stopped inside a system call (a run woken for its next window, a write of "d") count
for nothing. On a loaded host the judge gets ~1 sample per 4-6 ms of calls, so a task whose
calls are ~1 ms with one input set per window needs up to `MAX_SAMPLING_S` of extra windows;
with too few compute samples the run is not judged here. The KernelBench corpus
(benchmarks/kernelbench_corpus) is CUDA only: not measured here.

Second round: a call of little work is mostly the harness's per-call cost in torch (the
dispatcher trace, the output's allocation, the copy's setup): an honest 16x1024 ReLU (~25 us)
sampled anyway is 0.68-0.85 library. `MIN_CALL_S` keeps it unsampled, but its time on a cpu as
the timed windows measure it is noisy under load (77-2700 us on 2 cores with two spinners
beside it), and once past the gate it was a cheat (conformance case cpu_identity, a fresh-clone
CI). So a finding of `decide` stands only on fresh evidence: the calls timed again unsampled
(`RETIME_WINDOWS`, the least time on a cpu: load only adds) still long enough to sample, and a
second round of samples that finds it too. Metered with `cpus`, a call's time on a cpu is its
cpu time, which no sleep or extra thread lowers; a thread already traced is found at once.

A candidate that tells the sampling windows from the timed ones (it may notice a tracer
between two of its calls: TracerPid, stop gaps; cheapest, a voluntary context switch in a call
that makes no system call: tests/verifier/test_redteam_round5.py) can compute in its own
object only while traced. Its sampled calls are then slower than its timed ones: the median
sampled window after the first (it notices its first stop there) over `SWITCH_RATIO` times the
timed windows' median is the runtime (`switched` in the figures); the stops cost ~15% (below).
Left open: a switch to own code no slower than SWITCH_RATIO times the library's. Sampling without stops (perf_event_open PERF_SAMPLE_IP on the run's threads, as root)
would leave nothing to watch for and could cover the timed windows too. Sampling the timed
windows too would close that, at a cost measured here (a child timing 200 us calls of its own
.so, 2 cores): at 1 kHz the median call +3.7% (the fastest +0.5%), at 5 kHz +12-15%; too much
for the runtime figure, hence the separate windows.

GPU: the equivalent is the kernels the worker's context launches, seen from outside. CUPTI
(and the profiler built on it) subscribes inside the process that owns the context, so the
referee cannot trace another process's launches; options are (a) the host-side form of this
module on the GPU worker (its threads' rips: time in libcudnn/libcublas/aten's CUDA kernels'
launch paths vs the candidate's own .so launching its kernels), which sees who launches but not
device time; (b) an injection library (CUDA_INJECTION64_PATH) loaded before any candidate code
that streams CUPTI activity records (kernel name, module, duration) over a pipe the referee
reads, protected as well as the worker's memory is (i.e. not against a candidate that writes
its process memory; the records' kernel names must come from modules the candidate built);
(c) Nsight/`nsys`-style device-wide sampling (PM sampling / `cupti` range profiling from a
privileged daemon on an exclusive GPU), which attributes SM time per context and kernel, from a
process the candidate does not share; (d) MPS or MIG isolation with per-client counters.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verifier.judge.clock import JudgeClock, calls_for
from verifier.judge.library_work import no_work
from verifier.judge.ptrace_sampler import SYSCALL, Sampler, unavailable

TARGET_SAMPLES = 80  # windows are served while sampling until this many samples,
SAMPLE_WINDOW_S = 0.4  # or this much time in calls,
MAX_SAMPLING_S = 5.0  # or this long in all (fills and checks included)
MIN_CALL_S = 200e-6  # calls shorter than this are mostly the harness's own overhead
MIN_SAMPLES = 20
# compute samples (not overhead) the rules need: none in the candidate's objects out of 12 has
# probability 0.5**12 for the least own share measured on an honest kernel (~0.5)
MIN_COMPUTE, MIN_SHARE_COMPUTE = 12, 20
LIBRARY_SHARE = 0.5  # honest library shares measured: 0.00-0.25 (module docstring)
SWITCH_RATIO = 3.0  # the sampled windows' median call (the first window left out) over the
# timed ones': beyond this the run computed differently while sampled (the stops cost ~15%)
SWITCH_WINDOWS = 3  # sampled windows after the first, at least
RETIME_WINDOWS = 5  # unsampled windows timed again before a second round (`_retime`)
KINDS = ("own", "torch", "library", "anon", "movement", "overhead", "syscall")

def parse_maps(text: str) -> list[tuple[int, int, str]]:
    """Executable mappings of a /proc maps text: (start, end, path or "" for anonymous)."""
    return [(lo, hi, path) for lo, hi, path, _, _ in _maps_with_inodes(text)]


def _maps_with_inodes(text: str) -> list[tuple[int, int, str, int, int]]:
    """(start, end, path, inode, file offset) of each executable mapping."""
    out = []
    for ln in text.splitlines():
        parts = ln.split(None, 5)
        if len(parts) < 2 or "x" not in parts[1]:
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        inode = int(parts[4]) if len(parts) > 4 and parts[4].isdigit() else 0
        offset = int(parts[2], 16) if len(parts) > 2 else 0
        out.append((lo, hi, parts[5].strip() if len(parts) > 5 else "", inode, offset))
    return out


def kind_of(path: str, own: set[str]) -> str:
    """The object class of a mapped path (`KINDS`); `own`: the candidate's object file names."""
    name = os.path.basename(path.replace(" (deleted)", ""))
    if not path or path.startswith("[anon") or path.startswith("/memfd:"):
        return "anon"
    if path.startswith("["):  # [vdso], [vsyscall]
        return "overhead"
    if name in own and "-packages/" not in path:
        return "own"
    if "/torch/lib/" in path or "/torch.libs/" in path or name.startswith(("libtorch", "libc10")):
        return "torch"
    if "-packages/" in path or any(k in name for k in ("blas", "mkl", "lapack", "numpy")):
        return "library"
    # overhead is where the run cannot write (the system's trees, the interpreter's prefix): a
    # library copied under any other name into its folder or /tmp is still library code
    return "overhead" if path.startswith(_overhead_roots()) else "library"


_SYSTEM_ROOTS = ("/usr/", "/lib/", "/lib64/", "/lib32/", "/libx32/", "/bin/", "/sbin/")


def _overhead_roots() -> tuple[str, ...]:
    """Folders whose objects are every run's overhead: the system's, the interpreter's."""
    prefixes = {sys.base_prefix, sys.prefix, sys.exec_prefix, os.path.dirname(sys.executable)}
    real = {os.path.realpath(p) for p in prefixes if p} | {os.path.dirname(
        os.path.realpath(sys.executable))}
    return _SYSTEM_ROOTS + tuple(p.rstrip("/") + "/" for p in sorted(real) if p != "/")


def classify(samples: list[tuple[int, int]], maps: dict[int, str], own: set[str],
             own_inodes: set[int] | None = None
             ) -> tuple[Counter[str], Counter[tuple[str, str]]]:
    """(samples per kind, samples per (kind, object name)) of `samples`; with `own_inodes`
    (the files the judge placed), an object of an own name is own only if it is one of them."""
    kinds: Counter[str] = Counter()
    objects: Counter[tuple[str, str]] = Counter()
    parsed = {tid: _maps_with_inodes(text) for tid, text in maps.items()}
    for tid, rip in samples:
        if rip < 0:
            kinds["syscall"] += 1
            objects["syscall", f"(syscall {SYSCALL - rip})"] += 1
            continue
        path, inode, at = next(((p, i, rip - lo + off) for lo, hi, p, i, off in
                                parsed.get(tid, []) if lo <= rip < hi), (None, 0, 0))
        if path is None:
            kinds["anon"] += 1
            objects["anon", "(unmapped)"] += 1
            continue
        kind = kind_of(path, own)
        if kind == "own" and own_inodes is not None and inode not in own_inodes:
            kind = "library"  # a file of an own object's name the judge never placed
        elif kind == "torch" and no_work(path, inode, at):
            kind = "movement"  # torch's copies, fills and hooks: no arithmetic of the task
        kinds[kind] += 1
        objects[kind, os.path.basename(path) or "(anonymous)"] += 1
    return kinds, objects


def decide(kinds: Counter[str], objects: Counter[tuple[str, str]], own_loaded: bool, call_s: float,
           policy: str = "strict") -> str:
    """Why the samples show a fallback (the finding's message), or "" (none, or too few)."""
    total = sum(kinds.values())
    lib = kinds["torch"] + kinds["library"] + kinds["anon"]
    compute = lib + kinds["own"]  # the interpreter, libc (the harness's copies, page faults)
    # and the loader are every run's overhead: the shares are of the compute samples
    if policy != "strict" or call_s < MIN_CALL_S or total < MIN_SAMPLES or \
            compute < MIN_COMPUTE:
        return ""
    if own_loaded and kinds["own"] == 0:
        return (f"library_time: none of {compute} compute samples (of {total} cpu samples) of "
                "calls on fresh inputs ran in the candidate's own objects (its extension never "
                f"computed; most in {_top(objects)})")
    if compute >= MIN_SHARE_COMPUTE and lib / compute > LIBRARY_SHARE:
        return (f"library_time: {lib / compute:.0%} of {compute} compute samples (of {total} "
                f"cpu samples) of calls on fresh inputs ran in library code (most in "
                f"{_top(objects)}), {kinds['own'] / compute:.0%} in the candidate's own objects")
    return ""


def _top(objects: Counter[tuple[str, str]]) -> str:
    return next((name for (kind, name), _ in objects.most_common()
                 if kind in ("torch", "library", "anon")), "?")


class SamplingClock(JudgeClock):
    """The judge's clock, plus untimed windows after the timed ones in which the judge samples
    where the run's threads are (`Sampler`); `result()` carries the samples' finding as the
    clock's failure under the strict policy."""

    def __init__(self, judge: Any, policy: str = "strict", **kw: Any) -> None:
        self.policy = policy
        self.tasks: Callable[[], list[int]] | None = None
        self.own: set[str] = set()
        self.own_inodes: set[int] | None = None  # the placed objects' files (None: by name)
        self.workdir = kw.get("workdir")
        self.sampling: dict[str, Any] = {}
        self._armed = threading.Event()  # set while a sampling window's calls run
        self._sampling = False
        super().__init__(judge, **kw)

    def sample_tasks(self, cgroup: Path | None, own: set[str]) -> None:
        """Sample the tasks of the run's cgroup (`cgroup/tasks`), `own` its extension files."""
        why = unavailable() if cgroup is not None else "no cgroup lists the run's threads"
        if why:
            print(f"kernelsynth verifier: no ip sampling: {why}", file=sys.stderr)
            return
        self.own = {os.path.basename(n) for n in own}
        if self.workdir is not None:  # a copy of a library under an own name is not own
            self.own_inodes = {os.stat(Path(self.workdir) / n).st_ino for n in own
                               if (Path(self.workdir) / n).exists()}
        self.tasks = lambda: _read_tasks(Path(cgroup) / "tasks")

    def _measure(self) -> dict[str, Any]:
        figures = super()._measure()
        if figures and self.tasks is not None and self.policy == "strict":
            self.sampling = self._sample(figures["runtime_us"] * 1e-6)
            sampled = self.sampling.get("sampled_call_us") or 0.0
            # the sampled calls far slower than the timed ones (median to median: load slows
            # both alike): the run changed what it ran once it saw the sampler's stops (a ptrace
            # stop is a context switch it can count), so the samples are of other code than
            # the timed calls; the runtime is theirs
            if sampled > SWITCH_RATIO * figures["median_us"]:
                figures["switched"] = (f"the sampled calls took {sampled:.0f} us, the timed "
                                       f"ones {figures['runtime_us']:.0f} us: timed as sampled")
                figures["runtime_us"] = sampled
        return figures

    def _window(self, n: int) -> float:
        if self._sampling:  # samples only between "w" and "d": where the calls run
            self._armed.set()
        try:
            return super()._window(n)
        finally:
            self._armed.clear()

    def _sample(self, call_s: float) -> dict[str, Any]:
        busy_s = busy_call_s(call_s, self.runtime_cores)
        if busy_s < MIN_CALL_S:
            return {"skipped": f"calls of {busy_s * 1e6:.0f} us on a cpu are too short to "
                               "sample"}
        began = time.perf_counter()
        out = self._round(call_s, busy_s)
        if out.get("finding") and not out.get("traced"):
            self._confirm(out, call_s)
        out["wall_s"] = round(time.perf_counter() - began, 3)  # what sampling added
        return out

    def _confirm(self, out: dict[str, Any], call_s: float) -> None:
        """A share found in one round stands only if fresh evidence finds it again (module
        doc, "second round"): the calls timed again, unsampled, must still be long enough to
        sample, and a second round of samples must find a fallback too."""
        first = out.pop("finding")
        out["first_round"] = first
        n = min(calls_for(call_s), self.judge.sets)
        busy_s = self._retime(n)
        out["retimed_call_us"] = round(busy_s * 1e6, 2)
        if busy_s < MIN_CALL_S:
            out["finding"] = ""
            out["cleared"] = (f"timed again, calls of {busy_s * 1e6:.0f} us on a cpu are too "
                              "short to sample")
            return
        again = self._round(call_s, busy_s)
        out["second_round"] = {k: again.get(k) for k in ("samples", "kinds", "objects", "finding")}
        out["finding"] = again.get("finding", "") and (
            f"{first}; a second round found it again: {again['finding'].split(': ', 1)[1]}")

    def _retime(self, n: int) -> float:
        """The least time on a cpu (`busy_call_s`) of a call in `RETIME_WINDOWS` more unsampled
        windows of n calls: load only adds to it, so the least is the best estimate of a
        call's work (module doc, "second round")."""
        busy = []
        for _ in range(RETIME_WINDOWS):
            metered = len(self.window_cores)
            per_call = self.call_time(self._checked(n), n)
            cores = self.window_cores[-1] if len(self.window_cores) > metered else None
            busy.append(busy_call_s(per_call, cores))
        return min(busy)

    def _round(self, call_s: float, busy_s: float) -> dict[str, Any]:
        """One round of sampled windows of calls on fresh inputs: its samples and finding."""
        assert self.tasks is not None
        n = min(calls_for(call_s), self.judge.sets, max(1, int(SAMPLE_WINDOW_S / 4 / call_s)))
        sampler = Sampler(self.tasks, armed=self._armed).start()
        began, served, per_call, windows = time.perf_counter(), 0.0, [], 0
        meter, self.meter = self.meter, None  # untimed: no wait for quiet, nothing charged
        self._sampling = True
        try:
            # past SAMPLE_WINDOW_S while samples are too few to decide on (a loaded host's
            # sampler wakes seldom, and then often at the run's system calls)
            while ((sampler.user_samples() < TARGET_SAMPLES
                    and (served < SAMPLE_WINDOW_S or sampler.user_samples() < MIN_SAMPLES)
                    or windows <= SWITCH_WINDOWS) and time.perf_counter() - began < MAX_SAMPLING_S):
                wall = self._checked(n)  # (a failed window's failure stands; the plan goes on)
                served, windows = served + wall, windows + 1
                if windows > 1:  # a run sees its first stop in the first: no switch before it
                    per_call.append(self.call_time(wall, n))
        finally:
            self.meter, self._sampling = meter, False
            sampler.stop()
        kinds, objects = classify(sampler.samples, sampler.maps, self.own, self.own_inodes)
        out = {"samples": sum(kinds.values()), "kinds": dict(kinds),
               "objects": {f"{k}:{o}": c for (k, o), c in objects.most_common(8)}, "refused": dict(sampler.refused),
               "served_s": round(served, 4), "call_us": round(call_s * 1e6, 2),
               "sampled_call_us": round(sorted(per_call)[len(per_call) // 2] * 1e6, 2)
               if per_call else None}
        if sampler.refused.get("traced"):
            out["traced"] = True
            out["finding"] = ("library_time: a thread of the run is traced by another process "
                              "(the judge's samples were kept out)")
        elif sampler.refused.get("denied") and not sampler.samples:
            print("kernelsynth verifier: no ip sampling: ptrace refused on the run's threads",
                  file=sys.stderr)
        else:
            out["finding"] = decide(kinds, objects, bool(self.own), busy_s, self.policy)
        return out

    def result(self) -> dict[str, Any]:
        """The clock's result; a sampled fallback is the windows' failure (a cheat)."""
        res = super().result()
        res["ip_samples"] = self.sampling
        if self.sampling.get("finding") and not res["failure"]:
            res["failure"] = self.sampling["finding"]
        return res


def busy_call_s(call_s: float, cores: float | None) -> float:
    """A call's time on a cpu: its runtime, less what a loaded host kept it waiting (`cores`:
    the cpu time over wall time of the window that set the runtime, where under one core).
    `MIN_CALL_S` is about the work a call does; on a loaded host a 31 us call made of glue (a
    chunk, the own kernel, a cat) took over 200 us of wall time and was sampled as 94% library.
    That window's own figure, not the windows' median: a run that slept through its calibration
    windows (their calls right, then idle) put the median under 0.1 while its fastest windows
    ran a library at one core, and went unsampled (tests/verifier/test_redteam_round7.py).
    The meter is the run's cgroup (us), as sampling needs one; without a meter the runtime
    stands."""
    if cores is None:
        return call_s
    return call_s * min(1.0, cores)


def _read_tasks(path: Path) -> list[int]:
    try:
        return [int(x) for x in path.read_text().split()]
    except (OSError, ValueError):
        return []
