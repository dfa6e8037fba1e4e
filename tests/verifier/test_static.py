"""Stage 2: each static rule fires on its pattern, with the line, and not on clean code."""

from __future__ import annotations

import ast

import pytest

from verifier.checks.extspec import ExtensionSpec
from verifier.checks.static import check_cpp, check_python

TASK32 = "import torch\nclass Model: pass\ndef get_inputs(): return [torch.randn(4)]\n"
TASK16 = "import torch\ndef get_inputs(): return [torch.randn(4, dtype=torch.float16)]\n"
CLEAN = """import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline
ext = load_inline(name="e", cpp_sources="", functions=["f"])
class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.w = nn.Parameter(torch.randn(n))
        self.fc = nn.Linear(n, n)
    def forward(self, x):
        y = torch.empty_like(x)
        x = x.contiguous().view(-1)
        return ext.f(x, self.fc.weight, y)
"""


def rules(code: str, task: str = TASK32) -> list[tuple[str, int | None]]:
    return [(f["rule"], f["line"]) for f in check_python(ast.parse(code), task)]


def test_clean_candidate_has_no_findings() -> None:
    assert rules(CLEAN) == []


@pytest.mark.parametrize("line,rule", [
    ("        return torch.relu(x)", "torch_compute"),
    ("        return F.gelu(x)", "torch_compute"),
    ("        return x @ self.w", "torch_compute"),
    ("        return x.sum()", "torch_compute"),
    ("        return self.fc(x)", "nn_layer"),
    ("        return ext.f(x.half())", "precision_downgrade"),
    ("        return Model()(x)", "reference_model"),
    ("        return open('/etc/passwd')", "escape"),
    ("        torch.set_num_threads(64)", "monkey_patch"),
    ("        s = torch.cuda.Stream()", "threads_streams"),
    ("        return x.__class__.__bases__", "escape"),
])
def test_forward_rules(line: str, rule: str) -> None:
    code = CLEAN.replace("        return ext.f(x, self.fc.weight, y)", line)
    found = rules(code)
    assert (rule, len(code.splitlines()) ) in found or any(r == rule for r, _ in found), found
    assert any(r == rule and ln == code.splitlines().index(line) + 1 for r, ln in found)


@pytest.mark.parametrize("snippet,rule", [
    ("import os\n", "escape"),
    ("import subprocess\n", "escape"),
    ("import threading\n", "threads_streams"),
    ("from reference import Model\n", "reference_model"),
    ("import time\ntime.perf_counter = lambda: 0\n", "monkey_patch"),
    ("torch.allclose = lambda *a: True\n", "monkey_patch"),
])
def test_module_rules(snippet: str, rule: str) -> None:
    assert rule in {r for r, _ in rules(snippet + CLEAN)}


def test_try_fallback_in_modelnew() -> None:
    code = CLEAN.replace("        return ext.f(x, self.fc.weight, y)",
                         "        try:\n            return ext.f(x)\n        except Exception:\n"
                         "            return x")
    assert ("try_fallback", 13) in rules(code)


def test_subclassing_model() -> None:
    assert "reference_model" in {r for r, _ in rules(CLEAN.replace("ModelNew(nn.Module)",
                                                                   "ModelNew(Model)"))}


def test_half_allowed_in_half_task() -> None:
    code = CLEAN.replace("return ext.f(x, self.fc.weight, y)", "return ext.f(x.half())")
    assert rules(code, TASK16) == []


def _cpp(src: str, **kw) -> list[dict]:
    code = f'src = """\n{src}\n"""\n'
    return check_cpp([ExtensionSpec(name="e", cpp_sources=[f"\n{src}\n"], **kw)], code, TASK32)


@pytest.mark.parametrize("src,rule", [
    ("torch::Tensor f(torch::Tensor x) { return at::relu(x); }", "cpp_torch_compute"),
    ("torch::Tensor f(torch::Tensor x) { return torch::matmul(x, x); }", "cpp_torch_compute"),
    ("torch::Tensor f(torch::Tensor x) { return x.matmul(x); }", "cpp_torch_compute"),
    ("torch::Tensor f(torch::Tensor x) { return at::native::relu(x); }", "cpp_torch_compute"),
    ('void f() { FILE* h = fopen("/etc/passwd", "r"); }', "escape"),
    ('void f() { system("ls"); }', "escape"),
    ('#include "/etc/passwd"', "escape"),
    ("void f() { std::thread t([]{}); }", "threads_streams"),
    ("void f() { at::Half h; }", "precision_downgrade"),
])
def test_cpp_rules(src: str, rule: str) -> None:
    found = _cpp(src)
    assert any(f["rule"] == rule and f["line"] == 2 for f in found), found


