"""Template generator coverage and, with --verify, how many template kernels verify correct/fast.

    PYTHONPATH=. python3 benchmarks/generate.py [--tasks-dir sources/seed] [--backend cuda|cpu]
        [--variants 3] [--verify] [--limit N] [--shard K/N] [--out DIR]

Coverage: share of task files with at least one template candidate, per level and per family
(the family a seed file declares first). Baseline in the same run: the share a single-op
template set would cover (tasks whose lowering needs exactly one kernel launch), which is what a
per-op template library without fusion or composition reaches. With --verify, every candidate
goes through `verifier.api.verify_batch` on the backend: share correct and share faster than
eager (the verifier's eager timing is the baseline). Needs only torch + stdlib + this repo for
`--backend cuda` (task files are read directly; no schemas/pyarrow import).
"""

from __future__ import annotations

import argparse
import ast
import collections
import hashlib
import json
import re
import sys
import time
from pathlib import Path

# `python benchmarks/generate.py` puts benchmarks/ first on sys.path, where select.py would shadow
# the stdlib module that subprocess imports; only the repository root belongs there.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from pipeline.candidates.templates import NoTemplate, TaskView, template_kernels  # noqa: E402
from pipeline.candidates.templates.analysis import trace_sources  # noqa: E402

_FAMILIES = re.compile(r"^Families: (?P<f>[a-z_, ]+)\. Level (?P<l>\d)\.$", re.M)


def load_views(tasks_dir: Path, backend: str, limit: int | None,
               cpu_cache: Path | None) -> list[tuple[TaskView, str, int]]:
    """(view, declared family, level) per task file; cpu sources scaled via pipeline.tasks.taskfile."""
    files = sorted(p for p in tasks_dir.glob("*.py") if not p.name.startswith("_"))[:limit]
    cpu: dict[str, str | None] = {}
    if backend == "cpu":
        cached = json.loads(cpu_cache.read_text()) if cpu_cache and cpu_cache.exists() else {}
        todo = [f for f in files if f.name not in cached]
        if todo:
            from pipeline.tasks.taskfile import validate_task_files  # needs the full environment

            for f, rep in zip(todo, validate_task_files(todo, workers=2, scale=True),
                              strict=True):
                cached[f.name] = rep.cpu_source if rep.valid else None
            if cpu_cache:
                cpu_cache.write_text(json.dumps(cached))
        cpu = cached
    out = []
    for f in files:
        src = f.read_text(encoding="utf-8")
        m = _FAMILIES.search(src)
        fam, level = (m.group("f").split(",")[0].strip(), int(m.group("l"))) if m else ("?", 1)
        cpu_src = cpu.get(f.name) if backend == "cpu" else src
        if cpu_src is None:
            continue
        tid = hashlib.sha256(ast.unparse(ast.parse(src)).encode()).hexdigest()[:20]
        out.append((TaskView(tid, f.stem, src, cpu_src, level, str(f)), fam, level))
    return out


