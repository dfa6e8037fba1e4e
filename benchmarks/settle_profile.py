"""What the persistent worker's settle between jobs costs, part by part (cpu loop).

Two measurements in one run:
1. In this process, the worker's own loop as `verifier.run.gpu_worker.main` runs it (warm-up,
   the ready snapshot, the harness frozen), then N honest jobs (`run_job`, the after-job
   hygiene) each followed by the real `_settle`; every function the settle goes through is
   wrapped (before the ready snapshot, so the hygiene checks see the wrappers as the
   harness's own) and timed only while a settle runs: the table gives each part's calls and
   milliseconds per settle (inclusive: a part's callees are in its figure too). The standalone
   cost of a scan of the frozen generation (`gc.get_freeze_count`) and of the full process
   snapshot (`tamper.process_state`) are timed on their own as reference rows.
2. The real cpu loop (`GpuRunner`, its worker process, `verifier_cases.cpu_loop_jobs`): the
   parent's "settle" span of N honest jobs (the worker's settle, its reply's JSON, the pipe).

Run it on two checkouts to compare (the old code path is a commit, not a switch):

    .venv/bin/python benchmarks/settle_profile.py [--jobs 12] [--no-loop]
"""

from __future__ import annotations

import os
import sys

# Run as a script, this folder is sys.path[0]; its select.py would shadow the stdlib module.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import functools  # noqa: E402
import gc  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "verifier"))

# an honest job: numpy's ReLU (no build, so the settle is most of what a job adds)
HONEST = '''import torch


class ModelNew(torch.nn.Module):
    def forward(self, x):
        import numpy as np
        return torch.from_numpy(np.maximum(x.numpy(), 0))
'''

# (module, function) the settle goes through, those that exist in this checkout
PARTS = [
    ("gc", "collect"), ("gc", "freeze"), ("gc", "unfreeze"), ("gc", "get_freeze_count"),
    ("gc", "get_objects"),
    ("verifier.run.settle", "leftover_code"), ("verifier.run.settle", "collect_left_garbage"),
    ("verifier.run.disarm", "detach_all"), ("verifier.run.disarm", "pin_mortal"),
    ("verifier.run.disarm", "note_frozen"), ("verifier.run.disarm", "mortal_objects"),
    ("verifier.run.gpu_worker", "_hygiene"), ("verifier.run.gpu_worker", "after_job"),
    ("verifier.run.gpu_worker", "watched_state"), ("verifier.run.gpu_worker", "global_flags"),
    ("verifier.run.settle", "strays_end_it"), ("verifier.run.settle", "memory_ends_it"),
    ("verifier.run.tamper", "residue_ends_it"), ("verifier.run.tamper", "left_in_process"),
    ("verifier.run.tamper", "process_state"), ("verifier.run.tamper", "module_callables"),
    ("verifier.run.tamper", "class_attributes"), ("verifier.run.tamper", "protocol_state"),
    ("verifier.run.tamper", "torch_private"), ("verifier.run.tamper", "interpreter_private"),
    ("verifier.run.tamper", "process_settings"), ("verifier.run.tamper", "torch_switches"),
    ("verifier.run.tamper", "_py_kernels"), ("verifier.run.tamper", "logging_hooks"),
    ("verifier.run.import_residue", "snapshot"), ("verifier.run.import_residue", "added"),
    ("verifier.run.hidden_state", "snapshot"), ("verifier.run.hidden_state", "package_paths"),
    ("verifier.run.hidden_state", "codec_search"),
]

SPENT: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])  # part: [calls, seconds]
PER_SETTLE: dict[str, list[float]] = defaultdict(list)  # part: its seconds in each settle
ON = [False]


