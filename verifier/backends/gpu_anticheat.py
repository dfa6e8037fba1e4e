"""GPU anti-cheat: which kernels does `ModelNew.forward` launch? Library or ATen kernels = fallback.

torch.profiler lists every kernel a call launches, also those launched from C++ (an `at::matmul`
inside an extension shows up as a cuBLAS `..._gemm_...`/`nvjet_...` kernel). A kernel is the
candidate's own when its base name is one of the `__global__` functions in the candidate's
sources; fills and copies (from `torch::zeros`, `.contiguous()`) are allowed; cuBLAS, cuDNN,
CUTLASS, Triton (torch.compile) and ATen-native kernels mean the candidate fell back to a library.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

_GLOBAL_FN = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?"
                        r"(?:static\s+|inline\s+|__forceinline__\s+)*void\s+"
                        r"(?:__launch_bounds__\s*\([^)]*\)\s*)?([A-Za-z_]\w*)")

# Allowed: memory traffic the allocation/view allowlist implies.
_ALLOWED = re.compile(r"^(Memset|Memcpy)|FillFunctor|fill_kernel|direct_copy_kernel|copy_kernel"
                      r"|CatArrayBatchedCopy", re.IGNORECASE)

# Namespaced library kernels: a candidate cannot whitelist these by naming its kernel alike.
_STRONG_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("cublas", re.compile(r"cublas|nvjet|xmma|cutlass::|splitKreduce|mublas", re.I)),
    ("cudnn", re.compile(r"cudnn|mudnn", re.I)),
    ("triton", re.compile(r"^triton_", re.I)),
    ("aten", re.compile(r"at::native::|at_cuda_detail|\bat::", re.I)),
    ("cub", re.compile(r"^(void )?(cub|thrust)::", re.I)),
]
_WEAK_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("cublas", re.compile(r"gemm|gemv|cutlass", re.I)),
    ("cudnn", re.compile(r"implicit_convolve|winograd|fprop|dgrad|wgrad|conv2d_", re.I)),
    ("aten", re.compile(r"cunn_|reduce_kernel|elementwise_kernel|softmax_warp|SoftMax"
                        r"|layer_norm|batch_norm|index_elementwise", re.I)),
]


@dataclass
class KernelFinding:
    """One launched kernel that is not the candidate's own code."""

    kernel: str
    category: str  # cublas | cudnn | triton | aten | cub | unknown

    def as_finding(self) -> dict[str, Any]:
        severity = "error" if self.category != "unknown" else "warning"
        return {"rule": f"gpu_fallback_{self.category}", "severity": severity, "line": None,
                "message": f"forward launched a {self.category} kernel: {self.kernel[:160]}"}


def candidate_kernel_names(sources: Iterable[str]) -> set[str]:
    """Names of the `__global__` functions defined in the candidate's C++/CUDA sources."""
    names: set[str] = set()
    for src in sources:
        names.update(_GLOBAL_FN.findall(src))
    return names


def kernel_base_name(kernel: str) -> str:
    """`void ns::relu_kernel<float>(float const*, int)` -> `relu_kernel`."""
    head = kernel.split("(", 1)[0].strip()
    depth, out = 0, []
    for ch in head:  # drop template arguments, which may contain spaces and '::'
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    head = "".join(out).strip()
    head = head.split()[-1] if head.split() else head
    return head.rsplit("::", 1)[-1]


def classify_kernel(kernel: str, own: set[str]) -> str | None:
    """None when the kernel is allowed (own code, fill/copy), else its library category."""
    if _ALLOWED.search(kernel):
        return None
    for category, pattern in _STRONG_PATTERNS:
        if pattern.search(kernel):
            return category
    if kernel_base_name(kernel) in own:
        return None
    for category, pattern in _WEAK_PATTERNS:
        if pattern.search(kernel):
            return category
    return "unknown"


def launched_kernels(fn: Callable[..., Any], args: Sequence[Any],
                     device: torch.device | str = "cuda") -> list[str]:
    """Names of the device kernels (and memcpy/memset) launched by one `fn(*args)` call."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    kind = torch.device(device).type
    if kind == "cuda":
        activities.append(ProfilerActivity.CUDA)
    elif kind != "cpu" and hasattr(ProfilerActivity, "PrivateUse1"):  # musa is PrivateUse1
        activities.append(ProfilerActivity.PrivateUse1)
    with torch.no_grad(), profile(activities=activities) as prof:
        fn(*args)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
    names: list[str] = []
    for evt in prof.events():
        dtype = getattr(evt, "device_type", None)
        if dtype is not None and dtype != torch.autograd.DeviceType.CPU:
            names.append(evt.name)
    return list(dict.fromkeys(names))


def fallback_findings(kernels: Iterable[str], own: set[str]) -> list[KernelFinding]:
    """The launched kernels that are not the candidate's own or allowed memory traffic."""
    out: list[KernelFinding] = []
    for name in kernels:
        category = classify_kernel(name, own)
        if category is not None:
            out.append(KernelFinding(name, category))
    return out
