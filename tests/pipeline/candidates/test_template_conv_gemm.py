"""Implicit-GEMM convolutions (pipeline/candidates/templates/conv_gemm.py): chosen for fp32
convolutions with enough out-channels per group, compiled by nvcc, and their device text run on
the CPU (fake_cuda.py) against torch's convolutions: padding, stride, dilation, asymmetric
kernels, groups, 1-D and 3-D, with and without bias, at the verifier's fp32 tolerance.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pipeline.candidates.templates import TaskView, conv_gemm, template_kernels
from tests.pipeline.candidates.fake_cuda import build
from tests.pipeline.candidates.nvcc_once import assert_nvcc_compiles

KINDS = (("sgemm128", 128), ("tf32x3", 64), ("tf32x3", 128))
# harness kernels: each kind direct (index i) and transposed (index len(KINDS) + i)
BUILT = [(k, t, False) for k, t in KINDS] + [(k, t, True) for k, t in KINDS]

CONV = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(CI, 96, 3, padding=1)
    def forward(self, x):
        return torch.relu(self.conv(x))
def get_inputs():
    return [torch.randn(8, CI, 40, 40)]
def get_init_inputs():
    return []
"""


def _main() -> str:
    calls = "\n".join(f"            case {i}: k{i}_kernel(x.data(), w.data(), has_bias ? "
                      f"bias.data() : nullptr, out.data(), geo); break;"
                      for i in range(len(BUILT)))
    tiles = ", ".join(str(t) for _, t, _ in BUILT)
    return r"""
int main(int argc, char** argv) {
    // kind d[0..21] has_bias x w bias out
    if (argc != 29) { std::fprintf(stderr, "argc %d\n", argc); return 2; }
    const int kind = std::atoi(argv[1]);
    int64_t d[22];
    for (int i = 0; i < 22; ++i) d[i] = std::atoll(argv[2 + i]);
    const bool has_bias = std::atoi(argv[24]) != 0;
    const int64_t cig = d[1] / d[21], cog = d[2] / d[21], S = d[6] * d[7] * d[8];
    const int64_t nx = d[0] * d[1] * d[3] * d[4] * d[5], nw = d[1] * cog * d[9] * d[10] * d[11];
    std::vector<float> x = ks_slurp(argv[25], nx), w = ks_slurp(argv[26], nw);
    std::vector<float> bias = ks_slurp(argv[27], has_bias ? d[2] : 0);
    std::vector<float> out(d[0] * d[2] * S, -12345.f);
    const int tiles[] = {TILES};
    const int64_t tile = tiles[kind];
    K_CG_T geo{(int)d[1], (int)d[2], (int)d[3], (int)d[4], (int)d[5], (int)d[6], (int)d[7],
               (int)d[8], (int)d[9], (int)d[10], (int)d[11], (int)d[12], (int)d[13], (int)d[14],
               (int)d[15], (int)d[16], (int)d[17], (int)d[18], (int)d[19], (int)d[20], (int)cig,
               (int)cog, (int)(cig * d[9] * d[10] * d[11]), (int)S, (int)(d[0] * S)};
    const dim3 grid{(unsigned)((geo.NP + tile - 1) / tile), (unsigned)((cog + tile - 1) / tile),
                    (unsigned)d[21]};
    ks_launch(grid, 256, [&] {
        switch (kind) {
CALLS
        }
    });
    ks_spill(argv[28], out);
    return 0;
}
""".replace("TILES", tiles).replace("CALLS", calls)


def _harness_source() -> str:
    parts = []
    for i, (kind, tile, transposed) in enumerate(BUILT):
        text = conv_gemm.device_text(kind, tile, transposed)
        # one geometry struct for all three (the same text under each prefix)
        text = text.replace("K_", f"k{i}_").replace("C_T", "float")
        parts.append(text)
    geo = "using K_CG_T = k0_CG;\n"
    body = "\n".join(parts) + geo + _main()
    for i in range(1, len(BUILT)):  # the kernels take their own struct: same layout
        body = body.replace(f"k{i}_kernel(x.data(), w.data(), has_bias ? bias.data() : nullptr, "
                            "out.data(), geo)",
                            f"k{i}_kernel(x.data(), w.data(), has_bias ? bias.data() : nullptr, "
                            f"out.data(), reinterpret_cast<const k{i}_CG&>(geo))")
    return body


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("igemm"), _harness_source())


def _pad3(vals: list[int], fill: int) -> list[int]:
    return [fill] * (3 - len(vals)) + list(vals)


def _run(exe: Path, tmp: Path, kind: int, x: torch.Tensor, w: torch.Tensor,
         bias: torch.Tensor | None, stride: list[int], pad: list[int], dil: list[int],
         groups: int, out_shape: tuple[int, ...]) -> torch.Tensor:
    n, ci = x.shape[:2]
    d = [n, ci, out_shape[1], *_pad3(list(x.shape[2:]), 1), *_pad3(list(out_shape[2:]), 1),
         *_pad3(list(w.shape[2:]), 1), *_pad3(stride, 1), *_pad3(pad, 0), *_pad3(dil, 1), groups]
    paths = []
    for name, t in (("x", x), ("w", w), ("bias", bias if bias is not None else torch.empty(0))):
        path = tmp / f"{name}.bin"
        path.write_bytes(t.contiguous().numpy().tobytes())
        paths.append(path)
    out = tmp / "out.bin"
    args = [harness_arg for harness_arg in (exe, kind, *d, int(bias is not None), *paths, out)]
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return torch.frombuffer(bytearray(out.read_bytes()), dtype=torch.float32).view(out_shape)


