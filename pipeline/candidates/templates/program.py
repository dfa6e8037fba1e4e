"""Lower a traced reference graph to a candidate file: kernels plus a thin `forward`.

The builder walks the live ATen nodes in order. View ops become Python view calls, elementwise
chains are fused into one kernel (elementwise.py), and every other op is handed to its family
module (reduction, softmax, norm, matmul, conv, pooling, scan, loss, misc). Each family emits a
kernel (CUDA or CPU C++), the host function that launches it, and a sentence of reasoning.
Shapes are static per backend source, so allocation sizes are literals taken from the trace.
"""

from __future__ import annotations

import ast
import hashlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline.candidates.templates import symbolic, tidy
from pipeline.candidates.templates.analysis import Graph, Node, NoTemplate, Reference, refs
from pipeline.candidates.templates.symbolic import Dim, Scalar, scalar_marker
from verifier import pyast

C_TYPES = {
    "float32": "float", "float64": "double", "float16": "c10::Half", "bfloat16": "c10::BFloat16",
    "int64": "int64_t", "int32": "int32_t", "int16": "int16_t", "int8": "int8_t",
    "uint8": "uint8_t", "bool": "bool",
}
FLOATS = ("float32", "float64", "float16", "bfloat16")

# Every include and helper a kernel may use; a candidate's own header keeps only what it uses
# (tidy.header). The self-check's shared translation unit includes all of them.
CUDA_HEADER = r"""#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>
#include <cstdint>
#include <cmath>
#include <cfloat>
#define HD __host__ __device__ __forceinline__
#define KS_STREAM c10::cuda::getCurrentCUDAStream()

// Grid size for a grid-stride loop: enough blocks to fill the GPU, capped so huge tensors loop.
static inline unsigned int ks_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned int)(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}
"""

CPU_HEADER = r"""#include <torch/extension.h>
#include <cstdint>
#include <cmath>
#include <cfloat>
#include <algorithm>
#include <vector>
"""


def ctype(dtype: str) -> str:
    if dtype not in C_TYPES:
        raise NoTemplate(f"dtype {dtype} is not supported by the templates")
    return C_TYPES[dtype]


def acc_type(*dtypes: str) -> str:
    """Accumulate in double for fp64, float otherwise (half/bf16 compute in float)."""
    return "double" if "float64" in dtypes else "float"


def lit(value: float | int | bool, acc: str = "float") -> str:
    """A C literal of the accumulation type (a constructor value: a marker for its parameter)."""
    if isinstance(value, Scalar):
        return scalar_marker(value, acc)
    if isinstance(value, Dim):  # a size used as a number (a mean's divisor): a parameter too
        return f"(({acc}){value!r})"
    if isinstance(value, dict) and "float" in value:
        value = float(value["float"])
    if isinstance(value, bool):
        value = 1.0 if value else 0.0
    v = float(value)
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    text = repr(v)
    return f"{text}f" if acc == "float" else text


def fn(name: str, acc: str) -> str:
    """C math function name for the accumulation type (expf for float, exp for double)."""
    return name + "f" if acc == "float" else name


def numel(shape: list[int]) -> int:
    return math.prod(shape) if shape else 1


@dataclass
class Kernel:
    name: str
    family: str
    source: str
    decl: str
    note: str
    canon: str = ""  # source with its own name masked, to find duplicates
    uses: int = 1
    comment: str = ""  # the note with sizes as expressions of the inputs (kernel comment)


@dataclass
class Built:
    """A lowered candidate: file text plus what it is made of (for meta and reasoning)."""

    code: str
    kernels: list[Kernel]
    family: str
    notes: list[str]
    params: dict


