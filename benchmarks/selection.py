"""Diversity-preserving selection vs top-k-by-reward vs random-k on one synthetic pool.

Each task's verified pool mimics what sampling produces: many near-copies of the most common
(and often best-rewarded) kernel, with renamed variables and different constants, plus a few
kernels built on other strategies (vectorized, shared memory, warp shuffles, two kernels,
tensor cores) whose rewards are close. Prints, for each method, the mean pairwise kernel distance
within a task, the distinct strategies per task, the mean speedup and the time taken.

    .venv/bin/python -m benchmarks.selection [--tasks 200] [--k 4]
"""

from __future__ import annotations

import argparse
import random
import time

from pipeline.datasets.selection import (
    _sketch,
    select_diverse,
    select_random_k,
    select_top_k,
    selection_quality,
)
from schemas import Candidate, Verdict

STRATEGIES = {
    "plain": "__global__ void {f}(const float* {a}, float* {b}, int n) {{\n"
             "  int {i} = blockIdx.x * blockDim.x + threadIdx.x;\n"
             "  if ({i} < n) {b}[{i}] = fmaxf({a}[{i}], 0.f) * {c}f;\n}}\n"
             "// launch: {f}<<<(n + {t} - 1) / {t}, {t}>>>(...);",
    "vec4": "__global__ void {f}(const float4* {a}, float4* {b}, int n4) {{\n"
            "  int {i} = blockIdx.x * blockDim.x + threadIdx.x;\n"
            "  if ({i} < n4) {{ float4 v = {a}[{i}]; v.x = fmaxf(v.x, 0.f) * {c}f;\n"
            "    v.y = fmaxf(v.y, 0.f) * {c}f; v.z = fmaxf(v.z, 0.f) * {c}f;\n"
            "    v.w = fmaxf(v.w, 0.f) * {c}f; {b}[{i}] = v; }}\n}}\n"
            "// launch: {f}<<<(n / 4 + {t} - 1) / {t}, {t}>>>(...);",
    "shared": "__global__ void {f}(const float* {a}, float* {b}, int n) {{\n"
              "  __shared__ float tile[{t}];\n"
              "  int {i} = blockIdx.x * blockDim.x + threadIdx.x;\n"
              "  tile[threadIdx.x] = {i} < n ? {a}[{i}] : 0.f;\n  __syncthreads();\n"
              "  if ({i} < n) {b}[{i}] = fmaxf(tile[threadIdx.x], 0.f) * {c}f;\n}}\n"
              "// launch: {f}<<<(n + {t} - 1) / {t}, {t}>>>(...);",
    "warp": "__global__ void {f}(const float* {a}, float* {b}, int n) {{\n"
            "  int {i} = blockIdx.x * blockDim.x + threadIdx.x;\n"
            "  float v = {i} < n ? {a}[{i}] : 0.f;\n"
            "  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));\n"
            "  if ({i} < n) {b}[{i}] = fmaxf(v, 0.f) * {c}f;\n}}\n"
            "// launch: {f}<<<(n + {t} - 1) / {t}, {t}>>>(...);",
    "two_pass": "__global__ void {f}_a(const float* {a}, float* {b}, int n) {{\n"
                "  int {i} = blockIdx.x * blockDim.x + threadIdx.x;\n"
                "  if ({i} < n) {b}[{i}] = fmaxf({a}[{i}], 0.f);\n}}\n"
                "__global__ void {f}_b(float* {b}, int n) {{\n"
                "  int {i} = blockIdx.x * blockDim.x + threadIdx.x;\n"
                "  if ({i} < n) {b}[{i}] *= {c}f;\n}}\n"
                "// launch: {f}_a<<<(n + {t} - 1) / {t}, {t}>>>(...);",
    "wmma": "#include <mma.h>\nusing namespace nvcuda;\n"
            "__global__ void {f}(const half* {a}, float* {b}, int n) {{\n"
            "  wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;\n"
            "  wmma::load_matrix_sync(fa, {a}, 16);\n"
            "  int {i} = blockIdx.x * blockDim.x + threadIdx.x;\n"
            "  if ({i} < n) {b}[{i}] = fmaxf(__half2float({a}[{i}]), 0.f) * {c}f;\n}}\n"
            "// launch: {f}<<<(n + {t} - 1) / {t}, {t}>>>(...);",
}
WRAPPER = ('import torch\nfrom torch.utils.cpp_extension import load_inline\n\ncuda_src = """\n'
           '{kernel}\n"""\next = load_inline(name="k", cpp_sources="", cuda_sources=cuda_src, '
           'functions=["run"])\n\n\nclass ModelNew(torch.nn.Module):\n'
           '    def forward(self, x):\n        return ext.run(x)\n')
