import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = """
__global__ void bias_relu_kernel(const float* y, const float* b, float* out, int M, int N) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < M * N) out[i] = fmaxf(y[i] + b[i % N], 0.f);
}
torch::Tensor bias_relu_cuda(torch::Tensor y, torch::Tensor b) {
    auto yc = y.contiguous();
    auto out = torch::empty_like(yc);
    int M = yc.size(0), N = yc.size(1);
    bias_relu_kernel<<<(M * N + 255) / 256, 256>>>(yc.data_ptr<float>(), b.data_ptr<float>(),
                                                  out.data_ptr<float>(), M, N);
    return out;
}
"""

ext = load_inline(name='lin', cpp_sources="torch::Tensor bias_relu_cuda(torch::Tensor y, torch::Tensor b);", cuda_sources=src, functions=['bias_relu_cuda'], extra_cflags=[''], extra_ldflags=[''], verbose=True)

class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)
    def forward(self, x):
        y = torch.nn.functional.linear(x, self.fc.weight)
        return ext.bias_relu_cuda(y, self.fc.bias)
