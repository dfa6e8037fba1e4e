"""Verifier throughput on CPU: batched builds vs plain one-load_inline-per-candidate.

Mixed batch: correct kernels (distinct sources, so each really compiles), buggy kernels, hacks and
compile errors for the relu and linear tasks. Every run salts the C++ sources, so the candidate
builds are cold; the precompiled header (a one-time cost per torch version and flag set) is
built first and reported on its own line.

Baseline (same run): for a subset of the same candidates, a KernelBench-style harness: one fresh
process per candidate that calls the real `load_inline` (its own cold build), then runs the
forward on seeded inputs and compares with the reference, sequentially.

    .venv/bin/python benchmarks/verify_cpu.py [--n 32] [--baseline 3]
"""

from __future__ import annotations

import os
import sys

# Run as a script, this folder is sys.path[0]; its select.py would shadow the stdlib module.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "verifier"))

from verifier_cases import (  # noqa: E402
    CASES,
    LINEAR_TASK,
    RELU_TASK,
    linear_candidate,
    relu_ok,
)

from verifier.api import verify_batch  # noqa: E402
from verifier.backends import get_backend  # noqa: E402
from verifier.checks.extspec import specs_from_source  # noqa: E402
from verifier.compile.builder import BuildContext, Builder  # noqa: E402
from verifier.protocol import VerifyOptions, VerifyRequest  # noqa: E402

TASKS = {"relu": RELU_TASK, "linear": LINEAR_TASK}
KEEP = {"incorrect_off_by_one", "incorrect_zeros", "incorrect_dtype", "cheat_hidden_aten",
        "cheat_cached_result", "compile_syntax", "static_torch_relu", "crash_segfault",
        "incorrect_bounds_stride", "static_cpp_aten"}

BASELINE_SCRIPT = r'''
import json, sys, time
t0 = time.perf_counter()
import torch
ns_task, ns_cand = {}, {}
exec(open("task.py").read(), ns_task)
tc = time.perf_counter()
exec(compile(open("cand.py").read(), "cand.py", "exec"), ns_cand)
compile_s = time.perf_counter() - tc
init = ns_task["get_init_inputs"]()
torch.manual_seed(0); ref = ns_task["Model"](*init)
torch.manual_seed(0); new = ns_cand["ModelNew"](*init)
if list(ref.state_dict()) == list(new.state_dict()):
    new.load_state_dict(ref.state_dict())
ok, cand_s = True, 0.0
with torch.no_grad():
    for t in range(5):
        torch.manual_seed(1000 + t)
        xs = ns_task["get_inputs"]()
        r = ref(*xs)
        c0 = time.perf_counter(); o = new(*xs); cand_s += time.perf_counter() - c0
        ok = ok and torch.allclose(o, r, atol=1e-4, rtol=1e-4)
    times = []
    for _ in range(20):
        c0 = time.perf_counter(); new(*xs); times.append(time.perf_counter() - c0)
    cand_s += sum(times)
json.dump({"ok": bool(ok), "compile_s": compile_s, "cand_s": cand_s,
           "total_s": time.perf_counter() - t0}, open("out.json", "w"))
'''


def salted(code: str, salt: str) -> str:
    """The same candidate with a comment in its C++ source, so its build is new."""
    return code.replace('cpp_source = r"""\n', f'cpp_source = r"""\n// {salt}\n', 1)


