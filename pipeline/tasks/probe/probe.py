"""The task probe: one job in a sandboxed child of the verifier's fork server (torch + stdlib).

`pipeline.tasks.probe.pool` sends each job to `verifier.run.forkserver`, which forks a sandboxed
child that runs this module as `__main__`: it reads `job.json`, writes `result.json`, and a hang,
crash or hostile module costs only that child. Three job kinds, one path:
- `taskfile`: a KernelBench file checked and run on CPU (`tasks validate`, see
  `pipeline.tasks.probe.taskfile_job`);
- `complete`: a full KernelBench file from a source, scaled for the CPU by the data-flow scaler
  and measured;
- `extracted`: a class pulled out of a file, with init arguments and forward inputs to infer.
Measuring means: validity (constant, near-zero, input-independent, nondeterministic,
input-mutating outputs), the aten op inventory, per-statement shapes of `forward`, FLOPs and
bytes at GPU sizes (on meta tensors), and GPU sizes that reach the target time on the named GPU.
Every job runs under a time budget that grows with its FLOPs (`pipeline.tasks.probe.budget`).
"""

from __future__ import annotations

import json
import os

from pipeline.tasks.probe.budget import start_budget, start_clock
from pipeline.tasks.probe.dims import derived_refresher, int_constants, tie_partners
from pipeline.tasks.probe.inputs import build_model, infer_inputs, role_base, sized_specs
from pipeline.tasks.probe.measure import analyze_run, check_validity
from pipeline.tasks.probe.runtime import (
    ProbeReject,
    block_files,
    classify_error,
    dtype_name,
    exec_source,
    load_torch,
    make_input,
    short_error,
)
from pipeline.tasks.probe.scale import footprint, input_numel, meta_items, scale_constants
from pipeline.tasks.probe.taskfile_job import check_taskfile


def _est_ms(stats: dict, gpu: dict) -> float:
    return 1e3 * max(stats["flops"] / gpu["flops"], stats["bytes"] / gpu["bandwidth"])


def _meta_stats(ns, init_args, specs, trace: bool) -> dict:
    model = build_model(ns, init_args, "meta")
    inputs = [make_input(s, "meta") for s in specs]
    return analyze_run(model, inputs, trace)


def _gpu_sizes(ns, init_args, specs, base: dict, job: dict) -> tuple[dict, dict | None]:
    """Grow batch, then sequence/spatial dims until the estimate reaches the target time."""
    gpu, target = job["gpu"], job["gpu_min_ms"]
    cap_bytes = job.get("gpu_max_bytes", 4e9)
    roles = {r for s in specs for r in s.get("roles", [])}
    growable = [r for r in ("batch", "seq", "height", "width", "depth") if r in roles]
    base = role_base(base)
    sizes = {r: base[r] for r in growable}
    try:
        stats = _meta_stats(ns, init_args, sized_specs(specs, sizes), False)
    except BaseException:  # noqa: BLE001 - meta unsupported: keep the CPU sizes
        return sizes, None
    limits = {"batch": 256, "seq": job.get("max_seq", 4096), "height": 512, "width": 512,
              "depth": 64}
    order = ["batch", "seq", "height", "width", "depth"]
    steps = 0
    while _est_ms(stats, gpu) < target and steps < 24:
        steps += 1
        grew = False
        for r in sorted(growable, key=lambda r: (sizes[r] * 1.0 / limits[r], order.index(r))):
            if sizes[r] * 2 > limits[r]:
                continue
            trial = {**sizes, r: sizes[r] * 2}
            try:
                new = _meta_stats(ns, init_args, sized_specs(specs, trial), False)
            except BaseException:  # noqa: BLE001 - this dim cannot grow
                limits[r] = sizes[r]
                continue
            if new["bytes"] > cap_bytes:
                limits[r] = sizes[r]
                continue
            sizes, stats, grew = trial, new, True
            break
        if not grew:
            break
    return sizes, stats


