"""The committed generated code is what ``python -m checkpointd.service.genproto`` makes now."""

from __future__ import annotations

from pathlib import Path

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


def test_every_message_is_named_in_the_service() -> None:
    from checkpointd.v1 import checkpointd_pb2

    service = checkpointd_pb2.DESCRIPTOR.services_by_name["Checkpointd"]
    names = {method.name for method in service.methods}
    assert names == {
        "Capture",
        "Restore",
        "GetCheckpoint",
        "ListCheckpoints",
        "GetHead",
        "ListEntries",
        "Diff",
        "Fork",
        "DeleteHead",
        "Prune",
        "SweepBlobs",
        "ReadFile",
        "UploadArtifact",
        "ReadArtifact",
        "GetServerInfo",
    }
    streaming = {m.name: (m.client_streaming, m.server_streaming) for m in service.methods}
    assert streaming["Capture"] == (False, True)
    assert streaming["Restore"] == (False, True)
    assert streaming["ListEntries"] == (False, True)
    assert streaming["Diff"] == (False, True)
    assert streaming["ReadFile"] == (False, True)
    assert streaming["ReadArtifact"] == (False, True)
    assert streaming["UploadArtifact"] == (True, False)
