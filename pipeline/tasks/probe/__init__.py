"""Probe: run a task in a sandboxed child of the verifier's fork server (inputs, op inventory,
FLOPs, shapes, validity checks), with CPU-size copies (`scale`, `dims`) and checked variants."""