def _spec_of(name: str, t) -> dict:
    torch = load_torch()
    spec = {"name": name, "shape": list(t.shape), "dtype": dtype_name(t.dtype), "init": "randn",
            "low": None, "high": None}
    if t.numel() == 0:
        return spec
    if t.dtype == torch.bool:
        spec.update(init="randint", low=0.0, high=2.0)
    elif not (t.is_floating_point() or t.is_complex()):
        spec.update(init="randint", low=float(t.min()), high=float(t.max()) + 1)
    elif float(t.min()) >= 0.0 and float(t.max()) <= 1.0:
        spec.update(init="rand", low=0.0, high=1.0)
    return spec


# --- the two job kinds -----------------------------------------------------------------------


def _jsonable(value):
    torch = load_torch()
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, torch.dtype):
        return str(value)
    raise ProbeReject("init_not_json", f"init input of type {type(value).__name__}")


def _complete(job: dict) -> dict:
    """A full KernelBench file: its own inputs; scale a CPU copy; analyze at the given sizes."""

    from verifier import pyast

    torch = load_torch()
    ns = exec_source(job["source"])
    tree = pyast.parse(job["source"])
    constants, partners = int_constants(tree), tie_partners(tree)
    for fn in ("get_inputs", "get_init_inputs"):
        if not callable(ns.get(fn)):
            raise ProbeReject("missing_function", f"missing function {fn}()")
    try:
        init_gpu = _jsonable(list(ns["get_init_inputs"]()))
        # GPU sizes on meta: shapes, ops, flops without allocating
        with torch.device("meta"):
            gpu_inputs = list(ns["get_inputs"]())
    except ProbeReject:
        raise
    except BaseException as exc:  # noqa: BLE001
        raise ProbeReject("bad_inputs", f"get_inputs()/get_init_inputs() raised {short_error(exc)}"
                          ) from None
    gpu_stats = None
    try:
        with meta_items():
            model = build_model(ns, init_gpu, "meta")
            gpu_stats = analyze_run(model, gpu_inputs, True)
    except ProbeReject:
        raise
    except BaseException:  # noqa: BLE001 - meta unsupported: estimate from the CPU run
        gpu_stats = None

    scaled = scale_constants(ns, constants, int(job["cpu_max_numel"]), lambda: input_numel(ns),
                             lambda: footprint(ns), derived_refresher(tree, [*constants,
                                                                             *partners]),
                             partners)
    try:
        init_cpu = _jsonable(list(ns["get_init_inputs"]()))
        model = build_model(ns, init_cpu)
        torch.manual_seed(1)
        inputs = list(ns["get_inputs"]())
        names = _forward_names(model, len(inputs))
        in_specs = [_spec_of(n, x) if isinstance(x, torch.Tensor) else
                    {"name": n, "shape": [], "dtype": type(x).__name__, "init": "given",
                     "low": None, "high": None} for n, x in zip(names, inputs, strict=True)]
        validity = check_validity(model, inputs, lambda: list(ns["get_inputs"]()))
        cpu_stats = analyze_run(model, [x.clone() if isinstance(x, torch.Tensor) else x
                                         for x in inputs], True)  # CPU file's annotations
    except ProbeReject:
        raise
    except BaseException as exc:  # noqa: BLE001
        raise ProbeReject(classify_error(exc), f"reference raised {short_error(exc)}") from None
    if gpu_stats is None and scaled:
        raise ProbeReject("no_meta", "shapes at GPU size unknown (meta run failed) and the CPU "
                                     "copy is scaled")
    gpu_in = [_spec_of(n, x) if isinstance(x, torch.Tensor) and x.device.type != "meta" else
              {**s, "shape": list(x.shape) if isinstance(x, torch.Tensor) else []}
              for n, x, s in zip(names, gpu_inputs, in_specs, strict=True)]
    return {"ok": True, "init_inputs": init_gpu, "cpu_init_inputs": init_cpu,
            "inputs": gpu_in, "cpu_inputs": in_specs, "scaled_constants": scaled,
            "gpu": gpu_stats or cpu_stats, "cpu": cpu_stats, "validity": validity,
            "gpu_sizes": {}, "cpu_sizes": {}}


