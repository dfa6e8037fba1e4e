"""Dataset versions: `datasets/<name>/<version>/` with Parquet per config and split, a manifest
with lineage and content hashes, and a dataset card whose YAML `configs:` `datasets` understands.

A version is written to a hidden temp folder and renamed into place, so a crash never leaves a
half-written version. Parquet bytes depend only on the rows, so publishing the same inputs twice
gives the same content hashes. Reading a version re-hashes every file it lists.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from pipeline.config import Config
from pipeline.datasets import CONFIGS, build_datasets, config_schema
from pipeline.select import SELECTORS
from pipeline.stats import compute_stats
from pipeline.workspace import Workspace
from schemas import Candidate, RawModule, Rejection, Task, Verdict

log = logging.getLogger(__name__)

SPLITS = ("train", "validation")
MANIFEST = "manifest.json"
CARD = "README.md"
STATS = "stats.json"
_VERSION_RE = re.compile(r"^v(\d+)$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")

CONFIG_DESCRIPTIONS = {
    "tasks": "KernelBench-style tasks (reference `Model`, inputs, shapes, FLOPs/bytes, "
             "provenance).",
    "sft": "Supervised fine-tuning: system/user prompt and an assistant answer with reasoning and "
           "a verified kernel from templates or a teacher.",
    "rft": "Rejection fine-tuning: selected verified model responses with reward, speedup and "
           "the statistics of their sample group.",
    "rl": "Prompt-only rows with the reference source and input shapes for online RL rewards; "
          "all-failed groups appear as feedback-conditioned repair prompts.",
    "repair": "Multi-turn repair: attempt, verifier feedback, fix; per-turn rewards and statuses.",
    "preference": "Preference pairs: a correct fast kernel (chosen) against an incorrect or "
                  "clearly slower one (rejected).",
    "review": "Code review: a kernel with an injected bug; the answer names the bug, its line "
              "and the fix.",
    "perf_analysis": "Performance analysis: a verified kernel with measured times and FLOP/byte "
                     "figures; the answer explains the bottleneck and the next optimization.",
}


class PublishError(RuntimeError):
    """A version cannot be written (bad name, existing version, bad table)."""


class VersionIntegrityError(RuntimeError):
    """A published version does not match its manifest (a file edited, added or removed)."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def dataset_dir(ws: Workspace, name: str) -> Path:
    """The folder holding every version of dataset `name` (the name is checked)."""
    if not _NAME_RE.match(name):
        raise PublishError(f"dataset name {name!r} is invalid: use letters, digits, '.', '_', '-'")
    return ws.datasets_dir / name


