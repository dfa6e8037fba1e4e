"""The KernelBench problems of the corpus (main branch, large sizes) and how each is solved.

Each Problem names its file under KernelBench/, ModelNew's constructor (the reference's
signature, the same submodules so state dicts match) and the family-specific recipe that
benchmarks/kernelbench_corpus/__init__.py turns into candidates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from benchmarks.kernelbench_corpus import kernels as K
from benchmarks.kernelbench_corpus import spatial as S


@dataclass
class Problem:
    file: str
    key: str  # short, C-identifier-safe
    family: str  # unary | rows | matmul | pool | fused
    init: str = ""  # ModelNew.__init__ parameters after self (", a, b=1")
    body: str = ""  # ModelNew.__init__ lines after super().__init__()
    fwd_args: str = "x"
    spec: dict[str, Any] = field(default_factory=dict)

    @property
    def level(self) -> int:
        return int(self.file.split("/")[0].removeprefix("level"))


GELU = "0.5f * {a} * (1.f + erff({a} * 0.70710678118654752f))"
SOFTPLUS = "({a} > 20.f ? {a} : log1pf(expf({a})))"
MISH = "([](float a) {{ float s = a > 20.f ? a : log1pf(expf(a)); return a * tanhf(s); }})"


def _u(file: str, key: str, expr: str, wrong: str, torch: str, *, init: str = "",
       body: str = "", nparams: int = 0, args: str = "", crash: bool = False,
       hang: bool = False, fwd_args: str = "x", x: str = "x") -> Problem:
    return Problem(file, key, "unary", init, body, fwd_args, dict(
        expr=expr, wrong=wrong, torch=torch, nparams=nparams, args=args, crash=crash, hang=hang,
        x=x))


UNARY = [
    _u("level1/19_ReLU.py", "relu", "fmaxf(v, 0.f)", "fmaxf(v, 0.f) * 0.5f", "torch.relu(x)",
       crash=True, hang=True),
    _u("level1/20_LeakyReLU.py", "lrelu", "v > 0.f ? v : v * p0", "v > 0.f ? v * p0 : v",
       "F.leaky_relu(x, self.negative_slope)", init=", negative_slope: float = 0.01",
       body="self.negative_slope = negative_slope", nparams=1, args=", self.negative_slope"),
    _u("level1/21_Sigmoid.py", "sigm", "1.f / (1.f + expf(-v))", "1.f / (1.f + expf(v))",
       "torch.sigmoid(x)", crash=True),
    _u("level1/22_Tanh.py", "tanh", "tanhf(v)", "tanhf(v) * 0.99f", "torch.tanh(x)"),
    _u("level1/25_Swish.py", "swish", "v / (1.f + expf(-v))", "v / (1.f + expf(v))",
       "x * torch.sigmoid(x)", hang=True),
    _u("level1/26_GELU_.py", "gelu", GELU.format(a="v"), "0.5f * v * (1.f + erff(v))",
       "F.gelu(x)", crash=True),
    _u("level1/27_SELU_.py", "selu",
       "1.0507009873554805f * (v > 0.f ? v : 1.6732632423543772f * expm1f(v))",
       "1.0507009873554805f * v", "torch.selu(x)"),
    _u("level1/28_HardSigmoid.py", "hsig", "fminf(fmaxf(v / 6.f + 0.5f, 0.f), 1.f)",
       "fminf(fmaxf(v / 3.f + 0.5f, 0.f), 1.f)", "F.hardsigmoid(x)"),
    _u("level1/29_Softplus.py", "splus", SOFTPLUS.format(a="v"), "logf(1.f + v)",
       "F.softplus(x)", hang=True),
    _u("level1/30_Softsign.py", "ssign", "v / (1.f + fabsf(v))", "v / (1.f + v * v)",
       "x / (1 + torch.abs(x))", crash=True),
    _u("level1/31_ELU.py", "elu", "v > 0.f ? v : p0 * expm1f(v)", "v > 0.f ? v * p0 * 0.5f : v",
       "F.elu(x, alpha=self.alpha)", init=", alpha: float = 1.0", body="self.alpha = alpha",
       nparams=1, args=", self.alpha"),
    _u("level1/32_HardTanh.py", "htanh", "fminf(fmaxf(v, -1.f), 1.f)",
       "fminf(fmaxf(v, -1.f), 0.5f)", "F.hardtanh(x, min_val=-1.0, max_val=1.0)"),
    _u("level1/5_Matrix_scalar_multiplication.py", "smul", "v * p0", "v + p0", "A * s",
       nparams=1, args=", s", fwd_args="A, s", x="A", crash=True),
    _u("level1/88_MinGPTNewGelu.py", "ngelu",
       "0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)))",
       "0.5f * v * (1.f + tanhf(0.7978845608028654f * v))",
       "0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))"),
]


def _rows_p(file: str, key: str, make: Any, torch: str, form: str, *, init: str = "",
            body: str = "", call: str = "EXT(x)", extra: str = "") -> Problem:
    return Problem(file, key, "rows", init, body, "x", dict(make=make, torch=torch, form=form,
                                                            call=call, extra=extra))


ROWS = [
    _rows_p("level1/23_Softmax.py", "smax", lambda t, b: K.row_softmax(t, False, b and "one_warp"),
            "torch.softmax(x, dim=1)", "block_per_row_warp_shuffle"),
    _rows_p("level1/24_LogSoftmax.py", "lsmax",
            lambda t, b: K.row_softmax(t, True, b and "one_warp"),
            "torch.log_softmax(x, dim=self.dim)", "block_per_row_warp_shuffle",
            init=", dim: int = 1", body="self.dim = dim"),
    _rows_p("level1/38_L1Norm_.py", "l1n", lambda t, b: K.row_norm(t, "l1", b),
            "x / torch.mean(torch.abs(x), dim=1, keepdim=True)", "block_per_row_smem_tree"),
    _rows_p("level1/39_L2Norm_.py", "l2n", lambda t, b: K.row_norm(t, "l2", b),
            "x / torch.norm(x, p=2, dim=1, keepdim=True)", "block_per_row_smem_tree"),
    _rows_p("level1/40_LayerNorm.py", "lnorm", lambda t, b: K.layer_norm(t, b),
            "self.ln(x)", "two_pass_atomic_stats", init=", normalized_shape: tuple",
            body="self.ln = nn.LayerNorm(normalized_shape=normalized_shape)",
            call="EXT(x, self.ln.weight, self.ln.bias, self.ln.eps)",
            extra=", self.ln.weight, self.ln.bias, self.ln.eps"),
    _rows_p("level1/47_Sum_reduction_over_a_dimension.py", "rsum",
            lambda t, b: K.reduce_mid(t, "sum", True, b), "torch.sum(x, dim=self.dim, "
            "keepdim=True)", "thread_per_column", init=", dim: int", body="self.dim = dim"),
    _rows_p("level1/48_Mean_reduction_over_a_dimension.py", "rmean",
            lambda t, b: K.reduce_mid(t, "mean", False, b), "torch.mean(x, dim=self.dim)",
            "thread_per_column", init=", dim: int", body="self.dim = dim"),
    _rows_p("level1/49_Max_reduction_over_a_dimension.py", "rmax",
            lambda t, b: K.reduce_mid(t, "max", False, b), "torch.max(x, dim=self.dim)[0]",
            "thread_per_column", init=", dim: int", body="self.dim = dim"),
    _rows_p("level1/53_Min_reduction_over_a_dimension.py", "rmin",
            lambda t, b: K.reduce_mid(t, "min", False, b), "torch.min(x, dim=self.dim)[0]",
            "thread_per_column", init=", dim: int", body="self.dim = dim"),
]


def _mm(file: str, key: str, call: str, torch: str, *, fwd_args: str = "A, B",
        matvec: bool = False, bug: str = "wrong") -> Problem:
    return Problem(file, key, "matmul", "", "", fwd_args, dict(call=call, torch=torch,
                                                               matvec=matvec, bug=bug))


MATMUL = [
    _mm("level1/1_Square_matrix_multiplication_.py", "mmsq", "EXT(A, B, False, False)",
        "torch.matmul(A, B)"),
    _mm("level1/2_Standard_matrix_multiplication_.py", "mmstd", "EXT(A, B, False, False)",
        "torch.matmul(A, B)"),
    _mm("level1/3_Batched_matrix_multiplication.py", "bmm", "EXT(A, B, False, False)",
        "torch.bmm(A, B)"),
    _mm("level1/4_Matrix_vector_multiplication_.py", "mv", "EXT(A, B)", "torch.matmul(A, B)",
        matvec=True),
    _mm("level1/6_Matmul_with_large_K_dimension_.py", "mmbigk", "EXT(A, B, False, False)",
        "torch.matmul(A, B)"),
    _mm("level1/7_Matmul_with_small_K_dimension_.py", "mmsmk", "EXT(A, B, False, False)",
        "torch.matmul(A, B)"),
    _mm("level1/8_Matmul_with_irregular_shapes_.py", "mmirr", "EXT(A, B, False, False)",
        "torch.matmul(A, B)", bug="ktail"),
    _mm("level1/9_Tall_skinny_matrix_multiplication_.py", "mmtall", "EXT(A, B, False, False)",
        "torch.matmul(A, B)"),
    _mm("level1/16_Matmul_with_transposed_A.py", "mmta", "EXT(A, B, True, False)",
        "torch.matmul(A.T, B)"),
    _mm("level1/17_Matmul_with_transposed_B.py", "mmtb", "EXT(A, B, False, True)",
        "torch.matmul(A, B.T)"),
]


def _pool_p(file: str, key: str, dims: int, kind: str, init: str, body: str, call: str,
            torch: str, wrong_kind: str = "") -> Problem:
    return Problem(file, key, "pool", init, body, "x", dict(
        dims=dims, kind=kind, call=call, torch=torch, wrong_kind=wrong_kind or kind))


POOL = [
    _pool_p("level1/44_Average_Pooling_1D.py", "ap1", 1, "avg",
            ", kernel_size: int, stride: int = 1, padding: int = 0",
            "self.k, self.s, self.p = kernel_size, stride, padding",
            "EXT(x, self.k, self.s, self.p, 1)", "F.avg_pool1d(x, self.k, self.s, self.p)"),
    _pool_p("level1/45_Average_Pooling_2D.py", "ap2", 2, "avg",
            ", kernel_size: int, stride: int = None, padding: int = 0",
            "self.k, self.s, self.p = kernel_size, stride or kernel_size, padding",
            "EXT(x, self.k, self.s, self.p, 1)", "F.avg_pool2d(x, self.k, self.s, self.p)",
            wrong_kind="max"),
    _pool_p("level1/46_Average_Pooling_3D.py", "ap3", 3, "avg",
            ", kernel_size: int, stride: int = None, padding: int = 0",
            "self.k, self.s, self.p = kernel_size, stride or kernel_size, padding",
            "EXT(x, self.k, self.s, self.p, 1)", "F.avg_pool3d(x, self.k, self.s, self.p)"),
    _pool_p("level1/42_Max_Pooling_2D.py", "mp2", 2, "max",
            ", kernel_size: int, stride: int, padding: int, dilation: int",
            "self.k, self.s, self.p, self.d = kernel_size, stride, padding, dilation",
            "EXT(x, self.k, self.s, self.p, self.d)",
            "F.max_pool2d(x, self.k, self.s, self.p, self.d)", wrong_kind="avg"),
]


def _gemm(file: str, key: str, init: str, body: str, epi: str, wrong: str, nparams: int,
          pargs: str, lin: str = "self.gemm", bias: str = "") -> Problem:
    """Linear + epilogue: one tiled kernel with bias and epilogue; or nn.Linear + own tail."""
    b = bias or f"{lin}.bias"
    return Problem(file, key, "fused", init, body, "x", dict(
        form="smem_tiled_gemm+epilogue",
        make=lambda t: K.matmul(t, 32, "", epi, nparams, bias=True),
        make_wrong=lambda t: K.matmul(t, 32, "", wrong, nparams, bias=True),
        call=f"return EXT(x, {lin}.weight, {b}, False, True{pargs})",
        make_tail=lambda t: S.epilogue_only(t, epi.replace("v", "(v + bias[c])") if bias
                                            else epi, nparams),
        call_tail=f"y = {lin}(x)\nreturn EXT(y, {b if bias else 'y.new_empty(0)'}, 1{pargs})"))


FUSED = [
    _gemm("level2/12_Gemm_Multiply_LeakyReLU.py", "g12",
          ", in_features, out_features, multiplier, negative_slope",
          "self.gemm = nn.Linear(in_features, out_features)\nself.multiplier = multiplier\n"
          "self.negative_slope = negative_slope",
          "(v * p0 > 0.f ? v * p0 : v * p0 * p1)", "(v > 0.f ? v * p0 : v * p1)", 2,
          ", self.multiplier, self.negative_slope"),
    _gemm("level2/76_Gemm_Add_ReLU.py", "g76", ", in_features, out_features, bias_shape",
          "self.gemm = nn.Linear(in_features, out_features, bias=False)\n"
          "self.bias = nn.Parameter(torch.randn(bias_shape))", "fmaxf(v, 0.f)", "v", 0, "",
          bias="self.bias"),
    _gemm("level2/63_Gemm_ReLU_Divide.py", "g63", ", in_features, out_features, divisor",
          "self.linear = nn.Linear(in_features, out_features)\nself.divisor = divisor",
          "fmaxf(v, 0.f) / p0", "fmaxf(v / p0, 1.f)", 1, ", self.divisor", lin="self.linear"),
    _gemm("level2/9_Matmul_Subtract_Multiply_ReLU.py", "g9",
          ", in_features, out_features, subtract_value, multiply_value",
          "self.linear = nn.Linear(in_features, out_features)\n"
          "self.subtract_value = subtract_value\nself.multiply_value = multiply_value",
          "fmaxf((v - p0) * p1, 0.f)", "fmaxf(v * p1 - p0, 0.f)", 2,
          ", self.subtract_value, self.multiply_value", lin="self.linear"),
    _gemm("level2/59_Matmul_Swish_Scaling.py", "g59",
          ", in_features, out_features, scaling_factor",
          "self.matmul = nn.Linear(in_features, out_features)\n"
          "self.scaling_factor = scaling_factor", "v / (1.f + expf(-v)) * p0",
          "v / (1.f + expf(-v)) + p0", 1, ", self.scaling_factor", lin="self.matmul"),
    _gemm("level2/86_Matmul_Divide_GELU.py", "g86", ", input_size, output_size, divisor",
          "self.linear = nn.Linear(input_size, output_size)\nself.divisor = divisor",
          GELU.format(a="(v / p0)"), GELU.format(a="v") + " / p0", 1, ", self.divisor",
          lin="self.linear"),
    _gemm("level2/40_Matmul_Scaling_ResidualAdd.py", "g40",
          ", in_features, out_features, scaling_factor",
          "self.matmul = nn.Linear(in_features, out_features)\n"
          "self.scaling_factor = scaling_factor", "v * p0 + v", "v * p0", 1,
          ", self.scaling_factor", lin="self.matmul"),
    _gemm("level2/29_Matmul_Mish_Mish.py", "g29", ", in_features, out_features",
          "self.linear = nn.Linear(in_features, out_features)", f"{MISH}({MISH}(v))",
          f"{MISH}(v)", 0, "", lin="self.linear"),
]


def _conv(file: str, key: str, init: str, body: str, epi: str, wrong_epi: str, post: str,
          tail: str) -> Problem:
    return Problem(file, key, "fused", init, body, "x", dict(
        form="direct_conv+epilogue",
        make=lambda t: S.conv2d(t, epi),
        make_wrong=lambda t: S.conv2d(t, wrong_epi, bug="wrong"),
        call=f"return EXT(x, self.conv.weight, self.conv.bias, {post})",
        make_tail=lambda t: S.epilogue_only(t, tail, 0),
        call_tail=f"y = self.conv(x)\nreturn EXT(y, {post}, y.shape[2] * y.shape[3])"))


HSWISH = "fmaxf(v, 0.f) * fminf(fmaxf((fmaxf(v, 0.f) + 3.f) / 6.f, 0.f), 1.f)"
CONV = [
    _conv("level2/1_Conv2D_ReLU_BiasAdd.py", "c1", ", in_channels, out_channels, kernel_size, "
          "bias_shape", "self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)\n"
          "self.bias = nn.Parameter(torch.randn(bias_shape))", "fmaxf(v, 0.f) + post[oc]",
          "fmaxf(v, 0.f) + post[oc]", "self.bias", "fmaxf(v, 0.f) + bias[c]"),
    _conv("level2/57_Conv2d_ReLU_HardSwish.py", "c57", ", in_channels, out_channels, "
          "kernel_size", "self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)",
          HSWISH, HSWISH, "self.conv.bias", HSWISH),
]


def _mlp(file: str, key: str, sizes: str) -> Problem:
    """An MLP: every layer through the own tiled GEMM with bias (+ ReLU but the last)."""
    loop = ("for i, layer in enumerate(self.layers):\n"
            "    last = i == len(self.layers) - 1\n"
            "    x = EXT(x, layer.weight, layer.bias, False, True, 0.0 if last else 1.0)\n"
            "return x")
    wrong = loop.replace("0.0 if last else 1.0", "1.0")
    tail = ("for i, layer in enumerate(self.layers):\n    x = layer(x)\n"
            "    if i < len(self.layers) - 1:\n        x = EXT(x, x.new_empty(0), 1)\nreturn x")
    body = (f"dims = [input_size] + list({sizes}) + [output_size]\n"
            "self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))")
    epi = "(p0 > 0.5f ? fmaxf(v, 0.f) : v)"
    return Problem(file, key, "fused", f", input_size, {sizes}, output_size", body, "x", dict(
        form="smem_tiled_gemm_per_layer",
        make=lambda t: K.matmul(t, 32, "", epi, 1, bias=True),
        make_wrong=lambda t: K.matmul(t, 32, "", epi, 1, bias=True),
        call=loop, call_wrong=wrong,
        make_tail=lambda t: S.epilogue_only(t, "fmaxf(v, 0.f)", 0),
        call_tail=tail))


MLP = [
    _mlp("level3/1_MLP.py", "mlp1", "layer_sizes"),
    _mlp("level3/2_ShallowWideMLP.py", "mlp2", "hidden_layer_sizes"),
    _mlp("level3/3_DeepNarrowMLP.py", "mlp3", "hidden_layer_sizes"),
]

PROBLEMS: list[Problem] = UNARY + ROWS + MATMUL + POOL + FUSED + CONV + MLP
