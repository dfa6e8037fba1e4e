"""`python -m pipeline.cli` runs the kernelsynth CLI."""

from pipeline.cli import main

main()
