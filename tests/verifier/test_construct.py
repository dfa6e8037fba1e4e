"""The one construction rule (`verifier.judge.construct`): every process builds the reference and
the candidate seeded, under the device context, by one method per run; a model that builds only
on the host makes the whole run the KernelBench way. The device-context code path runs here on
the cpu and on the meta device (what fails under a CUDA context fails under meta the same way:
a fresh tensor is not on the host)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from verifier.judge import decide
from verifier.judge.construct import DEVICE, HOST, HostOnly, build, build_any, build_checked
from verifier.run.collect import construct_for_discovery

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import LINEAR_TASK  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


class Mlp(nn.Module):
    """The draws a KernelBench model makes: layers, a raw parameter, a buffer."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 8))
        self.scale = nn.Parameter(torch.randn(8))
        self.register_buffer("shift", torch.rand(8))
        self.made_on = torch.empty(1).device.type  # where a fresh tensor lands during __init__

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x) * self.scale + self.shift


class MlpNew(nn.Module):
    """A candidate with other names, drawing in the same order: no state dict to copy."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(width, width), nn.Linear(width, 8)
        self.s = nn.Parameter(torch.randn(8))
        self.register_buffer("t", torch.rand(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x))) * self.s + self.t


class NeedsHost(nn.Module):
    """KernelBench accepts it: `.numpy()` of a fresh tensor works on the host only."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.arange(4.0).numpy().tolist()
        self.w = nn.Parameter(torch.randn(4))


