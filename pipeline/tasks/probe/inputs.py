"""Input inference for modules carved out of larger files: candidate constructor arguments and
forward inputs from the first layer's dimensions, tried until the forward runs.
"""

from __future__ import annotations

import time

from pipeline.tasks.probe.runtime import (
    ProbeReject,
    classify_error,
    load_torch,
    make_input,
    short_error,
    tensor_outputs,
)

# --- input inference for extracted modules ---------------------------------------------------


def _first_layer(model):
    torch = load_torch()
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
    torch = load_torch()
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


def build_model(ns, init_args, device="cpu"):
    torch = load_torch()
    torch.manual_seed(0)
    if device == "meta":
        with torch.device("meta"):
            model = ns["Model"](*init_args)
    else:
        model = ns["Model"](*init_args)
    return model.eval()


_PRIMARY = ("hidden_states", "input_ids", "pixel_values", "inputs_embeds", "x", "input",
            "features", "embeddings", "hidden_state", "input_features", "inputs")


def infer_inputs(ns: dict, job: dict):
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
            model = build_model(ns, init_args)
        except ProbeReject:
            raise
        except BaseException as exc:  # noqa: BLE001
            first_err = first_err or exc
            if classify_error(exc) in ("needs_gpu", "reads_files", "downloads"):
                raise ProbeReject(classify_error(exc), short_error(exc)) from None
            continue
        modes = (True, False) if any(_optional(p) for p in tensor_params[1:]) else (False,)
        for specs in (sp for mode in modes for sp in _candidates(
                model, tensor_params, base, job.get("feature_guess", []), none_optional=mode)):
            if time.monotonic() > deadline:
                break
            tried += 1
            load_torch().manual_seed(1)
            inputs = [make_input(s) for s in specs]
            try:
                with load_torch().no_grad():
                    outs = tensor_outputs(model(*inputs))
            except ProbeReject as rej:
                first_err = first_err or rej
                if rej.args[0] in ("output_none", "output_not_tensor"):
                    raise
                continue
            except BaseException as exc:  # noqa: BLE001 - the next candidate may fit
                first_err = first_err or exc
                if classify_error(exc) in ("needs_gpu", "reads_files", "downloads"):
                    raise ProbeReject(classify_error(exc), short_error(exc)) from None
                continue
            if any(o.is_floating_point() and not bool(load_torch().isfinite(o).all()) for o in outs):
                # runs, but inf/nan out (a None mask where a -inf fill needed one): keep looking,
                # and fall back to it only if nothing else runs
                fallback = fallback or (init_args, specs)
                continue
            return init_args, specs
    if fallback is not None:
        return fallback
    if isinstance(first_err, ProbeReject):
        raise first_err
    detail = short_error(first_err) if first_err else "no candidate"
    reason = classify_error(first_err) if first_err else "no_inputs"
    if first_err is not None and tried == 0:
        raise ProbeReject("init_error", f"constructor raised {detail}")
    raise ProbeReject("no_inputs" if reason == "runtime_error" else reason,
                      f"no input shape fits after {tried} tries; first: {detail}")


# --- sizing ----------------------------------------------------------------------------------


def role_base(base: dict) -> dict:
    sp = base["spatial"]
    return {"batch": base["batch"], "seq": base["seq"], "height": sp, "width": sp,
            "depth": 4, **base}


def sized_specs(specs: list[dict], sizes: dict) -> list[dict]:
    out = []
    for s in specs:
        roles = s.get("roles") or []
        shape = [sizes.get(r, d) if r in sizes else d for r, d in zip(roles, s["shape"],
                                                                      strict=False)]
        out.append({**s, "shape": shape or s["shape"]})
    return out