def _timed(name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not ON[0]:
            return fn(*args, **kwargs)
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[name][0] += 1
            SPENT[name][1] += time.perf_counter() - t
    return wrapper


def wrap_parts() -> list[str]:
    """Replace each part, wherever a loaded module binds it, by its timed wrapper."""
    import importlib

    found = []
    for module, name in PARTS:
        mod = importlib.import_module(module)
        fn = getattr(mod, name, None)
        if fn is None:
            continue
        label = f"{module.removeprefix('verifier.run.')}.{name}"
        wrapped = _timed(label, fn)
        for other in list(sys.modules.values()):
            names = getattr(other, "__dict__", None)
            if type(names) is dict:
                for k, v in list(names.items()):
                    if v is fn:
                        names[k] = wrapped
        found.append(label)
    return found


def in_process(jobs: int) -> tuple[list[str], list[float], dict[str, float]]:
    """The worker's loop in this process: the parts' table, each settle's seconds, and the
    reference rows' standalone costs (median seconds)."""
    parts = wrap_parts()
    from verifier_cases import relu_task

    from verifier.run import gpu_worker, tamper
    from verifier.run.disarm import note_frozen
    from verifier.run.settle import armed_finalizers, held_memory
    from verifier.run.worker import run_job

    gpu_worker._warm_up("cpu", {})
    state, flags = gpu_worker.watched_state(), gpu_worker.global_flags()
    threads = __import__("threading").active_count()
    residue = tamper.process_state()
    gc.collect()
    gc.freeze()
    mark = note_frozen(freeze=False)
    ready = gpu_worker.ReadyState(state=tuple(state.items()), flags=tuple(flags.items()),
                                  threads=threads, memory=held_memory(),
                                  armed=tuple(armed_finalizers().items()),
                                  residue=tuple(residue.items()))
    task, held, walls = relu_task(256, 256), [], []
    refs: dict[str, list[float]] = defaultdict(list)
    for i in range(jobs):
        job = {"nonce": f"settle-{i}", "backend": "cpu", "extensions": {},
               "options": {"trials": 2, "perf_trials": 2, "perf_max_trials": 2,
                           "perf_warmup": 1}}
        gc.enable()
        held.clear()
        result = run_job(job, task, HONEST)
        gc.disable()
        held[:] = [result, result.pop("raw_outputs", None)]
        assert not gpu_worker._hygiene(result, ready, held[1]), result.get("error")
        if i == 0:  # the first job's settle pays one-time costs (lazy imports): not counted
            _, mark = gpu_worker._settle(held, ready, mark)
            continue
        spent = {k: v[1] for k, v in SPENT.items()}
        ON[0] = True
        t = time.perf_counter()
        report, mark = gpu_worker._settle(held, ready, mark)
        walls.append(time.perf_counter() - t)
        ON[0] = False
        for label in parts:
            PER_SETTLE[label].append(SPENT[label][1] - spent.get(label, 0.0))
        assert report["outcome"] == "ok" and not report["worker_leaves"], report
        for label, fn in (("ref: gc.get_freeze_count() once", gc.get_freeze_count),
                          ("ref: tamper.process_state() once", tamper.process_state)):
            t = time.perf_counter()
            fn()
            refs[label].append(time.perf_counter() - t)
    return parts, walls, {k: statistics.median(v) for k, v in refs.items()}


def loop_settles(jobs: int) -> list[float]:
    """The parent's settle span of each honest job after the first in the real cpu loop."""
    from verifier_cases import cpu_loop_jobs

    outs, _ = cpu_loop_jobs([HONEST] * jobs, "settle-loop")
    return [o.spans["settle"] for o in outs[1:] if "settle" in o.spans]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--no-loop", action="store_true", help="skip the real cpu loop")
    args = ap.parse_args()
    head = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h %s"],
                          capture_output=True, text=True).stdout.strip()
    print(f"checkout: {ROOT} {head}")
    parts, walls, refs = in_process(args.jobs)
    n = len(walls)
    print(f"\nin-process worker loop, {n} settles (the first job's left out); "
          f"frozen objects now {gc.get_freeze_count()}")
    print(f"{'part (inclusive)':44} {'calls/settle':>12} {'ms median':>10} {'ms min':>8}")
    for label in parts:
        calls, each = SPENT.get(label, (0, 0.0))[0], PER_SETTLE[label]
        print(f"{label:44} {calls / n:12.1f} {statistics.median(each) * 1e3:10.1f} "
              f"{min(each) * 1e3:8.1f}")
    print(f"{'settle (gpu_worker._settle)':44} {'':12} {statistics.median(walls) * 1e3:10.1f} "
          f"{min(walls) * 1e3:8.1f}")
    for label, s in refs.items():
        print(f"{label:44} {'':12} {s * 1e3:10.1f}")
    if not args.no_loop:
        spans = loop_settles(args.jobs)
        print(f"\nreal cpu loop (GpuRunner), {len(spans)} settles: parent's settle span "
              f"median {statistics.median(spans) * 1e3:.1f} ms, mean "
              f"{statistics.mean(spans) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
