"""libcst extraction of one class into a standalone task module (no execution here)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from pipeline.tasks.carve.carve import ExtractError, extract_class, package_resolver

MULTI = '''import math
import os
import requests
import torch
import torch.nn as nn
import torch.nn.functional as F

SCALE = 2.0
UNUSED_CONST = 7


def helper(x):
    return x * SCALE + math.pi


def unused_helper(y):
    return requests.get(y)


class Gate(nn.Module):
    def __init__(self, dim):
        super(Gate, self).__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        return torch.sigmoid(self.proj(x))


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int = 32):
        super(Block, self).__init__()
        self.fc = nn.Linear(dim, hidden)
        self.gate = Gate(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.fc(x))
        return helper(h * self.gate(h))

    @classmethod
    def build(cls):
        return Block(4)


class Other(nn.Module):
    def forward(self, x):
        return os.path.join(x)
'''


def test_closure_rename_and_super_fix() -> None:
    ext = extract_class(MULTI, "Block", "pkg/multi.py")
    src = ext.source
    tree = ast.parse(src)
    top = {n.name for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)}
    assert top == {"Model", "Gate", "helper"}  # closure only: no Other, no unused_helper
    assert "SCALE = 2.0" in src and "UNUSED_CONST" not in src
    assert "import math" in src and "requests" not in src and "import os" not in src
    assert "super(Gate, self)" not in src and "super(Block" not in src
    assert "return Model(4)" in src  # references to the original name follow the rename
    assert ext.original_name == "Block"
    assert [p.name for p in ext.init_params] == ["dim", "hidden"]
    assert ext.init_params[1].has_default and not ext.init_params[0].has_default
    assert [p.name for p in ext.forward_params] == ["x"]
    ns: dict = {}
    exec(compile(src, "task.py", "exec"), ns)  # standalone: runs without the original file
    import torch

    out = ns["Model"](8)(torch.randn(2, 8))
    assert out.shape == (2, 32)


def test_unresolved_import_rejected_with_name() -> None:
    code = "import torch.nn as nn\nfrom .layers import Fancy\n\n\nclass A(nn.Module):\n" \
           "    def forward(self, x):\n        return Fancy()(x)\n"
    with pytest.raises(ExtractError) as err:
        extract_class(code, "A", "pkg/mod.py")
    assert err.value.reason == "unresolved_name" and "Fancy" in err.value.detail
    with pytest.raises(ExtractError) as err2:
        extract_class("import scipy\nimport torch.nn as nn\n\n\nclass B(nn.Module):\n"
                      "    def forward(self, x):\n        return scipy.special.erf(x)\n", "B")
    assert err2.value.reason == "unresolved_import"
    with pytest.raises(ExtractError) as err3:
        extract_class(MULTI, "NotThere", "m.py")
    assert err3.value.reason == "class_not_found"


def _fake_package(root: Path) -> None:
    (root / "models" / "toy").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "activations_extra.py").write_text(
        "import torch\n\n\ndef squash(x):\n    return torch.tanh(x) * 2\n")
    (root / "models" / "toy" / "configuration_toy.py").write_text(
        "class ToyConfig(PretrainedConfig):\n    hidden_size: int = 4096\n"
        "    intermediate_size: int = 16384\n    num_attention_heads: int = 32\n"
        "    hidden_act: str = 'silu'\n    vocab_size: int = 50000\n")
    (root / "models" / "toy" / "modeling_toy.py").write_text(
        "import torch\nfrom torch import nn\nfrom ...activations_extra import squash\n"
        "from ...utils import auto_docstring\nfrom .configuration_toy import ToyConfig\n\n\n"
        "@auto_docstring\nclass ToyMLP(nn.Module):\n"
        "    def __init__(self, config: ToyConfig):\n        super().__init__()\n"
        "        self.up = nn.Linear(config.hidden_size, config.intermediate_size)\n"
        "        self.down = nn.Linear(config.intermediate_size, config.hidden_size)\n\n"
        "    def forward(self, x):\n        return self.down(squash(self.up(x)))\n")


def test_cross_file_inlining_and_config_instance(tmp_path: Path) -> None:
    root = tmp_path / "toypkg"
    _fake_package(root)
    path = "models/toy/modeling_toy.py"
    code = (root / path).read_text()
    ext = extract_class(code, "ToyMLP", path, package_resolver(root, "toypkg"))
    src = ext.source
    assert "def squash" in src and ext.inlined == ["activations_extra.py:squash"]
    assert "auto_docstring" not in src  # foreign decorators are dropped
    assert "class ModelConfig" in src and "config = ModelConfig()" in src
    assert ext.config_class == "ToyConfig"
    # dims shrink together (4096 -> 512 and 16384 -> 2048); the rest is kept
    assert ext.config["hidden_size"] == 512 and ext.config["intermediate_size"] == 2048
    assert ext.init_params == []
    ns: dict = {}
    exec(compile(src, "task.py", "exec"), ns)
    import torch

    assert ns["Model"]()(torch.randn(3, 512)).shape == (3, 512)


def test_real_transformers_file() -> None:
    spec = importlib.util.find_spec("transformers")
    assert spec and spec.origin
    root = Path(spec.origin).parent
    path = "models/llama/modeling_llama.py"
    code = (root / path).read_text(encoding="utf-8")
    res = package_resolver(root)
    mlp = extract_class(code, "LlamaMLP", path, res)
    assert "transformers" not in mlp.source.replace("transformers'", "")
    assert "ACT2FN" in mlp.shims and mlp.config["hidden_act"] == "silu"
    att = extract_class(code, "LlamaAttention", path, res)
    assert "def eager_attention_forward" in att.source and "def repeat_kv" in att.source
    assert [p.name for p in att.forward_params][:3] == ["hidden_states", "cos", "sin"]
    with pytest.raises(ExtractError) as err:
        extract_class(code, "LlamaForCausalLM", path, res)
    assert err.value.reason == "pretrained_model"
