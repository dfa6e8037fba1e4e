import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_src = """
torch::Tensor relu_forward(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const int64_t n = xc.numel();
    for (int64_t i = 0; i < n; ++i) o[i] = in[i] > 0.f ? in[i] : 0.1f * in[i];
    return out;
}
"""

ext = load_inline(name="relu_ext", cpp_sources=relu_src, functions=["relu_forward"], extra_cflags=["-O3"], verbose=False)

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        pass
    def forward(self, x):
        return ext.relu_forward(x)
