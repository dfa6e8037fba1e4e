"""The judge's clock: a candidate's runtime is measured by the trusted judge, never reported.

Code that shares a process with the candidate is the candidate's, so the worker reports no
time at all. After its correctness trials it serves timed windows over two pipes (FIFOs in the
run directory of a sandboxed run; inherited pipes, `FDS_ENV`, of a persistent worker):

    worker -> judge  "t"        ready: its inputs are views of the judge's arena (`verifier.judge.arena`)
                                ("t <bytes>" and its trials' report: checked now, `trials_checked`)
    judge  -> worker "w <n>"    sent right after the judge wrote fresh inputs into the arena
    worker: n calls over the arena's input sets (under the dispatcher trace, as every call),
            call i's output copied into the arena's slot i, synchronize
    worker -> judge  "d"
    judge  -> worker "e"        no more windows

Before "t" a persistent worker's traced trials are timed by the same clock ("p", "g", "q",
`verifier.judge.trial_pace`): windows far faster per call than those trials are a cheat. The
trials are stepped as the cpu windows are: each trial's inputs published at its "p", its slot
sealed at its "q" (no trial computes a later one's output, none is written after its end).
The judge times "w" sent to "d" received with its own clock. Any thread (or process) of the
run can speak this protocol and map the arena, not only the harness, so nothing rests on the
harness's loop: a window is believed for what the judge checks and measures itself.
- Every call has its own output slot. After "d" the judge draws which calls it checks (the
  last, and `window_judge.RANDOM_CHECKS` others: a secret the worker cannot know while it runs),
  reads those slots at once and compares them with its own reference on its pristine inputs; a
  window that skipped calls or answers "d" before its outputs are written fails as a cheat.
  The windows planned go on after a failed one as after any (`failed_check`): a worker told
  at once that it was caught voided that run and re-rolled (`verifier.run.outcome`).
- Work done outside the window is charged to it. A window's inputs exist only from the judge's
  fill on; a worker that computes while the judge fills (a thread watching the inputs land)
  burns cpu time there that an honest worker, blocked on the pipe, does not. Where the judge
  can meter the run's cpu time (`meter`: the run's cgroup, `verifier.isolation.cpu_meter`), it waits
  after each check until the run is quiet (an honest OpenMP pool spins ~5-10 ms after its last
  parallel region; loaded, it waits for a cpu: `runnable`), reads the meter, fills, reads it
  again at "w": the run's cpu time in between, less a noise allowance (`FILL_NOISE_S`, at most
  `NOISE_SHARE` of the window), is added to the window's time. Charged, not a cheat: cpu
  seconds are at least the wall seconds the work would have taken inside the window, so the
  attack gains nothing, and an honest run not quiet in time (a loaded host) is slowed a little. Cpu time inside the
  window (an honest multi-threaded kernel's) is never charged. Work after "d" is: the meter is
  read as "d" is in, before any slot, so slots written after "d" while the judge's thread
  waited for a cpu are in the window's cpu time (with `cpus`), and later ones lose the race to
  its reads (unmetered, a loaded host lets such a worker win: tests/verifier/test_redteam_round7).
- A window's inputs do not exist before the fill; a window has no more calls than input sets (a
  repeated set would let a cache answer without the work), and a timed call's output is a plain
  tensor (a lazy subclass would do the work only when copied).
A window with no calls measures the round trip; then windows of more and more calls calibrate
one call; then `WINDOWS` windows of n calls (the calibration's last counts if it had n), n large
enough that the round trip is under 1% of a window (and a window at least `TARGET_S`: one call
if it is that long), but never more than the judge's input sets (where they are too few, the
round trip's larger share only adds time); a far slower than eager window ends the timing
(`verifier.judge.pace`, `early_stop`). The runtime is the fastest window's time per call, less
the judge's own time for the calls' output copies (at most half): load only adds time, and no
window runs faster than its calls truly take. The reference's baseline is timed by this very
clock in a process that never ran candidate code: on cpu a sandboxed child serves a judge's
windows with the reference as its forward (`verifier.run.runners.SandboxRunner.baseline`;
`time_windows` in-process was ~2x faster than the same forward judged here, issue 28); on a GPU
a worker that only ever loads references serves it (`GpuRunner.baseline`).
That deduction is the price of a slot per call: an output computed in place in its slot would
make the harness's copy a no-op (torch skips a copy of memory onto itself) and still be
deducted (a 2x claim for a copy-bound op like ReLU), so the harness refuses an output in the
slots' memory (`timed_calls.slot_filler`: a cheat), and the copy deducted is the fastest this
process timed for that size (`window_judge.fastest_copy`: a copy timed under load never lowers
a later runtime). A worker that patches the harness is deducted copies it never made (at most
half a window, which the physics floor then weighs); an honest kernel's figure is unchanged.

A window faster per call than every one before it has all its calls checked (`deep`, on a GPU
as far as `window_judge.DEEP_CLONE_BYTES` allows): the fastest cannot have skipped calls. A
window whose sets are all published at "w" lets a first call compute every set's output in one
batch and the later calls answer from it (the window then times the batch): the cpu runner's
clock is `stepped` (`verifier.judge.stepped`: "s n", each call's set published once the call
before it wrote its slot); a device judge's windows are not (the device form is in that module).
"""

