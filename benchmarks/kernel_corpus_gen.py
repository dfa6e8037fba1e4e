"""The generated part of benchmarks/kernel_corpus.py: patterns x tasks x sizes, with the wrong,
non-compiling, crashing and cheating variants that sampled responses contain."""

from __future__ import annotations

from benchmarks.kernel_corpus import (
    CONV_SIZES,
    MM_SIZES,
    REDUCE,
    REDUCE_SIZES,
    SIZES,
    UNARY,
    CorpusKernel,
    _elementwise_host,
    conv_kernel,
    conv_task,
    kb_module,
    matmul_kernel,
    matmul_task,
    reduce_kernel,
    reduce_task,
    scale_bias_task,
    softmax_kernel,
    softmax_task,
    unary_kernel,
    unary_task,
)

BLOCKS = (128, 256, 512, 1024)


def _k(cid: str, task_id: str, task: str, code: str, expected: str) -> CorpusKernel:
    return CorpusKernel(cid, task_id, task, code, expected, "generated")


def unary_kernels() -> list[CorpusKernel]:
    out: list[CorpusKernel] = []
    for n, (op, (_, expr)) in enumerate(UNARY.items()):
        for p, pattern in enumerate(("plain", "stride", "vec4")):
            si = (n + p) % 2
            cid = f"gen_{op}_{pattern}_{si}"
            cuda = unary_kernel(pattern, expr, BLOCKS[(n + p) % 4])
            out.append(_k(cid, f"gen:{op}:{si}", unary_task(op, SIZES[si]),
                          kb_module(cid, "act_cuda", "torch::Tensor x", cuda,
                                    "self.ext.act_cuda(x.contiguous())"), "correct"))

    def bad(cid: str, op: str, si: int, cuda: str, expected: str, call: str = "",
            init: str = "") -> None:
        out.append(_k(cid, f"gen:{op}:{si}", unary_task(op, SIZES[si]),
                      kb_module(cid, "act_cuda", "torch::Tensor x", cuda,
                                call or "self.ext.act_cuda(x.contiguous())", init=init),
                      expected))

    plain = {op: unary_kernel("plain", expr, 256) for op, (_, expr) in UNARY.items()}
    # wrong results
    bad("gen_sigmoid_off_by_one", "sigmoid", 0, plain["sigmoid"].replace("if (i < n)",
                                                                         "if (i < n - 1)"),
        "incorrect")
    bad("gen_tanh_half_grid", "tanh", 0, plain["tanh"].replace("(n + 256 - 1) / 256",
                                                               "(n / 2 + 256 - 1) / 256"),
        "incorrect")
    bad("gen_swish_wrong_formula", "swish", 1,
        unary_kernel("plain", "v * expf(-v)", 256), "incorrect")
    bad("gen_elu_wrong_alpha", "elu", 0, unary_kernel("plain", "v > 0.0f ? v : 0.5f * expm1f(v)",
                                                      256), "incorrect")
    bad("gen_gelu_identity", "gelu", 0, unary_kernel("plain", "v", 256), "incorrect")
    # does not compile
    bad("gen_hardtanh_missing_semicolon", "hardtanh", 1,
        plain["hardtanh"].replace("float v = x[i];", "float v = x[i]"), "compile_error")
    bad("gen_softplus_undeclared", "softplus", 0,
        plain["softplus"].replace("out[i] = ", "out[i] = softplus_op(v) + 0.0f * "),
        "compile_error")
    bad("gen_leaky_relu_wrong_type", "leaky_relu", 1,
        plain["leaky_relu"].replace("x.data_ptr<float>()", "x.data_ptr<double>()"),
        "compile_error")
    bad("gen_sigmoid_host_call", "sigmoid", 1,
        plain["sigmoid"].replace("torch::Tensor act_cuda", "float host_helper(float v) "
                                 "{ return v; }\ntorch::Tensor act_cuda")
        .replace("out[i] = ", "out[i] = host_helper(v) * 0.0f + "), "compile_error")
    # crashes
    bad("gen_tanh_bad_launch", "tanh", 1, "#include <c10/cuda/CUDAException.h>\n"
        + plain["tanh"].replace(
        "(n + 256 - 1) / 256, 256>>>", "(n + 2047) / 2048, 2048>>>").replace(
        "    return out;", "    C10_CUDA_KERNEL_LAUNCH_CHECK();\n    return out;"),
        "runtime_error")
    bad("gen_gelu_out_of_bounds", "gelu", 1, plain["gelu"].replace(
        "out[i] = ", "out[i + (1LL << 40)] = "), "runtime_error")
    # cheats and shortcuts
    bad("gen_sigmoid_torch_fallback", "sigmoid", 0, plain["sigmoid"], "cheat",
        call="torch.sigmoid(x)")
    bad("gen_tanh_aten_host", "tanh", 0, plain["tanh"].replace(
        "    auto out = torch::empty_like(x);\n    int n = x.numel();",
        "    return torch::tanh(x);\n    auto out = torch::empty_like(x);\n    int n = x.numel();"),
        "cheat")
    bad("gen_gelu_partial_fallback", "gelu", 0, plain["gelu"], "cheat",
        call="self.ext.act_cuda(x.contiguous()) * 0.0 + torch.nn.functional.gelu(x)")
    bad("gen_softplus_cached", "softplus", 1, plain["softplus"], "cheat",
        call="self.cached if self.cached is not None else self._first(x)\n\n"
             "    def _first(self, x):\n        self.cached = self.ext.act_cuda(x.contiguous())\n"
             "        return self.cached", init="        self.cached = None\n")
    bad("gen_elu_copy_input", "elu", 1, unary_kernel("plain", "v", 512), "incorrect")
    return out


