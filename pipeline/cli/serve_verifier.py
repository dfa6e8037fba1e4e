"""`kernelsynth serve-verifier`: the verifier's HTTP reward service with the workspace's config."""

from __future__ import annotations

from typing import Annotated

import typer

from pipeline.cli.app import app
from pipeline.cli.common import ConfigOpt, WorkspaceOpt, fail, open_context


@app.command("serve-verifier")
def serve_verifier(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free one).")] = 8008,
    backend: Annotated[str | None, typer.Option(help="cpu, cuda, musa or auto "
                                                      "(default: verify.backend).")] = None,
    max_concurrency: Annotated[int, typer.Option(help="Batches verifying at once.")] = 2,
    timeout: Annotated[float, typer.Option(help="Seconds per request at most.")] = 600.0,
    max_body_mb: Annotated[float, typer.Option(help="Largest request body.")] = 16.0,
    max_items: Annotated[int, typer.Option(help="Completions per request at most.")] = 1024,
    workspace: WorkspaceOpt = None,
    config: ConfigOpt = None,
) -> None:
    """HTTP reward service for RL (POST /verify, POST /get_reward, GET /health)."""
    from pipeline.stages.verify import verify_options
    from verifier.reward.server import ServiceLimits, serve

    cfg, ws = open_context(workspace, config)
    if backend not in (None, "auto", "cpu", "cuda", "musa"):
        raise fail(f"unknown backend {backend!r}: use cpu, cuda, musa or auto")
    if max_concurrency < 1 or timeout <= 0 or max_items < 1 or max_body_mb <= 0:
        raise fail("--max-concurrency and --max-items must be >= 1, --timeout and "
                   "--max-body-mb > 0")
    opts = verify_options(cfg.verify, ws.cache_dir)
    if backend:
        opts.backend = backend
    try:
        serve(host, port, opts, ServiceLimits(max_concurrency=max_concurrency, timeout_s=timeout,
                                              max_body_bytes=int(max_body_mb * (1 << 20)),
                                              max_items=max_items, isolate_batches=True))
    except OSError as exc:
        raise fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