from __future__ import annotations

import math
import os
import select
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verifier.judge.clock_serve import GO, REQ
from verifier.judge.stepped import can_step, metered, step_floor_s, stepped_window
from verifier.judge.trial_pace import pace_trials, trial_figures, trials_checked

WINDOWS = 3
TARGET_S = 0.02  # a window is at least this long (timer and scheduler noise well under 1%)
ROUND_TRIP_SHARE = 0.01  # the round trip is under this share of a window
MIN_CALLS, MAX_CALLS = 3, 100_000
WAIT_S = 120.0  # the longest the judge waits for one message
FILL_NOISE_S, NOISE_SHARE = 0.0005, 0.05  # the run's cpu time during a fill that is not
# charged: an honest worker's wake-up, a meter's rounding (at most this share of the window: a
# window capped by its input sets may be a single short call)
QUIET_S, QUIET_MAX_S = 0.002, 0.05  # the run is quiet: under 10% cpu over QUIET_S and no
# thread runnable (waited for at most QUIET_MAX_S, then the fill is charged as it is)


def calls_for(call_s: float, round_trip_s: float = 0.0) -> int:
    """Calls in one window: at least TARGET_S of work, the round trip under 1% of it."""
    want = max(TARGET_S, round_trip_s / ROUND_TRIP_SHARE)
    if not call_s > 0 or not math.isfinite(call_s):
        return MIN_CALLS
    if call_s >= want:  # one call is the window: more calls add seconds, not precision
        return 1
    return max(MIN_CALLS, min(MAX_CALLS, math.ceil(want / call_s)))


