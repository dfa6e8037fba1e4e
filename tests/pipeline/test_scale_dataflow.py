"""CPU copies keep the task's meaning: scaled dims follow the file's data flow, constraints stop
the scaling, and sizes no host can hold give a `too_large_for_host` verdict, not `invalid`."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from pipeline.tasks.taskfile import inspect_task_source, substitute_constants

DERIVED = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, in_channels, out_channels, bias_shape):
            super().__init__()
            self.conv = nn.Conv2d(in_channels, out_channels, 3)
            self.bias = nn.Parameter(torch.randn(bias_shape))

        def forward(self, x):
            return torch.relu(self.conv(x)) + self.bias

    batch_size = 64
    in_channels = 8
    out_channels = 256
    height = width = 64
    bias_shape = (out_channels, 1, 1)

    def get_inputs():
        return [torch.randn(batch_size, in_channels, height, width)]

    def get_init_inputs():
        return [in_channels, out_channels, bias_shape]
''')

GROUPS = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, features, groups):
            super().__init__()
            self.fc = nn.Linear(features, features)
            self.norm = nn.GroupNorm(groups, features)

        def forward(self, x):
            return self.norm(self.fc(x))

    batch_size = 2048
    features = 1536
    num_groups = 24

    def get_inputs():
        return [torch.randn(batch_size, features)]

    def get_init_inputs():
        return [features, num_groups]
''')

POOLS = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, channels):
            super().__init__()
            layers = []
            for _ in range(5):
                layers += [nn.Conv2d(channels, channels, 3, padding=1), nn.MaxPool2d(2)]
            self.body = nn.Sequential(*layers)

        def forward(self, x):
            return self.body(x).flatten(1)

    batch_size = 32
    channels = 16
    image_size = 256

    def get_inputs():
        return [torch.randn(batch_size, channels, image_size, image_size)]

    def get_init_inputs():
        return [channels]
''')

ARITH = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def forward(self, a, b):
            return a @ b

    M = 1024 * 16
    K = 64 * 2

    def get_inputs():
        return [torch.randn(M, K), torch.randn(K, M)]

    def get_init_inputs():
        return []
''')

HUGE = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def forward(self, x):
            return x * 2

    def get_inputs():
        return [torch.randn(1 << 16, 1 << 16)]

    def get_init_inputs():
        return []
''')


def test_derived_constant_follows_the_scaled_one():
    rep = inspect_task_source(DERIVED, scale=True, cpu_max_numel=1 << 16)
    assert rep.valid, rep.reason
    assert rep.scaled_constants
    channels = rep.scaled_constants.get("out_channels", 256)
    assert rep.init_inputs[2] == [channels, 1, 1]
    assert rep.outputs[0].shape[1] == channels
    again = inspect_task_source(rep.cpu_source)
    assert again.valid and again.outputs[0].shape == rep.outputs[0].shape


def test_group_count_keeps_dividing_the_scaled_features():
    rep = inspect_task_source(GROUPS, scale=True, cpu_max_numel=1 << 14)
    assert rep.valid, rep.reason
    features, groups = rep.init_inputs
    assert features % groups == 0
    assert rep.inputs[0].shape[0] * rep.inputs[0].shape[1] <= 1 << 14


def test_pooling_chain_keeps_at_least_one_pixel():
    rep = inspect_task_source(POOLS, scale=True, cpu_max_numel=1 << 14)
    assert rep.valid, rep.reason
    size = rep.inputs[0].shape[2]
    assert size >= 32 and size < 256  # five 2x2 pools need 32 pixels; it did scale
    assert rep.outputs[0].shape[1] == rep.inputs[0].shape[1] * (size // 32) ** 2


def test_int_arithmetic_constants_scale_and_substitute():
    rep = inspect_task_source(ARITH, scale=True, cpu_max_numel=1 << 16)
    assert rep.valid, rep.reason
    assert "M" in rep.scaled_constants
    assert f"M = {rep.scaled_constants['M']}" in rep.cpu_source
    assert substitute_constants("N = 4 * 2  # eight\n", {"N": 2}) == "N = 2  # eight\n"


def test_sizes_no_host_can_hold_are_too_large_for_host_not_invalid(tmp_path):
    rep = inspect_task_source(HUGE, scale=True, memory_mb=2048)
    assert not rep.valid and rep.too_large_for_host, rep.reason
    assert rep.reason.startswith("too_large_for_host")
    path = tmp_path / "huge.py"
    path.write_text(HUGE)
    bad = tmp_path / "bad.py"
    bad.write_text("x = (\n")
    cmd = [sys.executable, "-m", "pipeline.cli.__main__", "tasks", "validate", "--json",
           "--workspace", str(tmp_path / "ws")]
    only_big = subprocess.run([*cmd, str(path)], capture_output=True, text=True)
    assert only_big.returncode == 0, only_big.stderr
    assert json.loads(only_big.stdout)["too_large_for_host"] is True
    with_bad = subprocess.run([*cmd, str(path), str(bad)], capture_output=True, text=True)
    assert with_bad.returncode == 1


RNN = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, input_size, hidden_size, num_layers):
            super().__init__()
            self.rnn = nn.GRU(input_size, hidden_size, num_layers, batch_first=True,
                              bidirectional=True)

        def forward(self, x):
            return self.rnn(x)[0][:, -1]

    batch_size = 8
    seq_len = 1024
    input_size = 128
    hidden_size = 256
    num_layers = 4

    def get_inputs():
        return [torch.randn(batch_size, seq_len, input_size)]

    def get_init_inputs():
        return [input_size, hidden_size, num_layers]
''')


def test_recurrent_model_scales_by_its_flops_within_the_time_budget():
    rep = inspect_task_source(RNN, scale=True, timeout_s=60)
    assert rep.valid, rep.reason
    batch, steps, width = rep.inputs[0].shape
    hidden = rep.init_inputs[1]
    layers = rep.init_inputs[2]
    flops = 2 * 2 * 3 * hidden * ((width + hidden) + (layers - 1) * 3 * hidden) * batch * steps
    assert flops <= 1 << 28 and steps < 1024
    assert rep.outputs[0].shape == [batch, 2 * hidden]