# CPU strategy families, picked by `variant % 3` (every family module reads `Builder.simd`):
# `simd` contiguous inner loops under `#pragma omp simd` built for the host's vector ISA, with
# glibc's vector math (libmvec) for exp/log/tanh...; `omp` plain OpenMP loops at -O3 (the first
# teacher's kernels); `simd_fastmath` the simd loops with -ffast-math (reassociated reductions,
# no NaN/inf guarantees: the verifier decides whether the answer still holds) and inline
# polynomial exp/tanh (tidy.fast_math). Both simd families ask for full-width (512-bit) vectors
# where the host has them (tidy.wide_vectors): GCC otherwise caps -march=native loops at 256 bits
# on AVX-512 hosts, half the width torch's own kernels use (a libmvec tanhf loop ran 2x faster).
CPU_STRATEGIES = ("simd", "omp", "simd_fastmath")
CPU_CFLAGS = {
    "omp": ["-O3", "-fopenmp"],
    "simd": ["-O3", "-march=native", "-fno-math-errno", "-fopenmp"],
    "simd_fastmath": ["-O3", "-march=native", "-ffast-math", "-fno-finite-math-only",
                      "-fopenmp"],
}

FAMILY_ORDER = ("matmul", "conv", "conv_transpose", "attention", "norm", "softmax", "pooling",
                "loss", "scan", "embedding", "reduction", "broadcast", "activation", "elementwise",
                "shape", "other")


@dataclass
class Builder:
    graph: Graph
    ref: Reference
    backend: str  # cuda | cpu
    variant: int
    lines: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    tuples: dict[str, dict[int, str]] = field(default_factory=dict)
    kernels: list[Kernel] = field(default_factory=list)
    families: list[str] = field(default_factory=list)
    params: dict = field(default_factory=dict)
    # Gathers a strided value with a copy kernel; lower.py plugs in the elementwise lowering so
    # that program.py never imports a family module (they all import program.py).
    gather: Callable[[Builder, dict], str] | None = None
    sizes: dict[str, str] = field(default_factory=dict)  # size symbol -> `x.size(0)`
    # root of an elementwise chain -> its members, when a row kernel (softmax) applies the chain
    # as it reads its input instead of a kernel of its own writing it out (registry.plan_fusion)
    prologues: dict[str, list[Node]] = field(default_factory=dict)
    # a GEMM's or convolution's node -> the elementwise chain its store applies (epilogue.py)
    epilogues: dict[str, list[Node]] = field(default_factory=dict)
    _counter: int = 0
    _extra: dict[str, list[str]] = field(default_factory=dict)  # kernel -> markers it takes

    @property
    def cuda(self) -> bool:
        return self.backend != "cpu"

    @property
    def cpu_strategy(self) -> str:
        """The CPU strategy family of this variant ("" on GPU backends)."""
        return "" if self.cuda else CPU_STRATEGIES[self.variant % len(CPU_STRATEGIES)]

    @property
    def simd(self) -> bool:
        """CPU kernels with vectorised (`omp simd`) contiguous inner loops."""
        return self.cpu_strategy.startswith("simd")

    def node(self, name: str) -> Node:
        return self.graph.by_name[name]

    def fresh(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}{self._counter}"

    def val(self, ref) -> str:
        """Python expression of a graph value (a node reference or a node name)."""
        name = ref["node"] if isinstance(ref, dict) else ref
        if name not in self.env:
            raise NoTemplate(f"value {name} is not available (unsupported producer)")
        return self.env[name]

    def meta(self, ref) -> dict:
        name = ref["node"] if isinstance(ref, dict) else ref
        m = self.node(name).meta
        if not isinstance(m, dict):
            raise NoTemplate(f"value {name} is not a single tensor")
        return m

    def emit(self, line: str) -> None:
        self.lines.append(symbolic.as_python(line, self.sizes))

    def alloc(self, shape: list[int], dtype: str, zero: bool = False) -> str:
        var = self.fresh("buf")
        fn_name = "zeros" if zero else "empty"
        self.emit(f"{var} = torch.{fn_name}({tuple(shape)!r}, dtype=torch.{dtype}, device=dev)")
        return var

    def contiguous(self, ref) -> str:
        """The value as a contiguous tensor; a strided one is gathered by a copy kernel."""
        m = self.meta(ref)
        if m["contiguous"] and m["offset"] == 0:
            return self.val(ref)
        if self.gather is None:
            raise NoTemplate("a strided value needs a copy kernel but no gather lowering is set")
        return self.gather(self, ref)

    def add_kernel(self, family: str, hint: str, source: str, decl: str, note: str) -> str:
        """Register a kernel's C++ text; `decl` uses NAME for the host function's name.

        Sizes and constructor values in the text become parameters (symbolic.plumb); a kernel
        whose text equals an earlier one's (up to its name) reuses that one.
        """
        name = f"{hint}_{len(self.kernels)}"
        source, decl, marks = symbolic.plumb(source.replace("NAME", name),
                                             decl.replace("NAME", name), name)
        comment = symbolic.as_python(note, self.sizes)
        note = symbolic.as_numbers(note)
        self.families.append(family)
        shape = re.compile(rf"\b{re.escape(hint)}(?=_|\b)")
        canon = shape.sub("KS_SELF", source.replace(name, "KS_HOST"))
        for k in self.kernels:
            if k.family == family and k.canon == canon:
                self._extra[k.name] = marks
                k.uses += 1
                return k.name
        self.kernels.append(Kernel(name, family, source, decl, note, canon, comment=comment))
        self._extra[name] = marks
        return name

    def call(self, fn_name: str, *args: str) -> None:
        extra = [symbolic.as_python(m, self.sizes) for m in self._extra.get(fn_name, [])]
        self.emit(f"_ext.{fn_name}({', '.join([*args, *extra])})")


