"""Red-team round 6 on the cpu backend: attacks on the verifier after its move into rooms and the
signed trials.

The judge's clock and window judge run here with a real worker serving their windows (a thread
in this process speaking the clock's protocol over its FIFOs, as the harness's own loop does:
what the worker's calls really ran is known to the test, never to the judge), so these attacks
take seconds and need no compile. Each test asserts the verdict with the defence on, and, where
the defence can be switched off, that the attack gets through without it (so it cannot pass for
want of an attack). An attack that still gets through is an `xfail(strict=True)` naming the hole
and its fix. GPU forms: benchmarks/redteam_gpu.py (named in each test's docstring).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import SCALE_TASK  # noqa: E402

from verifier.judge.arena import Arena, fill, views  # noqa: E402
from verifier.judge.clock import JudgeClock  # noqa: E402
from verifier.judge.clock_serve import open_worker_pipes, serve_windows  # noqa: E402
from verifier.judge.window_judge import WindowJudge  # noqa: E402

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)

TOL = (1e-4, 1e-4, 1e-2, 1e-2)
SET_BYTES = 64 * 32 * 4  # SCALE_TASK's one input
CALL_S = 0.002  # what a true call costs (a sleep: the judge's time, not the test's cpu)
SKIP_CALL_S = 0.0005  # the skipper's (short: windows of many calls even under load)


# --- the clock: skipping calls in the one window that sets the runtime ------------------------
class _Skipper:
    """A worker's forward that does the work (a sleep, the right output) on every call but, in the
    final phase's windows (a window of as many calls as the window before it), skips every
    other call but the last: `torch.empty_like`, no work. The judge checks the last call and
    RANDOM_CHECKS calls drawn after "d": with two random checks over the calls, the skipped half
    is missed one time in four, and then that window's half time per call is the runtime (the
    fastest window's): a 2x claim for a 25% gamble (a policy may take it in one window only)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []  # every window's n, in order
        self.skipped: list[int] = []  # the calls it skipped

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        frame = sys._getframe(1)  # serve_windows: its window's n and this call's index
        n, i = frame.f_locals["n"], frame.f_locals["i"]
        if i == 0:
            self.sizes.append(n)
        final = len(self.sizes) >= 2 and self.sizes[-1] == self.sizes[-2] and n >= 3
        if final and i < n - 1 and i % 2 == 0:
            self.skipped.append(i)
            return torch.empty_like(x)
        time.sleep(SKIP_CALL_S)
        return x * 3.0 + 1.0


def _serve(tmp_path: Path, forward: Any, sets: int = 32, task: str = SCALE_TASK,
           set_bytes: int = SET_BYTES, stepped: bool = False
           ) -> tuple[dict[str, Any], WindowJudge]:
    """The judge's windows over `sets` input sets of `task`, served by `forward` in a thread
    (`stepped`: each call's set published after the call before it, as the cpu runner's)."""
    judge = WindowJudge(task, 0, TOL, 3 * set_bytes * sets, path=str(tmp_path / "arena"))
    spec = {**judge.spec, "path": str(tmp_path / "arena")}
    jc = JudgeClock(judge, workdir=tmp_path, wait_s=30.0, stepped=stepped)

    def worker() -> None:
        arena = Arena.attach(spec["path"], spec["nbytes"], "cpu")
        old = os.getcwd()
        os.chdir(tmp_path)
        try:
            ins = [views(arena, lay) for lay in spec["sets"]]
            outs = [views(arena, lay) for lay in spec["outs"]]
            pipes = open_worker_pipes()
        finally:
            os.chdir(old)
        assert pipes is not None
        try:
            serve_windows(pipes, forward, ins, lambda k, out: fill(outs[k], out), lambda: None)
        except (OSError, ValueError):
            pass

    t = threading.Thread(target=worker, daemon=True)
    t.start()
    t.join(timeout=120)
    res = jc.result()
    judge.close()
    return res, judge


