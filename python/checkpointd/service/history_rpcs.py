"""The calls that change a thread's history without touching the workspace:
Fork, DeleteHead and Prune."""

from __future__ import annotations

import time

from .. import validation
from ..ids import new_uuid7
from ..v1 import checkpointd_pb2 as pb
from . import convert
from .calls import RpcGroup, log, unary
from .request_ids import mark_spent
from .state import Context

# Ids a Prune reply lists (~40 bytes each: 400 KB), so it stays bounded however
# many checkpoints a thread had; deleted_count counts them all.
MAX_PRUNE_IDS = 10_000


class HistoryRpcs(RpcGroup):
    @unary
    async def Fork(self, request: pb.ForkRequest, context: Context) -> pb.ForkResponse:
        store, _ = self.state.stores()
        source_thread = validation.check_id(request.source_thread_id, "source_thread_id")
        source_checkpoint = validation.check_id(
            request.source_checkpoint_id, "source_checkpoint_id"
        )
        destination = validation.check_id(request.destination_thread_id, "destination_thread_id")
        async with await store.acquire_writer(destination) as lease:
            checkpoint = await store.fork_from_checkpoint(
                source_thread,
                source_checkpoint,
                destination,
                new_uuid7(),
                int(time.time() * 1000),
                lease,
            )
        return pb.ForkResponse(checkpoint=convert.summary_of(checkpoint))

    @unary
    async def DeleteHead(
        self, request: pb.DeleteHeadRequest, context: Context
    ) -> pb.DeleteHeadResponse:
        store, _ = self.state.stores()
        thread_id = validation.check_id(request.thread_id, "thread_id")
        checkpoint_id = validation.check_id(request.checkpoint_id, "checkpoint_id")
        # Marked before the delete: a marker whose checkpoint still exists is
        # harmless (a retry finds the checkpoint and replays it), a delete whose
        # marker failed to be written would free the request_id.
        await mark_spent(self.state, [checkpoint_id])
        async with await store.acquire_writer(thread_id) as lease:
            await store.delete_head(thread_id, checkpoint_id, lease)
        head = await store.get_head(thread_id)
        response = pb.DeleteHeadResponse()
        if head is not None:
            response.head_checkpoint_id = head
        return response

    @unary
    async def Prune(self, request: pb.PruneRequest, context: Context) -> pb.PruneResponse:
        from ..sweep import prune

        store, _ = self.state.stores()
        thread_id = validation.check_id(request.thread_id, "thread_id")
        began = time.monotonic()
        if not request.dry_run:
            # As in DeleteHead: mark what will go before it goes (and whatever
            # else went, should the head have moved in between, after).
            planned = await prune(store, thread_id, request.keep, dry_run=True)
            await mark_spent(self.state, planned)
        deleted = await prune(store, thread_id, request.keep, dry_run=request.dry_run)
        ids = [d if isinstance(d, str) else d.id for d in deleted]
        if not request.dry_run:
            await mark_spent(self.state, sorted(set(ids) - set(planned)))
        log.info(
            "prune%s of thread %s (keep %d): %d checkpoints in %d ms",
            " (dry run)" if request.dry_run else "",
            thread_id,
            request.keep,
            len(ids),
            int((time.monotonic() - began) * 1000),
        )
        return pb.PruneResponse(
            deleted_checkpoint_ids=ids[:MAX_PRUNE_IDS],
            dry_run=request.dry_run,
            deleted_count=len(ids),
            ids_truncated=len(ids) > MAX_PRUNE_IDS,
        )