def _forward_names(model, n: int) -> list[str]:
    import inspect

    params = [p for p in inspect.signature(model.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    return [params[i].name if i < len(params) and params[i].kind != params[i].VAR_POSITIONAL
            else f"arg{i}" for i in range(n)]


def _extracted(job: dict) -> dict:
    """A class pulled out of a file: infer inputs, validate on CPU, size for the GPU on meta."""
    torch = load_torch()
    ns = exec_source(job["source"])
    init_args, specs = infer_inputs(ns, job)
    base = job["base"]
    model = build_model(ns, init_args)
    cpu_specs = specs
    torch.manual_seed(1)
    inputs = [make_input(s) for s in cpu_specs]
    try:
        validity = check_validity(model, inputs, lambda: [make_input(s) for s in cpu_specs])
        cpu_stats = analyze_run(model, [x.clone() if x is not None else x for x in inputs], True)
    except ProbeReject:
        raise
    except BaseException as exc:  # noqa: BLE001
        raise ProbeReject(classify_error(exc), f"reference raised {short_error(exc)}") from None
    sizes, gpu_stats = _gpu_sizes(ns, init_args, specs, base, job)
    gpu_specs = sized_specs(specs, sizes)
    try:
        gpu_stats = _meta_stats(ns, init_args, gpu_specs, True)
    except BaseException:  # noqa: BLE001 - meta unsupported: GPU file keeps the CPU sizes
        sizes = {r: role_base(base)[r] for r in sizes}
        gpu_specs = specs
        model = build_model(ns, init_args)
        torch.manual_seed(1)
        gpu_stats = analyze_run(model, [make_input(s) for s in specs], True)
    cpu_sizes = {r: role_base(base)[r] for r in sizes}
    return {"ok": True, "init_inputs": init_args, "cpu_init_inputs": init_args,
            "inputs": gpu_specs, "cpu_inputs": cpu_specs, "scaled_constants": {},
            "gpu": gpu_stats, "cpu": cpu_stats, "validity": validity,
            "gpu_sizes": sizes, "cpu_sizes": cpu_sizes}


def analyze(job: dict) -> dict:
    """Analyze one job; every failure becomes {ok: False, reason, detail}."""
    torch = load_torch()
    torch.manual_seed(0)
    try:
        if job.get("kind") == "variants":
            from pipeline.tasks.probe.variants import validate

            return validate(job["sources"])
        if job.get("kind") == "complete":
            return _complete(job)
        return _extracted(job)
    except ProbeReject as rej:
        return {"ok": False, "reason": rej.args[0], "detail": rej.args[1]}
    except RecursionError:
        return {"ok": False, "reason": "runtime_error", "detail": "recursion too deep"}


# --- the child's entry ------------------------------------------------------------------------


def run_job(job: dict, write) -> None:
    """Run one job under its time budget and `write(result)`; every failure is a result."""
    start_clock()
    start_budget(job, 0.0, write)
    load_torch().set_num_threads(1)
    try:
        if job.get("kind") == "taskfile":
            result = check_taskfile(job, lambda flops: start_budget(job, flops, write))
        else:
            result = analyze(job)
    except BaseException as exc:  # noqa: BLE001 - last resort, still one line of reason
        result = {"ok": False, "reason": "probe_error", "detail": short_error(exc)}
    write(result)


def main() -> None:
    with open("job.json", encoding="utf-8") as fh:
        job = json.load(fh)
    fd = os.open("result.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    done = []

    def write(result: dict) -> None:
        if not done:  # the budget's timer and the job never both answer
            done.append(True)
            os.write(fd, json.dumps(result, default=str).encode("utf-8"))

    block_files()
    run_job(job, write)
    os.close(fd)


if __name__ == "__main__":
    main()