def _long_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows of 0.2 s: a loaded host that stretched a one-call window past the usual 20 ms
    target would leave the runtime to windows of one call (nothing to skip or to batch)."""
    from verifier.judge import clock

    monkeypatch.setattr(clock, "TARGET_S", 0.2)


def _unlucky(judge_cls: type, monkeypatch: pytest.MonkeyPatch) -> None:
    """The judge's draw that misses the skipped calls (one window in four draws so): the last
    call and two odd ones."""
    real = judge_cls.picks

    def picks(self: WindowJudge, n: int, deep: bool = False) -> list[int]:
        got = real(self, n, deep)
        if deep and len(got) > 1 + 2:  # the deep check: every call, as the judge makes it
            return got
        calls = max(1, min(n, len(self._set_seeds)))
        odd = [k for k in range(1, calls - 1, 2)][:2]
        return [calls - 1, *odd]

    monkeypatch.setattr(judge_cls, "picks", picks)


def test_skipping_calls_in_one_window_is_caught_when_the_draw_misses_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Defence off (every window checked by its random draw alone), the unlucky draw lets the
    skipping windows through (with two random checks: one window in four). On: the window faster than every
    one before it has all its calls checked, so the skip is a cheat whatever the draw."""
    _long_windows(monkeypatch)
    _unlucky(WindowJudge, monkeypatch)
    real_check = WindowJudge.check
    monkeypatch.setattr(WindowJudge, "check", lambda self, n, deep=False: real_check(self, n))
    (tmp_path / "off").mkdir()
    skipper = _Skipper()
    off, _ = _serve(tmp_path / "off", skipper)
    # every window passed with half its calls skipped (how much faster its figure is depends
    # on the host's load: each skipped call saves a call's work, a sleep of SKIP_CALL_S here)
    assert off["failure"] == "" and off["figures"]["runtime_us"] > 0, off
    assert len(skipper.skipped) >= 2, skipper.sizes
    monkeypatch.setattr(WindowJudge, "check", real_check)
    skipper = _Skipper()
    (tmp_path / "on").mkdir()
    on, _ = _serve(tmp_path / "on", skipper)
    assert skipper.skipped, skipper.sizes  # it did skip
    # caught, or (a load spike made the skipping window no faster than one before it, so
    # nothing checked it deeply) its time is not the runtime: the attack gained nothing
    if on["failure"]:
        assert "the output of a timed call was wrong" in on["failure"], on
        assert on["figures"] == {}
    else:
        assert on["figures"]["runtime_us"] >= 0.95 * SKIP_CALL_S * 1e6, on  # a sleep at least


def test_an_honest_worker_is_timed_as_before_with_deep_checks(tmp_path: Path) -> None:
    """Deep checks only read more of what the worker wrote: an honest worker's runtime is its
    call's, and its fastest window was checked call by call."""
    seen: list[bool] = []
    real = WindowJudge.check

    def spy(self: WindowJudge, n: int, deep: bool = False) -> str:
        seen.append(deep)
        why = real(self, n, deep)
        if deep:
            assert sorted(self.checked) == list(range(max(1, min(n, len(self._set_seeds)))))
        return why

    WindowJudge.check = spy  # type: ignore[method-assign]
    try:
        res, _ = _serve(tmp_path, _call)
    finally:
        WindowJudge.check = real  # type: ignore[method-assign]
    assert res["failure"] == "", res
    assert res["figures"]["runtime_us"] >= 0.95 * CALL_S * 1e6, res["figures"]
    # its fastest window deep (a window faster per call than every earlier one is checked call
    # by call; as windows grow, each can be: the final local CI of a5773d7 saw all 6 deep)
    assert any(seen), seen


# --- the clock: every set of a window computed in its first call ----------------------------
def _call(x: torch.Tensor) -> torch.Tensor:
    """An honest call whose cost is mostly per call (a dispatch or a launch: CALL_S, a sleep,
    so the host's load does not blur it), whatever the size of what it computes."""
    time.sleep(CALL_S)
    return x * 3.0 + 1.0


