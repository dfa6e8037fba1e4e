"""kernelsynth pipeline: pure stage functions, the CLI, datasets, publishing, catalog."""
