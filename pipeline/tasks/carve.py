"""Extract one nn.Module class from a source file into a standalone KernelBench-style module.

The class becomes `Model`; the transitive closure of what it needs from its file (helpers,
constants, other classes, imports of torch/math/typing/...) comes along, nothing else. Names
imported from other files of the same repository are inlined when a resolver can find them,
else the class is rejected naming the missing name. A transformers-style `config` constructor
argument is replaced by a small concrete `ModelConfig` built from the config class's defaults.

Analysis uses `ast` (fast, for the closure); the rewrite of the assembled text uses libcst.
"""

from __future__ import annotations

import ast
import builtins
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from pipeline.tasks.normalize import NormalizeError, normalize_source
from pipeline.tasks.normalize_deps import absolute_module, dependency_definitions
from pipeline.tasks.repo_resolver import same_definition

# Top-level modules a task file may import (the verifier has torch + stdlib only).
ALLOWED_MODULES = frozenset({
    "torch", "math", "typing", "typing_extensions", "collections", "functools", "itertools",
    "dataclasses", "enum", "numbers", "operator", "abc", "copy", "warnings", "__future__",
    "numpy", "einops", "random", "logging", "inspect", "contextlib", "types", "re",
})
_BUILTINS = frozenset(dir(builtins)) | {"__name__", "__file__", "__class__"}

# torch-only stand-ins for well-known helpers of transformers (which a task may not import).
SHIMS: dict[str, str] = {
    "ACT2FN": '''class _Activations(dict):
    """Activation name -> a fresh module (stand-in for transformers' ACT2FN)."""

    def __getitem__(self, key):
        # activations this stand-in does not know fall back to GELU (recorded in the task meta)
        return (super().__getitem__(key) if key in self else nn.GELU)()


ACT2FN = _Activations({
    "gelu": nn.GELU, "gelu_new": lambda: nn.GELU(approximate="tanh"),
    "gelu_fast": lambda: nn.GELU(approximate="tanh"),
    "gelu_pytorch_tanh": lambda: nn.GELU(approximate="tanh"), "gelu_python": nn.GELU,
    "quick_gelu": nn.GELU, "relu": nn.ReLU, "relu6": nn.ReLU6, "silu": nn.SiLU, "swish": nn.SiLU,
    "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "mish": nn.Mish, "elu": nn.ELU, "selu": nn.SELU,
    "leaky_relu": nn.LeakyReLU, "linear": nn.Identity, "softplus": nn.Softplus,
    "hardswish": nn.Hardswish, "hardsigmoid": nn.Hardsigmoid, "prelu": nn.PReLU,
    "relu2": lambda: _ReLUSquared(), "gelu_accurate": lambda: nn.GELU(approximate="tanh"),
})


class _ReLUSquared(nn.Module):
    def forward(self, x):
        return torch.square(torch.relu(x))''',
    "ALL_ATTENTION_FUNCTIONS": '''class _AttentionFunctions(dict):
    """Always the eager implementation (stand-in for transformers' attention registry)."""

    def get_interface(self, name, default):
        return default


ALL_ATTENTION_FUNCTIONS = _AttentionFunctions()''',
    "ACT2CLS": '''ACT2CLS = {
    "gelu": nn.GELU, "relu": nn.ReLU, "relu6": nn.ReLU6, "silu": nn.SiLU, "swish": nn.SiLU,
    "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "mish": nn.Mish, "elu": nn.ELU, "selu": nn.SELU,
    "leaky_relu": nn.LeakyReLU, "linear": nn.Identity, "softplus": nn.Softplus,
}''',
    "is_torchdynamo_compiling": "def is_torchdynamo_compiling():\n    return False",
    "torch_compilable_check": '''def torch_compilable_check(cond, msg, error_type=ValueError):
    """Input validation of transformers; the task's inputs are fixed, so it checks nothing."""
    return None''',
    "get_activation": "def get_activation(name):\n    return ACT2FN[name]",
    "init": "from torch.nn import init",
    "maybe_autocast": ("def maybe_autocast(*args, **kwargs):\n"
                       "    return contextlib.nullcontext()  # tasks run in fp32, no autocast"),
    "Cache": "class Cache:\n    pass",
    "DynamicCache": "class DynamicCache(Cache):\n    pass",
    "EncoderDecoderCache": "class EncoderDecoderCache(Cache):\n    pass",
    "StaticCache": "class StaticCache(Cache):\n    pass",
    "logger": "logger = logging.getLogger(__name__)\nlogger.warning_once = logger.warning",
}
_SHIM_NEEDS = {"ACT2FN": {"nn"}, "ACT2CLS": {"nn"}, "logger": {"logging"},
               "DynamicCache": {"Cache"}, "EncoderDecoderCache": {"Cache"},
               "StaticCache": {"Cache"}, "get_activation": {"ACT2FN"},
               "maybe_autocast": {"contextlib"}}  # torch is always imported

