"""The committed generated code is what ``python -m checkpointd.service.genproto`` makes now."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkpointd.service import genproto


def test_generated_code_is_current(tmp_path: Path) -> None:
    written = genproto.generate(tmp_path)
    committed_dir = genproto.PYTHON_ROOT.joinpath(*genproto.GENERATED_PACKAGE)
    fresh = {path.name: path.read_bytes() for path in written}
    committed = {path.name: path.read_bytes() for path in committed_dir.iterdir() if path.is_file()}
    assert set(fresh) == {
        "__init__.py",
        "checkpointd_pb2.py",
        "checkpointd_pb2.pyi",
        "checkpointd_pb2_grpc.py",
        "gateway_pb2.py",
        "gateway_pb2.pyi",
        "gateway_pb2_grpc.py",
    }
    assert committed == fresh, (
        "run `make proto` (python -m checkpointd.service.genproto) and commit"
    )


def test_generated_imports_are_correct_without_fixes() -> None:
    grpc_module = (
        genproto.PYTHON_ROOT / "checkpointd" / "v1" / "checkpointd_pb2_grpc.py"
    ).read_text()
    assert "from checkpointd.v1 import checkpointd_pb2" in grpc_module
    from checkpointd.v1 import checkpointd_pb2, checkpointd_pb2_grpc

    assert checkpointd_pb2.DESCRIPTOR.name == "checkpointd/v1/checkpointd.proto"
    assert checkpointd_pb2.DESCRIPTOR.package == "checkpointd.v1"
    assert hasattr(checkpointd_pb2_grpc, "CheckpointdStub")
    from checkpointd.v1 import gateway_pb2, gateway_pb2_grpc

    assert gateway_pb2.DESCRIPTOR.name == "checkpointd/v1/gateway.proto"
    assert gateway_pb2.DESCRIPTOR.package == "checkpointd.v1"
    assert hasattr(gateway_pb2_grpc, "GatewayStub")


def test_the_gateway_serves_every_store_and_blob_method() -> None:
    """Each CheckpointStore / BlobGuard / BlobAudit method a sidecar's remote
    store forwards has its Gateway call (and nothing else is served)."""
    from checkpointd.gateway.remote import (
        PackedRemoteCheckpointStore,
        RemoteBlobStore,
        RemoteCheckpointStore,
    )
    from checkpointd.v1 import gateway_pb2

    service = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"]
    names = {method.name for method in service.methods}
    store_methods = {
        "get": "Get",
        "list": "List",
        "get_head": "GetHead",
        "append": "Append",
        "delete_head": "DeleteHead",
        "acquire_writer": "AcquireWriter",
        "delete_checkpoints": "DeleteCheckpoints",
        "fork_from_checkpoint": "ForkFromCheckpoint",
        "list_blob_references": "ListBlobReferences",
        "pin_blobs": "PinBlobs",
        "condemn_blobs": "CondemnBlobs",
        "release_condemned": "ReleaseCondemned",
        "audit_blob_references": "AuditBlobReferences",
        "repair_blob_references": "RepairBlobReferences",
        "mark_blobs_missing": "MarkBlobsMissing",
        "clear_missing_blobs": "ClearMissingBlobs",
        "list_missing_blobs": "ListMissingBlobs",
        "list_threads": "ListThreads",
        "spent_checkpoint_ids": "SpentCheckpointIds",
    }
    for method, rpc in store_methods.items():
        assert callable(getattr(RemoteCheckpointStore, method)), method
        assert rpc in names, rpc
    blob_calls = {"BlobHead", "BlobMissing", "BlobGet", "BlobGetMany", "BlobPut", "BlobPutMany"}
    admin_blob_calls = {"BlobList", "BlobDelete"}
    blob_calls.add("BlobSignGet")  # presigned reads
    lease_calls = {"RenewWriter", "ReleaseWriter", "GetStoreInfo"}
    # The pack index (store.base.PackIndex) and the frame reads of packed blobs.
    pack_methods = {"locate_blobs": "LocateBlobs", "list_packed_blobs": "ListPackedBlobs"}
    for method, rpc in pack_methods.items():
        assert callable(getattr(PackedRemoteCheckpointStore, method)), method
        assert rpc in names, rpc
    pack_calls = {*pack_methods.values(), "ReadPackFrames"}
    assert callable(RemoteBlobStore.read_pack_frames)
    assert (
        names
        == set(store_methods.values()) | blob_calls | admin_blob_calls | lease_calls | pack_calls
    )


def test_every_message_is_named_in_the_service() -> None:
    from checkpointd.v1 import checkpointd_pb2

    service = checkpointd_pb2.DESCRIPTOR.services_by_name["Checkpointd"]
    names = {method.name for method in service.methods}
    assert names == {
        "Capture",
        "Restore",
        "Undo",
        "GetCheckpoint",
        "ListCheckpoints",
        "ListThreads",
        "GetHead",
        "ListEntries",
        "Diff",
        "Fork",
        "DeleteHead",
        "Prune",
        "SweepBlobs",
        "Check",
        "ReadFile",
        "UploadArtifact",
        "ReadArtifact",
        "GetServerInfo",
    }
    streaming = {m.name: (m.client_streaming, m.server_streaming) for m in service.methods}
    assert streaming["Capture"] == (False, True)
    assert streaming["Restore"] == (False, True)
    assert streaming["Undo"] == (False, True)
    assert streaming["ListEntries"] == (False, True)
    assert streaming["Check"] == (False, True)
    assert streaming["Diff"] == (False, True)
    assert streaming["ReadFile"] == (False, True)
    assert streaming["ReadArtifact"] == (False, True)
    assert streaming["UploadArtifact"] == (True, False)


@pytest.mark.timeout(900)  # builds two protoc plugins (slow on a cold build cache)
def test_go_stubs_are_current(tmp_path: Path) -> None:
    """The Go client's committed stubs match a fresh ``genproto --go`` (plugins
    built from the versions pinned in clients/go/go.mod)."""
    (tmp_path / "out").mkdir()
    fresh = genproto.generate_go(tmp_path / "out", bin_dir=tmp_path)
    committed_dir = genproto.GO_ROOT / "checkpointdv1"
    assert {p.name for p in fresh} == {
        "checkpointd.pb.go",
        "checkpointd_grpc.pb.go",
        "gateway.pb.go",
        "gateway_grpc.pb.go",
    }
    for path in fresh:
        assert path.read_bytes() == (committed_dir / path.name).read_bytes(), (
            "run `python -m checkpointd.service.genproto --go` and commit"
        )
