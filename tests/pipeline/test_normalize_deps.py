"""timm building blocks, partial norm layers and sibling-file helpers carved into tasks that
import torch alone; what cannot be resolved is named. Fake repositories in tmp_path, real git."""

from __future__ import annotations

import ast
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

from pipeline.tasks.carve.carve import ExtractError, extract_class
from pipeline.tasks.carve.repo_resolver import repo_resolver
from pipeline.tasks.normalize.deps import absolute_module, dependency_definitions

TIMM_BLOCK = '''\
from functools import partial

import torch
import torch.nn as nn
from timm.layers import DropPath, Mlp, trunc_normal_, to_2tuple, LayerNorm2d
from timm.models.layers import DropPath as TimmDropPath


class Block(nn.Module):
    def __init__(self, dim, mlp_ratio=4., drop_path=0., norm_layer=partial(nn.LayerNorm, eps=1e-6)):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=nn.GELU)
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.extra = TimmDropPath(0.1)
        self.patch = to_2tuple(3)
        self.conv = nn.Conv2d(dim, dim, self.patch, padding="same")
        self.norm2 = LayerNorm2d(dim)
        self.apply(self._init_weights)

    def _init_weights(self, m):
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=.02)

    def forward(self, x):
        B, C, H, W = x.shape
        y = self.norm2(self.conv(x)).flatten(2).transpose(1, 2)
        y = y + self.drop_path(self.mlp(self.norm1(y)))
        return self.extra(y)
'''


def _imports(source: str) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            out.add((node.module or "").split(".")[0])
    return out


def _load(source: str) -> dict:
    scope: dict = {}
    exec(compile(source, "<task>", "exec"), scope)  # noqa: S102 - our own test modules
    return scope


def test_timm_blocks_and_partial_norm_become_torch_definitions():
    ext = extract_class(TIMM_BLOCK, "Block", "models/block.py")
    assert _imports(ext.source) <= {"torch", "functools", "collections"}  # no timm
    scope = _load(ext.source)
    torch.manual_seed(0)
    model = scope["Model"](32).eval()
    keys = list(model.state_dict())
    assert keys[:2] == ["norm1.weight", "norm1.bias"]
    assert keys[2:6] == ["mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias"]
    assert model.mlp.fc1.out_features == 128 and model.norm1.eps == 1e-6
    assert 0.017 < model.mlp.fc1.weight.std() < 0.023  # trunc_normal_(std=.02), not default
    for shape in ((2, 32, 8, 8), (1, 32, 4, 12)):
        x = torch.randn(shape)
        out = model(x)
        assert out.shape == (shape[0], shape[2] * shape[3], 32)
        ln = torch.nn.functional.layer_norm(model.conv(x).permute(0, 2, 3, 1), (32,),
                                            model.norm2.weight, model.norm2.bias, 1e-6)
        y = ln.permute(0, 3, 1, 2).flatten(2).transpose(1, 2)
        torch.testing.assert_close(out, y + model.mlp(model.norm1(y)))


def test_drop_path_drops_whole_samples_in_training():
    ext = extract_class(TIMM_BLOCK, "Block", "models/block.py")
    drop = _load(ext.source)["DropPath"](0.5).train()
    torch.manual_seed(3)
    out = drop(torch.ones(64, 3, 5))
    per_sample = out.flatten(1)
    assert set(per_sample.unique().tolist()) <= {0.0, 2.0}
    assert (per_sample == per_sample[:, :1]).all()  # one decision per sample
    assert 0 < (per_sample[:, 0] == 0).sum() < 64
    assert torch.equal(drop.eval()(torch.ones(4, 3)), torch.ones(4, 3))


