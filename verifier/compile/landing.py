"""Build results announced as they become final, so a candidate runs as soon as its own
extensions are built (not when the rest of its translation unit's retries are over)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Landing(dict):
    """Results stored (cache index, object hash) and announced as set; between hold() and
    release() they are announced together (a unit's specs, in order)."""

    def __init__(self, store: Callable[[Any], None],
                 on_ready: Callable[[dict[str, Any]], None] | None) -> None:
        super().__init__()
        self.store, self.on_ready = store, on_ready
        self.pending: dict[str, Any] | None = None

    def hold(self) -> dict[str, Any]:
        self.pending = held = {}
        return held

    def release(self, held: dict[str, Any]) -> None:
        self.pending = None
        if held and self.on_ready is not None:
            self.on_ready(held)

    def __setitem__(self, key: str, res: Any) -> None:
        if not res.cached:
            self.store(res)
        super().__setitem__(key, res)
        if self.pending is not None:
            self.pending[key] = res
        elif self.on_ready is not None:
            self.on_ready({key: res})
