"""Diversity-preserving rejection sampling: per task, keep up to k verified kernels that differ.

Among a task's verified-correct candidates, a greedy pass picks the best-reward kernel first and
then, each step, the kernel maximising `(1 - weight) * reward + weight * distance to the nearest
kept kernel`. Distance mixes MinHash Jaccard over normalized kernel tokens with structural
features (number of kernels, shared memory, vectorization, warp primitives, tensor cores, launch
shape), so ten renamings of one kernel count as one strategy. Top-k-by-reward and random-k are
the baselines `benchmarks/selection.py` compares against.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from pipeline.datasets.retime import held_speedup, retimings, timing_held
from schemas import Candidate, Rejection, Verdict
from verifier.protocol import CORRECT_STATUSES

NUM_PERM = 64
SHINGLE = 3
# Share of the distance that comes from tokens; the rest from structural features.
TOKEN_SHARE = 0.5

_STRING_LITERAL = re.compile(r'(?s)r?"""(.*?)"""|r?\'\'\'(.*?)\'\'\'')
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/|#(?!pragma|include|define)[^\n]*", re.S)
_TOKEN = re.compile(r"[A-Za-z_]\w*|\d+\.?\d*[fFuUlL]*|<<<|>>>|::|->|[{}()\[\];,<>=+\-*/%&|^!~?:.]")
_KEYWORDS = frozenset(
    """__global__ __device__ __host__ __shared__ __syncthreads __restrict__ __ldg __shfl_down_sync
    __shfl_xor_sync __shfl_sync __shfl_up_sync __ballot_sync __any_sync __all_sync __expf __fdividef
    blockIdx threadIdx blockDim gridDim warpSize for while if else return const float double half
    int int64_t uint32_t size_t float2 float4 half2 __half __half2 __nv_bfloat16 auto void unsigned
    pragma omp parallel simd unroll wmma mma fragment load_matrix_sync store_matrix_sync mma_sync
    atomicAdd fmaxf fminf expf logf sqrtf rsqrtf tanhf max min data_ptr numel size empty empty_like
    zeros torch Tensor at std template typename static inline extern struct""".split()
)


@dataclass(frozen=True)
class KernelFeatures:
    """Structural facts about a candidate's kernels, read from its source text."""

    n_kernels: int
    shared_memory: bool
    vectorized: bool
    warp_primitives: bool
    tensor_cores: bool
    threads_per_block: int  # 0 when the launch shape is not a literal
    multithreaded: bool  # OpenMP or an equivalent on the CPU backend
    unrolled: bool

    def strategy(self) -> str:
        """A short label of the optimization strategy, for counting distinct strategies."""
        tags = [f"k{min(self.n_kernels, 3)}"]
        for name in ("shared_memory", "vectorized", "warp_primitives", "tensor_cores",
                     "multithreaded", "unrolled"):
            if getattr(self, name):
                tags.append(name)
        if self.threads_per_block:
            tags.append(f"tpb{self.threads_per_block}")
        return "+".join(tags)

    def vector(self) -> np.ndarray:
        """The features as numbers in [0, 1], for an L1 feature distance."""
        tpb = np.log2(self.threads_per_block) / 10.0 if self.threads_per_block > 0 else 0.0
        return np.array([
            min(self.n_kernels, 4) / 4.0, float(self.shared_memory), float(self.vectorized),
            float(self.warp_primitives), float(self.tensor_cores), min(tpb, 1.0),
            float(self.multithreaded), float(self.unrolled),
        ])


def kernel_source(code: str) -> str:
    """The kernel text of a candidate: its C++/CUDA string literals, else the whole file."""
    parts = [a or b for a, b in _STRING_LITERAL.findall(code)]
    text = "\n".join(p for p in parts if p.strip())
    return text if text.strip() else code


def normalized_tokens(code: str) -> list[str]:
    """Tokens of the kernel text with comments dropped, identifiers and numbers abstracted.

    Identifiers outside a small CUDA/C++ vocabulary become `ID` and number literals `NUM`, so
    renaming variables or changing a constant does not make a kernel look new.
    """
    text = _COMMENT.sub(" ", kernel_source(code))
    tokens = []
    for tok in _TOKEN.findall(text):
        if tok[0].isdigit():
            tokens.append("NUM")
        elif tok[0].isalpha() or tok[0] == "_":
            tokens.append(tok if tok in _KEYWORDS else "ID")
        else:
            tokens.append(tok)
    return tokens