def pct(a: int, b: int) -> str:
    return f"{100.0 * a / b:5.1f}%" if b else "    -"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks-dir", default="sources/seed")
    ap.add_argument("--backend", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--variants", type=int, default=3)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--shard", default="0/1",
                    help="K/N: only every N-th task starting at K (split a GPU run into calls)")
    ap.add_argument("--tasks", default="", help="comma-separated task names to add to the shard")
    ap.add_argument("--verify", action="store_true")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--compile-workers", type=int, default=8)
    ap.add_argument("--compile-batch", type=int, default=16, help="candidates per translation unit")
    ap.add_argument("--perf-budget", type=float, default=3.0, help="seconds of timing per kernel")
    ap.add_argument("--cpu-cache", default=None, help="JSON cache of scaled cpu sources")
    ap.add_argument("--out", default=None, help="write results.json here")
    args = ap.parse_args()

    t0 = time.perf_counter()
    views = load_views(Path(args.tasks_dir), args.backend, args.limit,
                       Path(args.cpu_cache) if args.cpu_cache else None)
    k, n = (int(x) for x in args.shard.split("/"))
    extra = set(filter(None, args.tasks.split(",")))
    views = [v for i, v in enumerate(views) if i % n == k or v[0].name in extra]
    t_load = time.perf_counter() - t0
    sources = [v.cpu_source if args.backend == "cpu" else v.source for v, _, _ in views]
    t1 = time.perf_counter()
    trace_sources(sources)
    t_trace = time.perf_counter() - t1
    rows, kernels = [], []
    t2 = time.perf_counter()
    for view, fam, level in views:
        try:
            ks = template_kernels(view, args.backend, args.variants)
            rows.append({"task": view.name, "family": fam, "level": level, "covered": True,
                         "n": len(ks), "single": len(ks[0].params) == 1 and
                         sum(len(v) for v in ks[0].params.values()) == 1, "reason": ""})
            kernels += [(view, fam, level, k) for k in ks]
        except NoTemplate as exc:
            rows.append({"task": view.name, "family": fam, "level": level, "covered": False,
                         "n": 0, "single": False, "reason": str(exc)})
    t_gen = time.perf_counter() - t2

    print(f"\nTemplate coverage ({args.backend}, {len(views)} tasks from {args.tasks_dir}; "
          f"load {t_load:.1f}s, trace {t_trace:.1f}s, generate {t_gen:.2f}s, "
          f"{len(kernels)} candidates)")
    print(f"{'group':<22}{'tasks':>6}{'covered':>9}{'share':>8}{'single-op baseline':>20}")
    groups = collections.defaultdict(list)
    for r in rows:
        groups[f"level {r['level']}"].append(r)
    for r in rows:
        groups[f"  {r['family']}"].append(r)
    for name in sorted(groups, key=lambda g: (not g.startswith("level"), g)):
        g = groups[name]
        cov = sum(r["covered"] for r in g)
        single = sum(r["single"] for r in g)
        print(f"{name:<22}{len(g):>6}{cov:>9}{pct(cov, len(g)):>8}{pct(single, len(g)):>20}")
    cov = sum(r["covered"] for r in rows)
    print(f"{'all':<22}{len(rows):>6}{cov:>9}{pct(cov, len(rows)):>8}"
          f"{pct(sum(r['single'] for r in rows), len(rows)):>20}")
    for r in rows:
        if not r["covered"]:
            print(f"  not covered: {r['task']}: {r['reason']}")

    verdicts = []
    if args.verify and kernels:
        from verifier.api import verify_batch
        from verifier.protocol import CORRECT_STATUSES, VerifyOptions, VerifyRequest

        reqs = [VerifyRequest(candidate_id=hashlib.sha256(k.code.encode()).hexdigest()[:20],
                              task_id=v.task_id,
                              task_source=v.cpu_source if args.backend == "cpu" else v.source,
                              response=k.raw_response(), backend=args.backend)
                for v, _, _, k in kernels]
        opts = VerifyOptions(backend=args.backend, workers=args.workers,
                             compile_workers=args.compile_workers,
                             compile_batch=args.compile_batch, perf_budget_s=args.perf_budget)
        t3 = time.perf_counter()
        done = [0]

        def progress(vd) -> None:  # a line per verdict, so a cut-off run still shows results
            done[0] += 1
            print(f"  [{done[0]}/{len(reqs)}] {time.perf_counter() - t3:6.1f}s {vd.status:14} "
                  f"{vd.candidate_id} compile {vd.compile_s or 0:.1f}s wall {vd.wall_s or 0:.1f}s "
                  f"{(vd.error or '')[:120]!r}", flush=True)

        verdicts = verify_batch(reqs, opts, progress=progress)
        t_ver = time.perf_counter() - t3
        print(f"\nVerification on {args.backend} ({len(reqs)} candidates, {t_ver:.0f}s); "
              "baseline = eager PyTorch timed by the verifier")
        print(f"{'group':<22}{'cands':>6}{'correct':>9}{'share':>8}{'faster':>8}{'share':>8}"
              f"{'median speedup':>16}")
        vg = collections.defaultdict(list)
        for (_v, _fam, level, k), vd in zip(kernels, verdicts, strict=True):
            vg[f"level {level}"].append(vd)
            vg[f"  {k.family}"].append(vd)
            vg["all"].append(vd)
        for name in sorted(vg, key=lambda g: (g == "all", not g.startswith("level"), g)):
            g = vg[name]
            ok = [d for d in g if d.status in CORRECT_STATUSES]
            fast = [d for d in g if d.status == "correct_fast"]
            sp = sorted(d.speedup for d in ok if d.speedup)
            med = f"{sp[len(sp) // 2]:.2f}x" if sp else "-"
            print(f"{name:<22}{len(g):>6}{len(ok):>9}{pct(len(ok), len(g)):>8}{len(fast):>8}"
                  f"{pct(len(fast), len(g)):>8}{med:>16}")
        print(teacher_table(kernels, verdicts, CORRECT_STATUSES))
        statuses = collections.Counter(d.status for d in verdicts)
        print("statuses:", dict(statuses))
        for (v, _, _, k), vd in zip(kernels, verdicts, strict=True):
            if vd.status not in CORRECT_STATUSES:
                msg = (vd.error or vd.feedback or "").replace("\n", " ")[:300]
                print(f"  {vd.status}: {v.name} {k.variant}: {msg}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps({
            "coverage": rows,
            "verdicts": [{"task": v.name, "variant": k.variant, "family": k.family,
                          "status": d.status, "speedup": d.speedup, "runtime_us": d.runtime_us,
                          "eager_us": d.eager_us, "compile_s": d.compile_s, "wall_s": d.wall_s,
                          "error": d.error[:500]}
                         for (v, _, _, k), d in zip(kernels, verdicts, strict=False)],
        }, indent=1))


