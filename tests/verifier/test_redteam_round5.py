"""Red-team round 5 on the cpu backend: attacks on the defences added since round 4.

The reward service's header phase, the judge's instruction-pointer sampler (verifier.judge.ip_sampler:
how it classifies objects, whether a run can tell when it is watched, its share threshold) and
the service's request checks. The sampler's attacks run against the sampling clock with a real
worker process speaking the clock's protocol (as tests/verifier/test_ip_sampler.py does), so
they need no compile and take seconds. Each check is independent of the attacker's own report
where it can be: what the worker's calls really ran is logged by the worker to a file the judge
never reads, and held against the judge's verdict. An attack that still gets through is an
`xfail(strict=True)` naming the hole, so that its fix flips it.

GPU: none of these has a GPU form. The sampler is the cpu backend's judge (the GPU worker's
fallback check is its profiler's kernel names, which a renamed copy of cuBLAS does not change),
and the service's head and request checks are the same code whichever backend verifies.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from verifier.reward.server import ServiceLimits

sys.path.insert(0, str(Path(__file__).parent))
from redteam_observer import TASK  # noqa: E402
from sampled_child import spawn, tasks_of  # noqa: E402
from service_cases import exchange, get_health, recording_server  # noqa: E402

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)


# --- reward service: a head sent a byte at a time -------------------------------------------
def _dribble(url: str, stop: threading.Event, every_s: float) -> None:
    """A client that sends its request head one byte every `every_s` (each read of the server
    gets its byte well within the read timeout) and never finishes it."""
    host, port = url.rsplit("/", 1)[1].split(":")
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 10_000
    try:
        with socket.create_connection((host, int(port)), timeout=30) as s:
            for byte in head:
                if stop.is_set():
                    return
                s.sendall(bytes([byte]))
                time.sleep(every_s)
    except OSError:  # the server closed it: what a bounded head does
        return


def test_heads_sent_a_byte_at_a_time_do_not_hold_the_connections() -> None:
    """Slowloris on the head: the read timeout bounded each recv, not the head, so clients
    that dribble a byte every half read-timeout held every connection slot for as long as
    they liked and the service answered everyone else 503."""
    srv, calls = recording_server(ServiceLimits(max_concurrency=1, timeout_s=30,
                                                read_timeout_s=1.0, max_connections=3))
    stop = threading.Event()
    clients = [threading.Thread(target=_dribble, args=(srv.url, stop, 0.4), daemon=True)
               for _ in range(3)]
    try:
        for c in clients:
            c.start()
        time.sleep(2.5)  # over twice the read timeout: every dribbled head is overdue
        answer = get_health(srv.url)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        assert b'"status": "ok"' in answer and calls == []
    finally:
        stop.set()
        srv.shutdown()
        srv.server_close()


def test_a_task_source_the_verifier_cannot_write_is_a_400() -> None:
    """A lone surrogate (JSON's "\\udcff") in the task source passed the request checks and
    became the candidate's `runtime_error` with reward 0.1 ("verifier error: 'utf-8' codec
    can't encode"): a verifier failure charged to the candidate. Checked before anything runs."""
    from verifier.reward.requests import BadRequest, parse_items

    bad = TASK.replace("import torch\n", "import torch  # \udcff\n", 1)
    body = json.dumps({"items": [{"task_source": bad, "response": "x"}]})
    with pytest.raises(BadRequest) as exc:
        parse_items(json.loads(body))
    assert exc.value.status == 400 and "items[0]" in str(exc.value)
    assert "UTF-8" in str(exc.value)


# --- the judge's instruction-pointer samples (verifier.judge.ip_sampler) ------------------------------
from collections import Counter  # noqa: E402

from redteam_round5_cases import (  # noqa: E402
    OWN_NAMED_LIBRARY,
    PADDED,
    PADDED_HALF,
    RENAMED_LIBRARY,
    TRACER_AWARE,
)
from sampler_cases import (  # noqa: E402
    CHILD_ENV,
    NEEDS_PTRACE,
    NoCheckJudge,
    build_spin,
    median,
    sampled_run,
)

from verifier.judge import ip_sampler as ips  # noqa: E402


@pytest.fixture(scope="module")
def spin_so(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_spin(tmp_path_factory.mktemp("spin5"), "libks_own5.so")


def _each_of(run: Callable[[Path], None], tmp_path: Path, tries: int = 3) -> None:
    """`run` (its asserts) in each of `tries` fresh folders, stopping at the first that fails.
    For an open hole (a strict xfail) whose outcome is a matter of sampling: one run can hold
    by chance and pass the xfail; a fix holds in every run, and flips it still."""
    for i in range(tries):
        (tmp_path / f"run{i}").mkdir()
        run(tmp_path / f"run{i}")


@NEEDS_PTRACE
def test_a_run_that_watches_for_the_sampler_is_found_or_timed_as_its_own_code(
        tmp_path: Path, spin_so: Path) -> None:
    """ip_sampler samples the untimed windows served after the timed ones: a run that notices
    its first ptrace stop (a voluntary context switch in a call that makes no system call:
    getrusage(RUSAGE_THREAD).ru_nvcsw) knows every later window is sampled and computes in its
    own object only then; the timed windows ran numpy's BLAS. The sampled windows' calls are
    then far slower than the timed ones (ip_sampler.SWITCH_RATIO): the runtime is theirs."""
    res, calls = sampled_run(tmp_path, TRACER_AWARE, spin_so, own_n=3_000_000)
    lib_s = median([s for m, s in calls if m == "lib"])
    own = [s for m, s in calls if m == "own"]
    assert own, f"the worker never saw the sampler: {Counter(m for m, _ in calls)}"
    # held: a finding, or a runtime of the code the samples saw (its own, slower object)
    held = res["failure"].startswith("library_time") or \
        res["figures"]["runtime_us"] * 1e-6 >= 0.7 * median(own)
    assert held, (f"no finding; runtime {res['figures']['runtime_us']:.0f} us = the library "
                  f"calls' ({lib_s * 1e6:.0f} us), own calls {median(own) * 1e6:.0f} us; "
                  f"samples {res['ip_samples'].get('kinds')}")


@NEEDS_PTRACE
@pytest.mark.parametrize("body", ["RENAMED_LIBRARY", "OWN_NAMED_LIBRARY"])
def test_a_library_copied_under_another_name_is_still_library_time(
        tmp_path: Path, spin_so: Path, body: str) -> None:
    """A BLAS copied into the run's folder under a neutral name, or under its own object's
    file name: neither is the object the judge placed."""
    code = {"RENAMED_LIBRARY": RENAMED_LIBRARY, "OWN_NAMED_LIBRARY": OWN_NAMED_LIBRARY}[body]
    res, calls = sampled_run(tmp_path, code, spin_so)
    assert calls and {m for m, _ in calls} == {"lib"}  # every call ran the copied BLAS
    kinds = res["ip_samples"].get("kinds", {})
    assert res["failure"].startswith("library_time"), (res["failure"], res["ip_samples"])
    assert kinds.get("own", 0) == 0, kinds


@NEEDS_PTRACE
@pytest.mark.parametrize("body", ["PADDED", "PADDED_HALF"])
def test_a_fallback_padded_with_its_own_spin_is_found(tmp_path: Path, spin_so: Path,
                                                      body: str) -> None:
    """numpy's BLAS does the work, the own object spins for 30% (50%) of its time after it:
    ~77% (67%) of the compute samples were library code, under the 0.85 share the rule
    allowed (set by honest runs whose torch samples were mostly the harness's output copy).
    With torch's copies and hooks counted as no work (verifier.judge.library_work) honest
    runs are at most ~0.2 library, and the share is 0.5. Found in each of three runs
    (`_each_of`)."""
    code = {"PADDED": PADDED, "PADDED_HALF": PADDED_HALF}[body]

    def run(work: Path) -> None:
        res, calls = sampled_run(work, code, spin_so)
        assert calls and {m for m, _ in calls} == {"padded"}
        assert res["failure"].startswith("library_time"), (res["failure"], res["ip_samples"])

    _each_of(run, tmp_path)


def test_only_system_and_interpreter_objects_are_overhead() -> None:
    """Where code was loaded from, not its file name, makes it overhead: a copy of a library
    in the run's folder or /tmp is library code, libc and libm under /usr are overhead."""
    own = {"ks_ext.so"}
    assert ips.kind_of("/tmp/run-1/ks_ext.so", own) == "own"
    assert ips.kind_of("/usr/lib/x86_64-linux-gnu/libc.so.6", own) == "overhead"
    assert ips.kind_of("/usr/lib/x86_64-linux-gnu/libmvec.so.1", own) == "overhead"
    assert ips.kind_of(os.path.realpath(sys.executable), own) == "overhead"
    assert ips.kind_of("[vdso]", own) == "overhead"
    for copied in ("/tmp/run-1/libks_helper.so", "/tmp/x/libc.so.6", "/dev/shm/a.so"):
        assert ips.kind_of(copied, own) == "library", copied


def test_a_run_without_extensions_leaves_no_open_pipes_in_the_judge(tmp_path: Path) -> None:
    """SamplingClock kept the objects it samples for in `own`, the name under which JudgeClock
    kept whether it made the FIFOs: a run with no extension object (a pure-Python candidate)
    set it to an empty set and the judge never closed that run's two FIFO ends. A policy that
    sends such candidates to a warm reward service runs the verifier out of file descriptors."""
    before = len(os.listdir("/proc/self/fd"))
    for i in range(5):
        work = tmp_path / f"run{i}"
        work.mkdir()
        clock = ips.SamplingClock(NoCheckJudge(), workdir=work, wait_s=1.0)
        clock.sample_tasks(work, set())  # a cgroup folder (no tasks file) and no objects
        clock.result()
    assert len(os.listdir("/proc/self/fd")) == before


@NEEDS_PTRACE
def test_a_process_the_judge_waits_for_is_not_stopped_under_its_wait(tmp_path: Path) -> None:
    """A ptrace stop of a process's leader is reported to every wait of its parent: with the
    judge sampling its own child, subprocess's wait took the sampler's stop for the child's
    end (returncode -5: SIGTRAP) and the sampler blocked on a stop it never saw. A worker
    that only computes and exits 0 was reported dead (an honest run's `runtime_error`)."""
    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\n"
                              "while time.time() - t < 1.5:\n    sum(range(1000))\n"],
                             env=CHILD_ENV)
    sampler = ips.Sampler(lambda: tasks_of(child.pid), interval_s=0.0002).start()
    try:
        while child.poll() is None:  # a runner's wait: waitpid(pid, WNOHANG) in a loop
            time.sleep(0.0005)
    finally:
        sampler.stop()
        child.kill()
    assert child.returncode == 0, child.returncode
    launcher, worker = spawn("import time\nt = time.time()\n"
                             "while time.time() - t < 1.0:\n    sum(range(1000))\n",
                             env=CHILD_ENV)
    sampler = ips.Sampler(lambda: tasks_of(worker), interval_s=0.0002).start()
    try:  # the worker the sandbox starts (a grandchild) is sampled
        assert launcher.wait(timeout=60) == 0
    finally:
        sampler.stop()
    assert sampler.user_samples() > 0, dict(sampler.refused)


