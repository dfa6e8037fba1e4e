"""What stepped windows cost an honest forward on the cpu backend (issue 28, round 6).

A stepped window (`verifier.judge.stepped`) publishes each call's input set only after the call
before it wrote its slot: one clock-pipe round trip and one set write per call, inside the
window. This times the same reference forward served by a child process (the harness's own
`serve_timed_windows`, as `benchmarks.eager_method`'s `windows` mode) with unstepped and
stepped windows, interleaved, and prints each one's fastest and median runtime per call (us,
after the judge's copy deduction) and stepped over unstepped.
Usage: nice -n 15 python -m benchmarks.stepped_windows [--tasks relu:16x1024,...] [--repeat 3]
       [--unmetered]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.eager_method import ARENA_BYTES, SEED, TOL, _child_env, task_source

TASKS = "relu:16x64,relu:16x1024,softmax:16x1024,relu:512x512"


def judged(src: str, stepped: bool, metered: bool) -> dict[str, Any]:
    """The clock's figures of a child serving this process's windows with the reference
    (`metered`: the child's cpu time by a cgroup of its own, one core given, as the cpu
    runner's clock meters a run)."""
    from verifier.isolation.cpu_meter import CpuCgroup
    from verifier.judge.clock import JudgeClock
    from verifier.judge.window_judge import WindowJudge

    meter = CpuCgroup.make() if metered else None
    if metered and meter is None:
        raise RuntimeError("--metered: no cpu cgroup can be made here")
    with tempfile.TemporaryDirectory(prefix="ks-stepped-") as tmp:
        judge = WindowJudge(src, SEED, TOL, ARENA_BYTES, path=str(Path(tmp) / "arena.bin"))
        clock = JudgeClock(judge, workdir=Path(tmp), stepped=stepped)
        spec = {**judge.spec, "path": str(Path(tmp) / "arena.bin")}
        (Path(tmp) / "task.py").write_text(src)
        (Path(tmp) / "spec.json").write_text(json.dumps({"spec": spec, "mode": "windows"}))
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks.eager_method",
                                 "--child-serve"], cwd=tmp, env=_child_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if meter is not None:  # joined before it imports torch: every thread of it counted
            procs = "cgroup.procs" if (meter.path / "cgroup.procs").exists() else "tasks"
            (meter.path / procs).write_text(str(proc.pid))
            clock.watch(meter.cpu_s, cpus=1, runnable=meter.runnable)
        _, err = proc.communicate(timeout=300)
        timed = clock.result()
        judge.close()
        if meter is not None:
            meter.remove()
    if proc.returncode or timed["failure"] or timed["judge_error"] or not timed["figures"]:
        raise RuntimeError(f"{timed['failure'] or timed['judge_error']} {err[-800:]}")
    return timed["figures"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default=TASKS, help="op:ROWSxCOLS,... (benchmarks.eager_method)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each, interleaved")
    ap.add_argument("--unmetered", action="store_true", help="no cpu meter (the clock then "
                    "keeps a step's write of the next set in the window)")
    args = ap.parse_args()
    print("| task | unstepped us (fastest / median) | stepped us (fastest / median) | "
          "stepped/unstepped | calls |")
    print("|---|---|---|---|---|")
    for item in args.tasks.split(","):
        op, size = item.split(":")
        rows, cols = (int(v) for v in size.split("x"))
        src = task_source(op, rows, cols)
        runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        for _ in range(args.repeat):
            for stepped in (False, True):
                runs[stepped].append(judged(src, stepped, not args.unmetered))
        best = {k: min(v, key=lambda f: f["runtime_us"]) for k, v in runs.items()}
        med = {k: sorted(f["runtime_us"] for f in v)[len(v) // 2] for k, v in runs.items()}
        print(f"| {op} {rows}x{cols} | {best[False]['runtime_us']:.1f} / {med[False]:.1f} | "
              f"{best[True]['runtime_us']:.1f} / {med[True]:.1f} | "
              f"{best[True]['runtime_us'] / best[False]['runtime_us']:.2f} | "
              f"{best[False]['calls']}/{best[True]['calls']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