class Broken(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        raise ValueError("broken on every device")


def _values(model: nn.Module) -> list[torch.Tensor]:
    return [t.detach().clone() for t in (*model.parameters(), *model.buffers())]


def test_reference_and_candidate_get_the_same_weights_from_the_same_seed() -> None:
    for method in (DEVICE, HOST):
        ref, new = build(Mlp, [16], 7, "cpu", method), build(MlpNew, [16], 7, "cpu", method)
        assert not ref.training and not new.training
        for a, b in zip(_values(ref), _values(new), strict=True):
            assert torch.equal(a, b)
        x = torch.randn(4, 16)
        assert torch.equal(ref(x), new(x))
    other = build(MlpNew, [16], 8, "cpu")
    assert not torch.equal(_values(other)[0], _values(ref)[0])  # the seed decides them


def test_on_the_cpu_both_methods_draw_the_same_weights() -> None:
    """The cpu backend is unchanged: the device context there draws from the host generator."""
    for a, b in zip(_values(build(Mlp, [16], 3, "cpu", DEVICE)),
                    _values(build(Mlp, [16], 3, "cpu", HOST)), strict=True):
        assert torch.equal(a, b)


def test_device_construction_makes_every_tensor_on_the_device() -> None:
    on_device = build(Mlp, [16], 0, "meta", DEVICE)
    assert on_device.made_on == "meta"  # drawn there: nothing of weight size on the host
    assert {t.device.type for t in _values(on_device)} == {"meta"}
    on_host = build(Mlp, [16], 0, "meta", HOST)
    assert on_host.made_on == "cpu"  # KernelBench's way: on the host, then moved
    assert {t.device.type for t in _values(on_host)} == {"meta"}

    class ExplicitCpu(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.zeros(3, device="cpu"))

    assert build(ExplicitCpu, [], 0, "meta").w.device.type == "meta"  # moved, as .cuda() does
    with pytest.raises(ValueError, match="construction method"):
        build(Mlp, [16], 0, "cpu", "gpu")


def test_a_model_that_builds_only_on_the_host_is_host_only() -> None:
    with pytest.raises(HostOnly, match=r"torch.device\('meta'\).*numpy.*builds on the host"):
        build_checked(NeedsHost, [], 0, "meta")
    assert build_checked(NeedsHost, [], 0, "meta", HOST).w.device.type == "meta"
    with pytest.raises(ValueError, match="broken on every device"):  # not HostOnly
        build_checked(Broken, [], 0, "meta")
    with pytest.raises(TypeError, match="numpy"):  # the plain build: the device's own error
        build(NeedsHost, [], 0, "meta", DEVICE)
    with pytest.raises(ValueError, match="broken on every device"):  # a host run: no fallback
        build_checked(Broken, [], 0, "meta", HOST)
    model, method = build_any(NeedsHost, [], 0, "meta")
    assert method == HOST and model.w.device.type == "meta"
    assert build_any(Mlp, [16], 0, "meta")[1] == DEVICE


def test_a_global_default_device_set_in_init_is_host_only() -> None:
    """`torch.set_default_device` in `__init__`: leaving the device context would undo it (its
    forward would then make tensors elsewhere than KernelBench's run does), so it is built the
    host's way, where it stays as it does in KernelBench."""

    class SetsDefault(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.set_default_device("meta")
            self.w = nn.Parameter(torch.randn(2))

    try:
        with pytest.raises(HostOnly, match="set_default_device"):
            build_checked(SetsDefault, [], 0, "meta")
        assert torch.get_default_device().type == "meta"  # the host build's, kept
    finally:
        torch.set_default_device(None)
    assert torch.empty(1).device.type == "cpu"


def test_the_judges_reference_is_the_rules_build_per_method() -> None:
    seed = 11
    ns: dict = {}
    exec(compile(LINEAR_TASK, "reference.py", "exec"), ns)
    mine = build(ns["Model"], ns["get_init_inputs"](), seed, "cpu")
    for method in (DEVICE, HOST):
        judged, _ = decide.reference(LINEAR_TASK, seed, method)
        for a, b in zip(_values(judged), _values(mine), strict=True):
            assert torch.equal(a, b)
    assert decide.reference(LINEAR_TASK, seed, HOST)[0] is not decide.reference(
        LINEAR_TASK, seed, DEVICE)[0]  # one cached model per method: never mixed up
    host_only = ("import torch\nclass Model(torch.nn.Module):\n"
                 "    def __init__(self):\n        super().__init__()\n"
                 "        if torch._C._len_torch_function_stack():\n"
                 "            raise RuntimeError('no device context, please')\n"
                 "    def forward(self, x):\n        return x\n"
                 "def get_inputs():\n    return [torch.rand(4)]\n"
                 "def get_init_inputs():\n    return []\n")
    with pytest.raises(HostOnly, match="no device context"):
        decide.reference(host_only, seed)
    assert decide.reference(host_only, seed, HOST)[0] is not None


def test_discovery_builds_on_meta_and_records_each_load_inline_once() -> None:
    sink: list = []

    class Records(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            sink.append("load_inline")
            self.fc = nn.Linear(width, width)
            self.where = self.fc.weight.device.type

    construct_for_discovery(Records, [8], sink)
    assert sink == ["load_inline"]

    class ReadsValues(Records):
        def __init__(self, width: int) -> None:
            super().__init__(width)
            self.first = float(self.fc.weight[0, 0].detach())  # no value on meta: built on the host

    sink.clear()
    construct_for_discovery(ReadsValues, [8], sink)
    assert sink == ["load_inline"]  # the meta attempt's record dropped, the host's kept


def _builder_calls(path: Path) -> list[str]:
    """Calls that build a Model/ModelNew by hand instead of through the rule."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Subscript) and isinstance(f.slice, ast.Constant) and \
                f.slice.value in ("Model", "ModelNew"):
            found.append(f"{path.name}:{node.lineno} {ast.unparse(f)}(...)")
        if isinstance(f, ast.Name) and f.id in ("model_new", "model_new_cls", "Model",
                                                "ModelNew"):
            found.append(f"{path.name}:{node.lineno} {f.id}(...)")
    return found


def test_every_verifier_process_builds_models_through_the_rule(tmp_path: Path) -> None:
    """The worker, the judge's reference (parent, referee, window and trial judges), the
    variants and the discovery run build through `verifier.judge.construct`, nowhere by hand."""
    rule = ROOT / "verifier" / "judge" / "construct.py"
    by_hand = [c for p in sorted((ROOT / "verifier").rglob("*.py")) if p != rule
               for c in _builder_calls(p)]
    assert by_hand == []
    users = {p.name for p in (ROOT / "verifier").rglob("*.py")
             if "verifier.judge.construct import" in p.read_text(encoding="utf-8")}
    assert {"worker.py", "decide.py", "generalize.py", "collect.py"} <= users
    probe = tmp_path / "probe.py"  # the finder does find a hand-built model
    probe.write_text("ref = ns['Model'](*init).to(device)\nnew = model_new_cls(*init)\n")
    assert len(_builder_calls(probe)) == 2
