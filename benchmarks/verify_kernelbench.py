"""The verifier on KernelBench's own problem files at their own sizes, vs KernelBench's harness.

    python -m benchmarks.verify_kernelbench --kb-dir KernelBench/ --out DIR
        [--levels 1,2,3] [--limit N] [--budget-s 510] [--kb-limit CORES] [--repeat]
        [--gpus 2] [--cores-per-gpu 16] [--run-timeout 30] [--verifier-args "--fallback partial"]
        [--device-tag h100]
    python -m benchmarks.verify_kernelbench --merge DIR1 DIR2 [--device-tag h100]

Needs a GPU node with torch only (no pyarrow, numpy or network): KernelBench's problem folder
(level1/, level2/, level3/ of its main branch) is read from --kb-dir; the candidates are ours
(benchmarks/kernelbench_corpus, labelled correct / wrong / crashing / hanging / fallback).
Phases, each written out as it ends (DIR/results.json and
benchmarks/results/verify_kernelbench_<device>.md), so a run cut at its wall limit keeps them:
0. problem sizes: bytes of every input and output tensor at main's sizes (meta tensors).
1. ours cold: `python -m verifier --batch` on every candidate in one batch on 1 GPU with a fresh
   build cache, verdicts streaming to DIR/ours1.jsonl; stopped at its share of the budget (the
   streamed verdicts stand). Compiled-and-run per GPU-hour, statuses, verdicts against labels,
   memory deaths (runtime_error naming SIGKILL, OOM or memory).
2. KernelBench's harness in its best configuration (benchmarks/kb_harness.py: every candidate
   pre-compiled in parallel on all cores, then one fresh process per candidate; 5 correctness
   trials at main's fp32 atol = rtol = 1e-4, 100 timed calls, the reference timed too) on an
   every-k-th subset without hangs (one per core by default), until its share of the budget;
   candidates per GPU-hour and the ratio, verdict agreement.
3. with --repeat: the same batch again (builds cached): verdict agreement across two runs.
4. with --gpus N: the batch cold on N GPUs: speed-up (decided per second) and agreement.
Shares: phase 1 gets --ours-share of the budget; 2 gets what is left (half of it when 3 or 4
follow); 3 and 4 run only while more than 30 s are left. For 1 vs 2 GPUs in one call, use
--kb-limit 0 --gpus 2 --ours-share 0.45 --cores-per-gpu 16 (each run holds 16 cores per GPU, as
a node's GPUs come with their share of its CPUs). Every batch runs with `--profile`: the table
says where its wall time went. One table from several calls (no GPU needed):
`--merge DIR1 DIR2 --device-tag h100`: DIR1's cold run, KernelBench ratio and DIR2's cold run
as the second run (agreement, timing noise), DIR2's 1 vs 2 GPUs. Pass verifier flags as
--verifier-args="--fallback partial" (with `=`, since the value starts with dashes).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.kb_table import agreement, coarse, markdown, merge, timing_noise  # noqa: E402
from benchmarks.kernelbench_corpus import KbCandidate, candidates  # noqa: E402
from benchmarks.kernelbench_corpus.__main__ import batch_rows  # noqa: E402
from verifier.reward.batch_io import parse_progress, profile_text  # noqa: E402

RAN = ("runtime_error", "timeout", "incorrect", "cheat", "correct_slow", "correct_fast")
# the verifier's or the device's memory, never a kernel's own illegal memory access
MEMORY = re.compile(r"SIGKILL|out of memory|\bOOM\b|MemoryError|cannot allocate memory|"
                    r"memory (?:bound|limit)", re.I)
KB_TOL = 1e-4  # KernelBench main's fp32 tolerance (eval.get_tolerance_for_precision)
T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


def device_tag(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100': the file name part of the results table."""
    m = re.search(r"\b([A-Z]\d{2,4}[A-Z]?)\b", name)
    return (m.group(1) if m else re.sub(r"\W+", "_", name)).lower() or "cpu"


