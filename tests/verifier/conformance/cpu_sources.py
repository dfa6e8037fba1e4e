"""C++ sources and tasks of the conformance corpus's CPU cases (see make_corpus.py)."""

# --- CPU kernels (C++) -------------------------------------------------------------------------
CPU_RELU_DEF = r'''
torch::Tensor relu_forward(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const int64_t n = xc.numel();
    for (int64_t i = 0; i < n; ++i) o[i] = in[i] > 0.f ? in[i] : 0.f;
    return out;
}
'''
CPU_RELU_DECL = "torch::Tensor relu_forward(torch::Tensor x);"
CPU_RELU_TEMPLATE = r'''
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
'''
CPU_RELU_OMP = CPU_RELU_DEF.replace("    for (int64_t i = 0;",
                                    "    #pragma omp parallel for\n    for (int64_t i = 0;")
CPU_RELU_INPLACE = r'''
void relu_inplace(torch::Tensor x) {
    float* p = x.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) p[i] = p[i] > 0.f ? p[i] : 0.f;
}
'''
CPU_RELU_ATEN = r'''
torch::Tensor relu_forward(torch::Tensor x) { return at::relu(x); }
'''
CPU_SCALE_DEF = r'''
torch::Tensor scale_forward(torch::Tensor x, double s) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t i = 0; i < xc.numel(); ++i) o[i] = in[i] * static_cast<float>(s);
    return out;
}
'''
CPU_LINEAR_DEF = r'''
torch::Tensor linear_relu(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
    auto xc = x.contiguous(); auto wc = w.contiguous(); auto bc = b.contiguous();
    const int64_t n = xc.size(0), k = xc.size(1), m = wc.size(0);
    auto out = torch::empty({n, m}, xc.options());
    const float* X = xc.data_ptr<float>(); const float* W = wc.data_ptr<float>();
    const float* B = bc.data_ptr<float>(); float* O = out.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < m; ++j) {
            float acc = B[j];
            for (int64_t t = 0; t < k; ++t) acc += X[i * k + t] * W[j * k + t];
            O[i * m + j] = acc > 0.f ? acc : 0.f;
        }
    return out;
}
'''
CPU_LINEAR_DECL = "torch::Tensor linear_relu(torch::Tensor x, torch::Tensor w, torch::Tensor b);"
CPU_BIAS_RELU = r'''
torch::Tensor bias_relu(torch::Tensor y, torch::Tensor b) {
    auto yc = y.contiguous();
    auto out = torch::empty_like(yc);
    const int64_t n = yc.size(0), m = yc.size(1);
    const float* Y = yc.data_ptr<float>(); const float* B = b.data_ptr<float>();
    float* O = out.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < m; ++j) { float v = Y[i * m + j] + B[j]; O[i * m + j] = v > 0 ? v : 0; }
    return out;
}
'''
CPU_SOFTMAX_DEF = r'''
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
'''
CPU_SOFTMAX_DECL = "torch::Tensor softmax_rows(torch::Tensor x);"

TASKS = {
    "relu": '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(16, 1024)]


def get_init_inputs():
    return []
''',
    "linear": '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(self.fc(x))


def get_inputs():
    return [torch.randn(8, 64)]


def get_init_inputs():
    return [64, 32]
''',
    "softmax": '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(32, 512)]


def get_init_inputs():
    return []
''',
    "relu_fp16": '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(64, 4096, dtype=torch.float16)]


def get_init_inputs():
    return []
''',
}
