"""The one error of the normalisation passes (einops, timm, helpers) that carving turns into a
Rejection: `reason` is a short class (`unresolved_name`, `einops_dynamic`), `detail` one line."""

from __future__ import annotations


class NormalizeError(Exception):
    """A dependency of a carved task cannot be rewritten into torch; names what and why."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
