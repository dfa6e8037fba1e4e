"""GPU verification service: a CPU compile pool feeding one execution worker per GPU.

Compiles run in a bounded pool (threads driving nvcc/g++ processes, a timeout each) and finish
in any order; each finished build goes straight to a queue that the GPU workers drain, so a GPU
never waits for nvcc while built candidates remain. Builds are cached by content key
(`ks_<key>.so`); host units use one precompiled header of torch/extension.h; device units try
the light torch header first (see verifier.backends.cuda). A worker that crashes, hangs past its
timeout or hits a sticky CUDA error is killed and replaced; only its candidate is affected.
`compile_only=True` stops after the compile stage and needs no GPU (nvcc and torch headers only).
"""

from __future__ import annotations

import json
import os
import queue
import select
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.utils.cpp_extension  # noqa: F401  (imported here: lazy imports race in threads)

from verifier.backends import BuildUnit
from verifier.backends.cuda import CudaBackend, torch_has_cuda_libs
from verifier.inline_builds import InlineBuild, find_inline_builds
from verifier.sandbox import scrubbed_env


@dataclass
class GpuJob:
    """One candidate to verify on a GPU."""

    candidate_id: str
    task_source: str
    candidate_source: str
    task_id: str = ""


@dataclass
class BuildOutcome:
    """Result of building one load_inline call."""

    key: str
    ok: bool
    so_path: str | None
    seconds: float
    cached: bool
    log: str = ""
    light_header: bool = False


@dataclass
class ServiceOptions:
    compile_workers: int = 8
    compile_timeout_s: float = 600.0
    run_timeout_s: float = 120.0
    compile_only: bool = False
    trials: int = 5
    torch_compile_baseline: bool = False
    repeat_timing: int = 1
    fast_threshold: float = 1.1
    use_pch: bool = True
    light_header: bool = True
    job_extra: dict[str, Any] = field(default_factory=dict)


def _pch_dir(backend: CudaBackend, cache: Path, timeout_s: float, log: list[str]) -> Path | None:
    """Build (once, under a lock file) the precompiled torch/extension.h for host units."""
    pdir = cache / "pch"
    gch = pdir / "ks_pch.h.gch"
    if gch.exists():
        return pdir
    pdir.mkdir(parents=True, exist_ok=True)
    header = pdir / "ks_pch.h"
    header.write_text("#include <torch/extension.h>\n", encoding="utf-8")
    tmp = pdir / f"ks_pch.h.gch.tmp{os.getpid()}"
    if backend.compile_pch(header, tmp, [], log, timeout_s):
        tmp.replace(gch)
        return pdir
    return None


def build_inline(build: InlineBuild, backend: CudaBackend, cache: Path,
                 pch: Path | None | Callable[[], Path | None], timeout_s: float,
                 compile_only: bool) -> BuildOutcome:
    """Compile (and unless compile_only, link) one load_inline call into cache/ks_<key>.so.

    `pch` may be a callable that blocks until the shared precompiled header exists, so device
    units (which do not use it) compile while it is being built.
    """
    key = build.key
    name = f"ks_{key}"
    so = cache / f"{name}.so"
    if so.exists() and not compile_only:
        return BuildOutcome(key, True, str(so), 0.0, True)
    start = time.monotonic()
    work = cache / "work" / key
    work.mkdir(parents=True, exist_ok=True)
    log: list[str] = []
    objs: list[Path] = []
    ok = True
    light = False
    if build.cuda_sources:
        dev = work / "cuda.cu"
        dev.write_text(build.device_source(backend.device_prelude), encoding="utf-8")
        objs.append(work / "cuda.o")
        dflags = [f"-DTORCH_EXTENSION_NAME={name}", *build.extra_cuda_cflags,
                  *[f"-I{p}" for p in build.extra_include_paths]]
        ok = backend.compile_unit(BuildUnit(dev, "device"), objs[0], dflags, None, log, timeout_s)
        light = any("built with <torch/types.h>" in line for line in log)
    if ok:
        host = work / "main.cpp"
        host.write_text(build.host_source(name), encoding="utf-8")
        define = [f"-DTORCH_EXTENSION_NAME={name}", *build.extra_cflags,
                  *[f"-I{p}" for p in build.extra_include_paths]]
        objs.insert(0, work / "main.o")
        waited = time.monotonic()
        pch_dir = pch() if callable(pch) else pch
        start += time.monotonic() - waited  # the shared PCH is not this candidate's cost
        ok = backend.compile_unit(BuildUnit(host, "host"), objs[0], define, pch_dir, log,
                                  timeout_s)
    if ok and not compile_only:
        tmp = work / f"{name}.so"
        ok = backend.link(objs, tmp, build.extra_ldflags, log, timeout_s)
        if ok:
            tmp.replace(so)
    text = "\n".join(log)
    return BuildOutcome(key, ok, str(so) if ok and not compile_only else None,
                        time.monotonic() - start, False, text[-20000:], light)


