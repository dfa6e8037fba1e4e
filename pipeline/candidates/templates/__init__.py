"""The built-in teacher: parametrised, readable kernels for the seed corpus' op families.

`template_candidates(task, backend, variants)` traces the reference to an ATen graph
(analysis.py), lowers it to kernels (program.py + one module per family) for `cuda` or `cpu`,
and returns one Candidate per distinct variant, each with a reasoning text (`meta`) and a full
assistant answer (`raw_response`). A task no template covers raises NoTemplate with the reason.
`template_kernels` does the same without `schemas` (so GPU nodes need only torch).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pipeline.candidates.templates.analysis import (
    NoTemplate,
    TaskView,
    graph_summary,
    read_reference,
    trace_source,
)

__all__ = ["NoTemplate", "TaskView", "TemplateKernel", "template_candidates", "template_kernels"]

BACKENDS = ("cuda", "cpu", "musa")


@dataclass
class TemplateKernel:
    """One generated candidate before it becomes a `schemas.Candidate`."""

    task_id: str
    backend: str
    family: str
    variant: str
    code: str
    reasoning: str
    params: dict

    @property
    def generator(self) -> str:
        return f"template:{self.family}/{self.variant}"

    def raw_response(self) -> str:
        return f"{self.reasoning}\n\n```python\n{self.code}```\n"

    def meta(self) -> str:
        return json.dumps({"family": self.family, "variant": self.variant,
                           "params": self.params, "reasoning": self.reasoning}, sort_keys=True)


def _variant_name(backend: str, params: dict, strategy: str = "") -> str:
    if strategy:  # CPU: the strategy family and the per-op choices that change the code
        parts = [strategy] + [it["variant"] for it in params.get("matmul", [])
                              if it["variant"] != "cpu_ikj"]
        return (backend + "-" + "-".join(dict.fromkeys(parts)))[:80]
    parts = []
    for fam, items in sorted(params.items()):
        for it in items:
            if fam == "matmul":
                parts.append(it["variant"])
            elif fam == "elementwise":
                parts.append(("vec4" if it["vectorized"] else "scalar") + f"{it['threads']}")
            elif fam == "reduction":
                mode = ("split" if it.get("split") else "block" if it["block_per_output"]
                        else "thread")
                parts.append(mode + str(it["threads"]))
            elif fam == "softmax":
                parts.append("sm_" + it["mode"])
            elif fam == "conv" and it.get("igemm"):
                parts.append(it["igemm"])
            elif fam == "conv":
                parts.append(("smemfilter" if it["shared_filter"] else "direct") + str(it["threads"]))
            elif fam == "scan":
                parts.append("blockscan" if it["block_per_row"] else "linescan")
            elif "threads" in it:
                parts.append(f"{fam}{it['threads']}")
    name = "-".join(dict.fromkeys(parts)) or "base"
    return (backend + "-" + name)[:80]


def template_kernels(view: TaskView, backend: str, variants: int = 3) -> list[TemplateKernel]:
    """Distinct template kernels for a task; raise NoTemplate(reason) when none fits."""
    from pipeline.candidates.templates.explain import reasoning
    from pipeline.candidates.templates.lower import lower
    from pipeline.candidates.templates.program import CPU_STRATEGIES

    if backend not in BACKENDS:
        raise NoTemplate(f"unknown backend {backend}")
    if backend == "musa":
        raise NoTemplate("MUSA templates are not written yet (port of the CUDA ones)")
    source = view.cpu_source if backend == "cpu" else view.source
    ref = read_reference(source)
    graph = trace_source(source)
    summary = graph_summary(graph)
    out: list[TemplateKernel] = []
    seen: set[str] = set()
    for v in range(max(1, variants) * 2):  # some variants coincide for a task; try a few more
        if len(out) >= variants:
            break
        built = lower(graph, ref, backend, v)
        if built.code in seen:
            continue
        seen.add(built.code)
        strategy = CPU_STRATEGIES[v % len(CPU_STRATEGIES)] if backend == "cpu" else ""
        out.append(TemplateKernel(view.task_id, backend, built.family,
                                  _variant_name(backend, built.params, strategy), built.code,
                                  reasoning(view, graph, summary, built, backend),
                                  built.params))
    return out


def template_candidates(task, backend: str, variants: int = 3) -> list:
    """`schemas.Candidate` records from the templates for a `schemas.Task` (STAGES.md)."""
    from schemas import Candidate

    view = TaskView.from_task(task)
    kernels = template_kernels(view, backend, variants)
    return [
        Candidate(candidate_id=Candidate.make_id(task.task_id, backend, k.code),
                  task_id=task.task_id, backend=backend, generator=k.generator, code=k.code,
                  raw_response=k.raw_response(), meta=k.meta())
        for k in kernels
    ]