def mixed_batch(n: int, salt: str) -> list[tuple[str, str, str]]:
    """(id, task, code): correct variants plus the chosen failure cases, n in all."""
    out = []
    fails = [(name, task, code) for name, task, _, code in CASES if name in KEEP]
    i = 0
    while len(out) < n:
        if i % 3 == 2 and fails:
            name, task, code = fails[(i // 3) % len(fails)]
            out.append((f"{name}_{i}", task, salted(code, f"{salt} {i}")))
        elif i % 3 == 1:
            out.append((f"linear_{i}", "linear", salted(linear_candidate(), f"{salt} {i}")))
        else:
            out.append((f"relu_{i}", "relu", salted(relu_ok(f"relu_v{i}"), f"{salt} {i}")))
        i += 1
    return out


def run_baseline(batch: list[tuple[str, str, str]], k: int, tmp: Path) -> list[dict]:
    """Plain harness on the first k compiling candidates, sequentially, cold extension dir."""
    rows = []
    for cid, task, code in [b for b in batch if b[0].startswith(("relu_", "linear_"))][:k]:
        d = tmp / f"base_{cid}"
        d.mkdir()
        (d / "task.py").write_text(TASKS[task])
        (d / "cand.py").write_text(code.replace('name="ext"', f'name="b_{cid}"')
                                   .replace('name="lin"', f'name="b_{cid}"'))
        (d / "run.py").write_text(BASELINE_SCRIPT)
        t0 = time.monotonic()
        env = {"TORCH_EXTENSIONS_DIR": str(d / "ext"), "PATH": "/usr/bin:/bin",
               "OMP_NUM_THREADS": "1", "HOME": str(d)}
        subprocess.run([sys.executable, "run.py"], cwd=d, env=env, check=True,
                       capture_output=True)
        r = json.loads((d / "out.json").read_text())
        r["wall_s"] = time.monotonic() - t0
        rows.append(r)
        print(f"  baseline {cid}: {r['wall_s']:.1f}s (compile {r['compile_s']:.1f}s)",
              file=sys.stderr)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=32, help="candidates in the mixed batch")
    ap.add_argument("--baseline", type=int, default=3, help="candidates for the baseline")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--compile-batch", type=int, default=16)
    ap.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "kernelsynth-bench"))
    ap.add_argument("--compare-spawn", action="store_true",
                    help="re-run the batch (builds cached) with a fresh interpreter per run "
                         "instead of the fork server, for the harness-overhead row")
    a = ap.parse_args()
    salt = uuid.uuid4().hex[:8]
    batch = mixed_batch(a.n, salt)
    tmp = Path(tempfile.mkdtemp(prefix="ks-bench-"))

    # one-time: the precompiled header for the common flag set
    t0 = time.monotonic()
    ctx = BuildContext(get_backend("cpu"), Path(a.cache_dir) / "builds")
    specs = [s for _, _, code in batch for s in (specs_from_source(code) or [])]
    Builder(ctx).prepare_pch(specs)
    pch_s = time.monotonic() - t0

    opts = VerifyOptions(backend="cpu", workers=a.workers, compile_workers=a.workers,
                         compile_batch=a.compile_batch, run_timeout_s=60, perf_trials=20,
                         build_cache_dir=str(Path(a.cache_dir) / "builds"),
                         baseline_cache_dir=str(tmp / "baselines"))
    reqs = [VerifyRequest(cid, task, TASKS[task], code, "cpu") for cid, task, code in batch]
    timings: dict[str, dict[str, float]] = {}
    t0 = time.monotonic()
    verdicts = verify_batch(reqs, opts, timings=timings)
    wall = time.monotonic() - t0
    compile_total = sum(v.compile_s for v in verdicts)
    compiled = [v for v in verdicts if v.stage not in ("extract", "static")]
    overhead = [t["exec_s"] - t.get("candidate_s", 0.0) for t in timings.values()
                if "exec_s" in t]
    statuses: dict[str, int] = {}
    for v in verdicts:
        statuses[v.status] = statuses.get(v.status, 0) + 1

    spawn_over: list[float] = []
    if a.compare_spawn:
        stimings: dict[str, dict[str, float]] = {}
        sopts = VerifyOptions(**{**opts.__dict__, "fork_server": False,
                                 "baseline_cache_dir": str(tmp / "baselines-spawn")})
        again = verify_batch(reqs, sopts, timings=stimings)
        assert [v.status for v in again] == [v.status for v in verdicts], "verdicts differ"
        spawn_over = [t["exec_s"] - t.get("candidate_s", 0.0) for t in stimings.values()
                      if "exec_s" in t]

    base = run_baseline(batch, a.baseline, tmp)
    b_wall = statistics.mean(r["wall_s"] for r in base)
    b_compile = statistics.mean(r["compile_s"] for r in base)
    b_over = statistics.mean(r["total_s"] - r["compile_s"] - r["cand_s"] for r in base)

    print(f"\nmixed batch: {len(batch)} candidates ({len(compiled)} reach compile), statuses "
          f"{json.dumps(statuses)}; one-time PCH build {pch_s:.1f}s (0 when cached)")
    print(f"baseline: plain load_inline + run per candidate, sequential, measured on "
          f"{len(base)} of the compiling candidates (cold builds each)\n")
    rows = [
        ("candidates / minute", f"{60 * len(batch) / wall:.1f}", f"{60 / b_wall:.2f}"),
        ("amortized compile s / compiled candidate",
         f"{compile_total / max(1, len(compiled)):.2f}", f"{b_compile:.1f}"),
        ("harness overhead s / executed candidate",
         f"{statistics.mean(overhead):.2f}" if overhead else "n/a", f"{b_over:.2f}"),
        ("wall s for the batch", f"{wall:.1f}", f"{b_wall * len(batch):.0f} (extrapolated)"),
    ]
    if spawn_over:
        rows.insert(3, ("  same, a fresh interpreter per run (no fork server)",
                        f"{statistics.mean(spawn_over):.2f}", "-"))
    w = max(len(r[0]) for r in rows)
    print(f"{'metric':<{w}} | {'kernelsynth verifier':>20} | {'plain load_inline':>18}")
    print("-" * (w + 44))
    for name, ours, theirs in rows:
        print(f"{name:<{w}} | {ours:>20} | {theirs:>18}")


if __name__ == "__main__":
    main()
