"""The same reference forward timed two ways on the cpu backend (issue 28).

(a) `in_process`: the eager baseline's method before eager30: `time_windows` in a trusted
    process, on inputs that process just drew, only the last output copied
    (`verifier.judge.timed_calls.time_reference`, as a baseline-only sandboxed child runs it).
(b) `windows`: the candidates' method: this process is the judge (`WindowJudge` + `JudgeClock`,
    arena file and FIFOs in a run directory as `verifier.run.runners.SandboxRunner` makes them),
    a child process serves its windows with the reference as its forward
    (`serve_timed_windows`, as `verifier.run.worker` serves a candidate's).
Attribution variants of (b), each changing one thing:
    `shm`      the arena on tmpfs (/dev/shm) instead of the run directory's disk-backed file
    `nocopy`   the child skips each call's copy into its slot (the judge still deducts it)
    `privcopy` the child copies each output into a private buffer of its own (one per call, as
               cold as the slots, not shared with the judge) instead of its slot
    `private`  the child calls on its own inputs drawn once (not the judge's arena), and no copy
    `nocopy` and `private` deduct nothing (no copy was made): the per-call time without a copy.
    `fast`, `fastnocopy`: `windows` and `nocopy` with the task's FAST forward (tasks in FAST).
The fix (eager30) times the baseline by (b): `served` is `SandboxRunner.baseline`, the real cpu path
(a sandboxed child serving this process's windows with the reference as forward); its ratio to
`windows` is the speedup the reference scores against itself, ~1.0 (the old method's: `windows`
over (a), ~0.5).
Usage: nice -n 15 python -m benchmarks.eager_method [--tasks relu,pow,softmax] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ARENA_BYTES = 16 << 20  # verifier.run.runners.CPU_ARENA_BYTES
SEED = 0
TOL = (1e-4, 1e-4, 1e-2, 1e-2)

_BODY = {
    "relu": "torch.relu(x)",
    "pow": "torch.pow(x, 3.0)",
    "softmax": "torch.softmax(x, dim=-1)",
    "max0": "torch.maximum(x, torch.zeros_like(x))",  # a ReLU in two passes
}
# an honest faster forward of a task (the `fast*` modes serve it instead of the reference): its
# speedup over the served baseline, with the copy vs without (`fastnocopy` / `nocopy`), shows
# how much the un-deducted part of the slot copy compresses a real speedup toward 1
FAST = {"max0": "torch.relu(x)"}
# cpu sizes: the lead's 16x1024 ReLU, and the 2^18-element cap (`taskfile.cpu_max_numel`) a
# KernelBench 4096x8192 task is scaled to
SIZES = [(16, 1024), (512, 512)]


def task_source(op: str, rows: int, cols: int) -> str:
    """A KernelBench-style task file of `op` on a rows x cols fp32 input."""
    return (f"import torch\nimport torch.nn as nn\n\nbatch_size = {rows}\ndim = {cols}\n\n\n"
            "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n\n"
            f"    def forward(self, x):\n        return {_BODY[op]}\n\n\n"
            "def get_inputs():\n    return [torch.randn(batch_size, dim)]\n\n\n"
            "def get_init_inputs():\n    return []\n")


def _child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _load(src: str) -> tuple[Any, Any]:
    import torch

    from verifier.judge import decide
    from verifier.judge.tensors import exact_fp32

    torch.set_num_threads(1)
    exact_fp32()
    return decide.reference(src, SEED)


def child_in_process(src: str) -> dict[str, Any]:
    """(a): the reference timed in this process, as the baseline-only child did."""
    from verifier.judge import decide
    from verifier.judge.timed_calls import time_reference

    model, get_inputs = _load(src)
    figures = time_reference(model, lambda k: decide.make_inputs(get_inputs, k), lambda: None,
                             budget_bytes=ARENA_BYTES)
    return figures["eager_windows"]


def child_serve(src: str, spec: dict[str, Any], mode: str) -> None:
    """(b): serve the judge's windows (FIFOs in the cwd) with the reference as forward."""
    import torch

    from verifier.backends import get_backend
    from verifier.judge import decide
    from verifier.judge.arena import Arena, views
    from verifier.judge.clock_serve import open_worker_pipes, serve_windows
    from verifier.judge.op_trace import OpNames
    from verifier.judge.timed_calls import serve_timed_windows

    model, get_inputs = _load(src)
    if mode.startswith("fast"):
        op = next(k for k, body in _BODY.items() if f"return {body}\n" in src)
        model = eval(f"lambda x: {FAST[op]}", {"torch": torch})  # noqa: S307 - our table
        mode = mode[len("fast"):] or "windows"
    backend = get_backend("cpu")
    with torch.no_grad():
        model(*decide.make_inputs(get_inputs, 1))  # warm, as a candidate after its trials
        if mode in ("windows", "shm"):
            serve_timed_windows({"arena": spec}, model, backend)
            return
        arena = Arena.attach(spec["path"], int(spec["nbytes"]), "cpu")
        sets = [views(arena, layout) for layout in spec["sets"]]
        if mode == "private":
            sets = [decide.make_inputs(get_inputs, 100 + i) for i in range(len(sets))]
        put = lambda i, out: None  # noqa: E731 - no copy
        if mode == "privcopy":
            from verifier.judge.arena import fill
            from verifier.judge.tensors import clone

            own = [clone(views(arena, layout)) for layout in spec["outs"]]
            put = lambda i, out: fill(own[i], out)  # noqa: E731
        pipes = open_worker_pipes()
        assert pipes is not None
        with OpNames():
            serve_windows(pipes, model, sets, put, lambda: None)
        arena.close()


