"""Code of an earlier job of a persistent worker that runs during a later job, for tests/
verifier/test_redteam_later_code.py (round 10's open finalizer, and further variants).

Each attack is planted as the harness drops the attacker's model (`test_redteam_round9.
_leaving`: after the job's own checks) or as its worker settles it (`test_redteam_round9b.
_at_settle`), and defines `later()`, which rebinds `torch.relu`: whatever job it runs in
"changed" a watched torch function, a cheat. What makes it run later:
- death (an object alive after the settle that a later job releases): the anchor is held by
  the settle's message in the worker's loop, dropped as the next job's message is read. On
  it: torch's own `_del_library` finalizer given a handle whose `on_destroy` is `later`
  (round 10's xfail), a `weakref.ref` callback, or a `__del__` of the job's own class;
- a registry a later job reads: a `logging` handler on torch's logger (a later job's torch
  logs through it), an entry of torch's custom-op table (`OPDEF_TO_LIB`: a later job's
  `torch.library.custom_op` of that name destroys the old entry's library first), a key of
  the job's own str class in `sys.modules` (its `__eq__` runs as a later job imports);
- no later job: an `atexit` handler (it runs as the worker exits, after its last reply).
"""

from __future__ import annotations

LATER = """
import functools, weakref  # (not sys: `_at_settle`'s own, which it reads first)
import torch


def later(*_a):
    import torch
    torch.relu = lambda x: x

"""

# the anchor: the message of the settle in the worker's own loop (`gpu_worker.main`'s `msg`),
# which lives until the loop reads the next job's: what it holds dies as the next job begins
ANCHOR = """
f = sys._getframe()
while f is not None and f.f_code.co_name != "main":
    f = f.f_back
msg = f.f_locals["msg"]
f.f_locals.clear()  # the frame's snapshot of its locals: it would hold the message on


class Anchor:
    pass


"""

DEATHS = {
    # round 10's open one: torch's finalizer function, by identity, given torch's own handle
    # type whose `on_destroy` is the job's
    "handle": ANCHOR + """
from torch._library.utils import RegistrationHandle
msg["ks"] = Anchor()
weakref.finalize(msg["ks"], torch.library._del_library, set(), set(), set(), set(),
                 [RegistrationHandle(functools.partial(later))], None, {})
""",
    # a weak reference's callback (no finalizer registry: the reference is kept elsewhere)
    "ref": ANCHOR + """
msg["ks"] = Anchor()
sys.modules["weakref"].ks_kept = weakref.ref(msg["ks"], later)
""",
    # no callback at all: a `__del__` of the job's own class
    "del": ANCHOR + """
Anchor.__del__ = later
msg["ks"] = Anchor()
""",
}


def death(name: str) -> str:
    """The code the attacker runs as its worker settles it, for the death `name`."""
    return LATER + DEATHS[name]


# a handler on torch's logger: its `emit` runs wherever a later job's torch logs
LOGGER = LATER + """
import logging


class Handler(logging.Handler):
    def emit(self, record):
        later()


logging.getLogger("torch").addHandler(Handler())
"""
# what the next job does: it logs a warning through a torch logger
ASK_LOG = ("import logging; logging.getLogger('torch.fx').warning('ks probe'); "
           "raise RuntimeError('logged')")

# an entry of torch's custom-op table under a name a later job's op may take: defining that op
# destroys the entry's library first (`get_library_allowing_overwrite`); a real Library (torch's
# finalizer, no kernel registered) with torch's handle type, whose `on_destroy` is the job's
OPDEF = LATER + """
from torch._library import custom_ops
from torch._library.utils import RegistrationHandle

lib = torch.library.Library("ks_ops", "FRAGMENT")
lib._registration_handles.append(RegistrationHandle(later))
custom_ops.OPDEF_TO_LIB["ks_ops::relu"] = lib
"""

# an exit handler: the interpreter runs it only as the worker exits, after its last reply (the
# parent kills a worker that leaves as it reads that reply)
EXITER = LATER + """
import atexit
atexit.register(later)
"""

# a key of the job's own str class in sys.modules, of the hash of "numpy" and ahead of it: its
# `__eq__` runs at every lookup of "numpy" there (any `import numpy`), from the next job's on
SHADOW = LATER + """
import os, sys
home = os.getcwd()


class Name(str):
    def __hash__(self):
        return hash("numpy")

    def __eq__(self, other):
        here = os.getcwd()
        if here != home and os.path.basename(here).startswith("job-"):
            later()
        return False


numpy = sys.modules.pop("numpy")
sys.modules[Name("ks_numpy")] = numpy
sys.modules["numpy"] = numpy
"""

# an honest ReLU as a custom op (numpy inside), and one defined through a `Library`: two of
# each in a row reuse their names, as sampled candidates do
CUSTOM_OP_RELU = '''import numpy as np
import torch


@torch.library.custom_op("ks_ops::relu", mutates_args=())
def ks_relu(x: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.maximum(x.detach().cpu().numpy(), 0)).to(x.device)


@ks_relu.register_fake
def _(x):
    return torch.empty_like(x)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return ks_relu(x)
'''

LIBRARY_RELU = '''import numpy as np
import torch

lib = torch.library.Library("ks_lib", "DEF")
lib.define("relu(Tensor x) -> Tensor")


def _relu(x):
    return torch.from_numpy(np.maximum(x.detach().cpu().numpy(), 0)).to(x.device)


lib.impl("relu", _relu, "CPU")
lib.impl("relu", _relu, "CUDA")


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.ops.ks_lib.relu(x)
'''
