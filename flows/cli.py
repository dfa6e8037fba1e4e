"""`kernelsynth build` and `kernelsynth serve`: registered on the CLI through an entry point.

Prefect is imported inside the commands, after `configure_prefect` has set its environment
(quiet console, no telemetry, a Prefect home inside the workspace), because Prefect reads its
settings when first imported.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Annotated, Any

import typer

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
    stage_progress_bars,
)

RunnerOpt = Annotated[str | None, typer.Option(
    "--runner", help="Task runner: local (threads/processes) or ray (prefect-ray).")]


# The count that says how many records a stage added (the rest of its counts are details).
NEW_KEY = {"ingest": "raw_modules", "tasks": "tasks", "generate": "candidates",
           "mutate": "candidates", "repair": "candidates", "verify": "verdicts"}


def _attach_progress(json_: bool, verbose: bool) -> None:
    """Show the flows' progress lines on the terminal (stderr), one per batch and stage."""
    from rich.logging import RichHandler

    logger = logging.getLogger("kernelsynth.build")
    logger.handlers.clear()
    if json_ and not verbose:
        return
    handler = RichHandler(console=console, show_path=False, markup=False)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def config_rows(summary: dict[str, Any]) -> list[list[Any]]:
    """Rows per config and split of the version the build left (from its manifest)."""
    from pipeline.datasets.versions import read_manifest

    manifest = read_manifest(Path(summary["path"]))
    rows = [[c, s.get("train", 0), s.get("validation", 0), sum(s.values())]
            for c, s in manifest["counts"].items()]
    rows += [[c, 0, 0, "0 (left out: empty)"] for c in manifest.get("empty_configs", [])]
    return rows


def print_config_rows(summary: dict[str, Any]) -> None:
    """The rows-per-config table of the build's version."""
    print_table(f"rows per config ({summary['version']})",
                ["config", "train", "validation", "total"], config_rows(summary))


def print_summary(summary: dict[str, Any], wall_s: float) -> None:
    """The end-of-build report: per-stage times and throughput, the funnel, the version."""
    rows = []
    for row in summary["stages"]:
        counts = {k: v for k, v in row.items() if k not in ("stage", "seconds")}
        new = int(counts.get(NEW_KEY.get(row["stage"].split(":")[0], ""), 0) or 0)
        rate = f"{new / row['seconds']:.2f}" if new and row["seconds"] > 0 else ""
        rows.append([row["stage"], f"{row['seconds']:.1f}", new, rate,
                     ", ".join(f"{k}={v}" for k, v in counts.items())])
    print_table(f"build {summary['run_id']} ({summary['backend']}, runner "
                f"{summary['runner']}): {wall_s:.1f} s",
                ["stage", "seconds", "new records", "records/s", "counts"], rows)
    f = summary["funnel"]
    pct = lambda v: "" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    print_table("funnel (whole workspace)", ["step", "count", "rate"], [
        ["sourced modules", f["sourced_modules"], ""],
        ["tasks", f["tasks"], ""],
        ["candidates", f["candidates"], ""],
        ["verified", f["verified"], ""],
        ["compiled", f["compiled"], pct(f["compile_rate"])],
        ["correct", f["correct"], pct(f["pass_rate"])],
        ["  first attempts correct", "", pct(f["first_attempt_pass_rate"])],
        ["  repair turns correct", "", pct(f["repair_pass_rate"])],
        ["faster than eager", f["faster"], pct(f["fast_rate"])],
        ["tasks with a correct kernel", f["tasks_solved"], ""],
        ["median / max speedup (correct)", f"{f['median_speedup']} / {f['max_speedup']}", ""],
    ])
    print_config_rows(summary)
    if summary["published"]:
        out.print(f"new version [bold]{summary['version']}[/bold] (parent "
                  f"{summary.get('parent') or 'none'}): {summary['path']}", highlight=False)
    else:
        out.print(f"no new data: kept the latest version [bold]{summary['version']}[/bold]: "
                  f"{summary['path']}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add the flow commands to the kernelsynth CLI."""

    @app.command("build")
    def build(
        workspace: WorkspaceOpt = None,
        config: ConfigOpt = None,
        json_: JsonOpt = False,
        runner: RunnerOpt = None,
        always_publish: Annotated[bool | None, typer.Option(
            "--always-publish/--skip-unchanged",
            help="Publish a version even when nothing changed (default: config, skip).")] = None,
        verbose: Annotated[bool, typer.Option("--verbose", "-v",
                                              help="Show Prefect's own log lines.")] = False,
        stages: StagesOpt = None,
    ) -> None:
        """Run the whole pipeline as the Prefect flow `build_dataset` and publish a version."""
        cfg, ws = open_context(workspace, config)
        if runner not in (None, "local", "ray"):
            raise fail(f"--runner {runner!r}: expected local or ray", 2)
        from flows.env import configure_prefect

        configure_prefect(ws.root, quiet=not verbose)
        _attach_progress(json_, verbose)
        from flows.build import build_dataset

        t0 = time.perf_counter()
        try:
            with stage_progress_bars(console, enabled=not json_):
                summary = build_dataset(workspace=str(ws.root),
                                        config=str(config.resolve()) if config else None,
                                        always_publish=always_publish, runner=runner,
                                        stages=stages)
        except Exception as exc:
            raise fail(f"build failed: {type(exc).__name__}: {exc}") from None
        wall = time.perf_counter() - t0
        summary["wall_s"] = round(wall, 2)
        if json_:
            emit_json(summary)
        else:
            print_summary(summary, wall)

    @app.command("serve")
    def serve(
        workspace: WorkspaceOpt = None,
        config: ConfigOpt = None,
        cron: Annotated[str | None, typer.Option(help="Cron schedule (default: config).")] = None,
        name: Annotated[str | None, typer.Option(help="Deployment name (default: config).")] = None,
        limit: Annotated[int | None, typer.Option(help="Flow runs at once.")] = 1,
        stages: StagesOpt = None,
    ) -> None:
        """Serve `build_dataset` on a cron schedule; every run publishes a new version."""
        cfg, ws = open_context(workspace, config)
        from flows.env import configure_prefect

        configure_prefect(ws.root, quiet=True)
        from prefect import serve as prefect_serve
        from prefect.schedules import Cron

        from flows.build import build_dataset

        if not os.environ.get("PREFECT_API_URL"):
            console.print("[yellow]note:[/yellow] PREFECT_API_URL is not set: serving against a "
                          "temporary local server that stops with this process; point "
                          "PREFECT_API_URL at `prefect server start` for a lasting schedule.")
        params: dict[str, Any] = {"workspace": str(ws.root), "always_publish": True}
        if config is not None:
            params["config"] = str(Path(config).resolve())
        if stages:
            params["stages"] = stages
        deployment = build_dataset.to_deployment(
            name=name or cfg.flows.deployment_name,
            schedules=[Cron(cron or cfg.flows.schedule_cron, timezone=cfg.flows.schedule_timezone)],
            parameters=params,
            description="Nightly kernelsynth build: a new dataset version per run.",
            tags=["kernelsynth"],
        )
        prefect_serve(deployment, limit=limit)
