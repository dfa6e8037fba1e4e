"""Verifier throughput on real-style CUDA kernels vs a KernelBench-style harness, in one call.

    python -m benchmarks.verify_gpu --out DIR [--limit N] [--gpus 2] [--kb-limit 16]
        [--compile-workers N] [--run-timeout 15] [--no-kb-same] [--cold-scaling]

Corpus: benchmarks/kernel_corpus.py (159 kernels: the 48 CUDA conformance cases, the 41
hand-written benchmark candidates, 70 generated in KernelBench's one-shot load_inline form,
with wrong, non-compiling, crashing and cheating ones). Phases, each printing progress:
1. ours cold: `verifier.api.verify_batch` on the whole corpus as one streaming batch, empty
   build and baseline caches, one GPU (with --pch-warm N: the build cache holds only the
   precompiled torch headers that a compile-only batch of N other-order kernels made first, as
   on a machine that verified a batch before; that warm-up is timed apart): wall time, compiled-and-run candidates per GPU-hour,
   verdicts against the labels, and the profile of where the wall time went
   (`verifier.run.batch_stats`: compile units, baseline jobs, GPU worker busy/idle, waiting).
2. with --gpus N (N > 1): the same batch again on 1 and on N GPUs with the builds cached and
   empty baseline caches (the execution side, which more GPUs can speed up), and the speed-up;
   --cold-scaling also runs it cold on N GPUs. Verdicts must be identical across runs.
3. KernelBench-style harness (benchmarks/kb_harness.py: parallel pre-compile with load_inline
   on all cores, then one fresh process per candidate, sequentially) on a stratified subset of
   --kb-limit kernels (0: skip; -1: all), ours cold on the same subset (unless --no-kb-same),
   the throughput ratio and verdict agreement.
The table goes to DIR/table.txt after every phase (a run cut short keeps what it measured);
raw numbers to DIR/results.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.kernel_corpus import CorpusKernel, as_expected, corpus  # noqa: E402

ATOL = RTOL = 1e-3  # the same tolerance in both harnesses
T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


class GpuSampler:
    """Samples nvidia-smi utilization.gpu (all GPUs, mean) every 0.5 s in a thread."""

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
                    self.samples.append(statistics.fmean(float(v) for v in out))
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


def coarse(status: str) -> str:
    """Our status in the KernelBench harness's vocabulary."""
    return "correct" if status in ("correct_slow", "correct_fast") else status


def run_ours(kernels: list[CorpusKernel], cache: Path, args: argparse.Namespace, gpus: int,
             label: str) -> dict:
    """One streaming batch through verify_batch; statuses, timings and the profile."""
    from verifier.api import verify_batch
    from verifier.protocol import VerifyOptions, VerifyRequest

    opts = VerifyOptions(backend="cuda", gpus=gpus, compile_workers=args.compile_workers,
                         compile_batch=args.compile_batch, run_timeout_s=args.run_timeout,
                         atol_fp32=ATOL, rtol_fp32=RTOL, perf_budget_s=args.perf_budget,
                         standby_worker=not args.no_standby,
                         build_cache_dir=str(cache / "builds"),
                         baseline_cache_dir=str(cache / "baselines"))
    reqs = [VerifyRequest(k.candidate_id, k.task_id, k.task_source, k.source, "cuda")
            for k in kernels]
    done = [0]
    start = time.monotonic()

    def progress(v: object) -> None:
        done[0] += 1
        if done[0] % 10 == 0 or done[0] == len(reqs):
            log(f"[{label}] {done[0]}/{len(reqs)} verdicts at {time.monotonic() - start:.1f}s")

    timings: dict[str, dict] = {}
    stats: dict = {}
    log(f"[{label}] start: {len(reqs)} candidates, {gpus} GPU(s), "
        f"{args.compile_workers} compile workers")
    with GpuSampler() as sampler:
        verdicts = verify_batch(reqs, opts, progress=progress, timings=timings, stats=stats)
    wall = time.monotonic() - start
    ran = sum(1 for v in verdicts if "exec_s" in timings.get(v.candidate_id, {}))
    log(f"[{label}] done in {wall:.1f}s; {ran} compiled and ran")
    return {"label": label, "gpus": gpus, "wall_s": wall, "ran": ran, "n": len(reqs),
            "status": {v.candidate_id: v.status for v in verdicts},
            "error": {v.candidate_id: v.error[:200] for v in verdicts},
            "timings": timings, "stats": stats, "nvsmi_util_mean": sampler.mean}


