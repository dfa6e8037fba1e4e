"""Red team of the judge's clock (issue 28, round 4), on the cpu backend.

The attacks (tests/verifier/redteam_cases.py, "the judge's clock") compute a correct ReLU and try
to make the judge's runtime, baseline or floor say more than the kernel does. They run in a
separate verifier process (an attack that kills the verifier must not kill the test), with the
static checks off (the judge must hold on its own), between honest candidates, and a later batch
checks honest candidates on the same caches. Each check is independent of the verifier's own
verdict: an attack's reward and speedup against an honest candidate with the same kernel, the
batch's verdicts all present, the trusted caches' bytes, a later honest candidate's figures.
Fast unit tests pin each fix on the judge's own classes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from redteam_cases import attacks, honest  # noqa: E402
from redteam_driver import run_rows  # noqa: E402
from redteam_observer import TASK, snapshot  # noqa: E402
from verifier_cases import SCALE_TASK, answer_in_thread, serve_in_thread  # noqa: E402

from verifier.judge import clock  # noqa: E402
from verifier.judge.arena import Arena, fill, views  # noqa: E402
from verifier.judge.clock import JudgeClock  # noqa: E402
from verifier.judge.window_judge import WindowJudge  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BUILD_CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"
JUDGE_ATTACKS = ("window_set_cache", "lazy_last_output", "rogue_clock_speaker",
                 "clock_early_done", "arena_truncate", "write_trusted_caches")
# KS_JUDGE_ONLY=name,name runs those attacks only (the others' checks skip)
_ONLY = {n for n in os.environ.get("KS_JUDGE_ONLY", "").split(",") if n} or set(JUDGE_ATTACKS)
# a speedup this much above an honest candidate's with the same kernel is a forged figure (the
# timing attacks claim 3x and more; two honest runs on a host loaded by six agents differed
# by up to 1.8x, so the margin is 2x)
FORGED = 2.0
TIMING = {"window_set_cache", "lazy_last_output", "rogue_clock_speaker", "clock_early_done"}
TOL = (1e-4, 1e-4, 1e-2, 1e-2)

def _run(base: Path, name: str, rows: list[tuple[str, str]]) -> tuple[dict[str, dict], int]:
    """Verify `rows` in a fresh verifier process, static checks off (the judge must hold on its
    own): (verdicts by id, its exit status)."""
    return run_rows(base, name, TASK, rows, static=False, options={
        "backend": "cpu", "workers": 1, "compile_workers": 2, "compile_batch": 40,
        "run_timeout_s": 240.0, "trials": 5, "memory_limit_mb": 4096,
        "build_cache_dir": str(BUILD_CACHE), "baseline_cache_dir": str(base / "baselines")})


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("judge-redteam")
    from verifier.run.baselines import default_cache_dir

    peaks_dir = default_cache_dir() / "peaks"
    ctx = {"victim": "", "out": "", "cache": str(BUILD_CACHE), "workspace": "", "token": "j",
           "port": 0, "tmp_probe": "", "secret_file": "",
           "trusted_caches": [str(base / "baselines"), str(peaks_dir)]}
    chosen = [(n, c) for n, c in attacks(ctx) if n in JUDGE_ATTACKS and n in _ONLY]
    # the baseline is cached by the first batch: a warm-up run times it before any attack
    warm, _ = _run(base, "warm", [("honest_warm", honest("j"))])
    baselines_before = snapshot(str(base / "baselines"))
    peaks_before = snapshot(str(peaks_dir))
    rows = [("honest_before", honest("j")), *chosen, ("honest_after", honest("j"))]
    verdicts, rc = _run(base, "attacks", rows)
    baselines_after = snapshot(str(base / "baselines"))
    later, later_rc = _run(base, "later", [("honest_later", honest("j"))])
    return {"warm": warm, "verdicts": verdicts, "rc": rc, "rows": [n for n, _ in rows],
            "later": later, "later_rc": later_rc, "base": base,
            "baselines": (baselines_before, baselines_after, snapshot(str(base / "baselines"))),
            "peaks": (peaks_before, snapshot(str(peaks_dir)))}


def _honest(suite: dict[str, Any]) -> list[dict]:
    return [suite["verdicts"][h] for h in ("honest_before", "honest_after")
            if h in suite["verdicts"]]


@pytest.mark.slow  # one verifier batch of six attacks and two honest candidates: minutes
def test_the_batch_survived_and_honest_candidates_are_correct(suite: dict[str, Any]) -> None:
    missing = [n for n in suite["rows"] if n not in suite["verdicts"]]
    assert suite["rc"] == 0 and not missing, (
        f"the verifier exited {suite['rc']} with verdicts missing for {missing}: "
        + (suite["base"] / "attacks.stderr").read_text()[-2000:])
    for v in _honest(suite):
        assert v["status"] in ("correct_fast", "correct_slow") and v["speedup"], v


@pytest.mark.slow  # end to end (the rogues' class strictly: tests/verifier/test_clock_rogues.py)
@pytest.mark.parametrize("name", JUDGE_ATTACKS)
def test_attack_gains_nothing(suite: dict[str, Any], name: str) -> None:
    if name not in _ONLY:
        pytest.skip("not in KS_JUDGE_ONLY")
    v = suite["verdicts"].get(name)
    assert v is not None, f"no verdict for {name}"
    honest_v = _honest(suite)
    assert honest_v, "no honest verdict to compare with"
    best_reward = max(h["reward"] for h in honest_v)
    best_speedup = max(h["speedup"] for h in honest_v)
    fastest_us = min(h["runtime_us"] for h in honest_v)
    why = f"{v['status']}: speedup {v.get('speedup')} runtime {v.get('runtime_us')} " \
          f"(honest {best_speedup}, {fastest_us} us); {v.get('error', '')[:200]}"
    if name not in TIMING:  # an honest kernel besides; its effects (the verifier's survival,
        return  # the trusted caches, a later candidate's figures) are the other tests' checks
    assert v["reward"] <= best_reward + 0.05, why
    if v["status"] in ("correct_fast", "correct_slow"):
        assert (v.get("speedup") or 0) <= best_speedup * FORGED, why
        assert (v.get("runtime_us") or 0) >= fastest_us / FORGED, why


@pytest.mark.slow
def test_no_attack_changed_a_trusted_cache(suite: dict[str, Any]) -> None:
    before, after_attacks, after_later = suite["baselines"]
    assert before and before == after_attacks == after_later
    peaks_before, peaks_after = suite["peaks"]
    assert peaks_before == peaks_after
    assert not any(p.endswith("ksrt-planted.json") for p in [*after_attacks, *peaks_after])


@pytest.mark.slow
def test_a_later_honest_candidate_is_judged_as_before(suite: dict[str, Any]) -> None:
    later = suite["later"].get("honest_later")
    first = suite["warm"]["honest_warm"]
    assert suite["later_rc"] == 0 and later is not None
    assert later["status"] in ("correct_fast", "correct_slow"), later
    assert later["eager_us"] == first["eager_us"]  # the same cached, trusted baseline
    assert later["speedup"] <= max(h["speedup"] for h in _honest(suite)) * FORGED


# --- the fixes, on the judge's own classes (fast: no compile) ---------------------------------
SET_BYTES = 64 * 32 * 4
ROW = 3 * SET_BYTES  # what one input set costs the budget: the set, its pristine copy, its
# call's output slot (the output has the input's size here)


def _timed(tmp_path: Path, forward: Any, budget: int) -> dict[str, Any]:
    judge = WindowJudge(SCALE_TASK, 0, TOL, budget, path=str(tmp_path / "arena.bin"))
    spec = {**judge.spec, "path": str(tmp_path / "arena.bin")}
    jc = JudgeClock(judge, workdir=tmp_path, wait_s=10.0)
    t = serve_in_thread(tmp_path, spec, forward)
    t.join(timeout=60)
    res = jc.result()
    res["sets"] = judge.sets
    judge.close()
    return res


def test_a_cache_of_repeated_input_sets_saves_no_time(tmp_path: Path) -> None:
    """Two input sets, 2 ms a call: a window of more calls than sets repeats a set, and a cache
    keyed by address and a probe of the values answers the repeats for free."""
    import time

    memo: dict[int, tuple[float, torch.Tensor]] = {}

    def forward(x: torch.Tensor) -> torch.Tensor:
        probe = float(x[0, 0])
        hit = memo.get(x.data_ptr())
        if hit is not None and hit[0] == probe:
            return hit[1]
        time.sleep(0.002)
        out = x * 3.0 + 1.0
        memo[x.data_ptr()] = (probe, out)
        return out

    res = _timed(tmp_path, forward, budget=ROW * 2)
    assert res["sets"] == 2 and res["failure"] == "", res
    assert res["figures"]["runtime_us"] >= 1800.0, res["figures"]  # every call did the work


def test_a_lazy_tensor_subclass_is_refused_in_a_timed_call(tmp_path: Path) -> None:
    """A subclass that does the work only when copied into the judge's slot (the last call)."""
    class Lazy(torch.Tensor):
        @staticmethod
        def __new__(cls, src: torch.Tensor) -> Lazy:
            t = torch.Tensor._make_wrapper_subclass(cls, src.shape, dtype=src.dtype)
            t.src = src
            return t

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001
            real = [a.src * 3.0 + 1.0 if isinstance(a, Lazy) else a for a in args]
            return func(*real, **(kwargs or {}))

    res = _timed(tmp_path, lambda x: Lazy(x), budget=16 << 20)
    assert res["figures"] == {} and not res.get("judge_error"), res


