"""Tasks from real research code: PyPI packages ingested as repositories, then the tasks stage.

Each package's wheel (`pip download --no-deps`) is unpacked into a git repository (the tree a
clone would give), ingested with the repository ingest (`sources.git_repos.iter_repo_modules`)
and built into tasks with `extract_tasks` + `curate_tasks` (what `kernelsynth tasks build`
runs). Printed per package: modules, valid tasks, distinct tasks, yield (distinct / modules),
the top rejection reasons, wall time. Two runs (code before and after a change) are compared
with `--table`:

    nice -n 10 .venv/bin/python -m benchmarks.ingest_packages --json /tmp/after.json
    .venv/bin/python -m benchmarks.ingest_packages --table before=/tmp/b.json after=/tmp/a.json \
        --out benchmarks/results/ingest_packages.txt
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from pathlib import Path

# (PyPI name, folder inside the wheel that is ingested, license of the package)
PACKAGES = [
    ("timm", "timm", "Apache-2.0"),
    ("torchvision", "torchvision/models", "BSD-3-Clause"),
    ("x-transformers", "x_transformers", "MIT"),
    ("denoising-diffusion-pytorch", "denoising_diffusion_pytorch", "MIT"),
]


def wheel_repo(name: str, pkg_dir: Path) -> Path:
    """The package's wheel unpacked into a one-commit git repository (cached in pkg_dir)."""
    stem = name.replace("-", "_")
    repo = pkg_dir / "repos" / stem
    if (repo / ".git").exists():
        return repo
    wheels = sorted(pkg_dir.glob(f"{stem}-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d",
                        str(pkg_dir), name], check=True)
        wheels = sorted(pkg_dir.glob(f"{stem}-*.whl"))
    repo.mkdir(parents=True)
    with zipfile.ZipFile(wheels[-1]) as zf:
        zf.extractall(repo, [n for n in zf.namelist() if n.endswith(".py")])
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
    subprocess.run(git + ["init", "-q"], cwd=repo, check=True)
    subprocess.run(git + ["add", "-A"], cwd=repo, check=True)
    subprocess.run(git + ["commit", "-q", "-m", wheels[-1].name], cwd=repo, check=True)
    return repo


def run_package(name: str, sub: str, spdx: str, pkg_dir: Path, sample: int, workers: int
                ) -> dict:
    """Ingest + tasks stage over one package; the figures of the table."""
    from pipeline.config import TasksConfig
    from pipeline.tasks.curate.curate import curate_tasks
    from pipeline.tasks.extract import extract_tasks
    from schemas import RawModule, Rejection
    from sources.git_repos import RepoSpec, iter_repo_modules

    repo = wheel_repo(name, pkg_dir)
    start = time.perf_counter()
    spec = RepoSpec(url=str(repo), paths=[f"{sub}/*.py"], license=spdx)
    with tempfile.TemporaryDirectory() as cache:
        items = list(iter_repo_modules(spec, Path(cache), allowlist=[spdx]))
    modules = [m for m in items if isinstance(m, RawModule)]
    total = len(modules)
    if sample and total > sample:  # every k-th class, the same ones in every run
        step = total / sample
        modules = [modules[int(i * step)] for i in range(sample)]
    cfg = TasksConfig(workers=workers)
    tasks, rejections = extract_tasks(modules, cfg)
    kept, dropped = curate_tasks(tasks, cfg, [])
    reasons = Counter(r.reason for r in rejections + dropped if isinstance(r, Rejection))
    details = Counter(_detail_class(r.reason, r.detail) for r in rejections)
    return {"package": name, "classes": total, "modules": len(modules), "valid": len(tasks),
            "distinct": len(kept), "seconds": round(time.perf_counter() - start, 1),
            "reasons": dict(reasons.most_common()), "details": dict(details.most_common(15)),
            "einops_tasks": sum(_imports_einops(t.source) for t in kept)}


def _imports_einops(source: str) -> bool:
    """True when a task file imports einops (a published task must import torch alone)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "einops"
                                                for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "einops":
            return True
    return False


def _detail_class(reason: str, detail: str) -> str:
    """A rejection's reason with the first words of its detail (the missing name, the error)."""
    tail = detail.split(": ", 1)[-1]  # the detail starts with the module's path:class
    return f"{reason}: {' '.join(tail.split())[:90]}"


def render(runs: dict[str, list[dict]]) -> str:
    """One table, one row per package and measure, one column per labelled run."""
    labels = list(runs)
    lines = ["package            measure         " + "".join(f"{lb:>12}" for lb in labels)]
    by_pkg = {lb: {r["package"]: r for r in rows} for lb, rows in runs.items()}
    for name, _, _ in PACKAGES:
        first = next((by_pkg[lb][name] for lb in labels if name in by_pkg[lb]), None)
        if first is None:
            continue
        for key in ("classes", "modules", "valid", "distinct", "yield", "seconds",
                    "einops_tasks"):
            cells = []
            for lb in labels:
                r = by_pkg[lb].get(name)
                if r is None:
                    cells.append(f"{'-':>12}")
                elif key == "yield":
                    cells.append(f"{r['distinct'] / max(1, r['modules']):>12.1%}")
                else:
                    cells.append(f"{r[key]:>12}")
            lines.append(f"{name[:18]:<19}{key:<16}" + "".join(cells))
        lines.append("")
    totals = {lb: (sum(r["modules"] for r in rows), sum(r["distinct"] for r in rows))
              for lb, rows in runs.items()}
    lines.append("all packages       yield           " + "".join(
        f"{d / max(1, m):>12.1%}" for m, d in totals.values()))
    for lb, rows in runs.items():
        lines.append(f"\ntop rejection reasons ({lb}):")
        merged: Counter[str] = Counter()
        for r in rows:
            merged.update(r["details"])
        lines.extend(f"  {n:5d}  {k}" for k, n in merged.most_common(12))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pkg-dir", type=Path, default=Path("/tmp/ks-pkgs"))
    parser.add_argument("--sample", type=int, default=0,
                        help="at most this many classes per package (0: all)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=None, help="package names")
    parser.add_argument("--json", type=Path, help="write this run's figures here")
    parser.add_argument("--table", nargs="*", metavar="LABEL=JSON",
                        help="render runs written with --json side by side")
    parser.add_argument("--out", type=Path, help="write the table here as well")
    parser.add_argument("--note", action="append", default=[],
                        help="a line written above the table (how it was measured)")
    args = parser.parse_args()
    if args.table:
        runs = {pair.split("=", 1)[0]: json.loads(Path(pair.split("=", 1)[1]).read_text())
                for pair in args.table}
    else:
        rows = []
        for name, sub, spdx in PACKAGES:
            if args.only and name not in args.only:
                continue
            rows.append(run_package(name, sub, spdx, args.pkg_dir, args.sample, args.workers))
            print(json.dumps(rows[-1]), flush=True)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        runs = {"this run": rows}
    text = "".join(f"# {line}\n" for line in args.note) + render(runs)
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
