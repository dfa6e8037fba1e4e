"""The judge's cpu meter on cgroup v2 hosts (`verifier.isolation.cpu_meter`): a v2 process is in one
cgroup only, so the meter is the run's own cgroup, read from its `cpu.stat`.

The reading and the choice of group are checked against fake cgroup folders (a tmp dir with the
files the kernel would show, written by the test). The end-to-end tests need a writable cgroup
v2 tree and skip elsewhere; `KS_TEST_CGROUP2` names one that is not /sys/fs/cgroup (a cgroup2
mount beside a v1 host's hierarchies works too: `mount -t cgroup2 none <dir>`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verifier.isolation import cpu_meter
from verifier.isolation.cgroups import kill_cgroup
from verifier.isolation.cpu_meter import CpuCgroup, run_meter, v2_usage_s
from verifier.isolation.sandbox import SandboxLimits, end_run_cgroup, run_cgroup
from verifier.judge.clock import JudgeClock

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: no implicit path
from test_clock_rogues import CALL_S, ROGUE, ROW, TOL, SlowFill  # noqa: E402
from verifier_cases import SCALE_TASK  # noqa: E402

from verifier.judge.window_judge import RANDOM_CHECKS  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
STAT = "usage_usec {}\nuser_usec {}\nsystem_usec 0\nnice_usec 0\n"


def fake_v2_group(path: Path, usage_usec: int | None = 0) -> Path:
    """A folder that looks like a cgroup v2 group: `cgroup.controllers`, `cgroup.procs`,
    `pids.max` and (unless None) a `cpu.stat` with this usage."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "cgroup.controllers").write_text("cpu memory pids\n")
    (path / "cgroup.procs").write_text("")
    (path / "pids.max").write_text("max\n")
    if usage_usec is not None:
        (path / "cpu.stat").write_text(STAT.format(usage_usec, usage_usec))
    return path


def test_a_v2_group_is_read_from_its_cpu_stat(tmp_path: Path) -> None:
    """usage_usec in seconds, read afresh each time; a group that is gone reads 0."""
    group = CpuCgroup.of_v2(fake_v2_group(tmp_path / "g", 1_234_567))
    assert group is not None and group.cpu_s() == pytest.approx(1.234567)
    (tmp_path / "g" / "cpu.stat").write_text(STAT.format(2_500_000, 2_000_000))
    assert group.cpu_s() == pytest.approx(2.5)
    (tmp_path / "g" / "cpu.stat").unlink()
    assert group.cpu_s() == 0.0
    assert v2_usage_s(tmp_path / "g" / "cpu.stat") is None


def test_what_is_no_v2_group_gets_no_v2_meter(tmp_path: Path) -> None:
    """No `cgroup.controllers` (a v1 group, a plain folder), no `cpu.stat`, or one without
    usage_usec: no meter, rather than one that reads 0 forever."""
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "cpu.stat").write_text(STAT.format(5, 5))
    assert CpuCgroup.of_v2(v1) is None
    assert CpuCgroup.of_v2(fake_v2_group(tmp_path / "nostat", None)) is None
    odd = fake_v2_group(tmp_path / "odd", None)
    (odd / "cpu.stat").write_text("nr_periods 0\n")
    assert CpuCgroup.of_v2(odd) is None
    (odd / "cpu.stat").write_text("usage_usec many\n")
    assert CpuCgroup.of_v2(odd) is None