class _Worker:
    """One persistent `verifier.gpu_worker` process pinned to a GPU."""

    def __init__(self, gpu: str, cache: Path, log_dir: Path) -> None:
        self.gpu = gpu
        rfd, wfd = os.pipe()
        env = scrubbed_env({"CUDA_VISIBLE_DEVICES": gpu,
                            "PYTHONPATH": os.pathsep.join(os.path.abspath(p) for p in sys.path if p)})
        self.log_path = log_dir / f"worker-{gpu}-{time.time_ns()}.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 (lives as long as the worker)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "verifier.gpu_worker", str(wfd), str(cache / "baselines")],
            stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT, env=env,
            pass_fds=(wfd,), start_new_session=True, cwd=str(log_dir))
        os.close(wfd)
        self.rfd = rfd
        self.buf = b""
        self.ready = self.read(timeout_s=300.0)

    def read(self, timeout_s: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([self.rfd], [], [], min(left, 1.0))
            if r:
                chunk = os.read(self.rfd, 1 << 20)
                if not chunk:
                    return None
                self.buf += chunk
            elif self.proc.poll() is not None:
                return None
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def send(self, job: dict[str, Any]) -> bool:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def describe_exit(self) -> str:
        rc = self.proc.poll()
        tail = self.log_path.read_bytes()[-600:].decode("utf-8", "replace").strip()
        return f"worker exited with code {rc}" + (f": {tail.splitlines()[-1]}" if tail else "")

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        os.close(self.rfd)
        self.log.close()


class GpuService:
    """Verify candidates: compile pool -> queue -> one worker per GPU."""

    def __init__(self, cache_dir: str | Path, options: ServiceOptions | None = None,
                 gpus: list[str] | None = None) -> None:
        self.cache = Path(cache_dir)
        self.cache.mkdir(parents=True, exist_ok=True)
        self.options = options or ServiceOptions()
        self.backend = CudaBackend()
        self.backend.light_header = self.options.light_header
        self.gpus = gpus if gpus is not None else [
            s.env["CUDA_VISIBLE_DEVICES"] for s in self.backend.execution_slots(1)]
        self.stats: dict[str, Any] = {"gpu_busy_s": {}, "worker_restarts": 0,
                                      "compile_s": [], "pch_s": 0.0}
        self._key_locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self.log_dir = self.cache / "logs"
        self.log_dir.mkdir(exist_ok=True)

    def _compile_job(self, job: GpuJob, pch: Callable[[], Path | None]
                     ) -> tuple[GpuJob, list[BuildOutcome], list[InlineBuild], list[str]]:
        builds, notes = find_inline_builds(job.candidate_source)
        outs = []
        for b in builds:
            with self._locks_guard:  # one build per content key; twins wait and hit the cache
                lock = self._key_locks.setdefault(b.key, threading.Lock())
            with lock:
                outs.append(build_inline(b, self.backend, self.cache, pch,
                                         self.options.compile_timeout_s,
                                         self.options.compile_only))
        return job, outs, builds, notes

    def run(self, jobs: list[GpuJob]) -> list[dict[str, Any]]:
        """Verify `jobs`; results come back in input order."""
        start = time.monotonic()
        opts = self.options
        pch_box: dict[str, Path | None] = {}
        pch_done = threading.Event()

        def make_pch() -> None:
            plog: list[str] = []
            t = time.monotonic()
            pch_box["dir"] = _pch_dir(self.backend, self.cache, opts.compile_timeout_s, plog)
            self.stats["pch_s"] = time.monotonic() - t
            if pch_box["dir"] is None:
                self.stats["pch_error"] = "\n".join(plog)[-2000:]
            pch_done.set()

        if opts.use_pch:
            threading.Thread(target=make_pch, daemon=True).start()
        else:
            pch_done.set()

        def pch() -> Path | None:
            pch_done.wait()
            return pch_box.get("dir")

        results: dict[str, dict[str, Any]] = {}
        ready: queue.Queue[tuple[GpuJob, dict[str, Any]] | None] = queue.Queue()
        runners = [] if opts.compile_only else [
            threading.Thread(target=self._gpu_loop, args=(gpu, ready, results), daemon=True)
            for gpu in self.gpus]
        for thread in runners:
            thread.start()
        with ThreadPoolExecutor(max_workers=opts.compile_workers) as pool:
            futures = [pool.submit(self._compile_job, job, pch) for job in jobs]
            for fut in as_completed(futures):  # first built, first run: GPUs never wait
                job, outs, builds, notes = fut.result()
                self._after_compile(job, outs, builds, notes, ready, results)
        for _ in runners:
            ready.put(None)
        for thread in runners:
            thread.join()
        self.stats["wall_s"] = time.monotonic() - start
        return [results[j.candidate_id] for j in jobs]

    def _after_compile(self, job: GpuJob, outs: list[BuildOutcome], builds: list[InlineBuild],
                       notes: list[str], ready: queue.Queue, results: dict) -> None:
        compile_s = sum(o.seconds for o in outs)
        self.stats["compile_s"].append({"candidate_id": job.candidate_id, "seconds": compile_s,
                                        "cached": all(o.cached for o in outs) and bool(outs),
                                        "light": any(o.light_header for o in outs)})
        failed = next((o for o in outs if not o.ok), None)
        base = {"candidate_id": job.candidate_id, "task_id": job.task_id, "backend": "cuda",
                "compile_s": compile_s, "findings": [], "notes": notes}
        if failed is not None:
            results[job.candidate_id] = {**base, "status": "compile_error", "stage": "compile",
                                         "compile_log": failed.log[-4000:]}
            return
        if self.options.compile_only:
            results[job.candidate_id] = {**base, "status": "compiled", "stage": "compile",
                                         "compile_log": "\n".join(o.log for o in outs)[-2000:]}
            return
        payload = {"candidate_id": job.candidate_id, "task_source": job.task_source,
                   "candidate_source": job.candidate_source,
                   "prebuilt": {o.key: o.so_path for o in outs if o.so_path},
                   "device_sources": [s for b in builds for s in b.cuda_sources + b.cpp_sources],
                   "trials": self.options.trials,
                   "torch_compile_baseline": self.options.torch_compile_baseline,
                   "repeat_timing": self.options.repeat_timing,
                   "fast_threshold": self.options.fast_threshold, **self.options.job_extra}
        ready.put((job, {**base, "_payload": payload}))

    def _gpu_loop(self, gpu: str, ready: queue.Queue, results: dict) -> None:
        worker: _Worker | None = _Worker(gpu, self.cache, self.log_dir)  # warm before work
        busy = 0.0
        while True:
            item = ready.get()
            if item is None:
                break
            job, base = item
            payload = base.pop("_payload")
            t0 = time.monotonic()
            if worker is None:
                worker = _Worker(gpu, self.cache, self.log_dir)
            result = None
            if worker.ready is not None and worker.send(payload):
                result = worker.read(self.options.run_timeout_s)
            if result is None:
                timed_out = worker.proc.poll() is None
                reason = (f"timed out after {self.options.run_timeout_s:.0f}s" if timed_out
                          else worker.describe_exit())
                worker.kill()
                worker = None
                self.stats["worker_restarts"] += 1
                result = {"status": "timeout" if timed_out else "runtime_error",
                          "stage": "correctness", "error": reason}
            elif result.get("sticky_cuda_error"):
                worker.kill()
                worker = None
                self.stats["worker_restarts"] += 1
            busy += time.monotonic() - t0
            results[job.candidate_id] = {**base, **result, "gpu": gpu,
                                         "gpu_s": time.monotonic() - t0}
        if worker is not None:
            assert worker.proc.stdin is not None
            worker.proc.stdin.close()
            worker.proc.wait(timeout=30)
            worker.kill()
        self.stats["gpu_busy_s"][gpu] = busy


def clear_cache(cache_dir: str | Path) -> None:
    """Remove built extensions and baselines (a cold start)."""
    shutil.rmtree(cache_dir, ignore_errors=True)


def compile_only_supported() -> tuple[bool, str]:
    """Whether this host can compile CUDA candidates, and what compile-only checks here."""
    from verifier.backends.cuda import nvcc_path

    try:
        nvcc_path()
    except FileNotFoundError as exc:
        return False, str(exc)
    what = ("host and device units compiled and linked (CUDA parts of torch left to load time)"
            if not torch_has_cuda_libs() else "host and device units compiled and linked")
    return True, what
