"""Red-team round 4 on the cpu backend of main: attacks the earlier rounds did not try.

The candidates are in tests/verifier/redteam_round4_cases.py. Fast tests pin what the static
rules see and the front stages and reward service do with hostile input; the slow part runs the
attacks end to end in fresh verifier processes (tests/verifier/redteam_driver.py), once
with the default options and once with the static checks off (the run-time defences on their
own), between honest candidates, a batch-mate pair built in one unit, and a later batch on the
same caches (`-m slow`: about four minutes on 2 loaded cores). Each check is independent
of the attack's own verdict where it can be: an honest neighbour's verdict, the baseline cache's
bytes, a later honest candidate's baseline. An attack that still gets through is an
`xfail(strict=True)` naming why, so that its fix flips it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from redteam_cases import honest  # noqa: E402
from redteam_driver import run_rows  # noqa: E402
from redteam_observer import TASK, snapshot  # noqa: E402
from redteam_round4_cases import attacks, override_pair, surrogate_candidate  # noqa: E402
from service_cases import get_health, recording_server  # noqa: E402
from verifier_cases import SCALE_TASK, serve_in_thread  # noqa: E402

from verifier.checks.extract import check_candidate  # noqa: E402
from verifier.checks.extspec import specs_from_source  # noqa: E402
from verifier.checks.static import check_cpp, check_python  # noqa: E402
from verifier.protocol import CORRECT_STATUSES, VerifyOptions, VerifyRequest  # noqa: E402

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)

ROOT = Path(__file__).resolve().parents[2]
BUILD_CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"
ATTACKS = {name: (cls, code) for name, cls, code in attacks()}
FALLBACKS = ("numpy_relu_helper", "numpy_via_torch_module", "disable_modes_relu", "cpp_keyguard_relu",
             "cpp_alias_traced", "pybind_alias_patch")

# What still gets through, and why (the lead and the owners of these files fix them).
RUNTIME_OPEN: dict[str, str] = {
    # numpy_relu_helper, numpy_via_torch_module, disable_modes_relu, cpp_keyguard_relu,
    # pybind_alias_patch: held by the judge's own instruction-pointer samples of the run
    # (verifier/judge/ip_sampler.py): no sample of the calls lands in the candidate's objects
    # omp_more_cores: held by the run's cpu bound (verifier.isolation.cpu_bound): the run is pinned to
    # the one cpu it is given and seccomp refuses sched_setaffinity, so `num_threads(8)` runs 8
    # threads on one core (omp_get_num_procs() is 1; tests/verifier/test_cpu_bound.py)
}
STATIC_OPEN = {
    "omp_more_cores": "no static rule can tell a fair OpenMP kernel from one that takes more "
                      "cores than the judge gives (the bound belongs to the run: see above)",
}
# with the default options an attack gets through only where both the static rules and the
# run-time defences miss it
DEFAULT_OPEN = {n: why for n, why in STATIC_OPEN.items() if n in RUNTIME_OPEN}


def _findings(code: str) -> list[dict]:
    tree = check_candidate(code, TASK)
    found = check_python(tree, TASK) + check_cpp(specs_from_source(code) or [], code, TASK)
    return [f for f in found if f["severity"] == "error"]


# --- static rules: what each attack hides from them -------------------------------------------
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(
    strict=True, reason=STATIC_OPEN[n])) if n in STATIC_OPEN else n for n in ATTACKS])
def test_static_rules_see_the_attack(name: str) -> None:
    found = _findings(ATTACKS[name][1])
    assert found, f"{name} ({ATTACKS[name][0]}) passes the static checks"


def test_honest_forms_next_to_the_attacks_are_not_findings() -> None:
    """The rules that see the attacks leave their honest neighbours alone: a torch::indexing
    using-directive, a nvcuda namespace, numpy-free helpers, OpenMP, stdio to stdout, a
    member called `open`, `std::vector::data`."""
    from redteam_cases import candidate

    cpp = r"""