def test_the_meter_is_v1_cpuacct_first_else_a_v2_run_group(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cpuacct hierarchy wins (v1 and hybrid hosts: unchanged); else the group is made in
    the v2 root where the sandbox makes its run cgroups and reads that group's cpu.stat."""
    v1_root, v2_root = tmp_path / "cpuacct", fake_v2_group(tmp_path / "unified")
    v1_root.mkdir()
    (v1_root / "cpuacct.usage").write_text("0\n")
    group = CpuCgroup.make(v1_root=v1_root, v2_root=v2_root)
    assert group is not None and group.path.parent == v1_root
    assert group.path.name.startswith(f"ks-cpu-{os.getpid()}-")
    (group.path / "cpuacct.usage").write_text("300000000\n")  # ns
    assert group.cpu_s() == pytest.approx(0.3)
    (group.path / "cpuacct.usage").unlink()  # the kernel's file: gone with the group
    group.remove()
    assert not group.path.exists()

    made: list[Path] = []

    def kernel_makes(root: Path) -> Path:  # mkdir in a v2 tree: the kernel adds the files
        made.append(fake_v2_group(root / f"ks-sbx-{os.getpid()}-{len(made)}", 40))
        return made[-1]

    monkeypatch.setattr(cpu_meter, "new_cgroup", kernel_makes)
    group = CpuCgroup.make(v1_root=tmp_path / "no-cpuacct", v2_root=v2_root)
    assert group is not None and group.path == made[0] and group.path.parent == v2_root
    assert group.cpu_s() == pytest.approx(40e-6)


def test_no_group_is_said_once_on_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A v2 tree the verifier cannot write (no delegation) or no cgroup at all: None, and the
    verifier says once why runs go unmetered; the group it tried is not left behind."""
    monkeypatch.setattr(cpu_meter, "_said", set())  # what this process said before
    v2_root = fake_v2_group(tmp_path / "unified")  # mkdir works, but no kernel adds cpu.stat
    for _ in range(3):
        assert CpuCgroup.make(v1_root=tmp_path / "no-cpuacct", v2_root=v2_root) is None
    err = capsys.readouterr().err
    assert err.count("not cpu-metered") == 1 and "delegated" in err, err
    assert not [p for p in v2_root.iterdir() if p.is_dir()]
    assert CpuCgroup.make(v1_root=tmp_path / "none", v2_root=tmp_path / "none") is None
    err = capsys.readouterr().err
    assert err.count("not cpu-metered") == 1 and "no cgroup v2" in err, err


def test_a_v2_meter_group_is_the_runs_own_cgroup(tmp_path: Path) -> None:
    """On v2 the launcher takes the judge's group as the run's cgroup (its pids limit there);
    a v1 meter group is another hierarchy: the run gets its own pids cgroup beside it."""
    meter = fake_v2_group(tmp_path / "ks-sbx-1-1")
    limits = SandboxLimits(processes=77, cpu_cgroup=str(meter))
    assert run_cgroup(limits) == meter
    assert (meter / "pids.max").read_text() == "77"
    v1 = tmp_path / "ks-cpu-1-1"
    v1.mkdir()
    assert run_cgroup(SandboxLimits(processes=0, cpu_cgroup=str(v1))) is None
    own = run_cgroup(SandboxLimits(processes=5, cpu_cgroup=str(v1)))
    try:
        assert own != v1 and (own is None or (own / "pids.max").read_text().strip() == "5")
    finally:
        if own is not None:
            kill_cgroup(own)


def test_the_runs_end_kills_leftovers_and_keeps_the_meter_group(tmp_path: Path) -> None:
    """What a run left in its cgroup dies when it ends; the judge's group stays for its owner's
    last reading (`CpuCgroup.remove`), not removed under it by the launcher."""
    meter = fake_v2_group(tmp_path / "ks-sbx-1-2", 9)
    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (meter / "cgroup.procs").write_text(f"{left.pid}\n")
        limits = SandboxLimits(cpu_cgroup=str(meter))
        assert end_run_cgroup(meter, limits) >= 1
        assert left.wait(timeout=10) == -signal.SIGKILL
    finally:
        left.kill()
        left.wait()
    assert meter.is_dir() and CpuCgroup.of_v2(meter) is not None


def test_the_gpu_workers_v2_cgroup_is_its_meter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The persistent GPU worker's cgroup (`verifier.run.gpu_pool`) meters it where it is a v2
    group; a v1 pids group counts no cpu time, and no group is no meter (said once each)."""
    monkeypatch.setattr(cpu_meter, "_said", set())  # what this process said before
    meter = run_meter(fake_v2_group(tmp_path / "ks-sbx-1-3", 2_000))
    assert meter is not None and meter() == pytest.approx(0.002)
    assert "not cpu-metered" not in capsys.readouterr().err
    pids_v1 = tmp_path / "v1"
    pids_v1.mkdir()
    (pids_v1 / "pids.max").write_text("max\n")
    assert run_meter(pids_v1) is None and run_meter(None) is None and run_meter(None) is None
    err = capsys.readouterr().err
    assert err.count("not cpu-metered") == 2 and "cgroup is v1" in err, err


# --- end to end: a real cgroup v2 tree --------------------------------------------------
V2_ROOT = Path(os.environ.get("KS_TEST_CGROUP2", "/sys/fs/cgroup"))


def _v2_group() -> CpuCgroup:
    """A real v2 run group (v1 cpuacct ignored: this checks the v2 path), or skip."""
    group = CpuCgroup.make(v1_root=Path("/nonexistent"), v2_root=V2_ROOT)
    if group is None:
        pytest.skip(f"no writable cgroup v2 tree at {V2_ROOT} (set KS_TEST_CGROUP2)")
    return group


BURN = r'''
import os, subprocess, sys, threading, time
def burn(s):
    t = time.thread_time()
    while time.thread_time() - t < s:
        pass
th = threading.Thread(target=burn, args=(0.15,))
th.start()
th.join()  # gone before the run ends: its time stays counted
subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\n"
                "while time.process_time() - t < 0.15: pass"], check=True)
if os.fork() == 0:  # a daemon that outlives the run: the run's end kills it
    os.setsid()
    time.sleep(60)
    os._exit(0)
'''


def test_a_sandboxed_run_is_metered_in_its_own_v2_cgroup(tmp_path: Path) -> None:
    """Both launchers put the run in the judge's v2 group: an exited thread's and an exited
    child's cpu are counted, the pids limit is the run's, what it left is killed, and the
    group stays until the judge removes it."""
    from verifier.isolation.sandbox import run_sandboxed
    from verifier.run.forkserver import ForkServer

    group = _v2_group()
    try:
        limits = SandboxLimits(timeout_s=60, processes=64, cpu_cgroup=str(group.path))
        res = run_sandboxed([sys.executable, "-c", BURN], workdir=tmp_path / "spawned",
                            limits=limits)
        assert res.returncode == 0, res.stderr
        assert "not metered" not in res.stderr, res.stderr
        spawned = group.cpu_s()
        assert spawned >= 0.28, spawned
        if (group.path / "pids.max").exists():
            assert (group.path / "pids.max").read_text().strip() == "64"
        # without its pid namespace (whose end kills it) the daemon is the cgroup's to kill
        res = run_sandboxed([sys.executable, "-c", BURN], workdir=tmp_path / "bare",
                            limits=SandboxLimits(timeout_s=60, processes=64, isolate=False,
                                                 cpu_cgroup=str(group.path)))
        assert res.returncode == 0, res.stderr
        assert res.extra["pids_cgroup"] and res.extra["leftover_killed"] >= 1, res.extra
        assert (group.path / "cgroup.procs").read_text().split() == []
        spawned = group.cpu_s()
        assert spawned >= 0.56, spawned
        with ForkServer(preload=()) as server:  # a forked run (the verifier's default)
            res = server.run_module("json.tool", workdir=tmp_path / "forked", limits=limits)
        assert res.extra.get("forked") and group.cpu_s() > spawned, res.stderr
    finally:
        group.remove()
    assert not group.path.exists()


def test_a_watcher_in_a_v2_run_is_charged_for_the_fill(tmp_path: Path) -> None:
    """The fill attack (a thread that computes each input set as the judge's fill lands it) in
    a sandboxed run on cgroup v2: the judge meters the run's group and charges the fill."""
    from verifier.isolation.sandbox import run_sandboxed

    group = _v2_group()
    judge = SlowFill(SCALE_TASK, 0, TOL, ROW * 12, path=str(tmp_path / "arena.bin"))
    jc = JudgeClock(judge, workdir=tmp_path, wait_s=20.0)
    jc.watch(group.cpu_s)
    spec = {**judge.spec, "path": str(tmp_path / "arena.bin")}
    try:
        res = run_sandboxed([sys.executable, "-c", ROGUE, json.dumps(spec), "watch", str(CALL_S),
                             str(RANDOM_CHECKS)], workdir=tmp_path, env={"PYTHONPATH": str(ROOT)},
                            limits=SandboxLimits(timeout_s=120, isolate=False,
                                                 isolate_network=False,
                                                 cpu_cgroup=str(group.path)))
        out = jc.result()
    finally:
        judge.close()
        group.remove()
    assert res.returncode == 0, res.stderr
    fig = out["figures"]
    assert out["failure"] == "" and fig["fill_cpu_us"] >= 0.75e6 * CALL_S, out
    assert fig["runtime_us"] >= 0.75e6 * CALL_S, fig
    assert not group.path.exists()


def test_the_verifier_meters_a_cpu_run_by_its_v2_cgroup(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`verify_batch` on the cpu backend (the judge in this process, the run forked): the
    run's windows are metered by its v2 cgroup (the clock's figures carry the fill's cpu), an
    honest candidate stays correct, and no group of this process is left behind."""
    from verifier_cases import RELU_TASK, relu_ok

    from verifier.api import verify_batch
    from verifier.protocol import CORRECT_STATUSES, VerifyOptions, VerifyRequest

    _v2_group().remove()  # skip unless the tree is writable
    monkeypatch.setattr(cpu_meter, "_V1_ROOT", Path("/nonexistent"))  # v2 even beside v1
    monkeypatch.setattr(cpu_meter, "_V2_ROOT", V2_ROOT)
    made: list[Path] = []
    real_make = CpuCgroup.make.__func__  # type: ignore[attr-defined]

    def make(cls: type[CpuCgroup], *args: object) -> CpuCgroup | None:
        group = real_make(cls, *args)
        made.extend([group.path] if group is not None else [])
        return group

    monkeypatch.setattr(CpuCgroup, "make", classmethod(make))
    burnt: list[float] = []  # each group's cpu time at its removal: the run's, all of it
    real_remove = CpuCgroup.remove

    def remove(self: CpuCgroup, wait_s: float | None = None) -> None:
        burnt.append(self.cpu_s())
        real_remove(self, wait_s)

    monkeypatch.setattr(CpuCgroup, "remove", remove)
    opts = VerifyOptions(backend="cpu", workers=1, compile_workers=1, run_timeout_s=60.0,
                         build_cache_dir=str(Path.home() / ".cache" / "kernelsynth-tests"
                                             / "verifier-builds"),
                         baseline_cache_dir=str(tmp_path / "bl"))
    timings: dict = {}
    (v,) = verify_batch([VerifyRequest("c", "relu", RELU_TASK, relu_ok(), "cpu")], opts,
                        timings=timings)
    assert v.status in CORRECT_STATUSES, (v.status, v.error)
    clock = timings["c"]["judge_clock"]
    assert "fill_cpu_us" in clock and clock["fill_cpu_us"] >= 0, clock  # metered windows
    print("judge clock:", clock, "groups' cpu s:", burnt)
    assert made and all(p.parent == V2_ROOT for p in made), made
    assert burnt and max(burnt) > 0.05, burnt  # the run (torch, its trials) was in the group
    assert not [p for p in made if p.exists()], made


def test_the_persistent_workers_v2_cgroup_meters_its_fills(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The persistent worker (`verifier.run.gpu_pool`, here with the cpu backend; one per GPU on a
    GPU host) is metered by its own v2 cgroup during the judge's fills, and an honest worker,
    blocked on the clock's pipe while the judge fills, is charged only noise."""
    from verifier_cases import RELU_TASK, relu_ok

    from verifier.api import verify_batch
    from verifier.backends.cpu import CpuBackend
    from verifier.isolation.cgroups import is_v2_cgroup, new_cgroup, pids_cgroup_root
    from verifier.protocol import CORRECT_STATUSES, VerifyOptions, VerifyRequest
    from verifier.run import gpu_pool

    _v2_group().remove()  # skip unless the tree is writable
    root = pids_cgroup_root()
    if root is None or not is_v2_cgroup(root):  # a v2 tree beside v1 pids: the worker goes there
        monkeypatch.setattr(gpu_pool, "make_pids_cgroup", lambda limit: new_cgroup(V2_ROOT))
    monkeypatch.setattr(CpuBackend, "persistent_worker", True)
    opts = VerifyOptions(backend="cpu", workers=1, compile_workers=1, run_timeout_s=60.0,
                         build_cache_dir=str(Path.home() / ".cache" / "kernelsynth-tests"
                                             / "verifier-builds"),
                         baseline_cache_dir=str(tmp_path / "bl"))
    timings: dict = {}
    verdicts = verify_batch([VerifyRequest(n, "relu", RELU_TASK, relu_ok(f"relu_{n}"), "cpu")
                             for n in ("a", "b")], opts, timings=timings)
    for v in verdicts:
        assert v.status in CORRECT_STATUSES, (v.status, v.error)
        fig = timings[v.candidate_id]["judge_clock"]
        assert "fill_cpu_us" in fig, fig  # metered by the worker's cgroup
        print("judge clock:", v.candidate_id, fig)
        # the charge in the window that set the runtime (a calibration window's, or one a
        # loaded host's scheduler made, is in fill_cpu_us and no part of the runtime)
        assert fig["fill_charged_us"] < 0.05 * fig["runtime_us"] * fig["calls"], fig
    deadline = time.monotonic() + 60  # a spare still starting stops itself once it is up
    while time.monotonic() < deadline and _mine(V2_ROOT):
        time.sleep(0.2)
    assert not _mine(V2_ROOT)


def _mine(root: Path) -> list[Path]:
    """This process's run cgroups under `root`."""
    return [p for p in root.iterdir() if p.name.startswith(f"ks-sbx-{os.getpid()}-")]
