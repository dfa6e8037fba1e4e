"""The adversarial suite: candidates with their expected statuses (relu and linear tasks)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verifier.protocol import CORRECT_STATUSES

CORRECT = set(CORRECT_STATUSES)

def relu_task(rows: int, cols: int) -> str:
    """A task file: torch.relu over one (rows, cols) fp32 input."""
    return f'''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn({rows}, {cols})]


def get_init_inputs():
    return []
'''


# x * 3 + 1 over a 64 x 32 input: the judge's clock tests' task (fast: no compile)
SCALE_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 3.0 + 1.0


def get_inputs():
    return [torch.randn(64, 32)]


def get_init_inputs():
    return []
'''

# tests/conftest.py serves these two tasks as fixtures too.
RELU_TASK = '''import torch
import torch.nn as nn

batch_size = 16
dim = 1024


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
'''

LINEAR_TASK = '''import torch
import torch.nn as nn

batch_size = 8
in_features = 64
out_features = 32


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(self.fc(x))


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
'''

HEAD = "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n"


def relu_candidate(body: str, fn: str = "relu_fwd", forward: str | None = None,
                   extra: str = "", cflags: str = '["-O3", "-fopenmp"]') -> str:
    """A relu-task candidate around C++ `body` defining `fn(torch::Tensor x)`."""
    fwd = forward or f"return ext.{fn}(x)"
    return (HEAD + extra + f'\ncpp_source = r"""\n{body}\n"""\n\n'
            f'ext = load_inline(name="ext", cpp_sources=cpp_source, functions=["{fn}"],\n'
            f'                  extra_cflags={cflags}, extra_ldflags=["-fopenmp"])\n\n\n'
            "class ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n\n"
            f"    def forward(self, x):\n        {fwd}\n")


RELU_LOOP = """
torch::Tensor {fn}(torch::Tensor x) {{
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    int64_t n = xc.numel();
    {pragma}
    for (int64_t i = 0; i < n; ++i) o[i] = in[i] > 0.f ? in[i] : 0.f;
    return out;
}}
"""


def relu_ok(fn: str = "relu_fwd", pragma: str = "#pragma omp parallel for") -> str:
    return relu_candidate(RELU_LOOP.format(fn=fn, pragma=pragma), fn)


LINEAR_KERNEL = """
torch::Tensor linear_relu(torch::Tensor x, torch::Tensor w, torch::Tensor b) {{
    auto xc = x.contiguous(); auto wc = w.contiguous();
    int64_t B = xc.size(0), K = xc.size(1), N = wc.size(0);
    auto out = torch::empty({{B, N}}, xc.options());
    const float* px = xc.data_ptr<float>(); const float* pw = wc.data_ptr<float>();
    const float* pb = b.data_ptr<float>(); float* po = out.data_ptr<float>();
    {decl}
    {pragma}
    for (int64_t r = 0; r < B * N; ++r) {{
        int64_t i = r / N, j = r % N;
        {init}
        for (int64_t k = 0; k < K; ++k) acc += px[i * K + k] * pw[j * K + k{off}];
        acc += pb[j];
        po[r] = acc > 0.f ? acc : 0.f;
    }}
    return out;
}}
"""


def linear_candidate(decl: str = "", init: str = "float acc = 0.f;", off: str = "",
                     pragma: str = "#pragma omp parallel for", forward: str | None = None,
                     init_sig: str = "in_features, out_features") -> str:
    body = LINEAR_KERNEL.format(decl=decl, init=init, off=off, pragma=pragma)
    fwd = forward or "return ext.linear_relu(x, self.fc.weight, self.fc.bias)"
    return (HEAD + f'\ncpp_source = r"""\n{body}\n"""\n\n'
            'ext = load_inline(name="lin", cpp_sources=cpp_source, functions=["linear_relu"],\n'
            '                  extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"])\n\n\n'
            f"class ModelNew(nn.Module):\n    def __init__(self, {init_sig}):\n"
            "        super().__init__()\n"
            "        self.fc = nn.Linear(in_features, out_features)\n\n"
            f"    def forward(self, x):\n        {fwd}\n")


def _sub(body: str) -> str:
    return f"torch::Tensor relu_fwd(torch::Tensor x) {{\n{body}\n}}"


DYNAMIC_SOURCE = HEAD + '''
OP = ">"
cpp_source = "\\n".join([
    "torch::Tensor relu_dyn(torch::Tensor x) {",
    "  auto xc = x.contiguous(); auto out = torch::empty_like(xc);",
    "  const float* in = xc.data_ptr<float>(); float* o = out.data_ptr<float>();",
    "  for (int64_t i = 0; i < xc.numel(); ++i) o[i] = in[i] %s 0.f ? in[i] : 0.f;" % OP,
    "  return out;",
    "}",
])
ext = load_inline(name="dyn", cpp_sources=[cpp_source], functions=["relu_dyn"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu_dyn(x)
'''

OWN_MODULE = HEAD + '''
src = r"""
#include <torch/extension.h>
torch::Tensor relu_own(torch::Tensor x) {
  auto xc = x.contiguous(); auto out = torch::empty_like(xc);
  const float* in = xc.data_ptr<float>(); float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < xc.numel(); ++i) o[i] = in[i] > 0.f ? in[i] : 0.f;
  return out;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("relu_own", &relu_own); }
