"""Where a GPU worker's start goes: the spares that replace a killed worker (`GpuRunner`).

A KernelBench batch replaces its worker ~33 times (cheats, runtime errors and their
confirmations in fresh workers), and on an H100 node a spare took ~13 s to start: the lane
waited 24.5 s for one in session 21. This starts real `GpuWorkerProcess`es (the sandbox, its
cgroups, the worker's warm-up and snapshot) and splits each start by the marks the worker puts
in its ready line (`verifier.run.gpu_worker._warm_up`; CLOCK_MONOTONIC is host-wide):

    spawn      the sandbox's wrapper, the interpreter and the worker's own imports
    torch      import torch, the backend and the harness
    device     torch.cuda.init (the CUDA context)
    profiler   the profiler's first session (CUPTI)
    libraries  the math libraries' first use (cuDNN conv, cuBLAS matmul)
    harness    one harness run of a warm-up task
    snapshot   the ready snapshot (`process_state`), gc.freeze
    ready      the ready line read by the parent

Baseline, in the same run: a bare interpreter's `import torch` and first CUDA tensor (no
sandbox, no warm-up). Rows: one worker alone, then `--together` at once (a run of cheats
refills every spare together), each `--repeat` times.

    python -m benchmarks.worker_start [--backend cuda] [--together 5] [--out FILE.md]
    python -m benchmarks.worker_start --bind-ab --repeat 3   # LD_BIND_NOW's cost

Stdlib and torch only (it runs on the GPU node)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

STEPS = ("imported", "torch", "device", "profiler", "libraries", "harness", "snapshot")
NAMES = ("spawn", "torch", "device", "profiler", "libraries", "harness", "snapshot", "ready")

BARE = ("import time, torch; t = time.monotonic(); torch.ones(1, device={dev!r}).sum().item(); "
        "print(time.monotonic() - t)")


def bare_start(backend: str) -> tuple[float, float]:
    """(wall s, first device tensor s) of a bare interpreter: the baseline."""
    t0 = time.monotonic()
    dev = "cpu" if backend == "cpu" else "cuda"
    out = subprocess.run([sys.executable, "-c", BARE.format(dev=dev)], capture_output=True,
                         text=True, check=True)
    return time.monotonic() - t0, float(out.stdout.strip().splitlines()[-1])


def split(t0: float, ready_at: float, marks: dict[str, float]) -> dict[str, float]:
    """Seconds of each step from the spawn at `t0` to the parent's read at `ready_at`."""
    points = [t0, *(float(marks[k]) for k in STEPS), ready_at]
    return {n: round(b - a, 3) for n, a, b in zip(NAMES, points[:-1], points[1:], strict=True)}


def start_one(backend: str, env: dict[str, str]) -> dict[str, float]:
    """Start one real worker, split its start, stop it."""
    from verifier.run.gpu_pool import GpuWorkerProcess

    proc = GpuWorkerProcess(env, backend, host_memory_mb=0)
    t0 = time.monotonic()
    try:
        if not proc.start() or proc.ready is None:
            raise RuntimeError(f"the worker did not start: {proc.workdir}/worker.log")
        done = time.monotonic()
        marks = proc.ready.get("marks") or {}
        if set(STEPS) - set(marks):
            raise RuntimeError(f"the worker's ready line has no marks for {STEPS}: {proc.ready}")
        return {**split(t0, done, marks), "total": round(done - t0, 3)}
    finally:
        proc.stop()


def start_together(n: int, backend: str, env: dict[str, str]) -> list[dict[str, float]]:
    """`n` workers started at once from threads, as `GpuRunner._refill` does."""
    got: list[Any] = [None] * n

    def one(i: int) -> None:
        try:
            got[i] = start_one(backend, env)
        except Exception as exc:  # noqa: BLE001 (reported in the table's caller)
            got[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bad = [g for g in got if isinstance(g, Exception)]
    if bad:
        raise RuntimeError(f"{len(bad)} of {n} workers failed to start: {bad[0]}")
    return got


def row(label: str, starts: list[dict[str, float]]) -> str:
    med = {k: statistics.median(s[k] for s in starts) for k in (*NAMES, "total")}
    top = max(s["total"] for s in starts)
    return (f"| {label} | {len(starts)} | " + " | ".join(f"{med[k]:.2f}" for k in NAMES)
            + f" | {med['total']:.2f} | {top:.2f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--together", type=int, default=5, help="workers started at once")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", type=Path, help="also write the table here (markdown)")
    ap.add_argument("--bind-ab", action="store_true",
                    help="only single starts, with the workers' LD_BIND_NOW and with lazy "
                    "binding, alternated (`gpu_pool.WORKER_ENV`)")
    a = ap.parse_args(argv)
    env = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0")}
    lines = [f"# GPU worker start ({a.backend}, python {sys.version.split()[0]})", "",
             "Median seconds of each step (`benchmarks/worker_start.py`); `max`: the slowest "
             "start of the row.", "",
             "| row | starts | " + " | ".join(NAMES) + " | total | max |",
             "| --- " * (len(NAMES) + 4) + "|"]
    bare = [bare_start(a.backend) for _ in range(a.repeat)]
    imp, dev = (statistics.median(b[0] - b[1] for b in bare),
                statistics.median(b[1] for b in bare))
    lines.append(f"| baseline: bare `import torch` + first tensor | {len(bare)} | | {imp:.2f} | "
                 f"{dev:.2f} |" + " |" * (len(NAMES) - 3)
                 + f" {statistics.median(b[0] for b in bare):.2f} | "
                 f"{max(b[0] for b in bare):.2f} |")
    print("\n".join(lines), flush=True)

    def emit(line: str) -> None:
        lines.append(line)
        print(line, flush=True)
        if a.out:
            a.out.write_text("\n".join(lines) + "\n", "utf-8")

    if a.bind_ab:  # alternated, so a node's drift falls on both rows alike
        pairs = [(start_one(a.backend, env), start_one(a.backend, {**env, "LD_BIND_NOW": ""}))
                 for _ in range(a.repeat)]
        emit(row("one worker alone, LD_BIND_NOW (the workers')", [p[0] for p in pairs]))
        emit(row("one worker alone, lazy binding", [p[1] for p in pairs]))
        return 0
    emit(row("one worker alone", [start_one(a.backend, env) for _ in range(a.repeat)]))
    together = [s for _ in range(a.repeat) for s in start_together(a.together, a.backend, env)]
    emit(row(f"{a.together} at once", together))
    print(json.dumps({"together": together}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
