"""The aten ops a forward ran, recorded by torch's profiler (the trials' and the timed calls'
traces, the worker's and the reference's alike)."""

from __future__ import annotations

from typing import Any

LABEL = "ks-candidate"  # the candidate's own calls in a profile that also holds others


class OpNames:
    """The names of the aten ops run inside it (only those under `LABEL`, when `label`),
    recorded by torch's profiler: its C++ record hooks cost ~nothing per op, where a Python
    dispatch mode costs ~15 us, so every timed call can be traced without slowing it."""

    def __init__(self, label: bool = False) -> None:
        self.label = label

    def __enter__(self) -> set[str]:
        import torch

        self.names: set[str] = set()
        self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        self.prof.__enter__()
        return self.names

    def __exit__(self, *exc: Any) -> None:
        self.prof.__exit__(*exc)
        for e in self.prof.events():
            if not e.name.startswith("aten::"):
                continue
            parent = e.cpu_parent
            while self.label and parent is not None and parent.name != LABEL:
                parent = parent.cpu_parent
            if not self.label or parent is not None:
                self.names.add(e.name)
