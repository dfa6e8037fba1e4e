"""catalog.duckdb right after publishing: every view, relative paths, README's queries."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import duckdb
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.config import Config
from pipeline.datasets.catalog import open_catalog
from pipeline.datasets.publish import publish_workspace
from pipeline.datasets.rows import CONFIGS
from pipeline.datasets.versions import read_version
from pipeline.workspace import Workspace
from schemas import Verdict
from tests.pipeline.ks_synthetic import fill_workspace

README = Path(__file__).parents[2] / "README.md"


def _readme_queries() -> list[str]:
    lines = [ln for ln in README.read_text(encoding="utf-8").splitlines()
             if ln.startswith('kernelsynth sql "select') and "catalog" not in ln]
    return [ln[len('kernelsynth sql "'):-1] for ln in lines if " ds_" in ln or " ws_" in ln
            or "versions" in ln]


def _published_then_moved(tmp_path: Path) -> tuple[Workspace, list[Path]]:
    ws = Workspace(tmp_path / "ws")
    fill_workspace(ws, n_tasks=3)
    cfg = Config(workspace=str(ws.root))
    versions = [publish_workspace(ws, cfg), publish_workspace(ws, cfg)]
    moved = tmp_path / "elsewhere" / "ks-data"
    moved.parent.mkdir()
    shutil.move(ws.root, moved)
    return Workspace(moved), [moved / v.relative_to(ws.root) for v in versions]


def _every_view_answers(catalog: Path) -> dict[str, int]:
    """Row counts of every view, through plain duckdb (no search path, nothing attached)."""
    con = duckdb.connect(str(catalog), read_only=True)
    try:
        views = [r[0] for r in con.execute(
            "SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()]
        return {v: con.execute(f'SELECT count(*) FROM "{v}"').fetchone()[0] for v in views}
    finally:
        con.close()


def test_catalog_opens_with_plain_duckdb_from_any_directory(tmp_path: Path, monkeypatch) -> None:
    ws = Workspace(tmp_path / "project" / "ks-data")
    fill_workspace(ws, n_tasks=3)
    version = publish_workspace(ws, Config(workspace=str(ws.root)))
    published = json.loads((version / "manifest.json").read_text())["configs"]
    for cwd in (ws.root.parent, tmp_path, Path("/")):  # project root, elsewhere, the root
        monkeypatch.chdir(cwd)
        counts = _every_view_answers(ws.catalog_path.relative_to(cwd) if cwd != Path("/")
                                     else ws.catalog_path)
        assert {f"ds_{c}" for c in published} <= set(counts), counts
        for config in published:
            assert counts[f"ds_{config}"] == read_version(version)[config].num_rows, config
        assert counts["ws_verdicts"] == ws.read_table(Verdict).num_rows


def test_views_exist_right_after_publish_and_survive_a_move(tmp_path: Path, monkeypatch) -> None:
    ws, versions = _published_then_moved(tmp_path)
    open_catalog(ws).close()  # what any kernelsynth command does first: views follow the move
    monkeypatch.chdir(tmp_path)  # neither the old nor the new workspace
    assert set(_every_view_answers(ws.catalog_path)) >= {"ds_sft", "ws_verdicts"}
    con = duckdb.connect(str(ws.catalog_path), read_only=True)
    try:
        views = {r[0] for r in con.execute(
            "SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
        published = set(json.loads((versions[0] / "manifest.json").read_text())["configs"])
        assert {f"ds_{c}" for c in published} <= views
        assert {f"ds_{c}" for c in CONFIGS if c not in published}.isdisjoint(views)
        assert {f"ws_{t}" for t in ("tasks", "candidates", "verdicts", "rejections")} <= views
        paths = [r[0] for r in con.execute(
            "SELECT path FROM versions ORDER BY version").fetchall()]
        assert paths == ["datasets/kernelsynth/v1", "datasets/kernelsynth/v2"]
        for config in published:
            local = read_version(versions[1])[config]
            got = con.execute(f"SELECT count(*) FROM ds_{config} WHERE version = 'v2'").fetchone()
            assert got[0] == local.num_rows, config
        n = con.execute("SELECT count(*) FROM ws_verdicts").fetchone()[0]
        assert n == ws.read_table(Verdict).num_rows
    finally:
        con.close()


def test_readme_queries_work_as_written(tmp_path: Path) -> None:
    ws, versions = _published_then_moved(tmp_path)
    queries = _readme_queries()
    assert len(queries) == 3, queries
    runner = CliRunner()
    answers = []
    for query in queries:
        res = runner.invoke(app, ["sql", query, "--json", "-w", str(ws.root)])
        assert res.exit_code == 0, (query, res.output)
        answers.append([json.loads(line) for line in res.stdout.splitlines() if line.strip()])
    sft = {v.name: read_version(v)["sft"] for v in versions}
    assert answers[0] == [{"version": name, "rows": t.num_rows,
                           "tasks": len(set(t.column("task_id").to_pylist()))}
                          for name, t in sft.items()]
    statuses = Counter(ws.read_table(Verdict).column("status").to_pylist())
    assert {a["status"]: a["n"] for a in answers[1]} == dict(statuses)
    manifests = [json.loads((v / "manifest.json").read_text()) for v in versions]
    assert answers[2] == [{"version": m["version"],
                           "total_rows": sum(sum(c.values()) for c in m["counts"].values()),
                           "rl_rows": sum(m["counts"]["rl"].values())} for m in manifests]
