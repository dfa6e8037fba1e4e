"""Tasks stage: RawModule records -> KernelBench Task records (STAGES.md, `extract_tasks`).

Complete KernelBench files (the seed corpus, NNSmith graphs) keep their inputs; classes found in
larger files (transformers, git) are cut out with libcst (`pipeline.tasks.carve.carve`) and get inferred
inputs. Every module is then analyzed in a sandboxed probe worker (`pipeline.tasks.probe.probe`): inputs,
validity filters, op inventory, per-statement shapes, FLOPs/bytes, GPU and CPU sizes. The task
file at GPU sizes gets shape comments in `forward`; `cpu_source` is the same file scaled down.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import TasksConfig
from pipeline.tasks.annotate.annotate import annotate_forward, forward_text
from pipeline.tasks.annotate.reasoning import GPUS, op_families, reasoning_trace, task_level
from pipeline.tasks.carve.carve import (
    ExtractError,
    Extraction,
    Param,
    extract_class,
    package_resolver,
)
from pipeline.tasks.carve.repo_resolver import repo_resolver
from pipeline.tasks.probe.pool import ProbePool
from pipeline.tasks.probe.variants import job_for as variants_job
from pipeline.tasks.probe.variants import with_variants
from pipeline.tasks.taskfile import substitute_constants, task_id_of
from schemas import RawModule, Rejection, Task, TensorSpec
from verifier import pyast

STAGE = "extract"
BASE_SIZES = {"batch": 2, "seq": 16, "spatial": 16}
_ROLE_CONST = {"batch": "batch_size", "seq": "seq_len", "height": "height", "width": "width",
               "depth": "depth"}


@dataclass
class _Prepared:
    module: RawModule
    job: dict | None = None
    extraction: Extraction | None = None
    rejection: Rejection | None = None


def _reject(m: RawModule, reason: str, detail: str) -> Rejection:
    ref = f"{m.path}:{m.module_name}" if m.module_name else m.path
    return Rejection.make(STAGE, m.module_id, ref, reason, f"{ref}: {detail}"[:500])


@functools.lru_cache(maxsize=256)
def is_complete_task(code: str) -> bool:
    """True when the file already is a KernelBench task (Model, get_inputs, get_init_inputs)."""
    if "def get_inputs" not in code or "def get_init_inputs" not in code:
        return False
    try:
        tree = pyast.parse(code)
    except (SyntaxError, ValueError):
        return False
    names = {n.name for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)}
    return {"Model", "get_inputs", "get_init_inputs"} <= names


def _resolver_for(m: RawModule, cfg: TasksConfig | None = None) -> Callable | None:
    if m.source_kind == "transformers":
        spec = importlib.util.find_spec("transformers")
        if spec and spec.origin:
            return package_resolver(Path(spec.origin).parent, "transformers")
    if m.source_kind == "git":  # sibling files of the repository, at the module's commit
        return repo_resolver(m.repo_url, m.commit, cfg.repo_cache_dir if cfg else None)
    return None


# --- init argument heuristics ---------------------------------------------------------------

_INT_RULES: list[tuple[str, int]] = [
    (r"(^|_)(num_)?heads?$|n_heads?|num_attention_heads|nhead", 8),
    (r"kv_heads", 8),
    (r"layers?$|depth$|num_blocks", 2),
    (r"groups?$", 1),
    (r"kernel(_size)?$|ksize", 3),
    (r"stride", 1),
    (r"padding|pad$", 1),
    (r"dilation", 1),
    (r"idx$|index$|layer_id|^layer$", 0),
    (r"vocab|num_embeddings|num_classes|num_labels|n_classes", 1000),
    (r"experts?$", 4),
    (r"top_?k", 2),
    (r"max_position|max_len|max_seq|context", 2048),
    (r"window", 8),
    (r"patch", 4),
    (r"ratio|factor|scale", 2),
]
_DIM_NAME = re.compile(r"dim|size|features|channels|hidden|d_model|embed|width|planes|units|"
                       r"^d$|^n$|^c$|^in_|^out_|ch$")


_LAYER_INDEX = ("layer_idx", "layer_id", "layer_index", "layer_number")


def _guess_value(p: Param, dim: int) -> object:
    ann = p.annotation.replace("Optional[", "").lower()
    name = p.name.lower()
    if ann.startswith("bool") or name.startswith(("use_", "is_", "has_", "add_", "with_")) or \
            name in ("bias", "affine", "elementwise_affine", "causal", "inplace"):
        return name in ("bias", "affine", "elementwise_affine")
    if "eps" in name or "epsilon" in name:
        return 1e-5
    if "dropout" in name or name in ("p", "drop", "drop_rate", "attn_drop", "proj_drop"):
        return 0.0
    if "act" in name or "activation" in name or ann.startswith("str"):
        return "gelu"
    if ann.startswith("float") or "alpha" in name or "beta" in name or "temperature" in name:
        return 0.5
    if name in ("config",):
        return None
    for pattern, value in _INT_RULES:
        if re.search(pattern, name):
            return value
    if _DIM_NAME.search(name) or ann.startswith("int") or not ann:
        return dim
    return dim


def init_candidates(params: list[Param], config: dict | None) -> list[list]:
    """Candidate constructor argument lists for the required parameters, best first."""
    required = [p for p in params if not p.has_default]
    # a layer index with a None default selects per-layer config entries: pass 0 explicitly
    last = max((i for i, p in enumerate(params) if p.name in _LAYER_INDEX and p.has_default),
               default=-1)
    if last >= 0:
        try:
            tail = {p.name: pyast.literal_eval(p.default) for p in params[:last] if p.has_default}
        except (ValueError, SyntaxError):
            tail = None
        if tail is not None:
            required = params[:last + 1]
    out: list[list] = []
    for dim in (256, 64, 512):
        args = []
        for p in required:
            if p.has_default:
                args.append(0 if p.name in _LAYER_INDEX else pyast.literal_eval(p.default))
                continue
            if config and p.name in config and config[p.name] is not None:
                args.append(config[p.name])
            else:
                args.append(_guess_value(p, dim))
        if args not in out:
            out.append(args)
    return out


# --- task file assembly -----------------------------------------------------------------------


def _py(value: object) -> str:
    return repr(value)


def _taken_names(source: str) -> set[str]:
    tree = pyast.parse(source)
    names = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def assemble_task(ext: Extraction, probe: dict) -> tuple[str, dict[str, int]]:
    """The GPU-size task file for an extraction and the CPU values of its size constants."""
    taken = _taken_names(ext.source)
    consts: list[str] = []
    cpu_values: dict[str, int] = {}
    role_names: dict[str, str] = {}

    def const(name: str, value: object) -> str:
        base = name
        k = 1
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        taken.add(name)
        consts.append(f"{name} = {_py(value)}")
        return name

    for role in ("batch", "seq", "height", "width", "depth"):
        if role in probe["gpu_sizes"]:
            role_names[role] = const(_ROLE_CONST[role], probe["gpu_sizes"][role])
            cpu_values[role_names[role]] = probe["cpu_sizes"][role]
    feature_names: dict[int, str] = {}
    input_exprs = []
    for spec in probe["inputs"]:
        dims = []
        for role, d in zip(spec.get("roles") or [], spec["shape"], strict=False):
            if role in role_names:
                dims.append(role_names[role])
            elif role == "feature":
                if d not in feature_names:
                    feature_names[d] = const("features" if not feature_names else
                                             f"features_{len(feature_names) + 1}", d)
                dims.append(feature_names[d])
            else:
                dims.append(str(d))
        shape = ", ".join(dims) + ("," if len(dims) == 1 else "")
        if spec.get("init") == "none":
            input_exprs.append("None")
        elif spec.get("init") == "randint":
            lo, hi = int(spec.get("low") or 0), int(spec.get("high") or 2)
            input_exprs.append(f"torch.randint({lo}, {hi}, ({shape}))")
        else:
            dtype = spec.get("dtype", "float32")
            dt = "" if dtype == "float32" else f", dtype=torch.{dtype}"
            input_exprs.append(f"torch.randn({shape}{dt})")
    init_exprs = []
    required = [p for p in ext.init_params if not p.has_default]
    for p, value in zip(required, probe["init_inputs"], strict=False):
        if isinstance(value, int) and not isinstance(value, bool) and p.name.isidentifier():
            init_exprs.append(const(p.name, value))
        else:
            init_exprs.append(_py(value))
    text = ext.source.rstrip() + "\n\n\n" + "\n".join(consts) + "\n\n\n"
    text += "def get_inputs():\n    return [" + ", ".join(input_exprs) + "]\n\n\n"
    text += "def get_init_inputs():\n    return [" + ", ".join(init_exprs) + "]\n"
    return text, cpu_values


def cpu_annotated(source: str, cpu_values: dict[str, int], probe: dict) -> str:
    """The CPU copy with its own shape comments (annotated at the CPU sizes, not the GPU's)."""
    cpu = probe.get("cpu") or {}
    scaled = substitute_constants(source, cpu_values)
    outputs = [{"name": f"out{i}" if len(cpu.get("outputs", [])) > 1 else "out", **o}
               for i, o in enumerate(cpu.get("outputs", []))]
    inputs = [s for s in probe.get("cpu_inputs") or [] if isinstance(s.get("shape"), list)]
    text, _ = annotate_forward(scaled, cpu.get("lines", {}), outputs, inputs)
    if task_id_of(text) != task_id_of(scaled):
        raise ValueError("annotation changed the CPU copy's code")
    return text


def _specs(items: list[dict]) -> list[TensorSpec]:
    return [TensorSpec(name=s.get("name", f"out{i}"), shape=[int(x) for x in s["shape"]]
                       if isinstance(s["shape"], list) and all(isinstance(x, int)
                                                               for x in s["shape"]) else [],
                       dtype="NoneType" if s.get("init") == "none" else
                       str(s.get("dtype", "float32")), init=s.get("init", "randn"),
                       low=s.get("low"), high=s.get("high")) for i, s in enumerate(items)]


def _task_name(m: RawModule) -> str:
    if m.source_kind in ("seed", "nnsmith") or m.module_name in ("", "Model"):
        return Path(m.path).stem or m.module_id[:12]
    folder = Path(m.path).parent.name
    return f"{folder}.{m.module_name}" if folder else m.module_name


def build_task(m: RawModule, ext: Extraction | None, probe: dict, cfg: TasksConfig
               ) -> Task:
    """A Task from a successful probe result (raises ValueError on an unusable result)."""
    if ext is None:
        source = m.code
        cpu_values = {k: int(v) for k, v in probe.get("scaled_constants", {}).items()}
    else:
        source, cpu_values = assemble_task(ext, probe)
    gpu = probe["gpu"]
    outputs = [{"name": f"out{i}" if len(gpu["outputs"]) > 1 else "out", **o}
               for i, o in enumerate(gpu["outputs"])]
    inputs = [s for s in probe["inputs"] if isinstance(s.get("shape"), list)]
    annotated, count = annotate_forward(source, gpu.get("lines", {}), outputs, inputs)
    task_id = task_id_of(annotated)
    if task_id != task_id_of(source):
        raise ValueError("annotation changed the code")
    cpu_source = cpu_annotated(source, cpu_values, probe) if cpu_values else annotated
    ops = gpu["ops"]
    level = task_level(ops, gpu.get("op_counts", {}))
    name = _task_name(m)
    reasoning = reasoning_trace(name=name, inputs=inputs, outputs=outputs, ops=ops,
                                flops=gpu["flops"], nbytes=gpu["bytes"],
                                bytes_unfused=gpu.get("bytes_unfused", 0.0), level=level,
                                gpu=cfg.target_gpu)
    if ext is not None:  # the task file passes only the required arguments (assemble_task)
        n = sum(1 for p in ext.init_params if not p.has_default)
        probe = {**probe, "init_inputs": probe["init_inputs"][:n],
                 "cpu_init_inputs": (probe.get("cpu_init_inputs") or [])[:n]
                 if probe.get("cpu_init_inputs") is not None else None}
    meta = {"cpu_ms": probe.get("validity", {}).get("cpu_ms"), "annotated": count,
            "probe_s": round(probe.get("wall_s", 0.0), 3),
            "cpu_init_inputs": probe.get("cpu_init_inputs"), "cpu_sizes": cpu_values,
            "cpu_inputs": probe.get("cpu_inputs"), "op_counts": gpu.get("op_counts", {}),
            # the work of the CPU file (its own sizes), for rows measured on the CPU
            "cpu_flops": (probe.get("cpu") or {}).get("flops"),
            "cpu_bytes": (probe.get("cpu") or {}).get("bytes")}
    if ext is not None:
        meta.update(config_class=ext.config_class, inlined=ext.inlined, shims=ext.shims,
                    included=ext.included, normalized=ext.normalized)
    return Task(
        task_id=task_id, name=name, source=annotated, cpu_source=cpu_source,
        init_inputs=json.dumps(probe["init_inputs"]), input_specs=_specs(inputs),
        output_specs=_specs(outputs), shape_annotations=forward_text(annotated),
        op_inventory=ops, op_families=op_families(ops), flops=float(gpu["flops"]),
        bytes_moved=float(gpu["bytes"]), level=level, reasoning=reasoning,
        source_kind=m.source_kind, module_id=m.module_id, repo_url=m.repo_url, commit=m.commit,
        path=m.path, original_name=m.module_name, meta=json.dumps(meta, default=str),
        license=m.license, source_generator=source_generator(m),
    )


def source_generator(m: RawModule) -> str:
    """What wrote a generated source (seed corpus, NNSmith and its seed); "" for real code."""
    if m.source_kind == "nnsmith":
        try:
            seed = json.loads(m.meta or "{}").get("seed")
        except (json.JSONDecodeError, AttributeError):
            seed = None
        return f"nnsmith@{m.commit}" + (f" seed={seed}" if seed is not None else "")
    if m.source_kind == "seed":
        return f"kernelsynth seed corpus@{m.commit}"
    return ""


# --- the stage ----------------------------------------------------------------------------------


def prepare(m: RawModule, cfg: TasksConfig) -> _Prepared:
    """Extraction (host side, no execution) and the probe job for one module."""
    gpu = GPUS.get(cfg.target_gpu, GPUS["H100"])
    common = {"timeout_s": cfg.timeout_s, "cpu_max_numel": cfg.cpu_max_numel, "gpu": gpu,
              "gpu_min_ms": cfg.gpu_min_ms, "base": BASE_SIZES,
              "gpu_max_bytes": cfg.gpu_max_gb * 1e9}
    if is_complete_task(m.code) and m.module_name in ("", "Model") or m.source_kind in (
            "seed", "nnsmith"):
        if not is_complete_task(m.code):
            return _Prepared(m, rejection=_reject(m, "not_a_task",
                                                  "expected a complete KernelBench file"))
        return _Prepared(m, job={"kind": "complete", "source": m.code, **common})
    try:
        ext = extract_class(m.code, m.module_name, m.path, _resolver_for(m, cfg))
    except ExtractError as exc:
        return _Prepared(m, rejection=_reject(m, exc.reason, exc.detail))
    except RecursionError:
        return _Prepared(m, rejection=_reject(m, "syntax_error", "file too deeply nested"))
    feature_guess = []
    if ext.config:
        for key in ("hidden_size", "d_model", "embed_dim", "n_embd", "dim"):
            v = ext.config.get(key)
            if isinstance(v, int) and v not in feature_guess:
                feature_guess.append(v)
    max_seq = 4096
    if ext.config and isinstance(ext.config.get("max_position_embeddings"), int):
        max_seq = max(16, min(max_seq, int(ext.config["max_position_embeddings"])))
    job = {"kind": "extracted", "source": ext.source,
           "init_candidates": init_candidates(ext.init_params, ext.config),
           "forward_params": [{"name": p.name, "annotation": p.annotation,
                               "has_default": p.has_default} for p in ext.forward_params],
           "feature_guess": feature_guess + [256, 64], "max_seq": max_seq, **common}
    return _Prepared(m, job=job, extraction=ext)


def finish(prep: _Prepared, result: dict, cfg: TasksConfig) -> Task | Rejection:
    """Turn one probe result into a Task or a Rejection."""
    m = prep.module
    if not result.get("ok"):
        return _reject(m, result.get("reason", "probe_error"), result.get("detail", ""))
    try:
        return build_task(m, prep.extraction, result, cfg)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        return _reject(m, "build_error", f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 - libcst errors on odd files end as a reason
        return _reject(m, "build_error", f"{type(exc).__name__}: {str(exc)[:200]}")


def extract_tasks(modules: list[RawModule], cfg: TasksConfig, *, pool: ProbePool | None = None,
                  on_result: Callable[[RawModule, Task | Rejection], None] | None = None
                  ) -> tuple[list[Task], list[Rejection]]:
    """RawModules -> (tasks, rejections); every module ends up in exactly one of the two."""
    own = pool is None
    pool = pool or ProbePool(cfg.workers, cfg.probe_memory_mb)
    outcome: list[Task | Rejection | None] = [None] * len(modules)

    def one(i: int) -> None:
        # extraction (host CPU) of one module overlaps the probing of another in its worker
        m = modules[i]
        try:
            prep = prepare(m, cfg)
        except Exception as exc:  # noqa: BLE001 - a bad file must not end the batch
            prep = _Prepared(m, rejection=_reject(m, "extract_error",
                                                  f"{type(exc).__name__}: {str(exc)[:200]}"))
        if prep.rejection is not None or prep.job is None:
            item: Task | Rejection = prep.rejection or _reject(m, "extract_error", "no job")
        else:
            item = finish(prep, pool.analyze(prep.job), cfg)
            if isinstance(item, Task):  # the generalisation check's other sizes and arguments
                item = with_variants(item, pool.analyze(variants_job(item, cfg.timeout_s)))
        outcome[i] = item
        if on_result:
            on_result(m, item)

    try:
        with ThreadPoolExecutor(max_workers=max(1, cfg.workers)) as threads:
            list(threads.map(one, range(len(modules))))
    finally:
        if own:
            pool.close()
    tasks = [x for x in outcome if isinstance(x, Task)]
    rejections = [x for x in outcome if isinstance(x, Rejection)]
    return tasks, rejections
