"""The persistent worker's settle made cheaper (benchmarks/settle_profile.py), each check as it
was: a job's own `gc.freeze()` seen by the harness's mark (`disarm.frozen_since`) instead of the
permanent generation's size, the residue compared on the keys that differ first
(`tamper.left_in_process`), the writable directories resolved once a scan
(`hidden_state.writable_roots`), `tamper.identity` by exact type."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from verifier.run import disarm, hidden_state, tamper
from verifier.run.c_identity import c_function_pointer
from verifier.run.tamper import OS_THREADS, PER_JOB, identity, left_in_process, process_state

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def unfrozen() -> object:
    """Leave the test process's collector as it found it (nothing frozen)."""
    yield
    gc.unfreeze()


def test_a_freeze_is_seen_whatever_it_froze_and_only_a_freeze(unfrozen: object) -> None:
    """The mark leaves the listed objects at any `gc.freeze()` (the old count needed more
    than FREEZE_SLACK, 8, objects frozen past what died), and a collection keeps it listed."""
    assert disarm.frozen_since(None)  # no mark: nothing tells, so every object is scanned
    mark = disarm.note_frozen()
    assert not disarm.frozen_since(mark)
    gc.collect()  # generations 0-2 only: no freeze
    assert not disarm.frozen_since(mark)
    gc.freeze()  # whatever it moved (here: the mark, and few others)
    assert disarm.frozen_since(mark)
    mark = disarm.note_frozen()  # the harness's own freeze makes the next mark
    assert not disarm.frozen_since(mark)
    gc.freeze()
    gc.unfreeze()  # a freeze undone: every object listed again, the mark too
    assert not disarm.frozen_since(mark)


def test_a_job_that_froze_its_object_has_it_pinned(unfrozen: object) -> None:
    """A `__del__` object the job froze itself is listed again (`gc.unfreeze`) and pinned."""
    ran: list[int] = []

    class Later:
        def __del__(self) -> None:
            ran.append(1)

    mark = disarm.note_frozen()
    holder = [Later()]
    gc.freeze()
    before = len(disarm.PINNED)
    try:
        assert disarm.pin_mortal(mark) >= 1
        assert any(type(x) is Later for x in disarm.PINNED[before:])
        holder.clear()
        assert ran == []
    finally:
        del disarm.PINNED[before:]


def test_the_residue_named_as_before() -> None:
    """A public callable rebound and one removed are named; one added is not (as before: the
    module's names as they were are compared); the per-job shims, and fewer OS threads, are no
    residue; a changed identity of a function's code is."""
    mod = types.ModuleType("ks_settle_probe")
    mod.__spec__ = None
    mod.kept, mod.gone, mod.swapped = (lambda: 1), (lambda: 2), (lambda: 3)
    sys.modules["ks_settle_probe"] = mod
    try:
        before = process_state()
        mod.swapped = lambda: 3
        del mod.gone
        mod.added = lambda: 4
        mod.kept.__code__ = (lambda: 5).__code__
        left = left_in_process(before)
        assert {"ks_settle_probe.swapped", "ks_settle_probe.gone",
                "ks_settle_probe.kept"} <= set(left), left
        assert "ks_settle_probe.added" not in left
        before = {**process_state(), **dict.fromkeys(PER_JOB, -1)}
        before[OS_THREADS] += 1  # a thread that ended since is no residue

        def left_now() -> list[str]:  # (this test process's descriptor table is every earlier
            return [x for x in left_in_process(before) if x != "file descriptors"]  # test's)

        assert not left_now(), left_now()
        before[OS_THREADS] -= 2  # one more than then is
        assert left_now() == [OS_THREADS]
    finally:
        del sys.modules["ks_settle_probe"]


