"""Cold CUDA build cost of KernelBench-style candidates, per phase, old plan against new.

    python -m benchmarks.build_speed --n 12 --workers 16 [--most 16] [--import-check]
        [--configs old,new] [--out FILE.md]

Takes N candidates of benchmarks/kernelbench_corpus that reach the build (the `fallback` label
is left out: the strict policy stops most of them before it), stratified over the corpus, and
builds them with `verifier.compile.compile_plan.compile_all` (the path `python -m verifier --batch`
takes: units planned, the PCH beside the first units, rebuilds on any free worker) into a fresh
cache for each configuration, so every run is cold (PCH, macro lists, objects):
- old: the plan as it was before the contention term (units sized as if concurrent compilers
  did not slow each other, so a batch no larger than the workers is built one spec a unit);
- new: the current defaults (`CostModel(cores=--cores)`: concurrent units progress like
  `parallel_eff * cores` of them at most), host units on the light headers' PCH first
  (`verifier.compile.host_headers`);
- fullhost: the same plan, host units on torch/extension.h's PCH as before.
The backend is wrapped to time each phase: the device unit (nvcc; whether the light header
held or the unit was built again with torch/extension.h), the host unit (g++ on the PCH), the
PCH, the link and, with --import-check (needs a GPU torch), the sandboxed import. The table
gives wall, compiler CPU seconds (children's rusage), seconds per phase summed over units,
per candidate, and candidates per core-hour (built candidates x 3600 / (wall x cores)) and
per CPU-hour of compilers. Outcomes (built, or the first error line) must match across the
configurations; the table says whether they do. No GPU is needed without --import-check.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PHASES = ("pch", "device light", "device full", "device light+full", "host", "link", "import")


def corpus_specs(n: int) -> list[tuple[str, object]]:
    """(candidate_id, spec) for `n` corpus candidates that reach the build, spread evenly."""
    from benchmarks.kernelbench_corpus import candidates
    from verifier.checks.extspec import specs_from_source

    pool = []
    for c in candidates():
        if c.label == "fallback":
            continue
        specs = specs_from_source(c.source) or []
        if len(specs) != 1:
            raise SystemExit(f"{c.candidate_id}: expected one load_inline call, found "
                             f"{len(specs)}")
        pool.append((c.candidate_id, specs[0]))
    if n >= len(pool):
        return pool
    return [pool[i * len(pool) // n] for i in range(n)]


class PhaseClock:
    """Seconds per build phase, summed over the threads that ran them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.secs = dict.fromkeys(PHASES, 0.0)
        self.count = dict.fromkeys(PHASES, 0)

    def add(self, phase: str, secs: float) -> None:
        with self.lock:
            self.secs[phase] += secs
            self.count[phase] += 1


def timed_backend(clock: PhaseClock):
    """A cuda backend whose compile, PCH and link calls report their seconds to `clock`."""
    from verifier.backends.cuda import CudaBackend

    class Timed(CudaBackend):
        def compile_pch(self, header, out_gch, flags, log, timeout_s):  # noqa: ANN001
            t = time.monotonic()
            try:
                return super().compile_pch(header, out_gch, flags, log, timeout_s)
            finally:
                clock.add("pch", time.monotonic() - t)

        def compile_unit(self, unit, obj, flags, pch_dir, log, timeout_s):  # noqa: ANN001
            t, start = time.monotonic(), len(log)
            try:
                return super().compile_unit(unit, obj, flags, pch_dir, log, timeout_s)
            finally:
                text = "\n".join(log[start:])
                phase = "host" if unit.kind == "host" else (
                    "device light+full" if "light-header attempt failed" in text else
                    "device light" if "built with <torch/types.h>" in text else "device full")
                clock.add(phase, time.monotonic() - t)

        def link(self, objs, out, ldflags, log, timeout_s):  # noqa: ANN001
            t = time.monotonic()
            try:
                return super().link(objs, out, ldflags, log, timeout_s)
            finally:
                clock.add("link", time.monotonic() - t)

    return Timed()


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def build_once(name: str, cost, specs: list, args: argparse.Namespace, root: Path,
               light_host: bool = True) -> dict:
    """Build `specs` cold into a fresh cache under `root` with the plan of `cost`."""
    from verifier.compile.builder import BuildContext, Builder
    from verifier.compile.compile_plan import compile_all

    clock = PhaseClock()
    # load_memory_mb=0: as `verify_batch` has it for CUDA (the driver maps huge ranges)
    ctx = BuildContext(timed_backend(clock), root / name, check_import=args.import_check,
                       timeout_s=args.timeout, load_memory_mb=0, light_host=light_host)
    builder = Builder(ctx)
    check = builder._check_import

    def timed_check(so: Path, module: str) -> tuple[bool, str]:
        t = time.monotonic()
        try:
            return check(so, module)
        finally:
            clock.add("import", time.monotonic() - t)

    builder._check_import = timed_check  # type: ignore[method-assign]
    landed: dict = {}
    lock = threading.Lock()

    def on_ready(res: dict) -> None:
        with lock:
            landed.update({k: (v, time.monotonic()) for k, v in res.items()})

    cpu0, t0 = children_cpu(), time.monotonic()
    units, records = compile_all(builder, [s for _, s in specs], args.workers, args.most,
                                 on_ready, cost)
    wall, cpu = time.monotonic() - t0, children_cpu() - cpu0
    outcomes = {}
    for cid, s in specs:
        res = landed.get(s.key, (None, 0.0))[0]
        err = "" if res is None or res.ok else next(
            (ln for ln in res.log.splitlines() if "error" in ln), res.log.strip()[:200])
        outcomes[cid] = "missing" if res is None else ("built" if res.ok else err[:200])
    built = sum(v == "built" for v in outcomes.values())
    lands = sorted(t - t0 for _, t in landed.values())
    return {"config": name, "plan": [len(u) for u in units], "units_built": len(records),
            "rebuilds": sum(r.rebuild for r in records), "wall_s": wall, "cpu_s": cpu,
            "built": built, "n": len(specs), "first_land_s": lands[0] if lands else None,
            "phase_s": clock.secs, "phase_n": clock.count, "outcomes": outcomes,
            "per_core_hour": built * 3600 / (wall * args.cores) if wall else 0.0,
            "per_cpu_hour": built * 3600 / cpu if cpu else 0.0}