def warm_pch(kernels: list[CorpusKernel], cache: Path, args: argparse.Namespace) -> float:
    """Build the PCHs with a compile-only batch of `args.pch_warm` kernels into `cache`, then
    remove every built object but them; seconds taken."""
    from verifier.api import verify_batch
    from verifier.protocol import VerifyOptions, VerifyRequest

    sub = kb_subset(kernels, args.pch_warm)
    opts = VerifyOptions(backend="cuda", compile_only=True, compile_workers=args.compile_workers,
                         compile_batch=args.compile_batch, build_cache_dir=str(cache / "builds"),
                         baseline_cache_dir=str(cache / "baselines"))
    start = time.monotonic()
    verify_batch([VerifyRequest(k.candidate_id, k.task_id, k.task_source, k.source, "cuda")
                  for k in sub], opts)
    took = time.monotonic() - start
    kept = []
    for root in (cache / "builds").iterdir():  # one per toolchain: index/, builds/, pch/
        for entry in root.iterdir():
            if entry.name == "pch":
                kept += [p.name for p in entry.iterdir()]
            elif entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    log(f"[pch] warm-up of {len(sub)} kernels in {took:.1f}s; PCHs kept: {kept}")
    if not kept:
        raise SystemExit("the warm-up built no PCH: nothing to keep")
    return took


def ours_lines(run: dict, kernels: list[CorpusKernel]) -> list[str]:
    from verifier.run.batch_stats import profile_table

    n, wall, gpus, ran = run["n"], run["wall_s"], run["gpus"], run["ran"]
    right = [k for k in kernels if as_expected(run["status"][k.candidate_id], k.expected)]
    util = run["nvsmi_util_mean"]
    lines = [f"== {run['label']} ==",
             f"{n} candidates in {wall:.1f}s on {gpus} GPU(s): {ran} compiled and ran = "
             f"{ran / (wall * gpus) * 3600:.0f} compiled-and-run per GPU-hour "
             f"({n / (wall * gpus) * 3600:.0f} candidates per GPU-hour); nvidia-smi util mean "
             + (f"{util:.0f}%" if util is not None else "-"),
             f"verdicts as labelled: {len(right)}/{n}; statuses: "
             + ", ".join(f"{s} {c}" for s, c in sorted(collections.Counter(
                 run["status"].values()).items()))]
    for k in kernels:
        st = run["status"][k.candidate_id]
        if not as_expected(st, k.expected):
            lines.append(f"  unexpected: {k.candidate_id} ({k.origin}) expected {k.expected}, "
                         f"got {st}: {run['error'][k.candidate_id][:120]}")
    comp = sorted(t["compile_s"] for t in run["timings"].values() if t.get("compile_s"))
    if comp:
        lines.append(f"compile per candidate (its share of its unit): median "
                     f"{statistics.median(comp):.2f}s, max {comp[-1]:.2f}s")
    lines += ["profile (seconds from the batch's start; covered = wall time the phase's spans "
              "cover, overlaps counted once):", profile_table(run["stats"]), ""]
    return lines


def same_verdicts(a: dict, b: dict) -> tuple[int, list[str]]:
    """Candidates whose verdicts agree (correct_fast/slow: timing noise, counted as one)."""
    diff = [c for c in a["status"] if coarse(a["status"][c]) != coarse(b["status"][c])]
    return len(a["status"]) - len(diff), diff


def gpu_span(run: dict) -> float:
    """Seconds from the first baseline/candidate job to the last one's end."""
    ph = run["stats"].get("phases", {})
    spans = [ph[p] for p in ("exec", "baseline") if p in ph]
    if not spans:
        return 0.0
    return max(p["last_s"] for p in spans) - min(p["first_s"] for p in spans)


def kb_subset(kernels: list[CorpusKernel], limit: int) -> list[CorpusKernel]:
    """Every k-th kernel (the corpus mix), hangs left out: both harnesses would only wait."""
    pool = [k for k in kernels if k.expected != "timeout"]
    if limit < 0 or limit >= len(pool):
        return pool
    step = len(pool) / limit
    return [pool[int(i * step)] for i in range(limit)]


