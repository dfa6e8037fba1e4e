"""GPU verifier throughput vs a KernelBench-style harness, on the same candidates, in one run.

    PYTHONPATH=. python3 benchmarks/verify_gpu.py --out DIR [--baseline-limit 4]
        [--baseline-parallel 0] [--compile-workers 16]

Ours (`verifier.api.verify_batch`, backend cuda): a compile pool (all cores; many candidates per
translation unit, PCH for host units, light torch header for device units, content-hash cache)
feeding a persistent execution worker per GPU (correctness with a dispatcher trace, profiler
anti-cheat, event timing with L2 flush and fresh inputs, eager baselines cached per task).
Baseline (KernelBench style): for each candidate, sequentially, a fresh process does
`load_inline` (cold, torch defaults) and runs 5 correctness trials and 100 timed calls.
Prints a table; writes results.json and table.txt under --out.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gpu_candidates import TASKS, all_candidates  # noqa: E402
from verifier.protocol import CORRECT_STATUSES  # noqa: E402

ATOL = RTOL = 1e-3  # the same tolerance for both harnesses

KB_CHILD = r'''
import json, sys, time, torch, types
t0 = time.monotonic()
task_src, cand_src, build_dir, out_path, atol, rtol = sys.argv[1:7]
atol, rtol = float(atol), float(rtol)
res = {}
def done(**kw):
    res.update(kw); res["wall_s"] = time.monotonic() - t0
    open(out_path, "w").write(json.dumps(res)); sys.exit(0)
import os
os.environ["TORCH_EXTENSIONS_DIR"] = build_dir
task = {}; exec(compile(open(task_src).read(), "task", "exec"), task)
cand = {}
try:
    exec(compile(open(cand_src).read(), "cand", "exec"), cand)
except Exception as e:
    done(verdict="compile_error", error=str(e)[-500:], compile_s=time.monotonic() - t0)
compile_s = time.monotonic() - t0
res["compile_s"] = compile_s
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
            if o.shape != r.shape or not torch.allclose(o, r, atol=atol, rtol=rtol):
                done(verdict="incorrect", run_s=time.monotonic() - t0 - compile_s)
        times = []
        for _ in range(3): new(*inputs)
        torch.cuda.synchronize()
        for _ in range(100):
            s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
            s.record(); new(*inputs); e.record(); torch.cuda.synchronize()
            times.append(s.elapsed_time(e) * 1000)
        rt = []
        for _ in range(100):
            s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
            s.record(); ref(*inputs); e.record(); torch.cuda.synchronize()
            rt.append(s.elapsed_time(e) * 1000)
    m = sum(times) / len(times); mr = sum(rt) / len(rt)
    done(verdict="correct", runtime_us=m, eager_us=mr, speedup=mr / m,
         run_s=time.monotonic() - t0 - compile_s)
except Exception as e:
    done(verdict="runtime_error", error=str(e)[-500:], run_s=time.monotonic() - t0 - compile_s)
'''


def coarse(status: str) -> str:
    """Map a verdict status to the baseline's vocabulary (correct_fast/slow -> correct)."""
    if status in CORRECT_STATUSES:
        return "correct"
    return status


def as_expected(status: str, expected: str) -> bool:
    """A hack labelled `cheat` is caught whether the static or the dynamic stage caught it."""
    if expected == "cheat":
        return status in ("cheat", "static_reject")
    return coarse(status) == expected


