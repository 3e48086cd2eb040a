"""A real blob store with a hook that runs between the scan and an upload."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class BeforeUpload:
    """The real blob store; ``hook(keys)`` runs each time the engine asks
    which of ``keys`` are missing, and before each single-object ``put``: the
    engine does one of them right before it uploads
    (for a large file the scan handed over: after the scan hashed it, before
    the upload reads it again)."""

    def __init__(self, inner: Any, hook: Callable[[list[str]], None]) -> None:
        self._inner = inner
        self._hook = hook
        self.url = inner.url

    async def put(self, key: str, data: Any, *, if_absent: bool = True) -> bool:
        # With a pack index the engine asks the store, not the bucket, which
        # keys are missing: the hook then runs right before the put itself.
        self._hook([key])
        written: bool = await self._inner.put(key, data, if_absent=if_absent)
        return written

    async def missing(self, keys: Sequence[str]) -> list[str]:
        self._hook(list(keys))
        found: list[str] = await self._inner.missing(keys)
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
