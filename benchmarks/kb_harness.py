"""A KernelBench-style evaluation harness in its best configuration, for benchmarks/verify_gpu.py.

As KernelBench's scripts do it: first every candidate is compiled in parallel on all cores
(`build_compile_cache`: each candidate's module is executed with TORCH_EXTENSIONS_DIR set to its
own build directory, so `torch.utils.cpp_extension.load_inline` builds and caches it; one
process per candidate, `cores` at a time, ninja's own job count as main leaves it), then
candidates are evaluated one after another, each in a fresh Python process (`load_inline` finds its cached build). Each evaluation
follows KernelBench main's `eval_kernel_against_ref` (scripts/eval_from_generations.py with
build_cache on, src/kernelbench/eval.py and timing.py at 423217d; written here, not copied): the
candidate runs in the reference's namespace, both models are built under seed 42, 5 correctness
trials with seeds drawn from seed 42 compare shape and torch.allclose at the tolerance main
uses for fp32 (atol = rtol = 1e-4), then 100 timed calls with CUDA events (3 warm-up calls, the
first trial dropped, 256 MB written to thrash L2 before each), and the same for the reference
(main's excessive-speedup check). torch + stdlib only.
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
os.environ["TORCH_USE_CUDA_DSA"] = "1"
import torch
res = {}
def done(**kw):
    res.update(kw); res["wall_s"] = time.monotonic() - t0
    open(out_path, "w").write(json.dumps(res)); sys.exit(0)
def seed(n):
    torch.manual_seed(n); torch.cuda.manual_seed(n)
dev = torch.device("cuda:0")
# one namespace: the reference's module globals, then the candidate's (KernelBench's context)
ctx = {"__name__": "kb_eval"}
exec(compile(open(task_src).read(), "task", "exec"), ctx)
Model, get_inputs = ctx["Model"], ctx["get_inputs"]
seed(42)
init = [x.to(dtype=torch.float32).to(dev) if isinstance(x, torch.Tensor) else x
        for x in ctx["get_init_inputs"]()]
with torch.no_grad():
    seed(42); ref = Model(*init)
try:
    exec(compile(open(cand_src).read(), "cand", "exec"), ctx)
    torch.cuda.synchronize(dev)
except Exception as e:
    done(verdict="compile_error", error=str(e)[-500:])
res["load_s"] = time.monotonic() - t0
if ctx.get("ModelNew") is None:
    done(verdict="compile_error", error="no ModelNew")
try:
    with torch.no_grad():
        seed(42); new = ctx["ModelNew"](*init)
        ref = ref.to(device=dev, dtype=torch.float32); new = new.to(device=dev, dtype=torch.float32)
        torch.cuda.synchronize(dev)
except RuntimeError as e:
    done(verdict="runtime_error", error=str(e)[-500:])
def prep(xs):
    return [x.to(dtype=torch.float32).to(dev) if isinstance(x, torch.Tensor) else x for x in xs]
try:
    torch.manual_seed(42)
    trial_seeds = [torch.randint(0, 2**32 - 1, (1,)).item() for _ in range(5)]
    with torch.no_grad():
        for s in trial_seeds:
            seed(s); inputs = prep(get_inputs())
            r = ref(*inputs); torch.cuda.synchronize(dev)
            o = new(*inputs); torch.cuda.synchronize(dev)
            if (not isinstance(o, torch.Tensor) or o.shape != r.shape
                    or not torch.allclose(r, o, atol=atol, rtol=rtol)):
                done(verdict="incorrect")
            del r, o, inputs
except Exception as e:
    done(verdict="runtime_error", error=str(e)[-500:])
def timed(fn, inputs):
    # cuda events around each call, 3 warm-up calls, the first of 101 trials dropped, L2
    # thrashed (256 MB written) before every trial: KernelBench main's cuda_event timing
    for _ in range(3):
        fn(*inputs); torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    times = []
    for t in range(101):
        torch.cuda.synchronize(dev)
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        dummy = torch.empty((32, 1024, 1024), dtype=torch.int64, device=dev); dummy.fill_(42)
        del dummy
        s.record(); fn(*inputs); e.record(); torch.cuda.synchronize(dev)
        if t:
            times.append(s.elapsed_time(e) * 1000)
    return sum(times) / len(times)
try:
    with torch.no_grad():
        seed(42); inputs = prep(get_inputs())
        m = timed(new, inputs)
        seed(42); inputs = prep(get_inputs())
        mr = timed(ref, inputs)
    done(verdict="correct", runtime_us=m, eager_us=mr, speedup=mr / m)
except Exception as e:
    done(verdict="correct", error_during_performance=str(e)[-300:])
'''


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TORCH_CUDA_ARCH_LIST", None)  # torch's default: the visible GPU's arch
    env.pop("MAX_JOBS", None)  # main's batch_compile leaves ninja its default job count
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