"""
ext = load_inline(name="own", cpp_sources=src)


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu_own(x)
'''

MARKDOWN = ("Here is an optimized ReLU.\n\n```python\n" + relu_ok("relu_md", "") +
            "```\n\nIt uses a plain loop.")

LAZY = relu_candidate(RELU_LOOP.format(fn="relu_fwd", pragma=""), extra='''
class Lazy(torch.Tensor):
    pass
''', forward="return ext.relu_fwd(x).as_subclass(Lazy)")

CACHED = relu_candidate(RELU_LOOP.format(fn="relu_fwd", pragma=""), extra='''
_memo = {}
''', forward="return _memo.setdefault(tuple(x.shape), ext.relu_fwd(x))")

HIDDEN_PATCH = relu_candidate(RELU_LOOP.format(fn="relu_fwd", pragma=""), extra='''
_mod = torch
_mod.allclose = lambda *a, **k: True
''')

CASES: list[tuple[str, str, set[str], str]] = [
    # name, task, expected statuses, response
    ("correct_omp", "relu", CORRECT, relu_ok()),
    ("correct_plain", "relu", CORRECT, relu_ok("relu_plain", "")),
    ("correct_linear", "linear", CORRECT, linear_candidate()),
    ("correct_own_pybind_module", "relu", CORRECT, OWN_MODULE),
    ("correct_dynamic_sources", "relu", CORRECT, DYNAMIC_SOURCE),
    ("correct_markdown", "relu", CORRECT, MARKDOWN),
    ("format_prose_only", "relu", {"format_error"}, "I would write a CUDA kernel for this."),
    ("format_syntax", "relu", {"format_error"}, "```python\nclass ModelNew(nn.Module)\n```"),
    ("format_no_modelnew", "relu", {"format_error"}, HEAD + "class Foo(nn.Module):\n    pass\n"),
    ("format_signature", "linear", {"format_error"},
     linear_candidate(init_sig="").replace("nn.Linear(in_features, out_features)",
                                           "nn.Linear(64, 32)")),
    ("static_torch_relu", "relu", {"static_reject"},
     relu_ok().replace("return ext.relu_fwd(x)", "return torch.relu(x)")),
    ("static_try_fallback", "relu", {"static_reject"}, relu_ok().replace(
        "return ext.relu_fwd(x)",
        "try:\n            return ext.relu_fwd(x)\n        except Exception:\n"
        "            return x.clamp(min=0)")),
    ("static_subclass_model", "relu", {"static_reject"},
     relu_ok().replace("class ModelNew(nn.Module)", "class ModelNew(Model)")),
    ("static_tensor_method", "relu", {"static_reject"},
     relu_ok().replace("return ext.relu_fwd(x)", "return x.clamp(min=0)")),
    ("static_patch_timer", "relu", {"static_reject"},
     relu_ok().replace("class ModelNew", "import time\ntime.perf_counter = lambda: 0.0\n\n\n"
                                         "class ModelNew")),
    ("static_thread", "relu", {"static_reject"},
     relu_ok().replace("import torch\n", "import torch\nimport threading\n", 1)),
    ("static_half", "relu", {"static_reject"},
     relu_ok().replace("return ext.relu_fwd(x)", "return ext.relu_fwd(x.half()).float()")),
    ("static_env_file", "relu", {"static_reject"},
     relu_ok().replace("class ModelNew", "TOKEN = open('/etc/hostname').read()\n\n\n"
                                         "class ModelNew")),
    ("static_subprocess", "relu", {"static_reject"},
     relu_ok().replace("import torch\n", "import subprocess\nimport torch\n", 1)),
    ("static_cpp_aten", "relu", {"static_reject"}, relu_candidate(
        _sub("  return at::relu(x);"))),
    ("static_cpp_matmul", "linear", {"static_reject"}, linear_candidate().replace(
        "auto xc = x.contiguous(); auto wc = w.contiguous();",
        "return at::relu(at::matmul(x, w.t()) + b);")),
    ("static_cpp_file", "relu", {"static_reject"}, relu_candidate(
        _sub('  FILE* f = fopen("/etc/passwd", "r");\n  return x;'))),
    ("static_cpp_thread", "relu", {"static_reject"}, relu_candidate(
        "#include <thread>\n" + RELU_LOOP.format(fn="relu_fwd", pragma="").replace(
            "return out;", "std::thread t([]{}); t.join();\n    return out;"))),
    ("static_compiler_flag", "relu", {"static_reject"}, relu_candidate(
        RELU_LOOP.format(fn="relu_fwd", pragma=""), cflags='["-O3", "-fplugin=/tmp/evil.so"]')),
    ("static_nn_layer", "linear", {"static_reject"},
     linear_candidate(forward="return ext.linear_relu(self.fc(x), self.fc.weight, self.fc.bias)")),
    ("static_side_stream", "relu", {"static_reject"},
     relu_ok().replace("return ext.relu_fwd(x)",
                       "s = torch.cuda.Stream()\n        return ext.relu_fwd(x)")),
    ("cheat_hidden_aten", "relu", {"cheat"}, relu_candidate(
        _sub("  return x.clamp_min(0);"))),
    ("cheat_lazy_tensor", "relu", {"cheat"}, LAZY),
    ("cheat_cached_result", "relu", {"cheat"}, CACHED),
    ("cheat_hidden_patch", "relu", {"cheat"}, HIDDEN_PATCH),
    ("incorrect_zeros", "relu", {"incorrect"}, relu_candidate(
        _sub("  return torch::zeros_like(x);"))),
    ("incorrect_input_mutation", "relu", {"incorrect"}, relu_candidate(_sub(
        "  float* p = x.data_ptr<float>();\n"
        "  for (int64_t i = 0; i < x.numel(); ++i) p[i] = p[i] > 0.f ? p[i] : 0.f;\n"
        "  return x;"))),
    ("incorrect_off_by_one", "relu", {"incorrect"}, relu_candidate(
        RELU_LOOP.format(fn="relu_fwd", pragma="").replace(
            "o[i] = in[i] > 0.f ? in[i] : 0.f;",
            "o[i] = i > 0 && in[i - 1] > 0.f ? in[i - 1] : 0.f;"))),
    ("incorrect_bounds_stride", "linear", {"incorrect"}, linear_candidate(off=" + 1")),
    # a race shows by chance: in the trials (`incorrect`), or only in a timed window, which
    # the judge cannot tell from a kernel that misbehaves only when timed (`cheat`; CI met it)
    ("incorrect_race", "relu", {"incorrect", "cheat"}, relu_candidate(
        "#include <omp.h>\n" + _sub(
            "  auto out = torch::empty_like(x);\n"
            "  const float* in = x.data_ptr<float>(); float* o = out.data_ptr<float>();\n"
            "  static float scratch[1024];  // shared by all threads: a data race\n"
            "  volatile float* vs = scratch;\n"
            "  int64_t rows = x.size(0), cols = x.size(1);\n"
            "  #pragma omp parallel for num_threads(8)\n"
            "  for (int64_t r = 0; r < rows; ++r) {\n"
            "    for (int64_t c = 0; c < cols; ++c) vs[c] = in[r * cols + c];\n"
            "    for (volatile int spin = 0; spin < 2000000; ++spin) {}\n"
            "    for (int64_t c = 0; c < cols; ++c)\n"
            "      o[r * cols + c] = vs[c] > 0.f ? vs[c] : 0.f;\n"
            "  }\n"
            "  return out;"))),
    ("incorrect_dtype", "relu", {"incorrect"}, relu_candidate(_sub(
        "  auto out = torch::empty(x.sizes(), x.options().dtype(torch::kFloat64));\n"
        "  const float* in = x.data_ptr<float>(); double* o = out.data_ptr<double>();\n"
        "  for (int64_t i = 0; i < x.numel(); ++i) o[i] = in[i] > 0.f ? in[i] : 0.f;\n"
        "  return out;"))),
    ("compile_syntax", "relu", {"compile_error"}, relu_candidate(_sub(
        "  auto out = torch::empty_like(x)\n  return out;"))),
    ("compile_undefined", "relu", {"compile_error"}, relu_candidate(
        "torch::Tensor helper(torch::Tensor x);\n" + _sub("  return helper(x);"))),
    ("crash_segfault", "relu", {"runtime_error"}, relu_candidate(_sub(
        "  volatile float* p = nullptr;\n  p[12345] = 1.f;\n  return x;"))),
    ("crash_abort", "relu", {"runtime_error"}, relu_candidate(
        "#include <cstdlib>\n" + _sub("  std::abort();\n  return x;"))),
    ("crash_infinite_loop", "relu", {"timeout"}, relu_candidate(_sub(
        "  volatile int64_t k = 0;\n  while (true) { k = k + 1; }\n  return x;"))),
    ("crash_oom", "relu", {"runtime_error"}, relu_candidate(
        "#include <vector>\n" + _sub(
            "  std::vector<float> big((size_t)1 << 38, 1.f);\n  x.data_ptr<float>()[0] = big[7];"
            "\n  return x;"))),
    ("crash_stdout_flood", "relu", {"runtime_error", "timeout"}, relu_candidate(
        "#include <cstdio>\n" + _sub(
            "  static char buf[1 << 20];\n  for (int i = 0; i < (1 << 20); ++i) buf[i] = 'x';\n"
            "  for (int j = 0; j < 1024; ++j) fwrite(buf, 1, sizeof(buf), stdout);\n"
            "  return x;"))),
    ("crash_fork_bomb", "relu", {"runtime_error", "timeout"}, relu_candidate(
        "#include <sys/types.h>\n#define CAT(a, b) a##b\nextern \"C\" pid_t CAT(fo, rk)(void);\n"
        + _sub("  pid_t (*spawn)(void) = CAT(fo, rk);\n  for (;;) { spawn(); }\n  return x;"))),
]


def serve_in_thread(workdir: Path, spec: dict[str, Any], forward: Callable[..., Any] | None = None,
                    *, forward_of: Callable[[list, list], Callable[..., Any]] | None = None,
                    put_of: Callable[[list], Callable[[int, Any], None]] | None = None,
                    raised: list[BaseException] | None = None) -> threading.Thread:
    """The worker's side of the judge's windows in a started thread, as verifier.run.worker
    serves them: the arena mapped by `spec["path"]`, the clock's pipes in `workdir`, the calls
    `forward` (or `forward_of(sets, slots)`), call i's output filled into slot i (or by
    `put_of(slots)`). What ends it early (OSError: the judge stopped; ValueError: the harness
    refused an output) is kept in `raised`."""
    # imported here: conftest imports this module, and the judge's modules import torch
    from verifier.judge import clock_serve
    from verifier.judge.arena import Arena, fill, views

    kept = raised if raised is not None else []

    def target() -> None:
        old = os.getcwd()
        os.chdir(workdir)
        arena = Arena.attach(spec["path"], spec["nbytes"], "cpu")
        try:
            sets = [views(arena, layout) for layout in spec["sets"]]
            slots = [views(arena, layout) for layout in spec["outs"]]
            call = forward_of(sets, slots) if forward_of is not None else forward
            put = put_of(slots) if put_of is not None else (lambda i, out: fill(slots[i], out))
            clock_serve.serve_windows(clock_serve.open_worker_pipes(), call, sets, put,
                                      lambda: None)
        except (OSError, ValueError) as exc:
            kept.append(exc)
        finally:
            os.chdir(old)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t


def answer_in_thread(workdir: Path, window: Callable[[int], None]) -> threading.Thread:
    """The clock's protocol spoken by hand in a started thread (no harness: a rogue, or a
    worker with its own timing): "t", then `window(n)` and "d" for each "w n", until "e"."""
    from verifier.judge import clock_serve  # as in serve_in_thread: torch only when called

    def target() -> None:
        old = os.getcwd()
        os.chdir(workdir)
        wfd, rfd = clock_serve.open_worker_pipes()
        os.chdir(old)
        os.write(wfd, b"t\n")
        while (msg := clock_serve.read_line(rfd).split()) != ["e"]:
            window(int(msg[1]))
            os.write(wfd, b"d\n")
        os.close(wfd)
        os.close(rfd)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t


def tmp_venv(root: Path) -> Path:
    """A venv under /tmp (pytest's tmp_path) whose site-packages reach this one's through a
    .pth, as `python -m venv` + `pip install` would have it: bin/python links to the base."""
    assert str(root).startswith("/tmp/"), root
    venv = root / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "ks_parent.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


# the backend of the persistent-worker loop below (as `redteam_round7_cases.WORKER_BACKEND`):
# cpu here; `KS_REDTEAM_WORKER_BACKEND=cuda` on a GPU host runs the same jobs in a CUDA worker
# (the task's inputs drawn on the GPU, the judge in its referee process beside it)
LOOP_BACKEND = os.environ.get("KS_REDTEAM_WORKER_BACKEND", "cpu")


def skip_without_worker_device() -> None:
    """Skip the calling test module when the loop's backend is cuda and no GPU is visible (or
    no numpy: the honest siblings of the worker rounds are numpy models)."""
    if LOOP_BACKEND == "cuda":
        import importlib.util

        import pytest
        import torch

        if not torch.cuda.is_available():
            pytest.skip("KS_REDTEAM_WORKER_BACKEND=cuda: torch.cuda.is_available() is False "
                        "(run these on a GPU host, or unset it for the cpu loop)",
                        allow_module_level=True)
        if importlib.util.find_spec("numpy") is None:
            pytest.skip("KS_REDTEAM_WORKER_BACKEND=cuda: numpy is not installed here, and the "
                        "honest siblings of these rounds are numpy models",
                        allow_module_level=True)


def loop_runner(timeout_s: float = 60.0, backend: str | None = None
                ) -> tuple[Any, Callable[[str], dict[str, Any]]]:
    """A `GpuRunner` on `backend`'s persistent loop (LOOP_BACKEND when None: cpu, the judge
    in this process; cuda, the judge in a referee process on the GPU), one worker, and the
    job of a nonce as `verifier.stages.execute` makes it (built on the device)."""
    from verifier.judge.construct import DEVICE
    from verifier.judge.inputs import trial_input_seed
    from verifier.protocol import VerifyOptions
    from verifier.run.gpu_runner import GpuRunner
    from verifier.stages import JOB_OPTIONS

    backend = backend or LOOP_BACKEND
    opts = VerifyOptions(backend=backend, workers=1, run_timeout_s=timeout_s, trials=2,
                         perf_trials=2, perf_warmup=1)
    runner = GpuRunner(opts, {}, backend)

    def job(nonce: str) -> dict[str, Any]:
        return {"nonce": nonce, "backend": backend, "input_seed": trial_input_seed(),
                "variants": [], "options": {**{k: getattr(opts, k) for k in JOB_OPTIONS},
                                            "construct": DEVICE}}

    return runner, job


def cpu_loop_jobs(sources: list[str], prefix: str, task: str | None = None,
                  timeout_s: float = 60.0, backend: str | None = None) -> tuple[list[Any], int]:
    """One `GpuRunner` on its persistent loop (one worker, the judge's arena and clock; cpu
    unless `backend` or LOOP_BACKEND says cuda), a job of `task` (a 256 x 256 relu when None)
    per source (nonces `prefix`-i), in order: the outcomes, and how many runs it made again
    in a fresh worker. Jobs after jobs in one worker are where one job's residue reaches
    another."""
    from types import SimpleNamespace

    runner, job_of = loop_runner(timeout_s, backend)
    task = task or relu_task(256, 256)
    outs = []
    try:
        for i, src in enumerate(sources):
            item = SimpleNamespace(req=SimpleNamespace(task_source=task, task_id="relu"),
                                   built={}, specs=[], code=src)
            outs.append(runner.run(item, job_of(f"{prefix}-{i}")))
    finally:
        runner.close()
    return outs, runner.confirmations
