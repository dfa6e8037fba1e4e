"""extract_tasks end to end: real sandboxed probe workers, real transformers classes, bad input."""

from __future__ import annotations

import ast
import importlib.util
import json
import math
from pathlib import Path

import pytest

from pipeline.config import TasksConfig
from pipeline.tasks.extract import extract_tasks
from pipeline.tasks.probe.pool import ProbePool
from pipeline.tasks.taskfile import inspect_task_source, task_id_of
from schemas import OP_FAMILIES, RawModule, Task
from tests.conftest import LINEAR_TASK, RELU_TASK

BAD = '''import torch
import torch.nn as nn
import torch.nn.functional as F


class NeedsGpu(nn.Module):
    def forward(self, x):
        return x.cuda() * 2


class ReadsFile(nn.Module):
    def __init__(self):
        super().__init__()
        self.vocab = open("vocab.txt").read()

    def forward(self, x):
        return x + 1


class Hangs(nn.Module):
    def forward(self, x):
        while True:
            x = x + 1


class Constant(nn.Module):
    def forward(self, x):
        return torch.ones_like(x)


class NearZero(nn.Module):
    def forward(self, x):
        return x * 1e-6


class IgnoresInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        return self.w * 3


class Noisy(nn.Module):
    def forward(self, x):
        return F.dropout(x, p=0.5, training=True)


class Mutates(nn.Module):
    def forward(self, x):
        x.mul_(2)
        return x


class TakesInt(nn.Module):
    def forward(self, n: int):
        return torch.arange(n)


class MaskedAttention(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, hidden_states, attention_mask: torch.Tensor | None):
        q, k, v = self.qkv(hidden_states).chunk(3, dim=-1)
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        if attention_mask is not None:
            scores = scores + attention_mask
        return scores.softmax(-1) @ v


class AddsPositions(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, hidden_states, position_embeddings: torch.Tensor):
        return self.fc(hidden_states + position_embeddings)


class PatchEmbed(nn.Module):
    def __init__(self):
        super().__init__()
        self.image_size = 24
        self.proj = nn.Conv2d(3, 16, kernel_size=4, stride=4)

    def forward(self, pixel_values):
        if pixel_values.shape[-1] != self.image_size:
            raise ValueError(f"Input image size doesn't match model ({self.image_size}).")
        return self.proj(pixel_values).flatten(2).transpose(1, 2)


class Good(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        y = self.norm(x)
        y = torch.tanh(self.fc(y))
        return y + x
'''

EXPECT = {"NeedsGpu": "needs_gpu", "ReadsFile": "reads_files", "Hangs": "timeout",
          "Constant": "constant_output", "NearZero": "near_zero_output",
          "IgnoresInput": "input_independent", "Noisy": "nondeterministic",
          "Mutates": "mutates_inputs", "TakesInt": "non_tensor_input"}


def _raw(kind: str, path: str, name: str, code: str) -> RawModule:
    return RawModule(RawModule.make_id(kind, "", "", path, name, code), kind, "", "", path,
                     "MIT", name, code)


@pytest.fixture(scope="module")
def built() -> tuple[list[Task], list, list[RawModule]]:
    spec = importlib.util.find_spec("transformers")
    assert spec and spec.origin
    llama_path = "models/llama/modeling_llama.py"
    llama = (Path(spec.origin).parent / llama_path).read_text(encoding="utf-8")
    modules = [_raw("seed", "seed/relu.py", "Model", RELU_TASK),
               _raw("seed", "seed/linear.py", "Model", LINEAR_TASK),
               _raw("seed", "seed/broken.py", "Model", "import torch\nx = (\n"),
               _raw("transformers", llama_path, "LlamaMLP", llama),
               _raw("transformers", llama_path, "LlamaRMSNorm", llama),
               _raw("transformers", llama_path, "LlamaAttention", llama),
               _raw("transformers", llama_path, "LlamaForCausalLM", llama)]
    modules += [_raw("git", "repo/bad.py", name, BAD) for name in
                [*EXPECT, "Good", "MaskedAttention", "AddsPositions", "PatchEmbed"]]
    # generous enough for LlamaAttention on a loaded 2-core machine; Hangs still times out
    cfg = TasksConfig(workers=2, timeout_s=12.0)
    with ProbePool(2) as pool:
        tasks, rejections = extract_tasks(modules, cfg, pool=pool)
    return tasks, rejections, modules


@pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)
def test_every_module_accounted_for(built) -> None:
    tasks, rejections, modules = built
    ids = [t.module_id for t in tasks] + [r.item_id for r in rejections]
    assert sorted(ids) == sorted(m.module_id for m in modules)


