"""`kernelsynth ingest` and `kernelsynth github-search` (registered on import)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

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
    print_table,
    stage_progress_bars,
)


@app.command("ingest")
def ingest(
    manifest: Annotated[Path | None, typer.Option(
        "--manifest", help="Repo manifest YAML (url, ref, paths, license) to clone and scan.")
    ] = None,
    nnsmith: Annotated[int | None, typer.Option(
        "--nnsmith", help="Number of NNSmith graphs (overrides sources.nnsmith.count).")] = None,
    seed: Annotated[int | None, typer.Option(
        "--seed", help="NNSmith seed (overrides sources.nnsmith.seed).")] = None,
    no_default: Annotated[bool, typer.Option(
        "--no-default", help="Skip the built-in seed corpus and transformers sample.")] = False,
    workspace: WorkspaceOpt = None,
    config: ConfigOpt = None,
    json_: JsonOpt = False,
    stages: StagesOpt = None,
) -> None:
    """Collect PyTorch modules (seed corpus, transformers, NNSmith, git repos) as raw_modules."""
    from pipeline.plan import run_step
    from pipeline.runner import local_executor
    from pipeline.stages.ingest import sources_for_run
    from pipeline.workspace import WorkspaceError
    from sources.git_repos import ManifestError, load_manifest

    cfg, ws = open_context(workspace, config)
    if manifest is not None:
        try:
            load_manifest(manifest)  # fail fast on a malformed file, before any work
        except ManifestError as exc:
            raise fail(str(exc), 2) from None
    sources = sources_for_run(cfg.sources, nnsmith=nnsmith, seed=seed, default=not no_default)
    if manifest is not None:
        sources = sources.model_copy(update={"manifest": str(manifest)})
    cfg = cfg.model_copy(update={"sources": sources})
    try:
        ex = local_executor(ws, cfg, stages=stages)
        with stage_progress_bars(console, enabled=not json_):
            counts = run_step(ex, "ingest")
    except WorkspaceError as exc:
        raise fail(str(exc)) from None
    if json_:
        emit_json({"command": "ingest", "run": ex.run_id, **counts})
    else:
        rows = [[k, v] for k, v in sorted(counts.items())]
        print_table(f"ingest ({ex.run_id})", ["count", "value"], rows)
    if counts["modules"] == 0 and counts["existing"] == 0:
        raise typer.Exit(1)


@app.command("github-search")
def github_search(
    query: Annotated[str, typer.Argument(help="Search text, e.g. 'transformer attention'.")],
    out_path: Annotated[Path, typer.Option("--out", help="Manifest YAML to write.")] = Path(
        "repos.yaml"),
    stars: Annotated[int | None, typer.Option("--stars", help="Minimum stars.")] = None,
    topic: Annotated[list[str] | None, typer.Option("--topic", help="Topic (repeatable).")] = None,
    limit: Annotated[int, typer.Option("--limit", help="Maximum repositories.")] = 30,
    paths: Annotated[list[str] | None, typer.Option(
        "--paths", help="Glob of files to scan in each repo (repeatable).")] = None,
    api_url: Annotated[str, typer.Option(help="GitHub API base URL.")] = "https://api.github.com",
    json_: JsonOpt = False,
) -> None:
    """Search GitHub repositories (language:python) and write a repo manifest for `ingest`."""
    from sources.github import GitHubError, search_repositories, write_manifest

    token = os.environ.get("GITHUB_TOKEN") or None  # read once, here at the CLI edge
    if token is None:
        console.print("[yellow]note:[/yellow] GITHUB_TOKEN is not set; GitHub allows 10 "
                      "unauthenticated searches a minute", highlight=False)
    try:
        results = search_repositories(query, token=token, min_stars=stars, topics=topic,
                                      max_results=limit, api_url=api_url)
    except GitHubError as exc:
        raise fail(f"GitHub search needs network access to {api_url}: {exc}") from None
    write_manifest(results, out_path, paths=paths)
    if json_:
        for r in results:
            emit_json({"repo": r.full_name, "url": r.clone_url, "stars": r.stars,
                       "license": r.license})
    else:
        print_table(f"github search -> {out_path}", ["repo", "stars", "license", "ref"],
                    [[r.full_name, r.stars, r.license, r.default_branch] for r in results])
