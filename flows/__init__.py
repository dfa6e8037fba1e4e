"""kernelsynth flows."""
