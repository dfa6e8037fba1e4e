"""CUDA -> MUSA porting from the mapping table (verifier.backends.musa_port)."""

from __future__ import annotations

import ast

from verifier.backends.musa_port import (
    mu_filename,
    musa_task_variant,
    port_candidate_to_musa,
    port_cuda_to_musa,
)

KERNEL = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include "helpers.cuh"

__global__ void relu_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = __shfl_xor_sync(0xffffffff, x[i], 1);
    if (i < n) y[i] = v > 0.f ? v : 0.f;
}

torch::Tensor relu_cuda(torch::Tensor x) {
    const at::cuda::OptionalCUDAGuard guard(x.device());
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    float* tmp;
    cudaMalloc(&tmp, 16);
    cudaMemcpyAsync(tmp, x.data_ptr<float>(), 16, cudaMemcpyDeviceToDevice, stream);
    auto y = torch::empty_like(x);
    relu_kernel<<<1, 256, 0, stream>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, cudaGetErrorString(err));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    cudaFree(tmp);
    int my_cudaMalloc_count = 0;
    return y;
}
"""


def test_headers_are_mapped_to_musa_and_torch_musa():
    out = port_cuda_to_musa(KERNEL)
    assert "#include <musa_runtime.h>" in out
    assert "#include <musa_fp16.h>" in out
    assert '#include "torch_musa/csrc/aten/musa/MUSAContext.h"' in out
    assert '#include "torch_musa/csrc/core/MUSAGuard.h"' in out
    assert '#include "helpers.muh"' in out
    assert "cuda_runtime.h" not in out and "CUDAContext.h" not in out
    assert "#include <torch/extension.h>" in out  # torch's own headers stay


def test_runtime_calls_types_and_torch_helpers_are_renamed():
    out = port_cuda_to_musa(KERNEL)
    for musa in ("musaStream_t", "musaMalloc(", "musaMemcpyAsync(", "musaMemcpyDeviceToDevice",
                 "musaError_t", "musaGetLastError()", "musaSuccess", "musaGetErrorString",
                 "musaFree(", "at::musa::getCurrentMUSAStream()", "at::musa::OptionalMUSAGuard",
                 "C10_MUSA_KERNEL_LAUNCH_CHECK"):
        assert musa in out, musa
    assert "cudaMalloc(" not in out and "cudaStream_t" not in out


def test_cuda_programming_model_and_user_identifiers_are_kept():
    out = port_cuda_to_musa(KERNEL)
    # MUSA keeps __global__, <<<>>>, warp shuffles; user names are untouched.
    assert "__global__ void relu_kernel" in out
    assert "<<<1, 256, 0, stream>>>" in out
    assert "__shfl_xor_sync" in out
    assert "torch::Tensor relu_cuda(torch::Tensor x)" in out  # the bound function keeps its name
    assert "my_cudaMalloc_count" in out  # word boundaries: not a runtime call


def test_longest_match_first_for_library_names():
    src = "cublasHandle_t h; cublasCreate(&h); cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T);"
    out = port_cuda_to_musa(src)
    assert out == "mublasHandle_t h; mublasCreate(&h); mublasSgemm(h, MUBLAS_OP_N, MUBLAS_OP_T);"


def test_bf16_types_and_device_type():
    out = port_cuda_to_musa("__nv_bfloat16 a; nv_bfloat162 b; auto d = at::kCUDA;")
    assert out == "__mt_bfloat16 a; __mt_bfloat162 b; auto d = at::kPrivateUse1;"


CANDIDATE = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = """
#include <torch/extension.h>
#include <cuda_runtime.h>
__global__ void k(float* y) { y[0] = 1.f; }
torch::Tensor cuda_fill(torch::Tensor y) { cudaDeviceSynchronize(); k<<<1, 1>>>(y.data_ptr<float>()); return y; }
"""
ext = load_inline(name="fill", cpp_sources="torch::Tensor cuda_fill(torch::Tensor y);",
                  cuda_sources=src, functions=["cuda_fill"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def forward(self, x):
        torch.cuda.synchronize()
        return ext.cuda_fill(torch.empty(4, device="cuda"))
'''


def test_candidate_port_switches_builder_sources_and_device():
    out = port_candidate_to_musa(CANDIDATE)
    ast.parse(out)  # still valid Python
    assert "from torch_musa.utils.musa_extension import load_inline" in out
    assert "import torch_musa" in out
    assert "musa_sources=src" in out and "cuda_sources" not in out
    assert "extra_musa_cflags=" in out
    assert "torch.musa.synchronize()" in out
    assert 'device="musa"' in out
    assert "#include <musa_runtime.h>" in out and "musaDeviceSynchronize()" in out
    # the bound function name appears in C++ and in functions=[...]: both unchanged
    assert out.count("cuda_fill") == CANDIDATE.count("cuda_fill")


TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(16, 16, device="cuda")]


def get_init_inputs():
    return []
'''


def test_task_variant_targets_the_musa_device_and_imports_torch_musa():
    out = musa_task_variant(TASK)
    tree = ast.parse(out)
    imports = [n for n in tree.body if isinstance(n, ast.Import)]
    assert any(a.name == "torch_musa" for n in imports for a in n.names)
    assert 'device="musa"' in out and '"cuda"' not in out
    # a device-neutral task is left as it was (the verifier moves tensors to the device)
    plain = TASK.replace(', device="cuda"', "")
    assert musa_task_variant(plain) == plain


def test_mu_filenames():
    assert mu_filename("kernel.cu") == "kernel.mu"
    assert mu_filename("common.cuh") == "common.muh"
    assert mu_filename("bind.cpp") == "bind.cpp"
