"""CLI start-up: importing the command line (and its plugins) loads no heavy library."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "prefect", "datasets", "polars", "duckdb", "huggingface_hub", "pyarrow",
         "matplotlib", "libcst")


def _loaded_after(code: str) -> list[str]:
    probe = (f"import sys\n{code}\n"
             f"print('loaded:', *(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)")
    res = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin"})
    assert res.returncode == 0, res.stderr
    line = [ln for ln in res.stderr.splitlines() if ln.startswith("loaded:")]
    assert len(line) == 1, res.stderr
    return line[0].split()[1:]


def test_importing_the_cli_loads_no_heavy_library() -> None:
    assert _loaded_after("import pipeline.cli\npipeline.cli.load_plugins()") == []


def test_help_and_config_show_load_no_heavy_library() -> None:
    run = ("import pipeline.cli, sys\nsys.argv = ['kernelsynth', {!r}]\n"
           "try:\n    pipeline.cli.main()\nexcept SystemExit:\n    pass")
    assert _loaded_after(run.format("--help")) == []
    config_show = run.replace("{!r}]", "'config', 'show']")
    assert _loaded_after(config_show) == []


def test_stats_loads_only_the_data_libraries_it_reads_with(tmp_path: Path) -> None:
    # stats reads Parquet (pyarrow) and refreshes catalog.duckdb; nothing else is loaded
    code = ("import pipeline.cli, sys\n"
            f"sys.argv = ['kernelsynth', 'stats', '--workspace', {str(tmp_path / 'ks')!r}]\n"
            "try:\n    pipeline.cli.main()\nexcept SystemExit as exc:\n"
            "    assert not exc.code, exc.code")
    loaded = _loaded_after(code)
    assert "duckdb" in loaded and "pyarrow" in loaded, loaded  # it did read the workspace
    assert set(loaded) <= {"duckdb", "pyarrow"}, loaded
    assert (tmp_path / "ks" / "catalog.duckdb").is_file()


def test_startup_benchmark_prints_commands_and_baselines(tmp_path: Path) -> None:
    out = tmp_path / "startup.md"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cli_startup.py"),
                          "--repeat", "1", "--out", str(out)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    rows = {ln.split("|")[1].strip(): [float(x) for x in ln.split("|")[2:5]]
            for ln in out.read_text().splitlines() if ln.startswith("| ") and "---" not in ln
            and not ln.startswith("| command")}
    assert set(rows) == {"baseline: python -c pass", "baseline: eager imports (before)",
                         "kernelsynth --help", "kernelsynth config show", "kernelsynth stats"}
    assert all(v > 0 for vals in rows.values() for v in vals), rows
    assert out.read_text() in res.stdout + "\n" and "cores" in res.stdout
    # the CLI pays less CPU than importing the libraries it no longer loads eagerly
    assert rows["kernelsynth --help"][2] < rows["baseline: eager imports (before)"][2], rows


def test_generator_names_in_help_are_the_generators() -> None:
    from pipeline.candidates.generate import GENERATORS
    from pipeline.cli.generate import GENERATOR_NAMES

    assert GENERATOR_NAMES == GENERATORS
