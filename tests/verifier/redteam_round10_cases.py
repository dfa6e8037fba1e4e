"""Red-team round 10: what a persistent worker's job leaves to run in a later job, for tests/
verifier/test_redteam_round10.py (an honest numpy ReLU around each) and benchmarks/redteam_gpu.py
--round10 (a compiled ReLU around each, `redteam_cases.candidate(extra=...)`).

Each `EXTRA` is module-level code: it defines `later()`, which rebinds `torch.relu` (whatever job
it runs in "changed" a watched torch function: that job is a cheat), and hangs something that
runs `later` as it dies on the harness's `load_inline` shim of the job (which the next job's
`install_shim` replaced), or on an object that lives as long as the worker.
"""

from __future__ import annotations

HEAD = """
import sys, weakref


def later(*_a):
    import torch
    torch.relu = lambda x: x


class Anchor:
    pass


shim = sys.modules["torch.utils.cpp_extension"].load_inline
"""

ARMS = {
    # a finalizer of the candidate's own, named as torch's (`__module__` is writable)
    "spoof": """
later.__module__ = "torch.fx.passes"
shim.anchor = Anchor()
weakref.finalize(shim.anchor, later)
""",
    # a real torch function that runs the source it is given
    "exec": """
import torch.fx.graph_module as gm
shim.anchor = Anchor()
weakref.finalize(shim.anchor, gm._exec_with_source, "import torch\\ntorch.relu = abs\\n", {})
""",
    # no finalizer at all: an object alive at the settle whose last reference the next job drops
    "del": """
Anchor.__del__ = later
shim.anchor = Anchor()
""",
    # a finalizer named as torch's on an object as long-lived as the worker: it runs as the
    # worker exits, but a later job that dropped its object would run it; the settle names it
    "kept": """
later.__module__ = "torch.fx.passes"
weakref.finalize(sys.modules["torch"], later)
""",
}


def extra(name: str) -> str:
    """Module-level code of the attack `name` (nothing of the module keeps the shim alive)."""
    return HEAD + ARMS[name] + "del shim\n\n\n"


# an operator of torch's own Tensor class rebound (only the public callables of a module were
# compared between jobs): every later job of the worker computes `x * 2` as 2x + 1
DUNDER_EXTRA = """
import torch
torch.Tensor.__mul__ = lambda a, b: torch.mul(a, b).add(1)
"""
# what the next job asks: its error says what `torch.ones(2) * 2` is there
ASK_MUL = "raise RuntimeError(f'mul={(torch.ones(2) * 2).tolist()}')"


# the process's own settings, changed for every later job of the worker: a lower priority and
# a 0.5 s thread switch (slower windows under load), 64 descriptors, a cpu-time limit, the
# hang report's signal blocked, a recursion limit, a thread stack size, an int digit limit
SETTINGS_EXTRA = """
import os, resource, signal, sys, threading
sys.setrecursionlimit(400)
os.nice(7)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
resource.setrlimit(resource.RLIMIT_CPU, (3000, resource.getrlimit(resource.RLIMIT_CPU)[1]))
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
sys.setswitchinterval(0.5)
threading.stack_size(65536)
sys.set_int_max_str_digits(640)
"""
ASK_SETTINGS = ("import os, resource, signal, sys, threading; raise RuntimeError("
                "f'rec={sys.getrecursionlimit()} nofile="
                "{resource.getrlimit(resource.RLIMIT_NOFILE)[0]} "
                "mask={sorted(signal.pthread_sigmask(signal.SIG_BLOCK, []))} "
                "switch={sys.getswitchinterval()} stack={threading.stack_size()}')")
# no file or directory the next job makes is usable: the worker dies with that job
UMASK_EXTRA = """
import os
os.umask(0o777)
"""
# the worker's stdout replaced: its `flush`, which the worker calls after every job, frames
# the job after this one (its first flush is this job's own)
STREAM_EXTRA = """
import sys


class Stream:
    def __init__(self, inner):
        self.inner, self.flushes = inner, 0

    def write(self, text):
        return self.inner.write(text)

    def flush(self):
        self.flushes += 1
        if self.flushes > 1:
            import torch
            torch.relu = abs
        return self.inner.flush()


sys.stdout = Stream(sys.stdout)
"""


# --- what the parent takes from the worker's result beside the verdict ---------------------
# The worker's result is the candidate's to write (its process: frames here, PyRun from C++ as
# redteam_cases.PYRUN_CPP does). Its diagnostics (`phase_s`, seconds per phase, for the
# benchmarks) are read by the batch loop outside the per-candidate guard: a value that is not
# a number ended verify_batch for every candidate of the batch.
FORGE_EXTRA = """
import sys


def forge(**fields):
    f = sys._getframe()
    while f is not None and not hasattr(f.f_locals.get("res"), "data"):
        f = f.f_back
    if f is not None:
        f.f_locals["res"].data.update(fields)
"""
PHASES_FORWARD = 'forge(phase_s={"load": "a while"}); return ext.relu_fwd(x)'
# findings that are not records, then a NameError: the feedback's hint read them as records
FINDINGS_FORWARD = "forge(findings=[1]); raise NameError(\"name 'zzz' is not defined\")"
# 6 MB of findings (a 7 MB verdict), a generalisation check of its own, a 100 kB stage name
BULK_FORWARD = ("forge(findings=[{'rule': 'generalised', 'severity': 'info', 'line': None, "
                "'message': 'also correct at every size'}] + [{'rule': 'note', 'severity': "
                "'info', 'line': None, 'message': 'A' * 3000}] * 2000, stage='S' * 100000, "
                "kernel_names=['K' * 10000] * 100); return ext.relu_fwd(x)")