# Base classes that are nn.Module with extra machinery irrelevant to the computation.
MODULE_BASES = frozenset({"GradientCheckpointingLayer"})
REJECT_BASES = frozenset({"PreTrainedModel", "GenerationMixin", "PushToHubMixin",
                          "ModelHubMixin", "PyTorchModelHubMixin"})

_KEEP_DECORATORS = frozenset({"staticmethod", "classmethod", "property", "dataclass",
                              "torch", "functools", "lru_cache", "cache", "wraps"})

# Fallback values for config fields a class reads when the config class cannot be parsed.
GENERIC_CONFIG: dict[str, object] = {
    "hidden_size": 256, "intermediate_size": 1024, "num_attention_heads": 8,
    "num_key_value_heads": 8, "num_hidden_layers": 2, "hidden_act": "gelu",
    "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "layer_norm_eps": 1e-5,
    "rms_norm_eps": 1e-6, "vocab_size": 1024, "max_position_embeddings": 2048,
    "attention_dropout": 0.0, "attention_bias": False, "mlp_bias": False, "d_model": 256,
    "initializer_range": 0.02, "dropout": 0.0, "activation_function": "gelu",
    "_attn_implementation": "eager", "pad_token_id": 0, "type_vocab_size": 2,
    "num_labels": 2, "num_channels": 3, "patch_size": 4, "image_size": 32,
    "layer_norm_epsilon": 1e-5,
    "hidden_dropout": 0.0, "attention_dropout_prob": 0.0, "activation_dropout": 0.0,
    "rope_theta": 10000.0, "num_experts": 4, "num_experts_per_tok": 2, "num_local_experts": 4,
    "moe_intermediate_size": 256, "head_dim": 32, "classifier_dropout": 0.0, "use_bias": True,
    "bias": True, "qkv_bias": True, "norm_eps": 1e-5, "eps": 1e-5,
    "embed_dim": 256, "projection_dim": 256, "d_ff": 1024, "d_kv": 32, "num_heads": 8,
    "partial_rotary_factor": 1.0, "sliding_window": None, "output_attentions": False,
    "use_cache": False, "is_decoder": False, "chunk_size_feed_forward": 0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}
_DIM_FIELD = re.compile(r"(^|_)(hidden_size|intermediate_size|d_model|d_ff|ffn_dim|embed_dim|"
                        r"hidden_dim|d_kv|head_dim|dim|n_embd|n_inner|kv_channels|"
                        r"projection_dim|mlp_dim|ffn_hidden_size|moe_intermediate_size|"
                        r"d_inner|embedding_size|hidden_sizes|num_channels_hidden)$")
MAX_HIDDEN = 512
MAX_VOCAB = 8192
MAX_LAYERS = 2