#include <cstdio>
#include <omp.h>
using namespace torch::indexing;
namespace ks_util { inline float relu1(float v) { return v > 0.f ? v : 0.f; } }
namespace U = ks_util;
struct Box { bool opened = false; bool& state() { return opened; } };
static bool ks_open(Box* b) { return b->state(); }
torch::Tensor relu_fwd(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    int64_t n = xc.numel();
    Box b; ks_open(&b);
    #pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) o[i] = U::relu1(in[i]);
    if (n < 0) fprintf(stderr, "never\n");
    return out;
}
"""
    code = candidate('''
def _shape_of(x):
    return tuple(x.shape)
''', cpp=cpp, forward="_shape_of(x)\n        return ext.relu_fwd(x)", prelude=False,
                     cflags='["-O2", "-fopenmp"]')
    assert _findings(code) == []


def test_static_rules_see_a_registration_for_torchs_own_ops() -> None:
    attacker, victim = (code for _, code in override_pair("static"))
    found = _findings(attacker)
    assert any(f["rule"] == "op_registration" for f in found), found
    assert _findings(victim) == []
    from verifier.checks.cpp_hiding import hidden_forms

    own = ('TORCH_LIBRARY(ks_ops, m) { m.def("f(Tensor x) -> Tensor"); }\n'
           'TORCH_LIBRARY_IMPL(ks_ops, CPU, m) { m.impl("f", &f); }\n')
    assert list(hidden_forms(own, frozenset(), lambda name: False)) == []
    for other in ("TORCH_LIBRARY_IMPL(_, CPU, m) { m.fallback(f); }\n",
                  "TORCH_LIBRARY_FRAGMENT(aten, m) { m.def(\"x() -> ()\"); }\n",
                  "static auto r = c10::RegisterOperators().op(\"aten::relu\", &f);\n"):
        assert [r for r, _, _ in hidden_forms(other, frozenset(), lambda name: False)
                ] == ["op_registration"], other


# --- hostile input to the front stages and the service (no compile: fast) ---------------------
DEEP_UNARY = "\nKS_X = " + "not " * 30000 + "1\n"  # the parser says MemoryError, not Recursion


def test_a_deeply_nested_candidate_does_not_end_its_batch(tmp_path: Path) -> None:
    """CPython's parser reports 30000 nested unary operators as MemoryError; the front stages
    caught only RecursionError, so verify_batch raised and every candidate of the batch (an RL
    group, a reward-service request) lost its verdict."""
    from verifier.api import verify_batch

    reqs = [VerifyRequest("deep", "t", TASK, honest("r4deep") + DEEP_UNARY, "cpu"),
            VerifyRequest("mate", "t", TASK, "no code block at all", "cpu")]
    opts = VerifyOptions(backend="cpu", build_cache_dir=str(tmp_path / "b"),
                         baseline_cache_dir=str(tmp_path / "base"))
    verdicts = verify_batch(reqs, opts)
    assert [v.status for v in verdicts] == ["format_error", "format_error"], verdicts
    assert "nests too deeply" in verdicts[0].error


def _raw_post(url: str, body: bytes) -> bytes:
    host, port = url.rsplit("/", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /verify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        got = b""
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                return got
            got += chunk
            if b"\r\n\r\n" in got:
                head, _, rest = got.partition(b"\r\n\r\n")
                n = [int(ln.split(b":")[1]) for ln in head.split(b"\r\n")
                     if ln.lower().startswith(b"content-length")]
                if n and len(rest) >= n[0]:
                    return got


SERVICE_BODIES = {
    # json.loads raises RecursionError on nesting and ValueError on an integer of more than
    # 4300 digits (Python's int-string limit): neither is a JSONDecodeError
    "nested_arrays": b'{"items": ' + b"[" * 100000 + b"]" * 100000 + b"}",
    "int_of_5000_digits": b'{"items": [], "timeout_s": 1' + b"0" * 5000 + b"}",
    # a task source the parser fails on with MemoryError (400 expected, never a dropped line)
    "deep_task_source": json.dumps({"items": [{
        "task_source": "X = " + "not " * 30000 + "1\n", "response": "x"}]}).encode(),
}


@pytest.fixture(scope="module")
def service() -> Any:
    from verifier.reward.server import ServiceLimits

    srv, calls = recording_server(ServiceLimits(max_concurrency=1, timeout_s=30,
                                                max_body_bytes=1 << 20, read_timeout_s=5))
    yield srv, calls
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("name", list(SERVICE_BODIES))
def test_hostile_bodies_get_a_400_with_the_reason(service: Any, name: str) -> None:
    srv, calls = service
    answer = _raw_post(srv.url, SERVICE_BODIES[name])
    assert answer.startswith(b"HTTP/1.1 400"), answer[:300]
    assert b'"error"' in answer
    assert calls == []  # nothing was verified
    health = get_health(srv.url)  # and the server still answers
    assert b'"status": "ok"' in health


# --- end to end --------------------------------------------------------------------------------
def _run(base: Path, name: str, rows: list[tuple[str, str]], static: bool = True,
         compile_workers: int = 2) -> tuple[dict[str, dict], int]:
    """Verify `rows` in a fresh verifier process: (verdicts by id, its exit status)."""
    return run_rows(base, name, TASK, rows, static=static, options={
        "backend": "cpu", "workers": 1, "compile_workers": compile_workers,
        "run_timeout_s": 240.0, "build_cache_dir": str(BUILD_CACHE),
        "baseline_cache_dir": str(base / "baselines")})


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("redteam-round4")
    warm, _ = _run(base, "warm", [("honest_warm", honest("r4"))])
    baselines_before = snapshot(str(base / "baselines"))
    rows = [("honest_before", honest("r4")), *((n, c) for n, (_, c) in ATTACKS.items()),
            ("surrogate_comment", surrogate_candidate(honest("r4"))),
            ("honest_after", honest("r4"))]
    token = os.urandom(4).hex()  # fresh sources: the pair is built in this batch, in one unit
    defaults, rc = _run(base, "defaults", rows + override_pair("d" + token))
    runtime, rc_runtime = _run(base, "runtime", rows, static=False)
    # one compile worker: the planner keeps the pair (same flags and headers) in one unit
    pair = override_pair("r" + token)
    runtime.update(_run(base, "pair", pair, static=False, compile_workers=1)[0])
    later, later_rc = _run(base, "later", [("honest_later", honest("r4")), pair[1]])
    return {"warm": warm, "defaults": defaults, "runtime": runtime, "rows": [n for n, _ in rows],
            "rc": (rc, rc_runtime, later_rc), "later": later, "base": base,
            "baselines": (baselines_before, snapshot(str(base / "baselines")))}


def _held(name: str, v: dict | None) -> tuple[bool, str]:
    if v is None:
        return False, "no verdict"
    why = f"{v['status']} reward {v['reward']}: {(v.get('error') or '')[:200]}"
    if "ESCAPED" in (v.get("error") or ""):
        return False, why
    if name in FALLBACKS:  # a fallback is a cheat (or never runs)
        return v["status"] in ("cheat", "static_reject"), why
    if name == "fopen_pointer_so":  # the disk bound ends the run, or its writes come up short
        return v["status"] not in CORRECT_STATUSES or "KS-HELD" in (v.get("error") or ""), why
    return True, why


@pytest.mark.slow  # five verifier processes, four with fresh builds: about seven minutes
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(
    strict=True, reason=DEFAULT_OPEN[n])) if n in DEFAULT_OPEN else n for n in ATTACKS])
def test_attack_held_with_the_default_options(suite: dict[str, Any], name: str) -> None:
    held, why = _held(name, suite["defaults"].get(name))
    assert held, f"{name}: {why}"


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(
    strict=True, reason=RUNTIME_OPEN[n])) if n in RUNTIME_OPEN else n for n in ATTACKS])
def test_attack_held_by_the_run_time_defences_alone(suite: dict[str, Any], name: str) -> None:
    held, why = _held(name, suite["runtime"].get(name))
    assert held, f"{name}: {why}"


@pytest.mark.slow
def test_a_batch_mate_registration_rejected_with_the_default_options(suite: dict[str, Any]
                                                                      ) -> None:
    v = suite["defaults"]
    assert v["aten_override_batchmate"]["status"] == "static_reject", v["aten_override_batchmate"]
    assert v["batchmate_victim"]["status"] in CORRECT_STATUSES, v["batchmate_victim"]


@pytest.mark.slow
def test_a_batch_mate_registration_leaves_the_honest_neighbour_correct(suite: dict[str, Any]
                                                                      ) -> None:
    """Static checks off: the honest batch-mate's verdict, in the batch and from the cache.
    The registration is load-time code in the unit's object (`verifier.compile.load_code`): each is
    built again in a shared object of its own, and no worker loads the other's."""
    now, later = suite["runtime"].get("batchmate_victim"), suite["later"].get("batchmate_victim")
    assert now is not None and now["status"] in CORRECT_STATUSES, now
    assert later is not None and later["status"] in CORRECT_STATUSES, later