def test_definitions_only_for_timm_layers():
    assert [n for n, _ in dependency_definitions("timm.layers", "Mlp")] == [
        "_ntuple", "to_2tuple", "Mlp"]
    assert dependency_definitions("timm.layers.drop", "DropPath") is not None
    assert dependency_definitions("mypkg.layers", "Mlp") is None
    assert dependency_definitions("timm.layers", "SelectAdaptivePool2d") is None
    assert absolute_module("timm/models/vit.py", "layers", 2) == "timm.layers"
    assert absolute_module("a/b.py", "timm.layers", 0) == "timm.layers"


def test_unknown_timm_name_is_rejected_with_the_name():
    code = TIMM_BLOCK.replace("LayerNorm2d\n", "LayerNorm2d, SelectAdaptivePool2d\n").replace(
        "self.norm2 = LayerNorm2d(dim)", "self.norm2 = SelectAdaptivePool2d()")
    with pytest.raises(ExtractError) as info:
        extract_class(code, "Block", "models/block.py")
    assert info.value.reason == "unresolved_name"
    assert "SelectAdaptivePool2d from timm.layers" in info.value.detail


def _git_repo(root: Path, files: dict[str, str]) -> str:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@localhost", "-C", str(root)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "init"], check=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


RESEARCH_REPO = {
    "mypkg/__init__.py": "from mypkg.model import Unet\n",
    "mypkg/utils.py": '''\
        import torch

        EPS = 1e-5


        def exists(x):
            return x is not None


        def default(val, d):
            return val if exists(val) else d


        def l2norm(t):
            return t / t.norm(dim=-1, keepdim=True).clamp(min=EPS)
        ''',
    "mypkg/attend.py": '''\
        import torch
        from torch import nn

        from .utils import default


        class Attend(nn.Module):
            def __init__(self, scale=None):
                super().__init__()
                self.scale = scale

            def forward(self, q, k, v):
                scale = default(self.scale, q.shape[-1] ** -0.5)
                return (q @ k.transpose(-1, -2) * scale).softmax(dim=-1) @ v
        ''',
    "mypkg/model.py": '''\
        import torch
        from torch import nn

        from mypkg.attend import Attend
        from .utils import exists, l2norm, EPS
        from .missing_helpers import rotate_half


        class Attention(nn.Module):
            def __init__(self, dim, heads=4):
                super().__init__()
                self.heads = heads
                self.to_qkv = nn.Linear(dim, dim * 3, bias=False)
                self.attend = Attend()

            def forward(self, x, mask=None):
                q, k, v = self.to_qkv(x).chunk(3, dim=-1)
                q, k = l2norm(q), l2norm(k)
                out = self.attend(q, k, v)
                return out if not exists(mask) else out * mask + EPS


        class Rotary(nn.Module):
            def forward(self, x):
                return rotate_half(x)
        ''',
}


def test_helpers_from_sibling_files_are_inlined(tmp_path):
    commit = _git_repo(tmp_path, RESEARCH_REPO)
    (tmp_path / "mypkg/utils.py").write_text("# the work tree moved on\n")  # read at the commit
    resolver = repo_resolver(str(tmp_path), commit)
    assert resolver is not None
    code = RESEARCH_REPO["mypkg/model.py"]
    ext = extract_class(textwrap.dedent(code), "Attention", "mypkg/model.py", resolver)
    assert _imports(ext.source) == {"torch"}
    assert {"mypkg/attend.py:Attend", "mypkg/utils.py:l2norm", "mypkg/utils.py:EPS",
            "mypkg/utils.py:default"} <= set(ext.inlined)
    model = _load(ext.source)["Model"](16)
    for n in (3, 7):
        x = torch.randn(2, n, 16)
        q, k, v = model.to_qkv(x).chunk(3, dim=-1)
        q = q / q.norm(dim=-1, keepdim=True).clamp(min=1e-5)
        k = k / k.norm(dim=-1, keepdim=True).clamp(min=1e-5)
        ref = (q @ k.transpose(-1, -2) * 16 ** -0.5).softmax(dim=-1) @ v
        torch.testing.assert_close(model(x), ref)


