import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_src = """
void relu_inplace(torch::Tensor x) {
    float* p = x.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) p[i] = p[i] > 0.f ? p[i] : 0.f;
}
"""

ext = load_inline("relu_ip", relu_src, functions=["relu_inplace"])

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        pass
    def forward(self, x):
        ext.relu_inplace(x)
        return x