class ExtractError(Exception):
    """The class cannot become a standalone task; `reason` is a short class, `detail` one line."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass
class Param:
    name: str
    annotation: str = ""
    has_default: bool = False
    default: str = ""


@dataclass
class Extraction:
    """A standalone module text defining `Model` (no get_inputs yet) and what is known of it."""

    source: str
    original_name: str
    init_params: list[Param]
    forward_params: list[Param]
    config: dict[str, object] | None = None
    config_class: str = ""
    included: list[str] = field(default_factory=list)
    inlined: list[str] = field(default_factory=list)
    shims: list[str] = field(default_factory=list)
    normalized: list[str] = field(default_factory=list)  # einops patterns rewritten to torch


# A resolver maps (importing file path, module as written, level) to (path, source) or None.
Resolver = Callable[[str, str, int], "tuple[str, str] | None"]


def package_resolver(root: str | Path, package: str = "transformers") -> Resolver:
    """Resolve imports inside an installed package (relative or absolute) to its files."""
    root = Path(root)

    def resolve(importer: str, module: str, level: int) -> tuple[str, str] | None:
        rel = _package_relpath(importer, package)
        if level:
            base = list(Path(rel).parent.parts)
            if level > 1:
                base = base[: len(base) - (level - 1)] if level - 1 <= len(base) else None
            if base is None:
                return None
            parts = base + (module.split(".") if module else [])
        elif module.split(".")[0] == package:
            parts = module.split(".")[1:]
        else:
            return None
        for cand in (root.joinpath(*parts).with_suffix(".py"),
                     root.joinpath(*parts, "__init__.py")):
            if cand.is_file():
                try:
                    return str(cand.relative_to(root)), cand.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    return None
        return None

    return resolve


def _package_relpath(path: str, package: str) -> str:
    parts = Path(path).parts
    if package in parts:
        return str(Path(*parts[len(parts) - parts[::-1].index(package):]))
    return path


# --- file analysis (ast) ---------------------------------------------------------------------


@dataclass
class _Binding:
    kind: str  # def | import | from
    index: int  # statement index in the module body
    module: str = ""  # for imports
    level: int = 0
    orig: str = ""  # imported name


@dataclass(eq=False)
class _FileInfo:
    path: str
    source: str
    tree: ast.Module
    lines: list[str]
    bindings: dict[str, _Binding]


@functools.lru_cache(maxsize=64)
def _parse(path: str, source: str) -> _FileInfo:
    tree = ast.parse(source)
    bindings: dict[str, _Binding] = {}
    for i, node in enumerate(tree.body):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bindings[node.name] = _Binding("def", i)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        bindings.setdefault(n.id, _Binding("def", i))
        elif isinstance(node, ast.Import):
            for a in node.names:
                name = a.asname or a.name.split(".")[0]
                bindings[name] = _Binding("import", i, a.name if a.asname else name)
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                if a.name == "*":
                    continue
                bindings[a.asname or a.name] = _Binding("from", i, node.module or "", node.level,
                                                        a.name)
    return _FileInfo(path, source, tree, source.splitlines(keepends=True), bindings)


class _FreeNames(ast.NodeVisitor):
    """Names a statement reads from module scope (annotations and docstrings excluded)."""

    def __init__(self, skip_decorator: Callable[[ast.expr], bool]):
        self.loads: list[str] = []
        self.skip_decorator = skip_decorator

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and node.id not in self.loads:
            self.loads.append(node.id)

    def _visit_args(self, args: ast.arguments) -> None:
        for d in [*args.defaults, *args.kw_defaults]:
            if d is not None:
                self.visit(d)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        for d in node.decorator_list:
            if not self.skip_decorator(d):
                self.visit(d)
        self._visit_args(node.args)
        for stmt in node.body:
            self.visit(stmt)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._visit_args(node.args)
        self.visit(node.body)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for d in node.decorator_list:
            if not self.skip_decorator(d):
                self.visit(d)
        for b in node.bases:
            self.visit(b)
        for stmt in node.body:
            self.visit(stmt)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)


def _root_name(expr: ast.expr) -> str:
    while isinstance(expr, ast.Attribute | ast.Call | ast.Subscript):
        expr = expr.value if not isinstance(expr, ast.Call) else expr.func
    return expr.id if isinstance(expr, ast.Name) else ""


def _module_allowed(module: str) -> bool:
    return module.split(".")[0] in ALLOWED_MODULES


# --- closure ----------------------------------------------------------------------------------


@dataclass
class _Closure:
    stmts: list[tuple[str, int]] = field(default_factory=list)  # (path, index), dependency order
    imports: list[str] = field(default_factory=list)  # import lines of allowed modules
    shims: list[str] = field(default_factory=list)
    config_refs: list[tuple[str, str]] = field(default_factory=list)  # (path, class name)
    inlined: list[str] = field(default_factory=list)
    renames: dict[tuple[str, str], str] = field(default_factory=dict)
    definitions: dict[str, str] = field(default_factory=dict)  # timm blocks etc., in order


class _Collector:
    def __init__(self, resolver: Resolver | None, max_inlined_lines: int = 600):
        self.resolver = resolver
        self.closure = _Closure()
        self.seen: set[tuple[str, str]] = set()
        self.defined: dict[str, tuple[str, int]] = {}  # output name -> origin
        self.inlined_lines = 0
        self.max_inlined_lines = max_inlined_lines
        self.files: dict[str, _FileInfo] = {}

    def skip_decorator(self, info: _FileInfo) -> Callable[[ast.expr], bool]:
        def skip(expr: ast.expr) -> bool:
            return _strip_decorator(info, expr)

        return skip

    def need(self, info: _FileInfo, name: str, depth: int, via: str) -> None:
        self.files.setdefault(info.path, info)
        key = (info.path, name)
        if key in self.seen or name in _BUILTINS:
            return
        self.seen.add(key)
        b = info.bindings.get(name)
        if b is None:
            return  # a local/global the runtime will report if it is really missing
        if name in SHIMS and (b.kind != "def" or name == "logger"):
            if name not in self.closure.shims:
                self._shim_needs(name)
            return
        if b.kind == "def":
            node = info.tree.body[b.index]
            if (info.path, b.index) in self.closure.stmts:
                return
            owner = self.defined.get(name)
            if owner is not None and same_definition(
                    self.files[owner[0]].tree.body[owner[1]], node):
                return  # one helper copied into several files (`exists`, `default`)
            if isinstance(node, ast.ClassDef) and depth > 0:
                bad = [_root_name(x) for x in node.bases if _root_name(x) in REJECT_BASES]
                if bad:
                    raise ExtractError("pretrained_model", f"{name} derives from {bad[0]}")
            visitor = _FreeNames(self.skip_decorator(info))
            visitor.visit(node)
            for dep in visitor.loads:
                if dep != name:
                    self.need(info, dep, depth, via)
            if depth > 0:
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                self.inlined_lines += size
                if self.inlined_lines > self.max_inlined_lines:
                    raise ExtractError("too_many_dependencies",
                                       f"inlining {name} from {info.path} exceeds "
                                       f"{self.max_inlined_lines} lines")
                self.closure.inlined.append(f"{info.path}:{name}")
            owner = self.defined.get(name)
            if owner is not None and owner != (info.path, b.index):
                raise ExtractError("name_clash", f"{name} is defined in two inlined files")
            self.defined[name] = (info.path, b.index)
            self.closure.stmts.append((info.path, b.index))
            return
        self._need_import(info, name, b, depth, via)

    def _need_import(self, info: _FileInfo, name: str, b: _Binding, depth: int, via: str
                     ) -> None:
        if b.kind == "import":
            if _module_allowed(b.module):
                line = (f"import {b.module} as {name}" if b.module != name else
                        f"import {b.module}")
                self._add_import(line)
                return
            raise ExtractError("unresolved_import", f"{name} (module {b.module}) in {via}")
        if b.level == 0 and _module_allowed(b.module):
            alias = f" as {name}" if b.orig != name else ""
            self._add_import(f"from {b.module} import {b.orig}{alias}")
            return
        if name in SHIMS:
            if name not in self.closure.shims:
                self._shim_needs(name)
            return
        defs = dependency_definitions(absolute_module(info.path, b.module, b.level), b.orig)
        if defs is not None:  # a torch building block of timm & co: its definition comes along
            for def_name, source in defs:
                self.closure.definitions.setdefault(def_name, source)
            if name != b.orig:
                self.closure.definitions.setdefault(name, f"{name} = {b.orig}")
            return
        if b.orig.endswith("Config"):
            self.closure.config_refs.append((info.path, b.orig))
            return
        if b.orig in MODULE_BASES:
            return
        if self.resolver is None or depth >= 8:  # re-exports through __init__ files are deep
            raise ExtractError("unresolved_name", f"{name} from {'.' * b.level}{b.module}")
        found = self.resolver(info.path, b.module, b.level)
        if found is None:
            raise ExtractError("unresolved_name", f"{name} from {'.' * b.level}{b.module}")
        other = _parse(*found)
        if b.orig not in other.bindings:
            raise ExtractError("unresolved_name", f"{name} not found in {found[0]}")
        if b.orig != name:
            raise ExtractError("unresolved_name", f"{name} is an alias of {b.orig}")
        self.need(other, b.orig, depth + 1, f"{found[0]}")

    def _shim_needs(self, name: str) -> None:
        for dep in _SHIM_NEEDS.get(name, ()):
            if dep in SHIMS:
                if dep not in self.closure.shims:
                    self._shim_needs(dep)
            else:
                self._add_import({"nn": "from torch import nn", "logging": "import logging",
                                  "contextlib": "import contextlib"}[dep])
        self.closure.shims.append(name)

    def _add_import(self, line: str) -> None:
        if line not in self.closure.imports:
            self.closure.imports.append(line)


def _strip_decorator(info: _FileInfo, expr: ast.expr) -> bool:
    """Decorators from outside torch/stdlib (hub kernels, docstrings, output capture) go."""
    root = _root_name(expr)
    if root in _KEEP_DECORATORS:
        return False
    b = info.bindings.get(root)
    if b is None:
        return root not in _BUILTINS
    if b.kind == "def":
        return False
    return not _module_allowed(b.module) or b.level > 0


# --- config stand-in --------------------------------------------------------------------------


def config_defaults(info: _FileInfo, class_name: str, resolver: Resolver | None,
                    depth: int = 0) -> dict[str, object]:
    """Literal defaults of a config class: annotated class fields and `__init__` keywords."""
    b = info.bindings.get(class_name)
    if b is None or depth > 3:
        return {}
    if b.kind != "def":
        if resolver is None:
            return {}
        found = resolver(info.path, b.module, b.level)
        return config_defaults(_parse(*found), b.orig, resolver, depth + 1) if found else {}
    node = info.tree.body[b.index]
    if not isinstance(node, ast.ClassDef):
        return {}
    values: dict[str, object] = {}
    for base in node.bases:  # inherited defaults first, own ones override
        base_name = _root_name(base)
        if base_name.endswith("Config") and base_name not in ("PretrainedConfig",
                                                              "PreTrainedConfig"):
            values.update(config_defaults(info, base_name, resolver, depth + 1))
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value:
            _put_literal(values, stmt.target.id, stmt.value)
        elif (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
              and isinstance(stmt.targets[0], ast.Name)):
            _put_literal(values, stmt.targets[0].id, stmt.value)
        elif isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
            args = stmt.args
            pos = args.args[len(args.args) - len(args.defaults):]
            for a, d in zip(pos, args.defaults, strict=True):
                _put_literal(values, a.arg, d)
            for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True):
                if d is not None:
                    _put_literal(values, a.arg, d)
    return values


def _put_literal(values: dict, name: str, node: ast.expr) -> None:
    if isinstance(node, ast.Call) and node.args == [] and any(
            k.arg == "default" for k in node.keywords):  # interval(...)(default=0.02)
        node = next(k.value for k in node.keywords if k.arg == "default")
    try:
        value = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return
    if isinstance(value, int | float | str | bool | list | tuple | type(None)):
        values[name] = value


def small_config(defaults: dict[str, object], fields: list[str]) -> dict[str, object]:
    """The fields a class reads, with dims shrunk so the task runs on CPU and GPU sizes vary."""
    cfg = {k: v for k, v in defaults.items() if k in fields or k in ("hidden_size",
                                                                       "num_attention_heads")}
    for k in fields:
        if cfg.get(k) is None:
            cfg[k] = GENERIC_CONFIG.get(k, _guess_field(k))
    hidden = cfg.get("hidden_size") or cfg.get("d_model") or cfg.get("n_embd")
    factor = 1
    if isinstance(hidden, int) and hidden > MAX_HIDDEN:
        while hidden // factor > MAX_HIDDEN:
            factor *= 2
    for k, v in list(cfg.items()):
        if factor > 1 and isinstance(v, int) and not isinstance(v, bool) and _DIM_FIELD.search(k):
            cfg[k] = max(8, v // factor)
        elif factor > 1 and isinstance(v, list) and _DIM_FIELD.search(k) and all(
                isinstance(x, int) for x in v):
            cfg[k] = [max(8, x // factor) for x in v]
    for k, v in list(cfg.items()):
        if isinstance(v, int) and not isinstance(v, bool):
            if "vocab" in k and v > MAX_VOCAB:
                cfg[k] = MAX_VOCAB
            elif re.search(r"num_(hidden_)?layers|n_layers?$|num_blocks|depth$", k) and v > 2:
                cfg[k] = MAX_LAYERS
            elif re.search(r"dropout|drop_prob|_prob$", k):
                cfg[k] = 0
        elif isinstance(v, float) and re.search(r"dropout|drop_prob|_prob$|drop_path", k):
            cfg[k] = 0.0
    heads = cfg.get("num_attention_heads")
    if "head_dim" in cfg and cfg["head_dim"] is None and isinstance(hidden, int) and heads:
        cfg["head_dim"] = (hidden // factor) // int(heads)
    if "num_key_value_heads" in cfg and cfg["num_key_value_heads"] is None:
        cfg["num_key_value_heads"] = heads
    if "layer_types" in cfg and not isinstance(cfg["layer_types"], list):
        cfg["layer_types"] = ["full_attention"] * 4
    if "rope_parameters" in cfg and not isinstance(cfg["rope_parameters"], dict):
        # both access styles: rope_parameters["rope_theta"] and rope_parameters[layer_type]
        default = dict(GENERIC_CONFIG["rope_parameters"])  # type: ignore[arg-type]
        cfg["rope_parameters"] = {**default, "full_attention": dict(default),
                                  "sliding_attention": dict(default)}
    vocab = cfg.get("vocab_size")
    for k in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(vocab, int) and isinstance(cfg.get(k), int) and cfg[k] >= vocab:
            cfg[k] = 0
    cfg["_attn_implementation"] = "eager"
    return dict(sorted(cfg.items()))


def _guess_field(name: str) -> object:
    """A value for a config field that has no literal default (None means unknown)."""
    if re.search(r"(_size|_dim|_dims|^dim|_channels|_features|_width)$", name) and \
            "window" not in name and "max" not in name:
        return 256
    if re.search(r"^(num|n)_", name):
        return 4
    if re.search(r"eps|epsilon", name):
        return 1e-5
    if re.search(r"dropout|drop_prob|_prob$", name):
        return 0.0
    if "vocab" in name:
        return 1024
    return None


def _config_source(name: str, values: dict[str, object], subs: dict[str, list[str]]) -> str:
    lines = [f"    {k} = {v!r}" for k, v in values.items() if k.isidentifier() and k not in subs]
    for sub, fields in sorted(subs.items()):
        inner = small_config({}, fields)
        lines.append(f"\n    class {sub}:\n" + "\n".join(
            f"        {k} = {v!r}" for k, v in inner.items() if k.isidentifier()) + "\n")
    body = "\n".join(lines)
    return (f'class ModelConfig:\n    """Small concrete stand-in for {name} '
            f'(the fields the model reads)."""\n\n{body}\n\n'
            "    def get(self, key, default=None):\n        return getattr(self, key, default)\n")


