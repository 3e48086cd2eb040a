"""A real blob store with a hook that runs between the scan and an upload."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class BeforeUpload:
    """The real blob store; ``hook(keys)`` runs each time the engine asks
    which of ``keys`` are missing, which it does right before it uploads them
    (for a large file the scan handed over: after the scan hashed it, before
    the upload reads it again)."""

    def __init__(self, inner: Any, hook: Callable[[list[str]], None]) -> None:
        self._inner = inner
        self._hook = hook
        self.url = inner.url

    async def missing(self, keys: Sequence[str]) -> list[str]:
        self._hook(list(keys))
        found: list[str] = await self._inner.missing(keys)
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
