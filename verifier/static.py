"""Stage 2, static checks on the candidate's Python and C++/CUDA source.

Every finding is `{rule, message, line, severity}`; `line` is a line of the candidate file (C++
lines are mapped through where the source literal sits in the Python file). Rules:
`torch_compute` (torch/F/nn compute in ModelNew's methods), `nn_layer` (an nn layer called in
forward), `try_fallback`, `reference_model` (subclassing, calling or importing `Model`),
`monkey_patch` (assigning attributes of torch/time/...), `threads_streams`, `precision_downgrade`,
`escape` (files, network, processes, ctypes, environment, introspection, torch._C),
`computed_attr` (attribute names computed at run time, getter functions: verifier.computed_names),
`reference_name` (a warning: a name only the reference defines, under the isolated namespace),
`cpp_torch_compute` (ATen/torch compute from C++), `compiler_flag` (flags outside an allowlist).
"""

from __future__ import annotations

import ast
import re
from typing import Any

from verifier.computed_names import check_computed
from verifier.cpp_hiding import hidden_forms, resolve_aliases
from verifier.extspec import ExtensionSpec
from verifier.namespace import HINT, reference_names_used

# torch.<name>(...) calls a forward may make: allocation, shapes, dtypes, grad mode.
TORCH_ALLOWED = frozenset({
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
    "full_like", "Size", "device", "no_grad", "inference_mode", "is_tensor", "numel",
    "is_floating_point", "get_default_dtype", "tensor", "as_tensor", "arange", "finfo", "iinfo",
    "result_type", "promote_types", "broadcast_shapes",
})
# Tensor methods that compute (the rest: views, shapes, pointers, copies are fine).
TENSOR_COMPUTE = frozenset({
    "relu", "relu_", "sigmoid", "tanh", "exp", "log", "sum", "mean", "max", "min", "amax",
    "amin", "softmax", "log_softmax", "matmul", "mm", "bmm", "addmm", "baddbmm", "mv", "dot",
    "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "pow", "sqrt", "rsqrt", "abs",
    "clamp", "clamp_", "clip", "norm", "var", "std", "prod", "cumsum", "cumprod", "argmax",
    "argmin", "sort", "topk", "where", "masked_fill", "gelu", "silu", "erf", "neg", "reciprocal",
    "sin", "cos", "floor", "ceil", "round", "sign", "logsumexp", "addcmul", "addcdiv", "lerp",
    "maximum", "minimum", "conv2d", "einsum", "outer", "square", "exp_", "sigmoid_", "tanh_",
    "layer_norm", "hardtanh", "leaky_relu", "elu", "softplus", "mish", "any", "all", "eq", "ne",
    "gt", "lt", "ge", "le", "fmod", "remainder", "scatter", "gather", "index_select",
    "scatter_add", "bernoulli", "log1p", "expm1", "tril", "triu", "flip", "roll", "diff",
    "unique", "cross", "kron", "tensordot",
})
ESCAPE_MODULES = frozenset({
    "os", "sys", "subprocess", "socket", "ctypes", "cffi", "shutil", "pathlib", "io", "urllib",
    "http", "requests", "multiprocessing", "threading", "asyncio", "concurrent", "signal",
    "importlib", "inspect", "gc", "builtins", "pickle", "marshal", "tempfile", "glob", "pty",
    "fcntl", "mmap", "resource", "code", "runpy", "pdb", "traceback", "atexit", "weakref",
    "posix", "nt", "_posixsubprocess", "socketserver", "selectors", "select", "ssl", "_socket",
    "_thread", "_signal", "_ctypes", "faulthandler", "zipimport", "telnetlib", "ftplib",
    "smtplib", "xmlrpc", "termios", "_io", "sysconfig", "types", "ptrace",
})
# Attributes that reach the OS, the interpreter or the harness from any object (torch.os,
# torch.sys, np.ctypes, frame walking): the module denylist means nothing without them.
ESCAPE_ATTRS = frozenset({
    "os", "sys", "ctypes", "subprocess", "builtins", "importlib", "posix", "socket", "gc",
    "inspect", "signal", "multiprocessing", "_getframe", "_current_frames", "f_back", "f_locals",
    "f_globals", "f_builtins", "gi_frame", "cr_frame", "tb_frame", "tb_next", "modules",
    "_C", "CDLL", "cdll", "pythonapi", "environ", "system", "popen", "fork", "forkpty", "kill",
    "killpg", "setsid", "unshare", "setns", "ptrace", "execv", "execve", "spawnv", "dlopen",
    "settrace", "setprofile", "_exit", "currentframe", "getouterframes", "getinnerframes",
    "get_referrers", "get_referents", "get_objects", "ag_frame",
    # the dispatch-mode stack and the profiler: what the verifier's trace of forward sees
    "_python_dispatch", "_disable_current_modes", "_pop_mode", "_pop_mode_temporarily",
    "_push_mode", "_get_current_dispatch_mode", "_get_current_dispatch_mode_stack",
    "_len_torch_dispatch_stack", "_DisableTorchDispatch", "_disable_profiler",
    "_disable_profiler_legacy", "_disable_dynamo",
})
# Compute outside torch, in the candidate's process, where no dispatcher trace sees it: the
# libraries, and the ways a tensor's memory reaches them without importing anything.
FOREIGN_LIBRARIES = frozenset({"numpy", "scipy", "numba", "jax", "jaxlib", "cupy", "tensorflow",
                               "sklearn", "cv2", "mpmath", "pandas", "polars", "numexpr"})
