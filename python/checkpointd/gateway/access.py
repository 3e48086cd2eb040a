"""Which blobs a token may read, and how the gateway learns it.

The gateway remembers which threads' checkpoints reference each key among the
checkpoints it served or stored (``References``: a bounded map, newest kept);
a key it has not seen is looked up in the token's exact threads (``threads``
claim). A token that grants only prefixes must have read the checkpoint
through this gateway first (a restore always does). An admin token reads
everything. ``ReadAccess`` holds these rules for BlobGet, the pack reads and
the missing-blob marks; ``Pins`` (``packs.py``) adds the keys a writer pinned
through this gateway, for LocateBlobs.
"""

from __future__ import annotations

from collections import OrderedDict

from ..model import FILE_KEY_PREFIX, Checkpoint
from ..service import status
from ..store._packindex import artifact_twin
from ..store.base import CheckpointStore
from .auth import TOKEN_CACHE_SIZE
from .packs import Pins
from .tokens import TokenScope

# Keys remembered as referenced by some thread.
REFERENCE_MEMORY_KEYS = 1_000_000
# Exact threads of a token looked up for a key not yet seen.
MAX_LOOKUP_THREADS = 16


class References:
    """key → the threads whose checkpoints (seen by this gateway) reference it."""

    def __init__(self, limit: int = REFERENCE_MEMORY_KEYS) -> None:
        self._limit = limit
        self._threads: OrderedDict[str, set[str]] = OrderedDict()

    def remember(self, checkpoint: Checkpoint) -> None:
        thread = checkpoint.thread_id
        for key in checkpoint.blob_keys():
            threads = self._threads.get(key)
            if threads is None:
                self._threads[key] = {thread}
            else:
                threads.add(thread)
                self._threads.move_to_end(key)
        while len(self._threads) > self._limit:
            self._threads.popitem(last=False)

    def granted(self, scope: TokenScope, key: str) -> bool:
        return any(scope.covers(thread) for thread in self._threads.get(key, ()))


def _refused(scope: TokenScope, key: str) -> status.ServiceError:
    return status.ServiceError(
        status.FORBIDDEN,
        f"no checkpoint of the token's threads ({scope.subject}) references {key!r}",
        key=key,
        subject=scope.subject,
    )


class ReadAccess:
    """The read rules of one gateway (see the module docs)."""

    def __init__(self, store: CheckpointStore, pins: Pins) -> None:
        self.store = store
        self.pins = pins
        self.references = References()
        self._scanned: OrderedDict[str, str | None] = OrderedDict()  # thread → head listed

    def remember(self, checkpoint: Checkpoint) -> None:
        self.references.remember(checkpoint)

    def readable_now(self, scope: TokenScope, key: str) -> bool:
        return "admin" in scope.ops or self.references.granted(scope, key)

    async def may_read(self, scope: TokenScope, key: str) -> None:
        """FORBIDDEN unless the token may read ``key``."""
        if self.readable_now(scope, key):
            return
        await self.learn(scope)
        if not self.references.granted(scope, key):
            raise _refused(scope, key)

    async def may_read_row(self, scope: TokenScope, key: str) -> None:
        """``may_read`` for a pack row's key (its file form) or its artifact twin."""
        twin = artifact_twin(key)
        if self.readable_now(scope, key) or self.readable_now(scope, twin):
            return
        await self.learn(scope)
        if not (self.references.granted(scope, key) or self.references.granted(scope, twin)):
            raise _refused(scope, key)

    def locatable(self, scope: TokenScope, key: str) -> bool:
        """The read rule, or pinned through this gateway by a covered writer;
        a row serves a digest's file and artifact keys (``row_key``)."""
        if "admin" in scope.ops:
            return True
        forms = (key, artifact_twin(key)) if key.startswith(FILE_KEY_PREFIX) else (key,)
        return any(
            self.references.granted(scope, form) or self.pins.granted(scope, form) for form in forms
        )

    async def learn(self, scope: TokenScope) -> None:
        """Remember the keys of the checkpoints of the token's exact threads."""
        for thread in sorted(scope.threads)[:MAX_LOOKUP_THREADS]:
            # Listed again only when its head moved: asking for keys it does not
            # hold must not make the gateway reread a thread each time.
            head = await self.store.get_head(thread)
            if thread in self._scanned and self._scanned[thread] == head:
                continue
            for checkpoint in await self.store.list(thread):
                self.references.remember(checkpoint)
            self._scanned[thread] = head
            while len(self._scanned) > TOKEN_CACHE_SIZE:
                self._scanned.popitem(last=False)


__all__ = ["MAX_LOOKUP_THREADS", "REFERENCE_MEMORY_KEYS", "ReadAccess", "References"]