def _median(xs: list[float]) -> str:
    xs = sorted(xs)
    if not xs:
        return "-"
    mid = len(xs) // 2
    return f"{(xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2):.2f}x"


def teacher_table(kernels: list, verdicts: list, correct: tuple | frozenset) -> str:
    """Per family (and level): median speedup over eager of every correct template variant
    (before: the old sft taught each one), of the first-listed variant, and of the fastest correct
    variant per task (after: the sft answer), with the share of tasks whose answer is >= 1.0x."""
    per_task: dict[tuple[str, str], list[tuple[int, float]]] = collections.defaultdict(list)
    for i, ((view, fam, level, _k), vd) in enumerate(zip(kernels, verdicts, strict=True)):
        if vd.status in correct and vd.speedup:
            per_task[(view.name, f"{fam}|level {level}")].append((i, vd.speedup))
    groups: dict[str, list[list[tuple[int, float]]]] = collections.defaultdict(list)
    for (_task, key), got in per_task.items():
        fam, level = key.split("|")
        for g in (f"  {fam}", level, "all"):
            groups[g].append(got)
    lines = ["", "Teacher table: median speedup over eager (same run, same device)",
             f"{'group':<22}{'tasks':>6}{'all variants':>14}{'first variant':>15}"
             f"{'fastest/task':>14}{'>= 1.0x':>9}"]
    for name in sorted(groups, key=lambda g: (g == "all", not g.startswith("level"), g)):
        tasks = groups[name]
        every = [sp for got in tasks for _, sp in got]
        first = [min(got)[1] for got in tasks]  # the lowest kernel index: the first variant
        best = [max(sp for _, sp in got) for got in tasks]
        fast = sum(b >= 1.0 for b in best)
        lines.append(f"{name:<22}{len(tasks):>6}{_median(every):>14}{_median(first):>15}"
                     f"{_median(best):>14}{pct(fast, len(tasks)):>9}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