def problem_sizes(kb_dir: Path, problems: list[str]) -> dict[str, dict[str, Any]]:
    """Bytes of each input and output tensor of each problem at its file's sizes (meta device)."""
    import torch

    out: dict[str, dict[str, Any]] = {}
    for name in problems:
        ns: dict[str, Any] = {"__name__": "kb_problem"}
        try:
            with torch.device("meta"):
                exec(compile((kb_dir / name).read_text("utf-8"), name, "exec"), ns)
                inputs = ns["get_inputs"]()
                result = ns["Model"](*ns["get_init_inputs"]())(*inputs)
        except Exception as exc:  # a problem the meta device cannot run: say so, keep going
            out[name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
            continue
        outs = result if isinstance(result, (tuple, list)) else [result]
        out[name] = {
            "inputs": [[list(t.shape), t.numel() * t.element_size()] for t in inputs
                       if isinstance(t, torch.Tensor)],
            "outputs": [[list(t.shape), t.numel() * t.element_size()] for t in outs
                        if isinstance(t, torch.Tensor)]}
    return out


def memory_deaths(verdicts: list[dict]) -> list[str]:
    """Candidates lost to memory: runtime_error naming SIGKILL, OOM or a memory bound."""
    return [v["candidate_id"] for v in verdicts
            if v["status"] == "runtime_error" and MEMORY.search(v.get("error", "") or "")]


def expected(status: str, label: str, strict: bool = True) -> bool:
    """Whether a status is what the label predicts (fallback: rejected under strict)."""
    ok = {"correct": ("correct_slow", "correct_fast"), "wrong": ("incorrect",),
          "crashing": ("runtime_error",), "hanging": ("timeout",),
          "fallback": ("static_reject", "cheat") if strict else
          ("static_reject", "cheat", "correct_slow", "correct_fast")}
    return status in ok[label]


def run_verifier(rows_path: Path, out: Path, cache: Path, budget_s: float,
                 args: argparse.Namespace, gpus: int = 1) -> dict[str, Any]:
    """`python -m verifier --batch` as a subprocess, stopped (SIGKILL) at `budget_s`; with
    --cores-per-gpu, held to that many cores per GPU (a node's GPUs with their share of CPUs)."""
    cpus = sorted(os.sched_getaffinity(0))
    if args.cores_per_gpu:
        cpus = cpus[:gpus * args.cores_per_gpu]
    workers = min(args.compile_workers, len(cpus)) if args.cores_per_gpu else args.compile_workers
    cmd = [sys.executable, "-m", "verifier", "--batch", str(rows_path), "--out", str(out),
           "--backend", "cuda", "--gpus", str(gpus), "--cache-dir", str(cache),
           "--timeout", str(args.run_timeout), "--compile-workers", str(workers), "--profile",
           *args.verifier_args.split()]
    log(f"[ours] {' '.join(cmd[2:])}")
    start = time.monotonic()
    err_path = out.with_name(out.name + ".stderr")
    with open(err_path, "w", encoding="utf-8") as err:
        # a fresh XDG cache: the eager baselines are measured in this run, not found
        env = dict(os.environ, XDG_CACHE_HOME=str(cache.with_name(cache.name + "-xdg")))
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True, env=env,
                                preexec_fn=lambda: os.sched_setaffinity(0, cpus))
        try:
            rc = proc.wait(timeout=budget_s)
            cut = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc, cut = proc.wait(), True
    wall = time.monotonic() - start
    stderr = err_path.read_text("utf-8", "replace")
    verdicts = [json.loads(ln) for ln in out.read_text("utf-8").splitlines()] \
        if out.exists() else []
    progress = [p for p in map(parse_progress, stderr.splitlines()) if p]
    log(f"[ours] {len(verdicts)} verdicts in {wall:.1f}s (rc {rc}{', cut at budget' if cut else ''})")
    return {"wall_s": wall, "rc": rc, "cut": cut, "verdicts": verdicts, "gpus": gpus,
            "cores": len(cpus),
            "progress_last": progress[-1] if progress else None,
            "profile": profile_text(stderr),
            "stderr_tail": stderr[-3000:]}


def summarize(run: dict[str, Any], labels: dict[str, str], n_total: int) -> dict[str, Any]:
    """Rates and counts of one verifier run."""
    vs = run["verdicts"]
    ran = sum(v["status"] in RAN for v in vs)
    hours = run["wall_s"] * run.get("gpus", 1) / 3600  # GPU-hours
    return {"decided": len(vs), "of": n_total, "wall_s": round(run["wall_s"], 1),
            "cut": run["cut"], "ran": ran, "ran_per_gpu_hour": round(ran / hours) if hours else 0,
            "per_gpu_hour": round(len(vs) / hours) if hours else 0, "cores": run.get("cores"),
            "profile": run.get("profile", ""),
            "statuses": dict(collections.Counter(v["status"] for v in vs)),
            "memory_deaths": memory_deaths(vs),
            # judge-seconds saved (verifier.judge.pace): timing settled, hangs cut at a deadline
            "settled": sum("timing_settled" in str(v.get("findings", "")) for v in vs),
            "hang_deadline": sum("hang deadline" in (v.get("error") or "") for v in vs),
            # failures a worker reported after earlier jobs, made again in a fresh one
            # (`verifier.run.outcome.confirmed`): each cost a rerun and a worker swap
            "confirmed_fresh": sum("confirmed_fresh" in str(v.get("findings", "")) for v in vs),
            "as_labelled": sum(expected(v["status"], labels[v["candidate_id"]]) for v in vs),
            "unexpected": [f"{v['candidate_id']}: {v['status']} ({v['error'][:100]})"
                           for v in vs if not expected(v["status"], labels[v["candidate_id"]])]}


