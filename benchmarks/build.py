"""Wall time per stage of the default `kernelsynth build`, re-run time, and the Ray runner.

    .venv/bin/python benchmarks/build.py [--root DIR] [--ray-tasks N] [--skip-ray]

1. the default build (built-in config, backend auto) on a fresh workspace: seconds and new
   records per second for every stage;
2. the same command again with nothing new (the re-run time);
3. local runner (baseline) against the Ray runner (prefect-ray, a local Ray instance) on the same
   input: two fresh workspaces seeded with the first build's tasks (at most --ray-tasks of them),
   sharing its compile cache, each running generate -> verify -> mutate -> repair -> publish.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# `python benchmarks/build.py` puts benchmarks/ first on sys.path, where select.py would shadow
# the standard library's `select`; the repository root goes there instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "benchmarks"]
sys.path.insert(0, str(REPO))

NEW_KEY = {"ingest": "modules", "tasks": "tasks", "generate": "candidates", "mutate": "candidates",
           "repair": "candidates", "verify": "verdicts", "publish": "published"}


def new_records(row: dict) -> int:
    """The records a stage row added (modules, tasks, candidates or verdicts)."""
    key = NEW_KEY[row["stage"].split(":")[0]]
    return int(row.get(key, row.get("raw_modules", 0)) or 0)


def table(title: str, summaries: dict[str, dict]) -> None:
    names = list(summaries)
    print(f"\n{title}")
    head = f"{'stage':<16}" + "".join(f"{n + ' s':>14}{n + ' rec/s':>16}" for n in names)
    print(head)
    print("-" * len(head))
    stages = [r["stage"] for r in summaries[names[0]]["stages"]]
    for st in stages:
        line = f"{st:<16}"
        for n in names:
            row = next((r for r in summaries[n]["stages"] if r["stage"] == st), None)
            if row is None:
                line += f"{'-':>14}{'-':>16}"
                continue
            rec = new_records(row)
            rate = rec / row["seconds"] if row["seconds"] > 0 and rec else 0.0
            line += f"{row['seconds']:>14.1f}{rate:>16.2f}"
        print(line)
    line = f"{'total (wall)':<16}" + "".join(
        f"{summaries[n]['wall_s']:>14.1f}{'':>16}" for n in names)
    print(line)


def run_build(workspace: Path, config: Path | None = None, **kw: object) -> dict:
    from flows.build import build_dataset

    t0 = time.perf_counter()
    summary = build_dataset(workspace=str(workspace), config=str(config) if config else None,
                            **kw)
    summary["wall_s"] = time.perf_counter() - t0
    return summary


def seed_workspace(src: Path, dst: Path, max_tasks: int) -> None:
    """A fresh workspace holding the first `max_tasks` tasks of `src` (and their modules)."""
    from pipeline.workspace import Workspace
    from schemas import RawModule, Task

    ws_src, ws_dst = Workspace(src), Workspace(dst)
    tasks = sorted(ws_src.read(Task), key=lambda t: t.task_id)[:max_tasks]
    keep = {t.module_id for t in tasks}
    run = ws_dst.new_run("seed")
    run.write([m for m in ws_src.read(RawModule) if m.module_id in keep])
    run.write(tasks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=None, help="where the workspaces go")
    ap.add_argument("--ray-tasks", type=int, default=12)
    ap.add_argument("--skip-ray", action="store_true")
    ap.add_argument("--only-ray", action="store_true",
                    help="reuse <root>/default from an earlier run; measure only step 3")
    ap.add_argument("--json", type=Path, default=None, help="also write the summaries here")
    args = ap.parse_args()
    root = args.root or Path(tempfile.mkdtemp(prefix="ks-bench-build-"))
    root.mkdir(parents=True, exist_ok=True)
    from flows.env import configure_prefect

    configure_prefect(root)
    results: dict[str, dict] = {}
    default_ws = root / "default"
    if not args.only_ray:
        shutil.rmtree(default_ws, ignore_errors=True)
        print(f"default build in {default_ws} ...", flush=True)
        results["first"] = run_build(default_ws)
        print("re-run with nothing new ...", flush=True)
        results["rerun"] = run_build(default_ws)
        table("default build (local runner) and the re-run", {"first": results["first"],
                                                              "rerun": results["rerun"]})
        f = results["first"]["funnel"]
        print(f"\nfunnel: {json.dumps(f)}")
        print(f"version: {results['first']['version']} at {results['first']['path']}; re-run "
              f"published={results['rerun']['published']} in {results['rerun']['wall_s']:.1f} s")

    if not args.skip_ray:
        import yaml

        cache = default_ws / "cache"
        cfg = root / "bench.yaml"
        cfg.write_text(yaml.safe_dump({"sources": {"seed_corpus": False, "transformers_sample": 0,
                                                   "nnsmith": {"count": 0}},
                                       "verify": {"build_cache_dir": str(cache / "builds"),
                                                  "baseline_cache_dir": str(cache / "baselines")},
                                       "flows": {"ray_num_cpus": 2}}))
        for name, runner in (("local", "local"), ("ray", "ray")):
            ws = root / f"seeded-{name}"
            shutil.rmtree(ws, ignore_errors=True)
            seed_workspace(default_ws, ws, args.ray_tasks)
            print(f"{name} runner on {args.ray_tasks} seeded tasks ...", flush=True)
            results[name] = run_build(ws, cfg, runner=runner)
        table(f"local (baseline) vs Ray runner, {args.ray_tasks} tasks, warm compile cache",
              {"local": results["local"], "ray": results["ray"]})
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
