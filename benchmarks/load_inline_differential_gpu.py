"""CUDA differential with outputs (issue 15): every CUDA conformance case built by torch's real
`load_inline` and by our builder, on a GPU host, compared on what a user sees: built or not,
the names each extension binds, and the outputs of `ModelNew` on the same inputs.

    python -m benchmarks.load_inline_differential_gpu --out results.md [--only a,b] [--jobs 12]

Torch's side runs each case in its own process (a fresh extension namespace, the candidate's
own `load_inline` calls with the build folder moved to a temporary one). Our side builds every
spec as the verifier does (batched units on a pool, `verifier.compile.compile_plan`) and runs each case
in its own process with `load_inline` served by `verifier.checks.extspec.install_shim`, as the worker
does. Both seed the same way before constructing `ModelNew` and before `get_inputs`, so equal
code gives equal outputs. Needs a CUDA torch, nvcc and a GPU; torch and stdlib only.
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "verifier" / "conformance"))

# One case in a child: `side` is torch (real load_inline) or ours (install_shim over the
# builder's results). Writes {built, bound, error, stage} as JSON and the output tensors.
_CHILD = r'''
import json, os, sys, tempfile, traceback
from pathlib import Path
import torch
from torch.utils import cpp_extension

side, case_file, out_dir = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
case = json.loads(case_file.read_text())
bound = []
if side == "ours":
    from verifier.checks.extspec import install_shim
    install_shim(case["built"])
inner = cpp_extension.load_inline

failed = []

def load_inline(*args, **kwargs):
    if side == "torch":  # the candidate's own folder may clash with another case's
        kwargs["build_directory"] = tempfile.mkdtemp(prefix="ks_diff_", dir=str(out_dir))
    try:
        mod = inner(*args, **kwargs)
    except BaseException:
        failed.append(True)
        raise
    bound.append(sorted(n for n in dir(mod) if not n.startswith("_")))
    return mod

cpp_extension.load_inline = load_inline
res = {"built": False, "bound": bound, "error": "", "stage": ""}
try:
    task = {}
    exec(compile(case["task_source"], "task.py", "exec"), task)
    ns = {"__name__": "candidate"}
    exec(compile(case["code"], "candidate.py", "exec"), ns)
    res["stage"] = "run"
    torch.manual_seed(0)
    model = ns["ModelNew"](*task["get_init_inputs"]()).cuda().eval()  # may build (in __init__)
    torch.manual_seed(1)
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in task["get_inputs"]()]
    with torch.no_grad():
        out = model(*inputs)
    torch.cuda.synchronize()
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    torch.save([o.detach().cpu() for o in outs], out_dir / f"{side}.pt")
    res["stage"] = "done"
except BaseException as exc:
    res["error"] = f"{type(exc).__name__}: {str(exc)[-600:]}"
    res["trace"] = traceback.format_exc()[-1500:]
res["built"] = bool(bound) and not failed  # every load_inline call returned its module
(out_dir / f"{side}.json").write_text(json.dumps(res))
'''


def _child(side: str, case: dict[str, Any], work: Path, env: dict[str, str],
           timeout: float) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    (work / f"{side}_case.json").write_text(json.dumps(case))
    t = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD, side, str(work / f"{side}_case.json"),
                               str(work)], capture_output=True, text=True, env=env,
                              timeout=timeout, cwd=str(ROOT))
        tail = proc.stderr[-800:]
    except subprocess.TimeoutExpired:
        return {"built": False, "bound": [], "error": f"timed out after {timeout:.0f} s",
                "stage": "timeout", "seconds": timeout}
    path = work / f"{side}.json"
    res = json.loads(path.read_text()) if path.is_file() else {
        "built": False, "bound": [], "error": f"child died: {tail}", "stage": "crash"}
    res["seconds"] = round(time.monotonic() - t, 1)
    return res


def _compare_outputs(work: Path) -> tuple[str, float]:
    import torch

    a, b = work / "torch.pt", work / "ours.pt"
    if not (a.is_file() and b.is_file()):
        return "-", float("nan")
    ta, tb = torch.load(a), torch.load(b)
    if len(ta) != len(tb) or any(x.shape != y.shape or x.dtype != y.dtype
                                 for x, y in zip(ta, tb, strict=True)):
        return "shape/dtype differ", float("inf")
    pairs = list(zip(ta, tb, strict=True))
    diff = max(((x.double() - y.double()).abs().max().item() if x.numel() else 0.0)
               for x, y in pairs)
    if all(torch.equal(x, y) for x, y in pairs):
        return "equal", 0.0
    close = all(torch.allclose(x.double(), y.double(), rtol=1e-5, atol=1e-6)
                for x, y in pairs)
    return ("close" if close else "differ"), diff


def run(names: list[str] | None, jobs: int, work_root: Path, timeout: float
        ) -> list[dict[str, Any]]:
    """Both sides of every case; one row per case."""
    import corpus

    from verifier.backends import get_backend
    from verifier.checks.extspec import specs_from_source
    from verifier.compile.builder import BuildContext, Builder
    from verifier.compile.compile_plan import compile_all

    rows = [r for r in corpus.load("cuda") if not names or r["name"] in names]
    specs, by_case = [], {}
    for r in rows:
        found = specs_from_source(r["code"]) or []
        by_case[r["name"]] = found
        specs += found
    unique = list({s.key: s for s in specs}.values())
    t = time.monotonic()
    ctx = BuildContext(get_backend("cuda"), work_root / "cache")
    results: dict[str, Any] = {}
    compile_all(Builder(ctx), unique, workers=jobs, most=8, on_ready=results.update)
    ours_build_s = time.monotonic() - t
    env = {**os.environ, "MAX_JOBS": "2", "PYTHONPATH": str(ROOT)}

    def one(r: dict[str, Any]) -> dict[str, Any]:
        work = work_root / r["name"]
        base = {"task_source": r["task_source"], "code": r["code"]}
        theirs = _child("torch", base, work, env, timeout)
        built = {s.key: results[s.key].to_entry() for s in by_case[r["name"]]
                 if s.key in results and results[s.key].ok}
        all_ok = bool(by_case[r["name"]]) and len(built) == len(by_case[r["name"]])
        if all_ok:
            ours = _child("ours", {**base, "built": built}, work, env, timeout)
        else:
            logs = [results[s.key].log[-300:] for s in by_case[r["name"]]
                    if s.key in results and not results[s.key].ok]
            ours = {"built": False, "bound": [], "stage": "build",
                    "error": " | ".join(logs) or "no literal load_inline specs"}
        outputs, diff = _compare_outputs(work)
        return {"case": r["name"], "torch": theirs, "ours": ours, "outputs": outputs,
                "max_abs_diff": diff}

    t = time.monotonic()
    with ThreadPoolExecutor(jobs) as pool:
        out = list(pool.map(one, rows))
    for row in out:
        row["agree"] = (row["torch"]["built"] == row["ours"]["built"]
                        and row["torch"]["bound"] == row["ours"]["bound"]
                        and row["outputs"] in ("equal", "close", "-")
                        and (row["outputs"] != "-" or row["torch"]["stage"] != "done"
                             and row["ours"]["stage"] != "done"))
    print(f"ours: build {ours_build_s:.0f} s; both sides run {time.monotonic() - t:.0f} s",
          file=sys.stderr)
    return out


def table(out: list[dict[str, Any]], header: str) -> str:
    lines = [header, "", "| case | torch built | ours built | bound names | outputs | "
             "max abs diff | agree |", "| --- | --- | --- | --- | --- | ---: | --- |"]
    for r in out:
        same_bound = "same" if r["torch"]["bound"] == r["ours"]["bound"] else \
            f"torch {r['torch']['bound']} / ours {r['ours']['bound']}"
        lines.append(f"| {r['case']} | {r['torch']['built']} | {r['ours']['built']} | "
                     f"{same_bound} | {r['outputs']} | {r['max_abs_diff']:.3g} | "
                     f"{'yes' if r['agree'] else 'NO'} |")
    agree = sum(r["agree"] for r in out)
    lines += ["", f"agree: {agree}/{len(out)}"]
    for r in out:
        if not r["agree"]:
            lines.append(f"- {r['case']}: torch {r['torch']['stage']} {r['torch']['error'][:300]!r}"
                         f"; ours {r['ours']['stage']} {r['ours']['error'][:300]!r}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--timeout", type=float, default=400.0)
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("load_inline_differential_gpu: needs a CUDA GPU and a CUDA torch", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ks_lidiff_") as tmp:
        out = run([n for n in args.only.split(",") if n] or None, args.jobs, Path(tmp),
                  args.timeout)
    header = (f"# load_inline differential on {torch.cuda.get_device_name()} (torch "
              f"{torch.__version__}), {len(out)} CUDA conformance cases, "
              f"{time.monotonic() - t0:.0f} s wall\n\nCommand: `python -m "
              f"benchmarks.load_inline_differential_gpu --out ... --jobs {args.jobs}`")
    text = table(out, header)
    Path(args.out).write_text(text)
    Path(args.out).with_suffix(".json").write_text(json.dumps(out, indent=1, default=str))
    print(text)
    return 0 if all(r["agree"] for r in out) else 1


if __name__ == "__main__":
    sys.exit(main())
