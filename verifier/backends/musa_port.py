"""Port CUDA kernel sources and KernelBench task files to MUSA (Moore Threads) from a mapping table.

torch_musa's own JIT builder (`torch_musa.utils.musa_extension.load_inline(..., musa_sources=...)`)
compiles `.mu` sources with mcc; MUSA keeps CUDA's programming model (`__global__`, `<<<>>>`,
`__shfl_*_sync`, shared memory), so porting is a renaming of headers, runtime calls, library
handles (cuBLAS -> muBLAS, ...) and PyTorch's CUDA helpers (at::cuda -> at::musa). Identifiers are
replaced on word boundaries so `my_cudaMalloc_wrapper` is left alone, longest names first so
`cudaMemcpyAsync` is not split by `cudaMemcpy`.
"""

from __future__ import annotations

import ast
import re

from verifier import pyast

# Whole `#include` lines first: PyTorch's CUDA headers live elsewhere in torch_musa.
INCLUDE_MAP: dict[str, str] = {
    "ATen/cuda/CUDAContext.h": "torch_musa/csrc/aten/musa/MUSAContext.h",
    "ATen/cuda/Exceptions.h": "torch_musa/csrc/aten/musa/Exceptions.h",
    "ATen/cuda/Atomic.cuh": "torch_musa/share/generated_cuda_compatible/include/ATen/musa/Atomic.muh",
    "ATen/cuda/CUDADataType.h": "torch_musa/csrc/aten/musa/MUSADtype.muh",
    "c10/cuda/CUDAGuard.h": "torch_musa/csrc/core/MUSAGuard.h",
    "c10/cuda/CUDAStream.h": "torch_musa/csrc/core/MUSAStream.h",
    "c10/cuda/CUDAException.h": "torch_musa/csrc/core/MUSAException.h",
    "cuda_runtime.h": "musa_runtime.h",
    "cuda_runtime_api.h": "musa_runtime_api.h",
    "cuda.h": "musa.h",
    "cuda_fp16.h": "musa_fp16.h",
    "cuda_bf16.h": "musa_bf16.h",
    "cuda_fp8.h": "musa_fp8.h",
    "cublas_v2.h": "mublas.h",
    "cublas.h": "mublas.h",
    "curand_kernel.h": "murand_kernel.h",
    "cooperative_groups.h": "cooperative_groups.h",
}

# Identifier renames (word-boundary matches). Runtime API calls follow one rule (cudaX -> musaX,
# see _RUNTIME_PREFIX); this table holds everything that does not.
IDENTIFIER_MAP: dict[str, str] = {
    # PyTorch's CUDA helpers
    "getCurrentCUDAStream": "getCurrentMUSAStream",
    "getDefaultCUDAStream": "getDefaultMUSAStream",
    "getStreamFromPool": "getStreamFromPool",
    "CUDAStream": "MUSAStream",
    "CUDAGuard": "MUSAGuard",
    "OptionalCUDAGuard": "OptionalMUSAGuard",
    "CUDAStreamGuard": "MUSAStreamGuard",
    "CUDAEvent": "MUSAEvent",
    "getCurrentDeviceProperties": "getCurrentDeviceProperties",
    "C10_CUDA_KERNEL_LAUNCH_CHECK": "C10_MUSA_KERNEL_LAUNCH_CHECK",
    "C10_CUDA_CHECK": "C10_MUSA_CHECK",
    "AT_CUDA_CHECK": "C10_MUSA_CHECK",
    "kCUDA": "kPrivateUse1",
    # bfloat16 / fp8 types
    "__nv_bfloat16": "__mt_bfloat16",
    "__nv_bfloat162": "__mt_bfloat162",
    "nv_bfloat16": "__mt_bfloat16",
    "nv_bfloat162": "__mt_bfloat162",
    "__nv_fp8_e4m3": "__mt_fp8_e4m3",
    "__nv_fp8_e5m2": "__mt_fp8_e5m2",
    # libraries
    "cublasHandle_t": "mublasHandle_t",
    "cublasStatus_t": "mublasStatus_t",
    "cublasCreate": "mublasCreate",
    "cublasDestroy": "mublasDestroy",
    "cublasSetStream": "mublasSetStream",
    "cublasSgemm": "mublasSgemm",
    "cublasHgemm": "mublasHgemm",
    "cublasGemmEx": "mublasGemmEx",
    "cublasSgemmStridedBatched": "mublasSgemmStridedBatched",
    "CUBLAS_OP_N": "MUBLAS_OP_N",
    "CUBLAS_OP_T": "MUBLAS_OP_T",
    "CUBLAS_STATUS_SUCCESS": "MUBLAS_STATUS_SUCCESS",
    "getCurrentCUDABlasHandle": "getCurrentMUSABlasHandle",
    "curandState": "murandState",
    "curandStatePhilox4_32_10_t": "murandStatePhilox4_32_10_t",
    "curand_init": "murand_init",
    "curand_uniform": "murand_uniform",
    "curand_normal": "murand_normal",
    "cudnnHandle_t": "mudnnHandle_t",
}

# Namespace and qualified-name renames (plain substring; they contain `::`).
NAMESPACE_MAP: dict[str, str] = {
    "at::cuda::": "at::musa::",
    "c10::cuda::": "c10::musa::",
    "torch::cuda::": "torch::musa::",
    "at::DeviceType::CUDA": "at::DeviceType::PrivateUse1",
    "c10::DeviceType::CUDA": "c10::DeviceType::PrivateUse1",
    "thrust::cuda::": "thrust::musa::",
}