def test_bad_modules_rejected_with_reason(built) -> None:
    tasks, rejections, modules = built
    by_name = {r.ref.split(":")[-1]: r for r in rejections if r.ref.startswith("repo/bad.py")}
    for name, reason in EXPECT.items():
        assert by_name[name].reason == reason, (name, by_name[name].detail)
        assert by_name[name].stage == "extract" and name in by_name[name].detail
    assert "Good" in {t.original_name for t in tasks}
    reasons = {r.ref: r.reason for r in rejections}
    assert reasons["seed/broken.py:Model"] in ("not_a_task", "import_error")
    assert reasons["models/llama/modeling_llama.py:LlamaForCausalLM"] == "pretrained_model"


def test_tasks_are_kernelbench_files_with_annotations(built) -> None:
    tasks, _, _ = built
    by = {t.original_name if t.source_kind != "seed" else t.path: t for t in tasks}
    for t in tasks:
        assert t.task_id == task_id_of(t.source)
        names = {n.name for n in ast.parse(t.source).body if isinstance(n, ast.ClassDef |
                                                                       ast.FunctionDef)}
        assert {"Model", "get_inputs", "get_init_inputs"} <= names
        assert set(t.op_families) <= set(OP_FAMILIES) and t.op_inventory
        assert t.level in (1, 2, 3) and t.reasoning.count("\n") >= 6
        assert "# returns" in t.source
        assert t.output_specs and t.input_specs
    relu = by["seed/relu.py"]
    assert relu.level == 1 and relu.op_inventory == ["aten.relu"]
    assert relu.op_families == ["activation"]
    assert relu.source == RELU_TASK.replace("def forward(self, x):",
                                            "def forward(self, x):  # inputs: x: [16, 1024] "
                                            "float32").replace(
        "return torch.relu(x)", "return torch.relu(x)  # returns [16, 1024] float32")
    assert "memory-bound" in relu.reasoning
    mlp = by["LlamaMLP"]
    assert "compute-bound" in mlp.reasoning and mlp.level >= 2
    assert mlp.op_families[:2] == ["matmul", "activation"]
    # every statement of forward that assigns is annotated with its shape
    assert "# down_proj: [" in mlp.shape_annotations
    # GPU sizes reach the ~1 ms target (FLOP/byte estimate) while the CPU copy is small
    assert mlp.flops / 67e12 * 1e3 >= 0.9
    att = by["LlamaAttention"]
    assert [s.name for s in att.input_specs][:3] == ["hidden_states", "cos", "sin"]
    assert "attention" in att.reasoning.lower() or "softmax" in att.op_families


def test_cpu_copy_is_scaled_and_runs(built) -> None:
    tasks, _, _ = built
    mlp = next(t for t in tasks if t.original_name == "LlamaMLP")
    assert mlp.cpu_source != mlp.source
    assert task_id_of(mlp.cpu_source) != mlp.task_id
    report = inspect_task_source(mlp.cpu_source, "mlp_cpu", timeout_s=60)
    assert report.valid, report.reason
    gpu_numel = sum(math.prod(s.shape) for s in mlp.input_specs)
    cpu_numel = sum(math.prod(s.shape) for s in report.inputs)
    assert cpu_numel * 64 <= gpu_numel
    assert json.loads(mlp.meta)["cpu_inputs"][0]["shape"] == report.inputs[0].shape
    linear = next(t for t in tasks if t.path == "seed/linear.py")
    assert linear.source.startswith(LINEAR_TASK.split("class")[0])


def test_optional_masks_tensor_positions_and_fixed_resolutions(built) -> None:
    """An Optional mask is left None, a positional-embedding tensor stays one argument, and a
    patch embedding gets the resolution it checks for."""
    tasks, rejections, _ = built
    by = {t.original_name: t for t in tasks}
    assert {"MaskedAttention", "AddsPositions", "PatchEmbed"} <= set(by), [
        (r.ref, r.detail) for r in rejections if r.ref.startswith("repo/bad.py")]
    att = by["MaskedAttention"]
    assert [(s.name, s.init) for s in att.input_specs][1] == ("attention_mask", "none")
    assert "return [torch.randn(" in att.source and ", None]" in att.source
    assert inspect_task_source(att.cpu_source, "att_cpu", timeout_s=60).valid
    pos = by["AddsPositions"]
    assert [s.name for s in pos.input_specs] == ["hidden_states", "position_embeddings"]
    assert pos.input_specs[0].shape == pos.input_specs[1].shape
    patch = by["PatchEmbed"]
    assert patch.input_specs[0].shape[-2:] == [24, 24]
