"""No einops import or call remains in any task a build publishes: a `tasks build` over an
einops-based vision transformer file (the forms of lucidrains' vit-pytorch: `rearrange`,
`repeat`, `reduce`, the `Rearrange` layer, `einops.einsum`) writes tasks that import torch alone."""

from __future__ import annotations

import ast
import json

import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.workspace import Workspace
from schemas import RawModule, Rejection, Task

VIT = '''import torch
from torch import nn
import einops
from einops import rearrange, repeat, reduce
from einops.layers.torch import Rearrange


class FeedForward(nn.Module):
    def __init__(self, dim, hidden_dim):
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, hidden_dim), nn.GELU(),
                                 nn.Linear(hidden_dim, dim))

    def forward(self, x):
        return self.net(x)


class Attention(nn.Module):
    def __init__(self, dim, heads=8, dim_head=64):
        super().__init__()
        inner = dim_head * heads
        self.heads = heads
        self.scale = dim_head ** -0.5
        self.norm = nn.LayerNorm(dim)
        self.to_qkv = nn.Linear(dim, inner * 3, bias=False)
        self.to_out = nn.Linear(inner, dim)

    def forward(self, x):
        x = self.norm(x)
        q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        q, k, v = (rearrange(t, 'b n (h d) -> b h n d', h=self.heads) for t in (q, k, v))
        dots = einops.einsum(q, k, 'b h i d, b h j d -> b h i j') * self.scale
        out = torch.matmul(dots.softmax(dim=-1), v)
        return self.to_out(rearrange(out, 'b h n d -> b n (h d)'))


class PatchEmbed(nn.Module):
    def __init__(self, patch=4, channels=3, dim=64):
        super().__init__()
        self.to_patches = nn.Sequential(
            nn.Conv2d(channels, dim, patch, stride=patch), Rearrange('b d h w -> b (h w) d'),
            nn.LayerNorm(dim))
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))

    def forward(self, img):
        x = self.to_patches(img)
        cls = repeat(self.cls_token, '1 1 d -> b 1 d', b=x.shape[0])
        return torch.cat((cls, x), dim=1)


class MeanPoolHead(nn.Module):
    def __init__(self, dim, classes):
        super().__init__()
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        return self.head(reduce(x, 'b n d -> b d', 'mean'))
'''

CLASSES = ("FeedForward", "Attention", "PatchEmbed", "MeanPoolHead")


def _einops_uses(source: str) -> list[str]:
    """Every import of einops and every name or attribute that refers to it, by line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names
                      if a.name.split(".")[0] == "einops"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "einops":
            found.append(f"{node.lineno}: from {node.module}")
        elif isinstance(node, ast.Name) and node.id in ("einops", "rearrange", "repeat",
                                                         "reduce", "Rearrange", "Reduce"):
            found.append(f"{node.lineno}: {node.id}")
    return found


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    root = tmp_path_factory.mktemp("ws")
    ws = Workspace(root)
    ws.new_run("ingest").write([
        RawModule(RawModule.make_id("git", "", "", "vit.py", name, VIT), "git", "", "",
                  "vit.py", "MIT", name, VIT) for name in CLASSES])
    res = CliRunner().invoke(app, ["tasks", "build", "--workspace", str(root), "--json",
                                   "--workers", "2"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output.strip().splitlines()[-1])["modules"] == len(CLASSES)
    return ws


def test_the_checker_sees_einops():
    assert _einops_uses(VIT) and len(_einops_uses(VIT)) >= 9


def test_no_published_task_imports_or_calls_einops(built: Workspace):
    tasks = built.read(Task)
    rejected = [f"{r.ref} {r.reason}: {r.detail}" for r in built.read(Rejection)]
    # every class of the file became a task: the einops ones were rewritten, not dropped
    assert sorted(t.original_name for t in tasks) == sorted(CLASSES), rejected
    for t in tasks:
        assert _einops_uses(t.source) == [], (t.original_name, t.source)
        assert _einops_uses(t.cpu_source) == [], (t.original_name, t.cpu_source)
        # the rewrite's helpers name their pattern in a docstring, nothing imports einops
        assert "import einops" not in t.source and "from einops" not in t.source
