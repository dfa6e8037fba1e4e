"""Child side of task-file loading: runs inside the sandbox with torch + stdlib only.

Reads `task.py` and `options.json` from the working directory, checks the KernelBench interface,
optionally scales module-level dims down until the inputs fit `cpu_max_numel`, runs the reference
forward on CPU and writes `result.json` (shapes, dtypes, init inputs, scaled constants).
"""

from __future__ import annotations

import ast
import inspect
import json
import math
import os
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path

from pipeline.tasks.dims import (
    derived_refresher,
    get_slot,
    int_constants,
    set_slot,
    tie_partners,
)

_STARTED = [time.monotonic()]  # reset once torch is imported
_TIMER: list[threading.Timer] = []


def _write(result: dict) -> None:
    Path("result.json").write_text(json.dumps(result, default=str), encoding="utf-8")


def _fail(reason: str) -> None:
    _write({"valid": False, "reason": reason})
    sys.exit(0)


ALLOC_FAILURE = ("can't allocate memory", "cannot allocate memory", "out of memory")


def is_alloc_failure(text: str) -> bool:
    """True for the host allocator's refusal (the task's sizes are meant for a GPU's memory)."""
    low = text.lower()
    return any(m in low for m in ALLOC_FAILURE)


def _jsonable(value):
    import torch

    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, torch.dtype):
        return str(value)
    raise TypeError(f"init input of type {type(value).__name__} is not JSON-serializable")


def _spec(name: str, t) -> dict:
    import torch

    spec = {"name": name, "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
            "init": "randn", "low": None, "high": None}
    if t.device.type == "meta" or t.numel() == 0:
        return spec
    if t.dtype == torch.bool:
        spec.update(init="randint", low=0.0, high=2.0)
    elif not t.is_floating_point():
        spec.update(init="randint", low=float(t.min()), high=float(t.max()) + 1)
    else:
        lo, hi = float(t.min()), float(t.max())
        if lo >= 0.0 and hi <= 1.0:
            spec.update(init="rand", low=0.0, high=1.0)
    return spec


def _input_numel(ns: dict) -> int:
    import torch

    with torch.device("meta"):
        inputs = ns["get_inputs"]()
    return sum(x.numel() for x in inputs if isinstance(x, torch.Tensor))


# The CPU copy's whole footprint (inputs, parameters and buffers, outputs) may be this many times
# the input cap: an embedding lookup with small integer inputs once kept a 512 MB output, an
# outer product of two 8k vectors a 67M-element one, and their CPU verification ran out of time.
FOOTPRINT_FACTOR = 32
# ...and one forward may cost at most this many FLOPs: a SwiGLU MLP copy with 65k inputs still
# did 2.2 GFLOP a call, which a single-threaded CPU kernel timed 25 times does not finish in 60 s.
CPU_MAX_FLOPS = 1 << 28


# A halving must shrink the overshoot by at least this share to be kept: 1000 classes halved
# to 1 for 0.2% of MobileNetV1's FLOPs changed the task and cost ten meta runs of a deep model.
MIN_GAIN = 0.01


def _analytic_rnns(model, flops: list[float]) -> None:
    """Give each LSTM/GRU/RNN of a meta `model` a forward that returns outputs of the right
    shapes at once and adds its FLOPs to `flops[0]`: run step by step on meta, a 6-layer LSTM
    over 512 steps took 40 s, the whole time budget, before any scaling."""
    import torch

    def analytic(m):
        original = m.forward
        gates = {"LSTM": 4, "GRU": 3}.get(m.mode, 1)
        dirs = 2 if m.bidirectional else 1
        proj = m.proj_size or m.hidden_size

        def forward(x, hx=None):
            if not isinstance(x, torch.Tensor) or x.dim() not in (2, 3):
                return original(x, hx)
            batched = x.dim() == 3
            steps, batch = ((x.shape[1], x.shape[0]) if m.batch_first else x.shape[:2]
                            ) if batched else (x.shape[0], 1)
            width = x.shape[-1]
            for _ in range(m.num_layers):
                flops[0] += dirs * 2.0 * gates * m.hidden_size * (width + proj) * batch * steps
                width = dirs * proj
            out = x.new_empty(*x.shape[:-1], dirs * proj)
            lead = (dirs * m.num_layers, batch) if batched else (dirs * m.num_layers,)
            h = x.new_empty(*lead, proj)
            return (out, (h, x.new_empty(*lead, m.hidden_size))) if m.mode == "LSTM" else (out, h)

        m.forward = forward

    for mod in model.modules():
        if isinstance(mod, torch.nn.RNNBase):
            analytic(mod)


