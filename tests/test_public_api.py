"""The names docs/contract.md#python-api promises are importable from where it says."""

import importlib

import pytest

import checkpointd

PROMISED = {
    "checkpointd": [
        "capture_checkpoint",
        "CaptureOptions",
        "restore_checkpoint",
        "RestoreOptions",
        "sweep_blobs",
        "upload_artifact",
        "open_store",
        "open_instance_store",
        "open_blobs",
        "CaptureResult",
        "SweepReport",
        "__version__",
    ],
    "checkpointd.model": [
        "Checkpoint",
        "FileEntry",
        "DirEntry",
        "SymlinkEntry",
        "Artifact",
        "Writer",
        "WriterLease",
        "BlobReference",
        "Policy",
    ],
    "checkpointd.errors": [
        "SandboxCheckpointError",
        "SandboxCheckpointConflictError",
        "SandboxCheckpointDuplicateIdError",
        "SandboxCheckpointInvalidIdError",
        "SandboxCheckpointInvalidEntryError",
        "SandboxCheckpointParentMismatchError",
        "SandboxCheckpointNotHeadError",
        "SandboxCheckpointWriterConflictError",
        "SandboxCheckpointWriterLostError",
        "SandboxCheckpointInvalidArgumentError",
        "SandboxSnapshotError",
    ],
    "checkpointd.store": [
        "CheckpointStore",
        "InMemoryCheckpointStore",
        "SqliteCheckpointStore",
        "PostgresCheckpointStore",
        "InstanceStore",
        "InstanceRecord",
        "InMemoryInstanceStore",
        "SqliteInstanceStore",
        "PostgresInstanceStore",
    ],
    "checkpointd.blobs": ["BlobStore"],
    "checkpointd.testkit": ["checkpoint_store_conformance", "instance_store_conformance"],
}


@pytest.mark.parametrize(
    ("module", "name"), [(m, n) for m, names in PROMISED.items() for n in names]
)
def test_promised_name_is_importable(module: str, name: str) -> None:
    assert getattr(importlib.import_module(module), name) is not None


def test_error_codes_are_the_documented_ones() -> None:
    from checkpointd import errors

    expected = {
        "SandboxCheckpointConflictError": "SANDBOX_SNAPSHOT_STALE_HEAD",
        "SandboxCheckpointDuplicateIdError": "SANDBOX_SNAPSHOT_DUPLICATE_ID",
        "SandboxCheckpointInvalidIdError": "SANDBOX_SNAPSHOT_INVALID_ID",
        "SandboxCheckpointInvalidEntryError": "SANDBOX_SNAPSHOT_INVALID_ENTRY",
        "SandboxCheckpointParentMismatchError": "SANDBOX_SNAPSHOT_PARENT_MISMATCH",
        "SandboxCheckpointNotHeadError": "SANDBOX_SNAPSHOT_NOT_HEAD",
        "SandboxCheckpointWriterConflictError": "SANDBOX_SNAPSHOT_WRITER_CONFLICT",
        "SandboxCheckpointWriterLostError": "SANDBOX_SNAPSHOT_WRITER_LOST",
        "SandboxCheckpointInvalidArgumentError": "SANDBOX_SNAPSHOT_INVALID_ARGUMENT",
    }
    for name, code in expected.items():
        cls = getattr(errors, name)
        assert cls.code == code
        assert issubclass(cls, errors.SandboxCheckpointError)
    assert issubclass(errors.SandboxCheckpointInvalidArgumentError, ValueError)
    error = errors.SandboxSnapshotError(errors.MISSING_BLOB, "gone")
    assert error.code == "SANDBOX_SNAPSHOT_MISSING_BLOB"


def test_version_matches_the_native_module() -> None:
    from checkpointd import _native

    assert checkpointd.__version__ == _native.__version__
