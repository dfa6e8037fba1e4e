"""The kernelsynth execution verifier (torch + stdlib only). CLI: python -m verifier.

Modules, in stage order: `extract` (code from a response, ModelNew interface), `static` (rules on
Python and C++), `extspec` (the candidate's load_inline calls; recorder and run-time shim),
`collect` (child: records load_inline calls of non-literal candidates), `build` (batched,
namespaced, PCH-accelerated, content-cached builds with bisection on failure), `worker` (child:
correctness, dispatcher trace, tamper checks, timing), `reward` (reward and feedback), `api`
(`verify_batch`, the pools), `sandbox` (limits, namespaces, pids cgroups), `backends` (cpu and
the GPU backends' interface), `protocol` (the data contract).
"""