def kb_lines(sub: list[CorpusKernel], kb: dict, comp: dict, kb_wall: tuple[float, float],
             ours_full: dict, ours_sub: dict | None) -> list[str]:
    pre_wall, eval_wall = kb_wall
    total = pre_wall + eval_wall
    n = len(sub)
    full_rate = ours_full["n"] / ours_full["wall_s"]
    kb_rate = n / total
    lines = ["== KernelBench-style harness (parallel load_inline pre-compile on all cores, then "
             "one fresh process per candidate, sequential) ==",
             f"{n} candidates: pre-compile {pre_wall:.1f}s + eval {eval_wall:.1f}s = "
             f"{total:.1f}s = {kb_rate * 3600:.0f} candidates per GPU-hour",
             f"throughput ratio, ours (whole corpus, one batch) / KB-style: "
             f"{full_rate / kb_rate:.1f}x"]
    if ours_sub is not None:
        lines.append(f"same {n} candidates, ours cold: {ours_sub['wall_s']:.1f}s vs KB-style "
                     f"{total:.1f}s = {total / ours_sub['wall_s']:.1f}x")
    agree, compared, diffs = 0, 0, []
    for k in sub:
        if k.expected in ("cheat", "static_reject"):
            continue  # the KB-style harness has no anti-cheat checks: nothing to compare
        kv = kb[k.candidate_id].get("verdict", "runtime_error")
        ov = coarse(ours_full["status"][k.candidate_id])
        compared += 1
        agree += kv == ov
        if kv != ov:
            diffs.append(f"  differs: {k.candidate_id}: ours {ov}, KB-style {kv}: "
                         f"{kb[k.candidate_id].get('error', '')[:100]}")
    lines.append(f"verdict agreement with KB-style (non-cheat labels): {agree}/{compared}")
    loads = sorted(r.get("compile_s", 0.0) for r in comp.values())
    if loads:
        lines.append(f"KB-style load_inline compile per candidate: median "
                     f"{statistics.median(loads):.1f}s, max {loads[-1]:.1f}s")
    return lines + diffs + [""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench_out")
    ap.add_argument("--limit", type=int, default=0, help="use only N kernels (smoke run)")
    ap.add_argument("--gpus", type=int, default=1, help="N > 1: also run on 1 vs N GPUs")
    ap.add_argument("--cold-scaling", action="store_true",
                    help="with --gpus N: also run cold on N GPUs (fresh build cache)")
    ap.add_argument("--compile-workers", type=int, default=os.cpu_count() or 8)
    ap.add_argument("--compile-batch", type=int, default=16)
    ap.add_argument("--run-timeout", type=float, default=15.0)
    ap.add_argument("--perf-budget", type=float, default=3.0)
    ap.add_argument("--no-standby", action="store_true",
                    help="no warm standby GPU worker (A/B of the replacement after a crash)")
    ap.add_argument("--kb-limit", type=int, default=16,
                    help="KernelBench-style harness on this many kernels (0: skip, -1: all)")
    ap.add_argument("--no-kb-same", action="store_true",
                    help="skip our own cold run on the KB-style subset")
    ap.add_argument("--kb-timeout", type=float, default=300.0)
    ap.add_argument("--pch-warm", type=int, default=0,
                    help="N > 0: build the PCHs with a compile-only batch of N kernels first and "
                         "keep only them in the build cache of 'ours cold'")
    ap.add_argument("--ours-from", default="",
                    help="results.json of an earlier call: take 'ours cold' from it (run the "
                         "KB-style phase as a separate call)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kernels = corpus()
    if args.limit:
        kernels = kernels[:: max(1, len(kernels) // args.limit)][: args.limit]
    import torch

    n_gpu = torch.cuda.device_count()
    head = [f"device: {torch.cuda.get_device_name(0) if n_gpu else 'none'} x{n_gpu}  torch "
            f"{torch.__version__}  cpus {os.cpu_count()}  compile workers "
            f"{args.compile_workers}",
            f"corpus: {len(kernels)} kernels over {len({k.task_id for k in kernels})} tasks; "
            + ", ".join(f"{o} {c}" for o, c in collections.Counter(
                k.origin for k in kernels).items()) + "; labels "
            + ", ".join(f"{e} {c}" for e, c in sorted(collections.Counter(
                k.expected for k in kernels).items())), ""]
    sections: list[str] = list(head)
    report: dict = {"corpus": len(kernels), "args": vars(args)}

    def save() -> None:
        (out / "table.txt").write_text("\n".join(sections) + "\n", encoding="utf-8")
        (out / "results.json").write_text(json.dumps(report, indent=1, default=str),
                                          encoding="utf-8")

    log(head[0])
    log(head[1])
    save()
    root = Path(tempfile.mkdtemp(prefix="ks-verify-gpu-"))
    if args.ours_from:
        cold = json.loads(Path(args.ours_from).read_text(encoding="utf-8"))["ours_cold_1"]
        kernels = [k for k in kernels if k.candidate_id in cold["status"]]
        log(f"ours cold from {args.ours_from}: {cold['n']} candidates in {cold['wall_s']:.1f}s")
    else:
        label = "ours cold, 1 GPU"
        if args.pch_warm:
            report["pch_warm_s"] = warm_pch(kernels, root / "cold1", args)
            label = "ours cold candidates, PCH warm, 1 GPU"
            sections.append(f"PCH warm-up (compile-only batch of {args.pch_warm} kernels, only "
                            f"the PCHs kept): {report['pch_warm_s']:.1f}s, not counted below")
        cold = run_ours(kernels, root / "cold1", args, 1, label)
    report["ours_cold_1"] = cold
    sections += ours_lines(cold, kernels)
    save()
    if args.gpus > 1 and not args.ours_from:
        runs = {}
        for g in (1, args.gpus):  # builds cached by the cold run; baselines measured afresh
            cache = root / f"warm{g}"
            cache.mkdir()
            (cache / "builds").symlink_to(root / "cold1" / "builds")
            runs[g] = run_ours(kernels, cache, args, g, f"ours builds cached, {g} GPU(s)")
            report[f"ours_warm_{g}"] = runs[g]
            sections += ours_lines(runs[g], kernels)
            save()
        a, b = runs[1], runs[args.gpus]
        ea, eb = gpu_span(a), gpu_span(b)
        ok, diff = same_verdicts(a, b)
        ok_cold, diff_cold = same_verdicts(cold, b)
        sections += [f"== 1 -> {args.gpus} GPUs ==",
                     f"builds cached: {a['wall_s']:.1f}s -> {b['wall_s']:.1f}s = "
                     f"{a['wall_s'] / b['wall_s']:.2f}x speed-up",
                     f"GPU phase (first job on a warm worker to last job end): {ea:.1f}s -> "
                     f"{eb:.1f}s = {ea / eb if eb else 0:.2f}x speed-up (the rest of the wall: "
                     "GPU worker start-up, ~10 s, paid once per batch)",
                     f"verdicts identical 1 vs {args.gpus} GPUs: {ok}/{a['n']} "
                     + (f"(differ: {', '.join(diff[:8])})" if diff else ""),
                     f"verdicts identical cold vs cached {args.gpus} GPUs: {ok_cold}/{a['n']} "
                     + (f"(differ: {', '.join(diff_cold[:8])})" if diff_cold else "")]
        if args.cold_scaling:
            c2 = run_ours(kernels, root / f"cold{args.gpus}", args, args.gpus,
                          f"ours cold, {args.gpus} GPUs")
            report[f"ours_cold_{args.gpus}"] = c2
            sections += ours_lines(c2, kernels)
            sections.append(f"cold: {cold['wall_s']:.1f}s -> {c2['wall_s']:.1f}s = "
                            f"{cold['wall_s'] / c2['wall_s']:.2f}x speed-up")
        sections.append("")
        save()
    if args.kb_limit:
        from benchmarks import kb_harness

        sub = kb_subset(kernels, args.kb_limit)
        ours_sub = None
        if not args.no_kb_same:
            ours_sub = run_ours(sub, root / "kbsame", args, 1, "ours cold, KB-style subset")
            report["ours_kb_subset"] = ours_sub
            save()
        kb_dir = root / "kb"
        log(f"[kb] pre-compile {len(sub)} candidates on {args.compile_workers} cores")
        comp, pre_wall = kb_harness.precompile(sub, kb_dir, args.compile_workers,
                                               args.kb_timeout, log)
        log(f"[kb] pre-compile done in {pre_wall:.1f}s; sequential eval")
        kb, eval_wall = kb_harness.evaluate(sub, kb_dir, ATOL, RTOL, args.kb_timeout, log)
        report["kb"] = {"precompile_s": pre_wall, "eval_s": eval_wall, "compile": comp,
                        "eval": kb, "ids": [k.candidate_id for k in sub]}
        sections += kb_lines(sub, kb, comp, (pre_wall, eval_wall), cold, ours_sub)
        save()
    shutil.rmtree(root, ignore_errors=True)
    print("\n".join(sections), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
