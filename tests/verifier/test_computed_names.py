"""Static rules through computed names and aliases (issue 28 "Fallback outside the traced calls"
and the frame walks): each form is an error finding naming its line and what was seen, under
both fallback policies where it hides more than a library op; legitimate forms are not."""

from __future__ import annotations

import ast

import pytest

from verifier.checks.computed_names import Names
from verifier.checks.fallback import apply_policy, errors
from verifier.checks.static import check_python

HEAD = ("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
        "from torch.utils.cpp_extension import load_inline\n"
        "ext = load_inline(name='e', cpp_sources='', functions=['f'])\n")


def _cand(forward: str, pre: str = "", init: str = "        pass\n") -> str:
    return (HEAD + pre + "class ModelNew(nn.Module):\n    def __init__(self):\n"
            "        super().__init__()\n" + init + "    def forward(self, x):\n" + forward)


def _errors(code: str, policy: str) -> list[dict]:
    return errors(apply_policy(check_python(ast.parse(code), "import torch\n"), policy))


def _line(code: str, needle: str) -> int:
    return next(i for i, ln in enumerate(code.splitlines(), 1) if needle in ln)


# (case, code, rule, the text on the flagged line, whether `partial` rejects it too)
ATTACKS = [
    ("getattr concat", _cand("        return getattr(torch, 're' + 'lu')(x)\n"),
     "computed_attr", "getattr(torch, 're' + 'lu')", True),
    ("getattr concat, then called", _cand("        f = getattr(torch, 're' + 'lu')\n"
                                          "        return f(x)\n"), "torch_compute", "f(x)",
     True),
    ("getattr non-literal", _cand("        return getattr(torch, self.op)(x)\n"),
     "computed_attr", "getattr(torch, self.op)", True),
    ("F f-string", _cand("        n = 'relu'\n        return getattr(F, f'{n}')(x)\n"),
     "computed_attr", "getattr(F, f'{n}')", True),
    ("torch.nn.functional f-string of constants",
     _cand("        return getattr(torch.nn.functional, f\"{'re'}lu\")(x)\n"),
     "computed_attr", "names torch.nn.functional.relu", True),
    ("attrgetter", _cand("        import operator\n"
                         "        return operator.attrgetter('nn.functional.relu')(torch)(x)\n"),
     "computed_attr", "operator.attrgetter('nn.functional.relu')", True),
    ("attrgetter imported", _cand("        return ag('relu')(torch)(x)\n",
                                  pre="from operator import attrgetter as ag\n"),
     "computed_attr", "ag('relu')", True),
    ("reduce(getattr, ...)", _cand("        import functools\n        return functools.reduce("
                                   "getattr, ['nn', 'functional', 'relu'], torch)(x)\n"),
     "computed_attr", "getattr passed as a value", True),
    ("vars(torch)", _cand("        return vars(torch)['relu'](x)\n"), "escape", "vars(torch)",
     True),
    ("torch.__dict__", _cand("        return torch.__dict__['relu'](x)\n"), "escape",
     "torch.__dict__", True),
    ("torch._C alias", _cand("        if C._len_torch_dispatch_stack() == 0:\n"
                             "            return x\n        return ext.f(x)\n",
                             pre="C = torch._C\n"), "escape", "torch._C", True),
    ("from torch import _C", _cand("        return ext.f(x) if c._len_torch_dispatch_stack() "
                                   "else x\n", pre="from torch import _C as c\n"),
     "escape", "from torch import _C as c", True),
    ("import torch._C", _cand("        return ext.f(x)\n", pre="import torch._C as c\n"),
     "escape", "import torch._C as c", True),
    ("torch._C on self", _cand("        return ext.f(x) if self.c._len_torch_dispatch_stack() "
                               "else x\n", init="        self.c = torch._C\n"),
     "escape", "torch._C: reaches torch._C", True),
    ("getattr torch _C", _cand("        return getattr(torch, '_' + 'C')\n"), "escape",
     "getattr(torch, '_' + 'C')", True),
    ("importlib torch._C", _cand("        import importlib\n"
                                 "        return importlib.import_module('torch._C')\n"),
     "escape", "import importlib", True),
    ("__import__", _cand("        return __import__('torch')\n"), "escape",
     "__import__('torch')", True),
    ("sys via getattr", _cand("        return getattr(torch, 's' + 'ys')._getframe(1)\n"),
     "escape", "getattr(torch, 's' + 'ys')", True),
    ("sys via chr/join", _cand("        return getattr(torch, ''.join([chr(115), 'ys']))\n"),
     "escape", "reaches .sys", True),
    ("sys via a module constant", _cand("        return getattr(torch, NAME).modules\n",
                                        pre="NAME = 'S' + 'YS'\nNAME2 = NAME.lower()\n"),
     "computed_attr", "getattr(torch, NAME)", True),
    ("f_back computed", _cand("        return getattr(self.frame, 'f_' + 'back')\n"),
     "escape", "getattr(self.frame, 'f_' + 'back')", True),
    ("inspect.currentframe", _cand("        return inspect.currentframe()\n",
                                   pre="import inspect\n"), "escape", "inspect.currentframe",
     True),
    ("gc.get_referrers", _cand("        return gc.get_referrers(x)\n"), "escape",
     "gc.get_referrers", True),
    ("sys not imported", _cand("        return sys._getframe(0)\n"), "escape",
     "uses `sys` without importing it", True),
    ("ctypes", _cand("        return x\n", pre="import ctypes\n"), "escape", "import ctypes",
     True),
    ("exception traceback", _cand("        e = self.err\n        return e.__traceback__\n"),
     "escape", "e.__traceback__", True),
    ("computed name on any object", _cand("        return getattr(x, self.op)()\n"),
     "computed_attr", "getattr(x, self.op)", True),
    ("helper called from forward", _cand("        return helper(x)\n",
                                         pre="def helper(x):\n    return getattr(torch, "
                                             "'rel' + 'u')(x)\n"),
     "computed_attr", "in helper() (called from forward)", True),
    ("torch alias", _cand("        return T.relu(x)\n", pre="T = torch\n"), "torch_compute",
     "calls torch.relu", False),
    ("torch.ops.aten", _cand("        return torch.ops.aten.relu.default(x)\n"),
     "torch_compute", "torch.ops.aten.relu.default(x)", False),
]