class GpuSampler:
    """Samples nvidia-smi utilization.gpu every 0.5 s in a thread."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu",
                                      "--format=csv,noheader,nounits"], capture_output=True,
                                     text=True, timeout=5).stdout.split()
                if out:
                    self.samples.append(float(out[0]))
            except (OSError, ValueError, subprocess.TimeoutExpired):
                return
            self._stop.wait(0.5)

    def __enter__(self) -> GpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.samples) if self.samples else None


def run_ours(cands: list, cache: Path, args: argparse.Namespace, repeat: int = 1,
             run_timeout: float = 30.0, torch_compile: bool = False
             ) -> tuple[list[dict], dict, float | None]:
    from verifier.api import verify_batch
    from verifier.protocol import VerifyOptions, VerifyRequest

    opts = VerifyOptions(backend="cuda", compile_workers=args.compile_workers,
                         compile_batch=args.compile_batch, run_timeout_s=run_timeout,
                         torch_compile_baseline=torch_compile, repeat_timing=repeat,
                         atol_fp32=ATOL, rtol_fp32=RTOL, perf_budget_s=3.0,
                         build_cache_dir=str(cache / "builds"),
                         baseline_cache_dir=str(cache / "baselines"))
    reqs = [VerifyRequest(c.candidate_id, c.task, TASKS[c.task], c.source, "cuda")
            for c in cands]
    timings: dict[str, dict] = {}
    t0 = time.monotonic()
    with GpuSampler() as sampler:
        verdicts = verify_batch(reqs, opts, timings=timings)
    wall = time.monotonic() - t0
    results = [{**v.to_dict(), **timings.get(v.candidate_id, {})} for v in verdicts]
    stats = {"wall_s": wall, "gpu_busy_s": sum(r.get("exec_s", 0.0) for r in results)}
    return results, stats, sampler.mean


def run_baseline(cands: list, workdir: Path, timeout: float, parallel: int = 1
                 ) -> tuple[list[dict], float, float | None]:
    """KernelBench-style: one fresh process per candidate; `parallel` > 1 only for verdicts."""
    workdir.mkdir(parents=True, exist_ok=True)
    child = workdir / "kb_child.py"
    child.write_text(KB_CHILD, encoding="utf-8")
    start = time.monotonic()

    def one(c) -> dict:
        tdir = workdir / c.candidate_id
        tdir.mkdir(exist_ok=True)
        (tdir / "task.py").write_text(TASKS[c.task], encoding="utf-8")
        (tdir / "cand.py").write_text(c.source, encoding="utf-8")
        out = tdir / "result.json"
        t0 = time.monotonic()
        env = dict(os.environ)
        env.pop("TORCH_CUDA_ARCH_LIST", None)  # torch's default: the visible GPU's arch
        try:
            subprocess.run([sys.executable, str(child), str(tdir / "task.py"),
                            str(tdir / "cand.py"), str(tdir / "build"), str(out),
                            str(ATOL), str(RTOL)], timeout=timeout, capture_output=True,
                           env=env, start_new_session=True)
            res = json.loads(out.read_text()) if out.exists() else {"verdict": "runtime_error"}
        except subprocess.TimeoutExpired:
            res = {"verdict": "timeout"}
        res["candidate_id"] = c.candidate_id
        res["total_s"] = time.monotonic() - t0
        return res

    with GpuSampler() as sampler:
        if parallel <= 1:
            results = [one(c) for c in cands]
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(parallel) as pool:
                results = list(pool.map(one, cands))
    return results, time.monotonic() - start, sampler.mean


def save(out: Path, report: dict) -> None:
    """Write what is known so far (a run cut short still leaves its numbers)."""
    (out / "results.json").write_text(json.dumps(report, indent=1, default=str),
                                      encoding="utf-8")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="bench_out")
    ap.add_argument("--cache", default=None)
    ap.add_argument("--compile-workers", type=int, default=os.cpu_count() or 8)
    ap.add_argument("--baseline-limit", type=int, default=4)
    ap.add_argument("--baseline-timeout", type=float, default=240.0)
    ap.add_argument("--baseline-verdicts", type=int, default=0,
                    help="run the baseline on this many more candidates, in parallel (verdicts)")
    ap.add_argument("--baseline-parallel", type=int, default=8)
    ap.add_argument("--torch-compile", action="store_true")
    ap.add_argument("--compile-batch", type=int, default=16)
    ap.add_argument("--run-timeout", type=float, default=15.0)
    ap.add_argument("--baseline-ids", default="")
    ap.add_argument("--cv-ids", default="relu_plain256,relu_plain512,relu_plain1024,relu_stride,"
                    "add_plain256,add_plain128,add_stride,softmax_block256,softmax_block512,"
                    "softmax_block128,softmax_warp,ln_block256,ln_block512,mm_tiled16,"
                    "mm_naive16,mm_tiled32")
    ap.add_argument("--only", default="", help="comma-separated candidate ids")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(args.cache or tempfile.mkdtemp(prefix="ks-gpu-cache-"))
    cands = all_candidates()
    if args.only:
        keep = set(args.only.split(","))
        cands = [c for c in cands if c.candidate_id in keep]
    report: dict = {"n_candidates": len(cands)}
    import torch

    report["device"] = torch.cuda.get_device_name(0)
    report["torch"] = torch.__version__
    report["cpus"] = os.cpu_count()
    report["gpus"] = torch.cuda.device_count()  # one execution worker each

    # 1. Ours, cold cache.
    t0 = time.monotonic()
    ours, stats, util = run_ours(cands, cache, args, run_timeout=args.run_timeout)
    ours_wall = time.monotonic() - t0
    report["ours_cold"] = {"wall_s": ours_wall, "stats": stats, "nvsmi_util_mean": util,
                           "results": ours}
    save(out, report)
    print(f"[ours cold] {len(cands)} candidates in {ours_wall:.1f}s", flush=True)
    # 2. Ours, warm (cached builds and baselines), with 5 repeated timings for the CV.
    cv_ids = set(args.cv_ids.split(","))
    warm_cands = [c for c in cands if c.candidate_id in cv_ids]
    t0 = time.monotonic()
    warm, wstats, _ = run_ours(warm_cands, cache, args, repeat=5, run_timeout=120.0,
                               torch_compile=args.torch_compile)
    report["ours_warm"] = {"wall_s": time.monotonic() - t0, "stats": wstats, "results": warm}
    save(out, report)
    print(f"[ours warm] {len(warm_cands)} candidates in {time.monotonic() - t0:.1f}s", flush=True)
    # 3. Baseline, sequential (throughput) on the first N; optional parallel pass for verdicts.
    order = sorted(cands, key=lambda c: (c.kind != "correct", c.candidate_id))
    seq = order[: args.baseline_limit]
    kb_dir = Path(tempfile.mkdtemp(prefix="ks-kb-"))
    base, base_wall, base_util = (run_baseline(seq, kb_dir, args.baseline_timeout) if seq
                                  else ([], 0.0, None))
    report["baseline_seq"] = {"wall_s": base_wall, "results": base, "nvsmi_util_mean": base_util}
    save(out, report)
    print(f"[baseline seq] {len(seq)} candidates in {base_wall:.1f}s", flush=True)
    if args.baseline_ids:
        want = args.baseline_ids.split(",")
        order = sorted(cands, key=lambda c: want.index(c.candidate_id)
                       if c.candidate_id in want else len(want))
    buggy = [c for c in order[args.baseline_limit:] if c.kind != "hack"]
    buggy.sort(key=lambda c: c.expected == "timeout")  # a hang costs the whole timeout: last
    more = buggy[: args.baseline_verdicts]
    if more:
        extra, ewall, _ = run_baseline(more, kb_dir, args.baseline_timeout,
                                       parallel=args.baseline_parallel)
        report["baseline_par"] = {"wall_s": ewall, "results": extra}
        save(out, report)
        base = base + extra
    table = make_table(cands, ours, warm, base, report)
    (out / "table.txt").write_text(table, encoding="utf-8")
    (out / "results.json").write_text(json.dumps(report, indent=1, default=str),
                                      encoding="utf-8")
    print(table)
    return 0


def make_table(cands: list, ours: list[dict], warm: list[dict], base: list[dict],
               report: dict) -> str:
    lines: list[str] = []
    by_id = {r["candidate_id"]: r for r in ours}
    base_by = {r["candidate_id"]: r for r in base}
    lines.append(f"device: {report['device']}  torch {report['torch']}  cpus {report['cpus']}")
    lines.append(f"{'candidate':26} {'kind':7} {'expected':13} {'ours':13} {'baseline':13} "
                 f"{'compile_s':>9} {'gpu_s':>6} {'us':>9} {'speedup':>7}")
    right = 0
    for c in cands:
        r = by_id[c.candidate_id]
        b = base_by.get(c.candidate_id, {})
        ok = as_expected(r["status"], c.expected)
        right += ok
        us = r.get("runtime_us")
        sp = f"{r['speedup']:.2f}" if r.get("speedup") else "-"
        lines.append(f"{c.candidate_id:26} {c.kind:7} {c.expected:13} {r['status']:13} "
                     f"{b.get('verdict', '-'):13} {r.get('compile_s', 0):9.1f} "
                     f"{r.get('exec_s', 0):6.1f} {(f'{us:.1f}' if us else '-'):>9} "
                     f"{sp:>7}"
                     + ("" if ok else "   <-- unexpected"))
    cold = report["ours_cold"]
    n = len(cands)
    wall = cold["wall_s"]
    busy = cold["stats"]["gpu_busy_s"] / max(1, int(report.get("gpus") or 1))
    comp = [r["compile_s"] for r in ours if r.get("compile_s")]
    warm_comp = [r.get("compile_s", 0.0) for r in warm]
    lines.append("")
    lines.append(f"ours: verdicts as expected {right}/{n}")
    per_device = collections.Counter(r.get("worker_device") for r in ours if r.get("worker_device"))
    lines.append(f"ours: {len(per_device)} GPU worker device(s): "
                 + ", ".join(f"{d} ran {k}" for d, k in sorted(per_device.items())))
    gpus = max(1, int(report.get("gpus") or 1))
    lines.append(f"ours cold: {n} candidates in {wall:.1f}s on {gpus} GPU(s) = "
                 f"{n / (wall * gpus) * 3600:.0f} per GPU-hour; "
                 f"GPU worker busy {busy / wall:.0%} of wall; nvidia-smi util mean "
                 f"{cold['nvsmi_util_mean'] or 0:.0f}%")
    if comp:
        lines.append(f"ours compile per candidate (cold, its share of a batch build): median "
                     f"{statistics.median(comp):.2f}s, max {max(comp):.2f}s, total "
                     f"{sum(comp):.1f}s")
    if warm_comp:
        lines.append(f"ours compile per candidate (warm cache): median "
                     f"{statistics.median(warm_comp):.3f}s")
    over = []
    for r in warm:
        meds = r.get("repeat_medians_us")
        if not meds:
            continue
        med = statistics.median(meds)
        if med >= 100.0:
            over.append(r["repeat_cv"])
        lines.append(f"timing CV over 5 repeats: {r['candidate_id']:20} median {med:9.1f} us  "
                     f"CV {r['repeat_cv']:6.2%}  [{' '.join(f'{m:.1f}' for m in meds)}]  "
                     f"host {r.get('host_us') or 0:.0f} us, spin {r.get('spin_us') or 0:.0f} us, "
                     f"discarded {r.get('discarded_trials') or 0}, "
                     f"SM clock {r.get('clock_mhz') or 0:.0f} MHz")
    if over:
        lines.append(f"kernels over 100 us: {len(over)}, CV max {max(over):.2%}, "
                     f"median {statistics.median(over):.2%}, under 2%: "
                     f"{sum(cv < 0.02 for cv in over)}/{len(over)}")
    seq = report["baseline_seq"]
    nb = len(seq["results"])
    if nb:
        per = seq["wall_s"] / nb
        bc = [r.get("compile_s", 0) for r in seq["results"]]
        lines.append(f"baseline (KernelBench-style, sequential): {nb} candidates in "
                     f"{seq['wall_s']:.1f}s = {3600 / per:.0f} per GPU-hour; load_inline cold "
                     f"median {statistics.median(bc):.1f}s; nvidia-smi util mean "
                     f"{seq['nvsmi_util_mean'] or 0:.0f}%")
        ours_rate = n / (wall * gpus) * 3600
        lines.append(f"throughput ratio ours/baseline: {ours_rate / (3600 / per):.1f}x")
    same = diff = 0
    for c in cands:
        b = base_by.get(c.candidate_id)
        if b is None or c.kind == "hack":
            continue
        if coarse(by_id[c.candidate_id]["status"]) == b.get("verdict"):
            same += 1
        else:
            diff += 1
            lines.append(f"verdict differs: {c.candidate_id}: ours "
                         f"{by_id[c.candidate_id]['status']} vs baseline {b.get('verdict')}")
    lines.append(f"non-hack verdicts identical to baseline: {same}/{same + diff}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
