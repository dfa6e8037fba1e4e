"""Compile scheduling on the benchmark corpus: the old chunking against the planned units.

    python -m benchmarks.compile_schedule --workers N [--limit K] [--errors E] --out FILE

Builds the CUDA candidates of benchmarks/kernel_corpus.py (those that pass the front and C++
static checks, as `verify_batch` would build them) with the build stage only (import check off,
so no GPU is needed: nvcc and a torch wheel with c10/cuda headers suffice), twice in one run,
each into a fresh build cache sharing one prebuilt PCH (its time is printed once; both
schedules would pay it alike, beside their first units):
- old: `compile_chunks` as it was (one contiguous chunk of the flag-sorted specs per worker;
  a chunk holding several flag groups builds them one after another, and a failed unit's
  rebuilds run on the same worker, after its other units);
- planned: `verifier.compile.compile_plan` (units per flag group sized from the cost model, longest
  first on a dynamic pool, rebuilds at the front of the queue on any free worker).
For each: wall, compile sum (unit seconds), compiler CPU seconds (children's rusage: this shows
the work apart from waiting on a loaded machine), units and rebuilds, when specs landed, a GPU
feed simulated at --exec-s seconds a candidate (the GPU worker runs each landed candidate in
turn: when the last would finish), and a per-unit timeline. Outcomes per candidate (built, or
the first error line) must be identical across the two; the table says so. --limit K takes a
stratified subset (E of them compile errors; default: the corpus's share).
"""

from __future__ import annotations

import argparse
import heapq
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.kernel_corpus import CorpusKernel, corpus  # noqa: E402


def corpus_specs() -> list[tuple[CorpusKernel, str, list]]:
    """(kernel, code, specs) for every corpus candidate `verify_batch` would build."""
    from verifier.checks.extspec import specs_from_source
    from verifier.checks.fallback import apply_policy, errors
    from verifier.checks.static import check_cpp
    from verifier.protocol import VerdictData, VerifyRequest
    from verifier.stages import Item, front_stages

    out = []
    for k in corpus():
        it = Item(VerifyRequest(k.candidate_id, k.task_id, k.task_source, k.source, "cuda"),
                   VerdictData(k.candidate_id, k.task_id, "runtime_error", "extract", "cuda"))
        front_stages(it, "strict")
        specs = None if it.done else specs_from_source(it.code)
        if specs and not errors(apply_policy(check_cpp(specs, it.code, k.task_source),
                                             "strict")):
            out.append((k, it.code, specs))
    return out


