"""Red-team round 7 on the cpu backend: attacks on what changed since round 6 and was never
attacked: the quiet check's runnable rule, models built on the device (and the host fallback),
the ip sampler's cpu-time gate, the judge's window inputs, and the eager baseline served
through the same judge (timed while other slots run).

Each test asserts the verdict with the defence on and, where the defence can be switched off,
that the attack gets through without it (so it cannot pass for want of an attack). What the
worker's calls really ran is written by the worker to a file the judge never reads. GPU forms:
benchmarks/redteam_gpu.py --round7 (named in each test's docstring where one exists).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
from redteam_round7_cases import (  # noqa: E402
    DEFAULT_DEVICE_SETTER,
    HONEST,
    HOST_FORCING,
    LOAD_S,
    LOADER,
    MODE_LEFT_BEHIND,
    NUMPY_RELU,
    RELU_TASK,
    SLEEPY_WINDOWS,
)
from sampled_child import end, spawn  # noqa: E402
from sampler_cases import (  # noqa: E402
    CHILD_ENV,
    NEEDS_PTRACE,
    WORKER,
    NoCheckJudge,
    build_spin,
    median,
    sampled_run,
)
from test_clock_rogues import threads_cpu_s, threads_runnable  # noqa: E402
from verifier_cases import RELU_TASK as SMALL_RELU  # noqa: E402
from verifier_cases import SCALE_TASK  # noqa: E402

from verifier.isolation.cpu_meter import CpuCgroup  # noqa: E402
from verifier.judge import ip_sampler as ips  # noqa: E402
from verifier.judge.clock import JudgeClock  # noqa: E402
from verifier.judge.window_judge import WindowJudge  # noqa: E402

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)

TOL = (1e-4, 1e-4, 1e-2, 1e-2)


class _Judge(NoCheckJudge):
    """A judge with nothing to check (these attacks are about where the calls' time goes);
    `fill_s`: how long its fill takes, `marker`: a file it touches as its fill begins (where a
    worker would see the arena's inputs land)."""

    def __init__(self, fill_s: float = 0.0, marker: Path | None = None) -> None:
        self.fill_s, self.marker, self.fills = fill_s, marker, 0

    def fill(self, n: int) -> None:
        self.fills += 1
        if self.marker is not None:
            self.marker.write_text(str(self.fills))
        time.sleep(self.fill_s)


@pytest.fixture(scope="module")
def spin7(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run's own object: round 5's spin loop, built here."""
    return build_spin(tmp_path_factory.mktemp("spin7"), "libks_own7.so")


# --- the ip sampler's gate: calibration windows slept through --------------------------------
def _metered_sampled_run(work: Path, spin: Path) -> tuple[dict[str, Any], JudgeClock,
                                                          list[tuple[str, float]]]:
    """The sampling clock's result for SLEEPY_WINDOWS, its worker metered by its threads' cpu
    time (as a run's cgroup meters it), and the worker's own log."""
    clock = ips.SamplingClock(_Judge(), workdir=work, wait_s=60.0)

    def meter(worker: int) -> None:
        clock.watch(lambda: threads_cpu_s(worker), cpus=1, runnable=threads_runnable(worker))

    res, calls = sampled_run(work, SLEEPY_WINDOWS, spin, clock=clock, started=meter)
    return res, clock, calls


@NEEDS_PTRACE
def test_windows_slept_through_do_not_hide_a_library_call_from_the_sampler(
        tmp_path: Path, spin7: Path) -> None:
    """A run that sleeps after its calls in every window but the one that sets the runtime
    (right outputs, slow windows) put the windows' median cpu over wall near 0.15, so the ip
    sampler's gate (`MIN_CALL_S` on runtime x that median) read its ~0.6 ms library call as
    ~80 us and never sampled it: numpy's BLAS computed every call, no trace or rule sees it.
    The gate now reads the cpu over wall of the window that set the runtime: the library's
    call at one core, sampled, found. No GPU form (the sampler is the cpu backend's judge)."""
    held = []
    for i in range(3):  # how many compute samples a loaded host's sampler gets is chance
        work = tmp_path / f"run{i}"
        work.mkdir()
        res, clock, calls = _metered_sampled_run(work, spin7)
        modes = {m for m, _ in calls}
        assert modes == {"slept", "lib"}, modes  # it did alternate
        runtime_s = res["figures"]["runtime_us"] * 1e-6
        # off: the median rule read the library call as too short to sample (on a quiet
        # host; under load the call itself takes longer, so this is not asserted: CI's -x)
        old_gate = runtime_s * min(1.0, median(clock.window_cores)) < ips.MIN_CALL_S
        # on: sampled (the window that set the runtime ran at about one core)
        assert "skipped" not in res["ip_samples"], (res["ip_samples"], clock.window_cores)
        held.append((res["failure"], old_gate))
        if res["failure"].startswith("library_time"):
            break
    assert any(f.startswith("library_time") for f, _ in held), held


# --- the window judge's inputs: one set's seed told the next windows' ------------------------
def test_one_sets_seed_reveals_no_other_sets_inputs(tmp_path: Path) -> None:
    """torch seeds its host generator with a seed's low 32 bits, and the judge's sets were
    seeded base + 1, base + 2, ...: a run that found one set's seed (a search of 2^32 seeds
    against the first values of a set it saw: minutes of a GPU's time, or the run's cores
    between windows, where nothing is charged) knew every later window's inputs before their
    fill, and could compute their outputs while the judge checked (uncharged) and answer each
    call from memory. Each set's seed is drawn alone now: knowing one (here told to the
    attacker, standing in for the search) predicts no other set."""
    from verifier.judge import decide

    torch.manual_seed(5)
    a = torch.rand(8)
    torch.manual_seed(5 + (1 << 32))
    assert torch.equal(a, torch.rand(8))  # 32 bits: the search is 2^32 seeds, not 2^40
    judge = WindowJudge(SCALE_TASK, 0, TOL, 1 << 20, path=str(tmp_path / "arena"))
    try:
        judge.fill(4)
        known = judge._set_seeds[0]  # what the search found (the test tells it)
        seen = [[t.clone() for t in v] for v in judge.views[:4]]
        judge.fill(4)  # the next window
        later = [[t.clone() for t in v] for v in judge.views[:4]]
        guesses = [known + k for k in range(1, 12)]  # every seed the old sequence used next
        predicted = [decide.make_inputs(judge.get_inputs, s) for s in guesses]
        hits = [any(torch.equal(p[0], got[0]) for p in predicted) for got in seen[1:] + later]
        assert not any(hits), hits
        parities = {s % 2 for s in judge._set_seeds}
        assert parities == {0, 1}  # signed and unsigned sets in every window, as before
    finally:
        judge.close()


# --- the quiet check: a helper that naps across it and computes while the judge fills --------
NAPPER = """
import os, threading
from pathlib import Path
lib = ctypes.CDLL({spin!r})
lib.spin.argtypes, lib.spin.restype = [ctypes.c_long], ctypes.c_double
marker = Path("fill.marker")
done = []


def burst():  # the 'precompute': a thread of its own, gone before the judge says "w"
    t0 = time.thread_time()
    lib.spin({burst_n})
    done.append(time.thread_time() - t0)


def watcher():  # naps 0.2 ms at a time: no cpu to speak of, asleep at every look
    last = None
    while True:
        try:
            seen = marker.stat().st_mtime_ns
        except OSError:
            seen = None
        if seen != last and seen is not None:
            last = seen
            threading.Thread(target=burst).start()
        time.sleep(0.0002)


threading.Thread(target=watcher, daemon=True).start()


def call(x):
    lib.spin({own_n})
    with open("bursts.log", "w") as fh:
        fh.write(" ".join(f"{{s:.6f}}" for s in done))
"""


def test_a_helper_that_naps_across_the_quiet_check_is_charged_for_the_fill(
        tmp_path: Path, spin7: Path) -> None:
    """The quiet check waits for the run's cpu to stop and no thread to be runnable; a helper
    that naps 0.2 ms at a time is quiet at every look, then, when the inputs land (a marker
    here), starts a thread that computes for ~15 ms and exits before "w". The run's cgroup
    counts that thread's time though it is gone: each fill is charged with it (and the
    runtime holds it)."""
    group = CpuCgroup.make()
    if group is None:
        pytest.skip("no cpu meter cgroup (v1 cpuacct or v2) this process can write")
    import ctypes

    lib = ctypes.CDLL(str(spin7))
    lib.spin.argtypes = [ctypes.c_long]
    t0 = time.thread_time()
    lib.spin(2_000_000)
    per = (time.thread_time() - t0) / 2_000_000
    burst_n, own_n = int(0.015 / per), int(0.001 / per)
    setup = "import time\n" + NAPPER.format(spin=str(spin7), burst_n=burst_n, own_n=own_n)
    clock = JudgeClock(_Judge(fill_s=0.15, marker=tmp_path / "fill.marker"), workdir=tmp_path,
                       wait_s=60.0)
    with open(tmp_path / "worker.stderr", "w") as err:
        child, worker = spawn(WORKER.format(setup=setup), cwd=tmp_path, env=CHILD_ENV,
                              stderr=err)
    try:
        (group.path / "cgroup.procs").write_text(str(worker))
        clock.watch(group.cpu_s, cpus=1, runnable=group.runnable)
        rc = child.wait(timeout=180)
    finally:
        end(child, worker)
        res = clock.result()
        group.remove()
    assert rc == 0, (tmp_path / "worker.stderr").read_text()[-2000:]
    bursts = [float(s) for s in (tmp_path / "bursts.log").read_text().split()]
    assert len(bursts) >= 3 and median(bursts) >= 0.01, bursts  # it did compute in the fills
    assert res["failure"] == "", res
    fig = res["figures"]
    assert fig["fill_charged_us"] >= 0.5 * median(bursts) * 1e6, fig
    assert fig["runtime_us"] * fig["calls"] >= 0.5 * median(bursts) * 1e6, fig


# --- models built on the device: a candidate that forces the host's way ----------------------
BUILD_CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"


def test_a_candidate_that_forces_the_hosts_construction_gains_nothing(tmp_path: Path) -> None:
    """A model that calls torch.set_default_device in __init__ (refused under the device
    context, which undoes it on exit) and builds on the host makes the run go again the KernelBench way for its reference
    too: same weights on both sides (on a cpu, the same draws), the verdict of its forward as
    an honest one's, an info finding naming it, the task's cached baseline untouched (it is
    timed by a process that never ran candidate code, built its own way), and its honest
    neighbour built on the device. Its cost: the run twice (bounded: one more run; a GPU
    level-3 model, 8-20 s more). GPU form: benchmarks/redteam_gpu.py --round7 (host_forcing)."""
    from redteam_driver import run_rows

    opts = {"backend": "cpu", "build_cache_dir": str(BUILD_CACHE),
            "baseline_cache_dir": str(tmp_path / "baselines")}
    first, rc = run_rows(tmp_path, "honest", SMALL_RELU, [("honest", HONEST)], opts)
    assert rc == 0, (tmp_path / "honest.stderr").read_text()[-2000:]
    cached = {p.name: p.read_text() for p in (tmp_path / "baselines").glob("*.json")}
    assert cached
    got, rc = run_rows(tmp_path, "forcing", SMALL_RELU,
                       [("forcing", HOST_FORCING), ("honest", HONEST)], opts)
    assert rc == 0, (tmp_path / "forcing.stderr").read_text()[-2000:]
    forcing, honest = got["forcing"], got["honest"]
    rules = [f["rule"] for f in forcing["findings"]]
    assert "host_construction" in rules, forcing
    assert forcing["status"] in ("correct_fast", "correct_slow"), forcing
    assert honest["status"] == first["honest"]["status"] or honest["status"] in (
        "correct_fast", "correct_slow"), honest
    assert "host_construction" not in [f["rule"] for f in honest["findings"]], honest
    assert {p.name: p.read_text() for p in (tmp_path / "baselines").glob("*.json")} == cached


# --- the eager baseline timed while another slot runs a candidate ----------------------------
DRIVER = """
import json, sys, threading, time
import verifier.api as api
import verifier.run.baselines as baselines
from verifier.protocol import VerifyOptions, VerifyRequest
from verifier.run.runners import SandboxRunner

spec = json.load(open(sys.argv[1]))
if not spec["turns"]:  # the defence off: every run and baseline at once, as before
    import contextlib
    baselines.Baselines.turn = lambda self, baseline=False: contextlib.nullcontext()
spans, lock = [], threading.Lock()
real = SandboxRunner.run


def run(self, item, job, pace=None):
    t0 = time.monotonic()
    try:
        return real(self, item, job, pace)
    finally:
        with lock:
            spans.append({"what": "baseline" if job.get("baseline_only") else item.req.candidate_id,
                          "start": t0, "end": time.monotonic()})


SandboxRunner.run = run
reqs = [VerifyRequest(r["id"], r["id"], r["task"], r["code"], "cpu") for r in spec["rows"]]
verdicts = api.verify_batch(reqs, VerifyOptions(**spec["options"]))
json.dump({"spans": spans, "verdicts": [v.to_dict() for v in verdicts]}, open(spec["out"], "w"))
"""


def _batch(work: Path, name: str, rows: list[tuple[str, str, str]], opts: dict[str, Any],
           turns: bool = True) -> dict[str, Any]:
    """Verify `rows` (id, task, code) in a fresh verifier process; its runs' spans, verdicts."""
    spec = {"rows": [{"id": i, "task": t, "code": c} for i, t, c in rows], "options": opts,
            "turns": turns, "out": str(work / f"{name}.out.json")}
    (work / f"{name}.json").write_text(json.dumps(spec))
    (work / "driver.py").write_text(DRIVER)
    proc = subprocess.run([sys.executable, str(work / "driver.py"), str(work / f"{name}.json")],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=str(work),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((work / f"{name}.out.json").read_text())


def _overlap(spans: list[dict[str, Any]], a: str, b: str) -> float:
    """Seconds runs named `a` and `b` ran at once."""
    return sum(max(0.0, min(x["end"], y["end"]) - max(x["start"], y["start"]))
               for x in spans if x["what"] == a for y in spans if y["what"] == b)


def test_a_baseline_is_timed_with_the_host_to_itself(tmp_path: Path) -> None:
    """Two slots: one runs a candidate of another task that streams memory on its own cores
    for LOAD_S while its model is built; the other times the eager baseline of a ReLU (whose
    data fits the caches the loader flushes). Before: both at once (the baseline then cached
    for every later candidate of the task: a candidate could raise its task's speedups by
    loading the host while the baseline was timed). Now a baseline waits for the runs in flight
    and holds new ones back: no second of it beside a candidate's run. No GPU form (a GPU
    slot's referee times its baseline on its own device)."""
    opts = {"backend": "cpu", "workers": 2, "build_cache_dir": str(BUILD_CACHE)}
    spans = {}
    for name, turns in (("off", False), ("on", True)):
        work = tmp_path / name
        work.mkdir()
        o = {**opts, "baseline_cache_dir": str(work / "baselines")}
        _batch(work, "warm", [("small", SMALL_RELU, HONEST)], o)  # its baseline cached
        got = _batch(work, "load", [("loader", SMALL_RELU, LOADER),
                                    ("relu", RELU_TASK, HONEST)], o, turns)
        status = {v["candidate_id"]: v["status"] for v in got["verdicts"]}
        assert status["relu"] in ("correct_fast", "correct_slow"), got["verdicts"]
        spans[name] = got["spans"]
    # off: the baseline was timed while the loader ran (how much slower it reads depends on
    # the host's caches and on when the load begins: not asserted, the overlap is)
    assert _overlap(spans["off"], "baseline", "loader") > 0.5, spans["off"]
    assert _overlap(spans["on"], "baseline", "loader") == 0.0, spans["on"]
    assert _overlap(spans["on"], "baseline", "relu") == 0.0, spans["on"]
    loader = next(s for s in spans["on"] if s["what"] == "loader")
    assert loader["end"] - loader["start"] >= 0.8 * LOAD_S, spans["on"]


def test_host_turns_hold_new_runs_while_a_baseline_waits() -> None:
    """A baseline that waits for a run in flight holds a later run back (else a stream of runs
    on many slots would starve it), and runs share the host with each other."""
    from verifier.run.baselines import HostTurns

    turns, order = HostTurns(), []
    first_in = threading.Event()

    def a_run(name: str, hold_s: float, go: threading.Event | None = None) -> None:
        with turns.run():
            order.append(f"{name}+")
            if go is not None:
                go.set()
            time.sleep(hold_s)
            order.append(f"{name}-")

    def baseline() -> None:
        with turns.alone():
            order.append("B+")
            time.sleep(0.05)
            order.append("B-")

    r1 = threading.Thread(target=a_run, args=("r1", 0.3, first_in))
    r1.start()
    first_in.wait(5)
    b = threading.Thread(target=baseline)
    b.start()
    time.sleep(0.05)  # the baseline waits for r1
    r2 = threading.Thread(target=a_run, args=("r2", 0.0))
    r2.start()
    for t in (r1, b, r2):
        t.join(10)
    assert order == ["r1+", "r1-", "B+", "B-", "r2+", "r2-"], order


# --- a persistent worker: what one job leaves for the next ----------------------------------
def _two_jobs(first: str, construct: str = "device") -> tuple[dict[str, Any], dict[str, Any]]:
    """The payloads of `first` and then NUMPY_RELU, one job each, in one persistent worker (its
    cpu loop: the same code a GPU worker runs), as test_gpu_worker's jobs are sent."""
    from verifier.run.gpu_pool import GpuWorkerProcess

    job = {"nonce": "j1", "backend": "cpu", "extensions": {},
           "options": {"trials": 2, "perf_trials": 2, "perf_warmup": 1, "construct": construct}}
    worker = GpuWorkerProcess({}, backend="cpu")
    try:
        a = worker.run({"job": job, "task_source": SMALL_RELU, "candidate_source": first}, 60)
        b = worker.run({"job": {**job, "nonce": "j2", "options": {**job["options"],
                                                                   "construct": "device"}},
                        "task_source": SMALL_RELU, "candidate_source": NUMPY_RELU}, 60)
    finally:
        worker.stop()
    assert a.payload and b.payload, (a.failure, b.failure)
    return a.payload, b.payload


def test_a_mode_left_on_torchs_stack_does_not_reach_the_next_job() -> None:
    """Before: the worker's checks between jobs compared replaced functions and a few global
    flags, not torch's mode stacks, so the mode stayed for the next job, whose honest run then
    ended in a runtime_error (the harness's own calls returned x + 1). Now a mode left on
    either stack is tampering: the job is a cheat and its worker is replaced, so the next job
    runs in a clean process. GPU form: benchmarks/redteam_gpu.py --round7 (mode_left_behind)."""
    first, second = _two_jobs(MODE_LEFT_BEHIND)
    assert first["outcome"] == "cheat", first
    assert "function_modes" in first["error"], first["error"]
    assert second["outcome"] == "ok" and float(second["max_abs_diff"]) == 0.0, second
    assert second["worker_pid"] != first["worker_pid"]


def test_a_default_device_set_by_a_model_is_not_handed_to_the_next_job() -> None:
    """torch.set_default_device in a model's __init__ is why a run is built the KernelBench
    way (`verifier.judge.construct`, HOST: kept for forward); the worker then held that default
    (and its mode) for every later job. Now such a job is not a cheat, and its worker is
    replaced (an info finding says so)."""
    first, second = _two_jobs(DEFAULT_DEVICE_SETTER, construct="host")
    assert first["outcome"] == "ok", first
    assert any(f["rule"] == "worker_replaced" for f in first["findings"]), first["findings"]
    assert second["outcome"] == "ok" and second["worker_pid"] != first["worker_pid"], second


# --- the judge's reads after "d": slots written behind the judge's back ----------------------
def _process_cpu_s(pid: int) -> float:
    """Seconds on a cpu of process `pid`, exited threads included (its process cpu clock, the
    kernel's `MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)`): where no meter cgroup can be made."""
    try:
        return time.clock_gettime(((~pid) << 3) | 2)
    except OSError:  # gone
        return 0.0


def _raced(work: Path, mode: str, sets: int = 128, stepped: bool = False) -> dict[str, Any]:
    """The judge's clock over SCALE_TASK's windows, served by RACE_WORKER in `mode`, metered
    as a runner meters a run: its cpu time (the run's cgroup where one can be made, else its
    process cpu clock), one cpu given (`JudgeClock.watch`); `stepped`: as the cpu runner's
    judge times its windows (`verifier.judge.stepped`)."""
    from redteam_round7_cases import RACE_WORKER

    set_bytes = 64 * 32 * 4
    judge = WindowJudge(SCALE_TASK, 0, TOL, 3 * set_bytes * sets, path=str(work / "arena"))
    (work / "spec.json").write_text(json.dumps({**judge.spec, "path": str(work / "arena")}))
    (work / "race.py").write_text(RACE_WORKER)
    clock = JudgeClock(judge, workdir=work, wait_s=30.0, stepped=stepped)
    group = CpuCgroup.make()
    pid = [0]
    if group is not None:
        clock.watch(group.cpu_s, cpus=1, runnable=group.runnable)
    else:  # read only after the worker said "t": by then its pid is known
        clock.watch(lambda: _process_cpu_s(pid[0]), cpus=1, runnable=lambda: threads_runnable(
            pid[0])())
    try:
        proc = subprocess.Popen([sys.executable, str(work / "race.py"), str(work / "spec.json"),
                                 mode], cwd=work, env={**CHILD_ENV, "PYTHONPATH": str(ROOT)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        pid[0] = proc.pid
        if group is not None:  # before its first window: the worker imports torch first
            (group.path / "cgroup.procs").write_text(str(proc.pid))
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
    finally:
        res = clock.result()
        judge.close()
        if group is not None:
            group.remove()
    return res


def test_slots_written_after_d_are_caught_by_the_stepped_judge(tmp_path: Path) -> None:
    """(test_clock_rogues' "early" worker, which writes every slot after "d", made to race:
    the last slot first, windows shrunk so each is deep-checked, one pass in order.)
    An unstepped judge draws its checked calls after "d", then reads their slots one at a
    time: a worker of its own loop that answers "d" after one call and writes the other slots
    from then on, in order, in one pass (torch.add, ~1 us a slot), races those reads. Metering
    the run's cpu time as "d" is in charges what it wrote before the judge woke, but not what
    it writes while the judge reads: on a quiet 2-core host the writer stays ahead of the
    reader (CI, session 16: 1.93 us a call against the honest worker's 4.12). So the cpu
    runner's judge is stepped (`verifier.judge.stepped`): it reads each call's slot as the call
    says it is written, before the next call's set exists, so a slot written after "d" was
    read empty (GPU judges are unstepped: see the module docstring there). Held in each of
    three runs: caught, while the honest worker of the same loop is timed."""
    for i in range(3):
        (tmp_path / f"honest{i}").mkdir()
        honest = _raced(tmp_path / f"honest{i}", "honest", stepped=True)
        assert honest["failure"] == "" and honest["figures"]["runtime_us"] > 0, honest
        (tmp_path / f"race{i}").mkdir()
        race = _raced(tmp_path / f"race{i}", "race", stepped=True)
        assert "the output of a timed call was wrong" in race["failure"], race
