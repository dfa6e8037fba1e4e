import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_src = """
void relu_into(torch::Tensor x, torch::Tensor o) {
    float* p = o.data_ptr<float>(); o.copy_(x);
    for (int64_t i = 0; i < x.numel(); ++i) p[i] = p[i] > 0.f ? p[i] : 0.f;
}
"""

ext = load_inline("relu_into", relu_src, functions=["relu_into"])

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        pass
    def forward(self, x):
        out = torch.zeros_like(x)
        ext.relu_into(x, out)
        return out
