"""A KernelBench-style evaluation harness in its best configuration, for benchmarks/verify_gpu.py.

As KernelBench's scripts do it: first every candidate is compiled in parallel on all cores
(`build_compile_cache`: each candidate's module is executed with TORCH_EXTENSIONS_DIR set to its
own build directory, so `torch.utils.cpp_extension.load_inline` builds and caches it; one
process per candidate, MAX_JOBS=1, `cores` at a time), then candidates are evaluated one after
another, each in a fresh Python process (`load_inline` finds its cached build): 5 correctness
trials against the reference with torch.allclose, then 100 timed calls with CUDA events, and the
same for the reference. TF32 is off in both (as in our verifier), so a conv or matmul reference
is exact fp32 and verdicts compare like for like. torch + stdlib only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

KB_COMPILE = r'''
import json, os, sys, time
cand_src, build_dir, out_path = sys.argv[1:4]
os.environ["TORCH_EXTENSIONS_DIR"] = build_dir
t0 = time.monotonic()
res = {}
try:
    ns = {"__name__": "kb_candidate"}
    exec(compile(open(cand_src).read(), "cand", "exec"), ns)
    res["ok"] = True
except BaseException as e:
    res.update(ok=False, error=f"{type(e).__name__}: {e}"[-500:])
res["compile_s"] = time.monotonic() - t0
open(out_path, "w").write(json.dumps(res))
'''

KB_EVAL = r'''
import json, os, sys, time
t0 = time.monotonic()
task_src, cand_src, build_dir, out_path, atol, rtol = sys.argv[1:7]
atol, rtol = float(atol), float(rtol)
os.environ["TORCH_EXTENSIONS_DIR"] = build_dir
import torch
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
res = {}
def done(**kw):
    res.update(kw); res["wall_s"] = time.monotonic() - t0
    open(out_path, "w").write(json.dumps(res)); sys.exit(0)
task = {}; exec(compile(open(task_src).read(), "task", "exec"), task)
cand = {}
try:
    exec(compile(open(cand_src).read(), "cand", "exec"), cand)
except Exception as e:
    done(verdict="compile_error", error=str(e)[-500:])
load_s = time.monotonic() - t0
res["load_s"] = load_s
init = task["get_init_inputs"]()
try:
    torch.manual_seed(42); ref = task["Model"](*init).cuda()
    torch.manual_seed(42); new = cand["ModelNew"](*init).cuda()
    sd = ref.state_dict()
    if sd and set(sd) == set(new.state_dict()): new.load_state_dict(sd)
    with torch.no_grad():
        for trial in range(5):
            torch.manual_seed(trial)
            inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in task["get_inputs"]()]
            r = ref(*inputs); o = new(*inputs); torch.cuda.synchronize()
            if (not isinstance(o, torch.Tensor) or o.shape != r.shape
                    or not torch.allclose(o, r, atol=atol, rtol=rtol)):
                done(verdict="incorrect")
        def timed(fn):
            for _ in range(3): fn(*inputs)
            torch.cuda.synchronize()
            times = []
            for _ in range(100):
                s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
                s.record(); fn(*inputs); e.record(); torch.cuda.synchronize()
                times.append(s.elapsed_time(e) * 1000)
            return sum(times) / len(times)
        m, mr = timed(new), timed(ref)
    done(verdict="correct", runtime_us=m, eager_us=mr, speedup=mr / m)
except Exception as e:
    done(verdict="runtime_error", error=str(e)[-500:])
'''


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TORCH_CUDA_ARCH_LIST", None)  # torch's default: the visible GPU's arch
    env["MAX_JOBS"] = "1"  # one compiler job per candidate process: `cores` processes at once
    return env


def precompile(kernels: list[Any], workdir: Path, cores: int, timeout: float,
               progress: Any = print) -> tuple[dict[str, dict], float]:
    """Compile every candidate's load_inline calls, `cores` processes at once."""
    child = _write(workdir / "kb_compile.py", KB_COMPILE)
    start = time.monotonic()
    done = [0]

    def one(k: Any) -> tuple[str, dict]:
        d = workdir / k.candidate_id
        cand = _write(d / "cand.py", k.source)
        out = d / "compile.json"
        try:
            subprocess.run([sys.executable, str(child), str(cand), str(d / "build"), str(out)],
                           timeout=timeout, capture_output=True, env=_env(),
                           start_new_session=True)
            res = json.loads(out.read_text()) if out.exists() else {"ok": False}
        except subprocess.TimeoutExpired:
            res = {"ok": False, "error": "compile timeout"}
        done[0] += 1
        if done[0] % 8 == 0 or done[0] == len(kernels):
            progress(f"[kb precompile] {done[0]}/{len(kernels)} at "
                     f"{time.monotonic() - start:.0f}s")
        return k.candidate_id, res

    with ThreadPoolExecutor(max(1, cores)) as pool:
        results = dict(pool.map(one, kernels))
    return results, time.monotonic() - start


def evaluate(kernels: list[Any], workdir: Path, atol: float, rtol: float, timeout: float,
             progress: Any = print) -> tuple[dict[str, dict], float]:
    """One fresh process per candidate, one after another (the GPU is used by one at a time)."""
    child = _write(workdir / "kb_eval.py", KB_EVAL)
    start = time.monotonic()
    results: dict[str, dict] = {}
    for i, k in enumerate(kernels):
        d = workdir / k.candidate_id
        task = _write(d / "task.py", k.task_source)
        cand = _write(d / "cand.py", k.source)
        out = d / "eval.json"
        t0 = time.monotonic()
        try:
            subprocess.run([sys.executable, str(child), str(task), str(cand), str(d / "build"),
                            str(out), str(atol), str(rtol)], timeout=timeout,
                           capture_output=True, env=_env(), start_new_session=True)
            res = json.loads(out.read_text()) if out.exists() else {"verdict": "runtime_error"}
        except subprocess.TimeoutExpired:
            res = {"verdict": "timeout"}
        res["total_s"] = time.monotonic() - t0
        results[k.candidate_id] = res
        if (i + 1) % 4 == 0 or i + 1 == len(kernels):
            progress(f"[kb eval] {i + 1}/{len(kernels)} at {time.monotonic() - start:.0f}s")
    return results, time.monotonic() - start