# the text on the flagged line where the message words it differently
NEEDLES = {"torch._C on self": "self.c = torch._C", "sys via chr/join": "chr(115)",
           "reduce(getattr, ...)": "functools.reduce(", "sys not imported": "sys._getframe",
           "torch.nn.functional f-string of constants": "getattr(torch.nn.functional",
           "helper called from forward": "'rel' + 'u'", "torch alias": "T.relu(x)"}


@pytest.mark.parametrize("case,code,rule,seen,partial", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_computed_names_are_findings(case: str, code: str, rule: str, seen: str,
                                     partial: bool) -> None:
    found = [f for f in _errors(code, "strict") if f["rule"] == rule and seen in f["message"]]
    assert found, (case, _errors(code, "strict"))
    f = found[0]
    assert f["message"].startswith(f"line {f['line']}: ")
    needle = NEEDLES.get(case, seen)
    assert f["line"] == _line(code, needle), (f, needle)
    assert bool(_errors(code, "partial")) == partial, _errors(code, "partial")


LEGIT = [
    ("getattr on self", _cand("        return ext.f(getattr(self, f'w{0}'), x)\n")),
    ("own extension function by name", _cand("        return getattr(ext, f'f_{self.k}')(x)\n")),
    ("literal getattr on a tensor", _cand("        return ext.f(x, getattr(x, 'shape'))\n")),
    ("getattr with a default", _cand("        return ext.f(x, getattr(self.fc, 'bias', None))\n")),
    ("layers by name in __init__", _cand(
        "        return ext.f(x)\n",
        init="        for i in range(2):\n            setattr(self, f'c{i}', nn.Identity())\n"
             "        self.act = getattr(nn, 'ReLU')\n")),
    ("torch dtype by a literal", _cand("        return ext.f(x.to(getattr(torch, 'float32')))\n")),
    ("module-level string constants", _cand("        return ext.f(x)\n",
                                            pre="NAME = 'relu' + '_fwd'\nSRC = f'{NAME}()'\n")),
    ("numel with operator.mul", _cand(
        "        n = functools.reduce(operator.mul, x.shape, 1)\n        return ext.f(x, n)\n",
        pre="import functools\nimport operator\n")),
]


@pytest.mark.parametrize("case,code", LEGIT, ids=[c for c, _ in LEGIT])
def test_legitimate_forms_are_not_findings(case: str, code: str) -> None:
    assert _errors(code, "strict") == [], case


def test_fold() -> None:
    tree = ast.parse("A = 're' + 'lu'\nB = A.upper()\nC = 1\nC = 2\n")
    names = Names(tree)

    def fold(expr: str) -> str | None:
        return names.fold(ast.parse(expr, mode="eval").body)

    assert fold("'s' + 'ys'") == "sys" and fold("f\"{'f_'}back\"") == "f_back"
    assert fold("''.join(['s', chr(121), 's'])") == "sys" and fold("'xsys'[1:]") == "sys"
    assert fold("A") == "relu" and fold("'SYS'.lower()") == "sys"
    assert fold("B") == "RELU"  # constants fold through earlier constants
    assert fold("x + 'lu'") is None and fold("f'{x}'") is None and fold("C") is None
    assert names.path(ast.parse("getattr(F, 'relu')", mode="eval").body) == \
        "torch.nn.functional.relu"
