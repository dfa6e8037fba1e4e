"""The static checks' tables: which torch calls a forward may make, which modules, attributes
and calls reach the OS, the interpreter or the harness, which C++ forms are compute, escapes or
threads, and which compiler flags a candidate may pass (`verifier.checks.static` applies them,
`verifier.checks.computed_names` too)."""

from __future__ import annotations

import re

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
CPP_TORCH = re.compile(r"\b(at|torch)::((?:\w+::)*)(\w+)\s*(\(|<)")
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
FLAG_OK = re.compile(
    r"^(-O[0-3sfg]?|-Ofast|-fopenmp|-lgomp|-lm|-march=native|-mtune=native|-ffast-math|"
    r"-funroll-loops|-fno-\w[\w-]*|-f(tree-vectorize|strict-aliasing|omit-frame-pointer)|"
    r"-std=(c|gnu)\+\+(14|17|20)|-D\w+(=[\w.]*)?|-U\w+|-w|-W[\w-]+(=\w+)?|-m(avx\w*|fma|"
    r"sse\w*|f16c|bmi2?|popcnt|arch=[\w-]+)|-g|--use_fast_math|-use_fast_math|"
    r"--expt-relaxed-constexpr|--expt-extended-lambda|-lineinfo|-Xptxas=?[-\w,=]*|"
    r"-arch=sm_\d+a?|-gencode=?[\w,=]*|--ptxas-options=[-\w,=]*|-maxrregcount=\d+|"
    r"-Xcompiler=?-?[\w,=-]*|-lcublas|-lcuda|-lcudart|-lmusa\w*|-res-usage)$")


# nn layers that compute nothing in eval (Dropout is the identity there; Flatten is a view):
# never findings; if one does compute (training-mode dropout), the dispatcher trace sees it.
NO_COMPUTE_LAYERS = frozenset({
    "Parameter", "ParameterList", "ParameterDict", "Module", "ModuleList", "ModuleDict",
    "Identity", "BufferList", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout",
    "FeatureAlphaDropout", "Flatten", "Unflatten",
})
DROPOUT_FNS = frozenset({"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                          "feature_alpha_dropout"})


def torch_fn_computes(name: str) -> bool:
    """torch.<name> / F.<name> computes when the aten op of that name is compute by torch's
    own metadata (verifier.checks.fallback.op_kind); views, copies (cat, flatten), allocations and
    names with no aten op of their own are left to the dispatcher trace."""
    if name in TORCH_ALLOWED or name in DROPOUT_FNS:
        return False
    import torch

    from verifier.checks.fallback import functional_kind, is_fallback

    if not hasattr(torch.ops.aten, name):
        return False
    return is_fallback(functional_kind(name))


def is_aten_op(name: str) -> bool:
    """Whether torch has an aten op of that name."""
    import torch

    return hasattr(torch.ops.aten, name)


# Build settings a candidate may put in its environment, as torch's cpp_extension reads them
# (the verifier builds for the device it runs on and ignores their values).
BUILD_ENV = frozenset({"TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "TORCH_EXTENSIONS_DIR"})
