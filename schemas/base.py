"""Typed records backed by Arrow schemas derived from dataclass annotations.

A record class is a plain dataclass that inherits `Record` and sets `TABLE` and `SCHEMA_VERSION`.
Its Arrow schema is derived from the annotations, so the dataclass is the single source of truth.
Supported field types: str, int, float, bool, bytes, `T | None`, `list[T]` and nested `Record`
dataclasses (as structs). Free-form mappings are stored as JSON text (`str`) on purpose: Arrow maps
and unions do not round-trip cleanly through DuckDB, polars and `datasets`.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

R = TypeVar("R", bound="Record")

_SCALARS: dict[type, pa.DataType] = {
    str: pa.string(),
    int: pa.int64(),
    float: pa.float64(),
    bool: pa.bool_(),
    bytes: pa.binary(),
}


class SchemaError(ValueError):
    """A record or table does not match its schema; the message names the field and the problem."""


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
        raise TypeError(f"unsupported union {tp!r}: only `T | None` is allowed")
    return tp, False


def _arrow_type(tp: Any) -> pa.DataType:
    tp, _ = _unwrap_optional(tp)
    if tp in _SCALARS:
        return _SCALARS[tp]
    origin = typing.get_origin(tp)
    if origin is list:
        (item,) = typing.get_args(tp)
        return pa.list_(_arrow_type(item))
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return pa.struct([_arrow_field(name, hint) for name, hint in _hints(tp).items()])
    raise TypeError(f"unsupported field type {tp!r}")


def _arrow_field(name: str, hint: Any) -> pa.Field:
    _, optional = _unwrap_optional(hint)
    return pa.field(name, _arrow_type(hint), nullable=optional)


def _hints(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _check_value(path: str, value: Any, tp: Any) -> None:
    tp, optional = _unwrap_optional(tp)
    if value is None:
        if not optional:
            raise SchemaError(f"{path}: is required but missing (None)")
        return
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SchemaError(f"{path}: expected float, got {type(value).__name__} {value!r:.60}")
        return
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SchemaError(f"{path}: expected int, got {type(value).__name__} {value!r:.60}")
        return
    if tp in _SCALARS:
        if not isinstance(value, tp):
            raise SchemaError(
                f"{path}: expected {tp.__name__}, got {type(value).__name__} {value!r:.60}"
            )
        return
    if typing.get_origin(tp) is list:
        if not isinstance(value, list | tuple):
            raise SchemaError(f"{path}: expected a list, got {type(value).__name__}")
        (item,) = typing.get_args(tp)
        for i, v in enumerate(value):
            _check_value(f"{path}[{i}]", v, item)
        return
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, tp):
            raise SchemaError(f"{path}: expected {tp.__name__}, got {type(value).__name__}")
        for name, hint in _hints(tp).items():
            _check_value(f"{path}.{name}", getattr(value, name), hint)
        return
    raise SchemaError(f"{path}: unsupported type {tp!r}")


def _to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [_to_plain(v) for v in value]
    return value


def _from_plain(value: Any, tp: Any) -> Any:
    tp, _ = _unwrap_optional(tp)
    if value is None:
        return None
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        return [_from_plain(v, item) for v in value]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = _hints(tp)
        return tp(**{k: _from_plain(value.get(k), h) for k, h in hints.items() if k in value})
    return value


@dataclasses.dataclass
class Record:
    """Base of every table row. Subclasses set TABLE and SCHEMA_VERSION."""

    TABLE: ClassVar[str] = ""
    SCHEMA_VERSION: ClassVar[int] = 1
    KEY: ClassVar[str] = ""

    @classmethod
    def arrow_schema(cls) -> pa.Schema:
        """The Arrow schema of this record, with the table name and schema version as metadata."""
        fields = [_arrow_field(name, hint) for name, hint in _hints(cls).items()]
        meta = {b"kernelsynth.table": cls.TABLE.encode(), b"kernelsynth.schema_version": str(
            cls.SCHEMA_VERSION).encode()}
        return pa.schema(fields, metadata=meta)

    def validate(self) -> Self:
        """Check every field against its annotation; raise SchemaError naming the field."""
        for name, hint in _hints(type(self)).items():
            _check_value(f"{type(self).__name__}.{name}", getattr(self, name), hint)
        return self

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        hints = _hints(cls)
        unknown = set(data) - set(hints)
        if unknown:
            raise SchemaError(f"{cls.__name__}: unknown fields {sorted(unknown)}")
        return cls(**{k: _from_plain(data[k], hints[k]) for k in hints if k in data})

    @classmethod
    def to_arrow(cls, records: typing.Iterable[Record]) -> pa.Table:
        """Validate and convert records to an Arrow table with this record's schema."""
        rows = []
        for i, rec in enumerate(records):
            if not isinstance(rec, cls):
                raise SchemaError(f"row {i}: expected {cls.__name__}, got {type(rec).__name__}")
            try:
                rec.validate()
            except SchemaError as exc:
                raise SchemaError(f"row {i}: {exc}") from None
            rows.append(rec.to_dict())
        return pa.Table.from_pylist(rows, schema=cls.arrow_schema())

    @classmethod
    def from_arrow(cls, table: pa.Table) -> list[Self]:
        """Convert an Arrow table (checked against the schema) back to records."""
        check_table(cls, table)
        return [cls.from_dict(row) for row in table.select(
            [f.name for f in cls.arrow_schema()]).to_pylist()]

    @classmethod
    def write_parquet(cls, records: typing.Iterable[Record], path: str | Path) -> Path:
        path = Path(path)
        pq.write_table(cls.to_arrow(records), path, compression="zstd")
        return path

    @classmethod
    def read_parquet(cls, path: str | Path) -> list[Self]:
        try:
            table = pq.read_table(path)
        except (pa.ArrowInvalid, OSError) as exc:
            raise SchemaError(f"{path}: not a readable Parquet file ({exc})") from None
        try:
            return cls.from_arrow(table)
        except SchemaError as exc:
            raise SchemaError(f"{path}: {exc}") from None


def upgrade_table(cls: type[Record], table: pa.Table) -> pa.Table:
    """Add the columns a newer SCHEMA_VERSION appended (with their defaults) to an older table.

    Only a table whose metadata names an older version of `cls`'s table is upgraded, and only
    columns that have a default; anything else is left for `check_table` to report.
    """
    meta = table.schema.metadata or {}
    if meta.get(b"kernelsynth.table") != cls.TABLE.encode():
        return table
    try:
        version = int(meta.get(b"kernelsynth.schema_version", b"1"))
    except ValueError:
        return table
    if version >= cls.SCHEMA_VERSION:
        return table
    schema = cls.arrow_schema()
    for f in dataclasses.fields(cls):
        if f.name in table.schema.names:
            continue
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = _to_plain(f.default_factory())
        else:
            return table
        field = schema.field(f.name)
        table = table.append_column(field, pa.array([value] * table.num_rows, field.type))
    return table


def check_table(cls: type[Record], table: pa.Table) -> None:
    """Raise SchemaError naming the first missing or mistyped column of `table`."""
    expected = cls.arrow_schema()
    for field in expected:
        if field.name not in table.schema.names:
            raise SchemaError(f"{cls.__name__}: column {field.name!r} is missing")
        got = table.schema.field(field.name).type
        if got != field.type and not (pa.types.is_null(got)):
            raise SchemaError(
                f"{cls.__name__}: column {field.name!r} has type {got}, expected {field.type}"
            )


def dumps(obj: Any) -> str:
    """Canonical JSON used for JSON-text fields and content hashes (sorted keys, no spaces)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
