"""The persistent execution worker (`verifier.run.gpu_worker`), run here with the cpu backend.

On a GPU host the same loop keeps one process per GPU; what it must guarantee does not need a
GPU to test: one job after another in one process, each verdict as the sandboxed path gives it,
and a candidate that crashes, hangs or tampers with the process ends only its own run, the next
candidate getting a fresh worker.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from verifier.api import verify_batch
from verifier.backends.cpu import CpuBackend
from verifier.protocol import CORRECT_STATUSES, VerifyOptions, VerifyRequest
from verifier.run.gpu_pool import GpuWorkerProcess
from verifier.run.gpu_worker import global_flags, watched_state

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import RELU_TASK, relu_candidate, relu_ok  # noqa: E402

CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"

WRONG = relu_ok().replace("in[i] > 0.f ? in[i] : 0.f", "in[i] > 0.f ? in[i] : 0.1f")
SEGFAULT = relu_candidate(
    "torch::Tensor relu_fwd(torch::Tensor x) {\n  volatile float* p = nullptr;\n"
    "  *p = 1.f;\n  return x;\n}")
HANG = relu_ok().replace("return ext.relu_fwd(x)", "while True:\n            pass")


def _opts(tmp_path: Path) -> VerifyOptions:
    return VerifyOptions(backend="cpu", workers=1, compile_workers=1, compile_batch=16,
                         run_timeout_s=15.0, trials=3, perf_trials=3, perf_warmup=1,
                         build_cache_dir=str(CACHE), baseline_cache_dir=str(tmp_path / "bl"))


@pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)
def test_one_process_many_jobs_and_bad_jobs_end_only_themselves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CpuBackend, "persistent_worker", True)
    order = [("ok1", relu_ok()), ("wrong", WRONG), ("ok2", relu_ok("relu_b")),
             ("crash", SEGFAULT), ("ok3", relu_ok("relu_c")), ("hang", HANG),
             ("ok4", relu_ok("relu_d"))]
    timings: dict = {}
    verdicts = verify_batch([VerifyRequest(n, "relu", RELU_TASK, c, "cpu") for n, c in order],
                            _opts(tmp_path), timings=timings)
    v = {x.candidate_id: x for x in verdicts}
    for name in ("ok1", "ok2", "ok3", "ok4"):
        assert v[name].status in CORRECT_STATUSES, (name, v[name].error)
        assert v[name].runtime_us and v[name].eager_us and v[name].trials == 3
    assert v["wrong"].status == "incorrect" and v["wrong"].max_abs_diff, v["wrong"].error
    assert v["crash"].status == "runtime_error" and "SIGSEGV" in v["crash"].error
    assert v["hang"].status == "timeout"
    assert {t.get("worker_device") for n, t in timings.items() if n.startswith("ok")} == {"cpu"}
    rules = {name: {f["rule"] for f in v[name].findings} for name in v}
    for name in ("ok1", "ok2", "ok3", "ok4"):  # the judge's own clock timed the windows
        clock = timings[name]["judge_clock"]  # (one where load made it settle at once)
        windows = 1 if "timing_settled" in rules[name] else 3
        assert len(clock["windows_us"]) == windows and clock["runtime_us"] == v[name].runtime_us
    # builds land in any order, so the run order is read back, not assumed
    ran = sorted(timings, key=lambda n: timings[n]["exec_end"])
    pid = {n: timings[n].get("worker_pid") for n in ran if n not in ("crash", "hang")}
    current, seen = None, set()
    for name in ran:
        if name in ("crash", "hang"):  # it ends its process: the next one gets a fresh one
            current = None
            continue
        if current is None or "confirmed_fresh" in rules[name]:  # (load tripped a rule:
            assert pid[name] not in seen, (ran, pid)  # made again in a fresh worker)
        else:  # after a good or a merely wrong candidate the same process goes on
            assert pid[name] == current, (ran, pid)
        current = pid[name]
        seen.add(current)
    ended = 1 + sum(n in ("crash", "hang") for n in ran[:-1])  # (a confirmed run right after
    assert ended <= len(seen) <= ended + sum("confirmed_fresh" in rules[n] for n in ran)  # one)


def test_tampering_the_static_stage_missed_is_caught_between_jobs() -> None:
    """A candidate that replaces a torch function (here without an extension, straight to the
    worker) is a cheat, and the worker it used is not trusted with the next candidate."""
    task = RELU_TASK
    patcher = ("import torch\nimport torch.nn.functional as F\nF.gelu = lambda x: x\n"
               "class ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
               "        return x.clamp_min(0)\n")
    job = {"nonce": "n1", "backend": "cpu", "extensions": {},
           "options": {"trials": 2, "perf_trials": 2, "perf_warmup": 1}}
    worker = GpuWorkerProcess({}, backend="cpu")
    try:
        first = worker.run({"job": job, "task_source": task, "candidate_source": patcher}, 60)
        assert first.payload and first.payload["outcome"] == "cheat"
        msgs = [f["message"] for f in first.payload["findings"]]
        assert any("torch.nn.functional.gelu changed" in m for m in msgs), msgs
        plain = patcher.replace("F.gelu = lambda x: x\n", "")
        second = worker.run({"job": {**job, "nonce": "n2"}, "task_source": task,
                             "candidate_source": plain}, 60)
        assert second.payload and second.payload["nonce"] == "n2"
        assert second.payload["worker_pid"] != first.payload["worker_pid"]
        assert worker.starts == 2
    finally:
        worker.stop()


def test_the_watch_sees_replaced_functions_and_global_state() -> None:
    import torch
    import torch.nn.functional as F

    state, flags = watched_state(), global_flags()
    assert "torch.nn.functional.softmax" in state and "torch.Tensor.__eq__" in state
    original = F.softmax
    try:
        F.softmax = lambda *a, **k: None
        assert watched_state()["torch.nn.functional.softmax"] != state[
            "torch.nn.functional.softmax"]
    finally:
        F.softmax = original
    assert watched_state() == state
    torch.set_default_dtype(torch.float64)
    try:
        assert global_flags()["default_dtype"] != flags["default_dtype"]
    finally:
        torch.set_default_dtype(torch.float32)
    # a handler or a timer left behind would run candidate code after its run
    before = signal.signal(signal.SIGALRM, lambda *a: None)
    try:
        assert global_flags()["signal_handlers"] != flags["signal_handlers"]
    finally:
        signal.signal(signal.SIGALRM, before)
    signal.setitimer(signal.ITIMER_VIRTUAL, 100.0)
    try:
        assert global_flags()["timers"] != flags["timers"]
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
    assert global_flags() == flags


def test_threads_the_harness_started_are_not_held_against_the_candidate() -> None:
    """torch.compile baselines start helper threads before the candidate runs: not a cheat.
    A thread that appears after the candidate's code ran is."""
    import threading

    from verifier.run.gpu_worker import after_job

    state, flags, threads = watched_state(), global_flags(), threading.active_count()
    stop = threading.Event()
    helper = threading.Thread(target=stop.wait, daemon=True)
    helper.start()
    try:
        harness = {"outcome": "ok", "findings": [], "harness_threads": threading.active_count()}
        assert not after_job(harness, state, flags, threads) and harness["outcome"] == "ok"
        candidate = {"outcome": "ok", "findings": [], "harness_threads": threads}
        assert after_job(candidate, state, flags, threads) and candidate["outcome"] == "cheat"
        assert "threads" in candidate["error"]
    finally:
        stop.set()
        helper.join()


def _comms(marker: str) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == marker:
                    found.append(int(d.name))
            except OSError:
                continue
    return found


def test_the_worker_is_sandboxed_and_a_process_left_behind_ends_it() -> None:
    """The worker runs as its own unprivileged user in its own pid namespace (the candidate
    cannot reach the verifier), and a process a candidate leaves running is a cheat: the
    worker ends, taking the process with it."""
    import os
    import time

    marker = f"ksstray{os.getpid() % 100000}"
    forker = ("import ctypes, os, time, torch\n"
              "if os.fork() == 0:\n"
              f"    ctypes.CDLL(None).prctl(15, b'{marker}', 0, 0, 0)\n"
              "    time.sleep(120)\n    os._exit(0)\n"
              "info = (os.getuid(), os.getpid(), os.getppid(), os.getcwd())\n"
              "open('/proc/self/comm').read()\n"
              "class ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
              "        return x.clamp_min(0)\n")
    job = {"nonce": "s1", "backend": "cpu", "extensions": {},
           "options": {"trials": 2, "perf_trials": 2, "perf_warmup": 1}}
    worker = GpuWorkerProcess({}, backend="cpu")
    try:
        first = worker.run({"job": job, "task_source": RELU_TASK, "candidate_source": forker}, 60)
        assert first.payload and first.payload["outcome"] == "cheat", first
        assert any(f["rule"] == "stray_process" for f in first.payload["findings"])
        assert first.payload["worker_ns_pid"] == 1  # pid 1 of its own namespace
        deadline = time.monotonic() + 20
        while _comms(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _comms(marker)  # the namespace ended with the worker
        prober = forker.replace("if os.fork() == 0:", "if False:").replace(
            "open('/proc/self/comm').read()", "raise RuntimeError('PROBE %r' % (info,))")
        second = worker.run({"job": {**job, "nonce": "s2"}, "task_source": RELU_TASK,
                             "candidate_source": prober}, 60)
        assert worker.starts == 2
        text = str(second.payload)
        if os.geteuid() == 0:  # dropped to a run uid, not root
            assert "PROBE (0," not in text and "PROBE (2" in text, text
        # parent outside its namespace; its job directory in the private tmpfs
        assert ", 0, '/tmp/w/job-" in text, text
    finally:
        worker.stop()


def test_staged_objects_are_checked_and_removed(tmp_path: Path) -> None:
    """Job objects are copied into a directory the worker cannot write; one it replaced is
    refused (an earlier candidate cannot plant objects for a later one)."""
    from verifier.compile.builder import ArtefactMismatch, BuildResult, file_sha256

    so = tmp_path / "ks_x.so"
    so.write_bytes(b"\x7fELF not really")
    res = BuildResult("k1", True, path=str(so), module="ks_x", sha256=file_sha256(so))
    worker = GpuWorkerProcess({}, backend="cpu")
    try:
        assert worker.start()
        entries, staged = worker.stage([res])
        assert entries["k1"]["path"].startswith("/tmp/run/ext/")
        assert (staged / "ks_x.so").read_bytes() == so.read_bytes()
        assert (staged.parent.stat().st_uid, staged.stat().st_mode & 0o777) == (
            __import__("os").geteuid(), 0o755)
        ext = worker.workdir / "ext"
        ext.rename(worker.workdir / "ext-old")
        ext.mkdir()
        with pytest.raises(ArtefactMismatch, match="replaced"):
            worker.stage([res])
    finally:
        worker.stop()


_FILLER = """import os, torch
wrote, err = 0, ""
try:  # its own directory (the verifier's staging area) is read-only to it
    open("/tmp/run/planted", "w").write("x")
    err = "planted"
except OSError as exc:
    err = type(exc).__name__
chunk = b"z" * (1 << 20)
try:
    for i in range(6):
        with open("fill%d.bin" % i, "wb") as fh:
            for _ in range(60):
                fh.write(chunk)
                wrote += 1
except OSError as exc:
    err += " " + type(exc).__name__ + " " + str(exc.errno)
raise RuntimeError("FILL %d MB %s" % (wrote, err))
"""
_GRABBER = """import torch
b = bytearray(1800 << 20)
for i in range(0, len(b), 4096):
    b[i] = 1
raise RuntimeError("GRABBED")
"""


def test_the_workers_disk_total_and_host_memory_are_bounded() -> None:
    """Everything the worker writes lands in a size-limited tmpfs (its staging directory is
    read-only): a job cannot write 360 MB; its host memory is bounded by a memory cgroup (or
    RLIMIT_DATA) though RLIMIT_AS is off as on CUDA. (Raw outputs coming back for the parent's
    comparison: tests/verifier/test_redteam_persistent.py, honest and patch_compare.)"""
    from verifier.run.gpu_pool import DISK_MB, JOB_DISK_MB

    job = {"nonce": "d1", "backend": "cpu", "extensions": {}, "input_seed": 7,
           "options": {"trials": 2, "perf_trials": 2, "perf_warmup": 1}}
    worker = GpuWorkerProcess({}, backend="cpu", host_memory_mb=1200)
    try:
        fill = worker.run({"job": job, "task_source": RELU_TASK, "candidate_source": _FILLER},
                          120)
        text = str(fill.payload)
        assert "FILL" in text and "planted" not in text, text
        wrote = int(text.split("FILL ")[1].split(" MB")[0])
        assert JOB_DISK_MB - 8 <= wrote <= DISK_MB and "OSError 28" in text, text  # ENOSPC
        assert worker.memory_bound.startswith(("cgroup", "RLIMIT_DATA")), worker.memory_bound
        grab = worker.run({"job": {**job, "nonce": "d2"}, "task_source": RELU_TASK,
                           "candidate_source": _GRABBER}, 120)
        assert "GRABBED" not in str(grab.payload) + grab.failure, (grab.payload, grab.failure)
        assert ((grab.payload is None and "SIGKILL" in grab.failure)  # the cgroup's OOM kill
                or "MemoryError" in str(grab.payload)), (grab.payload, grab.failure)  # DATA
    finally:
        worker.stop()


def test_outputs_larger_than_the_sandboxes_file_limit_are_judged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's RLIMIT_FSIZE is 64 MB (its log, its files); a job's outputs go into the
    judge's arena through a mapping, which the limit does not cover: 3 trials of 16 MB each
    are judged there (nothing comes back as raw outputs)."""
    monkeypatch.setattr(CpuBackend, "persistent_worker", True)
    assert GpuWorkerProcess({}, "cpu").limits.file_mb == 64
    task = RELU_TASK.replace("batch_size = 16", "batch_size = 1024").replace(
        "dim = 1024", "dim = 4096")
    timings: dict = {}
    wrong = WRONG.replace("relu_fwd", "relu_w")
    verdicts = verify_batch([VerifyRequest("big", "relu", task, relu_ok("relu_big"), "cpu"),
                             VerifyRequest("big_wrong", "relu", task, wrong, "cpu")],
                            replace(_opts(tmp_path), run_timeout_s=60.0), timings=timings)
    v = {x.candidate_id: x for x in verdicts}
    assert v["big"].status in CORRECT_STATUSES, v["big"].error
    assert timings["big"]["referee_s"] > 0 and "outputs" not in timings["big"]["phase_s"]
    assert v["big_wrong"].status == "incorrect", v["big_wrong"].error
