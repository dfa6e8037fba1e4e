"""Lower a traced ATen graph to one candidate file: per-node lowerings, then `program.render`.

Separate from `program.py` so that the family modules (which use `program.Builder`) and the
registry (which collects their lowerings) never import each other in a circle.
"""

from __future__ import annotations

from pipeline.candidates.templates import attention, elementwise, registry
from pipeline.candidates.templates.analysis import Graph, NoTemplate, Reference
from pipeline.candidates.templates.program import (
    FAMILY_ORDER,
    Builder,
    Built,
    param_expr,
    render,
)


def lower(graph: Graph, ref: Reference, backend: str, variant: int) -> Built:
    """Lower the graph for one backend and variant; raise NoTemplate when an op is unsupported."""
    b = Builder(graph, ref, backend, variant, gather=elementwise.copy_kernel)
    places = graph.placeholders()
    nparams = len(graph.params)
    if len(places) != nparams + len(ref.forward_args):
        raise NoTemplate(f"forward takes {len(ref.forward_args)} inputs but the trace has "
                         f"{len(places) - nparams}")
    # Buffers follow parameters in the probe's placeholder order.
    for i, node in enumerate(places):
        if i < nparams:
            b.env[node.name] = param_expr(graph.params[i], False)
        else:
            b.env[node.name] = ref.forward_args[i - nparams]
    b.sizes = {sym: src if isinstance(src, str) else f"{b.env[src[0]]}.size({src[1]})"
               for sym, src in graph.symbols.items()}
    if not ref.forward_args:
        raise NoTemplate("forward has no tensor inputs")
    b.emit(f"dev = {ref.forward_args[0]}.device")
    live = graph.live_nodes()
    live_names = {n.name for n in live}
    users = {n.name: [u for u in n.users if u in live_names] for n in graph.nodes}
    fused = attention.match(b, live)
    if fused is not None:  # the whole graph is one attention: one kernel (CPU simd)
        attention.lower_fused(b, fused)
    else:
        groups = registry.plan_fusion(b, live, users)
        for node in live:
            registry.lower_node(b, node, groups, users)
    outs = graph.outputs()
    exprs = []
    for o in outs:
        if not (isinstance(o, dict) and "node" in o):
            raise NoTemplate("an output is not a tensor")
        if b.node(o["node"]).op == "placeholder":
            raise NoTemplate("an output aliases an input")
        exprs.append(b.val(o))
    b.emit("return " + (exprs[0] if len(exprs) == 1 else "(" + ", ".join(exprs) + ",)"))
    fams = [f for f in FAMILY_ORDER if f in b.families]
    if not b.kernels:
        raise NoTemplate("the reference launches no compute (views only)")
    return Built(render(b), b.kernels, fams[0] if fams else "other",
                 [k.note for k in b.kernels], b.params)