def kernel_features(code: str) -> KernelFeatures:
    """Read the structural features of a candidate's kernels from its source."""
    src = kernel_source(code)
    n_global = len(re.findall(r"__global__", src))
    if n_global == 0:  # CPU backend: count the bound functions instead
        m = re.search(r"functions\s*=\s*\[([^\]]*)\]", code)
        n_global = len(re.findall(r"['\"]\w+['\"]", m.group(1))) if m else 0
    tpb = 0
    launch = re.search(r"<<<\s*[^,>]+,\s*(\d+)", src)
    if launch:
        tpb = int(launch.group(1))
    else:
        m = re.search(r"(?:threads|block_size|BLOCK_SIZE|kThreads|block)\w*\s*=\s*(\d+)\s*;", src)
        if m:
            tpb = int(m.group(1))
    return KernelFeatures(
        n_kernels=max(n_global, 1),
        shared_memory=bool(re.search(r"__shared__|extern\s+__shared__", src)),
        vectorized=bool(re.search(
            r"\b(float4|float2|half2|__half2|int4|__nv_bfloat162|__m256|__m512|_mm256_\w+|"
            r"_mm512_\w+|reinterpret_cast<\s*(?:const\s+)?float4)|"
            r"#pragma\s+omp\s+(?:parallel\s+for\s+)?simd",
            src)),
        warp_primitives=bool(re.search(r"__shfl\w*|__ballot_sync|__any_sync|__all_sync|"
                                       r"cooperative_groups|__reduce_\w+_sync", src)),
        tensor_cores=bool(re.search(r"\bwmma::|nvcuda::wmma|\bmma\.sync|__hmma|mma_sync|wgmma",
                                    src)),
        threads_per_block=tpb,
        multithreaded=bool(re.search(r"#pragma\s+omp\s+parallel|std::thread|at::parallel_for",
                                     src)),
        unrolled=bool(re.search(r"#pragma\s+unroll", src)),
    )


@lru_cache(maxsize=1)
def _base_minhash() -> Any:
    """One MinHash whose permutations every sketch shares (drawing them dominates otherwise)."""
    # Imported here: datasketch's package import pulls in scipy (about a second), which CLI
    # commands that never select should not pay for.
    from datasketch import MinHash

    return MinHash(num_perm=NUM_PERM, seed=1)


@lru_cache(maxsize=65536)
def _sketch(code: str) -> tuple[Any, np.ndarray]:
    tokens = normalized_tokens(code)
    shingles = {" ".join(tokens[i:i + SHINGLE]).encode()
                for i in range(max(len(tokens) - SHINGLE + 1, 1))}
    base = _base_minhash()
    mh = type(base)(num_perm=NUM_PERM, seed=1, permutations=base.permutations,
                    scheme=base.scheme)
    mh.update_batch(list(shingles))
    return mh, kernel_features(code).vector()


def kernel_distance(code_a: str, code_b: str) -> float:
    """Distance in [0, 1]: MinHash Jaccard distance of tokens mixed with feature distance."""
    mh_a, f_a = _sketch(code_a)
    mh_b, f_b = _sketch(code_b)
    token_d = 1.0 - mh_a.jaccard(mh_b)
    # One differing strategy flag already counts as half the feature distance.
    feature_d = min(1.0, float(np.abs(f_a - f_b).sum()) / 2.0)
    return TOKEN_SHARE * token_d + (1.0 - TOKEN_SHARE) * feature_d


def meets_speedup(v: Verdict, min_speedup: float) -> bool:
    """A correct verdict measured at least `min_speedup` times faster than eager (with 0, any
    correct verdict; an untimed one never passes a positive gate). Both runtimes are the
    verifier's fastest window, so the two sides are measured alike."""
    if v.status not in CORRECT_STATUSES:
        return False
    return min_speedup <= 0 or (v.speedup is not None and v.speedup >= min_speedup)


def label_rejections(cands: list[Candidate], verdicts: dict[str, Verdict], min_speedup: float,
                     unstable: set[str]) -> list[Rejection]:
    """A publish Rejection for each teacher kernel that clears `min_speedup` but whose timing did
    not repeat: the same program timed again disagreed beyond both spreads (`unstable`, from
    `pairs.unstable_timings`). sft and preference leave those out; this says why."""
    out = []
    for c in cands:
        v = verdicts.get(c.candidate_id)
        if v is None or not c.generator.startswith("template:") or not meets_speedup(
                v, min_speedup):
            continue
        if c.candidate_id in unstable:
            out.append(Rejection.make(
                "publish", c.candidate_id, c.generator, "timing_not_repeated",
                f"{c.generator}: {v.speedup:.2f}x, but the same program timed again on "
                f"{v.device} landed outside this timing's spread (and this one outside its); "
                "not used as a speed label"))
        elif not timing_held(v, min_speedup):
            again = ", ".join(f"{r.get('speedup') or 0:.2f}x" for r in retimings(v))
            out.append(Rejection.make(
                "publish", c.candidate_id, c.generator, "timing_not_repeated",
                f"{c.generator}: {v.speedup:.2f}x, but verified again on {v.device} it ran at "
                f"{again}, under select.min_speedup {min_speedup:g}x; not taught as that fast"))
    return out


def fastest_per_task(items: Iterable[tuple[Candidate, Verdict]]) -> list[Candidate]:
    """Per (task, backend), the candidate with the highest measured speedup, by its slowest
    timing where it was timed more than once (then reward, id)."""
    best: dict[tuple[str, str], tuple[Candidate, Verdict]] = {}
    for c, v in items:
        key = (c.task_id, c.backend)
        cur = best.get(key)
        rank = (held_speedup(v), v.reward, c.candidate_id)
        if cur is None or rank > (held_speedup(cur[1]), cur[1].reward, cur[0].candidate_id):
            best[key] = (c, v)
    return [best[k][0] for k in sorted(best)]