FOREIGN_ATTRS = frozenset({"numpy", "np", "_np", "__array__", "__array_interface__",
                           "__array_struct__", "__dlpack__"})  # np: torch.storage.np, F.np
# Dunder attributes that reach globals, frames, classes or lookups by string from any object.
INTROSPECTION = frozenset({
    "__subclasses__", "__globals__", "__code__", "__closure__", "__builtins__", "__dict__",
    "__class__", "__bases__", "__mro__", "__self__", "__traceback__", "__getattribute__",
    "__getattr__", "__func__", "__wrapped__",
})
# nn.Module's own methods named like an escape attribute: `self.modules()` is the module tree,
# `sys.modules` a dict that is never called, so only the called form is the nn.Module API.
MODULE_API = frozenset({"modules"})
ESCAPE_CALLS = frozenset({"open", "exec", "eval", "compile", "__import__", "globals", "locals",
                          "vars", "setattr", "delattr", "breakpoint", "input", "memoryview"})
PATCHABLE = frozenset({"torch", "time", "F", "nn", "np", "numpy", "threading", "builtins", "sys",
                       "os", "math", "functional", "cpp_extension"})
REFERENCE_MODULES = frozenset({"reference", "ks_reference", "task", "__main__", "model"})
LOW_PRECISION = re.compile(r"\b(float16|half|bfloat16|__half|__nv_bfloat16|kHalf|kBFloat16|"
                           r"at::Half|c10::Half|at::BFloat16|c10::BFloat16|kFloat16)\b")
_CPP_TORCH = re.compile(r"\b(at|torch)::((?:\w+::)*)(\w+)\s*(\(|<)")
CPP_TORCH_ALLOWED = frozenset({
    "empty", "empty_like", "zeros", "zeros_like", "ones", "ones_like", "full", "empty_strided",
    "from_blob", "Tensor", "TensorOptions", "device", "dtype", "IntArrayRef", "Scalar",
    "ScalarType", "Device", "get_num_threads", "parallel_for", "Half", "BFloat16",
    "getCurrentCUDAStream", "CUDAGuard", "OptionalCUDAGuard", "make_tuple", "tensor", "arange",
    "check", "checkAll", "TensorArg", "autocast", "CheckedFrom", "Generator", "optional",
    "musa", "cuda", "getCurrentMUSAStream", "MUSAGuard", "OptionalMUSAGuard", "elementSize",
    "typeMetaToScalarType", "toString", "isFloatingType", "DeviceGuard", "NoGradGuard",
    "irange", "divup", "ceil_div", "TensorIterator", "acc_type", "kFloat", "kInt", "kLong",
    "clone",  # a copy, not compute (as x.clone())
})
CPP_TENSOR_COMPUTE = re.compile(
    r"\.\s*(matmul|mm|bmm|addmm|conv2d|relu|relu_|sigmoid|tanh|softmax|log_softmax|sum|mean|"
    r"exp|log|pow|sqrt|rsqrt|clamp|max|min|amax|norm|var|std|mul|add|sub|div|mul_|add_|sub_|"
    r"div_|gelu|silu|layer_norm|batch_norm|linear|einsum|cumsum|argmax|topk|sort|where|"
    r"index_select|gather|scatter|baddbmm)\s*\(")
