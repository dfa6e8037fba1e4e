"""Normalise a carved task's source so it imports torch alone (einops rewritten to torch).

Called by carving (`cst_extract.extract_class`) on the assembled module; raises
`NormalizeError` naming what cannot be rewritten, which carving turns into a rejection.
"""

from __future__ import annotations

from pipeline.tasks.normalize.einops_rewrite import rewrite_einops
from pipeline.tasks.normalize.errors import NormalizeError

__all__ = ["NormalizeError", "normalize_source"]


def normalize_source(source: str) -> tuple[str, list[str]]:
    """(the source with einops calls rewritten to torch, what was rewritten)."""
    return rewrite_einops(source)
