"""The operator's calls on the store and the bucket: SweepBlobs and Check."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

from ..errors import SandboxCheckpointError
from ..v1 import checkpointd_pb2 as pb
from .calls import BYTES_PER_MESSAGE, RpcGroup, log, streaming
from .state import Context
from .status import FORBIDDEN, ServiceError, classify

if TYPE_CHECKING:
    from ..sweep import SweepBatch

# SweepBlobs without older_than_ms: blobs younger than this are kept (an upload
# that a capture still in flight will reference is never that old).
DEFAULT_SWEEP_OLDER_THAN_MS = 3_600_000


class MaintenanceRpcs(RpcGroup):
    @streaming
    async def SweepBlobs(
        self, request: pb.SweepBlobsRequest, context: Context
    ) -> AsyncIterator[pb.SweepBlobsEvent]:
        from ..sweep import iter_sweep_blobs, repack_below_percent

        store, blobs = self.state.stores()
        if self.state.store_backend == "gateway":
            # Gateway mode: the sidecar's token cannot see other threads' references,
            # so a sweep here would judge the bucket blind; the gateway's operator runs it.
            raise ServiceError(
                FORBIDDEN, "sweep runs on the gateway, not in a sidecar (docs/gateway.md)"
            )
        older_than_ms = (
            request.older_than_ms
            if request.HasField("older_than_ms")
            else DEFAULT_SWEEP_OLDER_THAN_MS
        )
        percent = request.repack_below_percent if request.HasField("repack_below_percent") else None
        repack_below = repack_below_percent(percent)
        began = time.monotonic()
        summary = pb.SweepBlobsSummary(
            dry_run=request.dry_run,
            older_than_ms=older_than_ms,
            repack_below_percent=round(repack_below * 100),
        )
        try:
            async for batch in iter_sweep_blobs(
                store, blobs, older_than_ms, dry_run=request.dry_run, repack_below=repack_below
            ):
                summary.listed_count += batch.listed
                summary.deleted_count += len(batch.deleted)
                summary.kept_count += len(batch.kept)
                summary.failed_count += len(batch.failures)
                for _, reason in batch.kept:
                    summary.kept_by_reason[reason] += 1
                for part in _sweep_messages(batch):
                    yield pb.SweepBlobsEvent(batch=part)
        except Exception as exc:
            # Every deleted key was already streamed; the status says how many,
            # so a client that only reads the error still learns it.
            log.warning("sweep failed after deleting %d blobs: %s", summary.deleted_count, exc)
            _, reason, message, metadata = classify(exc)
            raise SandboxCheckpointError(
                f"sweep failed after deleting {summary.deleted_count} blobs: {message}",
                code=reason,
                details={**metadata, "deleted_count": summary.deleted_count},
            ) from exc
        summary.duration_ms = int((time.monotonic() - began) * 1000)
        log.info(
            "sweep%s: listed %d, deleted %d, kept %d, failed %d in %d ms",
            " (dry run)" if request.dry_run else "",
            summary.listed_count,
            summary.deleted_count,
            summary.kept_count,
            summary.failed_count,
            summary.duration_ms,
        )
        yield pb.SweepBlobsEvent(summary=summary)

    @streaming
    async def Check(
        self, request: pb.CheckRequest, context: Context
    ) -> AsyncIterator[pb.CheckEvent]:
        """``checkpointd check`` (check.py): findings streamed as they are found,
        so the reply stays bounded whatever the store holds; summary last."""
        from ..check import CheckFinding, CheckProgress, iter_check

        store, blobs = self.state.stores()
        async for event in iter_check(
            store, blobs, read_data=request.read_data, repair=request.repair
        ):
            if isinstance(event, CheckFinding):
                yield pb.CheckEvent(
                    finding=pb.CheckFinding(
                        kind=event.kind,
                        key=event.key,
                        stored=event.stored,
                        manifests=event.manifests,
                        message=event.message,
                    )
                )
            elif isinstance(event, CheckProgress):
                yield pb.CheckEvent(
                    progress=pb.CheckProgress(
                        blobs_checked=event.blobs_checked,
                        blobs_total=event.blobs_total,
                        bytes_read=event.bytes_read,
                    )
                )
            else:
                log.info(
                    "check: %d keys, %d mismatched counts, %d missing, %d corrupt, "
                    "%d repaired in %d ms",
                    event.keys,
                    event.count_mismatches,
                    event.missing,
                    event.corrupt,
                    event.repaired,
                    event.duration_ms,
                )
                yield pb.CheckEvent(
                    summary=pb.CheckSummary(
                        keys=event.keys,
                        blobs_checked=event.blobs_checked,
                        bytes_read=event.bytes_read,
                        count_mismatches=event.count_mismatches,
                        missing=event.missing,
                        corrupt=event.corrupt,
                        found=event.found,
                        repaired=event.repaired,
                        read_data=event.read_data,
                        repair=event.repair,
                        duration_ms=event.duration_ms,
                        ok=event.ok,
                    )
                )


def _sweep_messages(batch: SweepBatch) -> Iterator[pb.SweepBlobsBatch]:
    """One SweepBatch as SweepBlobsBatch messages of bounded size (a listing page
    of long foreign keys, or long failure messages, could pass the limit)."""
    message = pb.SweepBlobsBatch()
    size = 0
    items: list[tuple[str, str, str]] = [("deleted", key, "") for key in batch.deleted]
    items += [("kept", key, reason) for key, reason in batch.kept]
    items += [("failures", key, text) for key, text in batch.failures]
    for kind, key, text in items:
        weight = 16 + len(key) + len(text)
        if size and size + weight > BYTES_PER_MESSAGE:
            yield message
            message, size = pb.SweepBlobsBatch(), 0
        if kind == "deleted":
            message.deleted.append(key)
        elif kind == "kept":
            message.kept.add(key=key, reason=text)
        else:
            message.failures.add(key=key, message=text)
        size += weight
    if size:
        yield message
