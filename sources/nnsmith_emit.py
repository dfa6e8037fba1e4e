"""Emit an NNSmith graph IR as a readable PyTorch task file: one explicit torch call per
instruction, every weight an nn.Parameter created in instruction order.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field


class UnsupportedOp(ValueError):
    """The graph holds an op the emitter has no PyTorch spelling for; `op` names it."""

    def __init__(self, op: str):
        super().__init__(f"no emitter for op {op}")
        self.op = op


@dataclass
class EmittedGraph:
    """A graph written as a task file, plus where each SymbolNet weight went."""

    source: str
    ops: list[str]
    input_shapes: list[list[int]]
    # (index among SymbolNet.instructions, attribute on its torch module, our attribute name)
    slots: list[tuple[int, str, str]] = field(default_factory=list)


@dataclass
class _Ctx:
    """Emission state: the __init__ lines and the weight slots gathered so far."""

    init: list[str] = field(default_factory=list)
    slots: list[tuple[int, str, str]] = field(default_factory=list)
    inst_index: int = 0
    counter: int = 0

    def param(self, stem: str, torch_attr: str, init_expr: str, buffer: bool = False) -> str:
        name = f"{stem}{self.counter}_{torch_attr.replace('running_', '')}"
        if buffer:
            self.init.append(f'self.register_buffer("{name}", {init_expr})')
        else:
            self.init.append(f"self.{name} = nn.Parameter({init_expr})")
        self.slots.append((self.inst_index, torch_attr, name))
        return f"self.{name}"


def _shape(shape: list[int]) -> str:
    return "(" + ", ".join(str(int(d)) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _uniform(shape: list[int], fan_in: int) -> str:
    bound = 1.0 / math.sqrt(max(1, fan_in))
    return f"(torch.rand({_shape(shape)}) * 2 - 1) * {bound:.6g}"


# --- per-op emitters: (op, args, ctx) -> expression (a list of expressions for multi-output) ---


def _unary(fn: str) -> Callable:
    return lambda op, a, ctx: f"{fn}({a[0]})"


def _binary(fn: str) -> Callable:
    return lambda op, a, ctx: f"{fn}({a[0]}, {a[1]})"


def _constant(op, a, ctx):
    return ctx.param("const", "data", f"torch.randn({_shape(op.abs_tensor.shape)})")


def _prelu(op, a, ctx):
    return f"F.prelu({a[0]}, {ctx.param('prelu', 'weight', 'torch.full((1,), 0.25)')})"


def _div(op, a, ctx):
    if op.input_like[0].dtype.torch().is_floating_point:
        return f"torch.div({a[0]}, {a[1]})"
    return f'torch.div({a[0]}, {a[1]}, rounding_mode="floor")'


def _clip(op, a, ctx):
    lim = 1.5 if op.input_like[0].dtype.torch().is_floating_point else 1
    return f"torch.clip({a[0]}, {-lim}, {lim})"


def _pool(fn: str) -> Callable:
    return lambda op, a, ctx: (f"{fn}({a[0]}, kernel_size=({op.kernel_h_size}, {op.kernel_w_size}),"
                               f" stride={op.stride}, padding={op.padding})")


def _slice(op, a, ctx):
    # the same start/end arithmetic as nnsmith.materialize.torch.forward (region-relative ends)
    reg = op.extra_attrs["region"]
    dim_s = op.input_like[0].shape[op.extra_attrs["axis"]]
    start, end = op.start, op.end
    if reg in ("left", "mid"):
        start -= dim_s
    if reg == "left" and end < dim_s and end != op.INT_MAX:
        end -= dim_s
    end_text = "" if end == op.INT_MAX else str(end)
    parts = [":"] * op.extra_attrs["ndims"]
    parts[op.extra_attrs["axis"]] = f"{start}:{end_text}:{op.step}"
    return f"{a[0]}[{', '.join(parts)}]"


def _pad(op, a, ctx):
    kind = op.extra_attrs["type"]
    pads = [int(p) for p in op.padding_list]
    if kind == "constant":
        return f'F.pad({a[0]}, {pads}, mode="constant", value=0.5)'
    return f'F.pad({a[0]}, {pads}, mode="{kind}")'


def _batchnorm(op, a, ctx):
    n = int(op.nfeat)
    w = ctx.param("bn", "weight", f"torch.ones({n})")
    b = ctx.param("bn", "bias", f"torch.zeros({n})")
    mean = ctx.param("bn", "running_mean", f"torch.zeros({n})", buffer=True)
    var = ctx.param("bn", "running_var", f"torch.ones({n})", buffer=True)
    return f"F.batch_norm({a[0]}, {mean}, {var}, {w}, {b}, training=False, eps=1e-05)"


def _conv1d(op, a, ctx):
    cin, cout, k = int(op.in_channels), int(op.out_channels), int(op.kernel_size)
    w = ctx.param("conv", "weight", _uniform([cout, cin, k], cin * k))
    b = ctx.param("conv", "bias", _uniform([cout], cin * k))
    return (f"F.conv1d({a[0]}, {w}, {b}, stride={op.stride}, padding={op.padding}, "
            f"dilation={op.dilation})")


def _conv2d(op, a, ctx):
    cin, cout = int(op.in_channels), int(op.out_channels)
    kh, kw = int(op.kernel_h_size), int(op.kernel_w_size)
    w = ctx.param("conv", "weight", _uniform([cout, cin, kh, kw], cin * kh * kw))
    b = ctx.param("conv", "bias", _uniform([cout], cin * kh * kw))
    return (f"F.conv2d({a[0]}, {w}, {b}, stride={op.stride}, padding={op.padding}, "
            f"dilation=({op.dilation_h}, {op.dilation_w}))")


def _linear(op, a, ctx):
    fin, fout = int(op.ifeat), int(op.ofeat)
    w = ctx.param("fc", "weight", _uniform([fout, fin], fin))
    b = ctx.param("fc", "bias", _uniform([fout], fin))
    return f"F.linear({a[0]}, {w}, {b})"


def _reduce(method: str, values: bool = False) -> Callable:
    def emit(op, a, ctx):
        dim = op.extra_attrs.get("reduce_dim")
        if dim is None:
            return f"{a[0]}.{method}()"
        return f"{a[0]}.{method}({dim})" + (".values" if values else "")

    return emit


def _squeeze(op, a, ctx):
    dim = op.extra_attrs.get("reduce_dim")
    return f"{a[0]}.squeeze({dim})" if dim is not None else f"{a[0]}.squeeze()"


def _transpose(op, a, ctx):
    d0, d1 = op._init_swap_dims(op.input_like[0].shape)
    return f"{a[0]}.transpose({d0}, {d1})"


def _interp(mode: str) -> Callable:
    return lambda op, a, ctx: (f"F.interpolate({a[0]}, size={[int(s) for s in op.size]}, "
                               f'mode="{mode}")')


def _cast(op, a, ctx):
    return f"{a[0]}.to(dtype={op.extra_attrs['to'].torch()})"


EMITTERS: dict[str, Callable] = {
    "Constant": _constant, "ReLU": _unary("torch.relu"), "GELU": _unary("F.gelu"),
    "LeakyReLU": lambda op, a, ctx: f"F.leaky_relu({a[0]}, 0.01)", "PReLU": _prelu,
    "Sigmoid": _unary("torch.sigmoid"), "Sin": _unary("torch.sin"), "Cos": _unary("torch.cos"),
    "Asin": _unary("torch.asin"), "Acos": _unary("torch.acos"), "Tan": _unary("torch.tan"),
    "Atan": _unary("torch.atan"), "Abs": _unary("torch.abs"), "Floor": _unary("torch.floor"),
    "Ceil": _unary("torch.ceil"), "Round": _unary("torch.round"), "Sqrt": _unary("torch.sqrt"),
    "Log2": _unary("torch.log2"), "Neg": _unary("torch.neg"), "Clip": _clip,
    "Where": lambda op, a, ctx: f"torch.where({a[0]}, {a[1]}, {a[2]})",
    "Add": _binary("torch.add"), "Sub": _binary("torch.sub"), "Mul": _binary("torch.mul"),
    "Div": _div, "Max": _binary("torch.maximum"), "Min": _binary("torch.minimum"),
    "Pow": _binary("torch.pow"), "Equal": _binary("torch.eq"), "Greater": _binary("torch.gt"),
    "Less": _binary("torch.lt"), "And": _binary("torch.logical_and"),
    "Or": _binary("torch.logical_or"), "Xor": _binary("torch.logical_xor"),
    "Softmax": lambda op, a, ctx: f"torch.softmax({a[0]}, dim={op.dim})",
    "MaxPool2d": _pool("F.max_pool2d"), "AvgPool2d": _pool("F.avg_pool2d"), "Slice": _slice,
    "Pad": _pad, "ConstPad": _pad, "ReplicatePad": _pad, "ReflectPad": _pad,
    "Expand": lambda op, a, ctx: f"{a[0]}.expand({_shape(op.output_like[0].shape)[1:-1]})",
    "BatchNorm2d": _batchnorm, "Conv1d": _conv1d, "NCHWConv2d": _conv2d,
    "Reshape": lambda op, a, ctx: f"{a[0]}.reshape({_shape(op.target_shape)})",
    "Flatten": lambda op, a, ctx: f"{a[0]}.flatten()", "Transpose": _transpose,
    "NearestInterp": _interp("nearest"), "LinearInterp": _interp("linear"),
    "BilinearInterp": _interp("bilinear"), "BicubicInterp": _interp("bicubic"),
    "TrilinearInterp": _interp("trilinear"), "Squeeze": _squeeze,
    "TorchReduceSum": _reduce("sum"), "ReduceSum": _reduce("sum"),
    "ReduceMin": _reduce("min", values=True), "ReduceMax": _reduce("max", values=True),
    "ReduceMean": _reduce("mean"), "ArgMin": _reduce("argmin"), "ArgMax": _reduce("argmax"),
    "Tril": lambda op, a, ctx: f"{a[0]}.tril({op.diagonal})",
    "Triu": lambda op, a, ctx: f"{a[0]}.triu({op.diagonal})", "Linear": _linear,
    "Concat": lambda op, a, ctx: f"torch.cat([{', '.join(a)}], dim={op.extra_attrs['axis']})",
    "Cast": _cast, "MatMul": _binary("torch.matmul"), "PTMatMul": _binary("torch.matmul"),
}


def _emitter_for(op, emitters: dict[str, Callable]) -> Callable | None:
    # nnsmith specializes ops by subclassing (Concat3 -> Concat, CastF32 -> Cast, ExpandLast2 ->
    # Expand), so look the class and then its bases up by name
    for cls in type(op).__mro__:
        if cls.__name__ in emitters:
            return emitters[cls.__name__]
    return None


def emit_source(ir, *, title: str = "NNSmith graph",
                emitters: dict[str, Callable] | None = None) -> EmittedGraph:
    """Write a concrete nnsmith GraphIR as a KernelBench task file; raise UnsupportedOp."""
    from nnsmith.abstract.op import Input

    emitters = EMITTERS if emitters is None else emitters
    ctx = _Ctx()
    names: dict[str, str] = {}
    inputs = list(ir.input_var())
    for i, var in enumerate(inputs):
        names[var] = f"x{i}"
    body: list[str] = []
    ops: list[str] = []
    for inst in ir.insts:
        op = inst.iexpr.op
        if isinstance(op, Input):
            continue
        emit = _emitter_for(op, emitters)
        if emit is None:
            raise UnsupportedOp(op.name())
        ctx.counter = len(body)
        expr = emit(op, [names[v] for v in inst.iexpr.args], ctx)
        outs = inst.retvals()
        base = len(names) - len(inputs)
        for k, var in enumerate(outs):
            names[var] = f"v{base + k}"
        target = ", ".join(names[v] for v in outs)
        body.append(f"{target} = {expr}")
        ops.append(op.name())
        ctx.inst_index += 1
    leaves = [names[v] for v in ir.leaf_var()]
    body.append(f"return {leaves[0]}" if len(leaves) == 1 else f"return {', '.join(leaves)}")
    shapes = [[int(d) for d in ir.vars[v].shape] for v in inputs]
    dtypes = [ir.vars[v].dtype.torch() for v in inputs]
    args = ", ".join(names[v] for v in inputs)
    init = "\n".join(f"        {line}" for line in ["super().__init__()", *ctx.init])
    fwd = "\n".join(f"        {line}" for line in body)
    gen_inputs = ", ".join(_input_expr(s, d) for s, d in zip(shapes, dtypes, strict=True))
    source = f'''"""{title}: {len(ops)} ops ({", ".join(dict.fromkeys(ops))}).

Generated by kernelsynth from an NNSmith graph; weights are created in instruction order, so a
seeded construction is reproducible.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """A random graph of {len(ops)} ops from NNSmith."""

    def __init__(self):
{init}

    def forward(self, {args}):
{fwd}


def get_inputs():
    return [{gen_inputs}]


def get_init_inputs():
    return []
'''
    return EmittedGraph(source=source, ops=ops, input_shapes=shapes, slots=ctx.slots)


def _input_expr(shape: list[int], dtype) -> str:
    import torch

    if dtype.is_floating_point:
        return f"torch.randn({_shape(shape)}{'' if dtype == torch.float32 else f', dtype={dtype}'})"
    if dtype == torch.bool:
        return f"torch.randint(0, 2, {_shape(shape)}).bool()"
    return f"torch.randint(-4, 5, {_shape(shape)}, dtype={dtype})"
