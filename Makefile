.PHONY: setup demo test lint

setup:
	bash scripts/setup.sh

# The main job: set up, then build a dataset version from the built-in default sources.
demo: setup
	.venv/bin/kernelsynth build

# Set up, then run the test suite.
test: setup
	.venv/bin/python -m pytest -q -x --durations=15

lint: setup
	.venv/bin/ruff check .
