"""The harness's modules that its code imports at first use, loaded before the worker is ready.

The residue checks compare the process with the worker as it was when ready
(`verifier.run.gpu_worker.ReadyState`): a harness module first imported by a job (the paced
trials' `verifier.judge.trial_pace`, the arena's readers: the warm-up has no judge) was named
in no snapshot, and what a job changed in it was compared with nothing. A job that put its own
generator function in the closure cell of `WorkerPace.trial` (a `@contextmanager`) wrote every
later job's trial outputs, an honest ReLU "incorrect" (tests/verifier/test_redteam_round18.py).
So the worker imports, before its snapshot, every `verifier.*` module that a loaded harness
module imports inside its functions, and theirs.
"""

from __future__ import annotations

import ast
import importlib
import sys

# where the worker's jobs run harness code (a module elsewhere, the service's, is not loaded)
PACKAGES = ("verifier.run.", "verifier.judge.", "verifier.checks.", "verifier.backends")


def load_lazy_imports() -> list[str]:
    """Import the harness modules named by `from verifier.<...> import` statements of loaded
    harness modules, to a fixed point; the names it loaded."""
    loaded, seen = [], set()
    todo = [n for n in list(sys.modules) if n.startswith(PACKAGES)]
    while todo:
        name = todo.pop()
        path = getattr(sys.modules.get(name), "__file__", None)
        if name in seen or not path or not path.endswith(".py"):
            continue
        seen.add(name)
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            target = getattr(node, "module", None) if isinstance(node, ast.ImportFrom) else None
            if not getattr(node, "level", 0) and target and target.startswith(PACKAGES):
                if target not in sys.modules:
                    importlib.import_module(target)
                    loaded.append(target)
                todo.append(target)
    return loaded
