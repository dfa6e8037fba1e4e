"""The results table of benchmarks/verify_kernelbench.py: runs compared (agreement, timing noise),
issue 29's targets, and one table merged from several calls' output folders."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

CORRECT = ("correct_slow", "correct_fast")


def coarse(status: str) -> str:
    """Our status in the KernelBench harness's words."""
    return {"correct_slow": "correct", "correct_fast": "correct"}.get(status, status)


def agreement(a: list[dict], b: list[dict]) -> tuple[int, int, list[str]]:
    """Candidates decided in both runs, how many agree (fast/slow counted as one), which not."""
    sa = {v["candidate_id"]: coarse(v["status"]) for v in a}
    sb = {v["candidate_id"]: coarse(v["status"]) for v in b}
    both = sorted(set(sa) & set(sb))
    diff = [f"{c}: {sa[c]} vs {sb[c]}" for c in both if sa[c] != sb[c]]
    return len(both), len(both) - len(diff), diff


def timing_noise(a: list[dict], b: list[dict]) -> dict[str, Any]:
    """Speed-ups of the candidates correct in both runs: how far they differ (median, p90, in
    %), and the correct_fast/correct_slow flips, each within that noise of 1.0x or not."""
    sa = {v["candidate_id"]: v for v in a if v["status"] in CORRECT and v.get("speedup")}
    sb = {v["candidate_id"]: v for v in b if v["status"] in CORRECT and v.get("speedup")}
    both = sorted(set(sa) & set(sb))
    logs = sorted(abs(math.log(sa[c]["speedup"] / sb[c]["speedup"])) for c in both)
    if not logs:
        return {"both": 0, "median_pct": 0.0, "p90_pct": 0.0, "flips": 0, "outside": []}
    p90 = logs[min(len(logs) - 1, int(0.9 * len(logs)))]
    flips = [c for c in both if sa[c]["status"] != sb[c]["status"]]
    # a flip is noise when either run's speed-up lies within the p90 difference of 1.0x
    outside = [f"{c}: {sa[c]['speedup']:.3f} vs {sb[c]['speedup']:.3f}" for c in flips
               if min(abs(math.log(sa[c]["speedup"])), abs(math.log(sb[c]["speedup"]))) > p90]
    return {"both": len(both), "median_pct": round(100 * math.expm1(logs[len(logs) // 2]), 1),
            "p90_pct": round(100 * math.expm1(p90), 1), "flips": len(flips), "outside": outside}


def noise_row(what: str, noise: dict[str, Any] | None) -> list[str]:
    """The timing-noise line of a comparison, when it was measured."""
    if not noise or not noise["both"]:
        return []
    return [f"| timing noise, {what}: speed-ups of {noise['both']} candidates correct in both "
            f"differ by median {noise['median_pct']}%, p90 {noise['p90_pct']}%; "
            f"correct_fast/correct_slow flips {noise['flips']}, "
            f"{len(noise['outside'])} outside that noise |"]


def targets(report: dict[str, Any]) -> list[str]:
    """Issue 29's targets, each with the measured value and whether it holds."""
    ours, kb, rep, multi = (report.get(k) for k in ("ours1", "kb", "repeat", "multi"))
    rows = []

    def row(name: str, value: Any, ok: bool) -> None:
        rows.append(f"| {name} | {value} | {'yes' if ok else '**no**'} |")

    if ours:
        row("compiled-and-run per GPU-hour, cold, 1 GPU (>= 3,000)", ours["ran_per_gpu_hour"],
            ours["ran_per_gpu_hour"] >= 3000 and not ours["cut"])
        deaths = ours["memory_deaths"] + (multi["summary"]["memory_deaths"] if multi else [])
        row("memory deaths of honest kernels (0)", len(deaths), not deaths)
    if kb and ours and kb["per_gpu_hour"]:
        ratio = ours["per_gpu_hour"] / kb["per_gpu_hour"]
        row("ratio to KernelBench's harness (>= 6x)", f"{ratio:.1f}x", ratio >= 6)
    for name, cmp in (("agreement, two runs", rep), ("agreement, 1 vs 2 GPUs", multi)):
        if cmp:
            noise = cmp.get("noise") or {}
            row(f"{name} (all; fast/slow only within noise)", f"{cmp['agree']}/{cmp['both']}",
                cmp["agree"] == cmp["both"] and not noise.get("outside"))
    if multi:
        row(f"speed-up 1 -> {multi['gpus']} GPUs (>= 1.8x)", f"{multi['speedup']:.2f}x",
            multi["speedup"] >= 1.8)
    return ["", "## Targets (issue 29)", "", "| target | measured | holds |",
            "| --- | --- | --- |", *rows] if rows else []


def markdown(report: dict[str, Any]) -> str:
    """The results table of whatever phases have finished."""
    lines = [f"# verify_kernelbench on {report['device']}", "",
             f"`{report['command']}`", "",
             f"torch {report['torch']}, {report['cpus']} CPUs; KernelBench main problem files; "
             f"{report['n']} candidates over {report['problems']} problems; labels "
             + ", ".join(f"{k} {v}" for k, v in sorted(report["labels"].items())), ""]
    ours = report.get("ours1")
    if ours:
        lines += ["| measure | value |", "| --- | --- |",
                  f"| ours cold, 1 GPU ({ours.get('cores', '?')} cores): decided | "
                  f"{ours['decided']}/{ours['of']} in "
                  f"{ours['wall_s']} s{' (cut at budget)' if ours['cut'] else ''} |",
                  f"| compiled-and-run | {ours['ran']} = **{ours['ran_per_gpu_hour']} per "
                  "GPU-hour** |",
                  f"| all verdicts per GPU-hour | {ours['per_gpu_hour']} |",
                  f"| memory deaths (runtime_error: SIGKILL/OOM/memory) | "
                  f"{len(ours['memory_deaths'])} {', '.join(ours['memory_deaths'][:8])} |",
                  f"| verdicts as labelled | {ours['as_labelled']}/{ours['decided']} |",
                  "| statuses | " + ", ".join(f"{k} {v}" for k, v in
                                             sorted(ours["statuses"].items())) + " |",
                  f"| timing settled after one window / timeouts at a hang deadline | "
                  f"{ours.get('settled', '?')} / {ours.get('hang_deadline', '?')} |",
                  f"| runs confirmed in a fresh worker (failures after earlier jobs) | "
                  f"{ours.get('confirmed_fresh', '?')} |"]
    kb = report.get("kb")
    if kb:
        ratio = (ours["per_gpu_hour"] / kb["per_gpu_hour"]) if ours and kb["per_gpu_hour"] \
            else 0
        lines += [f"| KernelBench harness, main's best configuration (pre-compile of "
                  f"{kb['of']} in {kb['precompile_s']:.0f} s on all cores, then one process "
                  f"per candidate) | {kb['evaluated']}/{kb['of']} evaluated in "
                  f"{kb['wall_s']:.0f} s = {kb['per_gpu_hour']} per GPU-hour (each its share "
                  "of the pre-compile and its own evaluation) |",
                  f"| ratio ours / KernelBench (candidates per GPU-hour) | **{ratio:.1f}x** |",
                  f"| verdicts agree with KernelBench's (same candidates) | "
                  f"{kb.get('agree', 0)}/{kb.get('compared', 0)} |"]
    rep = report.get("repeat")
    if rep:
        lines.append(f"| agreement, two runs ({rep.get('how', 'builds cached in the second')})"
                     f" | {rep['agree']}/{rep['both']} |")
        lines += noise_row("two runs", rep.get("noise"))
    multi = report.get("multi")
    if multi and ours:
        m = multi["summary"]
        lines += [f"| ours cold, {multi['gpus']} GPUs: decided | {m['decided']}/{m['of']} in "
                  f"{m['wall_s']} s{' (cut at budget)' if m['cut'] else ''}; "
                  f"{m['ran_per_gpu_hour']} compiled-and-run per GPU-hour |",
                  f"| speed-up 1 -> {multi['gpus']} GPUs (decided per second) | "
                  f"**{multi['speedup']:.2f}x** |",
                  f"| agreement, 1 vs {multi['gpus']} GPUs | {multi['agree']}/{multi['both']} |",
                  *noise_row(f"1 vs {multi['gpus']} GPUs", multi.get("noise"))]
    lines += targets(report)
    for name, run in (("ours cold, 1 GPU", ours), ("ours cold, more GPUs",
                                                   multi and multi["summary"])):
        if run and run.get("profile"):
            lines += ["", f"## Where the wall time went: {name} (`--profile`)", "", "```",
                      run["profile"], "```"]
    for name, cmp in (("two runs", rep), ("1 vs more GPUs", multi)):
        if cmp and (cmp.get("differ") or (cmp.get("noise") or {}).get("outside")):
            lines += ["", f"## Verdicts that differ, {name}", ""]
            lines += [f"- {d}" for d in cmp.get("differ", [])[:40]]
            lines += [f"- fast/slow outside the noise: {d}" for d in cmp["noise"]["outside"]]
    sizes = report.get("sizes")
    if sizes:
        lines += ["", "## Problem sizes (main's files; MiB per input / output tensor)", "",
                  "| problem | inputs | outputs |", "| --- | --- | --- |"]
        for name, s in sizes.items():
            if "error" in s:
                lines.append(f"| {name} | {s['error'][:60]} | |")
                continue
            fmt = ", ".join
            lines.append(f"| {name} | {fmt(f'{b / 2**20:.0f}' for _, b in s['inputs'])} | "
                         f"{fmt(f'{b / 2**20:.0f}' for _, b in s['outputs'])} |")
    if ours and ours["unexpected"]:
        lines += ["", "## Verdicts other than labelled", ""]
        lines += [f"- {u}" for u in ours["unexpected"][:60]]
    if kb and kb.get("differ"):
        lines += ["", "## Differences with KernelBench's harness", ""]
        lines += [f"- {d}" for d in kb["differ"][:40]]
    return "\n".join(lines) + "\n"


def _verdicts(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text("utf-8").splitlines()] \
        if path.exists() else []


def merge(dirs: list[Path]) -> dict[str, Any]:
    """One report from several calls' --out folders: the first call's cold run, its next
    call's cold run as the second run (agreement and timing noise across two cold runs), and
    the first KernelBench-harness and multi-GPU phases found."""
    reports = [json.loads((d / "results.json").read_text("utf-8")) for d in dirs]
    report = dict(reports[0])
    report["command"] = "` and `".join(r["command"] for r in reports)
    for key in ("kb", "multi", "repeat"):
        found = [r[key] for r in reports if r.get(key)]
        if found:
            report[key] = found[0]
    if len(dirs) > 1 and reports[1].get("ours1"):
        a, b = _verdicts(dirs[0] / "ours1.jsonl"), _verdicts(dirs[1] / "ours1.jsonl")
        both, agree, diff = agreement(a, b)
        report["repeat"] = {"both": both, "agree": agree, "differ": diff[:40],
                            "noise": timing_noise(a, b), "summary": reports[1]["ours1"],
                            "how": "two cold runs, in two calls"}
    return report
