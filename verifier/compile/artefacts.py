"""Built artefacts after the build: their hashes, checks before every load, copies for a
worker, and the cache events the caller reports (split out of verifier/compile/builder.py)."""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verifier.compile.build_records import BuildResult


# Cache events (an artefact that no longer matches its hash, a failure the environment caused
# and so not cached: `verifier.compile.build_cause`), for the caller's report.
CACHE_EVENTS: list[str] = []


def record_event(message: str) -> None:
    CACHE_EVENTS.append(message)
    print(f"[build cache] {message}", file=sys.stderr)


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sidecar_ok(so: Path) -> bool:
    try:
        return (so.parent / f"{so.name}.sha256").read_text().strip() == file_sha256(so)
    except OSError:
        return False


def verify_artefact(r: BuildResult) -> bool:
    """The shared object still has the hash the builder recorded."""
    try:
        return bool(r.sha256) and file_sha256(r.path) == r.sha256
    except OSError:
        return False


class ArtefactMismatch(RuntimeError):
    """A built object changed after the builder wrote it (the message names it)."""


def copy_for_worker(results: list[BuildResult], dest: Path) -> dict[str, dict]:
    """Copy the built objects into `dest` (the worker's directory); entries for install_shim.
    Each copy is checked against the builder's hash: ArtefactMismatch when it differs."""
    entries = {}
    for r in results:
        if not r.ok:
            continue
        target = dest / Path(r.path).name
        if not target.exists():
            shutil.copyfile(r.path, target)
            if r.sha256 and file_sha256(target) != r.sha256:
                target.unlink()
                record_event(f"{r.path} changed after it was built (hash mismatch)")
                raise ArtefactMismatch(f"built object {Path(r.path).name} changed after the "
                                       "build (hash mismatch); not loaded")
        entries[r.key] = {"module": r.module, "path": target.name, "mode": r.mode}
    return entries