@pytest.mark.slow
def test_batches_survived_and_honest_neighbours_are_correct(suite: dict[str, Any]) -> None:
    for run in ("defaults", "runtime"):
        verdicts = suite[run]
        missing = [n for n in suite["rows"] if n not in verdicts]
        assert not missing, f"{run}: verdicts missing for {missing}"
        for h in ("honest_before", "honest_after"):
            assert verdicts[h]["status"] in CORRECT_STATUSES, (run, verdicts[h])
        # a lone surrogate is this candidate's format error, nobody else's
        assert verdicts["surrogate_comment"]["status"] == "format_error"
    assert suite["rc"] == (0, 0, 0), (suite["base"] / "defaults.stderr").read_text()[-2000:]


@pytest.mark.slow
def test_no_attack_changed_the_baseline_or_a_later_honest_verdict(suite: dict[str, Any]) -> None:
    before, after = suite["baselines"]
    assert before and before == after
    later, first = suite["later"].get("honest_later"), suite["warm"]["honest_warm"]
    assert later is not None and later["status"] in CORRECT_STATUSES, later
    assert later["eager_us"] == first["eager_us"]  # the same cached, trusted baseline


# --- output forms: a complex output's imaginary part ---------------------------------------------
def test_a_complex_output_is_judged_on_both_parts() -> None:
    """`.double()` of a complex tensor drops its imaginary part (with a warning): an FFT
    kernel that computed only the real part (half the work) was judged correct."""
    import torch

    from verifier.judge.device_compare import compare

    ref = torch.fft.fft(torch.randn(16, 64))
    half = torch.complex(ref.real, torch.zeros_like(ref.real))
    verdict, msg, _ = compare(ref, half, 1e-4, 1e-4, 1e-2, 1e-2)
    assert verdict == "values", msg
    assert compare(ref, ref.clone(), 1e-4, 1e-4, 1e-2, 1e-2)[0] == "ok"
    assert compare(ref, ref.conj(), 1e-4, 1e-4, 1e-2, 1e-2)[0] == "values"


