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


def test_generator_names_in_help_are_the_generators() -> None:
    from pipeline.candidates.generate import GENERATORS
    from pipeline.cli.generate import GENERATOR_NAMES

    assert GENERATOR_NAMES == GENERATORS
