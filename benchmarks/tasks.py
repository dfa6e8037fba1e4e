"""Benchmark: the tasks stage on the installed transformers tree (and the seed corpus baseline).

Finds every nn.Module class in `transformers/models/*/modeling_*.py`, runs `extract_tasks` and
`curate_tasks` on them with the configured workers, and prints: classes found, tasks before and
after dedup, yield, time per module, and the reason histogram of rejections. Baseline measured in
the same run: a fresh sandboxed interpreter per module (`taskfile.inspect_task_source`, what a
naive stage does) against the fork-server probe, on the same complete task files.

    .venv/bin/python benchmarks/tasks.py                 # the whole tree
    .venv/bin/python benchmarks/tasks.py --models 40     # the first 40 model folders
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent))

import argparse  # noqa: E402
import ast  # noqa: E402
import importlib.util  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402

from pipeline.config import TasksConfig  # noqa: E402
from pipeline.tasks.carve.carve import _is_module_class  # noqa: E402
from pipeline.tasks.carve.closure import parse_file  # noqa: E402
from pipeline.tasks.curate.curate import curate_tasks  # noqa: E402
from pipeline.tasks.extract import extract_tasks  # noqa: E402
from pipeline.tasks.taskfile import inspect_task_source  # noqa: E402
from schemas import RawModule, Rejection  # noqa: E402


def transformers_modules(limit_models: int | None, per_model: int | None, every: int = 1
                         ) -> list[RawModule]:
    """Every nn.Module class of the installed transformers modeling files."""
    spec = importlib.util.find_spec("transformers")
    assert spec and spec.origin, "transformers is not installed"
    root = Path(spec.origin).parent
    folders = sorted(p for p in (root / "models").iterdir() if p.is_dir())
    folders = folders[::max(1, every)]
    if limit_models:
        folders = folders[:limit_models]
    out = []
    for folder in folders:
        for path in sorted(folder.glob("modeling_*.py")):
            if path.name.startswith(("modeling_tf_", "modeling_flax_")):
                continue
            code = path.read_text(encoding="utf-8")
            rel = str(path.relative_to(root))
            try:
                info = parse_file(rel, code)
            except SyntaxError:
                continue
            found = 0
            for node in info.tree.body:
                if isinstance(node, ast.ClassDef) and _is_module_class(info, node):
                    out.append(RawModule(
                        RawModule.make_id("transformers", "pypi:transformers", "", rel, node.name,
                                          code), "transformers", "pypi:transformers", "", rel,
                        "Apache-2.0", node.name, code, node.lineno, node.end_lineno or 0))
                    found += 1
                    if per_model and found >= per_model:
                        break
    return out


def _cpu_s() -> float:
    """CPU seconds of this process and its reaped children (the sandboxed probes)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _load() -> float:
    import os

    return os.getloadavg()[0]


def seed_modules() -> list[RawModule]:
    root = Path(__file__).resolve().parents[1] / "sources" / "seed"
    return [RawModule(f"seed-{p.stem}", "seed", "", "", str(p.relative_to(root.parents[1])),
                      "MIT", "Model", p.read_text(encoding="utf-8"))
            for p in sorted(root.glob("*.py")) if p.name != "__init__.py"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=int, default=None, help="only the first N model folders")
    ap.add_argument("--per-model", type=int, default=None, help="at most N classes per file")
    ap.add_argument("--every", type=int, default=1, help="every k-th model folder (a sample)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--baseline", type=int, default=12, help="seed files for the baseline")
    args = ap.parse_args()
    cfg = TasksConfig(workers=args.workers, timeout_s=args.timeout)

    seeds = seed_modules()[: args.baseline]
    t0 = time.monotonic()
    for m in seeds:
        inspect_task_source(m.code, m.path, timeout_s=args.timeout, scale=True)
    naive = (time.monotonic() - t0) / max(1, len(seeds))
    t0 = time.monotonic()
    seed_tasks, _ = extract_tasks(seeds, cfg)
    fork = (time.monotonic() - t0) / max(1, len(seeds))

    modules = transformers_modules(args.models, args.per_model, args.every)
    cpu0 = _cpu_s()
    t0 = time.monotonic()
    seen = [0, 0]

    def progress(_m: RawModule, item: object) -> None:
        seen[0] += 1
        seen[1] += not isinstance(item, Rejection)
        if seen[0] % 250 == 0:
            print(f"  {seen[0]}/{len(modules)} modules, {seen[1]} tasks, "
                  f"{time.monotonic() - t0:.0f}s", file=sys.stderr, flush=True)

    tasks, rejections = extract_tasks(modules, cfg, on_result=progress)
    extract_s = time.monotonic() - t0
    extract_cpu = _cpu_s() - cpu0  # the probe workers are reaped when extract_tasks returns
    t0 = time.monotonic()
    kept, dropped = curate_tasks(tasks, cfg, [])
    curate_s = time.monotonic() - t0

    rows = [
        ("baseline: fresh sandboxed interpreter per module (s/module)", f"{naive:.3f}"),
        ("fork-server probe incl. start, same files (s/module)", f"{fork:.3f}"),
        ("transformers model folders", str(len({Path(m.path).parent for m in modules}))),
        ("nn.Module classes found", str(len(modules))),
        ("valid tasks before dedup", str(len(tasks))),
        ("yield before dedup", f"{len(tasks) / max(1, len(modules)):.1%}"),
        ("distinct tasks after dedup", str(len(kept))),
        ("extract wall time (s)", f"{extract_s:.1f}"),
        ("time per module (s, wall / modules)", f"{extract_s / max(1, len(modules)):.3f}"),
        ("extract CPU time, host + sandboxes (s)", f"{extract_cpu:.1f}"),
        ("CPU s per module", f"{extract_cpu / max(1, len(modules)):.3f}"),
        ("projected wall on 2 idle cores (s)", f"{extract_cpu / 2:.0f}"),
        ("load average during the run (1 min)", f"{_load():.1f}"),
        ("curate wall time (s)", f"{curate_s:.1f}"),
        ("level 1/2/3", "/".join(str(sum(t.level == k for t in kept)) for k in (1, 2, 3))),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'metric'.ljust(width)}  value")
    for k, v in rows:
        print(f"{k.ljust(width)}  {v}")
    print("\nrejection reasons (extract + curate):")
    for reason, n in Counter(r.reason for r in rejections + dropped).most_common():
        print(f"  {reason:<28} {n}")
    print(f"\n(seed baseline tasks: {len(seed_tasks)} of {len(seeds)})")


if __name__ == "__main__":
    main()