def _cases() -> list[tuple]:
    g = torch.Generator().manual_seed(11)
    def r(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=g) * 1.5 - 0.5
    return [  # label, x, w, bias, stride, padding, dilation, groups
        ("2-D 3x3 pad 1", r(2, 5, 9, 9), r(20, 5, 3, 3), r(20), [1, 1], [1, 1], [1, 1], 1),
        ("2-D stride (2, 1) dilation (2, 3) asym", r(1, 3, 13, 11), r(17, 3, 3, 2), None,
         [2, 1], [1, 2], [2, 3], 1),
        ("2-D groups 2", r(2, 6, 7, 8), r(36, 3, 3, 3), r(36), [1, 1], [0, 1], [1, 1], 2),
        ("1-D", r(3, 4, 50), r(70, 4, 5), r(70), [1], [2], [1], 1),
        ("3-D", r(1, 2, 5, 6, 7), r(18, 2, 3, 3, 3), r(18), [1, 1, 1], [1, 0, 1], [1, 1, 1], 1),
        ("2-D 1x1 pointwise, 150 channels", r(2, 24, 6, 6), r(150, 24, 1, 1), r(150), [1, 1],
         [0, 0], [1, 1], 1),
    ]


def _cases_transposed() -> list[tuple]:
    g = torch.Generator().manual_seed(13)
    def r(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=g) * 1.5 - 0.5
    return [  # label, x, w (Ci, Co/groups, k...), bias, stride, padding, output pad, dilation, groups
        ("2-D stride 2 pad 1 out-pad 1", r(2, 6, 5, 7), r(6, 20, 3, 3), r(20), [2, 2], [1, 1],
         [1, 1], [1, 1], 1),
        ("2-D stride (3, 1) dilation (1, 2) groups 2", r(1, 4, 6, 5), r(4, 17, 2, 3), None,
         [3, 1], [0, 1], [0, 0], [1, 2], 2),
        ("1-D stride 2", r(3, 5, 11), r(5, 70, 4), r(70), [2], [1], [0], [1], 1),
        ("3-D stride 2", r(1, 3, 3, 4, 3), r(3, 18, 3, 3, 3), r(18), [2, 2, 2], [1, 0, 1],
         [0, 1, 0], [1, 1, 1], 1),
    ]


@pytest.mark.parametrize("kind", range(len(KINDS)), ids=[f"{k}{t}" for k, t in KINDS])
def test_transposed_implicit_gemm_text_matches_torch_on_cpu(harness, tmp_path, kind) -> None:
    convs = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
    for label, x, w, bias, stride, pad, opad, dil, groups in _cases_transposed():
        want = convs[x.dim() - 2](x, w, bias, stride, pad, opad, groups, dil)
        got = _run(harness, tmp_path, len(KINDS) + kind, x, w, bias, stride, pad, dil, groups,
                   tuple(want.shape))
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (
            label, (got - want).abs().max().item())


@pytest.mark.parametrize("kind", range(len(KINDS)), ids=[f"{k}{t}" for k, t in KINDS])
def test_implicit_gemm_text_matches_torch_on_cpu(harness, tmp_path, kind) -> None:
    convs = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
    for label, x, w, bias, stride, pad, dil, groups in _cases():
        want = convs[x.dim() - 2](x, w, bias, stride, pad, dil, groups)
        got = _run(harness, tmp_path, kind, x, w, bias, stride, pad, dil, groups,
                   tuple(want.shape))
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (
            label, (got - want).abs().max().item())


def test_choice_by_dtype_channels_and_variant() -> None:
    f32 = ("float32", "float32")
    assert conv_gemm.choose(2, f32, False, 64, 1 << 10) == ("tf32x3", 64, False)
    assert conv_gemm.choose(0, f32, False, 128, 1 << 22) == ("sgemm128", 128, False)
    assert conv_gemm.choose(0, f32, False, 128, 1 << 10) is None
    assert conv_gemm.choose(2, f32, True, 64, 1 << 22) == ("tf32x3", 64, True)
    assert conv_gemm.choose(2, ("float32", "float32"), False, 1, 1 << 22) is None  # depthwise
    assert conv_gemm.choose(2, ("float16", "float16"), False, 64, 1 << 22) is None
    src = CONV.replace("CI", "32")
    ks = template_kernels(TaskView("c", "conv_relu", src, src), "cuda", 3)
    assert [k.variant for k in ks] == ["cuda-igemm_sgemm128_128", "cuda-smemfilter128",
                                       "cuda-igemm_tf32x3_128"]
    # the ReLU is applied in the implicit GEMM's store: one kernel in forward
    assert all(k.code.count("_ext.") == 1 for k in ks) and "_epi(v)" in ks[2].code


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_implicit_gemm_convolutions_compile_with_nvcc(tmp_path) -> None:
    src = CONV.replace("CI", "32")
    ks = template_kernels(TaskView("c", "conv_relu", src, src), "cuda", 3)
    small = CONV.replace("CI", "8").replace("40, 40", "12, 12").replace("96", "32")
    tf64 = template_kernels(TaskView("s", "small_conv", small, small), "cuda", 3)[2]
    assert "igemm_tf32x3_64" in tf64.variant
    tsrc = small.replace("nn.Conv2d(8, 32, 3, padding=1)", "nn.ConvTranspose2d(8, 32, 3, stride=2)")
    tr = template_kernels(TaskView("t", "small_tconv", tsrc, tsrc), "cuda", 3)[2]
    assert "igemm_tf32x3_64" in tr.variant and "_wfetch" in tr.code
    codes = [ks[0].code, ks[2].code, tf64.code, tr.code]
    assert_nvcc_compiles(codes, tmp_path)
