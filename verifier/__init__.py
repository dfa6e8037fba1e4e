"""The kernelsynth execution verifier (torch + stdlib only). CLI: python -m verifier.

Rooms, imported one way (top to bottom; `tests/test_architecture.py` holds the order):
`reward/` (the reward service, TRL and verl reward functions, batch files), `api` and `stages`
(`verify_batch`, the pools; one candidate's stages), `run/` (the worker, execution slots, the
fork server), `judge/` (references, output comparison, the clock, the GPU referee, performance
and reward), `compile/` (batched, namespaced, cached builds), `checks/` (extract, static rules,
load_inline specs, the preprocessor's view), `backends/` (cpu and the GPU backends), `isolation/`
(namespaces, sandboxes, cgroups), and `protocol` (the data contract) with `pyast`.
"""