def test_missing_sibling_is_rejected_with_the_name(tmp_path):
    commit = _git_repo(tmp_path, RESEARCH_REPO)
    resolver = repo_resolver(str(tmp_path), commit)
    with pytest.raises(ExtractError) as info:
        extract_class(textwrap.dedent(RESEARCH_REPO["mypkg/model.py"]), "Rotary",
                      "mypkg/model.py", resolver)
    assert info.value.reason == "unresolved_name"
    assert "rotate_half from .missing_helpers" in info.value.detail


def test_repo_resolver_needs_a_git_repository(tmp_path):
    assert repo_resolver(str(tmp_path), "") is None
    assert repo_resolver("https://example.invalid/x/y", "0" * 40, tmp_path) is None


def test_progress_bars_and_version_checks_become_stand_ins():
    code = textwrap.dedent('''\
        import torch
        from torch import nn
        from packaging import version
        from tqdm.auto import tqdm


        class Sampler(nn.Module):
            def __init__(self, steps=3):
                super().__init__()
                self.steps = steps
                self.flash = version.parse(torch.__version__) >= version.parse('2.0.0')

            def forward(self, x):
                for _ in tqdm(range(self.steps), desc='sampling'):
                    x = x * 0.5
                return x
        ''')
    ext = extract_class(code, "Sampler", "pkg/sampler.py")
    assert _imports(ext.source) <= {"torch", "re"}
    model = _load(ext.source)["Model"]()
    assert model.flash is True
    torch.testing.assert_close(model(torch.ones(2)), torch.full((2,), 0.125))


def test_one_helper_copied_into_two_files_is_not_a_clash(tmp_path):
    helper = "def exists(v):\n    return v is not None\n\n\n"
    files = {
        "pkg/attend.py": "import torch\nfrom torch import nn\n\n\n" + helper + (
            "class Attend(nn.Module):\n    def forward(self, q, mask=None):\n"
            "        return q.softmax(-1) if not exists(mask) else q.masked_fill(~mask, 0)\n"),
        "pkg/model.py": "import torch\nfrom torch import nn\nfrom .attend import Attend\n\n\n"
            + helper.replace("v", "val") + "class Net(nn.Module):\n    def __init__(self, scale=None):\n"
            "        super().__init__()\n        self.attend = Attend()\n"
            "        self.scale = scale if exists(scale) else 2.0\n\n"
            "    def forward(self, x):\n        return self.attend(x * self.scale)\n",
        "pkg/other.py": "def exists(v):\n    return bool(v)\n",
    }
    commit = _git_repo(tmp_path, files)
    resolver = repo_resolver(str(tmp_path), commit)
    ext = extract_class(files["pkg/model.py"], "Net", "pkg/model.py", resolver)
    assert ext.source.count("def exists") == 1
    x = torch.randn(2, 5)
    torch.testing.assert_close(_load(ext.source)["Model"]()(x), (x * 2.0).softmax(-1))
    clash = files["pkg/model.py"].replace(helper.replace("v", "val"), "def exists(v):\n    return bool(v)\n\n\n")
    with pytest.raises(ExtractError) as info:
        extract_class(clash, "Net", "pkg/model.py", resolver)
    assert info.value.reason == "name_clash"


def test_resolver_finds_src_layouts_and_package_roots(tmp_path):
    commit = _git_repo(tmp_path, {
        "src/lib/__init__.py": "from .ops import double\n",
        "src/lib/ops.py": "def double(x):\n    return x * 2\n",
        "project/models/layers.py": "SCALE = 3\n",
    })
    resolver = repo_resolver(str(tmp_path), commit)
    assert resolver("src/lib/net.py", "lib", 0)[0] == "src/lib/__init__.py"
    assert resolver("src/lib/net.py", "ops", 1)[0] == "src/lib/ops.py"
    assert resolver("project/models/vit.py", "models.layers", 0)[0] == "project/models/layers.py"
    assert resolver("src/lib/net.py", "numpy", 0) is None
    assert resolver("src/lib/net.py", "ops", 5) is None
