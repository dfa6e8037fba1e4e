"""catalog.duckdb: the versions table and views over workspace Parquet and dataset versions."""

from __future__ import annotations

import json
import subprocess
import sys

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import Config
from pipeline.datasets.catalog import open_catalog
from pipeline.datasets.publish import publish_workspace
from pipeline.workspace import Workspace, WorkspaceError
from tests.pipeline.ks_synthetic import fill_workspace


def _publish_twice(ws: Workspace) -> None:
    fill_workspace(ws, n_tasks=3)
    cfg = Config(workspace=str(ws.root))
    publish_workspace(ws, cfg)
    publish_workspace(ws, cfg)


def test_every_published_version_is_registered(workspace: Workspace) -> None:
    _publish_twice(workspace)
    con = duckdb.connect(str(workspace.catalog_path), read_only=True)
    rows = con.execute("SELECT name, version, parent_version, content_hash, total_rows, counts "
                       "FROM versions ORDER BY version").fetchall()
    con.close()
    assert [(r[0], r[1], r[2]) for r in rows] == [("kernelsynth", "v1", None),
                                                  ("kernelsynth", "v2", "v1")]
    assert rows[0][3] == rows[1][3]
    manifest = json.loads((workspace.datasets_dir / "kernelsynth" / "v1" / "manifest.json")
                          .read_text())
    assert json.loads(rows[0][5]) == manifest["counts"]
    assert rows[0][4] == sum(sum(s.values()) for s in manifest["counts"].values())


def test_views_cover_workspace_tables_and_versions(workspace: Workspace) -> None:
    _publish_twice(workspace)
    con = open_catalog(workspace)
    try:
        assert con.execute("SELECT count(*) FROM ws_tasks").fetchone()[0] == 3
        assert con.execute("SELECT count(*) FROM ws_verdicts").fetchone()[0] == \
            workspace.read_table(__import__("schemas").Verdict).num_rows
        per_version = dict(con.execute("SELECT version, count(*) FROM ds_sft GROUP BY 1")
                           .fetchall())
        manifest = json.loads((workspace.datasets_dir / "kernelsynth" / "v2" / "manifest.json")
                              .read_text())
        expected = sum(manifest["counts"]["sft"].values())
        assert per_version == {"v1": expected, "v2": expected}
        splits = {r[0] for r in con.execute("SELECT DISTINCT split FROM ds_tasks").fetchall()}
        assert splits <= {"train", "validation"} and "train" in splits
    finally:
        con.close()


def test_catalog_rebuilt_from_the_version_folders(workspace: Workspace) -> None:
    _publish_twice(workspace)
    workspace.catalog_path.unlink()
    con = open_catalog(workspace)
    try:
        assert con.execute("SELECT count(*) FROM versions").fetchone()[0] == 2
    finally:
        con.close()


@pytest.mark.parametrize("kind", ["corrupt", "foreign"])
def test_bad_workspace_parquet_names_the_file(workspace: Workspace, kind: str) -> None:
    fill_workspace(workspace, n_tasks=2)
    bad = workspace.root / "runs" / "r9" / "candidates" / "part-00000-bad.parquet"
    bad.parent.mkdir(parents=True)
    if kind == "corrupt":
        bad.write_bytes(b"garbage")
    else:
        pq.write_table(pa.table({"candidate_id": [1]}), bad)
    with pytest.raises(WorkspaceError, match=r"part-00000-bad\.parquet: (not a readable|foreign)"):
        open_catalog(workspace).close()


def test_locked_catalog_does_not_fail_a_publish(workspace: Workspace, caplog) -> None:
    fill_workspace(workspace, n_tasks=2)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys, time\n"
         f"con = duckdb.connect({str(workspace.catalog_path)!r})\n"
         "print('held', flush=True)\ntime.sleep(60)\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        path = publish_workspace(workspace, Config(workspace=str(workspace.root)))
    finally:
        holder.kill()
        holder.wait()
    assert path.name == "v1" and (path / "manifest.json").is_file()
    assert "could not register it" in caplog.text
    con = open_catalog(workspace)  # the version is registered once the lock is gone
    try:
        assert con.execute("SELECT version FROM versions").fetchall() == [("v1",)]
    finally:
        con.close()