def meta_items():
    """A dispatch mode in which `.item()` of a meta tensor is a placeholder (0.0, False or 1)
    instead of an error: Swin's `[x.item() for x in torch.linspace(0, rate, depth)]` drop-path
    rates built on meta. Values, not shapes, so the shapes and FLOPs stay exact unless a shape
    depends on data (then the real CPU run is the judge)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    scalar = torch.ops.aten._local_scalar_dense.default

    class MetaItems(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is scalar and args[0].device.type == "meta":
                t = args[0]
                return 0.0 if t.is_floating_point() else False if t.dtype == torch.bool else 1
            return func(*args, **(kwargs or {}))

    return MetaItems()


def footprint(ns: dict, strict: bool = False) -> tuple[int, float]:
    """(elements of the inputs, parameters, buffers and outputs; FLOPs) of one forward on meta.
    The inputs alone and 0 FLOPs when the model cannot be built or run on meta (with `strict`,
    that raises instead)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        inputs = ns["get_inputs"]()
    total = sum(x.numel() for x in inputs if isinstance(x, torch.Tensor))
    try:
        with torch.device("meta"), torch.no_grad(), meta_items():
            model = ns["Model"](*ns["get_init_inputs"]())
            rnn_flops = [0.0]
            _analytic_rnns(model, rnn_flops)
            with FlopCounterMode(display=False) as counter:
                out = model(*inputs)
    except Exception:  # noqa: BLE001 - no meta kernel for some op: inputs only
        if strict:
            raise
        return total, 0.0
    total += sum(t.numel() for t in (*model.parameters(), *model.buffers()))
    outs = out if isinstance(out, list | tuple) else [out]
    total += sum(o.numel() for o in outs if isinstance(o, torch.Tensor))
    return total, float(counter.get_total_flops()) + rnn_flops[0]


