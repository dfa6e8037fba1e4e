import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

sm_src = """
#include <cmath>
torch::Tensor softmax_rows(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const int64_t rows = xc.size(0), cols = xc.size(1);
    const float* in = xc.data_ptr<float>(); float* o = out.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = in + r * cols; float* orow = o + r * cols;
        float mx = row[0];
        for (int64_t c = 1; c < cols; ++c) mx = row[c] > mx ? row[c] : mx;
        double sum = 0.0;
        for (int64_t c = 0; c < cols; ++c) { orow[c] = std::exp(row[c] - mx); sum += orow[c]; }
        for (int64_t c = 0; c < cols; ++c) orow[c] = static_cast<float>(orow[c] / sum);
    }
    return out;
}
"""

ext = load_inline(name='softmax_ext', cpp_sources=[sm_src, 'torch::Tensor softmax_rows(torch::Tensor x);'], functions=['softmax_rows'], extra_cflags=['-O2'])

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        pass
    def forward(self, x):
        return ext.softmax_rows(x.t().t().contiguous())