# Runtime API: cudaMalloc, cudaStream_t, cudaSuccess, cudaMemcpyHostToDevice, ... -> musa*.
_RUNTIME_PREFIX = re.compile(r"\bcuda(?=[A-Z])")
_INCLUDE_LINE = re.compile(r'^(\s*#\s*include\s*)([<"])([^>"]+)([>"])', re.MULTILINE)
_CUH_INCLUDE = re.compile(r"\.cuh\b")


def _port_include(match: re.Match[str]) -> str:
    prefix, _open, path, _close = match.groups()
    if path in INCLUDE_MAP:
        new = INCLUDE_MAP[path]
        # torch_musa's headers are found through its include root, like other project headers.
        return f'{prefix}"{new}"' if new.startswith("torch_musa/") else f"{prefix}<{new}>"
    if path.startswith("c10/cuda/"):
        return f"{prefix}<c10/musa/{path[len('c10/cuda/'):].replace('CUDA', 'MUSA')}>"
    return match.group(0)


def port_cuda_to_musa(source: str) -> str:
    """Return `source` (CUDA C++) with headers, runtime calls and torch helpers renamed for MUSA."""
    out = _INCLUDE_LINE.sub(_port_include, source)
    out = _CUH_INCLUDE.sub(".muh", out)
    for old, new in NAMESPACE_MAP.items():
        out = out.replace(old, new)
    names = sorted(IDENTIFIER_MAP, key=len, reverse=True)
    pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in names) + r")\b")
    out = pattern.sub(lambda m: IDENTIFIER_MAP[m.group(1)], out)
    out = _RUNTIME_PREFIX.sub("musa", out)
    return out


# Python-side renames for a candidate or task file (device strings, torch.cuda.*, the builder).
_PY_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"from torch\.utils\.cpp_extension import load_inline"),
     "import torch_musa\nfrom torch_musa.utils.musa_extension import load_inline"),
    (re.compile(r"\bcuda_sources\s*="), "musa_sources="),
    (re.compile(r"\bextra_cuda_cflags\s*="), "extra_musa_cflags="),
    (re.compile(r"\btorch\.cuda\."), "torch.musa."),
    (re.compile(r"\.cuda\(\)"), ".musa()"),
    (re.compile(r"""(["'])cuda(:\d+)?\1"""), r"\1musa\2\1"),
    (re.compile(r"\bdevice\s*=\s*torch\.device\(\s*(['\"])cuda"), r"device=torch.device(\1musa"),
]


def _port_python(text: str) -> str:
    for pattern, repl in _PY_RULES:
        text = pattern.sub(repl, text)
    return text


def port_candidate_to_musa(candidate_source: str) -> str:
    """Port a KernelBench-form CUDA candidate (Python + load_inline strings) to torch_musa."""
    ported_strings = _port_string_literals(candidate_source)
    return _port_python(ported_strings)


def _port_string_literals(source: str) -> str:
    """Apply port_cuda_to_musa inside string literals that look like C++ (keeps Python intact)."""
    try:
        tree = pyast.parse(source)
    except SyntaxError:
        return port_cuda_to_musa(source)
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    spans: list[tuple[int, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _looks_like_cxx(
                node.value) and node.end_lineno is not None and node.end_col_offset is not None:
            start = offsets[node.lineno - 1] + _char_col(lines[node.lineno - 1], node.col_offset)
            end = offsets[node.end_lineno - 1] + _char_col(lines[node.end_lineno - 1],
                                                           node.end_col_offset)
            spans.append((start, end))
    out = source
    for start, end in sorted(spans, reverse=True):
        out = out[:start] + port_cuda_to_musa(out[start:end]) + out[end:]
    return out


def _char_col(line: str, byte_col: int) -> int:
    return len(line.encode("utf-8")[:byte_col].decode("utf-8", "replace"))


def _looks_like_cxx(text: str) -> bool:
    return any(tok in text for tok in ("#include", "__global__", "<<<", "cuda", "torch::Tensor"))


def musa_task_variant(task_source: str) -> str:
    """Return the MUSA variant of a KernelBench task file: tensors are created on the musa device."""
    text = _port_python(task_source)
    if "torch_musa" not in text and "musa" in text:
        # torch.musa and the 'musa' device exist only once torch_musa is imported.
        text = _insert_after_imports(text, "import torch_musa  # noqa: F401  (registers 'musa')\n")
    return text


def _insert_after_imports(text: str, line: str) -> str:
    try:
        tree = pyast.parse(text)
    except SyntaxError:
        return line + text
    last = 0
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            last = node.end_lineno or node.lineno
        elif last:
            break
    lines = text.splitlines(keepends=True)
    return "".join(lines[:last]) + line + "".join(lines[last:])


def mu_filename(cu_name: str) -> str:
    """`kernel.cu` -> `kernel.mu`, `x.cuh` -> `x.muh` (mcc picks the language from the suffix)."""
    if cu_name.endswith(".cuh"):
        return cu_name[:-4] + ".muh"
    if cu_name.endswith(".cu"):
        return cu_name[:-3] + ".mu"
    return cu_name