def kb_subset(cands: list[KbCandidate], limit: int) -> list[KbCandidate]:
    """Every k-th candidate, hangs left out (both harnesses would only wait)."""
    pool = [c for c in cands if c.label != "hanging"]
    if limit < 0 or limit >= len(pool):
        return pool
    step = len(pool) / max(limit, 1)
    return [pool[int(i * step)] for i in range(limit)]


def run_kb(sub: list[KbCandidate], rows: dict[str, dict], work: Path, budget_s: float,
           args: argparse.Namespace) -> dict[str, Any]:
    """KernelBench-style harness: parallel pre-compile, then one process per candidate."""
    from benchmarks import kb_harness

    kernels = [SimpleNamespace(candidate_id=c.candidate_id, source=c.source,
                               task_source=rows[c.candidate_id]["task_source"]) for c in sub]
    start = time.monotonic()
    comp, pre_s = kb_harness.precompile(kernels, work, args.compile_workers,
                                        min(args.kb_timeout, budget_s), log)
    results: dict[str, dict] = {}
    for k in kernels:
        left = budget_s - (time.monotonic() - start)
        if left < 5:
            break
        res, _ = kb_harness.evaluate([k], work, args.kb_tol, args.kb_tol,
                                     min(args.kb_timeout, left),
                                     lambda _m: None)
        results.update(res)
    wall = time.monotonic() - start
    n = len(results)
    log(f"[kb] {n}/{len(kernels)} evaluated in {wall:.1f}s (pre-compile {pre_s:.1f}s)")
    # a candidate costs its share of the parallel pre-compile and its own evaluation: the
    # rate of the whole subset, also where the budget ended the evaluations early
    cost = pre_s * n / max(1, len(kernels)) + (wall - pre_s)
    return {"wall_s": wall, "precompile_s": pre_s, "evaluated": n, "of": len(kernels),
            "per_gpu_hour": round(n / cost * 3600) if n and cost > 0 else 0,
            "verdicts": {cid: r.get("verdict", "runtime_error") for cid, r in results.items()},
            "errors": {cid: str(r.get("error", ""))[:200] for cid, r in results.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kb-dir", type=Path,
                    help="KernelBench's problem folder (level1/, level2/, level3/)")
    ap.add_argument("--merge", type=Path, nargs="+", default=[],
                    help="no run: one table from these calls' --out folders (needs no GPU)")
    ap.add_argument("--cores-per-gpu", type=int, default=0,
                    help="hold a run on N GPUs to N x this many cores (0: all)")
    ap.add_argument("--out", type=Path, default=Path("kb_bench_out"))
    ap.add_argument("--levels", default="1,2,3")
    ap.add_argument("--limit", type=int, default=0, help="every k-th of the corpus, N in all")
    ap.add_argument("--budget-s", type=float, default=510.0, help="wall budget of the run")
    ap.add_argument("--ours-share", type=float, default=0.55,
                    help="share of the budget for the cold batch")
    ap.add_argument("--kb-limit", type=int, default=os.cpu_count() or 12,
                    help="candidates for KernelBench's harness (default: one per core, as its "
                         "pre-compile runs one per core); 0: skip it")
    ap.add_argument("--kb-timeout", type=float, default=180.0, help="main's per-sample timeout")
    ap.add_argument("--kb-tol", type=float, default=KB_TOL, help="its atol = rtol")
    ap.add_argument("--repeat", action="store_true", help="run the batch twice (agreement)")
    ap.add_argument("--gpus", type=int, default=1,
                    help="N > 1: also a cold batch on N GPUs (speed-up, agreement)")
    ap.add_argument("--run-timeout", type=float, default=30.0)
    ap.add_argument("--compile-workers", type=int, default=os.cpu_count() or 8)
    ap.add_argument("--verifier-args", default="", help="more `python -m verifier` flags")
    ap.add_argument("--device-tag", default="", help="results file suffix (default: GPU name)")
    ap.add_argument("--results-dir", type=Path, default=ROOT / "benchmarks" / "results")
    a = ap.parse_args(argv)
    if a.merge:
        report = merge(a.merge)
        path = a.results_dir / f"verify_kernelbench_{a.device_tag or device_tag(report['device'])}.md"
        path.write_text(markdown(report), "utf-8")
        print(markdown(report), flush=True)
        return 0
    if a.kb_dir is None:
        ap.error("--kb-dir is required for a run")
    import torch

    cands = list(candidates(tuple(int(x) for x in a.levels.split(","))))
    if a.limit:
        cands = cands[:: max(1, len(cands) // a.limit)][: a.limit]
    a.out.mkdir(parents=True, exist_ok=True)
    rows_list = batch_rows(a.kb_dir, cands)
    rows_path = a.out / "rows.jsonl"
    rows_path.write_text("".join(json.dumps(r) + "\n" for r in rows_list), "utf-8")
    rows = {r["candidate_id"]: r for r in rows_list}
    labels = {c.candidate_id: c.label for c in cands}
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    report: dict[str, Any] = {
        "device": name, "torch": torch.__version__, "cpus": os.cpu_count(), "n": len(cands),
        "problems": len({c.problem for c in cands}),
        "labels": dict(collections.Counter(labels.values())),
        "command": "python -m benchmarks.verify_kernelbench " + " ".join(argv or sys.argv[1:])}
    md_path = a.results_dir / f"verify_kernelbench_{a.device_tag or device_tag(name)}.md"

    def save() -> None:
        (a.out / "results.json").write_text(json.dumps(report, indent=1, default=str), "utf-8")
        a.results_dir.mkdir(parents=True, exist_ok=True)
        md_path.write_text(markdown(report), "utf-8")

    report["sizes"] = problem_sizes(a.kb_dir, sorted({c.problem for c in cands}))
    save()
    log(f"{len(cands)} candidates over {report['problems']} problems on {name}")
    work = Path(tempfile.mkdtemp(prefix="ks-verify-kb-"))
    try:
        first = run_verifier(rows_path, a.out / "ours1.jsonl", work / "cache1",
                             a.budget_s * a.ours_share, a)
        report["ours1"] = summarize(first, labels, len(cands))
        report["ours1_stderr_tail"] = first["stderr_tail"]
        save()
        left = a.budget_s - (time.monotonic() - T0)
        if a.kb_limit and left > 30:
            decided = {v["candidate_id"] for v in first["verdicts"]}
            sub = kb_subset([c for c in cands if c.candidate_id in decided], a.kb_limit)
            kb_share = left * (0.5 if a.repeat or a.gpus > 1 else 0.9)
            kb = run_kb(sub, rows, work / "kb", kb_share, a)
            ours = {v["candidate_id"]: coarse(v["status"]) for v in first["verdicts"]}
            kb["compared"] = len(kb["verdicts"])
            kb["differ"] = [f"{cid} ({labels[cid]}): ours {ours[cid]}, KernelBench {kv} "
                            f"{kb['errors'][cid][:80]}" for cid, kv in kb["verdicts"].items()
                            if ours[cid] != kv]
            kb["agree"] = kb["compared"] - len(kb["differ"])
            report["kb"] = kb
            save()
        left = a.budget_s - (time.monotonic() - T0)
        if a.repeat and left > 30:
            shutil.copytree(work / "cache1", work / "cache2", dirs_exist_ok=True)
            second = run_verifier(rows_path, a.out / "ours2.jsonl", work / "cache2", left - 10, a)
            both, agree, diff = agreement(first["verdicts"], second["verdicts"])
            report["repeat"] = {"both": both, "agree": agree, "differ": diff[:40],
                                "noise": timing_noise(first["verdicts"], second["verdicts"]),
                                "summary": summarize(second, labels, len(cands))}
            save()
        left = a.budget_s - (time.monotonic() - T0)
        if a.gpus > 1 and left > 30:
            multi = run_verifier(rows_path, a.out / f"ours{a.gpus}gpu.jsonl",
                                 work / f"cache{a.gpus}", left - 10, a, gpus=a.gpus)
            both, agree, diff = agreement(first["verdicts"], multi["verdicts"])
            rate = (len(multi["verdicts"]) / multi["wall_s"]) / max(
                len(first["verdicts"]) / first["wall_s"], 1e-9)
            report["multi"] = {"gpus": a.gpus, "both": both, "agree": agree,
                               "differ": diff[:40], "speedup": rate,
                               "noise": timing_noise(first["verdicts"], multi["verdicts"]),
                               "summary": summarize(multi, labels, len(cands))}
            save()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(markdown(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
