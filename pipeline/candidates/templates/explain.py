"""The reasoning text of a template answer, derived from the graph and the emitted code.

Every sentence states something the candidate file shows: the work and compulsory traffic at
the task's sizes (FLOPs counted per op from the traced shapes, pipeline.tasks.annotate.flops for everything
torch's counter leaves out), one step per emitted kernel in the backend's own terms (CUDA:
blocks, threads, coalescing, shared memory; CPU: OpenMP loops, contiguous inner loops), where
sizes and constructor values come from, and the accumulation types the kernels use.
"""

from __future__ import annotations

import math
import re

from pipeline.candidates.templates.analysis import Graph, Node, TaskView
from pipeline.tasks.annotate.flops import op_flops

_BYTES = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "float16": 2, "bfloat16": 2,
          "int16": 2, "int8": 1, "uint8": 1, "bool": 1}
_NO_FLOPS = {"view", "_unsafe_view", "reshape", "expand", "t", "transpose", "permute",
             "unsqueeze", "squeeze", "select", "slice", "narrow", "detach", "alias", "lift_fresh",
             "contiguous", "as_strided", "unfold", "diagonal", "clone", "_to_copy", "copy",
             "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like",
             "full", "full_like", "new_zeros", "new_ones", "new_empty", "new_full",
             "scalar_tensor", "embedding", "index_select", "gather", "triu", "tril", "cat",
             "stack", "getitem", "lift_fresh_copy"}
# Peak fp32 FLOP/s over memory bandwidth: above this many FLOP per byte a kernel is compute-bound.
RIDGE = {"cuda": 20.0, "musa": 30.0, "cpu": 10.0}


def _numel(meta) -> int:
    if isinstance(meta, dict):
        return math.prod(int(d) for d in meta["shape"])
    if isinstance(meta, list) and meta:
        return _numel(meta[0])
    return 0


def _bytes(meta) -> int:
    if isinstance(meta, dict):
        return _numel(meta) * _BYTES.get(meta["dtype"], 4)
    if isinstance(meta, list):
        return sum(_bytes(m) for m in meta)
    return 0


def _inputs(graph: Graph, node: Node) -> list[dict]:
    out = []
    for v in node.named.values():
        refs = v if isinstance(v, list) else [v]
        for r in refs:
            if isinstance(r, dict) and "node" in r and isinstance(graph.by_name[r["node"]].meta,
                                                                   dict):
                out.append(graph.by_name[r["node"]].meta)
    return out


def node_flops(graph: Graph, node: Node) -> int:
    """FLOPs of one ATen node at the traced sizes (torch's counting for matmul/convolution)."""
    base = node.base.removesuffix("_")
    if base in _NO_FLOPS or node.target == "getitem":
        return 0
    metas = _inputs(graph, node)
    out = _numel(node.meta)
    if base in ("mm", "addmm", "bmm", "baddbmm", "mv"):
        a, b = (metas[1], metas[2]) if base in ("addmm", "baddbmm") else (metas[0], metas[1])
        k = int(a["shape"][-1])
        return 2 * out * k
    if base == "convolution":
        x, w = metas[0], metas[1]
        kprod = math.prod(int(d) for d in w["shape"][2:])
        if node.a("transposed"):
            return 2 * _numel(x) * int(w["shape"][1]) * kprod
        return 2 * out * int(w["shape"][1]) * kprod
    largest = max((_numel(m) for m in metas), default=0)
    return op_flops(node.target, largest, out)


def graph_cost(graph: Graph) -> tuple[int, int]:
    """(FLOPs, compulsory bytes: every input, parameter and output once) at the traced sizes."""
    flops = sum(node_flops(graph, n) for n in graph.live_nodes())
    moved = sum(_bytes(n.meta) for n in graph.placeholders())
    for o in graph.outputs():
        if isinstance(o, dict) and "node" in o:
            moved += _bytes(graph.by_name[o["node"]].meta)
    return flops, moved


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def _kernel_text(code: str) -> str:
    m = re.search(r'KERNELS = r"""(.*?)"""', code, re.S)
    return m.group(1) if m else ""