def subset(rows: list, limit: int, n_err: int | None, origin: str = "") -> list:
    """`limit` rows evenly spread over the corpus, `n_err` of them compile errors (of
    `origin` when given: generated ones share the flags and headers of most candidates)."""
    if limit <= 0 or limit >= len(rows):
        return rows
    bad = [r for r in rows if r[0].expected == "compile_error" and origin in ("", r[0].origin)]
    good = [r for r in rows if r[0].expected != "compile_error"]
    n_err = round(limit * len(bad) / len(rows)) or 1 if n_err is None else n_err
    n_err = min(n_err, len(bad), limit)

    def spread(xs: list, n: int) -> list:
        return [xs[i * len(xs) // n] for i in range(n)] if n else []

    return spread(bad, n_err) + spread(good, limit - n_err)


def chunk_groups(chunk: list) -> list[list]:
    """The units the old scheduler built for one chunk, one after another."""
    from verifier.compile.builder import flags_key

    groups: dict = {}
    for s in chunk:
        groups.setdefault((True, flags_key(s)) if s.batchable else (False, s.key),
                          []).append(s)
    return list(groups.values())


def plan_lines(specs: list, workers: int, most: int) -> list[str]:
    """Both schedules' units for `workers` and their makespans under the cost model."""
    from verifier.compile.builder import flags_key
    from verifier.compile.compile_plan import CostModel, makespan, plan_units

    cost = CostModel()
    ordered = sorted(specs, key=lambda s: (not s.batchable, repr(flags_key(s))))
    chunks = [chunk_groups(c) for c in old_chunks(ordered, workers, most)]
    free = [0.0] * workers  # chunks go to the next free worker in their order (pool.map)
    for c in chunks:
        heapq.heapreplace(free, free[0] + sum(cost.unit(len(u)) for u in c))
    old_span = max(free)
    units = plan_units(ordered, workers, most, cost)
    new_span = makespan([cost.unit(len(u)) for u in units], workers)
    return [f"plan for {workers} workers, cost model unit {cost.unit_s}s + {cost.spec_s}s a spec, "
            f"{cost.fail_p:.0%} failing (estimated seconds, rebuild risk included):",
            f"  old: {len(chunks)} chunks, units per chunk (built one after another) "
            f"{[[len(u) for u in c] for c in chunks]}; makespan {old_span:.0f}s",
            f"  planned: {len(units)} units {[len(u) for u in units]}; makespan {new_span:.0f}s"]


def old_chunks(specs: list, workers: int, most: int) -> list[list]:
    """The chunking before compile_plan (verifier/compile/builder.py compile_chunks, 2026-11-22)."""
    if not specs:
        return []
    n_units = max(min(len(specs), max(1, workers)), -(-len(specs) // max(1, most)))
    return [specs[i * len(specs) // n_units:(i + 1) * len(specs) // n_units]
            for i in range(n_units)]


class Run:
    """One schedule's build: unit records, landing times, outcomes."""

    def __init__(self, name: str) -> None:
        self.name, self.units, self.landed = name, [], {}
        self.lock = threading.Lock()

    def on_ready(self, res: dict) -> None:
        now = time.monotonic()
        with self.lock:
            for k in res:
                self.landed.setdefault(k, now)


def recording_builder(ctx, run: Run, planned: set):
    from verifier.compile.builder import Builder

    class Recording(Builder):
        def build_unit(self, specs, results, carried=0.0):
            t = time.monotonic()
            more = super().build_unit(specs, results, carried)
            ok = all(s.key in results and results[s.key].ok for s in specs)
            with run.lock:
                run.units.append({"n": len(specs), "start": t, "end": time.monotonic(),
                                  "worker": threading.current_thread().name, "ok": ok,
                                  "rebuild": frozenset(s.key for s in specs) not in planned})
            return more

    return Recording(ctx)


def build(name: str, specs: list, args: argparse.Namespace, pch_src: Path
          ) -> tuple[Run, dict, float, float]:
    from verifier.backends import get_backend
    from verifier.compile.builder import BuildContext, flags_key
    from verifier.compile.compile_plan import CompilePool, plan_units

    cache = Path(tempfile.mkdtemp(prefix=f"ks-sched-{name}-", dir=args.tmp))
    ctx = BuildContext(get_backend("cuda"), cache, check_import=args.import_check)
    if pch_src.is_dir():
        shutil.copytree(pch_src, ctx.root / "pch")
    run = Run(name)
    ordered = sorted(specs, key=lambda s: (not s.batchable, repr(flags_key(s))))
    if name == "old":
        chunks = old_chunks(ordered, args.workers, args.compile_batch)
        planned = {frozenset(s.key for s in g) for c in chunks for g in chunk_groups(c)}
    else:
        units = plan_units(ordered, args.workers, args.compile_batch)
        planned = {frozenset(s.key for s in u) for u in units}
    builder = recording_builder(ctx, run, planned)
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    if name == "old":
        with ThreadPoolExecutor(args.workers, thread_name_prefix="compile") as pool:
            list(pool.map(lambda c: builder.build(c, on_ready=run.on_ready), chunks))
    else:
        CompilePool(builder, args.workers, run.on_ready).run(units)
    results = {s.key: builder.cached(s) for s in specs}  # what each build stored
    wall = time.monotonic() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    for u in run.units:
        u["start"] -= t0
        u["end"] -= t0
    run.landed = {k: v - t0 for k, v in run.landed.items()}
    shutil.rmtree(cache, ignore_errors=True)
    return run, results, wall, cpu


def outcome(res) -> str:
    if res is None:
        return "missing"
    if res.ok:
        return "built"
    first = next((ln for ln in res.log.splitlines() if "error" in ln), res.log.strip()[:200])
    return "error: " + first.strip()[:200]


def lines_for(run: Run, results: dict, wall: float, cpu: float, rows: list, exec_s: float
              ) -> list[str]:
    units = sorted(run.units, key=lambda u: u["start"])
    good = sorted(run.landed[s.key] for _, _, ss in rows for s in ss
                  if results.get(s.key) is not None and results[s.key].ok and s.key in run.landed)
    gpu = 0.0
    for t in good:  # one GPU worker running each landed candidate in turn
        gpu = max(gpu, t) + exec_s
    busy = sum(u["end"] - u["start"] for u in units)
    out = [f"== {run.name}: wall {wall:.1f}s, compile sum {busy:.1f}s, compiler CPU {cpu:.1f}s, units built {len(units)} (rebuilds "
           f"{sum(u['rebuild'] for u in units)})",
           f"   built specs landed: first {good[0] if good else 0:.1f}s, median "
           f"{statistics.median(good) if good else 0:.1f}s, last {good[-1] if good else 0:.1f}s; "
           f"GPU feed at {exec_s}s/candidate would end at {gpu:.1f}s",
           f"   {'worker':<12}{'start s':>9}{'end s':>9}{'specs':>7}  result"]
    for u in units:
        out.append(f"   {u['worker']:<12}{u['start']:>9.1f}{u['end']:>9.1f}{u['n']:>7}  "
                   f"{'ok' if u['ok'] else 'failed'}{' (rebuild)' if u['rebuild'] else ''}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--limit", type=int, default=0, help="stratified subset (0: all)")
    ap.add_argument("--errors", type=int, default=None, help="compile errors in the subset")
    ap.add_argument("--error-origin", default="", help="compile errors only from this "
                    "origin (conformance, handwritten, generated)")
    ap.add_argument("--compile-batch", type=int, default=16, help="most specs a unit")
    ap.add_argument("--exec-s", type=float, default=0.81, help="GPU seconds a candidate "
                    "(H100 corpus run: 102.4 s exec for 126 candidates)")
    ap.add_argument("--order", default="old,planned")
    ap.add_argument("--import-check", action="store_true", help="also import-check each "
                    "object (GPU hosts: torch with CUDA)")
    ap.add_argument("--plan-only", action="store_true", help="print both plans (for "
                    "--workers and 16), build nothing")
    ap.add_argument("--tmp", default=None, help="where the build caches go")
    ap.add_argument("--out", required=True, help="the table goes here")
    args = ap.parse_args()
    from verifier.backends import get_backend
    from verifier.compile.builder import BuildContext, Builder

    rows = subset(corpus_specs(), args.limit, args.errors, args.error_origin)
    specs = list({s.key: s for _, _, ss in rows for s in ss}.values())
    head = [f"# python -m benchmarks.compile_schedule {' '.join(sys.argv[1:])} (cpus {os.cpu_count()}, load {os.getloadavg()[0]:.1f})",
            f"corpus subset: {len(rows)} candidates, {len(specs)} specs, "
            f"{sum(r[0].expected == 'compile_error' for r in rows)} labelled compile_error"]
    for w in dict.fromkeys([args.workers, 16]):
        head += plan_lines(specs, w, args.compile_batch)
    if args.plan_only:
        print("\n".join(head))
        return
    pch_cache = Path(tempfile.mkdtemp(prefix="ks-sched-pch-", dir=args.tmp))
    ctx = BuildContext(get_backend("cuda"), pch_cache, check_import=False)
    t = time.monotonic()
    Builder(ctx).prepare_pch(specs)  # as verify_batch: groups of >= 3 specs
    head.append(f"PCH (shared by both, built first): {time.monotonic() - t:.1f}s")
    print("\n".join(head), flush=True)
    body, seen = [], {}
    for name in args.order.split(","):
        run, results, wall, cpu = build(name, specs, args, ctx.root / "pch")
        seen[name] = {s.key: outcome(results.get(s.key)) for s in specs}
        body += lines_for(run, results, wall, cpu, rows, args.exec_s)
        print("\n".join(body[-len(run.units) - 3:]), flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("\n".join(head + body) + "\n")  # kept if a later one is cut
    names = list(seen)
    diff = [k for k in seen[names[0]] if len({seen[n][k] for n in names}) > 1]
    summary = [f"outcomes identical across {', '.join(names)}: {'yes' if not diff else 'NO'} "
               f"({sum(v == 'built' for v in seen[names[0]].values())} built, "
               f"{sum(v != 'built' for v in seen[names[0]].values())} compile errors)"]
    summary += [f"  differs {k}: " + " | ".join(seen[n][k] for n in names) for k in diff]
    print("\n".join(summary))
    Path(args.out).write_text("\n".join(head + body + summary) + "\n")
    shutil.rmtree(pch_cache, ignore_errors=True)


if __name__ == "__main__":
    main()