# --- rewrite (libcst) -------------------------------------------------------------------------


class _Rewrite(cst.CSTTransformer):
    """Rename the class to Model, fix super(), drop foreign decorators, bases and annotations."""

    def __init__(self, original: str, strip_decorators: set[str], known: set[str],
                 config_param: str | None):
        self.original = original
        self.strip_decorators = strip_decorators
        self.known = known
        self.config_param = config_param
        self.class_stack: list[str] = []
        self.func_depth = 0

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.class_stack.append(node.name.value)

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        self.class_stack.pop()
        bases = []
        for arg in updated.bases:
            root = _cst_root(arg.value)
            if root in MODULE_BASES:
                arg = arg.with_changes(value=cst.parse_expression("nn.Module"))
            bases.append(arg)
        decorators = [d for d in updated.decorators
                      if _cst_root(d.decorator) not in self.strip_decorators]
        return updated.with_changes(bases=bases, decorators=decorators)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.func_depth += 1

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef
                          ) -> cst.FunctionDef:
        self.func_depth -= 1
        decorators = [d for d in updated.decorators
                      if _cst_root(d.decorator) not in self.strip_decorators]
        updated = updated.with_changes(decorators=decorators)
        if updated.returns is not None and not self._annotation_ok(updated.returns.annotation):
            updated = updated.with_changes(returns=None)
        in_model = bool(self.class_stack) and self.class_stack[-1] in ("Model", self.original)
        if in_model and updated.name.value == "forward":
            updated = _split_position_embeddings(updated)
        if in_model and updated.name.value == "__init__" and self.config_param:
            params = updated.params
            kept = [p for p in params.params if p.name.value != self.config_param]
            if kept and isinstance(params.star_arg, cst.MaybeSentinel) and not params.kwonly_params:
                kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            updated = updated.with_changes(params=params.with_changes(params=kept))
            body = list(updated.body.body)
            at = 1 if body and _is_docstring(body[0]) else 0
            body.insert(at, cst.parse_statement(f"{self.config_param} = ModelConfig()"))
            updated = updated.with_changes(body=updated.body.with_changes(body=body))
        return updated

    def leave_Param(self, original: cst.Param, updated: cst.Param) -> cst.Param:
        if updated.annotation is not None and not self._annotation_ok(
                updated.annotation.annotation):
            return updated.with_changes(annotation=None)
        return updated

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
        if updated.value == self.original:
            return updated.with_changes(value="Model")
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if isinstance(updated.func, cst.Name) and updated.func.value == "super" and updated.args:
            return updated.with_changes(args=[])
        return updated

    def _annotation_ok(self, expr: cst.BaseExpression) -> bool:
        names = {n.value for n in _cst_names(expr)}
        return all(n in self.known or n in _BUILTINS for n in names)


