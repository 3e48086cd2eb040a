"""The checkpoint-store conformance suite (docs/contract.md#checkpoint-store), as a pytest class factory.

``checkpoint_store_conformance(make_store)`` returns a test class. ``make_store`` is
``async def make_store(*, now, lease_duration_ms, renew_after_ms) -> store`` and must
return a fresh, EMPTY store each call. The suite passes a clock it moves by hand
(starting at 1_000 ms), ``lease_duration_ms=100`` and ``renew_after_ms=25``, and
closes every store it made (``aclose()`` when the store has it).

``delete_checkpoints``, ``fork_from_checkpoint`` and the blob guard
(``pin_blobs``/``condemn_blobs``/``release_condemned``) are optional for a user's
store: their tests are skipped when the store lacks the method, and so are the
owner rules when ``acquire_writer`` takes no ``owner`` keyword (the owner of a
live lease acquires it again with a new fence; anyone else gets WRITER_CONFLICT
with ``expires_at_ms`` and ``retry_after_ms`` in its details). Every store
checkpointd ships has them all.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ._checkpoint_appends import AppendRules
from ._checkpoint_blobs import BlobRules
from ._checkpoint_leases import LeaseRules
from ._checkpoint_prune_fork import PruneForkRules
from ._checkpoint_values import ValueRules


class CheckpointStoreConformance(AppendRules, ValueRules, LeaseRules, PruneForkRules, BlobRules):
    """Every rule of docs/contract.md#checkpoint-store for a checkpoint store (see the module docstring).

    Its rules come in groups, one module each: reads and appends, bad values and copies,
    ``delete_head`` and leases, prune and fork, blobs."""


def checkpoint_store_conformance(
    make_store: Callable[..., Awaitable[Any]], *, name: str = "TestCheckpointStoreConformance"
) -> type:
    """A pytest test class checking every docs/contract.md#checkpoint-store rule on stores from ``make_store``.

    ``make_store`` is ``async def make_store(*, now, lease_duration_ms,
    renew_after_ms)`` returning a fresh, empty store. Use it as
    ``TestMyStore = checkpoint_store_conformance(make_store)`` in a test module.
    Tests are marked ``pytest.mark.asyncio`` (pytest-asyncio, strict or auto mode).
    """
    if not callable(make_store):
        raise TypeError("make_store must be an async callable returning a fresh store")
    return type(name, (CheckpointStoreConformance,), {"_make_store": staticmethod(make_store)})
