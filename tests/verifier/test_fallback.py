"""Fallback judged by what runs: op classification from torch's metadata, the policies, the
static rules that are never findings, and load_inline forms found without running the module."""

from __future__ import annotations

import ast

import pytest
import torch

from verifier.checks.extspec import ExtensionError, ExtensionSpec, specs_from_source, split_flags
from verifier.checks.fallback import apply_policy, errors, judge_ops, make_trace_mode, op_kind
from verifier.checks.static import check_python
from verifier.protocol import VerifyOptions

TASK = "import torch\n"
HEAD = "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n"


@pytest.mark.parametrize("op,kind", [
    ("aten.view.default", "view"), ("aten.permute.default", "view"),
    ("aten.split.Tensor", "view"), ("aten.expand.default", "view"),
    ("aten.sym_size.int", "shape"), ("aten.empty.memory_format", "allocation"),
    ("aten.zeros_like.default", "allocation"), ("aten.new_empty.default", "allocation"),
    ("aten.fill_.Scalar", "allocation"), ("aten.cat.default", "copy"),
    ("aten.clone.default", "copy"), ("aten.copy_.default", "copy"),
    ("aten.view_copy.default", "copy"), ("aten.rand.default", "random"),
    ("aten.randn_like.default", "random"), ("aten.mm.default", "compute"),
    ("aten.addmm.default", "compute"), ("aten.relu_.default", "compute"),
    ("aten.add.out", "compute"), ("aten.convolution.default", "compute"),
    ("aten.equal.default", "compute"), ("aten.native_dropout.default", "compute"),
])
def test_op_kind_from_schema_and_tags(op: str, kind: str) -> None:
    assert op_kind(op) == kind


def test_trace_records_ops_with_candidate_lines() -> None:
    code = "def f(x):\n    y = x.view(-1)\n    return torch.cat([y, y]).relu()\n"
    ns: dict = {"torch": torch}
    exec(compile(code, "candidate.py", "exec"), ns)
    x = torch.randn(4)
    with torch.no_grad(), make_trace_mode() as tr:
        ns["f"](x)
    findings, cheat = judge_ops(tr.ops, "strict", tr.own_calls)
    assert [f["message"].split()[2] for f in findings] == ["aten.relu.default"]
    assert findings[0]["line"] == 3 and "line 3" in cheat
    # partial: the op is a warning, but nothing of the candidate's own ran
    findings, cheat = judge_ops(tr.ops, "partial", 0)
    assert findings[0]["severity"] == "warning" and "no function" in cheat
    assert judge_ops(tr.ops, "partial", 1)[1] == ""
    with pytest.raises(ValueError):
        judge_ops(tr.ops, "lenient", 1)


def test_fallback_option_is_validated() -> None:
    assert VerifyOptions(fallback="partial").fallback == "partial"
    with pytest.raises(ValueError):
        VerifyOptions(fallback="loose")


