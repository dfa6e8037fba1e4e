"""The workspace directory: incremental Parquet parts per run, readers, DuckDB views.

Layout (ARCHITECTURE.md, "Storage"):
    <root>/runs/<run_id>/<table>/part-<seq>-<uid>.parquet
    <root>/datasets/<name>/<version>/
    <root>/cache/
    <root>/catalog.duckdb

A table's contents are the union of its parts over all runs, deduplicated by the record's key
(first written wins), so a re-run that skips finished keys, or a run resumed after a crash, reads
back exactly the records an uninterrupted run would have written.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from schemas import RECORD_TYPES, Record, SchemaError, check_table, upgrade_table

if TYPE_CHECKING:  # polars is imported where it is used: every command opens a workspace
    import polars as pl

R = TypeVar("R", bound=Record)


class WorkspaceError(RuntimeError):
    """A workspace file is unreadable or foreign; the message names the file."""


class PartWriter:
    """Writes record batches of one table as numbered Parquet parts, atomically."""

    def __init__(self, directory: Path, cls: type[Record]):
        self.directory = directory
        self.cls = cls
        self._lock = threading.Lock()
        self._seq = len(list(directory.glob("part-*.parquet"))) if directory.exists() else 0
        self.rows_written = 0

    def write(self, records: Iterable[Record]) -> Path | None:
        """Write one batch as a new part; returns its path (None for an empty batch)."""
        table = self.cls.to_arrow(records)
        if table.num_rows == 0:
            return None
        self.directory.mkdir(parents=True, exist_ok=True)
        with self._lock:
            seq = self._seq
            self._seq += 1
        final = self.directory / f"part-{seq:05d}-{uuid.uuid4().hex[:8]}.parquet"
        tmp = self.directory / f".{final.name}.tmp"
        pq.write_table(table, tmp, compression="zstd")
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        self.rows_written += table.num_rows
        return final


class Run:
    """One run of the pipeline: a folder of table parts."""

    def __init__(self, workspace: Workspace, run_id: str):
        self.workspace = workspace
        self.run_id = run_id
        self.dir = workspace.root / "runs" / run_id
        self.dir.mkdir(parents=True, exist_ok=True)
        self._writers: dict[str, PartWriter] = {}

    def writer(self, cls: type[Record]) -> PartWriter:
        if cls.TABLE not in self._writers:
            self._writers[cls.TABLE] = PartWriter(self.dir / cls.TABLE, cls)
        return self._writers[cls.TABLE]

    def write(self, records: list[Record]) -> Path | None:
        """Write a batch of records of one type (an empty list writes nothing)."""
        if not records:
            return None
        return self.writer(type(records[0])).write(records)


def new_run_id() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]


class Workspace:
    """A kernelsynth workspace rooted at `root` (created on first use)."""

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def datasets_dir(self) -> Path:
        return self.root / "datasets"

    @property
    def cache_dir(self) -> Path:
        path = self.root / "cache"
        path.mkdir(exist_ok=True)
        return path

    @property
    def catalog_path(self) -> Path:
        return self.root / "catalog.duckdb"

    def new_run(self, run_id: str | None = None) -> Run:
        return Run(self, run_id or new_run_id())

    def runs(self) -> list[str]:
        runs = self.root / "runs"
        return sorted(p.name for p in runs.iterdir() if p.is_dir()) if runs.exists() else []

    def part_paths(self, table: str) -> list[Path]:
        return sorted((self.root / "runs").glob(f"*/{table}/part-*.parquet"))

    def read_table(self, cls: type[Record], dedupe: bool = True) -> pa.Table:
        """All parts of `cls`'s table over all runs, checked against the schema."""
        tables = []
        for path in self.part_paths(cls.TABLE):
            try:
                table = upgrade_table(cls, pq.read_table(path))
                check_table(cls, table)
            except (pa.ArrowInvalid, OSError) as exc:
                raise WorkspaceError(f"{path}: not a readable Parquet file ({exc})") from None
            except SchemaError as exc:
                raise WorkspaceError(f"{path}: foreign schema ({exc})") from None
            tables.append(table.select(cls.arrow_schema().names).cast(cls.arrow_schema()))
        if not tables:
            # not schema.empty_table(): that imports pandas, 0.2 s of `stats`' start-up
            return pa.Table.from_batches([], schema=cls.arrow_schema())
        table = pa.concat_tables(tables)
        if dedupe and cls.KEY:
            table = _first_per_key(table, cls.KEY)
        return table

    def read(self, cls: type[R]) -> list[R]:
        return cls.from_arrow(self.read_table(cls))

    def read_polars(self, cls: type[Record]) -> pl.DataFrame:
        import polars as pl

        return pl.from_arrow(self.read_table(cls))

    def done_keys(self, cls: type[Record]) -> set[str]:
        """Keys already written for `cls` in any run (what a re-run skips)."""
        if not cls.KEY:
            raise ValueError(f"{cls.__name__} has no key")
        keys: set[str] = set()
        for path in self.part_paths(cls.TABLE):
            try:
                keys.update(pq.read_table(path, columns=[cls.KEY]).column(0).to_pylist())
            except (pa.ArrowInvalid, OSError, KeyError) as exc:
                raise WorkspaceError(f"{path}: cannot read column {cls.KEY!r} ({exc})") from None
        return keys

    def duckdb(self, tables: Iterable[str] | None = None) -> duckdb.DuckDBPyConnection:
        """An in-memory DuckDB connection with one view per workspace table."""
        con = duckdb.connect()
        for name in tables or RECORD_TYPES:
            cls = RECORD_TYPES[name]
            con.register(f"_{name}_arrow", self.read_table(cls))
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM _{name}_arrow")
        return con


def _first_per_key(table: pa.Table, key: str) -> pa.Table:
    if table.num_rows == 0:
        return table
    indices = pa.array(range(table.num_rows), pa.int64())
    keyed = pa.table({"k": table.column(key), "i": indices})
    first = keyed.group_by("k", use_threads=False).aggregate([("i", "min")]).column("i_min")
    return table.take(pc.take(first, pc.sort_indices(first)))
