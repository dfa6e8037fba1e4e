"""KernelBench task files: load in a probe job, check the interface, describe shapes.

A task file defines `class Model(nn.Module)`, `get_inputs()`, `get_init_inputs()` and usually
module-level shape constants. `task_id` is a content hash of the normalized source (comments and
formatting do not change it, so shape annotations can be added without changing the id).
"""

from __future__ import annotations

import ast
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.tasks.probe.dims import literal_int
from pipeline.tasks.probe.pool import ProbePool
from pipeline.tasks.probe.scale import is_alloc_failure
from schemas import TensorSpec, content_hash
from verifier import pyast


class TaskFileError(ValueError):
    """A task file is invalid; the message names the file and the reason."""


@dataclass
class TaskFileReport:
    """What loading one task file found."""

    path: str
    valid: bool
    reason: str = ""
    # The reference's sizes do not fit this host even after scaling (its allocator refused):
    # valid on a GPU, no CPU copy. `tasks validate` counts these apart from the invalid ones.
    too_large_for_host: bool = False
    task_id: str = ""
    init_inputs: list = field(default_factory=list)
    inputs: list[TensorSpec] = field(default_factory=list)
    outputs: list[TensorSpec] = field(default_factory=list)
    constants: dict[str, int] = field(default_factory=dict)
    scaled_constants: dict[str, int] = field(default_factory=dict)
    cpu_source: str = ""
    forward_ms: float = 0.0
    finite: bool = True
    mutated_inputs: list[str] = field(default_factory=list)
    output_abs_mean: list[float] = field(default_factory=list)
    num_params: int = 0

    def to_json(self) -> dict:
        return {
            "path": self.path, "valid": self.valid, "task_id": self.task_id or None,
            "too_large_for_host": self.too_large_for_host,
            "reason": self.reason or None, "init_inputs": self.init_inputs,
            "inputs": [_spec_json(s) for s in self.inputs],
            "outputs": [_spec_json(s) for s in self.outputs],
            "scaled_constants": self.scaled_constants,
        }


def _spec_json(s: TensorSpec) -> dict:
    return {"name": s.name, "shape": s.shape, "dtype": s.dtype, "init": s.init}


def normalize_source(source: str) -> str:
    """Canonical text of a Python source: comments, blank lines and formatting removed."""
    return ast.unparse(pyast.parse(source))


def task_id_of(source: str) -> str:
    return content_hash(normalize_source(source))


def substitute_constants(source: str, values: dict[str, int]) -> str:
    """Rewrite top-level `NAME = <int>` assignments (or int arithmetic such as `16384 * 4`) to
    the given values, keeping the rest; a key `NAME[i]` rewrites element i of a top-level int
    tuple, a key `Model.ARG` the int default of `Model.__init__`'s ARG (see
    `scale.tie_partners`)."""
    if not values:
        return source
    tree = pyast.parse(source)
    lines = source.splitlines(keepends=True)
    targets: list[tuple[str, ast.expr]] = []
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):
            name = node.targets[0].id
            targets.append((name, node.value))
            if isinstance(node.value, ast.Tuple):
                targets += [(f"{name}[{i}]", e) for i, e in enumerate(node.value.elts)]
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "__init__":
                    a = fn.args
                    positional = [*a.posonlyargs, *a.args]
                    targets += [(f"Model.{arg.arg}", d) for arg, d in zip(
                        positional[len(positional) - len(a.defaults):], a.defaults, strict=True)]
                    targets += [(f"Model.{arg.arg}", d) for arg, d in zip(
                        a.kwonlyargs, a.kw_defaults, strict=True) if d is not None]
    edits = [(node.lineno - 1, node.col_offset, node.end_col_offset, str(values[key]))
             for key, node in targets
             if key in values and literal_int(node) is not None
             and node.lineno == node.end_lineno]
    for line, start, end, text in sorted(edits, reverse=True):
        raw = lines[line].encode("utf-8")
        lines[line] = (raw[:start] + text.encode() + raw[end:]).decode("utf-8")
    return "".join(lines)


def _to_spec(d: dict) -> TensorSpec:
    return TensorSpec(name=d["name"], shape=[int(x) for x in d["shape"]], dtype=d["dtype"],
                      init=d.get("init", "randn"), low=d.get("low"), high=d.get("high"))


