"""Dataset versions: `datasets/<name>/<version>/` with Parquet per config and split, a manifest
with lineage and content hashes, and a dataset card whose YAML `configs:` `datasets` understands.

A version is written to a hidden temp folder and renamed into place, so a crash never leaves a
half-written version. Parquet bytes depend only on the rows, so publishing the same inputs twice
gives the same content hashes. Reading a version re-hashes every file it lists.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import shutil
import subprocess
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.config import Config
from pipeline.datasets.card import render_card
from pipeline.datasets.card_facts import decontamination_facts, rft_facts
from pipeline.datasets.catalog import register_version
from pipeline.datasets.pairs import unstable_timings
from pipeline.datasets.published import version_lineage
from pipeline.datasets.rows import CONFIGS, build_datasets
from pipeline.datasets.selection import SELECTORS, label_rejections
from pipeline.datasets.stats import compute_stats
from pipeline.datasets.tables import config_schema, filter_licenses
from pipeline.datasets.versions import (
    MANIFEST,
    STATS,
    VERSION_RE,
    PublishError,
    dataset_dir,
    file_sha256,
    list_versions,
)
from pipeline.workspace import Workspace
from schemas import Candidate, RawModule, Rejection, Task, Verdict

log = logging.getLogger(__name__)

SPLITS = ("train", "validation")
CARD = "README.md"

def _sort_rows(table: pa.Table) -> pa.Table:
    key = "row_id" if "row_id" in table.column_names else "task_id"
    if table.num_rows == 0:
        return table
    return table.take(pc.sort_indices(table, sort_keys=[(key, "ascending")]))


def _write_split(table: pa.Table, folder: Path, split: str, shard_rows: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    shards = max(1, -(-table.num_rows // shard_rows))
    paths = []
    for i in range(shards):
        part = table.slice(i * shard_rows, shard_rows)
        path = folder / f"{split}-{i:05d}-of-{shards:05d}.parquet"
        # Fixed writer options and no timestamps: identical rows give identical bytes.
        pq.write_table(part, path, compression="zstd", row_group_size=10_000)
        paths.append(path)
    return paths


def _check_table(config: str, table: pa.Table) -> pa.Table:
    expected = config_schema(config)
    if not table.schema.remove_metadata().equals(expected.remove_metadata()):
        raise PublishError(f"config {config!r}: schema differs from the declared one "
                           f"(got {table.schema.names}, expected {expected.names})")
    return table.cast(expected)


def publish_version(ws: Workspace, tables: dict[str, pa.Table], cfg: Config,
                    lineage: dict[str, Any], *, stats: dict[str, Any] | None = None,
                    version: str | None = None) -> Path:
    """Write a new version of `cfg.publish.name` atomically and register it in the catalog.

    `lineage` holds source_commits, verifier_versions, devices, code_commit (whatever is known);
    `stats` (from pipeline.datasets.stats; default: the statistics of the whole workspace) is stored as
    stats.json and summarised in the card.
    """
    name = cfg.publish.name
    root = dataset_dir(ws, name)
    existing = list_versions(ws, name)
    parent = existing[-1] if existing else None
    if version is None:
        version = f"v{int(parent[1:]) + 1}" if parent else "v1"
    if not VERSION_RE.match(version):
        raise PublishError(f"version {version!r} is invalid: use v<number>")
    final = root / version
    if final.exists():
        raise PublishError(f"{final}: version already exists")
    unknown = set(tables) - set(CONFIGS)
    if unknown:
        raise PublishError(f"unknown dataset configs {sorted(unknown)}")

    if not any(t.num_rows for t in tables.values()):
        raise PublishError(f"nothing to publish for {name!r}: every dataset config is empty "
                           "(no tasks in the workspace?)")
    if stats is None:
        stats = workspace_stats(ws, cfg)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{version}-{uuid.uuid4().hex[:8]}"
    try:
        counts: dict[str, dict[str, int]] = {}
        files: dict[str, dict[str, Any]] = {}
        empty: list[str] = []
        for config in [c for c in CONFIGS if c in tables]:
            table = _sort_rows(_check_table(config, tables[config]))
            if table.num_rows == 0:
                # `datasets` cannot load a split without rows, so an empty subset is left out
                # of this version (and named in the manifest and the card) rather than broken.
                empty.append(config)
                continue
            split_col = table.column("split")
            counts[config] = {}
            for split in SPLITS:
                part = table.filter(pc.equal(split_col, split))
                if part.num_rows == 0:
                    continue
                counts[config][split] = part.num_rows
                for path in _write_split(part, tmp / config, split, cfg.publish.shard_rows):
                    rows = pq.ParquetFile(path).metadata.num_rows
                    files[path.relative_to(tmp).as_posix()] = {
                        "sha256": file_sha256(path), "bytes": path.stat().st_size, "rows": rows}
        data_hash = hashlib.sha256("\n".join(
            f"{p}:{f['sha256']}" for p, f in sorted(files.items())).encode()).hexdigest()
        manifest: dict[str, Any] = {
            "name": name, "version": version, "parent_version": parent,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "configs": list(counts), "empty_configs": empty, "counts": counts,
            "content_hash": data_hash,
            "licenses": license_counts(tables),
            "excluded_licenses": _excluded_licenses(stats),
            "lineage": {
                "source_commits": lineage.get("source_commits", []),
                "verifier_versions": lineage.get("verifier_versions", []),
                "devices": lineage.get("devices", []),
                "backends": _column_values(tables, "backend"),
                "torch_version": lineage.get("torch_version") or _torch_version(),
                "code_commit": lineage.get("code_commit") or _code_commit(),
                "runs": lineage.get("runs", []),
                "host": lineage.get("host", {"platform": platform.platform(),
                                             "python": platform.python_version()}),
            },
            "config": cfg.model_dump(mode="json"),
            "rft": rft_facts(tables.get("rft")),
            "decontamination": decontamination_facts(ws, tables.get("tasks"), cfg),
        }
        if stats:
            (tmp / STATS).write_text(json.dumps(stats, indent=2) + "\n",
                                     encoding="utf-8")
        (tmp / CARD).write_text(render_card(name, version, manifest, stats,
                                            cfg.publish.hub_repo, str(final), folder=tmp),
                                encoding="utf-8")
        for extra in (STATS, CARD):
            if (tmp / extra).exists():
                files[extra] = {"sha256": file_sha256(tmp / extra),
                                "bytes": (tmp / extra).stat().st_size}
        manifest["files"] = dict(sorted(files.items()))
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        register_version(ws, final)
    except duckdb.Error as exc:
        # The version is complete and valid; the catalog picks it up the next time it opens.
        log.warning("%s: published, but catalog.duckdb could not register it (%s)", final,
                    str(exc).splitlines()[0])
    return final


def license_counts(tables: dict[str, pa.Table]) -> dict[str, dict[str, int]]:
    """SPDX id -> {config: rows} over every config's `license` column."""
    out: dict[str, dict[str, int]] = {}
    for config, table in tables.items():
        if "license" not in table.column_names:
            continue
        for item in pc.value_counts(table.column("license")).to_pylist():
            lic = item["values"] or "unknown"
            out.setdefault(lic, {})[config] = int(item["counts"])
    return dict(sorted(out.items()))


