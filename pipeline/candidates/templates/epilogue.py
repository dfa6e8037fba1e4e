"""Fused epilogues: an elementwise chain that reads only a GEMM's or a convolution's output
(bias + GELU + scale, ReLU, a residual-free activation chain) is applied to each value before the
producer stores it, so the chain has no kernel, no pass over memory and no buffer of its own.

`plan` (from `registry.plan_fusion`) moves such chains out of the elementwise groups;
`apply` (from the matmul and conv lowerings) rewrites the producer's store through the chain.
"""

from __future__ import annotations

import re

from pipeline.candidates.templates.analysis import Node, NoTemplate
from pipeline.candidates.templates.elementwise import element_function, group_operands
from pipeline.candidates.templates.program import Builder, acc_type
from pipeline.candidates.templates.tidy import cpu_inline

PRODUCERS = ("mm", "addmm", "bmm", "baddbmm", "convolution")
_STORE = re.compile(r"= \(([\w:]+)\)v;")


def plan(b: Builder, groups: dict[str, list[Node]], users: dict[str, list[str]]) -> None:
    """Move each chain whose one tensor input is a producer it alone reads into b.epilogues."""
    for root, members in list(groups.items()):
        leaves = group_operands(b, members)
        if len(leaves) != 1:
            continue
        src = b.node(leaves[0]["node"])
        inside = {m.name for m in members}
        out = b.node(root)
        if (src.base not in PRODUCERS or not users.get(src.name)
                or not set(users[src.name]) <= inside or src.name in b.epilogues
                or out.shape != src.shape or out.dtype != src.dtype
                or out.dtype not in ("float32", "float16", "bfloat16")
                or not (out.meta or {}).get("contiguous", True)):
            continue
        b.epilogues[src.name] = groups.pop(root)


def apply(b: Builder, node: Node, src: str, kname: str) -> tuple[str, str, str]:
    """(kernel text with its stores through the chain, the chain's root or "", a note)."""
    chain = b.epilogues.get(node.name)
    if chain is None:
        return src, "", ""
    efn = element_function(b, chain, [{"node": node.name}], acc_type(node.dtype), f"{kname}_epi")
    if not b.cuda:
        efn = cpu_inline(efn)
    text, n = _STORE.subn(lambda m: f"= ({m.group(1)}){kname}_epi(v);", src)
    if n == 0:
        raise NoTemplate(f"{node.target}: no store to fuse the elementwise epilogue into")
    ops = ", ".join(m.target.removeprefix("aten.") for m in chain)
    note = (f"; the elementwise epilogue ({ops}) is applied to each value in registers before "
            "the store, so it needs no kernel, pass or buffer of its own")
    return efn + text, chain[-1].name, note
