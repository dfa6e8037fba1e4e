"""Red-team suite (issue 22) on the cpu backend: every attack caught or without effect.

One verifier process verifies all attacks between two honest candidates (the process attacks try
to kill), a later run checks honest candidates on the same build cache; the observer checks files,
a loopback listener, processes and the other verdicts from outside.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from redteam_cases import attacks  # noqa: E402
from redteam_observer import TASK, honest_held, judge, make_context, run_suite  # noqa: E402
from redteam_transport import VerifierProcess  # noqa: E402

from verifier.checks.extract import check_candidate  # noqa: E402
from verifier.checks.extspec import specs_from_source  # noqa: E402
from verifier.checks.static import check_cpp, check_python  # noqa: E402

_NAMES = [n for n, _ in attacks({"victim": "", "out": "", "cache": "", "workspace": "",
                                 "token": "", "port": 0, "tmp_probe": "", "secret_file": ""})]
# KS_REDTEAM_ONLY=name,name runs the runtime part for those attacks only (the others skip)
_ONLY = {n for n in os.environ.get("KS_REDTEAM_ONLY", "").split(",") if n} or None
# the verifier as a batch driver and as the reward server (`serve-verifier`) on loopback
_TRANSPORTS = [t for t in os.environ.get("KS_REDTEAM_TRANSPORTS", "direct,http").split(",") if t]


@pytest.fixture(scope="module", params=_TRANSPORTS)
def suite(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[dict, dict]:
    unknown = (_ONLY or set()) - set(_NAMES)
    assert not unknown, f"KS_REDTEAM_ONLY names no attack: {sorted(unknown)}"
    ctx = make_context(tmp_path_factory.mktemp("redteam") / "rt")
    return run_suite(ctx, only=_ONLY, transport=request.param), ctx


# Attacks the static checks cannot see (plain Python and C++ that misbehave only at run time);
# every other one is rejected before it runs, and the runtime suite below runs them all with
# the static checks switched off, so each defence is tested on its own.
RUNTIME_ONLY = {"call_counting", "input_pointer_cache", "memory_bomb_loadcheck", "stdout_flood",
                "window_set_cache", "lazy_last_output"}
# attacks that still get through on cpu, and why (tests/verifier/test_redteam_judge.py); none
# now: rogue_clock_speaker is caught by the judge's checks of random calls (verifier/judge/clock.py)
OPEN: dict[str, str] = {}


def test_suite_is_large() -> None:
    assert len(_NAMES) >= 25


@pytest.mark.parametrize("name,code", attacks({
    "victim": "/v", "out": "/o", "cache": "/c", "workspace": "/w", "token": "t", "port": 1,
    "tmp_probe": "/tmp/p", "secret_file": "/s"}), ids=_NAMES)
def test_static_rejects(name: str, code: str) -> None:
    tree = check_candidate(code, TASK)
    findings = check_python(tree, TASK) + check_cpp(specs_from_source(code) or [], code, TASK)
    if name in RUNTIME_ONLY:
        assert not findings, findings  # else the runtime suite's case would be moot
    else:
        assert findings, f"{name} passes the static checks"


@pytest.mark.slow  # one verifier run of 40 candidates plus two small ones: minutes
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(
    strict=False, reason=OPEN[n])) if n in OPEN else n for n in _NAMES])  # load-dependent
# end to end; test_clock_rogues shows each defence strictly
def test_attack_held(suite: tuple[dict, dict], name: str) -> None:
    if _ONLY is not None and name not in _ONLY:
        pytest.skip("not in KS_REDTEAM_ONLY")
    r, ctx = suite
    held, why = judge(name, r, ctx)
    assert held, f"{name}: {why}"


@pytest.mark.slow
def test_honest_candidates_unchanged(suite: tuple[dict, dict]) -> None:
    held, why = honest_held(suite[0])
    assert held, why


@pytest.mark.slow
def test_no_hang_and_server_survived(suite: tuple[dict, dict]) -> None:
    r, _ = suite
    assert not r["hangs"], r["hangs"]
    if r["transport"] == "http":  # one server answered every request and is still up
        assert r["server_up_after_attacks"] and r["server_starts"] == 1
        assert len(r["verdicts"]) == len(r["rows"]) and len(r["later"]) == 2


_STALLS = """import faulthandler, os, signal, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)
def waiting_in_the_case():
    print("KSRT-START stuck_case", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)  # as posix_sigstop_parent does to its parent
    time.sleep(60)
waiting_in_the_case()
"""


def test_a_stalled_verifier_is_named_and_its_stacks_dumped(tmp_path) -> None:
    (tmp_path / "x").mkdir()
    vp = VerifierProcess(_STALLS, {}, tmp_path, "t", dict(os.environ))
    deadline = time.monotonic() + 30
    while not vp.started and time.monotonic() < deadline:
        vp.poll_log()
        time.sleep(0.1)
    assert vp.in_flight() == ["stuck_case"] and not vp.stalled(30, 30)
    time.sleep(1.2)
    assert vp.stalled(1.0, 100.0)
    note = vp.dump_and_kill("no progress for 1 s")
    log = vp.log_path.read_text()
    assert "stuck_case" in note and "'T'" in note  # stopped, as the note says
    assert "waiting_in_the_case" in log  # faulthandler's stack of the main thread
    assert vp.proc.returncode == -9
