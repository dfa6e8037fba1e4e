"""Child side of task building: a fork server that analyzes candidate task files (torch + stdlib).

Runs inside a sandbox (`pipeline.tasks.probe_pool` starts it). It imports torch once, then reads one
JSON job per stdin line; each job is analyzed in a forked child with its own timeout, so a hang,
crash or hostile module costs only that child. The reply is one JSON line on stdout.

A job is a task file (`source`, which must define `Model`) plus either its own `get_inputs` /
`get_init_inputs` (`kind: complete`) or facts to infer them from (`kind: extracted`: init
argument candidates and the forward parameters). The child finds inputs, checks validity
(constant, near-zero, input-independent, nondeterministic, input-mutating outputs), records the
aten op inventory, per-statement shapes of `forward`, FLOPs and bytes at GPU sizes (on meta
tensors) and picks GPU sizes that reach the target time on the named GPU.
"""

from __future__ import annotations

import builtins
import json
import os
import select
import signal
import sys
import time

from pipeline.tasks.probe_inputs import build_model, infer_inputs, role_base, sized_specs
from pipeline.tasks.probe_measure import analyze_run, check_validity
from pipeline.tasks.probe_runtime import (
    ProbeReject,
    block_files,
    classify_error,
    dtype_name,
    exec_source,
    load_torch,
    make_input,
    short_error,
)
from pipeline.tasks.scale import footprint, scale_constants


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
    import ast

    torch = load_torch()
    ns = exec_source(job["source"])
    tree = ast.parse(job["source"])
    constants = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Constant)
                and type(node.value.value) is int):
            constants[node.targets[0].id] = node.value.value
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
        model = build_model(ns, init_gpu, "meta")
        gpu_stats = analyze_run(model, gpu_inputs, True)
    except ProbeReject:
        raise
    except BaseException:  # noqa: BLE001 - meta unsupported: estimate from the CPU run
        gpu_stats = None

    def input_numel():
        with torch.device("meta"):
            xs = ns["get_inputs"]()
        return sum(x.numel() for x in xs if isinstance(x, torch.Tensor))

    scaled = scale_constants(ns, constants, int(job["cpu_max_numel"]), input_numel,
                             lambda: footprint(ns))
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
            from pipeline.tasks.variants import validate

            return validate(job["sources"])
        if job.get("kind") == "complete":
            return _complete(job)
        return _extracted(job)
    except ProbeReject as rej:
        return {"ok": False, "reason": rej.args[0], "detail": rej.args[1]}
    except RecursionError:
        return {"ok": False, "reason": "runtime_error", "detail": "recursion too deep"}


# --- the fork server -------------------------------------------------------------------------


def _run_child(job: dict, path: str) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    result_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    block_files()
    try:
        result = analyze(job)
    except BaseException as exc:  # noqa: BLE001 - last resort, still one line of reason
        result = {"ok": False, "reason": "probe_error", "detail": short_error(exc)}
    data = json.dumps(result, default=str).encode("utf-8")
    os.write(result_fd, data)
    os.close(result_fd)
    os._exit(0)


def _serve_one(job: dict, workdir: str) -> dict:
    path = os.path.join(workdir, f"res-{os.getpid()}-{time.monotonic_ns()}.json")
    timeout = float(job.get("timeout_s", 20.0))
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            _run_child(job, path)
        finally:
            os._exit(1)
    status = None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - start > timeout:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return {"ok": False, "reason": "timeout",
                    "detail": f"analysis took longer than {timeout:.0f}s"}
        time.sleep(0.003)
    wall = time.monotonic() - start
    try:
        with builtins.open(path, encoding="utf-8") as fh:
            result = json.loads(fh.read())
        os.unlink(path)
    except (OSError, ValueError):
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        name = signal.Signals(sig).name if sig else f"exit {os.WEXITSTATUS(status)}"
        reason = "memory" if sig in (signal.SIGKILL, signal.SIGSEGV) else "crash"
        return {"ok": False, "reason": reason, "detail": f"analysis child died ({name})"}
    result["wall_s"] = wall
    return result


_WARMUP = """import torch
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.conv = torch.nn.Conv2d(2, 2, 3)
    def forward(self, x, y):
        return self.fc(x).softmax(-1), self.conv(y).relu()
def get_inputs():
    return [torch.randn(16, 8), torch.randn(1, 2, 5, 5)]
def get_init_inputs():
    return []
"""


def main() -> None:
    import torch

    torch.set_num_threads(1)
    # warm the lazily imported pieces once so every fork gets them for free
    from torch.utils import flop_counter  # noqa: F401
    from torch.utils._python_dispatch import TorchDispatchMode  # noqa: F401

    analyze({"kind": "complete", "source": _WARMUP, "cpu_max_numel": 64, "gpu_min_ms": 0.0,
             "gpu": {"flops": 1e12, "bandwidth": 1e12}})
    workdir = os.getcwd()
    out = sys.stdout
    sys.stdout = sys.stderr
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], 3600)
        if not ready:
            continue
        line = sys.stdin.readline()
        if not line:
            return
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        reply = _serve_one(msg["job"], workdir)
        reply["id"] = msg.get("id")
        out.write(json.dumps(reply, default=str) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
