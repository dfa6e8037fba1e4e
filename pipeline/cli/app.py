"""The Typer application and its command groups; command modules register on these."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="kernelsynth",
    help="Manufacture verified training data for LLMs that write GPU kernels.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
tasks_app = typer.Typer(help="KernelBench tasks: validate files, build from sources, show.",
                        no_args_is_help=True)
config_app = typer.Typer(help="Show the effective configuration.", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")
app.add_typer(config_app, name="config")