def _split_position_embeddings(fn: cst.FunctionDef) -> cst.FunctionDef:
    """`position_embeddings=(cos, sin)` becomes two tensor arguments, so inputs stay tensors."""
    params = list(fn.params.params)
    names = [p.name.value for p in params]
    if "position_embeddings" not in names or "cos" in names or "sin" in names:
        return fn
    param = params[names.index("position_embeddings")]
    ann = cst.Module([]).code_for_node(param.annotation.annotation) if param.annotation else ""
    body = cst.Module([]).code_for_node(fn.body)
    if not re.search(r"\btuple\b|\bTuple\b", ann) and not re.search(
            r"=\s*position_embeddings\b", body):
        return fn  # a positional-embedding tensor (DETR), not rotary (cos, sin)
    params = [p for p in params if p.name.value != "position_embeddings"]
    at = 0
    while at < len(params) and params[at].default is None:
        at += 1
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    new = [cst.Param(cst.Name("cos"), comma=comma), cst.Param(cst.Name("sin"), comma=comma)]
    params = [p.with_changes(comma=comma) for p in params[:at]] + new + params[at:]
    if isinstance(fn.params.star_kwarg, cst.MaybeSentinel) and isinstance(
            fn.params.star_arg, cst.MaybeSentinel) and not fn.params.kwonly_params:
        params[-1] = params[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    body = list(fn.body.body)
    at_body = 1 if body and _is_docstring(body[0]) else 0
    body.insert(at_body, cst.parse_statement("position_embeddings = (cos, sin)"))
    return fn.with_changes(params=fn.params.with_changes(params=params),
                           body=fn.body.with_changes(body=body))


def _cst_names(expr: cst.CSTNode) -> list[cst.Name]:
    out: list[cst.Name] = []

    class V(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            out.append(node)

        def visit_Attribute(self, node: cst.Attribute) -> bool:
            root = node
            while isinstance(root, cst.Attribute):
                root = root.value
            if isinstance(root, cst.Name):
                out.append(root)
            return False

        def visit_SimpleString(self, node: cst.SimpleString) -> None:
            try:  # string annotations: check their names too
                parsed = ast.parse(node.evaluated_value, mode="eval")
            except (SyntaxError, ValueError):
                return
            out.extend(cst.Name(n.id) for n in ast.walk(parsed) if isinstance(n, ast.Name))

    expr.visit(V())
    return out


def _cst_root(expr: cst.BaseExpression) -> str:
    while True:
        if isinstance(expr, cst.Call):
            expr = expr.func
        elif isinstance(expr, cst.Attribute | cst.Subscript):
            expr = expr.value
        else:
            break
    return expr.value if isinstance(expr, cst.Name) else ""


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, cst.SimpleString | cst.ConcatenatedString))