def param_expr(name: str, is_buffer: bool) -> str:
    parts = name.split(".")
    if all(p.isidentifier() for p in parts):
        return "self." + name
    return f"self.get_{'buffer' if is_buffer else 'parameter'}({name!r})"


def kernel_comment(note: str) -> str:
    """The note as a `//` comment block over the kernel (its thread/loop mapping)."""
    words, lines, cur = note.split(), [], "//"
    for w in words:
        if len(cur) + 1 + len(w) > 98:
            lines.append(cur)
            cur = "//"
        cur += " " + w
    return "\n".join([*lines, cur])


def render(b: Builder) -> str:
    """The candidate file: reference imports, extension sources, ModelNew."""
    body = "\n".join(kernel_comment(k.comment or k.note) + "\n" + k.source.strip("\n") + "\n"
                     for k in b.kernels)
    body = tidy.resolve_switches(body)
    if not b.cuda:
        body = tidy.cpu_inline(body)
    body = tidy.drop_unused_macros(body)
    # a template slot left empty (no offset code) must not leave a blank line in a loop
    body = re.sub(r"[ \t]+\n", "\n", re.sub(r"\{\n[ \t]*\n", "{\n", body))
    selects = ""
    if b.simd:
        body, selects = tidy.vector_selects(body)
        body = tidy.wide_vectors(body)
    if b.cpu_strategy == "simd_fastmath":
        body, fast = tidy.fast_math(body)
        selects += fast
    header = tidy.header(body, b.cuda) + (tidy.vector_math(body) + selects if b.simd else "")
    decls = "\n".join(k.decl + ";" for k in b.kernels)
    digest = hashlib.sha256((header + body + b.backend).encode()).hexdigest()[:12]
    names = ", ".join(repr(k.name) for k in b.kernels)
    if b.cuda:
        build = (
            f'_ext = load_inline(\n    name="ks_tpl_{digest}",\n    cpp_sources=[CPP_DECLS],\n'
            f"    cuda_sources=[KERNELS],\n    functions=[{names}],\n"
            '    extra_cflags=["-O3"],\n    extra_cuda_cflags=["-O3"],\n    verbose=False,\n)'
        )
        sources = (f'KERNELS = r"""\n{header}\n{body}"""\n\n'
                   f'CPP_DECLS = r"""\n#include <torch/extension.h>\n{decls}\n"""\n')
    else:
        build = (
            f'_ext = load_inline(\n    name="ks_tpl_{digest}",\n    cpp_sources=[KERNELS],\n'
            f"    functions=[{names}],\n"
            f"    extra_cflags={CPU_CFLAGS[b.cpu_strategy]!r},\n".replace("'", '"')
            + '    extra_ldflags=["-fopenmp"],\n'
            "    verbose=False,\n)"
        )
        sources = f'KERNELS = r"""\n{header}\n{body}"""\n'
    base_imports = {"import torch", "import torch.nn as nn",
                     "from torch.utils.cpp_extension import load_inline"}
    init = "\n".join("    " + ln for ln in b.ref.init_source.splitlines())
    fwd = "\n".join("        " + ln for ln in b.lines)
    used = _globals_read(f"class ModelNew:\n{init}\n    def forward({b.ref.forward_signature}):\n"
                         f"{fwd}\n")
    preamble = _preamble(b.ref.preamble, used, base_imports)
    return (
        "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n"
        f"{preamble}\n\n{sources}\n{build}\n\n\n"
        "class ModelNew(nn.Module):\n"
        f"{init}\n\n"
        f"    def forward({b.ref.forward_signature}):\n"
        f"{fwd}\n"
    )