def summarize(per_call_s: list[float]) -> dict[str, Any]:
    """Runtime figures (us) of windows' times per call: the fastest, and the spread."""
    xs = sorted(per_call_s)
    q1, q3 = xs[len(xs) // 4], xs[(3 * len(xs)) // 4]
    return {"runtime_us": round(xs[0] * 1e6, 4), "median_us": round(xs[len(xs) // 2] * 1e6, 4),
            "iqr_us": round((q3 - q1) * 1e6, 4), "windows_us": [round(x * 1e6, 4) for x in xs]}


def deducted(wall: float, n: int, copy_s: float) -> float:
    """A window of n calls' time per call, less n output copies of `copy_s` each: at most half
    the window (the copy was measured once: a load spike then must not take a window's work
    away; a call writes its output)."""
    return (wall - min(n * copy_s, wall / 2)) / max(n, 1)


def time_windows(call: Callable[..., Any], sets: list[list[Any]],
                 refresh: Callable[[int], None], synchronize: Callable[[], None],
                 keep: Callable[[Any], None], pool: int = MAX_CALLS) -> dict[str, Any]:
    """The judge's windows timed in this (trusted) process: the GPU referee's eager baseline
    where no reference-only worker serves it (`verifier.run.gpu_runner.GpuRunner.baseline`):
    the same calibration, the same number of input sets (`refresh(n)` draws fresh ones for a
    window of n calls, outside the clock), the last output copied once (`keep`), the fastest
    window per call. (Copying every call's output into its own slot here, with the judge's
    copy deducted, made it no closer to the worker path on an H100: a 64 MB ReLU's reference
    judged as a candidate 0.64-0.69x either way, and at 1 GB 0.63x against 0.95-0.98x this
    way; the served baseline is what matches, 0.92-0.97x at 64 MB.)"""
    def window(n: int) -> float:
        refresh(n)
        used = max(1, min(n, len(sets)))
        synchronize()
        t0 = time.perf_counter()
        out = None
        for i in range(n):
            out = call(*sets[i % used])
        if n:
            keep(out)
        synchronize()
        return time.perf_counter() - t0

    window(1)  # warm-up: first-call costs (allocations, lazy init) are not the call's
    n, cap = 1, min(MAX_CALLS, pool)  # as the judge: no more calls than input sets
    while True:
        wall = window(n)
        if wall >= TARGET_S / 4 or n >= cap:
            break
        n = min(n * (8 if wall < TARGET_S / 64 else 2), cap)
    want = min(calls_for(wall / n), cap)  # the calibration's last window counts if it had n
    per_call = [wall / n] if want == n else []
    per_call += [window(want) / want for _ in range(WINDOWS - len(per_call))]
    return {**summarize(per_call), "calls": want}


# --- judge side ---------------------------------------------------------------------------
class JudgeClock:
    """The judge's end of the clock pipes for one run; a thread drives the windows.

    `judge` writes fresh inputs for a window of n calls (`fill(n)`), checks its output slots and
    inputs (`check(n) -> why not or ""`), and knows its own time for one output copy (`copy_s`).
    `meter() -> seconds` is the run's cpu time (`verifier.isolation.cpu_meter`; or set later, `watch`)."""

    def __init__(self, judge: Any, workdir: Path | None = None,
                 fds: tuple[int, int] | None = None, wait_s: float = WAIT_S,
                 meter: Callable[[], float] | None = None, stepped: bool = False) -> None:
        """FIFOs made in `workdir`, or `fds` (read, write): a persistent worker's pipes, kept
        open across jobs (what an earlier job left in them is drained first). `stepped`: each
        call's set published after the call before it (`verifier.judge.stepped`), where the
        judge can (a cpu judge's)."""
        self.judge, self.wait_s, self.meter, self.runnable = judge, wait_s, meter, None
        self.stepped = stepped and can_step(judge)
        self.step_s = 0.0  # deducted per step of a stepped window (`stepped.step_floor_s`)
        if self.stepped:
            judge.stepped = True
            self.step_s = step_floor_s(judge.set_bytes)  # (`watch` may leave the write out)
        self.fill_cpu: list[float] = []  # the run's cpu time during each window's fill
        self.charged: list[float] = []  # what each window was charged for its fill
        self.cpus: int | None = None  # the cores the run is given (`watch`); None: not bounded
        self.window_cores: list[float] = []  # each window's cpu time over its wall time
        self.runtime_cores: float | None = None  # that of the window that set the runtime
        self.figures: dict[str, Any] = {}
        self.trial_s: list[float] = []  # each paced trial's time (`verifier.judge.trial_pace`)
        self.trials_due: int | None = None  # how many the job has (set by the runner)
        self.fastest = math.inf  # the fastest checked window's time per call so far
        self.pace: Any = None  # the reference's `verifier.judge.pace.Pace` (set by the runner)
        self.serving, self.open_window = False, None  # from "t" to "e"; (start, calls) of a
        # window in flight, for `verifier.run.hang_watch`
        self.failure = ""  # why the windows do not stand (the worker's doing)
        self.failed_check = ""  # the first window whose outputs or inputs failed the checks
        self.judge_error = ""  # why the judge could not time them (not the worker's doing)
        self.trials: list[Any] | None = None  # [ok, why, stats, s]: trials checked at "t"
        self.owns_fifos = fds is None  # (not `own`: ip_sampler names its objects so)
        if fds is None:
            assert workdir is not None
            os.mkfifo(workdir / REQ, 0o666)
            os.mkfifo(workdir / GO, 0o666)
            # O_RDWR: opening never blocks, reads never see EOF while a worker comes and goes
            self.rfd = os.open(workdir / REQ, os.O_RDWR | os.O_NONBLOCK)
            self.wfd = os.open(workdir / GO, os.O_RDWR | os.O_NONBLOCK)
        else:
            self.rfd, self.wfd = fds
            _drain(self.rfd)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drive, name="ks-judge-clock", daemon=True)
        self._thread.start()

    def watch(self, meter: Callable[[], float] | None, cpus: int | None = None,
              runnable: Callable[[], int] | None = None) -> None:
        """Meter the run's cpu time with `meter` (`runnable`: its threads in state R) from the
        next window on; with `cpus` (the threads the run is given, and its baseline ran with), a
        window is charged at least its cpu time over `cpus`: a run that takes more cores than it
        was given (OpenMP `num_threads(8)` where OMP_NUM_THREADS=1 asked one) gains nothing."""
        self.cpus = cpus
        self.meter, self.runnable = meter, runnable
        if self.stepped:  # a step's write of the next set is in the window only unmetered
            self.step_s = step_floor_s(0 if metered(self) else self.judge.set_bytes)

    def call_time(self, wall: float, n: int) -> float:
        """A window of n calls' time per call, less the judge's own time for their n output
        copies and, stepped, its n-1 steps' floor: at most half the window (both measured when
        the judge was made: a load spike then must not take a window's work away)."""
        step = self.step_s * (n - 1) / n if self.stepped and n > 1 else 0.0
        return deducted(wall, n, self.judge.copy_s + step)

    def read_message(self, deadline: float, size: int = 1) -> str:
        """The worker's next message (one byte at a time, or `size` bytes where every message
        it may send is that long: nothing of a later one is lost)."""
        buf = b""
        while not buf.endswith(b"\n") and len(buf) <= 64:
            buf += self._chunk(deadline, max(1, size - len(buf)), "no message from the worker")
        if len(buf) > 64:
            raise ValueError("an oversized clock message")
        return buf.decode(errors="replace").strip()

    def read_bytes(self, deadline: float, n: int) -> bytes:
        """The next `n` bytes the worker sends (a trial report after its "t")."""
        buf = b""
        while len(buf) < n:
            buf += self._chunk(deadline, n - len(buf), "no trial report from the worker")
        return buf

    def _chunk(self, deadline: float, most: int, missing: str) -> bytes:
        while True:
            left = deadline - time.perf_counter()
            if self._stop.is_set() or left <= 0:
                raise TimeoutError(missing)
            if not select.select([self.rfd], [], [], min(left, 0.1))[0]:
                continue
            try:
                chunk = os.read(self.rfd, most)
            except BlockingIOError:
                continue
            if not chunk:
                raise OSError("the worker closed the clock pipe")
            return chunk

    def _window(self, n: int) -> float:
        if self.stepped and n > 1:  # no call sees a later call's set (a batch of them)
            return stepped_window(self, n)
        # the clock starts before the order goes out and stops after the answer is in: a
        # thread switch in this process only ever lengthens a window, never shortens it
        self.open_window = (time.monotonic(), n)
        t0 = time.perf_counter()
        os.write(self.wfd, f"w {n}\n".encode())
        try:
            msg = self.read_message(t0 + self.wait_s)
        finally:
            t1, self.open_window = time.perf_counter(), None
        if msg != "d":
            raise ValueError(f"unexpected clock message {msg[:40]!r}")
        return t1 - t0

    def _drive(self) -> None:
        started = False
        try:
            # a run that fails first sends nothing
            msg = pace_trials(self, self.read_message(time.perf_counter() + 1e9))
            if msg.partition(" ")[0] != "t":
                raise ValueError(f"unexpected clock message {msg[:40]!r}")
            started = self.serving = True
            if trials_checked(self, msg):  # trials that failed the judge's check: no window
                self.figures = self._measure()
        except TimeoutError:
            if not self._stop.is_set():
                self.failure = "the worker did not finish a timing window in time"
        except (OSError, ValueError) as exc:
            self.failure = f"the timing windows failed: {exc}"
        except RuntimeError as exc:  # the judge itself (the referee) failed: not the worker
            self.judge_error = f"the verifier's timing judge failed: {exc}"
        finally:
            if started:  # the worker waits for its next order only once it said "t"
                try:
                    os.write(self.wfd, b"e\n")
                except OSError as exc:
                    self.failure = self.failure or f"the timing windows failed: {exc}"
            self.serving = False

    def _measure(self) -> dict[str, Any]:
        round_trip = min(self._window(0) for _ in range(5))
        n, call_s = 1, 0.0
        while True:  # calibration: more calls until a window is a quarter of the target
            wall = self._checked(n)
            call_s = max(self.call_time(wall, n), 1e-7 / n)  # noise only adds time
            if wall >= TARGET_S / 4 or n >= min(MAX_CALLS, self.judge.sets):
                break
            n = min(n * (8 if wall < TARGET_S / 64 else 2), self.judge.sets)
        per_call = [call_s]  # the calibration's last window: a window as any other
        settled = self.pace.settled(call_s, wall) if self.pace is not None else ""
        for _ in range(0 if settled else 2):  # until the fastest window holds the round trip
            # under 1%; no more calls than input sets: every call on a set fresh for it
            want = min(calls_for(call_s, round_trip), self.judge.sets)
            per_call, n = (per_call if want == n else []), want
            while len(per_call) < WINDOWS:
                wall = self._checked(n)
                per_call.append(self.call_time(wall, n))
            call_s = min(per_call)
            if call_s * n >= round_trip / ROUND_TRIP_SHARE or n >= self.judge.sets:
                break
        figures = summarize(per_call)
        set_by = self.charged[-len(per_call):][per_call.index(min(per_call))]  # runtime's
        figures.update(calls=n, round_trip_us=round(round_trip * 1e6, 2), sets=self.judge.sets,
                       copy_us=round(self.judge.copy_s * 1e6, 2),
                       step_us=round(self.step_s * 1e6, 2), out_bytes=int(self.judge.out_bytes))
        figures.update({"early_stop": settled} if settled else {})
        figures.update(trial_figures(self.trial_s))  # the trials', against the windows'
        if len(self.window_cores) >= len(per_call):  # the runtime's window's cpu over wall
            self.runtime_cores = self.window_cores[-len(per_call):][per_call.index(min(per_call))]
        if self.fill_cpu:  # what the run burnt while the judge filled (charged above noise)
            figures["fill_cpu_us"] = round(max(self.fill_cpu) * 1e6, 2)  # of any window
            figures["fill_charged_us"] = round(set_by * 1e6, 2)  # what the runtime holds
            figures["window_cores"] = round(max(self.window_cores), 3)  # cpu over wall
        return figures

    def _checked(self, n: int) -> float:
        """One window of n calls on fresh inputs: its wall time, plus the run's cpu time
        during the fill above noise; the first window whose outputs or inputs fail the judge's
        checks is the windows' failure (`failed_check`), and the plan goes on as if it passed."""
        meter = self.meter
        before = _quiet(meter, self.runnable) if meter is not None else 0.0
        self.judge.fill(n)
        at_go = meter() if meter is not None else 0.0
        burnt = max(0.0, at_go - before)
        wall = self._window(n)
        inside = max(0.0, meter() - at_go) if meter is not None else 0.0
        # a window faster per call than every one before it may set the runtime: all checked
        per_call = self.call_time(wall, n)
        deep = n > 0 and per_call < self.fastest
        # after a failed check the windows' verdict is made (and stands: `verifier.run.outcome
        # .judged_failure`): the planned windows are served, their checks (each a reference
        # forward and a comparison of its outputs, a GB-sized miss's fp64 second opinion too)
        # are not made. Their time was never a secret (a miss costs the exact scan and that
        # opinion, a pass the fast pass); the orders are, and those are the plan's.
        if not self.failed_check:
            self.failed_check = self.judge.check(n, deep=True) if deep else self.judge.check(n)
        if deep:  # (as after a passing window: the later windows' checks are as deep)
            self.fastest = per_call
        if meter is not None:
            self.fill_cpu.append(burnt)
            self.window_cores.append(inside / max(wall, 1e-9))
        if meter is not None and self.cpus:  # more cores than given: their time is charged
            wall = max(wall, inside / self.cpus)
        self.charged.append(max(0.0, burnt - min(FILL_NOISE_S, NOISE_SHARE * wall)))
        return wall + self.charged[-1]

    def result(self) -> dict[str, Any]:
        """What the judge measured once the windows are over: {"figures", "failure" (the
        worker's doing), "judge_error" (the verifier's), "failed_check" (its checks'),
        "fastest_us" (of the windows checked, a failed run's too: `outcome.held_to_first`)}."""
        figures = self.stop()
        fastest = round(self.fastest * 1e6, 4) if math.isfinite(self.fastest) else None
        return {"figures": {} if self.failed_check else figures, "judge_error": self.judge_error,
                "failure": self.failed_check or self.failure, "failed_check": self.failed_check,
                "trials": self.trials, "fastest_us": fastest}

    def stop(self) -> dict[str, Any]:
        """The figures once the windows are over (or abandoned: the worker is gone)."""
        self._stop.set()
        self._thread.join(timeout=5.0)
        if self.owns_fifos:
            os.close(self.rfd)
            os.close(self.wfd)
        return self.figures


def _quiet(meter: Callable[[], float], runnable: Callable[[], int] | None = None) -> float:
    """The run's cpu time once it is quiet (under 10% of a cpu over QUIET_S, no thread
    `runnable`), waited for at most QUIET_MAX_S: after "d" an honest OpenMP pool spins a few
    ms (on a loaded host partly waiting for a cpu: no cpu time, but state R)."""
    deadline = time.perf_counter() + QUIET_MAX_S
    last = meter()
    while time.perf_counter() < deadline:
        time.sleep(QUIET_S)
        now = meter()
        if now - last < QUIET_S / 10 and not (runnable is not None and runnable()):
            return now
        last = now
    return last


NO_JUDGE = "the verifier has no timing judge on this backend"


def no_judge() -> dict[str, Any]:
    """The result of a run no judge timed (a backend whose device the judge cannot map)."""
    return {"figures": {}, "failure": "", "judge_error": NO_JUDGE}


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 1 << 16):
            pass
    except BlockingIOError:
        pass