def judge_windows(src: str, mode: str) -> dict[str, Any]:
    """(b) and its variants: this process judges a child's windows; the clock's figures."""
    from verifier.judge.clock import JudgeClock
    from verifier.judge.window_judge import WindowJudge

    base = "/dev/shm" if mode == "shm" else None
    with tempfile.TemporaryDirectory(prefix="ks-eager-", dir=base) as tmp:
        judge = WindowJudge(src, SEED, TOL, ARENA_BYTES, path=str(Path(tmp) / "arena.bin"))
        clock = JudgeClock(judge, workdir=Path(tmp))
        if mode in ("nocopy", "fastnocopy", "privcopy", "private"):  # no slot copy: no check
            judge.check = lambda n, deep=False: ""  # type: ignore[method-assign]
        if mode in ("nocopy", "fastnocopy", "private"):  # no copy made: nothing to deduct
            judge.copy_s = 0.0
        spec = {**judge.spec, "path": str(Path(tmp) / "arena.bin")}
        (Path(tmp) / "task.py").write_text(src)
        (Path(tmp) / "spec.json").write_text(json.dumps({"spec": spec, "mode": mode}))
        proc = subprocess.run([sys.executable, "-m", "benchmarks.eager_method", "--child-serve"],
                              cwd=tmp, env=_child_env(), capture_output=True, text=True,
                              timeout=300)
        timed = clock.result()
        judge.close()
    if proc.returncode or timed["failure"] or timed["judge_error"] or not timed["figures"]:
        raise RuntimeError(f"{mode}: {timed['failure'] or timed['judge_error']} "
                           f"{proc.stderr[-800:]}")
    return timed["figures"]


def served(src: str) -> dict[str, Any]:
    """The baseline as the verifier now times it (cpu): `SandboxRunner.baseline`."""
    from verifier.backends.cpu import CpuBackend
    from verifier.isolation.sandbox import SpawnLauncher
    from verifier.protocol import VerifyOptions
    from verifier.run.runners import SandboxRunner

    with tempfile.TemporaryDirectory(prefix="ks-eager-") as tmp:
        opts = VerifyOptions(backend="cpu", run_timeout_s=120.0, baseline_cache_dir=tmp)
        runner = SandboxRunner(SpawnLauncher(), CpuBackend(), opts, {}, threads=1)
        got = runner.baseline(src, {"seed": SEED})
    if not got:
        raise RuntimeError("served: no baseline")
    return got["eager_windows"]