def scale_constants(ns: dict, constants: dict[str, int], cap: int,
                    input_numel: Callable[[], int],
                    cost: Callable[[], tuple[int, float]] | None = None,
                    refresh: Callable[[dict], None] | None = None,
                    partners: dict[str, int] | None = None) -> dict[str, int]:
    """Halve the largest dim constants until `input_numel()` fits `cap` and, when `cost` (see
    `footprint`) is given, the footprint fits FOOTPRINT_FACTOR * cap and the FLOPs
    CPU_MAX_FLOPS; a halving that does not shrink the largest overshoot (by MIN_GAIN) is undone (and retried
    after the next halving that does), and so is one that makes `cost` raise where it did not
    before (a group count no longer dividing channels, a pooling chain left with 0 pixels).
    A constant whose halving alone is undone is tried again together with each of its ties (the
    other constants and `partners`, see `tie_partners`, of the same value), then with all: a
    batch size that must equal a broadcast dim, an image size that must equal the model's
    default.
    `refresh(ns)` (see `derived_refresher`) recomputes the values derived from the constants
    after each change.

    `ns` is the task module's namespace, changed in place; returns the slots it changed.
    """
    use_cost = cost is not None
    if use_cost:
        try:
            cost()
        except Exception:  # noqa: BLE001 - the model does not run on meta: bound the inputs
            use_cost = False
    partners = partners or {}

    def excess() -> float:
        if refresh is not None:
            refresh(ns)
        over = input_numel() / cap
        if use_cost:
            elements, flops = cost()
            over = max(over, elements / (cap * FOOTPRINT_FACTOR), flops / CPU_MAX_FLOPS)
        return over

    scaled: dict[str, int] = {}
    broken: set[frozenset] = set()

    def untouched(k: str) -> bool:  # not moved by a refresh since we last set it
        return get_slot(ns, k) == scaled.get(k, {**partners, **constants}.get(k))

    def attempt(keys: list[str], size: float) -> float | None:
        """Halve `keys` together; keep it and return the new excess if it shrank, else undo."""
        old = {k: get_slot(ns, k) for k in keys}
        trial = frozenset((k, max(1, old[k] // 2)) for k in keys)
        if trial in broken:  # raised before: other dims shrinking does not mend a pooling chain
            return None
        for k, v in trial:
            set_slot(ns, k, v)
        try:
            new = excess()
        except Exception:  # noqa: BLE001 - a dim that breaks the task is not scalable this far
            broken.add(trial)
            new = size
        if new < size * (1.0 - MIN_GAIN):
            scaled.update({k: get_slot(ns, k) for k in keys})
            return new
        for k in keys:
            set_slot(ns, k, old[k])
        if refresh is not None:
            refresh(ns)
        return None

    useless: set[str] = set()
    size = excess()
    while size > 1:
        live = [k for k in constants if k not in useless and untouched(k) and ns[k] >= 2]
        if not live:
            break
        name = max(live, key=lambda k: ns[k])
        new = attempt([name], size)
        if new is None:
            ties = [k for k in (*constants, *partners) if k != name and untouched(k)
                    and get_slot(ns, k) == ns[name]]
            # one partner at a time first: equal values at small sizes are often coincidence
            for group in [[name, k] for k in ties] + ([[name, *ties]] if len(ties) > 1 else []):
                new = attempt(group, size)
                if new is not None:
                    break
        if new is None:
            useless.add(name)
            continue
        size = new
        useless.clear()  # a dim that did not help before may help now (the other bound leads)
    return scaled


def time_budget(flops: float, base_s: float, host_flops: float, max_s: float) -> float:
    """Seconds a task may take: `base_s` plus its FLOPs at GPU size (one forward, counted on
    meta) at a conservative host rate, capped at `max_s`: a deep model's meta scaling loop and
    CPU checks take longer than an elementwise op's."""
    return min(max_s, base_s + flops / host_flops)


def start_budget(opts: dict, flops: float | None) -> None:
    """End this process with a `timed out` verdict when the task's time budget (see
    `time_budget`, measured from torch's import: a loaded host's slow interpreter start is no
    fault of the task) runs out; `flops=None`: the cap, while the FLOPs are being counted. The
    parent's sandbox timeout is the cap: this gives the verdict the budget's figures sooner."""
    if not opts.get("budget_s"):
        return
    base, cap = float(opts["budget_s"]), float(opts.get("max_budget_s", opts["budget_s"]))
    if flops is None:
        budget, why = cap, "while counting FLOPs"
    else:
        budget = time_budget(flops, base, float(opts.get("host_flops", 1e9)), cap)
        why = f"budget {base:.0f}s + {flops / 1e9:.1f} GFLOP at GPU size"
    left = budget - (time.monotonic() - _STARTED[0])

    def expire() -> None:
        _write({"valid": False, "reason": f"timed out after {budget:.0f}s ({why})"})
        os._exit(0)

    for old in _TIMER:  # the budget set before the FLOPs were known
        old.cancel()
    timer = threading.Timer(max(0.0, left), expire)
    timer.daemon = True
    timer.start()
    _TIMER[:] = [timer]


def main() -> None:
    opts = json.loads(Path("options.json").read_text(encoding="utf-8"))
    src = Path("task.py").read_text(encoding="utf-8")
    try:
        tree = ast.parse(src, "task.py")
    except SyntaxError as exc:
        _fail(f"syntax error at line {exc.lineno}: {exc.msg}")
    import torch

    _STARTED[0] = time.monotonic()
    start_budget(opts, 0.0)
    torch.set_num_threads(1)
    module = types.ModuleType("kernelsynth_task")
    module.__file__ = "task.py"
    sys.modules[module.__name__] = module
    ns = module.__dict__
    try:
        exec(compile(tree, "task.py", "exec"), ns)
    except BaseException as exc:  # noqa: BLE001 - report anything the file raises
        _fail(f"executing the file raised {type(exc).__name__}: {str(exc)[:200]}")
    model_cls = ns.get("Model")
    if not (isinstance(model_cls, type) and issubclass(model_cls, torch.nn.Module)):
        _fail("no class Model(nn.Module)")
    for fn in ("get_inputs", "get_init_inputs"):
        if not callable(ns.get(fn)):
            _fail(f"missing function {fn}()")
    constants = int_constants(tree)
    partners = tie_partners(tree)
    scaled: dict[str, int] = {}
    try:
        # FLOPs cost a meta run (seconds for a deep model): counted where scaling needs them
        if opts.get("scale"):
            start_budget(opts, None)
            start_budget(opts, footprint(ns)[1])
        if opts.get("scale") and opts.get("cpu_max_numel"):
            scaled = scale_constants(ns, constants, int(opts["cpu_max_numel"]),
                                     lambda: _input_numel(ns), lambda: footprint(ns, True),
                                     derived_refresher(tree, [*constants, *partners]),
                                     partners)
        init_inputs = ns["get_init_inputs"]()
        if not isinstance(init_inputs, list | tuple):
            _fail(f"get_init_inputs() returned {type(init_inputs).__name__}, not a list")
        init_json = _jsonable(list(init_inputs))
        torch.manual_seed(opts.get("seed", 0))
        model = model_cls(*init_inputs).eval()
        torch.manual_seed(opts.get("seed", 0) + 1)
        inputs = ns["get_inputs"]()
        if not isinstance(inputs, list | tuple):
            _fail(f"get_inputs() returned {type(inputs).__name__}, not a list")
        params = list(inspect.signature(model.forward).parameters)
        names = [params[i] if i < len(params) else f"arg{i}" for i in range(len(inputs))]
        in_specs = []
        for name, x in zip(names, inputs, strict=True):
            if isinstance(x, torch.Tensor):
                in_specs.append(_spec(name, x))
            else:
                in_specs.append({"name": name, "shape": [], "dtype": type(x).__name__,
                                 "init": "given", "low": None, "high": None, "value": x})
        clones = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        start = time.perf_counter()
        with torch.no_grad():
            out = model(*inputs)
        forward_ms = (time.perf_counter() - start) * 1e3
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001
        if isinstance(exc, MemoryError) or is_alloc_failure(str(exc)):
            _write({"valid": False, "too_large_for_host": True,
                    "reason": f"too_large_for_host: {str(exc).splitlines()[0][:160]}"
                              if str(exc) else "too_large_for_host: MemoryError",
                    "scaled_constants": scaled})
            sys.exit(0)
        last = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        where = f" (line {last.lineno})" if last and last.filename == "task.py" else ""
        _fail(f"reference raised {type(exc).__name__}{where}: {str(exc).splitlines()[0][:200]}"
              if str(exc) else f"reference raised {type(exc).__name__}{where}")
    outs = out if isinstance(out, list | tuple) else [out]
    out_specs = []
    for i, o in enumerate(outs):
        if not isinstance(o, torch.Tensor):
            _fail(f"forward output {i} is {type(o).__name__}, not a tensor")
        out_specs.append(_spec(f"out{i}" if len(outs) > 1 else "out", o))
    finite = all(bool(torch.isfinite(o).all()) for o in outs if o.is_floating_point())
    mutated = [n for n, a, b in zip(names, inputs, clones, strict=True)
               if isinstance(a, torch.Tensor) and not torch.equal(a, b)]
    _write({
        "valid": True, "reason": "", "init_inputs": init_json, "inputs": in_specs,
        "outputs": out_specs, "constants": constants, "scaled_constants": scaled,
        "forward_ms": forward_ms, "finite": finite, "mutated_inputs": mutated,
        "num_params": sum(p.numel() for p in model.parameters()),
        "output_abs_mean": [float(o.float().abs().mean()) if o.numel() else 0.0 for o in outs],
        "input_numel": sum(math.prod(s["shape"]) for s in in_specs),
    })


if __name__ == "__main__":
    main()