def reasoning(view: TaskView, graph: Graph, summary: str, built, backend: str) -> str:
    """The answer's explanation for one built candidate (program.Built) on `backend`."""
    cuda = backend != "cpu"
    flops, moved = graph_cost(graph)
    intensity = flops / moved if moved else 0.0
    bound = "compute-bound" if intensity > RIDGE[backend] else "memory-bound"
    device = "a GPU" if cuda else "the CPU"
    n = len(built.kernels)
    unit = ("kernel launch" + ("es" if n != 1 else "")) if cuda else (
        "C++ function" + ("s" if n != 1 else "") + ", each an OpenMP-parallel loop nest")
    steps = "\n".join(f"{i + 1}. {note}" for i, note in enumerate(built.notes))
    code = built.code
    forward = code[code.find("def forward"):]
    kernels = _kernel_text(code)
    sizes = len(set(re.findall(r"\b\w+(?:\.\w+)*\.size\(\d+\)", forward)))
    axes = sorted(set(re.findall(r"=\s*(self\.\w+) % \w+\.dim\(\)", forward)))
    if axes:
        where = ("forward reads the reduced axis from the module (" + ", ".join(
            f"`{a}`" for a in axes) + ") and the sizes before, along and after it from the "
                 "tensor's shape, and passes them to the "
                 + ("kernels" if cuda else "functions") + " as arguments, so the same code "
                 "serves any size and any axis the task is run at")
    elif sizes:
        where = (f"forward reads {sizes} size{'s' if sizes != 1 else ''} from the tensors "
                 "(`.size(i)`) and passes sizes to the "
                 + ("kernels as arguments (grid sizes and bounds checks use them)" if cuda
                    else "functions as arguments (they are the loop bounds)")
                 + ", so the same code serves any size the task is run at")
    else:
        where = "the sizes are those the reference was traced at (passed as arguments)"
    attrs = sorted(set(re.findall(r"_ext\.\w+\([^\n]*?\b(self\.[a-z_][\w.]*)", forward)))
    scalars = [a for a in attrs if not re.search(r"\.(weight|bias|running_\w+|size)$", a)]
    if scalars:
        where += "; constructor values come from the module (" + ", ".join(
            f"`{a}`" for a in scalars) + ")"
    accs = set(re.findall(r"typedef\s+(double|float)\s+\w+_acc", kernels))
    accs |= set(re.findall(r"\b(double|float)\s+\w+\s*=\s*0", kernels))
    accs |= set(re.findall(r"std::vector<(double|float)>", kernels))
    halves = bool(re.search(r"Half|BFloat16|__half|bfloat16", kernels))
    numerics = ("Numerics: accumulators in " + " and ".join(sorted(accs))
                + ("; 16-bit values are widened to float before any arithmetic" if halves else "")
                + "." if accs else "")
    return (
        f"The reference `{view.name}` computes: {summary}.\n"
        f"At these sizes that is {flops:,} FLOPs over at least {_size(moved)} of compulsory "
        f"traffic (inputs, parameters and outputs once each): {intensity:.2f} FLOP/byte, "
        f"{bound} on {device} (ridge about {RIDGE[backend]:g} FLOP/byte), so "
        + ("the kernels aim at few passes over memory." if bound == "memory-bound"
           else "the kernels aim at data reuse in fast memory.") + "\n"
        f"Plan for {'CUDA' if backend == 'cuda' else backend.upper() if cuda else 'CPU C++'}: "
        f"{n} {unit}.\n{steps}\n"
        f"Sizes: {where}.\n"
        + (f"{numerics}\n" if numerics else "")
        + "The constructor is the reference's, so parameters are created in the same order and "
        "initialised identically under the same seed; forward only allocates outputs, takes "
        "views and calls the extension, with no PyTorch compute."
    )
