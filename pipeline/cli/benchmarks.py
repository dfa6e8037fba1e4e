"""`kernelsynth benchmarks fetch kernelbench` (registered on import)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from pipeline.cli.app import app
from pipeline.cli.common import (
    ConfigOpt,
    JsonOpt,
    WorkspaceOpt,
    emit_json,
    fail,
    open_context,
    print_table,
)
from pipeline.tasks.curate.kernelbench_index import (
    BUILTIN,
    KERNELBENCH_COMMIT,
    KERNELBENCH_REPO,
    BenchmarkIndexError,
    fetch_kernelbench,
)

benchmarks_app = typer.Typer(help="Benchmark fingerprint indexes used for decontamination.",
                             no_args_is_help=True)
app.add_typer(benchmarks_app, name="benchmarks")


@benchmarks_app.command("fetch")
def fetch(
    name: Annotated[str, typer.Argument(help="The benchmark: kernelbench.")],
    repo: Annotated[str, typer.Option(help="Git URL, file:// URL or local path.")] = (
        KERNELBENCH_REPO),
    commit: Annotated[str, typer.Option(help="The pinned commit to index.")] = KERNELBENCH_COMMIT,
    out: Annotated[Path | None, typer.Option(
        help="Index file (default: <workspace>/benchmarks/kernelbench.json, which "
             "`tasks.decontaminate_against: [kernelbench]` then uses).")] = None,
    workspace: WorkspaceOpt = None,
    config: ConfigOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Rebuild a benchmark's fingerprint index (op sequences, n-gram hashes, shapes; no text)."""
    if name != BUILTIN:
        raise fail(f"benchmarks fetch {name!r}: unknown benchmark (known: {BUILTIN})", 2)
    cfg, ws = open_context(workspace, config)
    target = out or ws.root / "benchmarks" / f"{BUILTIN}.json"
    try:
        index = fetch_kernelbench(target, repo, commit, cfg.tasks.ngram)
    except BenchmarkIndexError as exc:
        raise fail(str(exc)) from None
    levels = Counter(e.level for e in index.entries)
    traced = sum(not e.trace.startswith("none") for e in index.entries)
    summary = {"command": "benchmarks fetch", "benchmark": name, "source": index.source,
               "index": str(target), "files": len(index.entries), "traced": traced,
               **{f"files:{k}": v for k, v in sorted(levels.items())}}
    if json_:
        emit_json(summary)
    else:
        print_table("benchmarks fetch", ["count", "value"],
                    [[k, v] for k, v in summary.items() if k != "command"])