class _Batcher:
    """All of a window's input sets are in the arena at "w": the first call stacks every set the
    window will use, pays the per-call cost once for the batch and keeps the rows; each later
    call answers its row (a plain tensor, copied into its slot by the harness as any output).
    Every output is right and fresh, so no check of the judge's fails; the window's time is one
    call's cost over n (on a GPU: one launch for every set of the window). A window of one call
    it answers at once (nothing to batch: the judge's calibration then grows n)."""

    def __init__(self) -> None:
        self.rows: tuple[torch.Tensor, ...] = ()
        self.batched = 0  # windows answered from a batch
        self.windows = 0  # windows of more than one call

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        frame = sys._getframe(1)  # serve_windows: the window's sets, n and this call's index
        n, i, sets = frame.f_locals["n"], frame.f_locals["i"], frame.f_locals["sets"]
        if n < 2:
            return x * 3.0 + 1.0
        self.windows += i == 0
        if i == 0:
            self.rows = _call(torch.stack([s[0] for s in sets[:min(n, len(sets))]])).unbind(0)
            self.batched += 1
        return self.rows[i % len(self.rows)]


def test_a_window_batched_in_its_first_call_is_timed_as_its_calls(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Defence off (every set of a window published at "w"), the first call batches the
    window's sets and the runtime is the batch's time over n calls. On (stepped windows,
    `verifier.judge.stepped`: each call's set published once the call before it wrote its
    slot), the first call's batch holds one fresh set and stale ones: its rows are wrong, a
    cheat; a batcher that waited could only batch one set. GPU form (still open there):
    benchmarks/redteam_gpu.py --round6 (batched_launch)."""
    _long_windows(monkeypatch)
    (tmp_path / "off").mkdir()
    batcher = _Batcher()
    off, _ = _serve(tmp_path / "off", batcher, sets=64)
    # every window of more than one call was answered from one batch, and passed the judge's
    # checks: its time is one call's cost over n (by construction: no timing asserted, a
    # loaded host shrinks n and blurs it, never the mechanism)
    assert off["failure"] == "" and off["figures"]["calls"] >= 2, off
    assert batcher.batched == batcher.windows, (batcher.batched, batcher.windows)
    (tmp_path / "on").mkdir()
    batcher = _Batcher()
    on, _ = _serve(tmp_path / "on", batcher, sets=64, stepped=True)
    assert batcher.batched, on
    assert "the output of a timed call was wrong" in on["failure"], on
    assert on["figures"] == {}


# --- the reward service: a connection past the bound, dribbling its head --------------------
def test_a_connection_past_the_bound_gets_its_503_while_it_dribbles() -> None:
    """A connection past `max_connections` is answered 503 by one of 16 overflow threads after
    it reads the head, and that read had 1 s per recv: a client sending a byte every 0.5 s held
    its thread for as long as it liked (up to 64 KiB of head), and 16 such clients left every
    later busy client closed without an answer. The read has 1 s in all now."""
    from verifier.protocol import VerifyOptions
    from verifier.reward.server import RewardServer, RewardService, ServiceLimits

    limits = ServiceLimits(max_concurrency=1, timeout_s=30, read_timeout_s=30.0,
                           max_connections=1)
    srv = RewardServer("127.0.0.1", 0, RewardService(VerifyOptions(backend="cpu"), limits,
                                                     lambda reqs, opts: []))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    host, port = srv.url.rsplit("/", 1)[1].split(":")
    import socket

    try:
        with socket.create_connection((host, int(port)), timeout=10) as held, \
                socket.create_connection((host, int(port)), timeout=10) as late:
            held.sendall(b"GET /health HTTP/1.1\r\n")  # holds the one connection slot
            time.sleep(0.3)
            late.setblocking(False)
            t0, got, closed = time.monotonic(), b"", False
            for byte in b"GET /health HTTP/1.1\r\nX-Pad: " + b"a" * 40:
                try:
                    got += late.recv(1 << 14)
                    closed = True  # (an empty read: the server closed it)
                except BlockingIOError:
                    pass
                except OSError:  # reset: closed with our later bytes unread
                    closed = True
                if got or closed:
                    break
                try:
                    late.send(bytes([byte]))
                except OSError:
                    closed = True
                    break
                time.sleep(0.5)
            waited = time.monotonic() - t0
        # answered (503) or closed within the bound, while it was still sending its head
        assert (got.startswith(b"HTTP/1.1 503") or closed) and waited < 4.0, (got[:80], waited)
    finally:
        srv.shutdown()
        srv.server_close()


# --- a library's compute called by name from C++ (a fallback no trace sees) ------------------
from redteam_round6_cases import (  # noqa: E402
    BLAS_CPP,
    MATMUL_TASK,
    PASTED_BLAS_CPP,
    N,
    matmul_candidate,
)

BUILD_CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"


def test_a_library_called_by_name_is_seen_by_no_rule_and_no_trace() -> None:
    """Defence off: the static rules find nothing in either form (the name written, or pasted
    by the preprocessor), and MKL's sgemm_ in libtorch_cpu computes the product under the
    worker's dispatcher trace without one aten op (the trials' and the timed calls' op lists
    stay empty, so `timed_fallback` cannot fire either)."""
    import ctypes

    from verifier.checks.extract import check_candidate
    from verifier.checks.extspec import specs_from_source
    from verifier.checks.fallback import make_trace_mode
    from verifier.checks.static import check_cpp, check_python

    for cpp in (BLAS_CPP, PASTED_BLAS_CPP):
        code = matmul_candidate(cpp, "ks6_static")
        tree = check_candidate(code, MATMUL_TASK)
        found = check_python(tree, MATMUL_TASK) + check_cpp(specs_from_source(code) or [],
                                                            code, MATMUL_TASK)
        assert [f for f in found if f["severity"] == "error"] == [], found
    lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
    a, b, c = torch.rand(N, N), torch.rand(N, N), torch.empty(N, N)
    i, one, zero = ctypes.c_int(N), ctypes.c_float(1.0), ctypes.c_float(0.0)
    p = ctypes.c_void_p
    with torch.no_grad(), make_trace_mode() as tr:
        lib.sgemm_(b"N", b"N", ctypes.byref(i), ctypes.byref(i), ctypes.byref(i),
                   ctypes.byref(one), p(b.data_ptr()), ctypes.byref(i), p(a.data_ptr()),
                   ctypes.byref(i), ctypes.byref(zero), p(c.data_ptr()), ctypes.byref(i))
    assert tr.ops == [] and torch.allclose(c, a @ b, atol=1e-4), tr.ops


def test_the_load_check_names_a_library_import(tmp_path: Path) -> None:
    """An object that imports sgemm_ (declared, not defined) is named; libc's and libm's
    imports and an own function called sgemm (defined in the object) are not."""
    from verifier.compile.loadcheck import library_imports

    (tmp_path / "a.c").write_text(
        "void sgemm_(const char*, const char*, const int*, const int*, const int*, "
        "const float*, const float*, const int*, const float*, const int*, const float*, "
        "float*, const int*);\nvoid f(float* c){int n=1; float o=1; sgemm_(\"N\",\"N\",&n,&n,&n,"
        "&o,c,&n,c,&n,&o,c,&n);}\n")
    (tmp_path / "b.c").write_text(
        "#include <math.h>\n#include <string.h>\nvoid sgemm(float* c){c[0]=expf(c[1]);}\n"
        "void g(float* c, float* d){memcpy(c, d, 64); sgemm(c);}\n")
    for name in ("a", "b"):
        subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(tmp_path / f"{name}.so"),
                        str(tmp_path / f"{name}.c"), "-lm"], check=True)
    assert library_imports(str(tmp_path / "a.so")) == ["sgemm_"]
    assert library_imports(str(tmp_path / "b.so")) == []
    assert library_imports(str(tmp_path / "a.c")) == []  # not an object: nothing to name


def test_a_library_called_by_name_does_not_pass_as_the_candidates_kernel(tmp_path: Path
                                                                          ) -> None:
    """End to end, default options (one build): the pasted form passed as `correct_slow`, a
    fallback rewarded; its object imports sgemm_, so its load check fails it, naming it."""
    from redteam_driver import run_rows

    verdicts, rc = run_rows(tmp_path, "blas", MATMUL_TASK,
                            [("pasted_blas", matmul_candidate(PASTED_BLAS_CPP, "ks6_pasted"))],
                            {"backend": "cpu", "build_cache_dir": str(BUILD_CACHE),
                             "baseline_cache_dir": str(tmp_path / "baselines")})
    assert rc == 0, (tmp_path / "blas.stderr").read_text()[-2000:]
    v = verdicts["pasted_blas"]
    assert v["status"] not in ("correct_fast", "correct_slow"), v
    assert "sgemm_" in (v.get("error") or "") + v.get("feedback", ""), v


def test_bodies_are_parsed_a_few_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 16 MB body of small numbers (`{"items": [0.5, 0.5, ...]}`) parses to ~160 MB of
    objects in ~1 s (measured here) before its 400: one parse per connection, 64 connections
    made ~10 GB at once. The parses take PARSE_SLOTS at a time (the bodies are read without
    one: a slow body holds no slot). Off (a slot per connection), all 12 parse together."""
    import json

    from service_cases import exchange

    import verifier.reward.server as server
    from verifier.protocol import VerifyOptions
    from verifier.reward.server import RewardServer, RewardService, ServiceLimits

    busy, most, lock = [0], [0], threading.Lock()
    real = server.load_json

    def slow_parse(raw: bytes) -> Any:
        with lock:
            busy[0] += 1
            most[0] = max(most[0], busy[0])
        time.sleep(0.3)  # a parse of 16 MB takes ~1 s
        with lock:
            busy[0] -= 1
        return real(raw)

    monkeypatch.setattr(server, "load_json", slow_parse)
    body = json.dumps({"items": [0.5] * 1000}).encode()
    peaks = {}
    for name, slots in (("on", server.PARSE_SLOTS), ("off", 64)):
        srv = RewardServer("127.0.0.1", 0, RewardService(
            VerifyOptions(backend="cpu"), ServiceLimits(max_concurrency=1, timeout_s=30),
            lambda reqs, opts: []))
        srv.parse_slots = threading.BoundedSemaphore(slots)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        answers: list[bytes] = []

        def post(url: str = srv.url, answers: list[bytes] = answers) -> None:
            answers.append(exchange(url, b"POST /verify HTTP/1.1\r\nHost: x\r\nConnection: "
                                    b"close\r\nContent-Length: %d\r\n\r\n" % len(body) + body))

        most[0] = 0
        clients = [threading.Thread(target=post) for _ in range(12)]
        try:
            for c in clients:
                c.start()
            for c in clients:
                c.join(timeout=60)
        finally:
            srv.shutdown()
            srv.server_close()
        assert len(answers) == 12 and all(a.startswith(b"HTTP/1.1 400") for a in answers), \
            answers[:1]
        peaks[name] = most[0]
    assert peaks["on"] <= server.PARSE_SLOTS < peaks["off"], peaks


