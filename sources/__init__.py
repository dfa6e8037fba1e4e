"""kernelsynth sources."""
