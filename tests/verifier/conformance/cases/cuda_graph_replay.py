import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_source = """
#include <c10/cuda/CUDAStream.h>
__global__ void relu_gs(const float* x, float* y, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        y[i] = x[i] > 0.f ? x[i] : 0.f;
}
torch::Tensor relu_cuda(torch::Tensor x) {
    auto out = torch::empty_like(x);
    int n = x.numel();
    relu_gs<<<80, 512, 0, at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(),
                                                                 out.data_ptr<float>(), n);
    return out;
}
"""

relu_cpp_source = "torch::Tensor relu_cuda(torch::Tensor x);"

ext = load_inline(
    name="elementwise_relu",
    cpp_sources=relu_cpp_source,
    cuda_sources=relu_source,
    functions=["relu_cuda"],
    verbose=True,
    extra_cflags=[""],
    extra_ldflags=[""],
)

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.graph = None
    def forward(self, x):
        if self.graph is None or self.static_in.shape != x.shape:
            self.static_in = x.clone()
            ext.relu_cuda(self.static_in)
            torch.cuda.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.static_out = ext.relu_cuda(self.static_in)
        self.static_in.copy_(x)
        self.graph.replay()
        return self.static_out.clone()
