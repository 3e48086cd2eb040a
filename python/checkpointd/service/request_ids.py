"""A capture's ``request_id``: the checkpoint id it derives, and the markers of
such checkpoints deleted since (DeleteHead and Prune write them, Capture
refuses a request_id whose checkpoint one names)."""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import SandboxCheckpointInvalidArgumentError
from ..ids import derive_request_id, is_request_derived
from ..store.base import SpentCheckpointIds
from .state import ServiceState

# Markers of checkpoints made under a request_id and deleted since (DeleteHead,
# Prune): the id is spent, never reused for new content. Kept in the bucket, so
# every daemon sharing it knows; outside the swept prefixes, so sweep keeps them.
SPENT_REQUEST_PREFIX = "checkpointd-spent-request-ids/"


async def mark_spent(state: ServiceState, checkpoint_ids: Iterable[str]) -> None:
    """Record deleted checkpoints whose id came from a request_id."""
    _, blobs = state.stores()
    for checkpoint_id in checkpoint_ids:
        if not is_request_derived(checkpoint_id):
            continue
        await blobs.put(SPENT_REQUEST_PREFIX + checkpoint_id, b"deleted\n")


async def refuse_spent_request_id(
    state: ServiceState, thread_id: str, request_id: str, checkpoint_id: str
) -> None:
    store, blobs = state.stores()
    # The store records the spent ids it deleted, by any path (store._core; the
    # gateway's remote store asks its store); the bucket markers cover stores
    # that cannot say (a user's own) and deletions from before stores kept them.
    spent = isinstance(store, SpentCheckpointIds) and bool(
        await store.spent_checkpoint_ids([checkpoint_id])
    )
    if spent or await blobs.head(SPENT_REQUEST_PREFIX + checkpoint_id) is not None:
        raise SandboxCheckpointInvalidArgumentError(
            f"request_id {request_id!r} of thread {thread_id!r} named checkpoint "
            f"{checkpoint_id}, which was deleted since; use a new request_id for a new capture",
            details={
                "field": "request_id",
                "request_id": request_id,
                "checkpoint_id": checkpoint_id,
            },
        )


def derive_checkpoint_id(thread_id: str, request_id: str) -> str:
    """The checkpoint id a capture with ``request_id`` gets (same inputs, same id)."""
    return derive_request_id(thread_id, request_id)