# --- entry point ------------------------------------------------------------------------------


def _params(fn: ast.FunctionDef | None) -> list[Param]:
    if fn is None:
        return []
    args = fn.args
    pos = [*args.posonlyargs, *args.args][1:]
    n_def = len(args.defaults)
    out = []
    for i, a in enumerate(pos):
        has = i >= len(pos) - n_def
        default = ast.unparse(args.defaults[i - (len(pos) - n_def)]) if has else ""
        out.append(Param(a.arg, ast.unparse(a.annotation) if a.annotation else "", has, default))
    for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        out.append(Param(a.arg, ast.unparse(a.annotation) if a.annotation else "", d is not None,
                         ast.unparse(d) if d is not None else ""))
    return out


def _method(info: _FileInfo, cls: ast.ClassDef, name: str, depth: int = 0
            ) -> ast.FunctionDef | None:
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == name:
            return stmt
    for base in cls.bases:
        b = info.bindings.get(_root_name(base))
        if b and b.kind == "def" and depth < 5:
            node = info.tree.body[b.index]
            if isinstance(node, ast.ClassDef):
                found = _method(info, node, name, depth + 1)
                if found is not None:
                    return found
    return None


def _is_module_class(info: _FileInfo, cls: ast.ClassDef, depth: int = 0) -> bool:
    for base in cls.bases:
        text = ast.unparse(base)
        root = _root_name(base)
        if root in MODULE_BASES or text.startswith(("nn.", "torch.nn.")) or text in (
                "Module", "Sequential", "ModuleList"):
            return True
        b = info.bindings.get(root)
        if b and b.kind == "def" and depth < 6:
            node = info.tree.body[b.index]
            if isinstance(node, ast.ClassDef) and _is_module_class(info, node, depth + 1):
                return True
        if b and b.kind == "from" and b.module.split(".")[0] == "torch":
            return True
    return False


