"""Workspace: atomic incremental parts, dedup by key across runs, polars and DuckDB readers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from pipeline.workspace import Workspace, WorkspaceError
from schemas import Candidate, Task, Verdict


def _cands(n: int, start: int = 0) -> list[Candidate]:
    return [Candidate(f"c{i}", "t", "cpu", "template:x", f"code{i}") for i in range(start, n)]


def test_parts_are_written_per_batch_and_read_back(workspace: Workspace):
    run = workspace.new_run("r1")
    p1 = run.write(_cands(3))
    p2 = run.write(_cands(5, 3))
    assert p1.parent == p2.parent == workspace.root / "runs" / "r1" / "candidates"
    assert p1.name.startswith("part-00000-") and p2.name.startswith("part-00001-")
    assert [c.candidate_id for c in workspace.read(Candidate)] == [f"c{i}" for i in range(5)]
    assert run.write([]) is None
    assert not list(p1.parent.glob(".*.tmp"))


def test_union_over_runs_dedupes_by_key_first_wins(workspace: Workspace):
    workspace.new_run("a").write(_cands(3))
    again = [Candidate("c1", "t", "cpu", "template:x", "different")] + _cands(4, 3)
    workspace.new_run("b").write(again)
    got = {c.candidate_id: c.code for c in workspace.read(Candidate)}
    assert got == {"c0": "code0", "c1": "code1", "c2": "code2", "c3": "code3"}
    assert workspace.done_keys(Candidate) == {"c0", "c1", "c2", "c3"}
    assert workspace.read_table(Candidate, dedupe=False).num_rows == 5


def test_polars_and_duckdb_views(workspace: Workspace):
    workspace.new_run().write(_cands(4))
    df = workspace.read_polars(Candidate)
    assert df.height == 4 and set(df.columns) >= {"candidate_id", "code", "prompt"}
    con = workspace.duckdb()
    assert con.execute("select count(*) from candidates").fetchone() == (4,)
    assert con.execute("select count(*) from tasks").fetchone() == (0,)  # empty view, right schema
    assert "task_id" in con.sql("select * from tasks").columns


def test_foreign_and_corrupt_parts_are_named(workspace: Workspace):
    run = workspace.new_run("r")
    run.write(_cands(1))
    bad = run.dir / "candidates" / "part-99999-bad.parquet"
    bad.write_bytes(b"garbage")
    with pytest.raises(WorkspaceError, match="part-99999-bad.parquet: not a readable Parquet"):
        workspace.read(Candidate)
    bad.unlink()
    # a verdict table written where candidates belong is a foreign schema
    Verdict.write_parquet([Verdict("c", "t", "cheat", "static", "cpu")],
                          run.dir / "candidates" / "part-99998-foreign.parquet")
    with pytest.raises(WorkspaceError, match="foreign schema"):
        workspace.read_table(Candidate)


def test_crash_mid_write_leaves_no_half_part(tmp_path):
    """A writer killed while writing leaves only complete parts (temp name + rename)."""
    root = tmp_path / "ws"
    code = textwrap.dedent(f"""
        import os, signal
        import pyarrow.parquet as pq
        from pipeline.workspace import Workspace
        from schemas import Candidate
        ws = Workspace({str(root)!r})
        run = ws.new_run("r")
        run.write([Candidate("c0", "t", "cpu", "g", "x")])
        real = pq.write_table
        def dying(table, where, **kw):
            real(table, where, **kw)
            os.kill(os.getpid(), signal.SIGKILL)   # die after the temp file, before rename
        pq.write_table = dying
        run.write([Candidate("c1", "t", "cpu", "g", "y")])
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=os.getcwd())
    assert proc.returncode == -9
    ws = Workspace(root)
    assert [c.candidate_id for c in ws.read(Candidate)] == ["c0"]


def test_empty_workspace_reads_empty(workspace: Workspace):
    assert workspace.read(Task) == []
    assert workspace.done_keys(Task) == set()
    assert workspace.runs() == []