def in_process(src: str) -> dict[str, Any]:
    """(a) in a fresh trusted child process."""
    with tempfile.TemporaryDirectory(prefix="ks-eager-") as tmp:
        (Path(tmp) / "task.py").write_text(src)
        proc = subprocess.run([sys.executable, "-m", "benchmarks.eager_method",
                               "--child-in-process"], cwd=tmp, env=_child_env(),
                              capture_output=True, text=True, timeout=300)
    if proc.returncode:
        raise RuntimeError(f"in_process: {proc.stderr[-800:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


MODES = ("windows", "served", "shm", "privcopy", "nocopy", "private", "fast", "fastnocopy")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="relu,pow,softmax")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--repeat", type=int, default=2, help="runs of each; the fastest is shown")
    ap.add_argument("--json", default="", help="also write the rows here")
    ap.add_argument("--child-in-process", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_in_process:
        print(json.dumps(child_in_process(Path("task.py").read_text())))
        return 0
    if args.child_serve:
        job = json.loads(Path("spec.json").read_text())
        child_serve(Path("task.py").read_text(), job["spec"], job["mode"])
        return 0
    modes = [m for m in args.modes.split(",") if m]
    rows = []
    print(f"{'task':8} {'size':9} {'(a) us':>8} " + " ".join(f"{m + ' us':>11}" for m in modes)
          + f" {'old x':>5} {'new x':>5} {'fast x':>6} {'nocopy x':>8} {'calls a/b':>10}"
          + f" {'copy us':>7}")
    for op in args.tasks.split(","):
        for r, c in SIZES:
            src = task_source(op, r, c)
            a = min((in_process(src) for _ in range(args.repeat)),
                    key=lambda f: f["runtime_us"])
            b = {m: min(((served(src) if m == "served" else judge_windows(src, m))
                         for _ in range(args.repeat)),
                        key=lambda f: f["runtime_us"])
                 for m in modes if op in FAST or not m.startswith("fast")}
            first = b[modes[0]]
            ratio = lambda p, q, b=b: (b[p]["runtime_us"] / b[q]["runtime_us"]  # noqa: E731
                                  if p in b and q in b else None)
            row = {"task": op, "size": f"{r}x{c}", "a_us": a["runtime_us"], "a_calls": a["calls"],
                   "a_windows_us": a["windows_us"],
                   **{f"{m}_windows_us": b[m]["windows_us"] for m in b},
                   **{f"{m}_us": b[m]["runtime_us"] for m in b},
                   "new_x": ratio("served", "windows"), "fast_x": ratio("served", "fast"),
                   "nocopy_fast_x": ratio("nocopy", "fastnocopy"),
                   "b_calls": first["calls"], "sets": first["sets"], "copy_us": first["copy_us"],
                   "round_trip_us": first["round_trip_us"]}
            rows.append(row)
            cell = lambda x, w: f"{x:{w}.2f}" if x is not None else f"{'-':>{w}}"  # noqa: E731
            print(f"{op:8} {row['size']:9} {a['runtime_us']:8.1f} "
                  + " ".join(f"{b[m]['runtime_us']:11.1f}" if m in b else f"{'-':>11}"
                             for m in modes)
                  + f" {a['runtime_us'] / first['runtime_us']:5.2f} {cell(row['new_x'], 5)}"
                  + f" {cell(row['fast_x'], 6)} {cell(row['nocopy_fast_x'], 8)}"
                  + f" {a['calls']:>4}/{first['calls']:<5} {first['copy_us']:7.1f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"when": time.strftime("%F %T"), "rows": rows},
                                              indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
