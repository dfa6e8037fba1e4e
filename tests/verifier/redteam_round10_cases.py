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
