"""Where a GPU verification's fixed costs go (device runs only): process start, CUDA context and
profiler start in a fresh interpreter vs in a child forked from a parent that imported torch
without touching CUDA; and nvcc/g++ time for one candidate's extension vs a batch of them in one
translation unit (verifier.build.Builder, CUDA backend, cold cache).

    PYTHONPATH=. python3 benchmarks/gpu_diag.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CHILD_STEPS = r'''
import time
def steps(t0, out):
    import torch
    out["import_s"] = time.monotonic() - t0
    t = time.monotonic(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
    out["cuda_init_s"] = time.monotonic() - t
    from torch.profiler import ProfilerActivity, profile
    for k in ("profiler1_s", "profiler2_s"):
        t = time.monotonic()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            torch.ones(4, device="cuda").add_(1); torch.cuda.synchronize()
        names = [e.name for e in p.events() if getattr(e, "device_type", None) is not None
                 and e.device_type != torch.autograd.DeviceType.CPU]
        out[k] = time.monotonic() - t
    out["kernels"] = names[:3]
    t = time.monotonic()
    buf = torch.empty(100 << 20, dtype=torch.uint8, device="cuda"); buf.zero_()
    torch.cuda.synchronize(); out["alloc_s"] = time.monotonic() - t
    return out
'''


def fresh_process() -> dict:
    code = CHILD_STEPS + ("\nimport json, sys\nt0 = time.monotonic()\n"
                          "print(json.dumps(steps(t0, {})))\n")
    t = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    res = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {
        "error": proc.stderr[-500:]}
    res["wall_s"] = time.monotonic() - t
    return res


def forked_children(n: int) -> list[dict]:
    """Children forked from this process, which has imported torch but never touched CUDA."""
    import torch  # noqa: F401
    import torch.utils.cpp_extension  # noqa: F401
    ns: dict = {}
    exec(CHILD_STEPS, ns)
    assert not torch.cuda.is_initialized()
    out = []
    for _ in range(n):
        r, w = os.pipe()
        t = time.monotonic()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                res = ns["steps"](time.monotonic(), {})
            except BaseException as exc:  # report, never return into the parent's code
                res = {"error": repr(exc)}
            os.write(w, json.dumps(res).encode())
            os._exit(0)
        os.close(w)
        data = b""
        while chunk := os.read(r, 65536):
            data += chunk
        os.close(r)
        os.waitpid(pid, 0)
        res = json.loads(data)
        res["wall_s"] = time.monotonic() - t
        out.append(res)
    return out


def compile_costs(workers: int) -> list[dict]:
    from benchmarks.gpu_candidates import all_candidates
    from verifier.backends.cuda import CudaBackend
    from verifier.build import BuildContext, Builder
    from verifier.extspec import specs_from_source

    cands = [c for c in all_candidates() if c.kind == "correct"]
    specs = [s for c in cands for s in (specs_from_source(c.source) or [])]
    code_of = {s.key: c.source for c in cands for s in (specs_from_source(c.source) or [])}
    rows = []

    def build(label: str, groups: list[list]) -> None:
        cache = Path(tempfile.mkdtemp(prefix="ks-diag-"))
        ctx = BuildContext(CudaBackend(), cache, code_of=code_of)
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
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--skip-compile", action="store_true")
    args = ap.parse_args()
    report: dict = {"forked": forked_children(3)}
    for r in report["forked"]:
        print("forked child:", json.dumps(r), flush=True)
    report["fresh"] = [fresh_process() for _ in range(2)]
    for r in report["fresh"]:
        print("fresh process:", json.dumps(r), flush=True)
    if not args.skip_compile:
        report["compile"] = compile_costs(args.workers)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gpu_diag.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
