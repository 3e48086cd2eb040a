"""What every checkpointd.v1 handler shares: the wrappers that turn its
exceptions into statuses and log its failures, the base class of the RPC
groups, and the bounds of the messages a call streams.

Errors: handlers raise; ``unary`` / ``streaming`` turn every exception into a
status through ``status.abort`` (the one error map). Cancellation: when the
client cancels or its deadline passes, grpc cancels the handler's task; the
engine task is cancelled too (and its native scan told to stop), and the
engines release their writer lease in ``finally`` — so a new capture of the
thread succeeds at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from .. import validation
from ..errors import MISSING_CHECKPOINT, SandboxSnapshotError
from ..model import Checkpoint
from .state import Context, ServiceState
from .status import abort, classify

MIN_CHUNK = 64 * 1024
MAX_CHUNK = 1024 * 1024
DEFAULT_CHUNK = 256 * 1024
# Chunks of manifest entries / diff changes: bounded by count and by an estimate
# of encoded size, so a message stays far below 4 MiB even with 4 KiB paths.
ENTRIES_PER_MESSAGE = 512
BYTES_PER_MESSAGE = 512 * 1024

# One logger for every handler, whichever group module it lives in: named for
# the module grpc registers, as the daemon's log lines always were.
log = logging.getLogger("checkpointd.service.servicer")
T = TypeVar("T")


class RpcGroup:
    """The base of each group of checkpointd.v1 handlers: the shared state and
    the checkpoint lookup several groups use."""

    def __init__(self, state: ServiceState) -> None:
        self.state = state

    async def _checkpoint(self, checkpoint_id: str) -> Checkpoint:
        store, _ = self.state.stores()
        validation.check_id(checkpoint_id, "checkpoint_id")
        checkpoint = await store.get(checkpoint_id)
        if checkpoint is None:
            raise SandboxSnapshotError(
                MISSING_CHECKPOINT,
                f"no checkpoint {checkpoint_id!r}",
                details={"checkpoint_id": checkpoint_id},
            )
        return checkpoint


def unary(
    method: Callable[[Any, Any, Context], Awaitable[T]],
) -> Callable[[Any, Any, Context], Awaitable[T]]:
    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: Context) -> T:
        with self.state.tracking():
            try:
                return await method(self, request, context)
            except asyncio.CancelledError:
                _log_cancelled(method.__name__, context)
                raise
            except Exception as exc:  # noqa: BLE001 - every error becomes a status
                _log_failure(method.__name__, exc)
                await abort(context, exc)
                raise  # unreachable: abort raises

    return wrapper


def streaming(
    method: Callable[[Any, Any, Context], AsyncIterator[T]],
) -> Callable[[Any, Any, Context], AsyncIterator[T]]:
    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: Context) -> AsyncIterator[T]:
        with self.state.tracking():
            answered = False  # the last message sent was the call's result
            try:
                async for item in method(self, request, context):
                    answered = _is_final(item)
                    yield item
            except (asyncio.CancelledError, GeneratorExit):
                # GeneratorExit: grpc closed the stream (the client went away)
                # while it waited for the next message. After the result (a
                # client that stops reading once it has it) the call succeeded.
                if answered:
                    log.debug("%s: the client closed the stream after its result", method.__name__)
                else:
                    _log_cancelled(method.__name__, context)
                raise
            except Exception as exc:  # noqa: BLE001 - every error becomes a status
                _log_failure(method.__name__, exc)
                await abort(context, exc)

    return wrapper


def _log_failure(method: str, exc: BaseException) -> None:
    """One WARNING per failed call: the method, status, reason and message (the
    message names ids and paths, never secrets or request bodies)."""
    code, reason, message, metadata = classify(exc)
    where = " ".join(f"{k}={v}" for k, v in metadata.items() if k in _LOGGED_METADATA)
    log.warning(
        "%s failed: %s %s: %s%s", method, code.name, reason, message, f" ({where})" if where else ""
    )


def _is_final(message: Any) -> bool:
    """True for the message that ends a long-work stream: a ``done`` event
    (Capture, Restore) or a ``summary`` (SweepBlobs, Check)."""
    fields = message.DESCRIPTOR.fields_by_name
    return any(name in fields and message.HasField(name) for name in ("done", "summary"))


def _log_cancelled(method: str, context: Context) -> None:
    """A call that ended because its client went away or its deadline passed
    (the work stopped and its lease was released) is a failure too."""
    remaining = context.time_remaining()
    why = "its deadline passed" if remaining is not None and remaining <= 0 else "cancelled"
    log.warning("%s failed: CANCELLED: %s", method, why)


# ErrorInfo metadata worth a log line (short identifiers, no content).
_LOGGED_METADATA = ("thread_id", "checkpoint_id", "path", "key", "field", "deleted_count")


def chunk_size(requested: int) -> int:
    return DEFAULT_CHUNK if requested == 0 else min(max(requested, MIN_CHUNK), MAX_CHUNK)


def chunks(items: list[T], weight: Callable[[T], int]) -> list[list[T]]:
    out: list[list[T]] = []
    current: list[T] = []
    size = 0
    for item in items:
        w = weight(item)
        if current and (len(current) >= ENTRIES_PER_MESSAGE or size + w > BYTES_PER_MESSAGE):
            out.append(current)
            current, size = [], 0
        current.append(item)
        size += w
    if current:
        out.append(current)
    return out
