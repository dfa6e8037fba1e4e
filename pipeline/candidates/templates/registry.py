"""Which lowering handles which ATen op; elementwise fusion planning; view ops in Python."""

from __future__ import annotations

from collections.abc import Callable

from pipeline.candidates.templates import (
    conv,
    elementwise,
    epilogue,
    loss,
    matmul,
    misc,
    norm,
    pooling,
    reduction,
    scan,
    softmax,
)
from pipeline.candidates.templates.analysis import Node, NoTemplate
from pipeline.candidates.templates.program import Builder

LOWERINGS: dict[str, Callable[[Builder, Node], None]] = {}
for _mod in (reduction, softmax, norm, matmul, conv, pooling, scan, loss, misc):
    LOWERINGS.update(_mod.LOWERINGS)

ALLOC = {"zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "empty",
         "empty_like", "new_zeros", "new_ones", "new_empty", "new_full", "scalar_tensor",
         "empty_strided"}


def plan_fusion(b: Builder, live: list[Node], users: dict[str, list[str]]
                ) -> dict[str, list[Node]]:
    """Map each fused group's root (last node) to its members in graph order."""
    order = {n.name: i for i, n in enumerate(b.graph.nodes)}
    groups: dict[str, list[Node]] = {}
    for n in live:
        if not elementwise.is_elementwise(n):
            continue
        members = [n]
        for r in elementwise._tensor_refs(n):
            if (r in groups and users.get(r) == [n.name]
                    and b.node(r).shape == n.shape):
                members = groups.pop(r) + members
        groups[n.name] = sorted({m.name: m for m in members}.values(),
                                key=lambda m: order[m.name])
    for root, members in list(groups.items()):
        if _softmax_prologue(b, root, members, users):
            b.prologues[root] = groups.pop(root)
    epilogue.plan(b, groups, users)
    return groups


def _softmax_prologue(b: Builder, root: str, members: list[Node],
                      users: dict[str, list[str]]) -> bool:
    """A CPU simd softmax can apply a one-input chain (softmin's neg, a temperature's div) as it
    reads its row: one pass over memory and one allocation fewer than the chain's own kernel."""
    if not b.simd or len(users.get(root, [])) != 1:
        return False
    user = b.node(users[root][0])
    if softmax.LOWERINGS.get(user.base) is None or user.base == "logsumexp":
        return False
    leaves = elementwise.group_operands(b, members)
    if len(leaves) != 1:
        return False
    leaf, out = b.meta(leaves[0]), b.node(root)
    return (leaf["shape"] == out.shape and leaf["dtype"] == out.dtype
            and out.dtype in ("float32", "float64"))


def _view(b: Builder, node: Node) -> str | None:
    """Python text for a view/shape op, or None when the op is not one."""
    x = b.env.get(node.named.get("self", {}).get("node", "")) if isinstance(
        node.named.get("self"), dict) else None
    base = node.base
    if base in ("view", "_unsafe_view", "reshape") and x:
        return f"{x}.view({tuple(node.a('size') or node.a('shape'))!r})" if base != "reshape" \
            else f"{x}.reshape({tuple(node.a('shape'))!r})"
    if base == "expand" and x:
        return f"{x}.expand({tuple(node.a('size'))!r})"
    if base == "t" and x:
        return f"{x}.t()"
    if base == "transpose" and x:
        return f"{x}.transpose({node.a('dim0')}, {node.a('dim1')})"
    if base == "permute" and x:
        return f"{x}.permute({tuple(node.a('dims'))!r})"
    if base == "unsqueeze" and x:
        return f"{x}.unsqueeze({node.a('dim')})"
    if base == "squeeze" and x:
        d = node.a("dim")
        return f"{x}.squeeze({tuple(d) if isinstance(d, list) else d!r})" if d is not None \
            else f"{x}.squeeze()"
    if base == "select" and x:
        return f"{x}.select({node.a('dim')}, {node.a('index')})"
    if base == "slice" and x:
        dim, start, end, step = (node.a("dim", 0), node.a("start"), node.a("end"),
                                 node.a("step", 1))
        idx = ":, " * dim + f"{'' if start is None else start}:{'' if end is None else end}" \
            f"{'' if step == 1 else f':{step}'}"
        return f"{x}[{idx}]"
    if base == "narrow" and x:
        return f"{x}.narrow({node.a('dim')}, {node.a('start')}, {node.a('length')})"
    if base in ("detach", "alias", "lift_fresh", "contiguous") and x:
        if base == "contiguous":
            return None
        return x
    if base == "as_strided" and x:
        return (f"{x}.as_strided({tuple(node.a('size'))!r}, {tuple(node.a('stride'))!r}, "
                f"{node.a('storage_offset') or 0})")
    if base == "unfold" and x:
        return f"{x}.unfold({node.a('dimension')}, {node.a('size')}, {node.a('step')})"
    if base == "diagonal" and x:
        return f"{x}.diagonal({node.a('offset', 0)}, {node.a('dim1', 0)}, {node.a('dim2', 1)})"
    return None


def lower_node(b: Builder, node: Node, groups: dict[str, list[Node]],
               users: dict[str, list[str]]) -> None:
    """Lower one live node (group roots emit the fused kernel; members are skipped)."""
    if node.name in groups:
        elementwise.lower_group(b, groups[node.name])
        return
    if elementwise.is_elementwise(node):
        return  # a member of a later group
    if node.target == "getitem":
        src, idx = node.args[0]["node"], node.args[1]
        parts = b.tuples.get(src)
        if parts is None or idx not in parts:
            raise NoTemplate(f"output {idx} of {b.node(src).target} is not produced")
        b.env[node.name] = parts[idx]
        return
    text = _view(b, node)
    if text is not None:
        var = b.fresh("v")
        if text.isidentifier():
            b.env[node.name] = text
        else:
            b.emit(f"{var} = {text}")
            b.env[node.name] = var
        return
    if node.base in ALLOC:
        _alloc(b, node)
        return
    low = LOWERINGS.get(node.base.removesuffix("_")) or LOWERINGS.get(node.base)
    if low is None:
        raise NoTemplate(f"no template for {node.target}")
    low(b, node)
    if isinstance(node.meta, dict) and not node.meta.get("contiguous", True):
        # Our kernels write contiguous outputs; a later view would see another layout.
        raise NoTemplate(f"{node.target} yields a non-contiguous layout in the reference")


def _alloc(b: Builder, node: Node) -> None:
    base = node.base
    value = {"zeros": 0, "zeros_like": 0, "new_zeros": 0, "ones": 1, "ones_like": 1,
             "new_ones": 1}.get(base)
    if base in ("full", "full_like", "new_full"):
        value = node.a("fill_value")
    if base == "scalar_tensor":
        value = node.a("s")
    if isinstance(value, dict):
        raise NoTemplate(f"{node.target} with a non-literal fill value")
    var = b.fresh("buf")
    shape = tuple(node.shape)
    if value is None:
        b.emit(f"{var} = torch.empty({shape!r}, dtype=torch.{node.dtype}, device=dev)")
    else:
        b.emit(f"{var} = torch.full({shape!r}, {value!r}, dtype=torch.{node.dtype}, device=dev)")
    b.env[node.name] = var
