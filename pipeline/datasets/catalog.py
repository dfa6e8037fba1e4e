"""`catalog.duckdb`: a `versions` table registering every published dataset version, and views
over the workspace Parquet (`ws_<table>`) and over every version's configs (`ds_<config>`).

Views are recreated when a version is registered (so right after `publish` / `build`) and each
time a kernelsynth command opens the catalog, since the set of tables changes as runs and
versions are added. Views name their Parquet files by absolute path, so plain
`duckdb.connect(".../catalog.duckdb")` works from any directory (a notebook, the duckdb CLI in
the project root); a moved or copied workspace gets its views rewritten to the new location by
the next kernelsynth command that opens it (`stats`, `sql`, `publish`, `build`).
`versions.path` stays relative to the workspace root, as the data it is. Parquet files are
checked (footer and schema) before a view is made over them, so a corrupt or foreign file is
reported by name instead of failing later inside a query.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.datasets.rows import CONFIGS
from pipeline.datasets.versions import list_versions, verify_version
from pipeline.workspace import Workspace, WorkspaceError
from schemas import RECORD_TYPES, SchemaError, check_table

log = logging.getLogger(__name__)

VERSIONS_DDL = """
CREATE TABLE IF NOT EXISTS versions (
    name VARCHAR NOT NULL,
    version VARCHAR NOT NULL,
    parent_version VARCHAR,
    created_at VARCHAR,
    path VARCHAR NOT NULL,
    content_hash VARCHAR NOT NULL,
    total_rows BIGINT NOT NULL,
    counts JSON,
    files JSON,
    verifier_versions JSON,
    devices JSON,
    PRIMARY KEY (name, version)
)
"""


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _relative(ws: Workspace, path: Path) -> str:
    """`path` relative to the workspace root (posix), or absolute when it lies outside."""
    try:
        return Path(path).resolve().relative_to(ws.root.resolve()).as_posix()
    except ValueError:
        return str(Path(path).resolve())


def _absolute(path: Path) -> str:
    """A view's file path: absolute, so the view reads the same from any working directory."""
    return str(Path(path).resolve())


def connect_catalog(ws: Workspace, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """A connection to catalog.duckdb; relative paths (catalogs of older releases) resolve in `ws`."""
    con = duckdb.connect(str(ws.catalog_path), read_only=read_only)
    con.execute(f"SET file_search_path = {_sql_str(str(ws.root.resolve()))}")
    return con


def check_parts(ws: Workspace, table: str) -> list[Path]:
    """The table's Parquet parts, each checked to be readable and of the table's schema."""
    cls = RECORD_TYPES[table]
    parts = ws.part_paths(table)
    for path in parts:
        try:
            schema = pq.read_schema(path)
        except (pa.ArrowInvalid, OSError) as exc:
            raise WorkspaceError(f"{path}: not a readable Parquet file ({exc})") from None
        try:
            check_table(cls, pa.Table.from_batches([], schema=schema))  # pandas-free
        except SchemaError as exc:
            raise WorkspaceError(f"{path}: foreign schema ({exc})") from None
    return parts


def register_version(ws: Workspace, version_dir: Path,
                     con: duckdb.DuckDBPyConnection | None = None) -> None:
    """Insert (or refresh) one verified version in the versions table."""
    manifest = verify_version(version_dir)
    own = con is None
    con = con or connect_catalog(ws)
    try:
        con.execute(VERSIONS_DDL)
        total = sum(sum(c.values()) for c in manifest["counts"].values())
        lin = manifest.get("lineage", {})
        con.execute(
            "INSERT OR REPLACE INTO versions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [manifest["name"], manifest["version"], manifest.get("parent_version"),
             manifest.get("created_at"), _relative(ws, Path(version_dir)),
             manifest["content_hash"], total, json.dumps(manifest["counts"]),
             json.dumps(manifest["files"]), json.dumps(lin.get("verifier_versions", [])),
             json.dumps(lin.get("devices", []))])
        if own:  # a new version: every view right away, not at the next open
            try:
                refresh_views(ws, con)
            except WorkspaceError as exc:  # the version stands; `sql`/`stats` name the file
                log.warning("catalog.duckdb views not refreshed: %s", exc)
    finally:
        if own:
            con.close()


def open_catalog(ws: Workspace) -> duckdb.DuckDBPyConnection:
    """Open catalog.duckdb, register versions not yet in it and recreate every view."""
    con = connect_catalog(ws)
    try:
        con.execute(VERSIONS_DDL)
        known = {(n, v) for n, v in con.execute("SELECT name, version FROM versions").fetchall()}
        names = sorted(p.name for p in ws.datasets_dir.iterdir()
                       if p.is_dir()) if ws.datasets_dir.is_dir() else []
        for name in names:
            for version in list_versions(ws, name):
                if (name, version) not in known:
                    register_version(ws, ws.datasets_dir / name / version, con)
        refresh_views(ws, con)
    except BaseException:
        con.close()
        raise
    return con


def refresh_views(ws: Workspace, con: duckdb.DuckDBPyConnection) -> list[str]:
    """(Re)create `ws_<table>` and `ds_<config>` views; returns the view names."""
    views = []
    for view, in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal "
                             "AND (view_name LIKE 'ws\\_%' ESCAPE '\\' OR "
                             "view_name LIKE 'ds\\_%' ESCAPE '\\')").fetchall():
        con.execute(f'DROP VIEW IF EXISTS "{view}"')
    for table in RECORD_TYPES:
        parts = check_parts(ws, table)
        if not parts:
            continue
        files = "[" + ", ".join(_sql_str(_absolute(p)) for p in parts) + "]"
        con.execute(f'CREATE VIEW "ws_{table}" AS SELECT * FROM read_parquet({files}, '
                    "union_by_name = true)")
        views.append(f"ws_{table}")
    rows = con.execute("SELECT name, version, path, files FROM versions ORDER BY name, version"
                       ).fetchall()
    for config in CONFIGS:
        selects = []
        for name, version, path, files in rows:
            paths = sorted(p for p in json.loads(files) if p.startswith(f"{config}/"))
            folder = ws.root / path  # an absolute path (older catalogs) stays absolute
            if not paths or not folder.is_dir():
                continue
            file_list = "[" + ", ".join(_sql_str(_absolute(folder / p)) for p in paths) + "]"
            selects.append(f"SELECT {_sql_str(name)} AS dataset, {_sql_str(version)} AS version, "
                           f"* FROM read_parquet({file_list}, union_by_name = true)")
        if selects:
            con.execute(f'CREATE VIEW "ds_{config}" AS ' + " UNION ALL BY NAME ".join(selects))
            views.append(f"ds_{config}")
    return views


def attach_catalog(ws: Workspace, con: duckdb.DuckDBPyConnection) -> list[str]:
    """Refresh catalog.duckdb and give `con` its views (`ds_*`, `ws_*`, `versions`) by name."""
    open_catalog(ws).close()
    con.execute(f"SET file_search_path = {_sql_str(str(ws.root.resolve()))}")
    con.execute(f"ATTACH {_sql_str(str(ws.catalog_path))} AS ks_catalog (READ_ONLY)")
    names = [r[0] for r in con.execute(
        "SELECT view_name FROM duckdb_views() WHERE database_name = 'ks_catalog' AND NOT "
        "internal").fetchall()] + ["versions"]
    for name in names:
        con.execute(f'CREATE OR REPLACE TEMP VIEW "{name}" AS SELECT * FROM ks_catalog."{name}"')
    return names