def test_identity_by_exact_type_is_identity_as_before() -> None:
    """Functions (code, defaults) and bound methods (their function's code) as before; a
    builtin or a C method with its C function (round 14, `c_identity`); anything else by `id`.
    The module walk's inlined form (`identity` only for `_CODED` types) is `identity`."""
    def f(x: int = 1) -> int:
        return x

    class C:
        def m(self) -> int:
            return 1

    bound = C().m
    first, method = identity(f), identity(bound)
    f.__defaults__ = (2,)
    C.m.__code__ = f.__code__
    assert identity(f) != first and identity(bound) != method
    assert identity(len) == hash((id(len), c_function_pointer(len))) and identity(C) == id(C)
    for v in (len, torch.relu, torch.Tensor.copy_, dict.fromkeys, f, bound, C, sys, 3, "s"):
        assert (identity(v) if type(v) in tamper._CODED else id(v)) == identity(v), v


def test_writable_roots_are_read_at_each_scan(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The roots resolved once a scan are those of now: a package whose path enters the
    worker's tmpfs (set after an earlier scan) is named, as by the per-path form."""
    pkg = types.ModuleType("ks_settle_pkg")
    pkg.__path__ = [str(tmp_path / "pkg")]
    sys.modules["ks_settle_pkg"] = pkg
    try:
        monkeypatch.delenv("KS_WORKER_TMP", raising=False)
        before = hidden_state.package_paths()
        monkeypatch.setenv("KS_WORKER_TMP", str(tmp_path))
        after = hidden_state.package_paths()
        key = "packages whose path is writable"
        assert before[key] != after[key]
        assert hidden_state.writable(str(tmp_path / "pkg"))
        assert hidden_state.writable(str(tmp_path / "pkg"), hidden_state.writable_roots())
        assert not hidden_state.writable("/usr/lib", hidden_state.writable_roots())
    finally:
        del sys.modules["ks_settle_pkg"]


# settles as the worker's loop makes them (its ready, then `_settle` after each "job"), in a
# fresh process: honest ones keep the harness's freeze (nothing unfrozen, the mark renewed);
# residue a finalizer leaves is found; an object a job froze is pinned
SETTLES = """
import gc, json, threading
import colorsys
from verifier.run import disarm, gpu_worker
from verifier.run.settle import armed_finalizers, held_memory
from verifier.run.tamper import process_state

state, flags, residue = gpu_worker.watched_state(), gpu_worker.global_flags(), process_state()
gc.collect()
gc.freeze()
mark = disarm.note_frozen(freeze=False)
ready = gpu_worker.ReadyState(state=tuple(state.items()), flags=tuple(flags.items()),
                              threads=threading.active_count(), memory=held_memory(),
                              armed=tuple(armed_finalizers().items()),
                              residue=tuple(residue.items()))
out, ran = {}, []
for i in range(2):
    report, mark = gpu_worker._settle([{"result": i}], ready, mark)
    out[f"honest {i}"] = [report["outcome"], report["worker_leaves"],
                          disarm.frozen_since(mark), gc.get_freeze_count() > 1000]


class Later:
    def __del__(self):
        ran.append(1)


holder = [Later()]
gc.freeze()  # the job's own
report, mark = gpu_worker._settle([], ready, mark)
holder.clear()
out["froze"] = [report["worker_leaves"], len(ran)]


class Cycle:
    def __del__(self):
        colorsys.rgb_to_hsv = lambda *a: (0, 0, 0)


c = Cycle()
c.me = c
del c
report, mark = gpu_worker._settle([], ready, mark)
out["finalizer"] = [report["worker_leaves"], " ".join(f["message"] for f in report["findings"])]
print(json.dumps(out))
"""


def test_settles_keep_the_freeze_and_catch_what_they_caught() -> None:
    env = {"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    run = subprocess.run([sys.executable, "-c", SETTLES], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    for i in range(2):  # ok, stays, no freeze seen, the harness's objects still frozen
        assert out[f"honest {i}"] == ["ok", False, False, True], out
    assert out["froze"] == [False, 0], out  # pinned: its __del__ never ran
    leaves, said = out["finalizer"]
    assert leaves and "colorsys.rgb_to_hsv" in said, out