# --- the ip sampler's switch rule on an honest run (round 5's watcher is held by it) ----------
from redteam_round5_cases import COMMON  # noqa: E402
from sampler_cases import NEEDS_PTRACE, build_spin, sampled_run  # noqa: E402


@pytest.fixture(scope="module")
def spin6(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run's own object: round 5's spin loop, built here."""
    return build_spin(tmp_path_factory.mktemp("spin6"), "libks_own6.so")

HONEST_OWN = COMMON + """

def call(x):
    t0 = time.perf_counter()
    lib.spin({own_n})
    a @ a
    note("own", t0)
"""


@NEEDS_PTRACE
def test_an_honest_run_sampled_is_not_called_switched(tmp_path: Path, spin6: Path) -> None:
    """The sampled windows' calls cost the stops' time (~15-50% here under load) over the
    timed ones; far under ip_sampler.SWITCH_RATIO, so an honest run keeps its timed runtime
    (round 5's watcher, whose sampled calls ran its own object 15x slower, does not). Its own
    object runs ~3x as long as its BLAS call: with 100k spins (~150 us to the BLAS's ~285 us)
    it was 67% library, a fallback under ip_sampler.LIBRARY_SHARE since round 5's padding."""
    res, calls = sampled_run(tmp_path, HONEST_OWN, spin6, own_n=600_000)
    assert res["failure"] == "" and "switched" not in res["figures"], res
    assert res["ip_samples"]["sampled_call_us"] > 0, res["ip_samples"]
