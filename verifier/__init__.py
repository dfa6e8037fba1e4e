"""The kernelsynth execution verifier (torch + stdlib only). CLI: python -m verifier."""