def list_versions(ws: Workspace, name: str) -> list[str]:
    """Published versions of `name`, oldest first (v1, v2, ...)."""
    root = dataset_dir(ws, name)
    if not root.is_dir():
        return []
    found = [p.name for p in root.iterdir() if p.is_dir() and _VERSION_RE.match(p.name)
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


BACKEND_TAGS = {"cuda": ["cuda", "gpu-kernels"], "musa": ["musa", "gpu-kernels"],
                "cpu": ["cpp", "cpu-kernels", "openmp"]}
BACKEND_WORDS = {"cuda": "CUDA kernels compiled with nvcc and checked on an NVIDIA GPU",
                 "musa": "MUSA kernels compiled and checked on a Moore Threads GPU",
                 "cpu": "C++ (OpenMP) kernels compiled with the host compiler and checked on "
                        "the CPU"}


def _backends(tables: dict[str, pa.Table]) -> list[str]:
    """The backends whose kernels (made and verified) are in the rows."""
    found: set[str] = set()
    for table in tables.values():
        if "backend" in table.column_names:
            found.update(b for b in table.column("backend").to_pylist() if b)
    return sorted(found)


def backend_tags(backends: list[str]) -> list[str]:
    """Card tags naming the backends that made and checked the kernels, nothing else."""
    tags = ["code", "kernelbench", "synthetic"]
    for b in backends:
        tags += [t for t in BACKEND_TAGS.get(b, [b]) if t not in tags]
    return tags


def backend_sentence(backends: list[str]) -> str:
    if not backends:
        return "No kernel rows in this version."
    return ("Kernels in this version: " + "; ".join(BACKEND_WORDS.get(b, b) for b in backends)
            + ". The `backend` column of every row names the one that made and checked it.")


def _card(name: str, version: str, manifest: dict[str, Any], stats: dict[str, Any] | None,
          license_id: str) -> str:
    configs = []
    for config in manifest["configs"]:
        splits = manifest["counts"][config]
        configs.append({
            "config_name": config,
            "data_files": [{"split": s, "path": f"{config}/{s}-*.parquet"} for s in splits],
            **({"default": True} if config == "sft" else {}),
        })
    backends = manifest.get("backends", [])
    front = {"license": license_id, "pretty_name": f"{name} {version}",
             "tags": backend_tags(backends), "task_categories": ["text-generation"],
             "configs": configs}
    lines = ["---", yaml.safe_dump(front, sort_keys=False).rstrip(), "---", "",
             f"# {name} {version}", "", backend_sentence(backends), "",
             "Verified training data for LLMs that write kernels, produced by kernelsynth: "
             "PyTorch modules become KernelBench-style tasks; template, LLM, mutation and "
             "repair generators write `ModelNew` kernels; the staged verifier (extract, static "
             "anti-cheat checks, compile, correctness on seeded inputs, timing against eager "
             "and torch.compile) keeps what is correct and measures what is faster; a "
             "diversity-preserving selection keeps up to k distinct kernels per task.", "",
             "## Subsets", "", "| config | train | validation | description |",
             "| --- | ---: | ---: | --- |"]
    for config in manifest["configs"]:
        c = manifest["counts"][config]
        lines.append(f"| `{config}` | {c.get('train', 0)} | {c.get('validation', 0)} | "
                     f"{CONFIG_DESCRIPTIONS.get(config, '')} |")
    if manifest.get("empty_configs"):
        lines += ["", "Empty in this version (left out so every listed subset loads): "
                  + ", ".join(f"`{c}`" for c in manifest["empty_configs"]) + "."]
    lines += ["", "Splits are made per dedup cluster, so no near-duplicate task appears in both "
              "train and validation.", "", "```python", "from datasets import load_dataset",
              'ds = load_dataset("<repo or folder>", name="sft")', "```", ""]
    if stats:
        funnel = stats.get("funnel", {})
        lines += ["## Statistics", "", "| stage | count |", "| --- | ---: |"]
        lines += [f"| {k} | {v} |" for k, v in funnel.items()]
        metrics = stats.get("metrics", {})
        if metrics:
            lines += ["", "| metric | value |", "| --- | ---: |"]
            lines += [f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |"
                      for k, v in metrics.items()]
        lines.append("")
    lin = manifest["lineage"]
    lines += ["## How it was made", "",
              f"- parent version: {manifest['parent_version'] or 'none'}",
              f"- verifier version(s): {', '.join(lin.get('verifier_versions', [])) or 'n/a'}",
              f"- hardware: {', '.join(lin.get('devices', [])) or 'n/a'}",
              f"- kernelsynth commit: {lin.get('code_commit') or 'n/a'}",
              f"- source repositories: {len(lin.get('source_commits', []))}",
              f"- content hash: `{manifest['content_hash']}`", "",
              "`manifest.json` lists every file with its SHA-256, the full configuration and the "
              "source commits.", ""]
    return "\n".join(lines)


def publish_version(ws: Workspace, tables: dict[str, pa.Table], cfg: Config,
                    lineage: dict[str, Any], *, stats: dict[str, Any] | None = None,
                    version: str | None = None) -> Path:
    """Write a new version of `cfg.publish.name` atomically and register it in the catalog.

    `lineage` holds source_commits, verifier_versions, devices, code_commit (whatever is known);
    `stats` (from pipeline.stats; default: the statistics of the whole workspace) is stored as
    stats.json and summarised in the card.
    """
    name = cfg.publish.name
    root = dataset_dir(ws, name)
    existing = list_versions(ws, name)
    parent = existing[-1] if existing else None
    if version is None:
        version = f"v{int(parent[1:]) + 1}" if parent else "v1"
    if not _VERSION_RE.match(version):
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
                        "sha256": _sha256(path), "bytes": path.stat().st_size, "rows": rows}
        data_hash = hashlib.sha256("\n".join(
            f"{p}:{f['sha256']}" for p, f in sorted(files.items())).encode()).hexdigest()
        manifest: dict[str, Any] = {
            "name": name, "version": version, "parent_version": parent,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "configs": list(counts), "empty_configs": empty, "counts": counts,
            "content_hash": data_hash,
            "lineage": {
                "source_commits": lineage.get("source_commits", []),
                "verifier_versions": lineage.get("verifier_versions", []),
                "devices": lineage.get("devices", []),
                "code_commit": lineage.get("code_commit") or _code_commit(),
                "runs": lineage.get("runs", []),
                "host": lineage.get("host", {"platform": platform.platform(),
                                             "python": platform.python_version()}),
            },
            "config": cfg.model_dump(mode="json"),
            "backends": _backends(tables),
        }
        if stats:
            (tmp / STATS).write_text(json.dumps(stats, indent=2) + "\n",
                                     encoding="utf-8")
        (tmp / CARD).write_text(_card(name, version, manifest, stats, cfg.publish.license),
                                encoding="utf-8")
        for extra in (STATS, CARD):
            if (tmp / extra).exists():
                files[extra] = {"sha256": _sha256(tmp / extra),
                                "bytes": (tmp / extra).stat().st_size}
        manifest["files"] = dict(sorted(files.items()))
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    from pipeline.catalog import register_version  # catalog imports publish's readers

    try:
        register_version(ws, final)
    except duckdb.Error as exc:
        # The version is complete and valid; the catalog picks it up the next time it opens.
        log.warning("%s: published, but catalog.duckdb could not register it (%s)", final,
                    str(exc).splitlines()[0])
    return final


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
        got = _sha256(path)
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


def publish_workspace(ws: Workspace, cfg: Config, version: str | None = None) -> Path:
    """Select, build every config, compute statistics and publish a new version."""
    rec = _workspace_records(ws)
    sel = cfg.select
    selected = SELECTORS[sel.method](rec["candidates"], rec["verdicts"], sel.k,
                                     sel.diversity_weight, sel.seed)
    tables = build_datasets(rec["tasks"], rec["candidates"], rec["verdicts"], selected, cfg)
    stats = compute_stats(rec["tasks"], rec["candidates"], rec["verdicts"],
                          sourced=rec["sourced"], rejections=rec["rejections"],
                          fast_threshold=cfg.verify.fast_threshold)
    stats["selected"] = len(selected)
    lineage = {
        "source_commits": sorted({f"{t.repo_url}@{t.commit}" for t in rec["tasks"]
                                  if t.repo_url or t.commit}),
        "verifier_versions": sorted({v.verifier_version for v in rec["verdicts"]
                                     if v.verifier_version}),
        "devices": sorted({v.device for v in rec["verdicts"] if v.device}),
        "code_commit": _code_commit(),
        "runs": ws.runs(),
        "host": {"platform": platform.platform(), "python": platform.python_version()},
    }
    return publish_version(ws, tables, cfg, lineage, stats=stats, version=version)