def _findings(forward: str, init: str = "pass", pre: str = "") -> list[dict]:
    code = (HEAD + pre + "ext = load_inline('e', 'x', functions=['f'])\n\n"
            "class ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            f"        {init}\n\n    def forward(self, x):\n        {forward}\n")
    return check_python(ast.parse(code), TASK)


@pytest.mark.parametrize("forward,init", [
    ("return torch.flatten(ext.f(x))", "pass"),
    ("return torch.cat([ext.f(x), ext.f(x)])", "pass"),
    ("return ext.f(x).view(-1)", "pass"),
    ("return self.drop(ext.f(x))", "self.drop = nn.Dropout(0.1)"),
    ("return self.drop(ext.f(x))", "self.drop = nn.Dropout(p=0.0)"),
    ("return self.idn(ext.f(x))", "self.idn = nn.Identity()"),
    ("return torch.nn.functional.dropout(ext.f(x), 0.1, self.training)", "pass"),
    ("return torch.stack([ext.f(x)]).reshape(x.shape)", "pass"),
])
def test_views_copies_and_eval_dropout_are_never_findings(forward: str, init: str) -> None:
    assert _findings(forward, init) == []


@pytest.mark.parametrize("forward", [
    "return torch.nn.functional.conv2d(x, x)", "return torch.matmul(x, x)",
    "return x @ x", "return torch.relu(ext.f(x))",
])
def test_unambiguous_compute_stays_a_static_finding(forward: str) -> None:
    found = _findings(forward)
    assert [f["rule"] for f in found] == ["torch_compute"]
    assert errors(apply_policy(found, "strict")) and not errors(apply_policy(found, "partial"))


def test_arch_list_env_is_a_build_setting_not_an_escape() -> None:
    pre = "import os\n\nos.environ['TORCH_CUDA_ARCH_LIST'] = '9.0'\n"
    assert _findings("return ext.f(x)", pre=pre) == []
    assert _findings("return ext.f(x)", pre="import os\n\nos.environ['LD_PRELOAD'] = 'x'\n")
    assert _findings("return ext.f(x)", pre=pre + "os.system('ls')\n")


@pytest.mark.parametrize("flags,argv", [
    ([""], []), ([" ", "\t"], []), (["-O3 --use_fast_math"], ["-O3", "--use_fast_math"]),
    ([" -O2 ", "-DX=1 -DY=2"], ["-O2", "-DX=1", "-DY=2"]), ("-O3", ["-O3"]),
    (['-DMSG="a b"'], ["-DMSG=a b"]),
])
def test_flags_split_like_torchs_ninja_shell(flags: list[str], argv: list[str]) -> None:
    assert split_flags(flags, "extra_cflags") == argv


def test_load_inline_arguments_like_torch() -> None:
    s = ExtensionSpec.from_call(("n", "src"), {"extra_cflags": [""], "extra_ldflags": [" "],
                                                "functions": {"f": "doc"}, "verbose": True,
                                                "with_pytorch_error_handling": False})
    assert s.extra_cflags == [] and s.extra_ldflags == [] and s.docstrings == ["doc"]
    assert not s.error_handling and s.key != ExtensionSpec.from_call(
        ("n", "src"), {"functions": ["f"]}).key
    with pytest.raises(ExtensionError):  # torch: "Expected 'functions' to be a list or dict"
        ExtensionSpec.from_call(("n", "src"), {"functions": ("f",)})
    bad = ExtensionSpec.from_call(("n", "src"), {"extra_cflags": ['-DX="a']})
    assert "extra_cflags" in bad.unsupported and not bad.batchable
    assert ExtensionSpec.from_call(("n", "s"), {"is_python_module": False}).unsupported


SRC = 'src = "int f(int a) { return a; }"\n'


@pytest.mark.parametrize("body", [
    "def build():\n    return load_inline('e', src, functions=['f'])\n\next = build()\n",
    "try:\n    ext = load_inline('e', src, functions=['f'])\nexcept Exception:\n    raise\n",
    "class ModelNew:\n    ext = load_inline('e', src, functions=['f'])\n",
    "class ModelNew:\n    def __init__(self):\n        body = src\n"
    "        self.ext = load_inline(name='e', cpp_sources=[body], functions=['f'])\n",
])
def test_load_inline_in_functions_classes_and_try_is_found_statically(body: str) -> None:
    (spec,) = specs_from_source(HEAD + SRC + body)
    assert spec.functions == ["f"] and spec.cpp_sources == ["int f(int a) { return a; }"]


def test_name_assigned_in_two_branches_needs_a_run() -> None:
    code = HEAD + "if 1:\n    src = 'a'\nelse:\n    src = 'b'\next = load_inline('e', src)\n"
    assert specs_from_source(code) is None
    assert specs_from_source(HEAD + SRC + "for i in range(2):\n    x = i\n"
                             "ext = load_inline('e', src)\n") is not None
