"""CLI start-up time: `kernelsynth --help`, `config show` and `stats`, against baselines.

    python benchmarks/cli_startup.py [--repeat 5] [--workspace DIR] [--out FILE.md]

Each command runs `--repeat` times as a fresh process (`python -m pipeline.cli ...`, what the
`kernelsynth` entry point runs) and is timed by wall clock and by the CPU seconds the child used
(user + system, from getrusage), so a loaded shared machine shows up as wall >> CPU. Two
baselines run in the same session, interleaved with the commands: the bare interpreter
(`python -c pass`, the floor) and importing the libraries that start-up used to load eagerly
(torch, prefect, datasets, polars, duckdb, pyarrow, huggingface_hub), what each command paid
before imports were made lazy. `stats` runs on an empty workspace unless `--workspace` names one
(it refreshes that workspace's catalog.duckdb). The table states the machine: cores and the load
average before and after.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EAGER = "import torch, prefect, datasets, polars, duckdb, pyarrow, huggingface_hub"


def timed(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, child CPU seconds) of one run of `argv`; a failed run stops the benchmark."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        raise SystemExit(f"cli_startup: {' '.join(argv)} exited {res.returncode}: "
                         f"{res.stderr.strip()[-400:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def cases(workspace: Path) -> list[tuple[str, list[str]]]:
    """(label, argv) of the baselines and the commands, in the order each round runs them."""
    py, cli = sys.executable, [sys.executable, "-m", "pipeline.cli"]
    return [("baseline: python -c pass", [py, "-c", "pass"]),
            ("baseline: eager imports (before)", [py, "-c", EAGER]),
            ("kernelsynth --help", cli + ["--help"]),
            ("kernelsynth config show", cli + ["config", "show"]),
            ("kernelsynth stats", cli + ["stats", "--workspace", str(workspace)])]


def measure(workspace: Path, repeat: int) -> dict[str, list[tuple[float, float]]]:
    """Every case `repeat` times, round-robin, so load that comes and goes hits all alike."""
    runs: dict[str, list[tuple[float, float]]] = {}
    for label, argv in cases(workspace):  # one untimed run each: the page cache is warm
        timed(argv)
        runs[label] = []
    for _ in range(repeat):
        for label, argv in cases(workspace):
            runs[label].append(timed(argv))
    return runs


def table(runs: dict[str, list[tuple[float, float]]], load: tuple[float, float]) -> str:
    """The Markdown table: median and max wall, median CPU, per case; the machine above it."""
    n = len(next(iter(runs.values())))
    lines = [f"Machine: {os.cpu_count()} cores ({platform.machine()}, {platform.system()}), "
             f"load average {load[0]:.2f} before, {load[1]:.2f} after; Python "
             f"{platform.python_version()}; {n} runs each, round-robin.", "",
             "| command | wall median (s) | wall max (s) | CPU median (s) |",
             "| --- | --- | --- | --- |"]
    for label, samples in runs.items():
        walls, cpus = [w for w, _ in samples], [c for _, c in samples]
        lines.append(f"| {label} | {statistics.median(walls):.2f} | {max(walls):.2f} | "
                     f"{statistics.median(cpus):.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workspace", type=Path, help="workspace for `stats` (default: empty)")
    ap.add_argument("--out", type=Path, help="also write the table to this file")
    a = ap.parse_args(argv)
    if a.repeat < 1:
        ap.error("--repeat must be >= 1")
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ks-startup-") as tmp:
        runs = measure(a.workspace or Path(tmp) / "ks-data", a.repeat)
    text = table(runs, (load_before, os.getloadavg()[0]))
    print(text)
    if a.out:
        a.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