def _has_torch_base(info: _FileInfo, cls: ast.ClassDef, depth: int = 0) -> bool:
    """True when forward comes from a torch.nn class (e.g. a subclass of nn.Conv2d)."""
    for base in cls.bases:
        text = ast.unparse(base)
        if text.startswith(("nn.", "torch.nn.")) and text not in ("nn.Module", "torch.nn.Module"):
            return True
        b = info.bindings.get(_root_name(base))
        if b and b.kind == "def" and depth < 6:
            node = info.tree.body[b.index]
            if isinstance(node, ast.ClassDef) and _has_torch_base(info, node, depth + 1):
                return True
    return False


def _config_fields(text: str, param: str) -> list[str]:
    fields = re.findall(rf"\b{re.escape(param)}\.([A-Za-z_]\w*)", text)
    fields += re.findall(rf"getattr\(\s*{re.escape(param)}\s*,\s*[\"'](\w+)[\"']", text)
    return sorted(set(fields) - {"get"})


def extract_class(code: str, class_name: str, path: str = "<file>",
                  resolver: Resolver | None = None) -> Extraction:
    """Standalone source for `class_name` of `code`, renamed `Model`; raises ExtractError."""
    try:
        info = _parse(path, code)
    except (SyntaxError, ValueError) as exc:
        raise ExtractError("syntax_error", f"{path}: {exc}") from None
    b = info.bindings.get(class_name)
    if b is None or b.kind != "def" or not isinstance(info.tree.body[b.index], ast.ClassDef):
        raise ExtractError("class_not_found", f"no top-level class {class_name} in {path}")
    cls = info.tree.body[b.index]
    bad = [_root_name(x) for x in cls.bases if _root_name(x) in REJECT_BASES
           or _root_name(x).endswith("PreTrainedModel")]
    if bad:
        raise ExtractError("pretrained_model", f"{class_name} derives from {bad[0]}")
    if not _is_module_class(info, cls):
        raise ExtractError("not_module", f"{class_name} is not an nn.Module subclass")
    collector = _Collector(resolver)
    collector.need(info, class_name, 0, path)
    closure = collector.closure
    init_fn = _method(info, cls, "__init__")
    fwd_fn = _method(info, cls, "forward")
    inherited_forward = False
    if fwd_fn is None:
        if not _has_torch_base(info, cls):
            raise ExtractError("no_forward", f"{class_name} has no forward()")
        inherited_forward = True
    init_params = _params(init_fn)
    config_param = None
    config_name = ""
    for p in init_params:
        if p.name == "config" or (p.name.endswith("_config") and not p.has_default) or \
                p.annotation.split(
                "|")[0].strip().strip("'\"").endswith("Config"):
            config_param = p.name
            config_name = p.annotation.split("|")[0].strip().strip("'\"")
            break
    parts: list[str] = []
    for path_i, idx in closure.stmts:
        finfo = collector.files[path_i]
        node = finfo.tree.body[idx]
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        parts.append("".join(finfo.lines[first - 1: node.end_lineno]).rstrip() + "\n")
    body_text = "\n\n".join(parts)
    config_values = None
    subs: dict[str, list[str]] = {}
    if config_param:
        fields = _config_fields(body_text, config_param)
        if not fields and "config" in body_text:
            fields = _config_fields(body_text, "config")
        defaults: dict[str, object] = {}
        ref = config_name or (closure.config_refs[0][1] if closure.config_refs else "")
        if not ref:
            ref = _guess_config_class(info, class_name)
        if ref:
            defaults = config_defaults(info, ref, resolver)
        config_values = small_config(defaults, fields)
        config_name = config_name or ref
        for sub, attr in re.findall(rf"\b{re.escape(config_param)}\.(\w+_config)\.(\w+)",
                                    body_text):
            subs.setdefault(sub, []).append(attr)
    header = ["import torch", "import torch.nn as nn"] + [
        i for i in closure.imports if i not in ("import torch", "import torch.nn as nn")]
    if any(i == "from torch import nn" for i in header):
        header.remove("import torch.nn as nn")
    text = "\n".join(header) + "\n\n\n"
    if closure.definitions:
        text += "\n\n\n".join(closure.definitions.values()) + "\n\n\n"
    if closure.shims:
        text += "\n\n\n".join(SHIMS[s] for s in closure.shims) + "\n\n\n"
    if config_values is not None:
        text += _config_source(config_name or "the config", config_values, subs) + "\n\n"
    text += body_text
    known = set(_BUILTINS) | set(collector.defined) | set(closure.shims) | set(
        closure.definitions) | {
        "ModelConfig", "Model", "torch", "nn"}
    for line in header:
        known.update(_import_names(line))
    strip: set[str] = set()
    for finfo in collector.files.values():
        strip |= {n for n in _all_decorator_roots(finfo) if _strip_decorator(finfo, ast.Name(n))}
    try:
        module = cst.parse_module(text)
        module = module.visit(_Rewrite(class_name, strip, known, config_param))
        out = module.code
    except cst.ParserSyntaxError as exc:
        raise ExtractError("syntax_error", f"rewritten {class_name}: {exc}") from None
    try:
        out, normalized = normalize_source(out)
    except NormalizeError as exc:
        raise ExtractError(exc.reason, f"{class_name}: {exc.detail}") from None
    fwd_params = [Param("input")] if inherited_forward else _params(fwd_fn)
    out_tree = ast.parse(out)
    model_node = next((n for n in out_tree.body if isinstance(n, ast.ClassDef)
                       and n.name == "Model"), None)
    if model_node is not None:
        own = next((n for n in model_node.body if isinstance(n, ast.FunctionDef)
                    and n.name == "forward"), None)
        if own is not None:
            fwd_params = _params(own)
    init_rest = [p for p in init_params if p.name != config_param]
    return Extraction(out, class_name, init_rest, fwd_params, config_values, config_name,
                      [f"{p}:{i}" for p, i in closure.stmts], closure.inlined, closure.shims,
                      normalized)


def _guess_config_class(info: _FileInfo, class_name: str) -> str:
    """The file's config import sharing the longest prefix with the class name."""
    names = [n for n in info.bindings if n.endswith("Config") and n[0].isupper()]

    def common(n: str) -> int:
        k = 0
        while k < min(len(n), len(class_name)) and n[k] == class_name[k]:
            k += 1
        return k

    return max(names, key=lambda n: (common(n), -len(n)), default="")


def _import_names(line: str) -> set[str]:
    node = ast.parse(line).body[0]
    if isinstance(node, ast.Import):
        return {a.asname or a.name.split(".")[0] for a in node.names}
    if isinstance(node, ast.ImportFrom):
        return {a.asname or a.name for a in node.names}
    return set()


@functools.lru_cache(maxsize=64)
def _all_decorator_roots(info: _FileInfo) -> frozenset[str]:
    roots = set()
    for node in ast.walk(info.tree):
        for d in getattr(node, "decorator_list", []):
            roots.add(_root_name(d))
    return frozenset(roots)