CPP_ESCAPES = re.compile(
    r"(?<![.>])\b(fopen|freopen|ifstream|ofstream|fstream|popen|system|fork|vfork|execv|"
    r"execve|execvp|execl|execlp|socket|connect|dlopen|dlsym|getenv|setenv|syscall|ptrace|unlink|remove|"
    r"mmap|open|creat|kill|std::filesystem)\s*\(|#\s*include\s*[<\"](fstream|filesystem|"
    r"sys/socket\.h|unistd\.h|dlfcn\.h|sys/syscall\.h|sys/mman\.h|netinet/in\.h|"
    r"sys/ptrace\.h|spawn\.h)[>\"]|#\s*include\s*\"(/|[^\"]*\.\.)|\b__asm__\b|\basm\s*\(|"
    r"\b(__asm|asm)\b|\.incbin\b|#\s*include\s*(<\s*/|<[^>]*\.\.|[^\s<\"])|#\s*embed\b|"
    r"\b(openat|openat2|fork|clone3|unshare|setns|prctl|setrlimit|prlimit|raise|signal|"
    r"sigaction|setsid|setuid|setgid|pidfd_open|process_vm_writev|process_vm_readv|"
    r"getauxval|__builtin_frame_address)\s*\(|"
    r"\bPy(Run|Import|Eval|Sys|Code|Frame|Thread|GILState|CFunction|Module_GetDict|"
    r"Object_SetAttr|Object_GetAttr|Object_Call|Dict_SetItem|Marshal|Interpreter)\w*|"
    r"\bml_meth\b|\b(py|pybind11)::(exec|eval|eval_file|module_::import|module::import|"
    r"globals|dict\s*\(\s*\)\s*\[)|\bstd::system\b")
# clone(2), the syscall that makes processes, but not a tensor's clone: a method call
# (`x.clone()`, `p->clone()`) or torch's own (`torch::clone(`, `at::clone(`) is the tensor copy
# (group 1 set); any other `clone(`, `::clone(`, `&clone`, and a `using` or `#define` naming a
# bare clone (a way to re-export the syscall under torch's name) are the syscall.
CPP_CLONE = re.compile(
    r"(\.|->|\b(?:torch|at|Tensor)\s*::)?\s*\bclone\b(?=\s*\()|&\s*(?:::\s*)?clone\b|"
    r"\busing\b[^;]*\bclone\b|#\s*define\b[^\n]*(?<![.>:\w])clone\b")
CPP_THREADS = re.compile(
    r"\b(std::thread|std::async|std::jthread|pthread_create|cudaStreamCreate\w*|"
    r"getStreamFromPool|musaStreamCreate\w*|cudaLaunchHostFunc)\b")
_FLAG_OK = re.compile(
    r"^(-O[0-3sfg]?|-Ofast|-fopenmp|-lgomp|-lm|-march=native|-mtune=native|-ffast-math|"
    r"-funroll-loops|-fno-\w[\w-]*|-f(tree-vectorize|strict-aliasing|omit-frame-pointer)|"
    r"-std=(c|gnu)\+\+(14|17|20)|-D\w+(=[\w.]*)?|-U\w+|-w|-W[\w-]+(=\w+)?|-m(avx\w*|fma|"
    r"sse\w*|f16c|bmi2?|popcnt|arch=[\w-]+)|-g|--use_fast_math|-use_fast_math|"
    r"--expt-relaxed-constexpr|--expt-extended-lambda|-lineinfo|-Xptxas=?[-\w,=]*|"
    r"-arch=sm_\d+a?|-gencode=?[\w,=]*|--ptxas-options=[-\w,=]*|-maxrregcount=\d+|"
    r"-Xcompiler=?-?[\w,=-]*|-lcublas|-lcuda|-lcudart|-lmusa\w*|-res-usage)$")