# --- the timed calls' trace, blinded ----------------------------------------------------------
# What the timed calls ran is recorded in the worker (`verifier.judge.op_trace.OpNames`, the
# candidate's process) and held against the trials' trace there. A run whose own kernel does
# the trials and whose timed calls run torch's op swaps the recorder's set for a new one as the
# windows begin: the harness reads the old one, empty. On a cpu the judge's sampler (its own
# process) still sees the library's time; on a GPU the worker's records are all there is
# (benchmarks/redteam_gpu.py --round10: "blind" there is a GPU hole unless it is a cheat).
BLIND_EXTRA = """
import gc, sys

BLINDED = []


def timing():
    f = sys._getframe()
    while f is not None and f.f_code.co_name != "serve_windows":
        f = f.f_back
    return f is not None


def blind():
    if not BLINDED:
        BLINDED.append(1)
        for o in gc.get_objects():
            if type(o).__name__ == "OpNames":
                o.names = set()
"""
BLIND_FORWARD = ("if timing():\n            blind()\n            return torch.relu(x)\n"
                 "        return ext.relu_fwd(x)")

# --- the worker's own exchange: json and socket ------------------------------------------------
# The worker writes each result with `json.dumps`: `JSONEncoder.encode` rebound made the next
# job's result "incorrect" under that job's own nonce (the attacker's own result is left alone)
ENCODER_EXTRA = """
import json

_encode = json.JSONEncoder.encode
OWN = []


def framing(self, o):
    if isinstance(o, dict) and o.get("nonce") and o.get("outcome") == "ok":
        OWN.append(o["nonce"])
        if OWN[0] != o["nonce"]:  # a later job's result
            o = {**o, "outcome": "incorrect", "error": "framed by an earlier job"}
    return _encode(self, o)


json.JSONEncoder.encode = framing
"""
# and reads each job with `json.loads` (`json._default_decoder.decode`): an attribute of that
# object made every later job run another candidate than the one sent
DECODER_EXTRA = """
import json

_decode = json._default_decoder.decode


def swap(s, *a, **k):
    o = _decode(s, *a, **k)
    if isinstance(o, dict) and "candidate_source" in o:
        o["candidate_source"] = "raise RuntimeError('not the candidate that was sent')"
    return o


json._default_decoder.decode = swap
"""

# --- a hygiene check's own reader rebound -------------------------------------------------------
# round 7's torch-function mode left on the stack (it adds 1 to every later job's tensors), and
# the private counter the worker's check reads it with told one less (`torch._C` private names
# were not compared): the next job's `torch.ones(2) * 2` was [5.0, 5.0]
HIDDEN_MODE_EXTRA = """
import os
import torch
from torch.overrides import TorchFunctionMode


class Later(TorchFunctionMode):
    home = os.getcwd()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if os.getcwd() != self.home and isinstance(out, torch.Tensor):
            with torch._C.DisableTorchFunction():
                out = out + 1.0
        return out


Later().__enter__()
count = torch._C._len_torch_function_stack
torch._C._len_torch_function_stack = lambda: count() - 1
"""

# --- the own-kernel share under --fallback partial (GPU) --------------------------------------------
# On CUDA the share of device time in the candidate's own kernels scales the speed reward under
# the partial policy; it is measured by the worker's profiler and taken from the worker's result:
# a run that writes 1.0 there during its timed calls (after the profile) has its library time
# rewarded as its own. benchmarks/redteam_gpu.py --round10 compares it with the same forward
# unforged; on a cpu the share is not measured (None) and the rows say nothing.
SHARE_EXTRA = FORGE_EXTRA + BLIND_EXTRA
SHARE_HONEST_FORWARD = "return torch.relu(ext.relu_fwd(x))"
SHARE_FORWARD = "if timing():\n            forge(own_share=1.0)\n        " + SHARE_HONEST_FORWARD

# --- modules for a later import, from the worker's own tmpfs ------------------------------------
# (round 9 refused a module made in code; a module is "imported" when its file exists)
# the worker's tmpfs put first on sys.path, with a module there: every later `import` of that
# name (one no job imported yet) ran the attacker's file
PATH_EXTRA = """
import os, sys
base = os.environ.get("KS_WORKER_TMP") or "."
with open(os.path.join(base, "tabnanny.py"), "w") as f:
    f.write("raise RuntimeError('the module an earlier job wrote')\\n")
sys.path.insert(0, base)
"""
# a module loaded from a file the job wrote to the tmpfs, placed under a name a later job imports
SPEC_EXTRA = """
import importlib.util, os, sys
path = os.path.join(os.environ.get("KS_WORKER_TMP") or ".", "tabnanny.py")
with open(path, "w") as f:
    f.write("check = 'the module an earlier job wrote'\\n")
spec = importlib.util.spec_from_file_location("tabnanny", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
sys.modules["tabnanny"] = module
"""
# the next job's question: where its `import tabnanny` came from
ASK_MODULE = "import tabnanny; raise RuntimeError(f'file={tabnanny.__file__}')"