def test_a_body_of_many_small_items_is_refused_before_its_items_are_parsed() -> None:
    """The item bound was checked after every item's task source was parsed (in the handler's
    thread, holding the GIL): 30000 items of a 600-byte task (9 MB, under the body limit)
    took the server ~3 s of parsing per request before its 413; now the count comes first."""
    srv, calls = recording_server(ServiceLimits(max_concurrency=1, timeout_s=30, max_items=64,
                                                max_body_bytes=32 << 20))
    body = json.dumps({"items": [{"task_source": TASK, "response": "x"}] * 30000}).encode()
    try:
        t0 = time.monotonic()
        answer = exchange(srv.url, b"POST /verify HTTP/1.1\r\nHost: x\r\nConnection: close"
                          b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        parsed_s = time.monotonic() - t0
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b"30000 items; this service takes at most 64" in answer and calls == []
        from verifier.reward.requests import BadRequest, parse_items

        payload = json.loads(body)
        t0 = time.thread_time()  # cpu time: parsing 30000 items is ~3 s of it, load or not
        with pytest.raises(BadRequest) as exc:  # the same check alone: no item is parsed
            parse_items(payload, 64)
        assert exc.value.status == 413
        assert time.thread_time() - t0 < 0.5 and parsed_s < 10.0
    finally:
        srv.shutdown()
        srv.server_close()
