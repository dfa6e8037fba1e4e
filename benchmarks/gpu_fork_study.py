"""Which imports poison CUDA for forked children, and what a fresh process pays (device only).

Each experiment starts a parent that runs a setup line, forks a child, and has the child
initialize CUDA and open two profiler sessions; prints the parent's thread count and the child's
costs (or its error). Then splits the profiler's start-up cost in a fresh process (CPU-only
session first). Measured on an H100 (2026-11-22): `import torch` alone forks fine (child CUDA
init 0.35-0.5 s); importing torch.utils.cpp_extension/torch.profiler without NVML poisons the
fork; the first profiler session of a process costs 4.5-6.5 s whatever its activities, and a CPU
session in the parent breaks CUDA in the child. Hence: a fork server for CPU-side sandboxed runs
(verifier.forkserver, NVML check on) and a persistent worker per GPU (verifier.gpu_worker).

    python3 benchmarks/gpu_fork_study.py
"""

import os
import subprocess
import sys
import time

EXPERIMENTS = {
 "import_torch_only": "import torch",
 "import_torch_nvml_env": "import os; os.environ['PYTORCH_NVML_BASED_CUDA_CHECK']='1'; import torch",
 "torch_cpp_ext_profiler": "import torch, torch.utils.cpp_extension, torch.profiler",
 "after_is_available_nvml": "import os; os.environ['PYTORCH_NVML_BASED_CUDA_CHECK']='1'; import torch; torch.cuda.is_available()",
 "preload_cupti": "import torch, torch.profiler, ctypes, glob, os; [ctypes.CDLL(p) for p in glob.glob(os.path.join(os.path.dirname(torch.__file__), '..', 'nvidia', '*', 'lib', 'libcupti.so*'))[:1]]",
 "cpu_profile_in_parent": "import torch\nfrom torch.profiler import profile, ProfilerActivity\nwith profile(activities=[ProfilerActivity.CPU]): torch.ones(2)+1",
}
CHILD = r'''
import json, os, sys, threading, time
setup = sys.argv[1]
t = time.monotonic(); exec(setup); setup_s = time.monotonic() - t
import torch
info = {"setup_s": setup_s, "threads_py": threading.active_count(),
        "tasks": len(os.listdir("/proc/self/task")), "cuda_initialized": torch.cuda.is_initialized()}
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r); out = {}
    try:
        out["bad_fork"] = bool(torch._C._cuda_isInBadFork())
        t = time.monotonic(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
        out["cuda_init_s"] = time.monotonic() - t
        from torch.profiler import profile, ProfilerActivity
        for k in ("prof1_s", "prof2_s"):
            t = time.monotonic()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
                torch.ones(4, device="cuda").add_(1); torch.cuda.synchronize()
            out[k] = time.monotonic() - t
        out["n_kernels"] = sum(1 for e in p.events() if e.device_type != torch.autograd.DeviceType.CPU)
    except BaseException as e:
        out["error"] = repr(e)[:300]
    os.write(w, json.dumps(out).encode()); os._exit(0)
os.close(w); data = b""
while True:
    c = os.read(r, 65536)
    if not c: break
    data += c
os.waitpid(pid, 0)
info["child"] = json.loads(data)
print(json.dumps(info))
'''
for name, setup in EXPERIMENTS.items():
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-W", "ignore", "-c", CHILD, setup], capture_output=True, text=True, timeout=120)
    line = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr[-400:]
    print(f"{name:28} {time.monotonic()-t:5.1f}s {line}", flush=True)
# profiler cost split in a fresh process
SPLIT = r'''
import time, torch, json
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
from torch.profiler import profile, ProfilerActivity
o = {}
t = time.monotonic()
with profile(activities=[ProfilerActivity.CPU]): torch.ones(4, device="cuda").add_(1)
o["cpu_only_s"] = time.monotonic() - t
t = time.monotonic()
with profile(activities=[ProfilerActivity.CUDA]) as p: torch.ones(4, device="cuda").add_(1); torch.cuda.synchronize()
o["cuda_first_s"] = time.monotonic() - t
t = time.monotonic()
with profile(activities=[ProfilerActivity.CUDA]) as p: torch.ones(4, device="cuda").add_(1); torch.cuda.synchronize()
o["cuda_second_s"] = time.monotonic() - t
print(json.dumps(o))
'''
for env_extra in ({}, {"KINETO_USE_DAEMON": "0", "KINETO_LOG_LEVEL": "5"}):
    p = subprocess.run([sys.executable, "-c", SPLIT], capture_output=True, text=True, timeout=120, env={**os.environ, **env_extra})
    print("profiler split", env_extra, p.stdout.strip()[-300:] or p.stderr[-300:], flush=True)