# A task's time budget is `timeout_s` plus its GPU-size FLOPs at HOST_FLOPS (a loaded host's
# single thread, conservatively), at most BUDGET_CAP_FACTOR * `timeout_s`: MobileNetV1's 11.4
# GFLOP give it 41 s, a 200-GFLOP VGG the cap (see `probe_budget.time_budget`).
HOST_FLOPS = 1e9
BUDGET_CAP_FACTOR = 4.0


def inspect_task_source(
    source: str,
    ref: str = "<source>",
    *,
    timeout_s: float = 30.0,
    memory_mb: int = 6144,
    scale: bool = False,
    cpu_max_numel: int = 1 << 18,
    seed: int = 0,
    pool: ProbePool | None = None,
) -> TaskFileReport:
    """Load `source` as a task in a probe job (a sandboxed child of the fork server of `pool`,
    or of a pool of its own) and report what it defines; it may take `timeout_s` plus its
    FLOPs' share (see HOST_FLOPS)."""
    try:
        task_id = task_id_of(source)
    except SyntaxError as exc:
        return TaskFileReport(ref, False, f"syntax error at line {exc.lineno}: {exc.msg}")
    except ValueError as exc:  # e.g. null bytes
        return TaskFileReport(ref, False, f"cannot parse: {exc}")
    job = {"kind": "taskfile", "source": source, "scale": scale, "cpu_max_numel": cpu_max_numel,
           "seed": seed, "budget_s": timeout_s, "host_flops": HOST_FLOPS,
           "max_budget_s": timeout_s * BUDGET_CAP_FACTOR}
    if pool is None:
        with ProbePool(1, memory_mb) as own:
            p = own.analyze(job)
    else:
        p = pool.analyze(job)
    if "valid" not in p or p.get("reason") in ("timeout", "memory", "crash", "probe_unavailable",
                                                "probe_error"):
        why = p.get("detail") or p.get("reason") or "no result"
        if is_alloc_failure(why):
            return TaskFileReport(ref, False, f"too_large_for_host: {why}", task_id=task_id,
                                  too_large_for_host=True)
        return TaskFileReport(ref, False, why, task_id=task_id)
    if not p.get("valid"):
        return TaskFileReport(ref, False, p.get("reason", "invalid"), task_id=task_id,
                              too_large_for_host=bool(p.get("too_large_for_host")))
    scaled = {k: int(v) for k, v in p.get("scaled_constants", {}).items()}
    return TaskFileReport(
        path=ref, valid=True, task_id=task_id, init_inputs=p["init_inputs"],
        inputs=[_to_spec(s) for s in p["inputs"]], outputs=[_to_spec(s) for s in p["outputs"]],
        constants=p.get("constants", {}), scaled_constants=scaled,
        cpu_source=substitute_constants(source, scaled) if scaled else source,
        forward_ms=p.get("forward_ms", 0.0), finite=p.get("finite", True),
        mutated_inputs=p.get("mutated_inputs", []),
        output_abs_mean=p.get("output_abs_mean", []), num_params=p.get("num_params", 0),
    )


def read_task_source(path: str | Path) -> str:
    """Read a task file as UTF-8; raise TaskFileError naming the file otherwise."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise TaskFileError(f"{p}: cannot read ({exc.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TaskFileError(f"{p}: not UTF-8 (byte {exc.start})") from None


def validate_task_file(path: str | Path, **kwargs) -> TaskFileReport:
    """Validate one task file on disk; every failure becomes an invalid report with a reason."""
    try:
        source = read_task_source(path)
    except TaskFileError as exc:
        return TaskFileReport(str(path), False, str(exc).split(": ", 1)[1])
    return inspect_task_source(source, str(path), **kwargs)


def validate_task_files(paths: list[str | Path], workers: int = 2, memory_mb: int = 6144,
                        **kwargs) -> list[TaskFileReport]:
    """Validate many files, `workers` at a time on one probe fork server; order follows
    `paths`."""
    with ProbePool(workers, memory_mb) as probes, \
            ThreadPoolExecutor(max_workers=max(1, workers)) as threads:
        return list(threads.map(lambda p: validate_task_file(p, pool=probes, **kwargs), paths))