def table(runs: list[dict], args: argparse.Namespace) -> str:
    """The markdown report of the runs."""
    head = ["config", "plan (specs a unit)", "wall s", "compiler CPU s", "CPU s a candidate",
            "first landed s", *(f"{p} s (n)" for p in PHASES), "built", "per core-hour",
            "per CPU-hour"]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in runs:
        phases = [f"{r['phase_s'][p]:.1f} ({r['phase_n'][p]})" for p in PHASES]
        rows.append("| " + " | ".join([
            r["config"], ",".join(map(str, r["plan"])), f"{r['wall_s']:.1f}",
            f"{r['cpu_s']:.1f}", f"{r['cpu_s'] / max(1, r['n']):.1f}",
            f"{r['first_land_s']:.1f}" if r["first_land_s"] is not None else "-", *phases,
            f"{r['built']}/{r['n']}", f"{r['per_core_hour']:.0f}",
            f"{r['per_cpu_hour']:.0f}"]) + " |")
    same = len({json.dumps(r["outcomes"], sort_keys=True) for r in runs}) == 1
    lines = [f"# build_speed: {runs[0]['n']} KernelBench corpus candidates, cold, "
             f"{args.workers} compile workers, {args.cores} cores",
             "", f"`python -m benchmarks.build_speed {' '.join(sys.argv[1:])}`", "", *rows, "",
             f"outcomes identical across configs: {'yes' if same else 'NO'}"]
    if not same:
        for cid in runs[0]["outcomes"]:
            vals = {r["config"]: r["outcomes"][cid] for r in runs}
            if len(set(vals.values())) > 1:
                lines.append(f"- {cid}: {vals}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.build_speed",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4, help="candidates to build")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 2,
                    help="cores the per-core-hour figure divides by")
    ap.add_argument("--most", type=int, default=16, help="most specs a unit (--compile-batch)")
    ap.add_argument("--configs", default="old,new")
    ap.add_argument("--import-check", action="store_true",
                    help="import each object in the sandbox (needs torch with CUDA)")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--work-dir", type=Path, default=None, help="caches (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=None, help="write the table (and .json) here")
    args = ap.parse_args(argv)
    from verifier.compile.compile_plan import CostModel

    # old: no contention term (the effective parallelism is the workers, as the plan assumed)
    configs = {"old": (CostModel(parallel_eff=1.0, cores=max(1, args.workers)), True),
               "new": (CostModel(cores=args.cores), True),
               "fullhost": (CostModel(cores=args.cores), False)}
    names = [c for c in args.configs.split(",") if c]
    unknown = [c for c in names if c not in configs]
    if unknown:
        ap.error(f"--configs: unknown {', '.join(unknown)} (known: {', '.join(configs)})")
    specs = corpus_specs(args.n)
    root = args.work_dir or Path(tempfile.mkdtemp(prefix="ks-build-speed-"))
    runs = []
    for name in names:
        print(f"[build_speed] {name}: {len(specs)} candidates, {args.workers} workers",
              file=sys.stderr, flush=True)
        cost, light = configs[name]
        runs.append(build_once(name, cost, specs, args, root, light_host=light))
        r = runs[-1]
        print(f"[build_speed] {name}: plan {r['plan']}, {r['built']}/{r['n']} built, wall "
              f"{r['wall_s']:.1f}s, CPU {r['cpu_s']:.1f}s", file=sys.stderr, flush=True)
    text = table(runs, args)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
        args.out.with_suffix(".json").write_text(json.dumps(runs, indent=1), encoding="utf-8")
    return 0 if len({json.dumps(r["outcomes"], sort_keys=True) for r in runs}) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
