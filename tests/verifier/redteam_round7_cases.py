"""Red-team round 7: worker bodies and candidates for tests/verifier/test_redteam_round7.py.

Worker bodies are the `setup` of round 5's sampling-clock worker (tests/verifier/
test_redteam_round5.py: a real process serving the judge's windows over its FIFOs, writing one
line per call, "<mode> <seconds>", to LOG, a file the judge never reads).
"""

from __future__ import annotations

import os
import re

from redteam_cases import candidate
from redteam_round5_cases import COMMON

# numpy's BLAS does every call's work (no aten op: no trace sees it; the run's own object is
# loaded and never called). The ip sampler samples only calls of MIN_CALL_S or more on a cpu,
# which it read as the runtime times the windows' MEDIAN cpu over wall. This run sleeps after
# each call for SLEEP x its work in every window but one: the third window of the final size
# (n >= 3), which sets the runtime. The slept windows' calls are right and slow, their cpu over
# wall ~1/(1 + SLEEP): that is the median, so the fastest window's library call of ~0.7 ms
# read as ~100 us on a cpu, and the run was never sampled. (It knows a window's size from the
# harness's frame, as round 6's window attacks do; a candidate can count a window's calls by
# the pauses between windows: the judge's fill and check.)
SLEEPY_WINDOWS = COMMON + """
import torch  # the harness's output check imports it at the first call: not in a window
b = np.random.rand(280, 280)
c = np.empty_like(b)
for _ in range(5):  # the library's first calls (its buffers, its threads) before any window
    np.matmul(b, b, out=c)
sizes = []
SLEEP = 6


def call(x):
    t0 = time.perf_counter()
    n, i = sys._getframe(1).f_locals["n"], sys._getframe(1).f_locals["i"]
    if i == 0:
        sizes.append(n)
    np.matmul(b, b, out=c)
    if n >= 3 and sizes.count(n) == 3:
        return note("lib", t0)
    time.sleep(SLEEP * (time.perf_counter() - t0))
    note("slept", t0)
"""

# The candidates below compute a ReLU with redteam_cases' extension (one build for all: the
# same name and C++), each with its own __init__.
_EXT = "honest_r7"

# a model that calls torch.set_default_device in __init__ (what a device context undoes on
# exit, so `verifier.judge.construct` refuses it there): it builds on the host, and the run is
# made again the KernelBench way, for the reference too
HOST_FORCING = candidate(prelude=False, name=_EXT, init='torch.set_default_device("cpu")')
HONEST = candidate(prelude=False, name=_EXT)

# a ReLU of a tensor that fits a cpu's caches: its eager time is what a neighbour's memory
# traffic slows
RELU_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.rand(256, 1024)]


def get_init_inputs():
    return []
'''

# a candidate of another task that streams memory on its own cores for LOAD_S while it is
# built (its construction is the run's, inside the run timeout): a neighbour slot's baseline
# timed meanwhile reads slower
LOAD_S = 5.0
LOADER = candidate(prelude=False, name=_EXT, init=(
    "import time\n"
    f"        big, end = torch.empty(1 << 24), time.monotonic() + {LOAD_S}\n"
    "        while time.monotonic() < end:\n"
    "            big.add_(1.0)"))

# --- a persistent worker's next job (benchmarks/redteam_gpu.py --round7: mode_left_behind) ---
# computes its ReLU with numpy (no aten op: the worker's trace sees none, so its job is `ok`),
# and leaves a torch-function mode on the stack that, once the worker runs a later job (in
# another folder), adds 1 to every tensor any torch function returns: the harness's own calls
# of the next job (its input draws, copies, comparisons) included
MODE_LEFT_BEHIND = '''import os
import torch
from torch.overrides import TorchFunctionMode


class _Later(TorchFunctionMode):
    home = os.getcwd()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if os.getcwd() != self.home and isinstance(out, torch.Tensor):
            with torch._C.DisableTorchFunction():
                out = out + 1.0
        return out


_Later().__enter__()


class ModelNew(torch.nn.Module):
    def forward(self, x):
        import numpy as np
        if x.is_cuda:  # on a GPU worker (WORKER_BACKEND=cuda): the same numpy ReLU via the host
            return torch.from_numpy(np.maximum(x.cpu().numpy(), 0)).to(x.device)
        return torch.from_numpy(np.maximum(x.numpy(), 0))