def correct_pool(candidates: Iterable[Candidate],
                 verdicts: Iterable[Verdict]) -> dict[str, list[tuple[Candidate, Verdict]]]:
    """Verified-correct candidates grouped by task (mutations excluded: they carry bugs)."""
    by_id = {v.candidate_id: v for v in verdicts}
    pool: dict[str, list[tuple[Candidate, Verdict]]] = defaultdict(list)
    for cand in candidates:
        verdict = by_id.get(cand.candidate_id)
        if verdict is None or verdict.status not in CORRECT_STATUSES:
            continue
        if cand.generator.startswith("mutate:"):
            continue
        pool[cand.task_id].append((cand, verdict))
    for items in pool.values():
        items.sort(key=lambda cv: cv[0].candidate_id)  # input order must not change the result
    return dict(pool)


def _diverse_for_task(items: list[tuple[Candidate, Verdict]], k: int, weight: float) -> list[str]:
    # Reward relative to the task's best (not min-max scaled, which would blow a 2% reward
    # gap up to the whole [0, 1] range and drown the diversity term).
    rewards = np.array([v.reward for _, v in items], dtype=float)
    floor = min(0.0, float(rewards.min()))
    top = float(rewards.max()) - floor
    norm = (rewards - floor) / top if top > 0 else np.ones_like(rewards)
    codes = [c.code for c, _ in items]
    first = int(np.argmax(norm))  # argmax takes the first maximum: ties go to the smallest id
    chosen = [first]
    nearest = np.array([kernel_distance(codes[first], c) for c in codes])
    while len(chosen) < min(k, len(items)):
        score = (1.0 - weight) * norm + weight * nearest
        score[chosen] = -np.inf
        nxt = int(np.argmax(score))
        chosen.append(nxt)
        nearest = np.minimum(nearest, [kernel_distance(codes[nxt], c) for c in codes])
    return [items[i][0].candidate_id for i in chosen]


def select_diverse(candidates: list[Candidate], verdicts: list[Verdict], k: int, weight: float,
                   seed: int = 0) -> list[str]:
    """Per task, up to k verified-correct candidate ids maximising reward-weighted diversity.

    `weight` 0 is pure top-k by reward, 1 is pure diversity after the best kernel. `seed` is
    accepted for a uniform signature with the random baseline; the greedy pass is deterministic.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight must be within [0, 1], got {weight}")
    pool = correct_pool(candidates, verdicts)
    out: list[str] = []
    for task_id in sorted(pool):
        out.extend(_diverse_for_task(pool[task_id], k, weight))
    return out


def select_top_k(candidates: list[Candidate], verdicts: list[Verdict], k: int,
                 weight: float = 0.0, seed: int = 0) -> list[str]:
    """Baseline: per task, the k highest-reward verified-correct candidates."""
    pool = correct_pool(candidates, verdicts)
    out: list[str] = []
    for task_id in sorted(pool):
        ranked = sorted(pool[task_id], key=lambda cv: (-cv[1].reward, cv[0].candidate_id))
        out.extend(c.candidate_id for c, _ in ranked[:k])
    return out


def select_random_k(candidates: list[Candidate], verdicts: list[Verdict], k: int,
                    weight: float = 0.0, seed: int = 0) -> list[str]:
    """Baseline: per task, k verified-correct candidates drawn uniformly (seeded)."""
    pool = correct_pool(candidates, verdicts)
    rng = random.Random(seed)
    out: list[str] = []
    for task_id in sorted(pool):
        items = pool[task_id]
        out.extend(c.candidate_id for c, _ in rng.sample(items, min(k, len(items))))
    return out


SELECTORS: dict[str, Callable[..., list[str]]] = {
    "diverse": select_diverse, "top_k": select_top_k, "random": select_random_k,
}


def selection_quality(candidates: list[Candidate], verdicts: list[Verdict],
                      selected: list[str]) -> dict[str, float]:
    """Mean pairwise distance within tasks, distinct strategies per task, mean speedup."""
    by_id = {c.candidate_id: c for c in candidates}
    speed = {v.candidate_id: v.speedup for v in verdicts}
    groups: dict[str, list[Candidate]] = defaultdict(list)
    for cid in selected:
        groups[by_id[cid].task_id].append(by_id[cid])
    dists: list[float] = []
    strategies: list[int] = []
    for cands in groups.values():
        strategies.append(len({kernel_features(c.code).strategy() for c in cands}))
        for i in range(len(cands)):
            for j in range(i + 1, len(cands)):
                dists.append(kernel_distance(cands[i].code, cands[j].code))
    speedups = [s for cid in selected if (s := speed.get(cid)) is not None]
    return {
        "selected": float(len(selected)),
        "mean_pairwise_distance": float(np.mean(dists)) if dists else 0.0,
        "distinct_strategies_per_task": float(np.mean(strategies)) if strategies else 0.0,
        "mean_speedup": float(np.mean(speedups)) if speedups else 0.0,
    }
