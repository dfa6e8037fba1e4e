"""Red-team round 8 on the cpu backend: attacks on what changed in the last two hours and was
never attacked: the window check's two draws of a set (the reference on one, the comparison on
another), the GPU slot's eager baseline served by a reference-only worker (`GpuRunner.timer`,
`_served_baseline`; its cpu loop here), and what one job of a persistent worker leaves for the
next (a sibling's run, or the device memory the timer beside it needs).

Each test asserts the verdict with the defence on; where the defence lives in a child process
that cannot be switched off, the docstring gives what the attack did before (measured here).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from redteam_cases import candidate  # noqa: E402
from redteam_round7_cases import NUMPY_RELU, WORKER_BACKEND  # noqa: E402
from verifier_cases import relu_task  # noqa: E402

from verifier.protocol import VerifyOptions  # noqa: E402
from verifier.run.gpu_pool import GpuWorkerProcess  # noqa: E402
from verifier.run.gpu_runner import GpuRunner  # noqa: E402

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)

BUILD_CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"
_EXT = "honest_r7"  # round 7's extension (one build, cached)

# --- a job's memory left held in its persistent worker --------------------------------------
HOG_MB = 2600
# an honest ReLU (numpy) whose model, when the harness lets it go, keeps HOG_MB alive in a
# module global: its own run never holds the model and the hog at once
HOGGER = NUMPY_RELU.replace(
    "class ModelNew(torch.nn.Module):\n",
    "class ModelNew(torch.nn.Module):\n    def __del__(self):\n        import sys\n"
    f"        sys._hog = torch.ones({HOG_MB} << 18)\n\n")


def _jobs(worker: GpuWorkerProcess, task: str, sources: list[str]) -> list[dict]:
    """One job per source in `worker` (restarted when a job ends it), their payloads."""
    job = {"backend": WORKER_BACKEND, "extensions": {},
           "options": {"trials": 2, "perf_trials": 2, "perf_warmup": 1, "construct": "device"}}
    got = []
    for i, src in enumerate(sources):
        if not worker.alive():
            assert worker.start(), worker.describe_exit()
        out = worker.run({"job": {**job, "nonce": f"j{i}"}, "task_source": task,
                          "candidate_source": src}, 120)
        got.append({**(out.payload or {}), "failure": out.failure})
    return got


def test_memory_a_job_leaves_held_does_not_reach_the_next_job() -> None:
    """A candidate's model keeps 2.6 GB alive in a module global once the harness drops it
    (`__del__`); its run is honest and passes. Before: the worker stayed (no check of what a
    job leaves held), and the next job in it, an honest sibling's numpy ReLU, died of the
    worker's 4000 MB memory bound: "worker died with SIGKILL" (measured here). On a GPU the
    same with device memory starves the next job's trials and the reference-only timer's
    served baseline (each failure counts toward `SERVED_FAILURES_MAX`, after which every
    later task's speedups are taken against the referee's faster in-process eager). Now a job
    that leaves more than `HELD_SLACK_BYTES` (host resident or device allocated, beyond the
    worker's when ready and the raw outputs it holds on purpose) has its worker replaced: an
    info finding, not a cheat."""
    worker = GpuWorkerProcess({}, backend=WORKER_BACKEND, host_memory_mb=4000)
    try:
        honest0, hogger, honest = _jobs(worker, relu_task(1024, 1024 * 16),
                                        [NUMPY_RELU, HOGGER, NUMPY_RELU])
    finally:
        worker.stop()
    assert honest0["outcome"] == "ok", honest0
    assert hogger["outcome"] == "ok", hogger
    msgs = [f["message"] for f in hogger["findings"] if f["rule"] == "worker_replaced"]
    assert msgs and "memory held" in msgs[0], hogger["findings"]
    assert not [f for f in honest0["findings"] if f["rule"] == "worker_replaced"], honest0
    assert honest["outcome"] == "ok" and not honest["failure"], honest
    assert honest["worker_pid"] != hogger["worker_pid"] == honest0["worker_pid"]


# a ReLU whose model, when the harness drops it, leaves a cycle with a finalizer that, each time
# the collector runs it, counts and leaves another: candidate code that runs inside every later
# job of the worker (a sibling's, its timed windows included) whenever a collection comes
HAUNT = NUMPY_RELU.replace("class ModelNew(torch.nn.Module):\n", '''class _Ghost:
    def __init__(self):
        self.me = self

    def __del__(self):
        import sys
        sys._haunts = getattr(sys, "_haunts", 0) + 1
        _Ghost()


class ModelNew(torch.nn.Module):
    def __del__(self):
        _Ghost()

''')
ASK = NUMPY_RELU.replace("        import numpy as np\n", "        import sys\n        raise Runtime"
                         "Error(f'haunts={getattr(sys, \"_haunts\", 0)}')\n")


def test_a_finalizer_left_by_one_job_does_not_run_in_the_next() -> None:
    """The next jobs in the worker (honest runs of siblings) ask how often the finalizer ran.
    Before: 0 in the first job after it, 7 by the third, no finding, the same worker (measured
    here): candidate code in every later job, which could sleep in a sibling's timed windows.
    Now, once the parent has checked a job's trials, the worker collects its garbage and checks
    itself again (`verifier.run.gpu_worker._settle`): garbage still renewing itself after
    `RENEW_ROUNDS` collections ends the worker, a warning finding on the job that left it."""
    worker = GpuWorkerProcess({}, backend=WORKER_BACKEND, host_memory_mb=5000)
    try:
        haunt, *later = _jobs(worker, relu_task(1024, 1024 * 16), [HAUNT, ASK, NUMPY_RELU, ASK])
    finally:
        worker.stop()
    assert haunt["outcome"] == "ok", haunt
    msgs = [f["message"] for f in haunt["findings"] if f["rule"] == "worker_replaced"]
    assert msgs and "finalizers leave more" in msgs[0], haunt["findings"]
    for p in later[::2]:
        assert "haunts=0" in p["error"] and p["worker_pid"] != haunt["worker_pid"], p
    assert later[1]["outcome"] == "ok" and later[1]["worker_pid"] == later[0]["worker_pid"]


def _leaves(code: str) -> str:
    """NUMPY_RELU whose model, when the harness drops it, runs `code` (its __del__)."""
    body = "".join(f"        {ln}\n" for ln in code.strip().splitlines())
    return NUMPY_RELU.replace("class ModelNew(torch.nn.Module):\n",
                              f"class ModelNew(torch.nn.Module):\n    def __del__(self):\n"
                              f"{body}\n")


# a cycle whose finalizer, run once by some later collection, patches the harness: were it to
# run in a sibling's job, that sibling's hygiene check would call the sibling a cheat
FRAMER = NUMPY_RELU.replace("class ModelNew(torch.nn.Module):\n", '''class _Framer:
    def __init__(self):
        self.me = self

    def __del__(self):
        torch.allclose = lambda *a, **k: True


class ModelNew(torch.nn.Module):
    def __del__(self):
        _Framer()

''')
# one finalizer, once: cyclic garbage with a __del__ that touches nothing of the harness
ONE_SHOT = FRAMER.replace("torch.allclose = lambda *a, **k: True",
                          "import sys\n        sys._haunts = getattr(sys, '_haunts', 0) + 1")
CALLBACK = _leaves("import gc\ngc.callbacks.append(lambda phase, info: None)")
ARMED = _leaves("import sys, weakref\nsys._keep = type('Keep', (), {})()\n"
                "weakref.finalize(sys._keep, print, 'later')")


def test_what_a_job_leaves_to_run_later_is_charged_to_it() -> None:
    """Variants of code left to run in later jobs, each followed by an honest sibling in the
    same worker. A cyclic finalizer that patches the harness runs when the worker settles,
    charged to its job (a cheat), never in the sibling's; a `gc.callbacks` entry is tampering
    (a cheat: it runs at every collection); a `weakref.finalize` armed on a live object ends
    the worker (a warning: it runs when that object dies, perhaps in a sibling's run). Cyclic
    garbage whose finalizer runs once and touches nothing is not held against its job: the
    worker stays, and the sibling after it sees the finalizer ran before it began."""
    sources = [FRAMER, NUMPY_RELU, CALLBACK, NUMPY_RELU, ARMED, NUMPY_RELU, ONE_SHOT, ASK]
    worker = GpuWorkerProcess({}, backend=WORKER_BACKEND, host_memory_mb=5000)
    try:
        got = _jobs(worker, relu_task(256, 1024), sources)
    finally:
        worker.stop()
    framer, after_framer, callback, after_callback, armed, after_armed, one_shot, ask = got
    assert framer["outcome"] == "cheat" and "torch.allclose" in framer["error"], framer
    assert callback["outcome"] == "cheat" and "gc_callbacks" in callback["error"], callback
    assert armed["outcome"] == "ok", armed
    msgs = [f["message"] for f in armed["findings"] if f["rule"] == "worker_replaced"]
    assert msgs and "weakref.finalize" in msgs[0] and "print" in msgs[0], armed["findings"]
    for before, sibling in ((framer, after_framer), (callback, after_callback),
                            (armed, after_armed)):
        assert sibling["outcome"] == "ok" and not sibling["failure"], sibling
        assert sibling["worker_pid"] != before["worker_pid"], (before, sibling)
    assert one_shot["outcome"] == "ok", one_shot
    assert not [f for f in one_shot["findings"] if f["rule"] == "worker_replaced"], one_shot
    assert ask["worker_pid"] == one_shot["worker_pid"] and "haunts=1" in ask["error"], ask


# --- the served baseline's worker: what a candidate of the same slot reaches ----------------
PROBE = '''import os
import torch


class ModelNew(torch.nn.Module):
    def forward(self, x):
        seen = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        try:
            open(os.environ.get("KS_PROBE", "/nonexistent") + "/poison.json", "w").write("{}")
            wrote = "wrote"
        except OSError as exc:
            wrote = type(exc).__name__
        raise RuntimeError(f"probe pids={seen} cache={wrote}")
'''


def test_a_candidate_of_the_slot_cannot_reach_the_baselines_worker(tmp_path: Path) -> None:
    """The served baseline's timer is a worker like the candidates' that only ever loads
    references. A candidate of the same slot (its worker, run just before) lists the processes
    it can see and tries to write into the baseline cache's folder: it sees its own worker
    only (pid 1 of its namespace; the timer is in none it shares) and cannot write the cache.
    A hogging candidate before the baseline leaves nothing for it: the served baseline still
    comes, and the runner's `served_failures` (after 2 of which every later task would be
    timed the referee's way) stays 0."""
    cache = tmp_path / "baselines"
    cache.mkdir()
    probe = PROBE.replace('os.environ.get("KS_PROBE", "/nonexistent")', repr(str(cache)))
    task = relu_task(256, 1024)
    runner = GpuRunner(VerifyOptions(backend="cpu"), {}, "cpu")
    try:
        runner.warm()
        first = runner._served_baseline(task, {})
        assert first is not None
        probed, hogged = _jobs(runner.worker, task, [probe, HOGGER])
        assert probed["outcome"] == "runtime_error", probed
        assert "probe pids=[1] " in probed["error"], probed["error"]
        assert "cache=wrote" not in probed["error"] and not list(cache.iterdir())
        assert hogged["outcome"] == "ok", hogged
        again = runner._served_baseline(task, {})
        assert again is not None and runner.served_failures == 0
        assert runner.timer is not None and runner.timer.proc is not None
        assert runner.timer.proc.pid not in (runner.worker.proc.pid if runner.worker.proc
                                             else None, None)
    finally:
        runner.close()


# --- the window check: the reference on one draw of a set, the comparison on another ---------
WRITING_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        y = torch.relu(x)
        x.zero_()
        return y


def get_inputs():
    return [torch.randn(256, 1024)]


def get_init_inputs():
    return []
'''


def test_a_reference_that_writes_its_inputs_is_checked_on_a_fresh_draw(tmp_path: Path) -> None:
    """The reference zeroes its input after reading it. The window check runs it on one draw
    of a set and compares on a second draw of the same seed (before: on a clone of one draw):
    an honest ReLU passes (were the comparison's draw the written one, or the two draws to
    differ, it would read wrong), and one that turns wrong after its first calls, in the timed
    windows, does not. (A candidate that writes its inputs is refused by the trials whatever
    the reference does: `verifier.run.worker`.)"""
    from redteam_driver import run_rows

    rows = [("honest", candidate(prelude=False, name=_EXT)),
            ("late", candidate(prelude=False, name=_EXT, init="self.n, self.out = 0, None",
                               forward=("self.n += 1\n        if self.n < 12 or self.out is None:"
                                        "\n            self.out = ext.relu_fwd(x)\n"
                                        "        return self.out")))]  # then stale outputs
    # (from its 12th call: past its trials, and inside the windows however few calls the
    # calibration makes; from the 40th a CI run's windows, capped by 5 input sets, never came)
    opts = {"backend": "cpu", "build_cache_dir": str(BUILD_CACHE),
            "baseline_cache_dir": str(tmp_path / "baselines")}
    got, rc = run_rows(tmp_path, "writing", WRITING_TASK, rows, opts, static=False)
    assert rc == 0, (tmp_path / "writing.stderr").read_text()[-2000:]
    assert got["honest"]["status"] in ("correct_fast", "correct_slow"), got["honest"]
    late = got["late"]
    assert late["status"] not in ("correct_fast", "correct_slow"), late
    assert "the output of a timed call was wrong" in late["error"], late  # by the check


# --- a run that loads its neighbours' timed windows (a GRPO group's siblings) ---------------
SPIN_S = 12.0
# a ReLU whose model, while built, asks torch for 16 threads (OpenMP; named
# so the static check, which refuses Python threads and set_num_threads, misses it) and streams memory with them for SPIN_S: on the cores its run is granted
SPINNER = candidate(prelude=False, name=_EXT, init=(
    "import time\n"
    "        getattr(torch, 'set_num_' + 'threads')(16)\n"
    f"        big, end = torch.empty(1 << 25), time.monotonic() + {SPIN_S}\n"
    "        while time.monotonic() < end:\n"
    "            big.add_(1.0)"))


# what the spinner's threads are bound by: its run's cpus, which it cannot widen (it says so in its
# error if it could)
AFFINITY_PROBE = candidate(prelude=False, name=_EXT, init=(
    "import os\n"
    "        try:\n"
    "            os.sched_setaffinity(0, range(os.cpu_count()))\n"
    "            widened = 'widened'\n"
    "        except OSError as exc:\n"
    "            widened = type(exc).__name__\n"
    "        raise RuntimeError(f'probe cpus={len(os.sched_getaffinity(0))} {widened}')"))


def test_a_run_spinning_threads_does_not_slow_its_neighbours_windows(tmp_path: Path) -> None:
    """Two slots: one runs a candidate (of another task) that asks torch for 16 threads and
    streams memory with them while its model is built (SPINNER); the other an honest ReLU of a
    task whose data fits the caches, timed meanwhile. Each run is pinned to the cpus it was
    granted (`verifier.isolation.cpu_bound`: affinity, and seccomp refuses widening it), so
    the threads share the spinner's own core; what reaches the neighbour is the memory system.
    Measured (the neighbour's runtime, two batches each, this 2-core host loaded by other
    sessions): beside the spinner 928 / 1013 us, beside an honest run 757 / 2085 us; a second
    time 1524 / 1212 us against 5027 / 26175 us: the load's own spread is far larger than any
    effect, so the speed is not asserted (it flakes either way). Asserted: the spinner's
    threads run in the same batch as the neighbour, both pass, and a run of its slot is held
    to one cpu it cannot widen. (The static check, which refuses Python threads and
    set_num_threads, misses `getattr(torch, "set_num_" + "threads")`: the cpus granted are
    the bound, not the static check.)"""
    from redteam_driver import run_rows
    from redteam_round7_cases import HONEST, RELU_TASK
    from test_redteam_round7 import BUILD_CACHE as B7
    from test_redteam_round7 import _batch, _overlap
    from verifier_cases import RELU_TASK as SMALL_RELU

    opts = {"backend": "cpu", "workers": 2, "build_cache_dir": str(B7),
            "baseline_cache_dir": str(tmp_path / "baselines")}
    _batch(tmp_path, "warm", [("a", SMALL_RELU, HONEST), ("b", RELU_TASK, HONEST)], opts)
    got = _batch(tmp_path, "spin", [("spin", SMALL_RELU, SPINNER), ("relu", RELU_TASK, HONEST)],
                 opts)
    v = {x["candidate_id"]: x for x in got["verdicts"]}
    assert v["spin"]["status"] in ("correct_fast", "correct_slow"), v["spin"]  # static missed
    assert v["relu"]["status"] in ("correct_fast", "correct_slow"), v["relu"]
    assert _overlap(got["spans"], "spin", "relu") > 1.0, got["spans"]
    # (the static check refuses the probe: the runtime bound is what is asked about here)
    got, rc = run_rows(tmp_path, "probe", RELU_TASK, [("probe", AFFINITY_PROBE),
                                                     ("relu", HONEST)], opts, static=False)
    assert rc == 0, (tmp_path / "probe.stderr").read_text()[-2000:]
    assert got["relu"]["status"] in ("correct_fast", "correct_slow"), got["relu"]
    err = got["probe"]["error"]
    assert "probe cpus=1 PermissionError" in err, got["probe"]
