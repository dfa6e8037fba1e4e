"""verifier.isolation.isolate in a forked child: the run's own unprivileged uid, no capabilities, host
control files (cgroups) unwritable, its own pid namespace."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from verifier.isolation.isolate import RUN_UID_BASE, isolate, run_uid


def _in_isolated_child(workdir: Path, uid: int, probe, devices: bool = False) -> dict:
    """Fork, isolate (with the GPU worker's private /dev where `devices`), run `probe()` (a
    dict) and return it through a pipe."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(rfd)
            cwd, note = isolate(str(workdir), 16, True, uid, devices=devices)
            os.chdir(cwd)
            out = {"note": note, **probe()}
        except BaseException as exc:  # reported to the test, which fails on it
            out = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(wfd, json.dumps(out).encode())
        os._exit(0)
    os.close(wfd)
    data = b""
    while chunk := os.read(rfd, 65536):
        data += chunk
    os.close(rfd)
    os.waitpid(pid, 0)
    return json.loads(data)


def _probe() -> dict:
    status = Path("/proc/self/status").read_text().splitlines()
    cap = [ln.split()[1] for ln in status if ln.startswith("CapEff")][0]
    written = []
    for cg in ("/sys/fs/cgroup/pids/cgroup.procs", "/sys/fs/cgroup/cgroup.procs"):
        try:
            with open(cg, "w") as fh:
                fh.write(str(os.getpid()))
            written.append(cg)
        except OSError:
            pass
    return {"resuid": list(os.getresuid()), "resgid": list(os.getresgid()), "cap": cap,
            "groups": os.getgroups(), "pid": os.getpid(), "cgroup_written": written,
            "cwd": os.getcwd()}


def test_run_uid_is_unprivileged_and_distinct() -> None:
    assert run_uid(0) == RUN_UID_BASE and run_uid(1) != run_uid(0) and run_uid(5) > 65535


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop is taken when the verifier is root")
def test_child_drops_to_the_runs_uid(tmp_path: Path) -> None:
    uid = run_uid(4242)
    r = _in_isolated_child(tmp_path, uid, _probe)
    assert "error" not in r, r
    assert r["resuid"] == [uid] * 3 and r["resgid"] == [uid] * 3 and r["groups"] == []
    assert int(r["cap"], 16) == 0
    assert r["pid"] == 1 and r["cwd"] == "/tmp/run"
    assert r["cgroup_written"] == []  # cgroup_escape: the host's cgroup files stay closed


def test_unprivileged_caller_gets_no_escape(tmp_path: Path) -> None:
    r = _in_isolated_child(tmp_path, run_uid(7), _probe)
    assert "error" not in r, r
    assert r["cgroup_written"] == []


# --- the GPU worker's private /dev -------------------------------------------------------------
def _fake_dev(tmp_path: Path) -> Path:
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("null", "zero", "urandom", "nvidiactl", "nvidia0", "nvidia-uvm", "sda", "mem",
                 "kmsg", "mtgpu.0"):
        (dev / name).write_text("")
    (dev / "nvidia-caps").mkdir()
    return dev


def test_device_plan_keeps_the_gpu_nodes_and_nothing_else(tmp_path: Path) -> None:
    from verifier.isolation.isolate import device_plan

    plan = device_plan(str(_fake_dev(tmp_path)))
    assert plan[0] == ("tmpfs", "/dev", "")
    binds = {t: src for kind, t, src in plan if kind == "bind"}
    assert set(binds) == {"/dev/null", "/dev/zero", "/dev/urandom", "/dev/nvidiactl",
                          "/dev/nvidia0", "/dev/nvidia-uvm", "/dev/nvidia-caps", "/dev/mtgpu.0"}
    assert binds["/dev/nvidia0"] == str(tmp_path / "dev" / "nvidia0")
    assert ("symlink", "/dev/fd", "/proc/self/fd") in plan and plan[-1][0] == "shm"
    # the host's real /dev: whatever GPU nodes it has are kept
    real = {t for kind, t, _ in device_plan("/dev") if kind == "bind"}
    import glob

    assert {p for p in glob.glob("/dev/nvidia*")} <= real and "/dev/null" in real


def _dev_probe() -> dict:
    out = {"listing": sorted(os.listdir("/dev"))}
    with open("/dev/null", "w") as fh:
        fh.write("x")
    with open("/dev/urandom", "rb") as fh:
        out["random"] = len(fh.read(8))
    try:
        open("/dev/ksrt-planted", "w").close()
        out["dev_writable"] = True
    except OSError:
        out["dev_writable"] = False
    if os.path.exists("/dev/nvidia0"):  # a character node bound from the host (here: null's)
        with open("/dev/nvidia0", "w") as fh:
            out["nvidia0_written"] = fh.write("y")
    out["uid"] = os.getuid()
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a stand-in GPU node needs root")
def test_private_dev_in_a_sandboxed_child(tmp_path: Path, monkeypatch) -> None:
    import stat

    import verifier.isolation.isolate as iso

    dev = tmp_path / "hostdev"
    dev.mkdir()
    for name, (major, minor) in {"null": (1, 3), "urandom": (1, 9), "nvidia0": (1, 3)}.items():
        try:
            os.mknod(dev / name, stat.S_IFCHR | 0o666, os.makedev(major, minor))
            os.chmod(dev / name, 0o666)
        except OSError as exc:
            pytest.skip(f"mknod not allowed here ({exc})")
    (dev / "sda").write_text("")  # a host node the worker must not see
    monkeypatch.setattr(iso, "DEV_ROOT", str(dev))
    work = tmp_path / "work"
    work.mkdir()
    r = _in_isolated_child(work, run_uid(99), _dev_probe, devices=True)
    assert "error" not in r and not r["note"], r
    assert "nvidia0" in r["listing"] and "sda" not in r["listing"], r["listing"]
    assert {"null", "urandom", "fd", "shm"} <= set(r["listing"])
    assert r["nvidia0_written"] == 1 and r["random"] == 8
    assert r["dev_writable"] is False and r["uid"] == run_uid(99)


def test_gpu_worker_is_started_with_the_sandbox_and_its_devices() -> None:
    from verifier.isolation.sandbox import sandboxed_argv
    from verifier.run.gpu_pool import GpuWorkerProcess

    w = GpuWorkerProcess({"CUDA_VISIBLE_DEVICES": "0"})
    assert w.limits.isolate and w.limits.devices and w.limits.isolate_network
    assert w.limits.processes > 0 and w.limits.file_mb > 0
    argv = sandboxed_argv(["python", "-m", "verifier.run.gpu_worker", "5"], w.limits, None)
    spec = json.loads(argv[4])
    assert spec["limits"]["isolate"] and spec["limits"]["devices"]
    assert argv[5:] == ["python", "-m", "verifier.run.gpu_worker", "5"]  # no unshare wrapper
    # its own directory is read-only to it: caches and jobs live in the size-limited tmpfs
    assert not spec["limits"]["run_dir_writable"] and spec["limits"]["disk_mb"] > 0
    caches = w.private_caches()
    assert caches["HOME"] == "/tmp/w" and caches["TRITON_CACHE_DIR"].startswith("/tmp/w/")
    assert caches["KS_WORKER_TMP"] == "/tmp/w" and int(caches["KS_JOB_DISK_MB"]) > 0