def _globals_read(class_text: str) -> set[str]:
    """Names the class reads that it does not bind itself (parameters, locals): the module
    names its methods need."""
    try:
        tree = pyast.parse(class_text)
    except SyntaxError:  # keep every copied line rather than guess
        return set(re.findall(r"\b\w+\b", class_text))
    bound = {a.arg for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
             for a in [*f.args.posonlyargs, *f.args.args, *f.args.kwonlyargs,
                       *filter(None, [f.args.vararg, f.args.kwarg])]}
    bound |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
              and isinstance(n.ctx, ast.Store)}
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return read - bound


def _preamble(text: str, used: set[str], skip: set[str]) -> str:
    """The reference's module-level statements the candidate needs: imports and constants whose
    name it reads, and the helper classes and functions it reads (a config stand-in its
    constructor builds), with whatever those read in turn."""
    try:
        stmts = [ast.unparse(s) for s in pyast.parse(text).body]
    except SyntaxError:  # line by line, as before
        stmts = text.splitlines()
    keep = [False] * len(stmts)
    need = set(used)
    changed = True
    while changed:  # a kept helper's own reads can pull in an earlier statement
        changed = False
        for i, st in enumerate(stmts):
            if keep[i] or st in skip:
                continue
            m = re.match(r"^(?:class|def) (\w+)", st)
            if (m.group(1) not in need) if m else not _binds_used(st, need):
                continue
            if not st.startswith(("import ", "from ")):  # what a kept helper reads, too
                need |= _globals_read(st)
            keep[i] = changed = True
    return "\n".join(st for st, k in zip(stmts, keep, strict=True) if k)


def _binds_used(line: str, names: set[str]) -> bool:
    """A copied import or constant is kept only when the candidate reads the name it binds (the
    reference's `batch_size = 512` in an answer would be a size it never reads)."""
    m = (re.match(r"^(\w+) = ", line) or re.match(r"^import [\w.]+ as (\w+)$", line)
         or re.match(r"^import (\w+)", line))
    if m:
        return m.group(1) in names
    m = re.match(r"^from [\w.]+ import (.+)$", line)
    if m:
        bound = [n.split(" as ")[-1].strip() for n in m.group(1).strip("()").split(",")]
        return any(n in names for n in bound)
    return True


__all__ = ["CPU_STRATEGIES", "Builder", "Built", "Kernel", "NoTemplate", "acc_type", "ctype", "fn", "lit",
           "numel", "refs"]
