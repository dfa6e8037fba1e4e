"""`kernelsynth` commands for the datasets stage: publish, push, stats, report."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Annotated, Any

import typer

from pipeline.catalog import open_catalog
from pipeline.cli.app import app
from pipeline.cli.common import (
    ConfigOpt,
    JsonOpt,
    WorkspaceOpt,
    console,
    emit_json,
    fail,
    open_context,
    out,
    print_table,
)
from pipeline.config import Config
from pipeline.datasets import build_datasets
from pipeline.hub import HubError, push_version
from pipeline.publish import (
    PublishError,
    VersionIntegrityError,
    find_version,
    publish_version,
    read_stats,
)
from pipeline.report import write_report
from pipeline.select import SELECTORS
from pipeline.stats import compute_stats
from pipeline.workspace import Workspace, WorkspaceError
from schemas import Candidate, RawModule, Rejection, Task, Verdict

NameOpt = Annotated[str | None, typer.Option("--name", help="Dataset name (default: config).")]


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


@app.command("publish")
def publish(
    workspace: WorkspaceOpt = None,
    config: ConfigOpt = None,
    json_: JsonOpt = False,
    name: NameOpt = None,
    version: Annotated[str | None, typer.Option(help="Version (default: next v<N>).")] = None,
) -> None:
    """Build every dataset config from the workspace and write a new dataset version."""
    cfg, ws = open_context(workspace, config)
    if name:
        cfg = cfg.model_copy(update={"publish": cfg.publish.model_copy(update={"name": name})})
    try:
        path = publish_workspace(ws, cfg, version)
    except (WorkspaceError, PublishError, VersionIntegrityError) as exc:
        raise fail(str(exc)) from None
    from pipeline.publish import read_manifest

    manifest = read_manifest(path)
    if json_:
        emit_json({"path": str(path), "version": manifest["version"],
                   "parent_version": manifest["parent_version"], "counts": manifest["counts"],
                   "content_hash": manifest["content_hash"]})
        return
    rows = [[c, s.get("train", 0), s.get("validation", 0)] for c, s in manifest["counts"].items()]
    print_table(f"{manifest['name']} {manifest['version']} -> {path}",
                ["config", "train", "validation"], rows)


@app.command("push")
def push(
    version: Annotated[str, typer.Argument(help="Version to push, e.g. v3.")],
    repo: Annotated[str, typer.Option("--repo", help="Hub dataset repo ORG/NAME.")],
    private: Annotated[bool | None, typer.Option("--private/--public",
                                                 help="Repo visibility (default: config).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the operations only.")] = False,
    workspace: WorkspaceOpt = None,
    config: ConfigOpt = None,
    json_: JsonOpt = False,
    name: NameOpt = None,
) -> None:
    """Upload a version to the Hugging Face Hub in one commit and tag it with the version."""
    cfg, ws = open_context(workspace, config)
    # The token is read here, at the CLI edge: HF_TOKEN first, then the saved login.
    token = os.environ.get("HF_TOKEN")
    if not token and not dry_run:
        from huggingface_hub import get_token

        token = get_token()
    try:
        path = find_version(ws, version, name or None)
        plan = push_version(path, repo, token=token, dry_run=dry_run,
                            private=cfg.publish.private if private is None else private)
    except (PublishError, VersionIntegrityError, HubError) as exc:
        raise fail(str(exc)) from None
    if json_:
        emit_json({"repo": plan.repo_id, "version": plan.version, "dry_run": dry_run,
                   "operations": plan.describe(), "commit_url": plan.commit_url})
        return
    for line in plan.describe():
        out.print(("(dry run) " if dry_run else "") + line, highlight=False)
    if not dry_run:
        console.print(f"pushed {plan.version} to {plan.repo_id} {plan.commit_url}")


def _print_stats(stats: dict[str, Any]) -> None:
    print_table("funnel", ["stage", "count"], [[k, v] for k, v in stats["funnel"].items()])
    print_table("metrics", ["metric", "value"],
                [[k, f"{v:.4g}" if isinstance(v, float) else v]
                 for k, v in stats["metrics"].items()])
    print_table("speedup over eager", ["quantile", "value"],
                [[k, f"{v:.4g}" if isinstance(v, float) else v]
                 for k, v in stats["speedup"].items() if k != "histogram"])
    for key in ("by_level", "by_op_family", "by_source", "by_generator"):
        print_table(key.replace("_", " "), ["slice", "verified", "correct", "pass rate", "faster"],
                    [[k, d["verified"], d["correct"], f"{d['pass_rate']:.3f}", d["faster"]]
                     for k, d in stats[key].items()])
    print_table("compile-error taxonomy", ["class", "count"],
                [[k, v] for k, v in stats["compile_errors"].items()])


@app.command("stats")
def stats(
    version: Annotated[str | None, typer.Option(help="A published version (default: the "
                                                     "workspace as it is now).")] = None,
    workspace: WorkspaceOpt = None,
    config: ConfigOpt = None,
    json_: JsonOpt = False,
    name: NameOpt = None,
) -> None:
    """Print the funnel, pass rates, pass@k / fast_p metrics, speedups and compile errors."""
    cfg, ws = open_context(workspace, config)
    try:
        if version:
            data = read_stats(find_version(ws, version, name))
            if not data:
                raise fail(f"version {version} has no stored statistics")
        else:
            data = workspace_stats(ws, cfg)
            open_catalog(ws).close()  # keep catalog.duckdb's views current with the workspace
    except (WorkspaceError, PublishError, VersionIntegrityError) as exc:
        raise fail(str(exc)) from None
    if json_:
        emit_json(data)
    else:
        _print_stats(data)


@app.command("report")
def report(
    version: Annotated[str, typer.Option(help="The version to report on.")],
    out_file: Annotated[Path | None, typer.Option("--out", help="HTML file (default: next to "
                                                                "the version).")] = None,
    workspace: WorkspaceOpt = None,
    config: ConfigOpt = None,
    name: NameOpt = None,
) -> None:
    """Write an HTML page with plots of a version's statistics."""
    _, ws = open_context(workspace, config)
    try:
        path = write_report(find_version(ws, version, name), out_file)
    except (PublishError, VersionIntegrityError) as exc:
        raise fail(str(exc)) from None
    out.print(str(path), highlight=False)
