"""The checkpointd.v1.Checkpointd service grpc registers: each RPC turns into
one engine or store call. The handlers live in one module per group —
``capture_rpcs`` (Capture, UploadArtifact), ``restore_rpcs`` (Restore, Undo),
``read_rpcs`` (GetCheckpoint, ListCheckpoints, ListThreads, GetHead,
ListEntries, Diff, ReadFile, ReadArtifact), ``history_rpcs`` (Fork,
DeleteHead, Prune), ``maintenance_rpcs`` (SweepBlobs, Check) — and GetServerInfo
here; ``calls`` says how a handler's errors become statuses.
"""

from __future__ import annotations

from .. import __version__
from ..v1 import checkpointd_pb2 as pb
from ..v1 import checkpointd_pb2_grpc as pb_grpc
from .calls import MAX_CHUNK, unary
from .capture_rpcs import CaptureRpcs
from .guard import MAX_MESSAGE_BYTES
from .history_rpcs import HistoryRpcs
from .maintenance_rpcs import MaintenanceRpcs
from .read_rpcs import MAX_PAGE_SIZE, ReadRpcs
from .restore_rpcs import RestoreRpcs
from .state import Context
from .watch import watch_capabilities

# 2: SweepBlobs became a server stream of batches and a summary.
PROTOCOL_VERSION = 2


class CheckpointdServicer(
    CaptureRpcs,
    RestoreRpcs,
    ReadRpcs,
    HistoryRpcs,
    MaintenanceRpcs,
    pb_grpc.CheckpointdServicer,
):
    """Every group's handlers; the generated base answers UNIMPLEMENTED for a
    method none of them defines."""

    @unary
    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: Context
    ) -> pb.GetServerInfoResponse:
        return pb.GetServerInfoResponse(
            version=__version__,
            protocol_version=PROTOCOL_VERSION,
            capabilities=pb.Capabilities(
                store_backend=self.state.store_backend,
                blob_backend=self.state.blob_backend,
                fork=True,
                diff=True,
                safe_sweep=True,
                capture_request_id=True,
                max_chunk_bytes=MAX_CHUNK,
                max_message_bytes=MAX_MESSAGE_BYTES,
                lease_duration_ms=int(getattr(self.state.store, "lease_duration_ms", 0) or 0),
                max_page_size=MAX_PAGE_SIZE,
                auth_mode=self.state.auth_mode,
                tls=self.state.tls,
                mutual_tls=self.state.mutual_tls,
                auth_probes=self.state.auth_probes,
                restore_history=True,
                **watch_capabilities(self.state.journal),
            ),
        )