def test_cpp_clean_and_comments_ignored() -> None:
    src = ("// at::relu(x) would be cheating\ntorch::Tensor f(torch::Tensor x) {\n"
           "  auto y = torch::empty_like(x); float* p = y.data_ptr<float>();\n"
           "  at::parallel_for(0, 4, 1, [&](int64_t a, int64_t b) {});\n  return y;\n}")
    assert _cpp(src) == []


@pytest.mark.parametrize("src", [
    "torch::Tensor f(torch::Tensor x) { auto y = x.clone(); return y; }",
    "torch::Tensor f(torch::Tensor x) { auto y = x . clone ( ); return y; }",
    "torch::Tensor f(torch::Tensor x) { return torch::clone(x); }",
    "torch::Tensor f(torch::Tensor x) { return at::clone(x, c10::nullopt); }",
    "torch::Tensor f(torch::Tensor* p) { auto x_clone = p->clone(); return x_clone; }",
    "#define COPY(t) t.clone()\ntorch::Tensor f(torch::Tensor x) { return COPY(x); }",
])
def test_tensor_clone_is_not_the_clone_syscall(src: str) -> None:
    assert _cpp(src) == []


@pytest.mark.parametrize("src", [
    "int f(void* s) { return clone(g, s, CLONE_VM, nullptr); }",
    "int f(void* s) { return ::clone(g, s, 0, nullptr); }",
    "int f(void* s) { return mylib::clone(g, s, 0, nullptr); }",
    "auto p = &clone;",
    'namespace at { extern "C" int clone(int (*)(void*), void*, int, void*, ...); }',
    "namespace at { using ::clone; }",
    "#define CL clone",
])
def test_clone_syscall_is_an_escape(src: str) -> None:
    found = _cpp(src)
    assert any(f["rule"] == "escape" and "clone" in f["message"] and f["line"] == 2
               for f in found), found


def test_compiler_flags_allowlist() -> None:
    assert _cpp("", extra_cflags=["-O3", "-fopenmp", "-march=native", "-DN=4"]) == []
    bad = _cpp("", extra_cflags=["-fplugin=/tmp/x.so"], extra_ldflags=["-Wl,--wrap=malloc"])
    assert [f["rule"] for f in bad] == ["compiler_flag", "compiler_flag"]


# nn.Module's own API, as KernelBench-leaderboard kernels use it (issue 29: `self.modules()`
# was an "escape" because `modules` is also sys.modules).
MODULE_API = """import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline
ext = load_inline(name="e", cpp_sources="", functions=["f"])
class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)
        for name, p in self.named_parameters():
            setattr(self, name.replace(".", "_") + "_t", p.detach())
        for i in range(2):
            setattr(self, f"w{i}", nn.Parameter(torch.zeros(n)))
        delattr(self, "w1")
        self.register_buffer("scale", torch.ones(n))
        self.apply(lambda m: None)
        sd = self.state_dict()
        self.load_state_dict(sd)
        kids = list(self.children()) + list(self.named_children()) + list(self.named_modules())
        bufs = list(self.buffers()) + list(self.named_buffers()) + list(self.parameters())
        self.fc.modules()
        self.add_module("extra", nn.Identity())
        self.register_parameter("b2", nn.Parameter(torch.zeros(n)))
        self.get_submodule("fc").requires_grad_(False)
    def forward(self, x):
        ws = [m.weight for m in self.modules() if isinstance(m, nn.Linear)]
        b = getattr(self, "fc").bias
        y = torch.empty_like(x)
        return ext.f(x, ws[0], b, y, getattr(self, "w0"))
"""


def test_nn_module_api_is_not_an_escape() -> None:
    assert rules(MODULE_API) == []


@pytest.mark.parametrize("snippet,line", [
    ("m = torch.nn\nd = m.modules\n", 2),  # not called: the dict form (sys.modules)
    ("setattr(torch, 'relu', abs)\n", 1),
    ("setattr(self, '__class__', int)\n", 1),
    ("delattr(torch.nn.functional, 'relu')\n", 1),
])
def test_module_api_names_still_catch_escapes(snippet: str, line: int) -> None:
    found = rules("import torch\n" + snippet)
    assert ("escape", line + 1) in found, found