def _excluded_licenses(stats: dict[str, Any] | None) -> dict[str, int]:
    prefix = "publish:license_not_allowed: "
    return {k[len(prefix):]: v for k, v in (stats or {}).get("rejections", {}).items()
            if k.startswith(prefix)}


def _column_values(tables: dict[str, pa.Table], column: str) -> list[str]:
    values: set[str] = set()
    for table in tables.values():
        if column in table.column_names:
            values.update(v for v in table.column(column).to_pylist() if v)
    return sorted(values)


def _torch_version() -> str:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return ""


def _code_commit() -> str:
    """The kernelsynth source commit, when the code runs from a git checkout."""
    try:
        res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return res.stdout.strip() if res.returncode == 0 else ""


def _workspace_records(ws: Workspace) -> dict[str, Any]:
    return {"tasks": ws.read(Task), "candidates": ws.read(Candidate), "verdicts": ws.read(Verdict),
            "sourced": ws.read_table(RawModule).num_rows, "rejections": ws.read(Rejection)}


def workspace_stats(ws: Workspace, cfg: Config) -> dict[str, Any]:
    """Statistics of everything in the workspace."""
    rec = _workspace_records(ws)
    return compute_stats(rec["tasks"], rec["candidates"], rec["verdicts"],
                         sourced=rec["sourced"], rejections=rec["rejections"],
                         fast_threshold=cfg.verify.fast_threshold)


def publishable_tasks(ws: Workspace, cfg: Config, run_id: str | None = None) -> list[Task]:
    """The workspace's tasks with their licenses, recording a publish Rejection for each task
    `publish.licenses` leaves out (new ones only; `build_datasets` leaves them out).

    A task written before tasks carried a license (schema v1) takes its module's license.
    """
    tasks = ws.read(Task)
    if any(not t.license for t in tasks):
        mods = ws.read_table(RawModule).select(["module_id", "license"]).to_pylist()
        by_module = {m["module_id"]: m["license"] for m in mods}
        tasks = [t if t.license else replace(t, license=by_module.get(t.module_id, ""))
                 for t in tasks]
    _, rejected = filter_licenses(tasks, cfg.publish.licenses)
    done = ws.done_keys(Rejection)
    fresh = [r for r in rejected if r.rejection_id not in done]
    if fresh:
        ws.new_run(run_id).write(fresh)
    return tasks


def publish_workspace(ws: Workspace, cfg: Config, version: str | None = None,
                      run_id: str | None = None) -> Path:
    """Select (`select.method`), build every config, compute statistics, publish a version."""
    tasks = publishable_tasks(ws, cfg, run_id)
    rec = {**_workspace_records(ws), "tasks": tasks}
    sel = cfg.select
    selected = SELECTORS[sel.method](rec["candidates"], rec["verdicts"], sel.k,
                                     sel.diversity_weight, sel.seed)
    tables = build_datasets(rec["tasks"], rec["candidates"], rec["verdicts"], selected, cfg)
    vmap = {v.candidate_id: v for v in rec["verdicts"]}
    dropped = label_rejections(rec["candidates"], vmap, sel.min_speedup,
                               unstable_timings(rec["candidates"], vmap))
    done = ws.done_keys(Rejection)
    fresh = [r for r in dropped if r.rejection_id not in done]
    if fresh:  # the rows a timing did not hold for are dropped, and the funnel says why
        ws.new_run().write(fresh)
        rec["rejections"] = [*rec["rejections"], *fresh]
    stats = compute_stats(rec["tasks"], rec["candidates"], rec["verdicts"],
                          sourced=rec["sourced"], rejections=rec["rejections"],
                          fast_threshold=cfg.verify.fast_threshold)
    stats["selected"] = len(selected)
    lineage = version_lineage(ws, rec["tasks"], rec["verdicts"], _code_commit())
    return publish_version(ws, tables, cfg, lineage, stats=stats, version=version)