SHRINK = textwrap.dedent('''
    import os, sys
    from verifier.judge.window_judge import WindowJudge
    task, path = open(sys.argv[1]).read(), sys.argv[2]
    judge = WindowJudge(task, 0, (1e-4, 1e-4, 1e-2, 1e-2), 16 << 20, path=path)
    fd = os.open(path, os.O_RDWR)
    os.ftruncate(fd, 0)  # what a worker can do to the file it maps
    os.close(fd)
    try:
        judge.fill(judge.sets)
        why = judge.check(1)
    except OSError as exc:
        why = f"refused: {exc}"
    print("JUDGE SAYS", why)
''')


def test_a_shrunk_arena_file_does_not_kill_the_judge(tmp_path: Path) -> None:
    (tmp_path / "task.py").write_text(SCALE_TASK)
    proc = subprocess.run([sys.executable, "-c", SHRINK, str(tmp_path / "task.py"),
                           str(tmp_path / "arena.bin")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, f"the judge died (status {proc.returncode}): {proc.stderr[-500:]}"
    said = proc.stdout.split("JUDGE SAYS", 1)[1].strip()
    assert said, "the judge accepted a window over a truncated arena"


def test_a_slow_round_trip_never_makes_a_window_of_100k_calls(tmp_path: Path) -> None:
    """Under load the empty windows can take longer than the first one-call window; the old
    clock then took the call as free (1e-7 s) and asked for MAX_CALLS calls per window (an
    honest 1 ms kernel: 100 s a window, a timeout). A batchmate that loads the host does this to
    its neighbours. A window has at most as many calls as the judge has input sets."""
    import time

    judge = WindowJudge(SCALE_TASK, 0, TOL, ROW * 4,
                        path=str(tmp_path / "arena.bin"))
    jc = JudgeClock(judge, workdir=tmp_path, wait_s=10.0)

    arena = Arena.attach(str(tmp_path / "arena.bin"), judge.spec["nbytes"], "cpu")
    sets = [views(arena, layout) for layout in judge.spec["sets"]]
    slots = [views(arena, layout) for layout in judge.spec["outs"]]

    def window(n: int) -> None:  # the harness's loop, with a round trip slower than a call
        time.sleep(0.03 if n == 0 else 0.02)
        for i in range(n):
            fill(slots[i], sets[i % len(sets)][0] * 3.0 + 1.0)

    t = answer_in_thread(tmp_path, window)
    t.join(timeout=60)
    res = jc.result()
    judge.close()
    assert res["failure"] == "" and res["figures"], res
    assert res["figures"]["calls"] <= judge.sets == 4, res["figures"]


def test_a_huge_slowdown_earns_no_more_than_a_slow_kernel() -> None:
    """verifier/judge/reward.py reads a speedup of 0.0 as 'not timed' (speed term of 1x); the judge
    rounded eager/runtime to 6 places, so a 2e6-fold slowdown was paid as 1x (issue 28)."""
    from verifier.judge.performance import judge_performance
    from verifier.judge.reward import finalize
    from verifier.protocol import VerdictData, VerifyOptions

    def reward(runtime_us: float) -> float:
        v = VerdictData("c", "t", "runtime_error", "performance", "cpu")
        clock_result = {"figures": {"runtime_us": runtime_us, "out_bytes": 4}, "failure": "",
                        "judge_error": ""}
        v.status, _ = judge_performance(v, VerifyOptions(), clock_result, {"eager_us": 1.0},
                                        None)
        assert v.speedup is not None and v.speedup > 0, v.speedup
        return finalize(v).reward

    assert reward(4e6) <= reward(100.0) <= reward(2.0)


def test_a_copy_time_inflated_by_load_takes_no_window_away(tmp_path: Path) -> None:
    """The judge measures its own output copy once, when it is made; a neighbour that loads the
    host then (or a page-fault storm) gave a copy time longer than a whole window: an honest
    2 ms call was timed 0 us (a runtime_error verdict) or far too fast."""
    import time

    def forward(x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.002)
        return x * 3.0 + 1.0

    judge = WindowJudge(SCALE_TASK, 0, TOL, 16 << 20, path=str(tmp_path / "arena.bin"))
    judge.copy_s = 1.0  # as a load spike at the judge's making would leave it
    spec = {**judge.spec, "path": str(tmp_path / "arena.bin")}
    jc = JudgeClock(judge, workdir=tmp_path, wait_s=10.0)
    t = serve_in_thread(tmp_path, spec, forward)
    t.join(timeout=60)
    res = jc.result()
    judge.close()
    assert res["failure"] == "" and res["figures"], res
    assert res["figures"]["runtime_us"] >= 1000.0, res["figures"]  # half a call at the least


def test_a_judge_thread_late_after_its_order_still_times_the_window(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The judge's thread may wait for the GIL right after it writes "w" (a verifier process
    with many threads); a clock started after the write missed the window the worker ran
    meanwhile."""
    import time
    import types

    real_write = os.write

    def write(fd: int, data: bytes) -> int:
        n = real_write(fd, data)
        if data.startswith(b"w "):  # the judge's order out, then its thread is held up
            time.sleep(0.03)
        return n

    slow_os = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os)
                                       if not k.startswith("__")})
    slow_os.write = write
    monkeypatch.setattr(clock, "os", slow_os)

    def forward(x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.002)
        return x * 3.0 + 1.0

    res = _timed(tmp_path, forward, budget=16 << 20)
    assert res["failure"] == "" and res["figures"], res
    assert res["figures"]["runtime_us"] >= 1800.0, res["figures"]
