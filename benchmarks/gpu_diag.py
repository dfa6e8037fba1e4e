"""Where a GPU verification's fixed costs go (device runs only).

1. process start-up: a fresh interpreter's `import torch`, CUDA context and first/second
   profiler session; then the same in a child forked from a parent that ran a setup line
   (`import torch` alone, with cpp_extension/profiler imported, with NVML-based CUDA checks, with
   a CPU profiler session): which parents leave their children able to initialize CUDA;
2. the profiler's start-up cost split (a CPU-only session first, then a CUDA one);
3. nvcc/g++ time for one candidate's extension vs batches in one translation unit
   (verifier.compile.builder.Builder, CUDA backend, cold cache).

Measured on an H100 node (2026-11-22, benchmarks/results/gpu_diag.txt): a child forked after
`import torch` initializes CUDA in 0.35-0.5 s; torch.utils.cpp_extension + torch.profiler
imported without PYTORCH_NVML_BASED_CUDA_CHECK=1 poison the fork; the first profiler session of
a process costs 3.5-6.5 s whatever its activities, and one in the parent breaks CUDA in the
child. Hence verifier.run.forkserver for CPU-side runs and one persistent verifier.run.gpu_worker per
GPU for CUDA runs.

    PYTHONPATH=. python3 benchmarks/gpu_diag.py [--out DIR] [--skip-compile]
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, benchmarks/ is sys.path[0], where select.py would shadow the stdlib module.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

# The measured steps, run in a fresh interpreter or in a forked child (prints one JSON line).
STEPS = r'''
import json, os, sys, time
def steps(t0):
    out = {}
    import torch
    out["import_s"] = time.monotonic() - t0
    out["bad_fork"] = bool(getattr(torch._C, "_cuda_isInBadFork", lambda: False)())
    try:
        t = time.monotonic(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
        out["cuda_init_s"] = time.monotonic() - t
        from torch.profiler import ProfilerActivity, profile
        for k in ("profiler1_s", "profiler2_s"):
            t = time.monotonic()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
                torch.ones(4, device="cuda").add_(1); torch.cuda.synchronize()
            out[k] = time.monotonic() - t
        out["kernels"] = sum(1 for e in p.events()
                             if e.device_type != torch.autograd.DeviceType.CPU)
    except BaseException as exc:
        out["error"] = repr(exc)[:300]
    return out
'''

FRESH = STEPS + "\nprint(json.dumps(steps(time.monotonic())))\n"

# argv[1]: a setup line the parent runs before forking the child that runs `steps`.
FORKED = STEPS + r'''
import threading
t = time.monotonic(); exec(sys.argv[1]); setup_s = time.monotonic() - t
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r); os.write(w, json.dumps(steps(time.monotonic())).encode()); os._exit(0)
os.close(w)
data = b""
while chunk := os.read(r, 65536):
    data += chunk
os.waitpid(pid, 0)
print(json.dumps({"setup_s": setup_s, "parent_threads": len(os.listdir("/proc/self/task")),
                  "child": json.loads(data)}))
'''

SETUPS = {
    "import torch": "import torch",
    "import torch (NVML check)": "os.environ['PYTORCH_NVML_BASED_CUDA_CHECK'] = '1'; import torch",
    "+ cpp_extension, profiler": "import torch, torch.utils.cpp_extension, torch.profiler",
    "+ is_available() (NVML)": ("os.environ['PYTORCH_NVML_BASED_CUDA_CHECK'] = '1'; import torch;"
                                " torch.cuda.is_available()"),
    "+ CPU profiler session": ("import torch\nfrom torch.profiler import profile, ProfilerActivity"
                               "\nwith profile(activities=[ProfilerActivity.CPU]): torch.ones(2)"),
}

SPLIT = r'''
import json, time, torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
from torch.profiler import ProfilerActivity, profile
out = {}
for key, acts in (("cpu_only_first_s", [ProfilerActivity.CPU]),
                  ("cuda_after_s", [ProfilerActivity.CUDA])):
    t = time.monotonic()
    with profile(activities=acts):
        torch.ones(4, device="cuda").add_(1); torch.cuda.synchronize()
    out[key] = time.monotonic() - t
print(json.dumps(out))
'''


def _python(code: str, *args: str) -> dict:
    t = time.monotonic()
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code, *args],
                          capture_output=True, text=True, timeout=300)
    lines = proc.stdout.strip().splitlines()
    res = json.loads(lines[-1]) if proc.returncode == 0 and lines else {
        "error": proc.stderr[-500:]}
    res["wall_s"] = round(time.monotonic() - t, 2)
    return res


def process_costs() -> dict:
    report = {"fresh": [_python(FRESH) for _ in range(2)],
              "forked": {name: _python(FORKED, setup) for name, setup in SETUPS.items()},
              "profiler_split": _python(SPLIT)}
    for r in report["fresh"]:
        print("fresh process:", json.dumps(r), flush=True)
    for name, r in report["forked"].items():
        print(f"forked after {name!r}:", json.dumps(r), flush=True)
    print("profiler split:", json.dumps(report["profiler_split"]), flush=True)
    return report


def compile_costs(workers: int) -> list[dict]:
    from benchmarks.gpu_candidates import all_candidates
    from verifier.backends.cuda import CudaBackend
    from verifier.checks.extspec import specs_from_source
    from verifier.compile.builder import BuildContext, Builder

    cands = [c for c in all_candidates() if c.kind == "correct"]
    specs = [s for c in cands for s in (specs_from_source(c.source) or [])]
    rows = []

    def build(label: str, groups: list[list]) -> None:
        cache = Path(tempfile.mkdtemp(prefix="ks-diag-"))
        ctx = BuildContext(CudaBackend(), cache)
        t = time.monotonic()
        Builder(ctx).prepare_pch([s for g in groups for s in g])
        pch_s = time.monotonic() - t
        t = time.monotonic()
        with ThreadPoolExecutor(max(1, min(workers, len(groups)))) as pool:
            results = list(pool.map(lambda g: Builder(ctx).build(g), groups))
        wall = time.monotonic() - t
        n = sum(len(g) for g in groups)
        ok = sum(r.ok for res in results for r in res.values())
        rows.append({"label": label, "specs": n, "ok": ok, "pch_s": round(pch_s, 1),
                     "wall_s": round(wall, 1), "per_spec_s": round(wall / n, 2)})
        print(json.dumps(rows[-1]), flush=True)

    build("1 spec alone", [specs[:1]])
    build("8 specs, one TU", [specs[:8]])
    build(f"{len(specs)} specs, one TU", [specs])
    build(f"{len(specs)} specs, one each, {workers} parallel", [[s] for s in specs])
    size = max(1, len(specs) // workers + 1)
    groups = [specs[i:i + size] for i in range(0, len(specs), size)]
    build(f"{len(specs)} specs, {len(groups)} TUs, parallel", groups)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--skip-compile", action="store_true")
    args = ap.parse_args()
    report: dict = {"processes": process_costs()}
    if not args.skip_compile:
        report["compile"] = compile_costs(args.workers)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gpu_diag.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