def _finding(rule: str, message: str, line: int | None) -> dict[str, Any]:
    return {"rule": rule, "message": message, "line": line, "severity": "error"}


def _seen(rule: str, node: ast.AST, message: str) -> dict[str, Any]:
    """A finding whose message names the line and the source text seen there."""
    text = ast.unparse(node)
    text = text if len(text) <= 80 else text[:77] + "..."
    return _finding(rule, f"line {node.lineno}: {text}: {message}", node.lineno)


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _own_attribute(call: ast.Call) -> bool:
    """`setattr(self..., name, v)` / `delattr(self..., name)`: nn.Module code registering its own
    attributes (`setattr(self, f"conv{i}", ...)`), unless the name is a dunder."""
    if _dotted(call.func) not in ("setattr", "delattr") or not call.args:
        return False
    name = call.args[1] if len(call.args) > 1 else None
    dunder = isinstance(name, ast.Constant) and str(name.value).startswith("__")
    return _dotted(call.args[0]).split(".")[0] == "self" and not dunder


def _task_is_low_precision(task_source: str) -> bool:
    return bool(re.search(r"\b(float16|half|bfloat16)\b", task_source))


# nn layers that compute nothing in eval (Dropout is the identity there; Flatten is a view):
# never findings; if one does compute (training-mode dropout), the dispatcher trace sees it.
NO_COMPUTE_LAYERS = frozenset({
    "Parameter", "ParameterList", "ParameterDict", "Module", "ModuleList", "ModuleDict",
    "Identity", "BufferList", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout",
    "FeatureAlphaDropout", "Flatten", "Unflatten",
})
_DROPOUT_FNS = frozenset({"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                          "feature_alpha_dropout"})


def _torch_fn_computes(name: str) -> bool:
    """torch.<name> / F.<name> computes when the aten op of that name is compute by torch's
    own metadata (verifier.fallback.op_kind); views, copies (cat, flatten), allocations and
    names with no aten op of their own are left to the dispatcher trace."""
    if name in TORCH_ALLOWED or name in _DROPOUT_FNS:
        return False
    import torch

    from verifier.fallback import _functional_kind, is_fallback

    if not hasattr(torch.ops.aten, name):
        return False
    return is_fallback(_functional_kind(name))


def _is_aten_op(name: str) -> bool:
    import torch

    return hasattr(torch.ops.aten, name)


def _layer_attrs(cls: ast.ClassDef) -> dict[str, str]:
    """self.<attr> = nn.<Layer>(...) assignments of the class (parameter holders aside)."""
    out = {}
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            fn = _dotted(node.value.func)
            if fn.startswith(("nn.", "torch.nn.")) and fn.split(".")[-1] not in \
                    NO_COMPUTE_LAYERS:
                for t in node.targets:
                    if isinstance(t, ast.Attribute) and _dotted(t.value) == "self":
                        out[t.attr] = fn
    return out


# Build settings a candidate may put in its environment, as torch's cpp_extension reads them
# (the verifier builds for the device it runs on and ignores their values).
BUILD_ENV = frozenset({"TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "TORCH_EXTENSIONS_DIR"})


def _build_env_nodes(tree: ast.Module) -> set[int]:
    """ids of the nodes of `os.environ[K] = <str>` / `os.environ.setdefault(K, <str>)` with K a
    build setting, and of `import os` when os is used for nothing else."""
    ok: set[int] = set()
    for node in ast.walk(tree):
        key = val = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                node.targets[0], ast.Subscript) and _dotted(node.targets[0].value) == \
                "os.environ":
            key, val = node.targets[0].slice, node.value
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and _dotted(
                node.value.func) == "os.environ.setdefault" and len(node.value.args) == 2:
            key, val = node.value.args
        if isinstance(key, ast.Constant) and key.value in BUILD_ENV and isinstance(
                val, ast.Constant) and isinstance(val.value, str):
            ok.update(id(n) for n in ast.walk(node))
    uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "os"]
    if uses and all(id(n) in ok for n in uses):
        ok.update(id(n) for n in ast.walk(tree) if isinstance(n, ast.Import)
                  and [a.name for a in n.names] == ["os"] and n.names[0].asname is None)
    return ok


def check_python(tree: ast.Module, task_source: str, namespace: str = "isolated"
                 ) -> list[dict[str, Any]]:
    """Findings on the candidate's Python source; `namespace` is VerifyOptions.namespace (under
    kernelbench the reference's names are the candidate's too)."""
    out: list[dict[str, Any]] = []
    if namespace == "isolated":  # a warning: the NameError it leads to is the verdict
        out += [{"rule": "reference_name", "message": HINT.format(name=name), "line": line,
                 "severity": "warning"}
                for name, line in reference_names_used(tree, task_source).items()]
    build_env = _build_env_nodes(tree)
    low_ok = _task_is_low_precision(task_source)
    model_new = next((n for n in tree.body if isinstance(n, ast.ClassDef)
                      and n.name == "ModelNew"), None)
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        if id(node) in build_env:
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""])
            for name in names:
                root = name.split(".")[0]
                if root in ESCAPE_MODULES:
                    rule = "threads_streams" if root in ("threading", "multiprocessing",
                                                         "concurrent", "asyncio") else "escape"
                    out.append(_seen(rule, node, f"imports {name}"))
                if root in FOREIGN_LIBRARIES:
                    out.append(_seen("foreign_library", node, f"imports {name}: compute "
                                     "outside torch that no trace of forward sees"))
                hidden = sorted(ESCAPE_ATTRS.intersection(name.split(".")[1:]))
                if hidden:  # `from torch.utils._python_dispatch import ...`
                    out.append(_seen("escape", node, f"imports {name} ({hidden[0]}: the "
                                                     "dispatcher or the interpreter)"))
                if root in REFERENCE_MODULES:
                    out.append(_finding("reference_model", f"imports {name} (the reference)",
                                        node.lineno))
            if isinstance(node, ast.ImportFrom) and node.module and any(
                    a.name in ESCAPE_ATTRS for a in node.names):
                out.append(_seen("escape", node, "imports a name of the dispatcher or the "
                                                 "interpreter"))
            if isinstance(node, ast.ImportFrom) and any(a.name == "Model" for a in node.names):
                out.append(_finding("reference_model", "imports the reference Model",
                                    node.lineno))
        elif isinstance(node, ast.Name) and node.id == "Model":
            out.append(_finding("reference_model", "uses the reference Model", node.lineno))
        elif isinstance(node, ast.Name) and node.id in ("__builtins__", "__loader__", "__spec__"):
            out.append(_seen("escape", node, f"accesses {node.id}"))
        elif isinstance(node, ast.Attribute) and node.attr in ESCAPE_ATTRS and not (
                node.attr == "_C" and _dotted(node) in ("torch._C",)) and not (
                node.attr in MODULE_API and id(node) in called):
            out.append(_seen("escape", node, f"reaches .{node.attr} (the OS, the interpreter "
                                             "or the harness)"))
        elif isinstance(node, ast.Attribute) and node.attr in FOREIGN_ATTRS:
            out.append(_seen("foreign_library", node, f"reaches .{node.attr} (numpy, or a "
                                                      "tensor's memory handed to it: compute "
                                                      "outside torch)"))
        elif isinstance(node, ast.Attribute) and node.attr in INTROSPECTION:
            out.append(_seen("escape", node, f"introspection through {node.attr}"))
        elif isinstance(node, ast.Call):
            fn = _dotted(node.func)
            if fn in ESCAPE_CALLS and not _own_attribute(node):
                out.append(_seen("escape", node, f"calls {fn}()"))
            elif fn.split(".")[0] in ("os", "sys") or fn in ("torch.load", "torch.save"):
                out.append(_seen("escape", node, f"calls {fn}()"))
            if fn.endswith(("cuda.Stream", "cuda.stream", "musa.Stream", "musa.stream")) or \
                    fn.endswith(("Thread", "Process", "ThreadPoolExecutor")):
                out.append(_finding("threads_streams", f"creates {fn}", node.lineno))
            if fn.split(".")[-1] in ("half", "bfloat16") and not low_ok and isinstance(
                    node.func, ast.Attribute):
                out.append(_finding("precision_downgrade",
                                    f".{fn.split('.')[-1]}() in an fp32 task", node.lineno))
            if fn in ("torch.set_default_dtype", "torch.set_float32_matmul_precision",
                      "torch.set_num_threads", "torch._C._set_dispatch_mode") or fn.startswith(
                    ("torch._C.", "torch.utils._python_dispatch", "torch._dynamo")):
                out.append(_seen("monkey_patch", node, f"calls {fn}"))
        elif isinstance(node, ast.Attribute) and _dotted(node) in (
                "os.environ", "sys.modules", "torch.backends"):
            out.append(_seen("escape", node, f"accesses {_dotted(node)}"))
        elif isinstance(node, ast.Attribute) and node.attr in ("float16", "half", "bfloat16") \
                and _dotted(node).startswith("torch.") and not low_ok:
            out.append(_finding("precision_downgrade", f"uses {_dotted(node)} in an fp32 task",
                                node.lineno))
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                d = _dotted(t) if isinstance(t, ast.Attribute) else ""
                if d and d.split(".")[0] in PATCHABLE:
                    out.append(_seen("monkey_patch", node, f"assigns {d}"))
        if isinstance(node, ast.Try | ast.TryStar) and model_new is not None and any(
                node is n for n in ast.walk(model_new)):
            out.append(_finding("try_fallback", "try/except in ModelNew (a fallback path)",
                                node.lineno))
    out += check_computed(tree, model_new)
    if model_new is not None:
        ext_names = {t.id for n in tree.body if isinstance(n, ast.Assign)
                     and isinstance(n.value, ast.Call)
                     and _dotted(n.value.func).split(".")[-1] in ("load_inline", "load")
                     for t in n.targets if isinstance(t, ast.Name)}
        out += _check_model_new(model_new, ext_names)
    return _dedupe(out)


