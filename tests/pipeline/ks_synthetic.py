"""Synthetic Task/Candidate/Verdict records for the selection, dataset and publishing tests.

Built only from `schemas` fields, so these tests do not depend on the real generators and
verifier. `pool()` returns a deterministic mix of every generator kind and verdict status.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from schemas import Candidate, Finding, Message, RawModule, Rejection, Task, TensorSpec, Verdict
from verifier.protocol import CORRECT_STATUSES

REFERENCE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x) * {scale}


def get_inputs():
    return [torch.randn(16, {dim})]


def get_init_inputs():
    return []
'''

KERNEL = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = """
{body}

torch::Tensor run(torch::Tensor x) {{
    auto out = torch::empty_like(x);
    int n = x.numel();
    {launch}
    return out;
}}
"""

ext = load_inline(name="k_{tag}", cpp_sources="torch::Tensor run(torch::Tensor x);",
                  cuda_sources=cuda_src, functions=["run"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.run(x)
'''

BODIES = {
    "plain": ("__global__ void {n}(const float* x, float* y, int n) {{\n"
              "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
              "    if (i < n) y[i] = fmaxf(x[i], 0.f) * {c}f;\n}}",
              "{n}<<<(n + {t} - 1) / {t}, {t}>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);"),
    "vec4": ("__global__ void {n}(const float4* x, float4* y, int n4) {{\n"
             "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
             "    if (i < n4) {{ float4 v = x[i]; v.x = fmaxf(v.x, 0.f) * {c}f;\n"
             "        v.y = fmaxf(v.y, 0.f) * {c}f; v.z = fmaxf(v.z, 0.f) * {c}f;\n"
             "        v.w = fmaxf(v.w, 0.f) * {c}f; y[i] = v; }}\n}}",
             "{n}<<<(n / 4 + {t} - 1) / {t}, {t}>>>((const float4*)x.data_ptr<float>(), "
             "(float4*)out.data_ptr<float>(), n / 4);"),
    "shared": ("__global__ void {n}(const float* x, float* y, int n) {{\n"
               "    __shared__ float tile[{t}];\n"
               "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
               "    tile[threadIdx.x] = i < n ? x[i] : 0.f;\n    __syncthreads();\n"
               "    #pragma unroll\n    for (int s = 0; s < 1; ++s) {{}}\n"
               "    if (i < n) y[i] = fmaxf(tile[threadIdx.x], 0.f) * {c}f;\n}}",
               "{n}<<<(n + {t} - 1) / {t}, {t}>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);"),
    "warp": ("__global__ void {n}(const float* x, float* y, int n) {{\n"
             "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
             "    float v = i < n ? x[i] : 0.f;\n"
             "    float m = __shfl_down_sync(0xffffffff, v, 0);\n"
             "    if (i < n) y[i] = fmaxf(m, 0.f) * {c}f;\n}}",
             "{n}<<<(n + {t} - 1) / {t}, {t}>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);"),
    "two": ("__global__ void {n}_a(const float* x, float* y, int n) {{\n"
            "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
            "    if (i < n) y[i] = fmaxf(x[i], 0.f);\n}}\n"
            "__global__ void {n}_b(float* y, int n) {{\n"
            "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
            "    if (i < n) y[i] *= {c}f;\n}}",
            "{n}_a<<<(n + {t} - 1) / {t}, {t}>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);\n"
            "    {n}_b<<<(n + {t} - 1) / {t}, {t}>>>(out.data_ptr<float>(), n);"),
}


def kernel_code(style: str, name: str = "relu_scale", threads: int = 256, scale: str = "2.0",
                tag: str = "x") -> str:
    body, launch = BODIES[style]
    return KERNEL.format(body=body.format(n=name, c=scale, t=threads),
                         launch=launch.format(n=name, t=threads), tag=tag)


def make_task(i: int, cluster: str | None = None, level: int = 1) -> Task:
    src = REFERENCE.format(scale=i + 2, dim=1024 + i)
    return Task(
        task_id=f"task{i:03d}", name=f"relu_scale_{i}", source=src,
        cpu_source=src.replace("1024", "64"),
        input_specs=[TensorSpec("x", [16, 1024 + i], "float32")],
        output_specs=[TensorSpec("out", [16, 1024 + i], "float32")],
        op_inventory=["aten.relu", "aten.mul"], op_families=["activation", "elementwise"],
        flops=2.0 * 16 * (1024 + i), bytes_moved=8.0 * 16 * (1024 + i), level=level,
        reasoning="relu then a scalar multiply: one elementwise pass, memory-bound.",
        source_kind=["seed", "nnsmith", "git"][i % 3], repo_url="https://example.org/r.git",
        commit=f"{i:040x}", path=f"models/m{i}.py", dedup_cluster=cluster or f"c{i:03d}",
        license=["MIT", "Apache-2.0", "BSD-3-Clause"][i % 3],
        source_generator=f"nnsmith@v0 seed={i}" if i % 3 == 1 else "",
    )


def verdict(cand: Candidate, status: str, speedup: float | None = None, reward: float = 0.0,
            error: str = "", device: str = "NVIDIA H100 80GB HBM3") -> Verdict:
    correct = status in CORRECT_STATUSES
    eager = 40.0
    return Verdict(
        candidate_id=cand.candidate_id, task_id=cand.task_id, status=status,
        stage="done" if correct else {"compile_error": "compile", "incorrect": "correctness",
                                      "format_error": "extract"}.get(status, "correctness"),
        backend=cand.backend, device=device, verifier_version="0.1.0",
        compile_log=error if status == "compile_error" else "", error=error,
        trials=5 if correct else 0,
        runtime_us=eager / speedup if speedup else None, runtime_iqr_us=0.3 if speedup else None,
        eager_us=eager if speedup else None, compiled_us=eager * 0.8 if speedup else None,
        speedup=speedup, speedup_compiled=speedup * 0.8 if speedup else None,
        faster=bool(speedup and speedup > 1.1), reward=reward,
        feedback=f"status {status}" + (f": {error}" if error else ""),
        # what the verifier records when the generalisation check passed (dataset builds)
        findings=[Finding("generalised", "also correct at batch_size 16 -> 12", None, "info")]
        if correct else [],
    )


def candidate(task: Task, generator: str, code: str, *, parent: Candidate | None = None,
              turn: int = 0, meta: dict | None = None, response: str = "") -> Candidate:
    prompt = [Message("user", f"Optimize {task.name}")] if generator.startswith("llm:") else []
    return Candidate(Candidate.make_id(task.task_id, "cuda", code), task.task_id, "cuda",
                     generator, code, response, prompt,
                     parent.candidate_id if parent else None, turn, json.dumps(meta or {}))


COMPILE_ERRORS = [
    "kernel.cu(12): error: identifier \"tile\" is undefined",
    "error: no matching function for call to 'fmaxf(double, int)'",
    "undefined reference to `run(at::Tensor)'",
    "kernel.cu(3): error: expected a \";\"",
]


def pool(n_tasks: int = 6, seed: int = 0) -> tuple[list[Task], list[Candidate], list[Verdict]]:
    """Tasks with template, LLM, mutation and repair candidates and their verdicts."""
    rng = random.Random(seed)
    tasks = [make_task(i, cluster=f"c{i // 2:03d}", level=1 + i % 3) for i in range(n_tasks)]
    cands: list[Candidate] = []
    verdicts: list[Verdict] = []

    def add(c: Candidate, v: Verdict) -> Candidate:
        cands.append(c)
        verdicts.append(v)
        return c

    for t in tasks:
        tidx = int(t.task_id[4:])
        scale = f"{tidx + 2}.0"
        styles = ["plain", "vec4", "shared", "warp", "two"]
        for j, style in enumerate(styles):
            code = kernel_code(style, scale=scale, threads=[128, 256][j % 2], tag=f"t{j}")
            sp = round(0.8 + 0.3 * j + rng.random() * 0.1, 3)
            c = candidate(t, f"template:elementwise/{style}", code)
            add(c, verdict(c, "correct_fast" if sp > 1.1 else "correct_slow", sp, 1.0 + sp))
        if tidx == n_tasks - 1:
            # An all-failed LLM group: only compile errors and wrong answers.
            for j in range(3):
                code = kernel_code("plain", name=f"bad{j}", scale="9.0", tag=f"f{j}")
                st = "compile_error" if j < 2 else "incorrect"
                add(candidate(t, "llm:qwen", code, response=f"Try:\n```python\n{code}```"),
                    verdict(candidate(t, "llm:qwen", code), st, reward=0.1 * j,
                            error=COMPILE_ERRORS[j] if st == "compile_error" else "max diff 3.1"))
            continue
        for j in range(6):
            style = ["plain", "vec4", "shared"][j % 3]
            code = kernel_code(style, name=f"llm{j}", threads=64 * (j + 1), scale=scale,
                               tag=f"l{j}")
            c = candidate(t, "llm:qwen", code, response=f"Reasoning {j}.\n```python\n{code}```")
            if j % 3 == 2 and tidx % 2:
                add(c, verdict(c, "compile_error", reward=0.0,
                               error=COMPILE_ERRORS[(j + tidx) % len(COMPILE_ERRORS)]))
            else:
                sp = round(0.7 + 0.25 * j + rng.random() * 0.1, 3)
                add(c, verdict(c, "correct_fast" if sp > 1.1 else "correct_slow", sp, 1.0 + sp))
        # A failing attempt repaired in one turn.
        bad = kernel_code("plain", name="rep", scale="1.0", tag="r0")
        root = add(candidate(t, "llm:qwen", bad, response=f"```python\n{bad}```"),
                   verdict(candidate(t, "llm:qwen", bad), "incorrect", reward=0.3,
                           error="max abs diff 4.0"))
        fixed = kernel_code("plain", name="rep", scale=scale, tag="r1")
        add(candidate(t, "repair:1", fixed, parent=root, turn=1),
            verdict(candidate(t, "repair:1", fixed), "correct_slow", 1.0, 2.0))
        # A mutation of the first template kernel and its known fix.
        parent = next(c for c in cands
                      if c.task_id == t.task_id and c.generator.startswith("template:"))
        lines = parent.code.splitlines()
        k = next(i for i, s in enumerate(lines) if "if (i < n)" in s)
        mutated = list(lines)
        mutated[k] = mutated[k].replace("if (i < n)", "if (i <= n)")
        mcode = "\n".join(mutated) + "\n"
        if tidx % 2 == 0:  # the metadata pipeline.candidates.mutate writes
            meta = {"mutation": "off_by_one", "bug_line": k + 1,
                    "bug_description": "The bounds check lets thread n run past the end.",
                    "bug_before": "i < n", "bug_after": "i <= n",
                    "fix_candidate_id": parent.candidate_id, "fix_code": parent.code}
        else:  # only the kind and the original kernel: line and fix come from a diff
            meta = {"mutation": "off_by_one", "fix_code": parent.code}
        mut = add(candidate(t, "mutate:off_by_one", mcode, meta=meta),
                  verdict(candidate(t, "mutate:off_by_one", mcode), "runtime_error",
                          error="illegal memory access"))
        add(candidate(t, "repair:fix", parent.code + "\n", parent=mut, turn=1),
            verdict(candidate(t, "repair:fix", parent.code + "\n"), "correct_slow", 1.0, 2.0))
    return tasks, cands, verdicts


def raw_modules(tasks: list[Task]) -> list[RawModule]:
    return [RawModule(f"m{t.task_id}", t.source_kind, t.repo_url, t.commit, t.path, t.license,
                      "Model", t.source) for t in tasks] + [
        RawModule("m-extra", "git", "https://example.org/r.git", "0" * 40, "x.py", "MIT", "Bad",
                  "class Bad: pass")]


def rejections() -> list[Rejection]:
    return [Rejection.make("extract", "m-extra", "x.py", "no_forward", "Bad has no forward"),
            Rejection.make("curate", "task-dup", "models/dup.py", "near_duplicate", "dup of c000")]


def fill_workspace(ws, n_tasks: int = 6, run_id: str = "r1") -> None:  # noqa: ANN001
    """Write the synthetic pool, its raw modules and rejections as one run of `ws`."""
    tasks, cands, verdicts = pool(n_tasks)
    run = ws.new_run(run_id)
    for records in (raw_modules(tasks), tasks, cands, verdicts, rejections()):
        run.write(records)


def hf_offline(monkeypatch, tmp_path) -> Path:  # noqa: ANN001
    """Make `datasets` work offline with a private cache; returns the cache dir."""
    import datasets.config
    import huggingface_hub.constants

    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache
