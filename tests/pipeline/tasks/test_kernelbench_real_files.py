"""Decontamination against the shipped KernelBench index, with real KernelBench files renamed and
reformatted (level 1 from the repository snapshot) and level-4-style models built from a config."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from pipeline.config import TasksConfig
from pipeline.tasks.curate.curate import curate_tasks
from pipeline.tasks.curate.kernelbench_index import (
    KERNELBENCH_COMMIT,
    SHIPPED_INDEX,
    compute_ops,
    load_index_file,
    trace_files,
)
from pipeline.tasks.taskfile import task_id_of
from schemas import Task, TensorSpec

SNAPSHOT = Path("/work/.mirror/ScalingIntelligence+KernelBench/repo")


def _traced_tasks(sources: dict[str, str]) -> list[Task]:
    """Tasks as the probe leaves them: op inventory and input shapes from a real trace."""
    traces = trace_files(sources, timeout_s=120.0)
    out = []
    for name, source in sources.items():
        traced = traces[name]
        assert not traced["trace"].startswith("none"), (name, traced["trace"])
        specs = [TensorSpec(f"x{i}", s, "float32") for i, s in enumerate(traced["shapes"])]
        out.append(Task(task_id=task_id_of(source), name=name, source=source, cpu_source=source,
                        module_id=f"m-{name}", path=f"src/{name}.py",
                        op_inventory=traced["ops"], input_specs=specs))
    return out


class _Renamer(ast.NodeTransformer):
    """Renames the model class, module constants, parameters and `self.` attributes; drops
    docstrings. `ast.unparse` then rewrites the layout (quotes, spacing, line breaks)."""

    def __init__(self, names: dict[str, str], attrs: dict[str, str]):
        self.names, self.attrs = names, attrs

    def visit_Name(self, node: ast.Name) -> ast.Name:
        node.id = self.names.get(node.id, node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.arg = self.names.get(node.arg, node.arg)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.Attribute:
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            node.attr = self.attrs.get(node.attr, node.attr)
        return node

    def _undoc(self, node: ast.ClassDef | ast.FunctionDef) -> ast.AST:
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
        node.name = self.names.get(node.name, node.name)
        self.generic_visit(node)
        return node

    visit_ClassDef = visit_FunctionDef = _undoc


def rename_and_reformat(source: str, tag: str) -> str:
    """`source` with every name it chose replaced, docstrings and comments gone, re-laid out."""
    tree = ast.parse(source)
    names: dict[str, str] = {"Model": f"{tag.title()}Net"}
    attrs: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.arg != "self":
            names.setdefault(node.arg, f"{tag}_a{len(names)}")
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Name) and node.value.id == "self":
            attrs.setdefault(node.attr, f"{tag}_m{len(attrs)}")
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        names.setdefault(n.id, f"{tag.upper()}_{len(names)}")
    out = ast.unparse(_Renamer(names, attrs).visit(tree))
    return f"{out}\n\n\nModel = {names['Model']}\n"


def _snapshot_file(path: str) -> str:
    return subprocess.run(["git", "--git-dir", str(SNAPSHOT), "show",
                           f"{KERNELBENCH_COMMIT}:KernelBench/{path}"],
                          check=True, capture_output=True, text=True).stdout


needs_snapshot = pytest.mark.skipif(not SNAPSHOT.is_dir(),
                                    reason="no KernelBench snapshot on this machine")


def test_renamer_changes_every_chosen_name() -> None:
    src = ("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
           '    """doc"""\n    def __init__(self, dim: int):\n'
           "        super(Model, self).__init__()\n"
           "        self.dim = dim\n\n    def forward(self, x):  # note\n"
           "        return torch.sum(x, dim=self.dim)\n\nbatch_size = 16\n\n"
           "def get_inputs():\n    return [torch.rand(batch_size, 8)]\n\n"
           "def get_init_inputs():\n    return [1]\n")
    out = rename_and_reformat(src, "zq")
    assert "ZqNet" in out and "batch_size" not in out and "self.dim" not in out
    assert "doc" not in out and "# note" not in out and "dim=self.zq_m0" in out
    ns: dict = {}
    exec(compile(out, "renamed.py", "exec"), ns)
    assert list(ns["Model"](*ns["get_init_inputs"]())(*ns["get_inputs"]()).shape) == [16]


def _multi_op_level1(count: int) -> list[str]:
    """`count` level-1 files spread over the index whose traced forward runs >= 2 compute ops."""
    index = load_index_file(SHIPPED_INDEX)
    multi = sorted(e.name for e in index.entries if e.level == "level1"
                   and e.trace == "meta" and len(compute_ops(e.ops)) >= 2)
    step = max(1, len(multi) // count)
    return multi[::step][:count]


@pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)
@needs_snapshot
def test_renamed_reformatted_level1_files_with_two_or_more_ops_are_contaminated() -> None:
    picked = _multi_op_level1(10)
    assert len(picked) == 10
    sources = {f"t{i}": rename_and_reformat(_snapshot_file(name), f"t{i}")
               for i, name in enumerate(picked)}
    for name, src in zip(picked, sources.values(), strict=True):
        assert "class Model" not in src and "batch_size" not in src, name
    index = {e.name: e for e in load_index_file(SHIPPED_INDEX).entries}
    kept, rej = curate_tasks(_traced_tasks(sources), TasksConfig(), [])
    assert not kept, [(t.name, t.decontamination) for t in kept]
    assert [r.reason for r in rej] == ["contaminated"] * 10
    for rejection in rej:
        original = picked[int(rejection.item_id.removeprefix("m-t"))]
        found = rejection.ref.removeprefix("kernelbench/")
        # a file, or another KernelBench file running the same compute ops
        assert found == original or compute_ops(index[found].ops) == compute_ops(
            index[original].ops), (original, rejection.ref, rejection.detail)


GPT2_FROM_CONFIG = '''import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel


class TokenScorer(nn.Module):
    def __init__(self, layers: int, width: int, heads: int):
        super().__init__()
        cfg = GPT2Config(n_layer=layers, n_embd=width, n_head=heads)
        self.lm = GPT2LMHeadModel(cfg)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out = self.lm(input_ids=tokens)
        return out.logits


Model = TokenScorer
BATCH, SEQ, VOCAB = 8, 128, 50257


def get_inputs():
    return [torch.randint(0, VOCAB, (BATCH, SEQ))]


def get_init_inputs():
    return [4, 256, 4]
'''


def test_level4_entries_are_traced_from_offline_stand_ins() -> None:
    level4 = [e for e in load_index_file(SHIPPED_INDEX).entries if e.level == "level4"]
    assert len(level4) == 20
    for e in level4:
        assert "stand-in:" in e.trace and len(compute_ops(e.ops)) >= 5, (e.name, e.trace)
        assert e.shapes and len(e.shapes[0]) == 2


def test_gpt2_built_from_config_is_contaminated_with_level4() -> None:
    kept, rej = curate_tasks(_traced_tasks({"scorer": GPT2_FROM_CONFIG}), TasksConfig(), [])
    assert not kept and [r.reason for r in rej] == ["contaminated"]
    assert "_gpt2_" in rej[0].ref and rej[0].ref.startswith("kernelbench/level4/")


def test_unknown_checkpoint_is_untraced_and_says_why() -> None:
    src = ("import torch\nfrom transformers import AutoModelForCausalLM, AutoConfig\n\n"
           "class Model(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
           "        self.m = AutoModelForCausalLM.from_pretrained('someone/private-7b')\n\n"
           "    def forward(self, x):\n        return self.m(x).logits\n\n"
           "def get_inputs():\n    return [torch.randint(0, 100, (1, 8))]\n\n"
           "def get_init_inputs():\n    return []\n")
    traced = trace_files({"private": src})["private"]
    assert traced["ops"] == [] and "no offline stand-in for checkpoint 'someone/private-7b'" \
        in traced["trace"]
