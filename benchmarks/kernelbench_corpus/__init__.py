"""Candidates for KernelBench's own problem files (main branch), in the forms models write.

    from benchmarks.kernelbench_corpus import candidates, PROBLEMS
    for c in candidates(): c.problem ("level1/26_GELU_.py"), c.candidate_id, c.source, c.label

Labels: `correct`, `wrong` (compiles and runs, wrong numbers), `crashing` (illegal memory
access), `hanging` (a home-made grid barrier that deadlocks), `fallback` (torch computes in
forward: the whole result, or the library op with only the epilogue in an own kernel; KernelBench
accepts the second, the MooreEval-strict default rejects both). Every candidate is the one-shot
`load_inline` form (cpp_sources declaration + cuda_sources + functions=[...]) with its own kernel
names, so no two candidates share a build. The CUDA is ours (benchmarks/kernelbench_corpus/
kernels.py); KernelBench's problem files are not part of the repository: the benchmark reads
them from a directory given on its command line.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from benchmarks.kernelbench_corpus import kernels as K
from benchmarks.kernelbench_corpus import spatial as S
from benchmarks.kernelbench_corpus.problems import PROBLEMS, Problem

LABELS = ("correct", "wrong", "crashing", "hanging", "fallback")


@dataclass
class KbCandidate:
    """One candidate for one KernelBench problem file, with the verdict class we expect."""

    candidate_id: str
    problem: str  # "level1/26_GELU_.py", relative to KernelBench/
    label: str  # one of LABELS
    form: str  # how it is written (grid_stride, float4, tiled32, torch_linear+epilogue, ...)
    source: str


def _decl(cuda: str) -> str:
    """The C++ declaration of the host wrapper(s) in a CUDA source (the cpp_sources string)."""
    heads = re.findall(r"^(torch::Tensor run_\w+\([^)]*\))\s*\{", cuda, flags=re.M)
    return "\n".join(h + ";" for h in heads)


def module(tag: str, cuda: str, init: str, body: str, forward: str, fwd_args: str = "x",
           flags: str = '["-O3"]') -> str:
    """The candidate file: the source strings, one load_inline call, and ModelNew."""
    return (
        "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
        "from torch.utils.cpp_extension import load_inline\n\n"
        f'cuda_source_{tag} = r"""{cuda}"""\n\n'
        f'cpp_source_{tag} = """{_decl(cuda)}"""\n\n'
        f"ext_{tag} = load_inline(\n"
        f'    name="ext_{tag}",\n'
        f"    cpp_sources=cpp_source_{tag},\n"
        f"    cuda_sources=cuda_source_{tag},\n"
        f'    functions=["run_{tag}"],\n'
        "    verbose=False,\n"
        '    extra_cflags=["-O3"],\n'
        f"    extra_cuda_cflags={flags},\n)\n\n\n"
        "class ModelNew(nn.Module):\n"
        f"    def __init__(self{init}):\n        super().__init__()\n"
        + "".join(f"        {ln}\n" for ln in body.splitlines() if ln.strip())
        + f"\n    def forward(self, {fwd_args}):\n"
        + "".join(f"        {ln}\n" for ln in forward.replace("EXT", f"ext_{tag}.run_{tag}")
                  .splitlines() if ln.strip())
    )


def _unary(p: Problem, n: int) -> Iterator[tuple[str, str, str]]:
    expr, wrong, nparam, pargs = p.spec["expr"], p.spec["wrong"], p.spec["nparams"], p.spec["args"]
    call = f"EXT({p.spec.get('x', 'x')}{pargs})"
    for form in ("grid_stride", "float4"):
        yield "correct", form, module(f"{p.key}_{form[:2]}{n}", K.unary(
            f"{p.key}_{form[:2]}{n}", expr, nparam, form), p.init, p.body, f"return {call}",
            p.fwd_args)
    t = f"{p.key}_w{n}"
    yield "wrong", "grid_stride", module(t, K.unary(t, wrong, nparam), p.init, p.body,
                                         f"return {call}", p.fwd_args)
    t = f"{p.key}_h{n}"
    yield "wrong", "float4_half_grid", module(t, K.unary(t, expr, nparam, "float4", "half"),
                                              p.init, p.body, f"return {call}", p.fwd_args)
    if p.spec.get("crash"):
        t = f"{p.key}_c{n}"
        yield "crashing", "grid_stride", module(t, K.unary(t, expr, nparam, bug="crash"),
                                                p.init, p.body, f"return {call}", p.fwd_args)
    if p.spec.get("hang"):
        t = f"{p.key}_g{n}"
        yield "hanging", "grid_barrier", module(t, K.unary(t, expr, nparam, bug="hang"),
                                                p.init, p.body, f"return {call}", p.fwd_args)
    t = f"{p.key}_f{n}"
    yield "fallback", "kernel_unused", module(
        t, K.unary(t, expr, nparam), p.init, p.body,
        f"if not {p.spec.get('x', 'x')}.is_cuda:\n    return {call}\nreturn {p.spec['torch']}",
        p.fwd_args)


def _rows(p: Problem, n: int) -> Iterator[tuple[str, str, str]]:
    make, call = p.spec["make"], p.spec["call"]
    for label, bug in (("correct", ""), ("wrong", "wrong")):
        t = f"{p.key}_{label[0]}{n}"
        yield label, p.spec["form"], module(t, make(t, bug), p.init, p.body, f"return {call}",
                                            p.fwd_args)
    t = f"{p.key}_f{n}"
    yield "fallback", "torch_in_forward", module(
        t, make(t, ""), p.init, p.body, f"y = EXT(x{p.spec.get('extra', '')})\n"
        f"return {p.spec['torch']} if y.numel() else y", p.fwd_args)


def _matmul(p: Problem, n: int) -> Iterator[tuple[str, str, str]]:
    call, fwd = p.spec["call"], p.fwd_args
    if p.spec.get("matvec"):
        for label, bug in (("correct", ""), ("wrong", "wrong")):
            t = f"{p.key}_{label[0]}{n}"
            yield label, "warp_per_row_float4", module(t, K.matvec(t, bug), p.init, p.body,
                                                       f"return {call}", fwd)
    else:
        for label, tile, bug in (("correct", 32, ""), ("correct", 16, ""),
                                 ("wrong", 32, p.spec.get("bug", "wrong"))):
            t = f"{p.key}_{label[0]}{tile}{n}"
            yield label, f"smem_tiled{tile}", module(t, K.matmul(t, tile, bug), p.init, p.body,
                                                      f"return {call}", fwd)
    t = f"{p.key}_f{n}"
    src = K.matvec(t) if p.spec.get("matvec") else K.matmul(t)
    yield "fallback", "torch_matmul", module(t, src, p.init, p.body,
                                             f"return {p.spec['torch']}", fwd)


def _pool(p: Problem, n: int) -> Iterator[tuple[str, str, str]]:
    dims, kind, call = p.spec["dims"], p.spec["kind"], p.spec["call"]
    t = f"{p.key}_c{n}"
    yield "correct", "thread_per_output", module(t, S.pool(t, dims, kind), p.init, p.body,
                                                 f"return {call}", p.fwd_args)
    t = f"{p.key}_w{n}"
    wrong_kind = p.spec.get("wrong_kind", kind)
    yield "wrong", "thread_per_output", module(t, S.pool(t, dims, wrong_kind, "wrong"), p.init,
                                               p.body, f"return {call}", p.fwd_args)
    t = f"{p.key}_f{n}"
    yield "fallback", "torch_in_forward", module(t, S.pool(t, dims, kind), p.init, p.body,
                                                 f"return {p.spec['torch']}", p.fwd_args)


def _fused(p: Problem, n: int) -> Iterator[tuple[str, str, str]]:
    """Level 2/3: one own kernel for everything, a wrong one, and library op + own epilogue."""
    for label, key, call in (("correct", "make", "call"), ("wrong", "make_wrong", "call_wrong")):
        t = f"{p.key}_{label[0]}{n}"
        yield label, p.spec["form"], module(t, p.spec[key](t), p.init, p.body,
                                            p.spec.get(call, p.spec["call"]), p.fwd_args)
    t = f"{p.key}_f{n}"
    yield "fallback", "library_op+epilogue", module(t, p.spec["make_tail"](t), p.init, p.body,
                                                    p.spec["call_tail"], p.fwd_args)


FAMILIES = {"unary": _unary, "rows": _rows, "matmul": _matmul, "pool": _pool, "fused": _fused}


def candidates(levels: tuple[int, ...] = (1, 2, 3)) -> Iterator[KbCandidate]:
    """Every candidate of the corpus for problems of these levels, in a fixed order."""
    for n, p in enumerate(PROBLEMS):
        if p.level not in levels:
            continue
        for i, (label, form, source) in enumerate(FAMILIES[p.family](p, n)):
            yield KbCandidate(candidate_id=f"{p.key}-{i}-{label}", problem=p.file, label=label,
                              form=form, source=source)


__all__ = ["KbCandidate", "LABELS", "PROBLEMS", "candidates", "module"]
