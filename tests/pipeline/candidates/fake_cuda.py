"""Run a template's CUDA device text on the CPU (no GPU here): a prelude that makes it C++.

Each block runs as `blockDim.x` std::threads (blocks one after another): `__shared__` is a static
array (one block at a time uses it), `__syncthreads` a std::barrier over the block, and
`__shfl_down_sync` an exchange through per-warp scratch between two barriers of that warp's 32
threads. `ks_launch(grid, threads, body)` runs `body` once per thread of every block.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PRELUDE = r"""
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>
struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct alignas(16) float4 { float x, y, z, w; };
static thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
static std::barrier<>* ks_bar = nullptr;
static std::barrier<>* ks_warp_bar[32];
static void __syncthreads() { ks_bar->arrive_and_wait(); }
static uint32_t __float_as_uint(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
static float __uint_as_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
template <class T> T __shfl_down_sync(unsigned, T v, int off) {
    static T scratch[32][32];
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    scratch[w][lane] = v;
    ks_warp_bar[w]->arrive_and_wait();
    const T r = lane + off < 32 ? scratch[w][lane + off] : v;
    ks_warp_bar[w]->arrive_and_wait();
    return r;
}
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(n)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define HD inline

template <class F> void ks_launch(dim3 grid, unsigned threads, F body) {
    for (unsigned z = 0; z < grid.z; ++z)
      for (unsigned y = 0; y < grid.y; ++y)
        for (unsigned x = 0; x < grid.x; ++x) {
          std::barrier<> bar(threads);
          ks_bar = &bar;
          std::vector<std::unique_ptr<std::barrier<>>> warps;
          for (unsigned w = 0; w < threads / 32; ++w) {
            warps.push_back(std::make_unique<std::barrier<>>(32));
            ks_warp_bar[w] = warps.back().get();
          }
          std::vector<std::thread> pool;
          for (unsigned t = 0; t < threads; ++t)
            pool.emplace_back([&, t, x, y, z] {
              threadIdx = dim3{t, 0, 0};
              blockIdx = dim3{x, y, z};
              blockDim = dim3{threads, 1, 1};
              gridDim = grid;
              body();
            });
          for (auto& th : pool) th.join();
        }
}

static std::vector<float> ks_slurp(const char* path, size_t n) {
    std::vector<float> v(n);
    FILE* f = std::fopen(path, "rb");
    if (n && (!f || std::fread(v.data(), 4, n, f) != n)) {
        std::fprintf(stderr, "cannot read %zu floats from %s\n", n, path);
        std::exit(2);
    }
    if (f) std::fclose(f);
    return v;
}

static void ks_spill(const char* path, const std::vector<float>& v) {
    FILE* f = std::fopen(path, "wb");
    std::fwrite(v.data(), 4, v.size(), f);
    std::fclose(f);
}
"""

# The 3xTF32 kernel's two PTX primitives: round to TF32 (nearest, ties away from zero) and the
# m16n8k8 MMA after the PTX ISA's fragment layout, lanes' registers exchanged through per-warp
# scratch between two block barriers (every thread of the block issues the same MMAs).
TF32_EMULATION = r"""
static float ks_frag_a[8][32][4], ks_frag_b[8][32][2];
__device__ __forceinline__ uint32_t K_tf32(float x) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7f800000u) != 0x7f800000u) u += 0x1000u;  // half an ulp of a 10-bit mantissa
    return u & 0xffffe000u;
}
__device__ __forceinline__ void K_mma(float (&d)[4], const uint32_t (&a)[4],
                                      const uint32_t (&b)[2]) {
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    for (int i = 0; i < 4; ++i) ks_frag_a[w][lane][i] = __uint_as_float(a[i] & 0xffffe000u);
    for (int i = 0; i < 2; ++i) ks_frag_b[w][lane][i] = __uint_as_float(b[i] & 0xffffe000u);
    __syncthreads();
    const int g = lane / 4, t = lane % 4;
    for (int q = 0; q < 4; ++q) {
        const int row = g + (q / 2) * 8, col = t * 2 + q % 2;
        double s = 0.0;
        for (int k = 0; k < 8; ++k) {
            const float av = ks_frag_a[w][(row % 8) * 4 + k % 4][(row >= 8) + 2 * (k >= 4)];
            const float bv = ks_frag_b[w][col * 4 + k % 4][k >= 4];
            s += (double)av * (double)bv;
        }
        d[q] += (float)s;
    }
    __syncthreads();
}
"""


def build(tmp: Path, body: str) -> Path:
    """Compile PRELUDE + `body` (device text and a main) with g++; the executable's path."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not installed")
    src = tmp / "harness.cpp"
    src.write_text(PRELUDE + body)
    exe = tmp / "harness"
    proc = subprocess.run(["g++", "-std=c++20", "-O2", "-pthread", str(src), "-o", str(exe)],
                          capture_output=True, text=True, timeout=600)
    errors = "\n".join(ln for ln in proc.stderr.splitlines() if "error" in ln)
    assert proc.returncode == 0, errors[:4000] or proc.stderr[-4000:]
    return exe
