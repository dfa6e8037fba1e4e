"""Dims that must stay equal scale together (a batch that equals a broadcast dim, an image size
that equals the model's constructor default), meta runs survive `.item()`, and a task's time
budget grows with its FLOPs."""

from __future__ import annotations

import ast
import textwrap

import pytest

from pipeline.tasks.probe.budget import time_budget
from pipeline.tasks.probe.dims import (
    derived_refresher,
    get_slot,
    int_constants,
    may_tie,
    tie_partners,
)
from pipeline.tasks.probe.scale import footprint, input_numel, scale_constants
from pipeline.tasks.taskfile import inspect_task_source, substitute_constants

HINGE = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def forward(self, predictions, targets):
            return torch.mean(torch.clamp(1 - predictions * targets, min=0))

    batch_size = 4096
    input_shape = (4096,)

    def get_inputs():
        return [torch.rand(batch_size, *input_shape),
                torch.randint(0, 2, (batch_size,)).float() * 2 - 1]

    def get_init_inputs():
        return []
''')

# Swin's form: the model checks the input against its constructor default, and builds drop-path
# rates with `.item()` (no meta kernel).
PATCHES = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, img_size=256, patch_size=4, in_chans=3, embed_dim=32, depth=3):
            super().__init__()
            self.img_size = img_size
            self.rates = [x.item() for x in torch.linspace(0, 0.1, depth)]
            self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size)

        def forward(self, x):
            assert x.shape[-1] == self.img_size, f"input {x.shape[-1]} != model {self.img_size}"
            return self.proj(x).flatten(2).mean(-1)

    batch_size = 16
    image_size = 256

    def get_inputs():
        return [torch.rand(batch_size, 3, image_size, image_size)]

    def get_init_inputs():
        return []
''')


def _load(source: str) -> tuple[dict, ast.Module]:
    ns: dict = {}
    exec(compile(source, "task.py", "exec"), ns)
    return ns, ast.parse(source)


def _scale(source: str, cap: int) -> tuple[dict, dict]:
    ns, tree = _load(source)
    consts, partners = int_constants(tree), tie_partners(tree)
    scaled = scale_constants(ns, consts, cap, lambda: input_numel(ns),
                             lambda: footprint(ns, True),
                             derived_refresher(tree, [*consts, *partners]), partners)
    return ns, scaled


def test_batch_tied_to_a_broadcast_dim_scales_with_it():
    ns, scaled = _scale(HINGE, 1 << 16)
    assert scaled["batch_size"] == scaled["input_shape[0]"] <= 256
    assert ns["input_shape"] == (scaled["batch_size"],)
    p, t = ns["get_inputs"]()
    assert ns["Model"]()(p, t).shape == ()
    cpu = substitute_constants(HINGE, scaled)
    assert f"input_shape = ({scaled['batch_size']},)" in cpu


def test_image_size_tied_to_the_constructor_default_scales_with_it():
    ns, tree = _load(PATCHES)
    assert tie_partners(tree) == {"Model.img_size": 256, "Model.patch_size": 4,
                                  "Model.in_chans": 3, "Model.embed_dim": 32, "Model.depth": 3}
    assert footprint(ns, True)[1] > 0  # `.item()` on meta no longer stops the count
    ns, scaled = _scale(PATCHES, 1 << 14)
    assert scaled["image_size"] == scaled["Model.img_size"] == get_slot(ns, "Model.img_size")
    assert scaled["image_size"] < 256
    assert set(scaled) <= {"batch_size", "image_size", "Model.img_size"}  # no lone defaults
    cpu = substitute_constants(PATCHES, scaled)
    assert f"def __init__(self, img_size={scaled['image_size']}, patch_size=4" in cpu
    cpu_ns, _ = _load(cpu)
    assert cpu_ns["Model"]()(*cpu_ns["get_inputs"]()).shape == (scaled.get("batch_size", 16), 32)


def test_tied_task_validates_in_the_sandbox():
    rep = inspect_task_source(PATCHES, scale=True, cpu_max_numel=1 << 14, timeout_s=60)
    assert rep.valid, rep.reason
    side = rep.scaled_constants["image_size"]
    assert rep.inputs[0].shape[-1] == side == rep.scaled_constants["Model.img_size"]
    assert f"img_size={side}" in rep.cpu_source


def test_time_budget_grows_with_flops_up_to_the_cap():
    assert time_budget(0.0, 30.0, 1e9, 120.0) == 30.0
    assert time_budget(11.4e9, 30.0, 1e9, 120.0) == 41.4
    assert time_budget(500e9, 30.0, 1e9, 120.0) == 120.0


SLOW = '''
import time
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, a, b):
        if a.device.type != "meta":
            time.sleep(4)
        return {op}

M = {m}

def get_inputs():
    return [torch.randn(M, M), torch.randn(M, M)]

def get_init_inputs():
    return []
'''


@pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)
def test_a_heavy_task_gets_the_time_a_light_one_does_not():
    heavy = SLOW.format(op="a @ b", m=4096)  # 137 GFLOP at GPU size: the 12 s cap
    light = SLOW.format(op="a + b", m=64)  # no FLOPs counted: the 3 s base
    rep = inspect_task_source(heavy, scale=True, timeout_s=3)
    assert rep.valid, rep.reason
    rep = inspect_task_source(light, scale=True, timeout_s=3)
    assert not rep.valid
    assert rep.reason.startswith("timed out after 3s (budget 3s + 0.0 GFLOP"), rep.reason


# KernelBench level 2's form: stride and output_padding are constructor defaults; a kernel size
# halved to 2 equals the stride by chance. Meta runs accept stride 1 with output_padding 1, the
# CPU run does not, so the default must not follow a constant of another name.
DECONV = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, in_channels, out_channels, kernel_size, bias_shape, stride=2,
                     padding=1, output_padding=1):
            super().__init__()
            self.up = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride,
                                         padding=padding, output_padding=output_padding)
            self.shift = nn.Parameter(torch.randn(bias_shape))

        def forward(self, x):
            return torch.tanh(self.up(x) - self.shift)

    batch_size = 32
    in_channels = 64
    out_channels = 64
    height = width = 256
    kernel_size = 4
    bias_shape = (out_channels, 1, 1)

    def get_inputs():
        return [torch.rand(batch_size, in_channels, height, width)]

    def get_init_inputs():
        return [in_channels, out_channels, kernel_size, bias_shape]
''')


def test_a_default_of_another_name_does_not_follow_by_chance():
    assert may_tie("image_size", "Model.img_size") and may_tie("in_channels", "Model.in_chans")
    assert may_tie("batch_size", "input_shape[0]")
    assert not may_tie("kernel_size", "Model.stride")
    assert not may_tie("batch_size", "Model.img_size")
    ns, scaled = _scale(DECONV, 1 << 18)
    assert not any(k.startswith("Model.") for k in scaled), scaled
    model = ns["Model"](*ns["get_init_inputs"]())
    assert model(*ns["get_inputs"]()).dim() == 4  # the CPU copy runs