# --- timing: only the window's last output is checked ---------------------------------------------
_OPEN_LAST_CALL = (
    "window_judge.WindowJudge.check compares only the window's last output (the one the "
    "harness copies into the slot): a forward that tells timed calls from trials (their input "
    "is a view of the judge's arena, x._base is set), counts calls from the first set's "
    "address, and returns torch.empty_like for every call but the last of a window as long as "
    "the last one it saw, is timed at about 1/N of its real cost (N = calls per window, up to "
    "the judge's input sets: 3 for the 4 MB ReLU here, 256 for small tasks); fix: the judge "
    "checks every call's output (an output slot per set, or a checksum the worker cannot "
    "predict: a random call's output, chosen after the window, in its own slot)")


def test_skipping_all_but_the_last_call_of_a_window_saves_no_time(tmp_path: Path) -> None:
    """The harness's own loop (clock_serve.serve_windows) and a real judge; a true call takes 2 ms.
    End to end: redteam_round4_cases.last_only_candidate on SMALL_TASK (numbers there)."""
    import time

    import torch

    from verifier.judge.clock import JudgeClock
    from verifier.judge.window_judge import WindowJudge

    seen = {"first": None, "idx": 0, "longest": 0}

    def forward(x: torch.Tensor) -> torch.Tensor:
        if x._base is None:  # a trial's fresh clone: do the work
            time.sleep(0.002)
            return x * 3.0 + 1.0
        if seen["first"] is None:
            seen["first"] = x.data_ptr()
        if x.data_ptr() == seen["first"]:  # a window starts at the first set
            seen["longest"] = max(seen["longest"], seen["idx"])
            seen["idx"] = 0
        seen["idx"] += 1
        if seen["idx"] >= seen["longest"]:  # the last call of a window this long (or longer)
            time.sleep(0.002)
            return x * 3.0 + 1.0
        return torch.empty_like(x)

    set_bytes = 64 * 32 * 4
    judge = WindowJudge(SCALE_TASK, 0, (1e-4, 1e-4, 1e-2, 1e-2), set_bytes * 64,
                        path=str(tmp_path / "arena.bin"))
    spec = {**judge.spec, "path": str(tmp_path / "arena.bin")}
    jc = JudgeClock(judge, workdir=tmp_path, wait_s=10.0)

    t = serve_in_thread(tmp_path, spec, forward)
    t.join(timeout=120)
    res = jc.result()
    figures = res.get("figures") or {}
    judge.close()
    # every call has its own slot and the judge checks calls drawn after "d": the empty
    # outputs are found (a cheat), or, had none been drawn, the time is the true one
    if res["failure"] == "":
        assert figures.get("calls", 0) > 3 and figures["runtime_us"] >= 1800.0, res
    else:
        assert "output of a timed call was wrong" in res["failure"], res