def _check_model_new(cls: ast.ClassDef, ext_names: set[str]) -> list[dict[str, Any]]:
    out = []
    for base in cls.bases:
        if _dotted(base).split(".")[-1] == "Model":
            out.append(_finding("reference_model", "ModelNew subclasses the reference Model",
                                cls.lineno))
    layers = _layer_attrs(cls)
    for fn in cls.body:
        if not isinstance(fn, ast.FunctionDef) or fn.name == "__init__":
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                out.append(_finding("torch_compute", "the @ operator computes with torch",
                                    node.lineno))
            if not isinstance(node, ast.Call):
                continue
            name = _dotted(node.func)
            head, _, last = name.rpartition(".")
            if head in ("torch", "torch.nn.functional", "F", "torch.special", "torch.linalg",
                        "torch.fft") and (head != "torch" and head not in ("F",
                                                                         "torch.nn.functional")
                                          or _torch_fn_computes(last)):
                out.append(_finding("torch_compute", f"{name}() computes with torch in "
                                                     f"ModelNew.{fn.name}", node.lineno))
            elif head == "self" and last in layers:
                out.append(_finding("nn_layer", f"self.{last} ({layers[last]}) is called in "
                                                f"ModelNew.{fn.name}", node.lineno))
            elif isinstance(node.func, ast.Attribute) and last in TENSOR_COMPUTE and \
                    not head.startswith(("self.", "torch")) and head != "self" and \
                    head not in ext_names:
                out.append(_finding("torch_compute", f".{last}() computes with torch in "
                                                     f"ModelNew.{fn.name}", node.lineno))
    return out


