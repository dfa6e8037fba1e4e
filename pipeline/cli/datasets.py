"""`kernelsynth` commands for the datasets stage: publish, push, stats, report."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from pipeline.cli.app import app
from pipeline.cli.common import (
    ConfigOpt,
    JsonOpt,
    StagesOpt,
    WorkspaceOpt,
    console,
    emit_json,
    fail,
    open_context,
    out,
    print_table,
)

# Data libraries (duckdb, polars, datasets, huggingface_hub, matplotlib) are imported inside the
# commands that use them, so `kernelsynth --help` and the other commands start quickly.

NameOpt = Annotated[str | None, typer.Option("--name", help="Dataset name (default: config).")]


@app.command("publish")
def publish(
    workspace: WorkspaceOpt = None,
    config: ConfigOpt = None,
    json_: JsonOpt = False,
    stages: StagesOpt = None,
    name: NameOpt = None,
    version: Annotated[str | None, typer.Option(help="Version (default: next v<N>).")] = None,
    always_publish: Annotated[bool | None, typer.Option(
        "--always-publish/--skip-unchanged",
        help="Publish a version even when nothing changed (default: config, skip).")] = None,
) -> None:
    """Build every dataset config from the workspace and write a new dataset version, unless
    nothing changed since the latest (then the latest is kept)."""
    from pipeline.datasets.versions import PublishError, VersionIntegrityError, read_manifest
    from pipeline.plan import run_step
    from pipeline.runner import local_executor
    from pipeline.workspace import WorkspaceError

    cfg, ws = open_context(workspace, config)
    if name:
        cfg = cfg.model_copy(update={"publish": cfg.publish.model_copy(update={"name": name})})
    try:
        pub = run_step(local_executor(ws, cfg, stages=stages), "publish", always=always_publish,
                       version=version)
    except (WorkspaceError, PublishError, VersionIntegrityError) as exc:
        raise fail(str(exc)) from None
    path = Path(pub["path"])
    manifest = read_manifest(path)
    if json_:
        emit_json({"path": str(path), "version": manifest["version"],
                   "published": pub["published"],
                   "parent_version": manifest["parent_version"], "counts": manifest["counts"],
                   "content_hash": manifest["content_hash"]})
        return
    rows = [[c, s.get("train", 0), s.get("validation", 0)] for c, s in manifest["counts"].items()]
    state = "" if pub["published"] else " (no new data: the latest version, kept)"
    print_table(f"{manifest['name']} {manifest['version']} -> {path}{state}",
                ["config", "train", "validation"], rows)


@app.command("push")
def push(
    version: Annotated[str, typer.Argument(help="Version to push, e.g. v3.")],
    repo: Annotated[str | None, typer.Option("--repo", help="Hub dataset repo ORG/NAME "
                                                          "(default: publish.hub_repo).")] = None,
    private: Annotated[bool | None, typer.Option("--private/--public",
                                                 help="Repo visibility (default: config).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the operations only.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace main even when it holds a "
                                        "newer, diverged or foreign version.")] = False,
    workspace: WorkspaceOpt = None,
    config: ConfigOpt = None,
    json_: JsonOpt = False,
    name: NameOpt = None,
) -> None:
    """Make the Hub repo's main exactly a version in one commit (stale files deleted), tag it."""
    from pipeline.datasets.hub import HubError, push_version
    from pipeline.datasets.versions import PublishError, VersionIntegrityError, find_version

    cfg, ws = open_context(workspace, config)
    # The token is read here, at the CLI edge: HF_TOKEN first, then the saved login.
    token = os.environ.get("HF_TOKEN")
    if not token and not dry_run:
        from huggingface_hub import get_token

        token = get_token()
    repo = repo or cfg.publish.hub_repo
    if not repo:
        raise fail("no Hub repo: pass --repo ORG/NAME or set publish.hub_repo in the config")
    try:
        path = find_version(ws, version, name or None)
        plan = push_version(path, repo, token=token, dry_run=dry_run, force=force,
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
    import duckdb

    from pipeline.datasets.catalog import open_catalog
    from pipeline.datasets.publish import workspace_stats
    from pipeline.datasets.versions import (
        PublishError,
        VersionIntegrityError,
        find_version,
        read_stats,
    )
    from pipeline.workspace import WorkspaceError

    cfg, ws = open_context(workspace, config)
    try:
        if version:
            data = read_stats(find_version(ws, version, name))
            if not data:
                raise fail(f"version {version} has no stored statistics")
        else:
            data = workspace_stats(ws, cfg)
            try:  # keep catalog.duckdb's views current with the workspace
                open_catalog(ws).close()
            except duckdb.Error as exc:
                console.print(f"[yellow]warning:[/yellow] catalog.duckdb not refreshed: "
                              f"{str(exc).splitlines()[0]}", highlight=False)
    except (WorkspaceError, PublishError, VersionIntegrityError) as exc:
        raise fail(str(exc)) from None
    if json_:
        emit_json(data)
    else:
        _print_stats(data)


@app.command("report")
def report(
    version: Annotated[str | None, typer.Option(help="The version to report on (default: the "
                                                     "latest).")] = None,
    out_file: Annotated[Path | None, typer.Option("--out", help="HTML file (default: next to "
                                                                "the version).")] = None,
    workspace: WorkspaceOpt = None,
    config: ConfigOpt = None,
    name: NameOpt = None,
) -> None:
    """Write an HTML page with plots of a version's statistics."""
    from pipeline.datasets.report import write_report
    from pipeline.datasets.versions import (
        PublishError,
        VersionIntegrityError,
        find_version,
        list_versions,
    )

    cfg, ws = open_context(workspace, config)
    try:
        if version is None:
            dataset = name or cfg.publish.name
            published = list_versions(ws, dataset)
            if not published:
                raise fail(f"{ws.datasets_dir / dataset}: no published version of {dataset!r}; "
                           "run `kernelsynth build` or `kernelsynth publish` first")
            version = published[-1]
        path = write_report(find_version(ws, version, name), out_file)
    except (PublishError, VersionIntegrityError) as exc:
        raise fail(str(exc)) from None
    out.print(str(path), highlight=False)