@pytest.mark.parametrize("row, why", [
    ("[1, 2]", "expected a JSON object, got list"),
    ("NaN", "expected a JSON object, got float"),
    ('{"task_source": 5, "response": "x"}', "must be strings"),
])
def test_a_malformed_batch_row_is_named_not_a_traceback(tmp_path: Path, row: str, why: str
                                                        ) -> None:
    """`python -m verifier --batch` read any JSON line and called .get on it: an array line
    ended the verifier with an AttributeError traceback."""
    batch = tmp_path / "bad.jsonl"
    batch.write_text(row + "\n")
    proc = subprocess.run([sys.executable, "-m", "verifier", "--batch", str(batch), "--backend",
                           "cpu", "--out", str(tmp_path / "out.jsonl")], capture_output=True,
                          text=True, timeout=300, cwd=str(tmp_path),
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-1500:]
    assert f"{batch} row 0: " in proc.stderr and why in proc.stderr, proc.stderr[-500:]


def test_only_the_placed_objects_are_out_of_the_runs_disk_total(tmp_path: Path) -> None:
    """fopen_pointer_so wrote 3 x 60 MB as ks_fill*.so, which the runner's disk total skipped
    (every *.so was taken for the run's own extensions): only the exact objects it placed, at
    the size it placed them, are left out now."""
    from verifier.run.runners import _placed

    obj = tmp_path / "ks_abc.so"
    obj.write_bytes(b"\0" * 100)
    placed = {os.path.realpath(obj): 100}
    fill = tmp_path / "ks_fill0.so"
    fill.write_bytes(b"\0" * 10)
    assert _placed(obj, placed) and not _placed(fill, placed)
    obj.write_bytes(b"\0" * 200)  # the run grew a placed object: it counts
    assert not _placed(obj, placed)
