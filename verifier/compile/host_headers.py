"""The light host header: a build unit's C++ side compiled against what a load_inline unit needs.

torch's load_inline puts `torch/extension.h` (all of libtorch's C++ API: nn, optim, data, jit,
serialize, plus torch/python.h) before a candidate's C++ sources. A unit of declarations and
pybind11 bindings needs far less: ATen and the torch:: factories (`torch/types.h`), pybind11 with
torch's tensor casters (`torch/csrc/utils/pybind.h`) and `torch::wrap_pybind_function`
(`torch/csrc/Exceptions.h`). On this repo's 2-core node (g++ 13, torch 2.13, user CPU seconds of
g++ by hand, 8 KernelBench-corpus specs): the precompiled header of the light set costs 20.3 s
against 30.2 s for torch/extension.h, and the 8-spec host unit on it 4.4 s against 6.9 s
(`benchmarks/results/build_speed_host_cpu2.md`: whole builds, both ways).
`verifier.compile.builder` compiles the unit with every `torch/extension.h` swapped for the light set
first and, when that fails on a torch or pybind name, as written (the full header's PCH), so
what candidates may write is unchanged (the device units do the same: `verifier.backends.cuda`).
A unit that compiles on the light set binds as on the full header: both declare the same pybind11
type casters (tests/verifier/test_host_headers.py compares them), so no binding that the full
header converts fails at call time.
"""

from __future__ import annotations

import re

LIGHT_HOST_HEADERS = ("#include <torch/types.h>\n#include <torch/csrc/utils/pybind.h>\n"
                      "#include <torch/csrc/Exceptions.h>\n")
FULL_HOST_HEADERS = "#include <torch/extension.h>\n"
_FULL_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*[<\"]torch/(extension|all|torch)\.h[>\"]"
                           r"[^\n]*$", re.MULTILINE)
# names only the full header declares: a unit using them is built as written at once
_NEEDS_FULL = re.compile(r"torch::nn\b|torch::optim\b|torch::jit\b|torch::data\b|"
                         r"torch::serialize\b|torch::autograd\b|torch::python\b|\bnn::|"
                         r"torch::(?:save|load)\b")
_TORCH_NAME = re.compile(r"torch|at::|c10|pybind|py::|namespace|THP|was not declared|"
                         r"has not been declared|incomplete type", re.IGNORECASE)


def light_host_text(text: str) -> str | None:
    """The unit with every torch/extension.h (all.h, torch.h) include swapped for the light
    set (the precompiled header, when there is one, includes it first), or None when the unit
    names what only the full header has."""
    if not _FULL_INCLUDE.search(text) or _NEEDS_FULL.search(text):
        return None
    return _FULL_INCLUDE.sub(LIGHT_HOST_HEADERS.rstrip("\n"), text)


def may_need_full_header(log: str) -> bool:
    """Whether a failed light compile's errors may be the light header's doing (a torch or
    pybind name missing), so the unit is built again as written; False when every error is
    the candidate's own."""
    messages = [ln.split("error", 1)[1] for ln in log.splitlines() if "error" in ln
                and not ln.startswith("$ ")]
    if not messages:
        return True  # no diagnostics (killed, crashed): build as written
    return any(_TORCH_NAME.search(m) for m in messages)