NAMES = ["x", "inp", "src", "in_ptr", "a", "input", "data", "p"]


def build_pool(n_tasks: int, seed: int) -> tuple[list[Candidate], list[Verdict]]:
    """Per task: 8-14 near-copies of one favoured strategy plus 4-6 other strategies."""
    rng = random.Random(seed)
    cands, verdicts = [], []
    for t in range(n_tasks):
        task_id = f"task{t:05d}"
        styles = list(STRATEGIES)
        rng.shuffle(styles)
        favoured, others = styles[0], styles[1:1 + rng.randint(4, 5)]
        plan = [(favoured, 1.6 + rng.random() * 0.3) for _ in range(rng.randint(8, 14))]
        plan += [(s, 1.2 + rng.random() * 0.6) for s in others]
        for j, (style, speedup) in enumerate(plan):
            kernel = STRATEGIES[style].format(
                f=rng.choice(["relu_scale", "fused", "kern", "k_relu"]) + str(j),
                a=rng.choice(NAMES), b=rng.choice(["y", "out", "dst", "o"]),
                i=rng.choice(["i", "idx", "tid", "g"]), c=f"{rng.randint(2, 9)}.0",
                t=rng.choice([128, 256]))
            code = WRAPPER.format(kernel=kernel)
            cid = Candidate.make_id(task_id, "cuda", code)
            cands.append(Candidate(cid, task_id, "cuda", "llm:bench", code))
            verdicts.append(Verdict(cid, task_id, "correct_fast", "done", "cuda",
                                    speedup=round(speedup, 3), faster=True,
                                    reward=round(1.0 + speedup, 3)))
    return cands, verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cands, verdicts = build_pool(args.tasks, args.seed)
    print(f"pool: {args.tasks} tasks, {len(cands)} verified-correct candidates, k={args.k}")
    methods = [
        ("top-k by reward (baseline)", lambda: select_top_k(cands, verdicts, args.k)),
        ("random-k (baseline)", lambda: select_random_k(cands, verdicts, args.k, seed=args.seed)),
        ("diverse w=0.10", lambda: select_diverse(cands, verdicts, args.k, 0.1)),
        ("diverse w=0.25", lambda: select_diverse(cands, verdicts, args.k, 0.25)),
        ("diverse w=0.50", lambda: select_diverse(cands, verdicts, args.k, 0.5)),
        ("diverse w=0.75", lambda: select_diverse(cands, verdicts, args.k, 0.75)),
    ]
    header = (f"{'method':<28}{'mean pair dist':>15}{'strategies/task':>17}{'mean speedup':>14}"
              f"{'time s':>9}")
    print(header)
    print("-" * len(header))
    for name, run in methods:
        _sketch.cache_clear()  # every method pays for its own MinHash sketches
        start = time.perf_counter()
        selected = run()
        elapsed = time.perf_counter() - start
        q = selection_quality(cands, verdicts, selected)
        print(f"{name:<28}{q['mean_pairwise_distance']:>15.3f}"
              f"{q['distinct_strategies_per_task']:>17.2f}{q['mean_speedup']:>14.3f}"
              f"{elapsed:>9.2f}")


if __name__ == "__main__":
    main()
