"""Child side of task building: a fork server that analyzes candidate task files (torch + stdlib).

Runs inside a sandbox (`pipeline.probe_pool` starts it). It imports torch once, then reads one
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
import io
import json
import os
import select
import signal
import sys
import time
import traceback
import types

from pipeline.flops import first_numel, largest_numel, op_flops
from pipeline.taskprobe import footprint, scale_constants

_BLOCKED = "kernelsynth: file access blocked"


class ProbeReject(Exception):
    """The module cannot become a task; args = (reason, detail)."""


# --- helpers that need torch -----------------------------------------------------------------


def _torch():
    import torch

    return torch


def _dtype_name(dt) -> str:
    return str(dt).replace("torch.", "")


def _flatten(out) -> list:
    torch = _torch()
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, list | tuple):
        res = []
        for o in out:
            res.extend(_flatten(o))
        return res
    if out is None:
        return [None]
    if isinstance(out, dict) or hasattr(out, "to_tuple"):
        vals = list(out.values()) if isinstance(out, dict) else list(out.to_tuple())
        return [v for v in _flatten(vals) if v is not None]
    return [out]


def _tensor_outputs(out) -> list:
    torch = _torch()
    outs = _flatten(out)
    for i, o in enumerate(outs):
        if o is None:
            raise ProbeReject("output_none", f"forward output {i} is None")
        if not isinstance(o, torch.Tensor):
            raise ProbeReject("output_not_tensor", f"forward output {i} is {type(o).__name__}")
    if not outs:
        raise ProbeReject("output_not_tensor", "forward returned no tensor")
    return outs


def _classify(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    low = text.lower()
    if _BLOCKED in text or isinstance(exc, FileNotFoundError):
        return "reads_files"
    if "cuda" in low or "nccl" in low or "triton" in low:
        return "needs_gpu"
    if any(k in low for k in ("huggingface", "hf_hub", "from_pretrained", "urlopen", "socket",
                              "connection", "network", "download")):
        return "downloads"
    if isinstance(exc, MemoryError) or "memory" in low and "alloc" in low:
        return "memory"
    return "runtime_error"


def _short(exc: BaseException) -> str:
    msg = str(exc).splitlines()[0][:200] if str(exc) else ""
    last = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" (line {last.lineno})" if last and last.filename == "task.py" else ""
    return f"{type(exc).__name__}{where}: {msg}" if msg else f"{type(exc).__name__}{where}"


def _block_files() -> None:
    """Modules that read files (weights, vocabularies) are rejected, not served."""
    real_open = builtins.open

    def guarded_open(file, mode="r", *args, **kwargs):
        if isinstance(file, int):
            return real_open(file, mode, *args, **kwargs)
        raise PermissionError(f"{_BLOCKED}: {file}")

    builtins.open = guarded_open
    io.open = guarded_open
    torch = _torch()
    torch.load = lambda *a, **k: (_ for _ in ()).throw(PermissionError(f"{_BLOCKED}: torch.load"))


def _exec_source(source: str) -> dict:
    module = types.ModuleType("kernelsynth_task")
    module.__file__ = "task.py"
    sys.modules[module.__name__] = module
    ns = module.__dict__
    try:
        exec(compile(source, "task.py", "exec"), ns)
    except ProbeReject:
        raise
    except BaseException as exc:  # noqa: BLE001 - anything the file raises is a reason
        raise ProbeReject("import_error" if _classify(exc) == "runtime_error" else _classify(exc),
                          f"executing the file raised {_short(exc)}") from None
    model_cls = ns.get("Model")
    torch = _torch()
    if not (isinstance(model_cls, type) and issubclass(model_cls, torch.nn.Module)):
        raise ProbeReject("no_model", "no class Model(nn.Module)")
    return ns


def _make_input(spec: dict, device: str = "cpu"):
    torch = _torch()
    init = spec.get("init", "randn")
    if init == "none":  # an Optional argument left unset (attention_mask=None)
        return None
    shape = [int(s) for s in spec["shape"]]
    dt = getattr(torch, spec.get("dtype", "float32"))
    if device == "meta":
        return torch.empty(shape, dtype=dt, device="meta")
    if init == "randint":
        return torch.randint(int(spec.get("low") or 0), int(spec.get("high") or 2), shape,
                             dtype=dt)
    if init == "rand":
        return torch.rand(shape, dtype=dt)
    return torch.randn(shape, dtype=dt)


# --- op inventory, flops, bytes, per-line shapes -----------------------------------------------


def _op_recorder():
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpRecorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: list[str] = []
            self.counts: dict[str, int] = {}
            self.traffic = 0
            self.pointwise = 0

        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = str(func.overloadpacket).replace("aten::", "aten.")
            if name.startswith("aten."):
                if name not in self.counts:
                    self.ops.append(name)
                self.counts[name] = self.counts.get(name, 0) + 1
            self.traffic += _nbytes(args) + _nbytes(kwargs) + _nbytes(out)
            if func.overloadpacket not in _counted() and name.split(".")[-1] not in _NO_FLOPS:
                self.pointwise += op_flops(name, largest_numel((args, kwargs)), first_numel(out))
            return out

    return OpRecorder()


_NO_FLOPS = frozenset({
    "view", "reshape", "_unsafe_view", "permute", "transpose", "t", "expand", "unsqueeze",
    "squeeze", "contiguous", "clone", "slice", "select", "split", "split_with_sizes", "cat",
    "stack", "alias", "detach", "_to_copy", "copy_", "empty", "zeros", "ones", "full",
    "arange", "lift_fresh", "unbind", "as_strided", "_reshape_alias", "new_empty", "new_zeros",
    "empty_like", "zeros_like", "ones_like", "full_like", "index_select", "embedding",
    "_local_scalar_dense", "fill_", "zero_", "index", "gather", "constant_pad_nd", "roll",
})


def _counted():
    from torch.utils.flop_counter import flop_registry

    return flop_registry


def _numel(obj) -> int:
    torch = _torch()
    if isinstance(obj, torch.Tensor):
        return obj.numel()
    if isinstance(obj, list | tuple):
        return sum(_numel(o) for o in obj)
    return 0


def _nbytes(obj) -> int:
    torch = _torch()
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, list | tuple):
        return sum(_nbytes(o) for o in obj)
    if isinstance(obj, dict):
        return sum(_nbytes(o) for o in obj.values())
    return 0


class _LineShapes:
    """sys.settrace hook: tensor locals of `forward` before each line runs (first pass only)."""

    def __init__(self, code):
        self.code = code
        self.before: dict[int, dict] = {}

    def _snap(self, frame) -> dict:
        torch = _torch()
        snap = {}
        for k, v in frame.f_locals.items():
            if isinstance(v, torch.Tensor):
                snap[k] = [list(v.shape), _dtype_name(v.dtype)]
            elif isinstance(v, tuple) and v and all(isinstance(t, torch.Tensor) for t in v):
                snap[k] = [[list(t.shape) for t in v], "tuple"]
        return snap

    def __call__(self, frame, event, arg):
        if frame.f_code is not self.code:
            return None
        return self._local

    def _local(self, frame, event, arg):
        if event == "line" and frame.f_lineno not in self.before:
            self.before[frame.f_lineno] = self._snap(frame)
        return self._local


def _analyze_run(model, inputs: list, trace_lines: bool) -> dict:
    """One forward under the op recorder, the FLOP counter and (optionally) the line tracer."""
    torch = _torch()
    from torch.utils.flop_counter import FlopCounterMode

    rec = _op_recorder()
    flop = FlopCounterMode(display=False)
    tracer = _LineShapes(type(model).forward.__code__) if trace_lines else None
    if tracer:
        sys.settrace(tracer)
    try:
        with torch.no_grad(), flop, rec:
            out = model(*inputs)
    finally:
        if tracer:
            sys.settrace(None)
    outs = _tensor_outputs(out)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    ideal = _nbytes(inputs) + _nbytes(outs) + params + buffers
    return {
        "ops": rec.ops, "op_counts": rec.counts,
        "flops": float(flop.get_total_flops() + rec.pointwise),
        "bytes": float(ideal), "bytes_unfused": float(rec.traffic),
        "outputs": [{"shape": list(o.shape), "dtype": _dtype_name(o.dtype)} for o in outs],
        "lines": {str(k): v for k, v in (tracer.before.items() if tracer else [])},
        "param_bytes": float(params + buffers),
    }


# --- validity --------------------------------------------------------------------------------


def _check_validity(model, inputs: list, make_inputs) -> dict:
    """Run on CPU: deterministic, input-dependent, non-constant, not near zero, no mutation."""
    torch = _torch()
    clones = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    t0 = time.perf_counter()
    with torch.no_grad():
        out1 = _tensor_outputs(model(*inputs))
    ms = (time.perf_counter() - t0) * 1e3
    mutated = [i for i, (a, b) in enumerate(zip(inputs, clones, strict=True))
               if isinstance(a, torch.Tensor) and not torch.equal(a, b)]
    if mutated:
        raise ProbeReject("mutates_inputs", f"forward modifies input {mutated[0]} in place")
    with torch.no_grad():
        out2 = _tensor_outputs(model(*clones))
    for a, b in zip(out1, out2, strict=True):
        if a.shape != b.shape or not torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)):
            raise ProbeReject("nondeterministic", "two runs on the same inputs differ")
    floats = [o for o in out1 if o.is_floating_point() or o.is_complex()]
    for o in floats:
        if o.numel() and not bool(torch.isfinite(o).all()):
            raise ProbeReject("not_finite", "output has inf or nan")
    if all(o.numel() == 0 for o in out1):
        raise ProbeReject("empty_output", "every output is empty")
    numeric = [o.double() if not o.is_complex() else o.abs().double() for o in out1 if o.numel()]
    if all(bool((o == o.flatten()[0]).all()) for o in numeric):
        raise ProbeReject("constant_output", "every output element is the same value")
    if floats and all(float(o.abs().max()) < 0.01 for o in floats if o.numel()):
        raise ProbeReject("near_zero_output", "all outputs have |y| < 0.01")
    torch.manual_seed(1234)
    other = make_inputs()
    with torch.no_grad():
        out3 = _tensor_outputs(model(*other))
    same = all(a.shape == b.shape and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))
               for a, b in zip(out1, out3, strict=True))
    if same and any(isinstance(x, torch.Tensor) and x.numel() > 1 for x in inputs):
        raise ProbeReject("input_independent", "outputs do not change when the inputs change")
    return {"cpu_ms": ms, "abs_mean": [float(o.double().abs().mean()) for o in numeric]}


# --- input inference for extracted modules ---------------------------------------------------


def _first_layer(model):
    torch = _torch()
    nn = torch.nn
    for m in model.modules():
        if m is model and type(m).forward is not nn.Module.forward and not list(m.children()):
            pass
        if isinstance(m, nn.Embedding | nn.EmbeddingBag):
            return ("embedding", m.num_embeddings)
        if isinstance(m, nn.Linear):
            return ("features", m.in_features)
        if isinstance(m, nn.Conv1d | nn.ConvTranspose1d):
            return ("conv1d", m.in_channels)
        if isinstance(m, nn.Conv2d | nn.ConvTranspose2d):
            return ("conv2d", m.in_channels)
        if isinstance(m, nn.Conv3d | nn.ConvTranspose3d):
            return ("conv3d", m.in_channels)
        if isinstance(m, nn.LayerNorm | getattr(nn, "RMSNorm", nn.LayerNorm)):
            shape = m.normalized_shape
            if shape:
                return ("features", int(shape[-1]))
        if isinstance(m, nn.BatchNorm1d):
            return ("conv1d", m.num_features)
        if isinstance(m, nn.BatchNorm2d | nn.InstanceNorm2d):
            return ("conv2d", m.num_features)
        if isinstance(m, nn.BatchNorm3d):
            return ("conv3d", m.num_features)
        if isinstance(m, nn.GroupNorm):
            return ("conv2d", m.num_channels)
        if isinstance(m, nn.MultiheadAttention):
            return ("features", m.embed_dim)
    for p in model.parameters():  # custom norms: weight of shape [hidden]
        if p.dim() == 1:
            return ("features", int(p.shape[0]))
        if p.dim() == 2:
            return ("features", int(p.shape[-1]))
        break
    return None


def _model_dims(model, hint) -> list[int]:
    """Feature sizes the model's layers expect or produce, the first layer's first."""
    torch = _torch()
    nn = torch.nn
    dims: list[int] = []

    def add(d) -> None:
        if isinstance(d, int) and d > 0 and d not in dims:
            dims.append(d)

    if hint and hint[0] != "embedding":
        add(hint[1])
    for m in model.modules():
        if isinstance(m, nn.Linear):
            add(m.in_features)
            add(m.out_features)
        elif isinstance(m, nn.LayerNorm) and m.normalized_shape:
            add(int(m.normalized_shape[-1]))
        elif isinstance(m, nn.Conv1d | nn.Conv2d | nn.Conv3d):
            add(m.in_channels)
            add(m.out_channels)
        elif isinstance(m, nn.Embedding):
            add(m.embedding_dim)
    return dims


def _head_dim(model) -> int | None:
    """The per-head size rotary cos/sin must match (a rotary sub-dim wins when present)."""
    for names in (("rotary_ndims", "rotary_dim", "rotary_emb_dim"),
                  ("head_dim", "head_size", "attention_head_size", "d_head", "dim_head",
                   "head_features")):
        for m in model.modules():
            for name in names:
                hd = getattr(m, name, None)
                if isinstance(hd, int) and not isinstance(hd, bool) and hd > 0:
                    return hd
    return None


_INT_NAMES = ("input_ids", "ids", "index", "indices", "labels", "token_type_ids")


def _image_sizes(model) -> list[int]:
    """Input resolutions the model checks against (`image_size` of ViT-style embeddings)."""
    sizes: list[int] = []
    for m in model.modules():
        for name in ("image_size", "img_size"):
            v = getattr(m, name, None)
            if isinstance(v, list | tuple) and v and isinstance(v[0], int):
                v = v[0]
            if isinstance(v, int) and not isinstance(v, bool) and 8 <= v <= 1024 \
                    and v not in sizes:
                sizes.append(v)
    return sizes[:2]


def _layouts(hint, f: int, base: dict, images: list[int] = ()
             ) -> list[tuple[str, list[str], list[int]]]:
    b, s, sp = base["batch"], base["seq"], base["spatial"]
    kind = hint[0] if hint else None
    out = []
    if kind == "conv2d":
        out.append(("nchw", ["batch", "feature", "height", "width"], [b, f, sp, sp]))
        # a patch embedding that insists on its configured resolution (fixed, not grown)
        out += [(f"nchw{px}", ["batch", "feature", "fixed", "fixed"], [b, f, px, px])
                for px in images if px != sp]
    elif kind == "conv1d":
        out.append(("ncl", ["batch", "feature", "seq"], [b, f, s]))
    elif kind == "conv3d":
        out.append(("ncdhw", ["batch", "feature", "depth", "height", "width"],
                    [b, f, 4, sp // 2, sp // 2]))
    out += [("bsf", ["batch", "seq", "feature"], [b, s, f]),
            ("bf", ["batch", "feature"], [b, f]),
            ("nchw", ["batch", "feature", "height", "width"], [b, f, sp, sp]),
            ("bhsd", ["batch", "fixed", "seq", "feature"], [b, 4, s, f]),
            ("nhwc", ["batch", "height", "width", "feature"], [b, sp, sp, f])]
    seen, uniq = set(), []
    for item in out:
        if item[0] not in seen:
            seen.add(item[0])
            uniq.append(item)
    return uniq


def _optional(param: dict) -> bool:
    """An argument that may be None: annotated Optional, or a mask (None: nothing masked)."""
    ann = param.get("annotation") or ""
    return "None" in ann or "Optional" in ann or param["name"].endswith("mask")


def _candidates(model, params: list[dict], base: dict, guesses: list[int], limit: int = 48,
                none_optional: bool = False):
    """Spec lists for the tensor arguments, most plausible first. `none_optional`: arguments
    after the first whose annotation admits None (attention_mask: Optional[Tensor]) get None."""
    hint = _first_layer(model)
    images = _image_sizes(model)
    dims = _model_dims(model, hint)
    dims += [g for g in guesses if g not in dims]
    hd = _head_dim(model)
    b, s = base["batch"], base["seq"]
    n = 0
    first_is_tokens = hint is not None and hint[0] == "embedding" or params[0]["name"] in (
        "input_ids", "ids", "tokens")
    if first_is_tokens:
        high = float(min(hint[1], 1000)) if hint and hint[0] == "embedding" else 100.0
        layouts = [("tokens", ["batch", "seq"], [b, s], None)]
    else:
        layouts = [(*lay, f) for f in dims[:4] for lay in _layouts(hint, f, base, images)]
        layouts.sort(key=lambda x: 0 if x[3] == dims[0] else 1)
    for layout, roles, shape, f in layouts:
        for rest_f in ([f] + [d for d in dims[:4] if d != f]) if f is not None else [None]:
            specs = []
            for i, p in enumerate(params):
                name = p["name"]
                if i > 0 and none_optional and _optional(p):
                    specs.append({"name": name, "shape": [], "dtype": "float32", "init": "none",
                                  "low": None, "high": None, "roles": []})
                elif i == 0 and layout == "tokens":
                    specs.append({"name": name, "shape": shape, "dtype": "int64", "init": "randint",
                                  "low": 0.0, "high": high, "roles": roles})
                elif name in ("cos", "sin"):
                    d = hd or (rest_f or 32)
                    specs.append({"name": name, "shape": [b, s, d], "dtype": "float32",
                                  "init": "rand", "low": 0.0, "high": 1.0,
                                  "roles": ["batch", "seq", "fixed"]})
                elif i > 0 and any(k in name for k in _INT_NAMES):
                    specs.append({"name": name, "shape": [b, s], "dtype": "int64",
                                  "init": "randint", "low": 0.0, "high": 2.0,
                                  "roles": ["batch", "seq"]})
                elif i == 0 or rest_f is None:
                    sh = shape if layout != "tokens" else [b, s, dims[0] if dims else 64]
                    ro = roles if layout != "tokens" else ["batch", "seq", "feature"]
                    specs.append({"name": name, "shape": list(sh), "dtype": "float32",
                                  "init": "randn", "low": None, "high": None, "roles": ro})
                else:
                    sh = [rest_f if r == "feature" else d for r, d in zip(roles, shape,
                                                                           strict=True)]
                    specs.append({"name": name, "shape": sh, "dtype": "float32",
                                  "init": "randn", "low": None, "high": None, "roles": roles})
            yield specs
            n += 1
            if n >= limit or len(params) == 1:
                break
        if n >= limit:
            return


def _build_model(ns, init_args, device="cpu"):
    torch = _torch()
    torch.manual_seed(0)
    if device == "meta":
        with torch.device("meta"):
            model = ns["Model"](*init_args)
    else:
        model = ns["Model"](*init_args)
    return model.eval()


_PRIMARY = ("hidden_states", "input_ids", "pixel_values", "inputs_embeds", "x", "input",
            "features", "embeddings", "hidden_state", "input_features", "inputs")


def _infer_inputs(ns: dict, job: dict):
    """Try init candidates x shape candidates; the first forward that runs wins."""
    params = job["forward_params"]
    tensor_params = [p for p in params if not p.get("has_default")]
    if not tensor_params:
        tensor_params = [p for p in params if p.get("name") in _PRIMARY][:1]
    if not tensor_params:
        raise ProbeReject("no_inputs", "forward takes no required arguments")
    for p in tensor_params:
        ann = p.get("annotation") or ""
        if ann and any(t in ann for t in ("int", "float", "bool", "str")) and "Tensor" not in ann:
            raise ProbeReject("non_tensor_input", f"forward argument {p['name']} is {ann}")
    base = job["base"]
    first_err: BaseException | None = None
    fallback = None
    tried = 0
    deadline = time.monotonic() + 0.6 * float(job.get("timeout_s", 20.0))
    for init_args in job["init_candidates"]:
        try:
            model = _build_model(ns, init_args)
        except ProbeReject:
            raise
        except BaseException as exc:  # noqa: BLE001
            first_err = first_err or exc
            if _classify(exc) in ("needs_gpu", "reads_files", "downloads"):
                raise ProbeReject(_classify(exc), _short(exc)) from None
            continue
        modes = (True, False) if any(_optional(p) for p in tensor_params[1:]) else (False,)
        for specs in (sp for mode in modes for sp in _candidates(
                model, tensor_params, base, job.get("feature_guess", []), none_optional=mode)):
            if time.monotonic() > deadline:
                break
            tried += 1
            _torch().manual_seed(1)
            inputs = [_make_input(s) for s in specs]
            try:
                with _torch().no_grad():
                    outs = _tensor_outputs(model(*inputs))
            except ProbeReject as rej:
                first_err = first_err or rej
                if rej.args[0] in ("output_none", "output_not_tensor"):
                    raise
                continue
            except BaseException as exc:  # noqa: BLE001 - the next candidate may fit
                first_err = first_err or exc
                if _classify(exc) in ("needs_gpu", "reads_files", "downloads"):
                    raise ProbeReject(_classify(exc), _short(exc)) from None
                continue
            if any(o.is_floating_point() and not bool(_torch().isfinite(o).all()) for o in outs):
                # runs, but inf/nan out (a None mask where a -inf fill needed one): keep looking,
                # and fall back to it only if nothing else runs
                fallback = fallback or (init_args, specs)
                continue
            return init_args, specs
    if fallback is not None:
        return fallback
    if isinstance(first_err, ProbeReject):
        raise first_err
    detail = _short(first_err) if first_err else "no candidate"
    reason = _classify(first_err) if first_err else "no_inputs"
    if first_err is not None and tried == 0:
        raise ProbeReject("init_error", f"constructor raised {detail}")
    raise ProbeReject("no_inputs" if reason == "runtime_error" else reason,
                      f"no input shape fits after {tried} tries; first: {detail}")


# --- sizing ----------------------------------------------------------------------------------


def _role_base(base: dict) -> dict:
    sp = base["spatial"]
    return {"batch": base["batch"], "seq": base["seq"], "height": sp, "width": sp,
            "depth": 4, **base}


def _sized_specs(specs: list[dict], sizes: dict) -> list[dict]:
    out = []
    for s in specs:
        roles = s.get("roles") or []
        shape = [sizes.get(r, d) if r in sizes else d for r, d in zip(roles, s["shape"],
                                                                      strict=False)]
        out.append({**s, "shape": shape or s["shape"]})
    return out


def _est_ms(stats: dict, gpu: dict) -> float:
    return 1e3 * max(stats["flops"] / gpu["flops"], stats["bytes"] / gpu["bandwidth"])


def _meta_stats(ns, init_args, specs, trace: bool) -> dict:
    model = _build_model(ns, init_args, "meta")
    inputs = [_make_input(s, "meta") for s in specs]
    return _analyze_run(model, inputs, trace)


def _gpu_sizes(ns, init_args, specs, base: dict, job: dict) -> tuple[dict, dict | None]:
    """Grow batch, then sequence/spatial dims until the estimate reaches the target time."""
    gpu, target = job["gpu"], job["gpu_min_ms"]
    cap_bytes = job.get("gpu_max_bytes", 4e9)
    roles = {r for s in specs for r in s.get("roles", [])}
    growable = [r for r in ("batch", "seq", "height", "width", "depth") if r in roles]
    base = _role_base(base)
    sizes = {r: base[r] for r in growable}
    try:
        stats = _meta_stats(ns, init_args, _sized_specs(specs, sizes), False)
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
                new = _meta_stats(ns, init_args, _sized_specs(specs, trial), False)
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
    torch = _torch()
    spec = {"name": name, "shape": list(t.shape), "dtype": _dtype_name(t.dtype), "init": "randn",
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
    torch = _torch()
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

    torch = _torch()
    ns = _exec_source(job["source"])
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
        raise ProbeReject("bad_inputs", f"get_inputs()/get_init_inputs() raised {_short(exc)}"
                          ) from None
    gpu_stats = None
    try:
        model = _build_model(ns, init_gpu, "meta")
        gpu_stats = _analyze_run(model, gpu_inputs, True)
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
        model = _build_model(ns, init_cpu)
        torch.manual_seed(1)
        inputs = list(ns["get_inputs"]())
        names = _forward_names(model, len(inputs))
        in_specs = [_spec_of(n, x) if isinstance(x, torch.Tensor) else
                    {"name": n, "shape": [], "dtype": type(x).__name__, "init": "given",
                     "low": None, "high": None} for n, x in zip(names, inputs, strict=True)]
        validity = _check_validity(model, inputs, lambda: list(ns["get_inputs"]()))
        cpu_stats = _analyze_run(model, [x.clone() if isinstance(x, torch.Tensor) else x
                                         for x in inputs], True)  # CPU file's annotations
    except ProbeReject:
        raise
    except BaseException as exc:  # noqa: BLE001
        raise ProbeReject(_classify(exc), f"reference raised {_short(exc)}") from None
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
    torch = _torch()
    ns = _exec_source(job["source"])
    init_args, specs = _infer_inputs(ns, job)
    base = job["base"]
    model = _build_model(ns, init_args)
    cpu_specs = specs
    torch.manual_seed(1)
    inputs = [_make_input(s) for s in cpu_specs]
    try:
        validity = _check_validity(model, inputs, lambda: [_make_input(s) for s in cpu_specs])
        cpu_stats = _analyze_run(model, [x.clone() if x is not None else x for x in inputs], True)
    except ProbeReject:
        raise
    except BaseException as exc:  # noqa: BLE001
        raise ProbeReject(_classify(exc), f"reference raised {_short(exc)}") from None
    sizes, gpu_stats = _gpu_sizes(ns, init_args, specs, base, job)
    gpu_specs = _sized_specs(specs, sizes)
    try:
        gpu_stats = _meta_stats(ns, init_args, gpu_specs, True)
    except BaseException:  # noqa: BLE001 - meta unsupported: GPU file keeps the CPU sizes
        sizes = {r: _role_base(base)[r] for r in sizes}
        gpu_specs = specs
        model = _build_model(ns, init_args)
        torch.manual_seed(1)
        gpu_stats = _analyze_run(model, [_make_input(s) for s in specs], True)
    cpu_sizes = {r: _role_base(base)[r] for r in sizes}
    return {"ok": True, "init_inputs": init_args, "cpu_init_inputs": init_args,
            "inputs": gpu_specs, "cpu_inputs": cpu_specs, "scaled_constants": {},
            "gpu": gpu_stats, "cpu": cpu_stats, "validity": validity,
            "gpu_sizes": sizes, "cpu_sizes": cpu_sizes}


def analyze(job: dict) -> dict:
    """Analyze one job; every failure becomes {ok: False, reason, detail}."""
    torch = _torch()
    torch.manual_seed(0)
    try:
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
    _block_files()
    try:
        result = analyze(job)
    except BaseException as exc:  # noqa: BLE001 - last resort, still one line of reason
        result = {"ok": False, "reason": "probe_error", "detail": _short(exc)}
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