def _dedupe(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen, out = set(), []
    for f in findings:
        k = (f["rule"], f["message"], f["line"])
        if k not in seen:
            seen.add(k)
            out.append(f)
    return out


def _strip_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)


def _flag_ok(flag: str) -> bool:
    """On the allowlist; a flag nvcc hands to the host compiler (-Xcompiler a,b) only when
    each flag it hands over is (-fplugin=, -B, -specs= there read files too)."""
    m = re.fullmatch(r"(?:-Xcompiler|--compiler-options)=?(.*)", flag)
    if m:
        return all(_FLAG_OK.match(f) for f in m.group(1).split(",") if f) and bool(m.group(1))
    return bool(_FLAG_OK.match(flag))


def check_cpp(specs: list[ExtensionSpec], code: str, task_source: str) -> list[dict[str, Any]]:
    """Findings on the C++/CUDA sources and flags of the candidate's extensions."""
    from verifier.build import _source_line
    from verifier.build import scan as scan_directives

    out: list[dict[str, Any]] = []
    low_ok = _task_is_low_precision(task_source)
    for spec in specs:
        for flag in [*spec.extra_cflags, *spec.extra_cuda_cflags, *spec.extra_ldflags]:
            if not _flag_ok(flag.strip()):
                out.append(_finding("compiler_flag", f"compiler/linker flag {flag!r} is not "
                                                     "allowed", spec.line or None))
        if spec.extra_include_paths:
            out.append(_finding("compiler_flag", "extra_include_paths are not allowed",
                                spec.line or None))
        for src in [*spec.cpp_sources, *spec.cuda_sources]:
            base = _source_line(code, src)
            clean = resolve_aliases(_strip_comments(src))  # `namespace K = at;` -> at::
            # what the preprocessor sees (digraphs, splices, macro operands), not the raw text
            for reason in scan_directives(src).reject:
                out.append(_finding("build_file_access", reason, base or spec.line or None))

            def line_of(pos: int, _clean: str = clean, _base: int = base,
                        _call: int = spec.line) -> int | None:
                return _base + _clean.count("\n", 0, pos) if _base else (_call or None)

            for m in _CPP_TORCH.finditer(clean):
                ns, name = m.group(2), m.group(3)
                if ns.startswith(("native::", "nn::functional::", "linalg::", "special::",
                                  "fft::")) or (name not in CPP_TORCH_ALLOWED
                                                and not ns.startswith(("cuda::", "musa::"))):
                    out.append(_finding("cpp_torch_compute",
                                        f"{m.group(1)}::{ns}{name} computes with ATen from C++",
                                        line_of(m.start())))
            for m in CPP_TENSOR_COMPUTE.finditer(clean):
                out.append(_finding("cpp_torch_compute", f"tensor method .{m.group(1)}() "
                                                         "computes with ATen from C++",
                                    line_of(m.start())))
            for m in CPP_ESCAPES.finditer(clean):
                out.append(_finding("escape", f"{m.group(0).strip()} (file/process/network "
                                              "access from C++)", line_of(m.start())))
            for rule, message, pos in hidden_forms(clean, CPP_TORCH_ALLOWED, _is_aten_op):
                out.append(_finding(rule, message, line_of(pos)))
            for m in CPP_CLONE.finditer(clean):
                if not m.group(1):
                    out.append(_finding("escape", f"{m.group(0).strip()} (the clone syscall: "
                                                  "process creation from C++)",
                                        line_of(m.start())))
            for m in CPP_THREADS.finditer(clean):
                out.append(_finding("threads_streams", f"{m.group(1)} in C++",
                                    line_of(m.start())))
            if not low_ok:
                for m in LOW_PRECISION.finditer(clean):
                    out.append(_finding("precision_downgrade", f"{m.group(1)} in an fp32 task",
                                        line_of(m.start())))
    return _dedupe(out)
