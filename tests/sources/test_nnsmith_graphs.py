"""NNSmith graphs: emitted PyTorch source reproduces the SymbolNet, constraints hold."""

from __future__ import annotations

import json

import pytest
import torch

from schemas import RawModule, Rejection
from sources.config import NNSmithConfig
from sources.nnsmith_emit import EMITTERS, UnsupportedOp, emit_source
from sources.nnsmith_graphs import build_opset, generate_graph, iter_nnsmith_modules

CFG = NNSmithConfig(count=2, seed=7, max_nodes=5, target_numel=4096)


@pytest.fixture(scope="module")
def opset():
    return build_opset(CFG)


def _load(source: str) -> dict:
    ns: dict = {"__name__": "emitted"}
    exec(compile(source, "<emitted>", "exec"), ns)
    return ns


def _symbolnet(ir):
    from nnsmith.materialize import Model

    return Model.init("torch").from_gir(ir).native_model.eval()


@pytest.mark.parametrize("graph_seed", [1, 2, 3, 4, 5, 6])
def test_emitted_source_reproduces_symbolnet(opset, graph_seed):
    ir = generate_graph(opset, CFG, graph_seed)
    emitted = emit_source(ir)
    ns = _load(emitted.source)
    torch.manual_seed(0)
    model = ns["Model"]().eval()
    net = _symbolnet(ir)
    # SymbolNet draws its own weights: copy them into ours through the recorded slots
    modules = [inst[0] for inst in net.instructions]
    with torch.no_grad():
        for inst_index, torch_attr, ours in emitted.slots:
            getattr(model, ours).copy_(getattr(modules[inst_index], torch_attr))
    torch.manual_seed(1)
    inputs = ns["get_inputs"]()
    with torch.no_grad():
        expected = net(*inputs)
        got = model(*inputs)
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape and g.dtype == e.dtype
        torch.testing.assert_close(g, e, equal_nan=True)
    # the source is standalone and readable: explicit torch calls, no nnsmith
    assert "nnsmith" not in emitted.source.split('"""', 2)[2]
    assert "def forward(self" in emitted.source and "class Model(nn.Module)" in emitted.source


def test_constraints_float32_and_ranks(opset):
    cfg = CFG.model_copy(update={"min_rank": 2, "max_rank": 3})
    for graph_seed in range(3):
        ir = generate_graph(build_opset(cfg), cfg, graph_seed)
        for var in ir.input_var():
            assert ir.vars[var].dtype.torch() == torch.float32
            assert 2 <= len(ir.vars[var].shape) <= 3


def test_unsupported_op_is_named(opset):
    ir = None
    for graph_seed in range(40):
        ir = generate_graph(opset, CFG, graph_seed)
        names = [type(i.iexpr.op).__name__ for i in ir.insts]
        if "ReLU" in names or "GELU" in names:
            break
    missing = "ReLU" if "ReLU" in names else "GELU"
    partial = {k: v for k, v in EMITTERS.items() if k != missing}
    with pytest.raises(UnsupportedOp) as err:
        emit_source(ir, emitters=partial)
    assert err.value.op == f"core.{missing}"


def test_iter_yields_seeded_raw_modules():
    first = list(iter_nnsmith_modules(CFG))
    again = list(iter_nnsmith_modules(CFG))
    mods = [m for m in first if isinstance(m, RawModule)]
    assert len(mods) == CFG.count
    assert [m.module_id for m in mods] == [m.module_id for m in again if isinstance(m, RawModule)]
    assert all(isinstance(x, RawModule | Rejection) for x in first)
    for m in mods:
        assert m.source_kind == "nnsmith" and m.module_name == "Model"
        meta = json.loads(m.meta)
        assert meta["ops"] and all(len(s) >= 2 for s in meta["input_shapes"])
        ns = _load(m.code)
        torch.manual_seed(0)
        out = ns["Model"](*ns["get_init_inputs"]())(*ns["get_inputs"]())
        outs = out if isinstance(out, tuple) else (out,)
        assert all(torch.isfinite(o).all() for o in outs if o.is_floating_point())


def test_exclude_ops_removes_them():
    cfg = CFG.model_copy(update={"exclude_ops": ["core.ReLU", "Softmax"]})
    names = {op.name() for op in build_opset(cfg)}
    assert "core.ReLU" not in names and "core.Softmax" not in names and "core.GELU" in names
    only = {op.name() for op in build_opset(CFG.model_copy(update={"include_ops": ["core.Add",
                                                                                    "core.ReLU"]}))}
    assert only == {"core.Add", "core.ReLU"}
