"""The HTML report (embedded PNG plots) and the exploration notebook, run top to bottom."""

from __future__ import annotations

import base64
import importlib.util
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.config import Config
from pipeline.datasets.publish import publish_workspace
from pipeline.datasets.report import render_report
from pipeline.datasets.versions import VersionIntegrityError
from pipeline.workspace import Workspace
from tests.pipeline.ks_synthetic import fill_workspace

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


@pytest.fixture
def version(workspace: Workspace) -> Path:
    fill_workspace(workspace, n_tasks=4)
    return publish_workspace(workspace, Config(workspace=str(workspace.root)))


def test_report_embeds_png_plots_and_the_numbers(version: Path) -> None:
    page = render_report(version)
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) >= 8  # subsets, funnel, 4 pass-rate slices, speedups, compile errors
    assert all(base64.b64decode(img)[:8] == b"\x89PNG\r\n\x1a\n" for img in images)
    stats = json.loads((version / "stats.json").read_text())
    assert f"<td>correct</td><td>{stats['funnel']['correct']}</td>" in page
    assert "pass rate by generator" in page and "compile-error taxonomy" in page
    assert "<td>pass@1</td>" in page


def test_cli_report_writes_outside_the_version(version: Path, workspace: Workspace,
                                                tmp_path: Path) -> None:
    out = tmp_path / "r" / "report.html"
    res = CliRunner().invoke(app, ["report", "--version", "v1", "--out", str(out),
                                   "-w", str(workspace.root)])
    assert res.exit_code == 0, res.output
    assert out.read_text().startswith("<!doctype html>")
    res = CliRunner().invoke(app, ["report", "--version", "v1", "-w", str(workspace.root)])
    assert res.exit_code == 0 and (version.parent / "v1-report.html").is_file()
    (version / "stats.json").write_text("{}")
    with pytest.raises(VersionIntegrityError, match="stats.json: content hash mismatch"):
        render_report(version)
    res = CliRunner().invoke(app, ["report", "--version", "v1", "-w", str(workspace.root)])
    assert res.exit_code == 1 and "content hash mismatch" in res.output


def test_cli_report_defaults_to_the_latest_version(workspace: Workspace, tmp_path: Path) -> None:
    empty = CliRunner().invoke(app, ["report", "-w", str(tmp_path / "empty")])
    assert empty.exit_code == 1 and "no published version of 'kernelsynth'" in empty.output
    fill_workspace(workspace, n_tasks=3)
    cfg = Config(workspace=str(workspace.root))
    first, second = publish_workspace(workspace, cfg), publish_workspace(workspace, cfg)
    res = CliRunner().invoke(app, ["report", "-w", str(workspace.root)])
    assert res.exit_code == 0, res.output
    assert res.stdout.replace("\n", "") == str(second.parent / "v2-report.html")  # rich wraps
    assert (second.parent / "v2-report.html").is_file()
    assert not (first.parent / "v1-report.html").exists()


def test_notebook_runs_top_to_bottom_on_the_latest_version(workspace: Workspace,
                                                           version: Path, tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("run_notebook", NOTEBOOKS / "run_notebook.py")
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    publish_workspace(workspace, Config(workspace=str(workspace.root)))  # v2 is the latest
    nb = runner.run_notebook(workspace.root, out=tmp_path / "executed.ipynb", timeout=120)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    text = "".join(o.get("text", "") for o in outputs)
    assert "kernelsynth v2 (parent v1)" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)
    assert not any(o.get("output_type") == "error" for o in outputs)
    assert (tmp_path / "executed.ipynb").is_file()
    # Pinning a version through the parameters opens that one instead of the latest.
    nb = runner.run_notebook(workspace.root, version="v1", timeout=120)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.outputs)
    assert "kernelsynth v1 (parent None)" in text
