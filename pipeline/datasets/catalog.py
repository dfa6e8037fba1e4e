"""`catalog.duckdb`: a `versions` table registering every published dataset version, and views
over the workspace Parquet (`ws_<table>`) and over every version's configs (`ds_<config>`).

Views are recreated each time the catalog is opened, since they hold absolute file globs and the
set of tables changes as runs and versions are added. Parquet files are checked (footer and
schema) before a view is made over them, so a corrupt or foreign file is reported by name instead
of failing later inside a query.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.datasets.rows import CONFIGS
from pipeline.datasets.versions import list_versions, verify_version
from pipeline.workspace import Workspace, WorkspaceError
from schemas import RECORD_TYPES, SchemaError, check_table

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
            check_table(cls, schema.empty_table())
        except SchemaError as exc:
            raise WorkspaceError(f"{path}: foreign schema ({exc})") from None
    return parts


def register_version(ws: Workspace, version_dir: Path,
                     con: duckdb.DuckDBPyConnection | None = None) -> None:
    """Insert (or refresh) one verified version in the versions table."""
    manifest = verify_version(version_dir)
    own = con is None
    con = con or duckdb.connect(str(ws.catalog_path))
    try:
        con.execute(VERSIONS_DDL)
        total = sum(sum(c.values()) for c in manifest["counts"].values())
        lin = manifest.get("lineage", {})
        con.execute(
            "INSERT OR REPLACE INTO versions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [manifest["name"], manifest["version"], manifest.get("parent_version"),
             manifest.get("created_at"), str(Path(version_dir).resolve()),
             manifest["content_hash"], total, json.dumps(manifest["counts"]),
             json.dumps(manifest["files"]), json.dumps(lin.get("verifier_versions", [])),
             json.dumps(lin.get("devices", []))])
    finally:
        if own:
            con.close()


def open_catalog(ws: Workspace) -> duckdb.DuckDBPyConnection:
    """Open catalog.duckdb, register versions not yet in it and recreate every view."""
    con = duckdb.connect(str(ws.catalog_path))
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
        files = "[" + ", ".join(_sql_str(str(p)) for p in parts) + "]"
        con.execute(f'CREATE VIEW "ws_{table}" AS SELECT * FROM read_parquet({files}, '
                    "union_by_name = true)")
        views.append(f"ws_{table}")
    rows = con.execute("SELECT name, version, path, files FROM versions ORDER BY name, version"
                       ).fetchall()
    for config in CONFIGS:
        selects = []
        for name, version, path, files in rows:
            paths = sorted(p for p in json.loads(files) if p.startswith(f"{config}/"))
            if not paths or not Path(path).is_dir():
                continue
            file_list = "[" + ", ".join(_sql_str(str(Path(path) / p)) for p in paths) + "]"
            selects.append(f"SELECT {_sql_str(name)} AS dataset, {_sql_str(version)} AS version, "
                           f"* FROM read_parquet({file_list}, union_by_name = true)")
        if selects:
            con.execute(f'CREATE VIEW "ds_{config}" AS ' + " UNION ALL BY NAME ".join(selects))
            views.append(f"ds_{config}")
    return views