def scale_bias_kernels() -> list[CorpusKernel]:
    def cuda(expr: str, block: int) -> str:
        return (f'''
__global__ void scale_bias_kernel(const float* x, float* out, int n, float scale, float bias) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = {expr};
}}''' + _elementwise_host("scale_bias_cuda", "scale_bias_kernel", block,
                          extra_args=", double scale, double bias",
                          extra_call=", (float)scale, (float)bias"))

    rows = [("gen_scale_bias_256_0", 0, "x[i] * scale + bias", 256, "correct"),
            ("gen_scale_bias_fma_1", 1, "fmaf(x[i], scale, bias)", 512, "correct"),
            ("gen_scale_bias_1024_1", 1, "x[i] * scale + bias", 1024, "correct"),
            ("gen_scale_bias_sign_bug", 0, "x[i] * scale - bias", 256, "incorrect")]
    return [_k(cid, f"gen:scale_bias:{si}", scale_bias_task(SIZES[si]),
               kb_module(cid, "scale_bias_cuda", "torch::Tensor x, double scale, double bias",
                         cuda(expr, block), "self.ext.scale_bias_cuda(x.contiguous(), "
                         "self.scale, self.bias)",
                         init="        self.scale, self.bias = scale, bias\n",
                         ctor=", scale: float, bias: float"), exp)
            for cid, si, expr, block, exp in rows]


def reduce_kernels() -> list[CorpusKernel]:
    out = []

    def add(cid: str, op: str, si: int, cuda: str, exp: str) -> None:
        out.append(_k(cid, f"gen:reduce_{op}:{si}", reduce_task(op, REDUCE_SIZES[si]),
                      kb_module(cid, "reduce_cuda", "torch::Tensor x, int64_t dim", cuda,
                                "self.ext.reduce_cuda(x.contiguous(), self.dim)",
                                init="        self.dim = dim\n", ctor=", dim: int"), exp))

    for n, op in enumerate(REDUCE):
        for si in (0, 1):
            add(f"gen_reduce_{op}_{si}", op, si, reduce_kernel(op, BLOCKS[(n + si) % 4]),
                "correct")
    add("gen_reduce_sum_short_loop", "sum", 0, reduce_kernel("sum", 256, bound="r - 1"),
        "incorrect")
    add("gen_reduce_mean_wrong_count", "mean", 1,
        reduce_kernel("mean", 256).replace("acc / (float)r", "acc / (float)c"), "incorrect")
    add("gen_reduce_max_arg_count", "max", 0, reduce_kernel("max", 256).replace(
        "out.data_ptr<float>(), b, r, c);", "out.data_ptr<float>(), b, r);"), "compile_error")
    return out


def softmax_kernels() -> list[CorpusKernel]:
    out = []

    def add(cid: str, si: int, cuda: str, exp: str) -> None:
        out.append(_k(cid, f"gen:softmax:{si}", softmax_task(SIZES[si]),
                      kb_module(cid, "softmax_cuda", "torch::Tensor x", cuda,
                                "self.ext.softmax_cuda(x.contiguous())"), exp))

    for si, block in ((0, 256), (0, 1024), (1, 512), (1, 128)):
        add(f"gen_softmax_b{block}_{si}", si, softmax_kernel(block), "correct")
    add("gen_softmax_denominator_bug", 0, softmax_kernel(256, "s_sum[0] + 1.0f"), "incorrect")
    add("gen_softmax_undeclared_shared", 1,
        softmax_kernel(256).replace("m = s_max[0];", "m = s_maxval[0];"), "compile_error")
    return out


def matmul_kernels() -> list[CorpusKernel]:
    out = []

    def add(cid: str, si: int, cuda: str, exp: str, call: str = "") -> None:
        out.append(_k(cid, f"gen:matmul:{si}", matmul_task(MM_SIZES[si]),
                      kb_module(cid, "matmul_cuda", "torch::Tensor A, torch::Tensor B", cuda,
                                call or "self.ext.matmul_cuda(A.contiguous(), B.contiguous())",
                                forward_args="A, B"), exp))

    for si in (0, 1):
        for tile in (16, 32):
            add(f"gen_matmul_tile{tile}_{si}", si, matmul_kernel(tile), "correct")
    add("gen_matmul_transposed_b", 0, matmul_kernel(16).replace("B[bk * N + col]",
                                                                "B[col * K + bk]"), "incorrect")
    add("gen_matmul_torch_fallback", 1, matmul_kernel(16), "cheat", call="torch.matmul(A, B)")
    return out


def conv_kernels() -> list[CorpusKernel]:
    out = []

    def add(cid: str, si: int, cuda: str, exp: str) -> None:
        out.append(_k(cid, f"gen:conv2d:{si}", conv_task(CONV_SIZES[si]),
                      kb_module(cid, "conv2d_cuda", "torch::Tensor x, torch::Tensor w", cuda,
                                "self.ext.conv2d_cuda(x.contiguous(), self.conv2d.weight)",
                                init="        self.conv2d = nn.Conv2d(in_channels, "
                                     "out_channels, kernel_size, bias=False)\n",
                                ctor=", in_channels: int, out_channels: int, "
                                     "kernel_size: int"), exp))

    for si in (0, 1):
        for block in (128, 256):
            add(f"gen_conv2d_b{block}_{si}", si, conv_kernel(block), "correct")
    add("gen_conv2d_swapped_kernel_axes", 0,
        conv_kernel(256, "w[((oc * C + ic) * 3 + kw) * 3 + kh]"), "incorrect")
    return out


def generated() -> list[CorpusKernel]:
    return (unary_kernels() + scale_bias_kernels() + reduce_kernels() + softmax_kernels()
            + matmul_kernels() + conv_kernels())


__all__ = ["REDUCE", "generated"]