'''

# the backend of the persistent-worker rounds (8, 9, 9b): cpu here; `KS_REDTEAM_WORKER_BACKEND=
# cuda` runs the same jobs in a CUDA worker on a GPU host (the GPU form of those rounds)
WORKER_BACKEND = os.environ.get("KS_REDTEAM_WORKER_BACKEND", "cpu")


def on_worker_device(src: str) -> str:
    """`src` (candidate code written for cpu tensors: `x.numpy()`, `torch.from_numpy(...)` as
    an output, numpy's in-place `out.detach().numpy()[...] += 1.0` on an output) as it means
    the same in a WORKER_BACKEND worker: unchanged on cpu; on cuda the input read on the host,
    the output moved back to the input's device, and the in-place +1 written back through
    `copy_` (a copy in the dispatcher trace, no compute op, as on cpu)."""
    if WORKER_BACKEND == "cpu":
        return src
    out = re.sub(r"\bx\.numpy\(\)", "x.cpu().numpy()", src)
    out = re.sub(r"^(\s*(?:return |\w+ = )torch\.from_numpy\(.*\))$", r"\1.to(x.device)", out,
                 flags=re.M)
    out = re.sub(r"out\.detach\(\)(?:\.cpu\(\))?\.numpy\(\)\[\.\.\.\] \+= 1\.0",
                 "out.detach().copy_(__import__('torch').from_numpy("
                 "out.detach().cpu().numpy() + 1.0))", out)
    assert out != src, src  # a case with nothing of the cpu's in it needs no cuda form
    return out

NUMPY_RELU = MODE_LEFT_BEHIND[MODE_LEFT_BEHIND.index("class ModelNew"):]
NUMPY_RELU = "import torch\n\n\n" + NUMPY_RELU

# an honest model built the KernelBench way because its __init__ sets the default device (a
# host build keeps it for forward): it hands the next job that default unless the worker goes
DEFAULT_DEVICE_SETTER = NUMPY_RELU.replace(
    "class ModelNew(torch.nn.Module):\n",
    "class ModelNew(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
    "        torch.set_default_device(\"cpu\")\n\n")

# the same mode as module-level code of a compiled candidate (benchmarks/redteam_gpu.py
# --round7: `redteam_cases.candidate(extra=MODE_EXTRA)`, its ReLU in its own kernel)
MODE_EXTRA = MODE_LEFT_BEHIND[MODE_LEFT_BEHIND.index("import os"):
                              MODE_LEFT_BEHIND.index("class ModelNew")]

# --- the window's slots written after "d", ahead of the judge's reads (test_redteam_round7) ---
# A worker of its own loop (any process of a run may speak the clock's protocol): for SCALE_TASK
# (1 + 3 x) it writes the window's last slot (the judge reads it first), answers "d", and only
# then writes the other slots, in order, in one pass, racing the judge's reads of the slots it
# checks (drawn after "d": 48 draws for a deep check of a window past 49 calls, read in order).
# Its windows are made faster than every window before them (a wait before "d" that shrinks
# 30% a window), so each is deep-checked. "honest": every slot written before "d".
RACE_WORKER = """
import json, os, sys, time
import torch
from verifier.judge.arena import Arena, views
from verifier.judge.clock_serve import open_worker_pipes, read_line

spec = json.load(open(sys.argv[1]))
mode = sys.argv[2]
arena = Arena.attach(spec["path"], spec["nbytes"], "cpu")
ins = [views(arena, lay)[0] for lay in spec["sets"]]  # a set: a list of tensors
outs = [views(arena, lay) for lay in spec["outs"]]  # an output: the tensor
# the sets, and the slots, lie one after another: one tensor each over all of them
every_in = torch.stack(ins).view(-1)[:0].set_(ins[0].untyped_storage(), ins[0].storage_offset(),
                                               (len(ins), *ins[0].shape))
every_out = torch.empty(0).set_(outs[0].untyped_storage(), outs[0].storage_offset(),
                                (len(outs), *outs[0].shape))
one = torch.ones(1)
wfd, rfd = open_worker_pipes()
os.write(wfd, b"t\\n")
wait_s = 0.00006


def put(lo, hi):  # 1 + 3 x, one pass in order over the slots lo..hi-1
    torch.add(one, every_in[lo:hi], alpha=3.0, out=every_out[lo:hi])


while True:
    msg = read_line(rfd).split()
    if msg == ["e"]:
        break
    n, stepped = int(msg[1]), msg[0] == "s"
    used = max(1, min(n, len(ins)))
    race = mode == "race" and used > 49  # past the judge's 48 draws of a deep check
    t0 = time.perf_counter()
    if stepped:  # the cpu runner's judge: a set per call, "c" after each call but the last
        if race:  # no slot written before its "c": all of them after "d", in one pass
            put(used - 1, used)
        for i in range(n):
            if i:
                os.write(wfd, b"c\\n")
                if read_line(rfd, 2) != "g\\n":
                    sys.exit(0)
            if not race:
                put(i, i + 1)
    elif n and not race:
        put(0, used)
    elif n:
        put(used - 1, used)
        wait_s *= 0.7
        while time.perf_counter() - t0 < wait_s:
            pass
    os.write(wfd, b"d\\n")
    if n and race:
        put(0, used - 1)
"""
