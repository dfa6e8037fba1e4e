"""Reading published dataset versions: `datasets/<name>/<version>/` folders, their manifests
and the content hashes that prove a version was not edited after publishing.

`publish.py` writes versions; this module and `catalog.py` only read them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.workspace import Workspace
from verifier.compile.artefacts import file_sha256

MANIFEST = "manifest.json"
STATS = "stats.json"
VERSION_RE = re.compile(r"^v(\d+)$")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


class PublishError(RuntimeError):
    """A version cannot be written (bad name, existing version, bad table)."""


class VersionIntegrityError(RuntimeError):
    """A published version does not match its manifest (a file edited, added or removed)."""


def dataset_dir(ws: Workspace, name: str) -> Path:
    """The folder holding every version of dataset `name` (the name is checked)."""
    if not NAME_RE.match(name):
        raise PublishError(f"dataset name {name!r} is invalid: use letters, digits, '.', '_', '-'")
    return ws.datasets_dir / name


def list_versions(ws: Workspace, name: str) -> list[str]:
    """Published versions of `name`, oldest first (v1, v2, ...)."""
    root = dataset_dir(ws, name)
    if not root.is_dir():
        return []
    found = [p.name for p in root.iterdir() if p.is_dir() and VERSION_RE.match(p.name)
             and (p / MANIFEST).is_file()]
    return sorted(found, key=lambda v: int(v[1:]))


def find_version(ws: Workspace, version: str, name: str | None = None) -> Path:
    """The folder of `version` (of `name`, or of the only dataset that has it)."""
    names = [name] if name else sorted(p.name for p in ws.datasets_dir.iterdir()
                                       if p.is_dir()) if ws.datasets_dir.is_dir() else []
    hits = [ws.datasets_dir / n / version for n in names
            if (ws.datasets_dir / n / version / MANIFEST).is_file()]
    if not hits:
        where = f"dataset {name!r}" if name else str(ws.datasets_dir)
        raise PublishError(f"version {version!r} not found under {where}")
    if len(hits) > 1:
        raise PublishError(f"version {version!r} exists for several datasets "
                           f"({', '.join(p.parent.name for p in hits)}); pass --name")
    return hits[0]


def read_manifest(version_dir: Path) -> dict[str, Any]:
    """The manifest of a version folder (no hash check)."""
    path = Path(version_dir) / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise VersionIntegrityError(f"{path}: unreadable manifest ({exc})") from None
    if not isinstance(data, dict) or "files" not in data:
        raise VersionIntegrityError(f"{path}: not a kernelsynth manifest (no 'files')")
    return data


def verify_version(version_dir: str | Path) -> dict[str, Any]:
    """Re-hash every file of a version against its manifest; return the manifest."""
    root = Path(version_dir)
    manifest = read_manifest(root)
    listed = manifest["files"]
    present = {p.relative_to(root).as_posix() for p in root.rglob("*")
               if p.is_file() and p.name != MANIFEST}
    for rel in sorted(present - set(listed)):
        raise VersionIntegrityError(f"{root / rel}: file not in the manifest (added by hand?)")
    for rel, info in listed.items():
        path = root / rel
        if not path.is_file():
            raise VersionIntegrityError(f"{path}: listed in the manifest but missing")
        got = file_sha256(path)
        if got != info["sha256"]:
            raise VersionIntegrityError(
                f"{path}: content hash mismatch (manifest {info['sha256'][:12]}, file "
                f"{got[:12]}); the version was edited after publishing")
    return manifest


def read_version(version_dir: str | Path) -> dict[str, pa.Table]:
    """Every config of a verified version as one Arrow table (all splits)."""
    root = Path(version_dir)
    manifest = verify_version(root)
    out = {}
    for config in manifest["configs"]:
        paths = sorted(p for p in manifest["files"] if p.startswith(f"{config}/"))
        out[config] = pa.concat_tables([pq.read_table(root / p) for p in paths])
    return out


def read_stats(version_dir: str | Path) -> dict[str, Any]:
    """The statistics stored with a verified version ({} when it has none)."""
    root = Path(version_dir)
    verify_version(root)
    path = root / STATS
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
