"""Run a template's CUDA device text on the CPU (no GPU here): a prelude that makes it C++.

Each block runs as `blockDim.x` std::threads (blocks one after another): `__shared__` is a static
array (one block at a time uses it), `__syncthreads` a std::barrier over the block, and
`__shfl_down_sync` / `__shfl_xor_sync` an exchange through per-warp scratch between two
barriers of that warp's 32 threads; WMMA's TF32 fragments are emulated (below).
`ks_launch(grid, threads, body)` runs `body` once per thread of every block.
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
template <class T> T __shfl_xor_sync(unsigned, T v, int mask) {
    static T scratch[32][32];
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    scratch[w][lane] = v;
    ks_warp_bar[w]->arrive_and_wait();
    const T r = scratch[w][lane ^ mask];
    ks_warp_bar[w]->arrive_and_wait();
    return r;
}
static void __syncwarp() { ks_warp_bar[threadIdx.x / 32]->arrive_and_wait(); }
// WMMA's TF32 fragments: each thread holds the whole tile (row-major), which the API's contract
// allows (a fragment's lane layout is unspecified; element-wise code is layout-agnostic); the
// MMA uses only the 10-bit mantissa of its inputs, as the hardware does; lane 0 stores.
namespace nvcuda { namespace wmma {
struct matrix_a {}; struct matrix_b {}; struct accumulator {};
struct row_major {}; struct col_major {};
namespace precision { struct tf32 {}; }
enum layout_t { mem_row_major, mem_col_major };
template <class Use, int M, int N, int K, class T, class L = void> struct fragment;
template <int M, int N, int K, class L> struct fragment<matrix_a, M, N, K, precision::tf32, L> {
    static constexpr int num_elements = M * K, rows = M, cols = K; float x[M * K]; };
template <int M, int N, int K, class L> struct fragment<matrix_b, M, N, K, precision::tf32, L> {
    static constexpr int num_elements = K * N, rows = K, cols = N; float x[K * N]; };
template <int M, int N, int K> struct fragment<accumulator, M, N, K, float, void> {
    static constexpr int num_elements = M * N; float x[M * N]; };
inline float __float_to_tf32(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7f800000u) != 0x7f800000u) u += 0x1000u;  // nearest, ties away from zero
    return __uint_as_float(u & 0xffffe000u);
}
template <class F> void ks_load(F& f, const float* p, unsigned ldm, bool col) {
    for (int r = 0; r < F::rows; ++r)
        for (int c = 0; c < F::cols; ++c) f.x[r * F::cols + c] = col ? p[c * ldm + r] : p[r * ldm + c];
}
template <class Use, int M, int N, int K>
void load_matrix_sync(fragment<Use, M, N, K, precision::tf32, row_major>& f, const float* p,
                      unsigned ldm) { ks_load(f, p, ldm, false); }
template <class Use, int M, int N, int K>
void load_matrix_sync(fragment<Use, M, N, K, precision::tf32, col_major>& f, const float* p,
                      unsigned ldm) { ks_load(f, p, ldm, true); }
template <int M, int N, int K>
void fill_fragment(fragment<accumulator, M, N, K, float, void>& f, float v) {
    for (float& e : f.x) e = v;
}
template <int M, int N, int K, class LA, class LB>
void mma_sync(fragment<accumulator, M, N, K, float, void>& d,
              const fragment<matrix_a, M, N, K, precision::tf32, LA>& a,
              const fragment<matrix_b, M, N, K, precision::tf32, LB>& b,
              const fragment<accumulator, M, N, K, float, void>& c) {
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
            double s = 0.0;
            for (int k = 0; k < K; ++k)
                s += (double)__uint_as_float(__float_as_uint(a.x[m * K + k]) & 0xffffe000u)
                     * (double)__uint_as_float(__float_as_uint(b.x[k * N + n]) & 0xffffe000u);
            d.x[m * N + n] = c.x[m * N + n] + (float)s;
        }
}
template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float, void>& f,
                       unsigned ldm, layout_t layout) {
    if (threadIdx.x % 32 != 0) return;
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n)
            (layout == mem_row_major ? p[m * ldm + n] : p[n * ldm + m]) = f.x[m * N + n];
}
} }  // namespace nvcuda::wmma
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
