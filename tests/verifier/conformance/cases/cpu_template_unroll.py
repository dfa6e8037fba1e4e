import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_src = """
template <typename T>
struct ReluOp {
    static inline T apply(T v) { return v > T(0) ? v : T(0); }
};

template <typename T, int UNROLL>
void relu_loop(const T* in, T* out, int64_t n) {
    int64_t i = 0;
    for (; i + UNROLL <= n; i += UNROLL) {
#pragma GCC unroll 4
        for (int k = 0; k < UNROLL; ++k) out[i + k] = ReluOp<T>::apply(in[i + k]);
    }
    for (; i < n; ++i) out[i] = ReluOp<T>::apply(in[i]);
}

torch::Tensor relu_forward(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    relu_loop<float, 4>(xc.data_ptr<float>(), out.data_ptr<float>(), xc.numel());
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
