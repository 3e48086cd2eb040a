from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_REASON_UNSPECIFIED: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_INVALID_ID: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_INVALID_ENTRY: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_INVALID_ARGUMENT: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_INVALID_PATH: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_STALE_HEAD: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_PARENT_MISMATCH: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_WRITER_CONFLICT: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_WRITER_LOST: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_DUPLICATE_ID: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_NOT_HEAD: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_UNSUPPORTED_ENTRY: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_MISSING_CHECKPOINT: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_MISSING_BLOB: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_INVALID_BLOB: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_FORK_SOURCE_NOT_FOUND: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_FORK_SOURCE_THREAD_MISMATCH: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_FORK_DESTINATION_NOT_EMPTY: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_STORE_UNAVAILABLE: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_FILE_CHANGED: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_NO_SPACE: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_NAME_TOO_LONG: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_CROSS_DEVICE: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_PERMISSION_DENIED: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_MISSING_ENTRY: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_MISSING_ARTIFACT: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_DRAINING: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_UNAUTHENTICATED: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_ARTIFACT_NOT_UPLOADED: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_MESSAGE_TOO_LARGE: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_INTERNAL: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_FORBIDDEN: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_UNIMPLEMENTED: _ClassVar[ErrorReason]
    SANDBOX_SNAPSHOT_UNKNOWN_SERVICE: _ClassVar[ErrorReason]

class EntryKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENTRY_KIND_UNSPECIFIED: _ClassVar[EntryKind]
    ENTRY_KIND_FILE: _ClassVar[EntryKind]
    ENTRY_KIND_DIR: _ClassVar[EntryKind]
    ENTRY_KIND_SYMLINK: _ClassVar[EntryKind]

class ProgressPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROGRESS_PHASE_UNSPECIFIED: _ClassVar[ProgressPhase]
    PROGRESS_PHASE_LEASE: _ClassVar[ProgressPhase]
    PROGRESS_PHASE_SCAN: _ClassVar[ProgressPhase]
    PROGRESS_PHASE_PIN: _ClassVar[ProgressPhase]
    PROGRESS_PHASE_UPLOAD: _ClassVar[ProgressPhase]
    PROGRESS_PHASE_APPEND: _ClassVar[ProgressPhase]
    PROGRESS_PHASE_RESOLVE: _ClassVar[ProgressPhase]
    PROGRESS_PHASE_PLAN: _ClassVar[ProgressPhase]
    PROGRESS_PHASE_FETCH: _ClassVar[ProgressPhase]
    PROGRESS_PHASE_APPLY: _ClassVar[ProgressPhase]
    PROGRESS_PHASE_RECORD: _ClassVar[ProgressPhase]
    PROGRESS_PHASE_STASH: _ClassVar[ProgressPhase]

class ChangeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHANGE_KIND_UNSPECIFIED: _ClassVar[ChangeKind]
    CHANGE_KIND_ADDED: _ClassVar[ChangeKind]
    CHANGE_KIND_DELETED: _ClassVar[ChangeKind]
    CHANGE_KIND_MODIFIED: _ClassVar[ChangeKind]
    CHANGE_KIND_MODE_CHANGED: _ClassVar[ChangeKind]
ERROR_REASON_UNSPECIFIED: ErrorReason
SANDBOX_SNAPSHOT_INVALID_ID: ErrorReason
SANDBOX_SNAPSHOT_INVALID_ENTRY: ErrorReason
SANDBOX_SNAPSHOT_INVALID_ARGUMENT: ErrorReason
SANDBOX_SNAPSHOT_INVALID_PATH: ErrorReason
SANDBOX_SNAPSHOT_STALE_HEAD: ErrorReason
SANDBOX_SNAPSHOT_PARENT_MISMATCH: ErrorReason
SANDBOX_SNAPSHOT_WRITER_CONFLICT: ErrorReason
SANDBOX_SNAPSHOT_WRITER_LOST: ErrorReason
SANDBOX_SNAPSHOT_DUPLICATE_ID: ErrorReason
SANDBOX_SNAPSHOT_NOT_HEAD: ErrorReason
SANDBOX_SNAPSHOT_UNSUPPORTED_ENTRY: ErrorReason
SANDBOX_SNAPSHOT_MISSING_CHECKPOINT: ErrorReason
SANDBOX_SNAPSHOT_MISSING_BLOB: ErrorReason
SANDBOX_SNAPSHOT_INVALID_BLOB: ErrorReason
SANDBOX_SNAPSHOT_FORK_SOURCE_NOT_FOUND: ErrorReason
SANDBOX_SNAPSHOT_FORK_SOURCE_THREAD_MISMATCH: ErrorReason
SANDBOX_SNAPSHOT_FORK_DESTINATION_NOT_EMPTY: ErrorReason
SANDBOX_SNAPSHOT_STORE_UNAVAILABLE: ErrorReason
SANDBOX_SNAPSHOT_FILE_CHANGED: ErrorReason
SANDBOX_SNAPSHOT_NO_SPACE: ErrorReason
SANDBOX_SNAPSHOT_NAME_TOO_LONG: ErrorReason
SANDBOX_SNAPSHOT_CROSS_DEVICE: ErrorReason
SANDBOX_SNAPSHOT_PERMISSION_DENIED: ErrorReason
SANDBOX_SNAPSHOT_MISSING_ENTRY: ErrorReason
SANDBOX_SNAPSHOT_MISSING_ARTIFACT: ErrorReason
SANDBOX_SNAPSHOT_DRAINING: ErrorReason
SANDBOX_SNAPSHOT_UNAUTHENTICATED: ErrorReason
SANDBOX_SNAPSHOT_ARTIFACT_NOT_UPLOADED: ErrorReason
SANDBOX_SNAPSHOT_MESSAGE_TOO_LARGE: ErrorReason
SANDBOX_SNAPSHOT_INTERNAL: ErrorReason
SANDBOX_SNAPSHOT_FORBIDDEN: ErrorReason
SANDBOX_SNAPSHOT_UNIMPLEMENTED: ErrorReason
SANDBOX_SNAPSHOT_UNKNOWN_SERVICE: ErrorReason
ENTRY_KIND_UNSPECIFIED: EntryKind
ENTRY_KIND_FILE: EntryKind
ENTRY_KIND_DIR: EntryKind
ENTRY_KIND_SYMLINK: EntryKind
PROGRESS_PHASE_UNSPECIFIED: ProgressPhase
PROGRESS_PHASE_LEASE: ProgressPhase
PROGRESS_PHASE_SCAN: ProgressPhase
PROGRESS_PHASE_PIN: ProgressPhase
PROGRESS_PHASE_UPLOAD: ProgressPhase
PROGRESS_PHASE_APPEND: ProgressPhase
PROGRESS_PHASE_RESOLVE: ProgressPhase
PROGRESS_PHASE_PLAN: ProgressPhase
PROGRESS_PHASE_FETCH: ProgressPhase
PROGRESS_PHASE_APPLY: ProgressPhase
PROGRESS_PHASE_RECORD: ProgressPhase
PROGRESS_PHASE_STASH: ProgressPhase
CHANGE_KIND_UNSPECIFIED: ChangeKind
CHANGE_KIND_ADDED: ChangeKind
CHANGE_KIND_DELETED: ChangeKind
CHANGE_KIND_MODIFIED: ChangeKind
CHANGE_KIND_MODE_CHANGED: ChangeKind

class Policy(_message.Message):
    __slots__ = ("exclude", "include", "default_excludes")
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_EXCLUDES_FIELD_NUMBER: _ClassVar[int]
    exclude: _containers.RepeatedScalarFieldContainer[str]
    include: _containers.RepeatedScalarFieldContainer[str]
    default_excludes: bool
    def __init__(self, exclude: _Optional[_Iterable[str]] = ..., include: _Optional[_Iterable[str]] = ..., default_excludes: _Optional[bool] = ...) -> None: ...

class Entry(_message.Message):
    __slots__ = ("path", "kind", "blob_key", "size", "mtime_ns", "mode", "target", "chunk_count")
    PATH_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BLOB_KEY_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    CHUNK_COUNT_FIELD_NUMBER: _ClassVar[int]
    path: str
    kind: EntryKind
    blob_key: str
    size: int
    mtime_ns: int
    mode: int
    target: str
    chunk_count: int
    def __init__(self, path: _Optional[str] = ..., kind: _Optional[_Union[EntryKind, str]] = ..., blob_key: _Optional[str] = ..., size: _Optional[int] = ..., mtime_ns: _Optional[int] = ..., mode: _Optional[int] = ..., target: _Optional[str] = ..., chunk_count: _Optional[int] = ...) -> None: ...

class Artifact(_message.Message):
    __slots__ = ("artifact_id", "name", "mime_type", "size", "blob_key", "created_at")
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    BLOB_KEY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    artifact_id: str
    name: str
    mime_type: str
    size: int
    blob_key: str
    created_at: int
    def __init__(self, artifact_id: _Optional[str] = ..., name: _Optional[str] = ..., mime_type: _Optional[str] = ..., size: _Optional[int] = ..., blob_key: _Optional[str] = ..., created_at: _Optional[int] = ...) -> None: ...

class CheckpointSummary(_message.Message):
    __slots__ = ("id", "thread_id", "parent_checkpoint_id", "created_at", "reason", "label", "source_run_id", "entry_count", "file_count", "total_bytes", "artifact_count", "conversation_count", "policy", "workspace_subdir", "forked_from_thread_id", "forked_from_checkpoint_id", "restored_from_checkpoint_id", "stash_of_thread_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SOURCE_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    FILE_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_COUNT_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_COUNT_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_SUBDIR_FIELD_NUMBER: _ClassVar[int]
    FORKED_FROM_THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    FORKED_FROM_CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    RESTORED_FROM_CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    STASH_OF_THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    thread_id: str
    parent_checkpoint_id: str
    created_at: int
    reason: str
    label: str
    source_run_id: str
    entry_count: int
    file_count: int
    total_bytes: int
    artifact_count: int
    conversation_count: int
    policy: Policy
    workspace_subdir: str
    forked_from_thread_id: str
    forked_from_checkpoint_id: str
    restored_from_checkpoint_id: str
    stash_of_thread_id: str
    def __init__(self, id: _Optional[str] = ..., thread_id: _Optional[str] = ..., parent_checkpoint_id: _Optional[str] = ..., created_at: _Optional[int] = ..., reason: _Optional[str] = ..., label: _Optional[str] = ..., source_run_id: _Optional[str] = ..., entry_count: _Optional[int] = ..., file_count: _Optional[int] = ..., total_bytes: _Optional[int] = ..., artifact_count: _Optional[int] = ..., conversation_count: _Optional[int] = ..., policy: _Optional[_Union[Policy, _Mapping]] = ..., workspace_subdir: _Optional[str] = ..., forked_from_thread_id: _Optional[str] = ..., forked_from_checkpoint_id: _Optional[str] = ..., restored_from_checkpoint_id: _Optional[str] = ..., stash_of_thread_id: _Optional[str] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("phase", "files_done", "files_total", "bytes_done", "bytes_total", "phase_kind", "files_hashed")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    FILES_DONE_FIELD_NUMBER: _ClassVar[int]
    FILES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_DONE_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PHASE_KIND_FIELD_NUMBER: _ClassVar[int]
    FILES_HASHED_FIELD_NUMBER: _ClassVar[int]
    phase: str
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int
    phase_kind: ProgressPhase
    files_hashed: int
    def __init__(self, phase: _Optional[str] = ..., files_done: _Optional[int] = ..., files_total: _Optional[int] = ..., bytes_done: _Optional[int] = ..., bytes_total: _Optional[int] = ..., phase_kind: _Optional[_Union[ProgressPhase, str]] = ..., files_hashed: _Optional[int] = ...) -> None: ...

class CaptureRequest(_message.Message):
    __slots__ = ("thread_id", "label", "policy", "secrets", "conversation", "artifacts", "workspace_subdir", "request_id", "source_run_id", "skip_if_unchanged", "secret_names")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_SUBDIR_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SKIP_IF_UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    SECRET_NAMES_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    label: str
    policy: Policy
    secrets: _containers.RepeatedScalarFieldContainer[bytes]
    conversation: _containers.RepeatedScalarFieldContainer[str]
    artifacts: _containers.RepeatedCompositeFieldContainer[Artifact]
    workspace_subdir: str
    request_id: str
    source_run_id: str
    skip_if_unchanged: bool
    secret_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, thread_id: _Optional[str] = ..., label: _Optional[str] = ..., policy: _Optional[_Union[Policy, _Mapping]] = ..., secrets: _Optional[_Iterable[bytes]] = ..., conversation: _Optional[_Iterable[str]] = ..., artifacts: _Optional[_Iterable[_Union[Artifact, _Mapping]]] = ..., workspace_subdir: _Optional[str] = ..., request_id: _Optional[str] = ..., source_run_id: _Optional[str] = ..., skip_if_unchanged: _Optional[bool] = ..., secret_names: _Optional[_Iterable[str]] = ...) -> None: ...

class CaptureStats(_message.Message):
    __slots__ = ("entries", "files_hashed", "files_reused", "bytes_hashed", "blobs_uploaded", "bytes_uploaded", "duration_ms", "phases_ms", "scan_mode", "full_scan_reason", "entries_examined")
    class PhasesMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    FILES_HASHED_FIELD_NUMBER: _ClassVar[int]
    FILES_REUSED_FIELD_NUMBER: _ClassVar[int]
    BYTES_HASHED_FIELD_NUMBER: _ClassVar[int]
    BLOBS_UPLOADED_FIELD_NUMBER: _ClassVar[int]
    BYTES_UPLOADED_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    PHASES_MS_FIELD_NUMBER: _ClassVar[int]
    SCAN_MODE_FIELD_NUMBER: _ClassVar[int]
    FULL_SCAN_REASON_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_EXAMINED_FIELD_NUMBER: _ClassVar[int]
    entries: int
    files_hashed: int
    files_reused: int
    bytes_hashed: int
    blobs_uploaded: int
    bytes_uploaded: int
    duration_ms: int
    phases_ms: _containers.ScalarMap[str, int]
    scan_mode: str
    full_scan_reason: str
    entries_examined: int
    def __init__(self, entries: _Optional[int] = ..., files_hashed: _Optional[int] = ..., files_reused: _Optional[int] = ..., bytes_hashed: _Optional[int] = ..., blobs_uploaded: _Optional[int] = ..., bytes_uploaded: _Optional[int] = ..., duration_ms: _Optional[int] = ..., phases_ms: _Optional[_Mapping[str, int]] = ..., scan_mode: _Optional[str] = ..., full_scan_reason: _Optional[str] = ..., entries_examined: _Optional[int] = ...) -> None: ...

class CaptureStarted(_message.Message):
    __slots__ = ("thread_id", "checkpoint_id")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    checkpoint_id: str
    def __init__(self, thread_id: _Optional[str] = ..., checkpoint_id: _Optional[str] = ...) -> None: ...

class CaptureDone(_message.Message):
    __slots__ = ("checkpoint", "stats", "replayed", "unchanged")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    checkpoint: CheckpointSummary
    stats: CaptureStats
    replayed: bool
    unchanged: bool
    def __init__(self, checkpoint: _Optional[_Union[CheckpointSummary, _Mapping]] = ..., stats: _Optional[_Union[CaptureStats, _Mapping]] = ..., replayed: _Optional[bool] = ..., unchanged: _Optional[bool] = ...) -> None: ...

class CaptureEvent(_message.Message):
    __slots__ = ("started", "progress", "done")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    started: CaptureStarted
    progress: Progress
    done: CaptureDone
    def __init__(self, started: _Optional[_Union[CaptureStarted, _Mapping]] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., done: _Optional[_Union[CaptureDone, _Mapping]] = ...) -> None: ...

class RestoreRequest(_message.Message):
    __slots__ = ("thread_id", "checkpoint_id", "policy", "workspace_subdir", "dry_run", "secrets", "secret_names", "discard_live_changes", "record")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_SUBDIR_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    SECRET_NAMES_FIELD_NUMBER: _ClassVar[int]
    DISCARD_LIVE_CHANGES_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    checkpoint_id: str
    policy: Policy
    workspace_subdir: str
    dry_run: bool
    secrets: _containers.RepeatedScalarFieldContainer[bytes]
    secret_names: _containers.RepeatedScalarFieldContainer[str]
    discard_live_changes: bool
    record: bool
    def __init__(self, thread_id: _Optional[str] = ..., checkpoint_id: _Optional[str] = ..., policy: _Optional[_Union[Policy, _Mapping]] = ..., workspace_subdir: _Optional[str] = ..., dry_run: _Optional[bool] = ..., secrets: _Optional[_Iterable[bytes]] = ..., secret_names: _Optional[_Iterable[str]] = ..., discard_live_changes: _Optional[bool] = ..., record: _Optional[bool] = ...) -> None: ...

class UndoRequest(_message.Message):
    __slots__ = ("thread_id", "workspace_subdir", "dry_run", "secrets", "secret_names", "record")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_SUBDIR_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    SECRET_NAMES_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    workspace_subdir: str
    dry_run: bool
    secrets: _containers.RepeatedScalarFieldContainer[bytes]
    secret_names: _containers.RepeatedScalarFieldContainer[str]
    record: bool
    def __init__(self, thread_id: _Optional[str] = ..., workspace_subdir: _Optional[str] = ..., dry_run: _Optional[bool] = ..., secrets: _Optional[_Iterable[bytes]] = ..., secret_names: _Optional[_Iterable[str]] = ..., record: _Optional[bool] = ...) -> None: ...

class SavedBeforeRestore(_message.Message):
    __slots__ = ("checkpoint", "blobs_uploaded", "bytes_uploaded", "resumed")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    BLOBS_UPLOADED_FIELD_NUMBER: _ClassVar[int]
    BYTES_UPLOADED_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    checkpoint: CheckpointSummary
    blobs_uploaded: int
    bytes_uploaded: int
    resumed: bool
    def __init__(self, checkpoint: _Optional[_Union[CheckpointSummary, _Mapping]] = ..., blobs_uploaded: _Optional[int] = ..., bytes_uploaded: _Optional[int] = ..., resumed: _Optional[bool] = ...) -> None: ...

class RestoreStarted(_message.Message):
    __slots__ = ("thread_id", "checkpoint_id")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    checkpoint_id: str
    def __init__(self, thread_id: _Optional[str] = ..., checkpoint_id: _Optional[str] = ...) -> None: ...

class RestoreDone(_message.Message):
    __slots__ = ("restored", "checkpoint", "duration_ms", "plan", "unfilled_secret_paths", "unfilled_secret_count", "saved_before_restore", "recorded")
    RESTORED_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    UNFILLED_SECRET_PATHS_FIELD_NUMBER: _ClassVar[int]
    UNFILLED_SECRET_COUNT_FIELD_NUMBER: _ClassVar[int]
    SAVED_BEFORE_RESTORE_FIELD_NUMBER: _ClassVar[int]
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    restored: bool
    checkpoint: CheckpointSummary
    duration_ms: int
    plan: RestorePlan
    unfilled_secret_paths: _containers.RepeatedScalarFieldContainer[str]
    unfilled_secret_count: int
    saved_before_restore: SavedBeforeRestore
    recorded: CheckpointSummary
    def __init__(self, restored: _Optional[bool] = ..., checkpoint: _Optional[_Union[CheckpointSummary, _Mapping]] = ..., duration_ms: _Optional[int] = ..., plan: _Optional[_Union[RestorePlan, _Mapping]] = ..., unfilled_secret_paths: _Optional[_Iterable[str]] = ..., unfilled_secret_count: _Optional[int] = ..., saved_before_restore: _Optional[_Union[SavedBeforeRestore, _Mapping]] = ..., recorded: _Optional[_Union[CheckpointSummary, _Mapping]] = ...) -> None: ...

class RestorePlan(_message.Message):
    __slots__ = ("files_written", "paths_deleted", "files_kept", "dirs_created", "bytes_to_fetch", "blobs_to_fetch", "paths_stashed", "bytes_stashed")
    FILES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    PATHS_DELETED_FIELD_NUMBER: _ClassVar[int]
    FILES_KEPT_FIELD_NUMBER: _ClassVar[int]
    DIRS_CREATED_FIELD_NUMBER: _ClassVar[int]
    BYTES_TO_FETCH_FIELD_NUMBER: _ClassVar[int]
    BLOBS_TO_FETCH_FIELD_NUMBER: _ClassVar[int]
    PATHS_STASHED_FIELD_NUMBER: _ClassVar[int]
    BYTES_STASHED_FIELD_NUMBER: _ClassVar[int]
    files_written: int
    paths_deleted: int
    files_kept: int
    dirs_created: int
    bytes_to_fetch: int
    blobs_to_fetch: int
    paths_stashed: int
    bytes_stashed: int
    def __init__(self, files_written: _Optional[int] = ..., paths_deleted: _Optional[int] = ..., files_kept: _Optional[int] = ..., dirs_created: _Optional[int] = ..., bytes_to_fetch: _Optional[int] = ..., blobs_to_fetch: _Optional[int] = ..., paths_stashed: _Optional[int] = ..., bytes_stashed: _Optional[int] = ...) -> None: ...

class RestorePlanPaths(_message.Message):
    __slots__ = ("written", "deleted", "stashed")
    WRITTEN_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    STASHED_FIELD_NUMBER: _ClassVar[int]
    written: _containers.RepeatedScalarFieldContainer[str]
    deleted: _containers.RepeatedScalarFieldContainer[str]
    stashed: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, written: _Optional[_Iterable[str]] = ..., deleted: _Optional[_Iterable[str]] = ..., stashed: _Optional[_Iterable[str]] = ...) -> None: ...

class RestoreEvent(_message.Message):
    __slots__ = ("started", "progress", "done", "plan_paths")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    PLAN_PATHS_FIELD_NUMBER: _ClassVar[int]
    started: RestoreStarted
    progress: Progress
    done: RestoreDone
    plan_paths: RestorePlanPaths
    def __init__(self, started: _Optional[_Union[RestoreStarted, _Mapping]] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., done: _Optional[_Union[RestoreDone, _Mapping]] = ..., plan_paths: _Optional[_Union[RestorePlanPaths, _Mapping]] = ...) -> None: ...

class GetCheckpointRequest(_message.Message):
    __slots__ = ("checkpoint_id", "include_conversation")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    include_conversation: bool
    def __init__(self, checkpoint_id: _Optional[str] = ..., include_conversation: _Optional[bool] = ...) -> None: ...

class GetCheckpointResponse(_message.Message):
    __slots__ = ("checkpoint", "artifacts", "conversation")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    checkpoint: CheckpointSummary
    artifacts: _containers.RepeatedCompositeFieldContainer[Artifact]
    conversation: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, checkpoint: _Optional[_Union[CheckpointSummary, _Mapping]] = ..., artifacts: _Optional[_Iterable[_Union[Artifact, _Mapping]]] = ..., conversation: _Optional[_Iterable[str]] = ...) -> None: ...

class ListCheckpointsRequest(_message.Message):
    __slots__ = ("thread_id", "page_size", "page_token", "newest_first", "before", "stash")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NEWEST_FIRST_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    STASH_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    page_size: int
    page_token: str
    newest_first: bool
    before: str
    stash: bool
    def __init__(self, thread_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., newest_first: _Optional[bool] = ..., before: _Optional[str] = ..., stash: _Optional[bool] = ...) -> None: ...

class ListCheckpointsResponse(_message.Message):
    __slots__ = ("checkpoints", "next_page_token")
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    checkpoints: _containers.RepeatedCompositeFieldContainer[CheckpointSummary]
    next_page_token: str
    def __init__(self, checkpoints: _Optional[_Iterable[_Union[CheckpointSummary, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListThreadsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ThreadSummary(_message.Message):
    __slots__ = ("thread_id", "head_checkpoint_id", "checkpoint_count", "newest_created_at")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    HEAD_CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_COUNT_FIELD_NUMBER: _ClassVar[int]
    NEWEST_CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    head_checkpoint_id: str
    checkpoint_count: int
    newest_created_at: int
    def __init__(self, thread_id: _Optional[str] = ..., head_checkpoint_id: _Optional[str] = ..., checkpoint_count: _Optional[int] = ..., newest_created_at: _Optional[int] = ...) -> None: ...

class ListThreadsResponse(_message.Message):
    __slots__ = ("threads", "next_page_token")
    THREADS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    threads: _containers.RepeatedCompositeFieldContainer[ThreadSummary]
    next_page_token: str
    def __init__(self, threads: _Optional[_Iterable[_Union[ThreadSummary, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetHeadRequest(_message.Message):
    __slots__ = ("thread_id",)
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    def __init__(self, thread_id: _Optional[str] = ...) -> None: ...

class GetHeadResponse(_message.Message):
    __slots__ = ("checkpoint_id",)
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    def __init__(self, checkpoint_id: _Optional[str] = ...) -> None: ...

class ListEntriesRequest(_message.Message):
    __slots__ = ("checkpoint_id", "path_prefix")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_PREFIX_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    path_prefix: str
    def __init__(self, checkpoint_id: _Optional[str] = ..., path_prefix: _Optional[str] = ...) -> None: ...

class ListEntriesResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    def __init__(self, entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ...) -> None: ...

class DiffRequest(_message.Message):
    __slots__ = ("from_checkpoint_id", "to_checkpoint_id", "policy", "secrets", "workspace_subdir", "secret_names")
    FROM_CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    TO_CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_SUBDIR_FIELD_NUMBER: _ClassVar[int]
    SECRET_NAMES_FIELD_NUMBER: _ClassVar[int]
    from_checkpoint_id: str
    to_checkpoint_id: str
    policy: Policy
    secrets: _containers.RepeatedScalarFieldContainer[bytes]
    workspace_subdir: str
    secret_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, from_checkpoint_id: _Optional[str] = ..., to_checkpoint_id: _Optional[str] = ..., policy: _Optional[_Union[Policy, _Mapping]] = ..., secrets: _Optional[_Iterable[bytes]] = ..., workspace_subdir: _Optional[str] = ..., secret_names: _Optional[_Iterable[str]] = ...) -> None: ...

class Change(_message.Message):
    __slots__ = ("path", "kind", "old", "new")
    PATH_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    OLD_FIELD_NUMBER: _ClassVar[int]
    NEW_FIELD_NUMBER: _ClassVar[int]
    path: str
    kind: ChangeKind
    old: Entry
    new: Entry
    def __init__(self, path: _Optional[str] = ..., kind: _Optional[_Union[ChangeKind, str]] = ..., old: _Optional[_Union[Entry, _Mapping]] = ..., new: _Optional[_Union[Entry, _Mapping]] = ...) -> None: ...

class DiffResponse(_message.Message):
    __slots__ = ("changes",)
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    changes: _containers.RepeatedCompositeFieldContainer[Change]
    def __init__(self, changes: _Optional[_Iterable[_Union[Change, _Mapping]]] = ...) -> None: ...

class ReadFileRequest(_message.Message):
    __slots__ = ("checkpoint_id", "path", "chunk_size")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    path: str
    chunk_size: int
    def __init__(self, checkpoint_id: _Optional[str] = ..., path: _Optional[str] = ..., chunk_size: _Optional[int] = ...) -> None: ...

class ReadFileResponse(_message.Message):
    __slots__ = ("data", "entry")
    DATA_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    entry: Entry
    def __init__(self, data: _Optional[bytes] = ..., entry: _Optional[_Union[Entry, _Mapping]] = ...) -> None: ...

class UploadArtifactMetadata(_message.Message):
    __slots__ = ("name", "mime_type")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    mime_type: str
    def __init__(self, name: _Optional[str] = ..., mime_type: _Optional[str] = ...) -> None: ...

class UploadArtifactRequest(_message.Message):
    __slots__ = ("metadata", "chunk")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    metadata: UploadArtifactMetadata
    chunk: bytes
    def __init__(self, metadata: _Optional[_Union[UploadArtifactMetadata, _Mapping]] = ..., chunk: _Optional[bytes] = ...) -> None: ...

class UploadArtifactResponse(_message.Message):
    __slots__ = ("artifact",)
    ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    artifact: Artifact
    def __init__(self, artifact: _Optional[_Union[Artifact, _Mapping]] = ...) -> None: ...

class ReadArtifactRequest(_message.Message):
    __slots__ = ("blob_key", "chunk_size")
    BLOB_KEY_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    blob_key: str
    chunk_size: int
    def __init__(self, blob_key: _Optional[str] = ..., chunk_size: _Optional[int] = ...) -> None: ...

class ReadArtifactResponse(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class ForkRequest(_message.Message):
    __slots__ = ("source_thread_id", "source_checkpoint_id", "destination_thread_id")
    SOURCE_THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    source_thread_id: str
    source_checkpoint_id: str
    destination_thread_id: str
    def __init__(self, source_thread_id: _Optional[str] = ..., source_checkpoint_id: _Optional[str] = ..., destination_thread_id: _Optional[str] = ...) -> None: ...

class ForkResponse(_message.Message):
    __slots__ = ("checkpoint",)
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    checkpoint: CheckpointSummary
    def __init__(self, checkpoint: _Optional[_Union[CheckpointSummary, _Mapping]] = ...) -> None: ...

class DeleteHeadRequest(_message.Message):
    __slots__ = ("thread_id", "checkpoint_id")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    checkpoint_id: str
    def __init__(self, thread_id: _Optional[str] = ..., checkpoint_id: _Optional[str] = ...) -> None: ...

class DeleteHeadResponse(_message.Message):
    __slots__ = ("head_checkpoint_id",)
    HEAD_CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    head_checkpoint_id: str
    def __init__(self, head_checkpoint_id: _Optional[str] = ...) -> None: ...

class PruneRequest(_message.Message):
    __slots__ = ("thread_id", "keep", "dry_run")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    KEEP_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    keep: int
    dry_run: bool
    def __init__(self, thread_id: _Optional[str] = ..., keep: _Optional[int] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class PruneResponse(_message.Message):
    __slots__ = ("deleted_checkpoint_ids", "dry_run", "deleted_count", "ids_truncated")
    DELETED_CHECKPOINT_IDS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    DELETED_COUNT_FIELD_NUMBER: _ClassVar[int]
    IDS_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    deleted_checkpoint_ids: _containers.RepeatedScalarFieldContainer[str]
    dry_run: bool
    deleted_count: int
    ids_truncated: bool
    def __init__(self, deleted_checkpoint_ids: _Optional[_Iterable[str]] = ..., dry_run: _Optional[bool] = ..., deleted_count: _Optional[int] = ..., ids_truncated: _Optional[bool] = ...) -> None: ...

class SweepBlobsRequest(_message.Message):
    __slots__ = ("older_than_ms", "dry_run", "repack_below_percent")
    OLDER_THAN_MS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    REPACK_BELOW_PERCENT_FIELD_NUMBER: _ClassVar[int]
    older_than_ms: int
    dry_run: bool
    repack_below_percent: int
    def __init__(self, older_than_ms: _Optional[int] = ..., dry_run: _Optional[bool] = ..., repack_below_percent: _Optional[int] = ...) -> None: ...

class KeptBlob(_message.Message):
    __slots__ = ("key", "reason")
    KEY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    key: str
    reason: str
    def __init__(self, key: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class SweepFailure(_message.Message):
    __slots__ = ("key", "message")
    KEY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    key: str
    message: str
    def __init__(self, key: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class SweepBlobsBatch(_message.Message):
    __slots__ = ("deleted", "kept", "failures")
    DELETED_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    deleted: _containers.RepeatedScalarFieldContainer[str]
    kept: _containers.RepeatedCompositeFieldContainer[KeptBlob]
    failures: _containers.RepeatedCompositeFieldContainer[SweepFailure]
    def __init__(self, deleted: _Optional[_Iterable[str]] = ..., kept: _Optional[_Iterable[_Union[KeptBlob, _Mapping]]] = ..., failures: _Optional[_Iterable[_Union[SweepFailure, _Mapping]]] = ...) -> None: ...

class SweepBlobsSummary(_message.Message):
    __slots__ = ("listed_count", "deleted_count", "kept_count", "failed_count", "dry_run", "kept_by_reason", "duration_ms", "older_than_ms", "repack_below_percent")
    class KeptByReasonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    LISTED_COUNT_FIELD_NUMBER: _ClassVar[int]
    DELETED_COUNT_FIELD_NUMBER: _ClassVar[int]
    KEPT_COUNT_FIELD_NUMBER: _ClassVar[int]
    FAILED_COUNT_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    KEPT_BY_REASON_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    OLDER_THAN_MS_FIELD_NUMBER: _ClassVar[int]
    REPACK_BELOW_PERCENT_FIELD_NUMBER: _ClassVar[int]
    listed_count: int
    deleted_count: int
    kept_count: int
    failed_count: int
    dry_run: bool
    kept_by_reason: _containers.ScalarMap[str, int]
    duration_ms: int
    older_than_ms: int
    repack_below_percent: int
    def __init__(self, listed_count: _Optional[int] = ..., deleted_count: _Optional[int] = ..., kept_count: _Optional[int] = ..., failed_count: _Optional[int] = ..., dry_run: _Optional[bool] = ..., kept_by_reason: _Optional[_Mapping[str, int]] = ..., duration_ms: _Optional[int] = ..., older_than_ms: _Optional[int] = ..., repack_below_percent: _Optional[int] = ...) -> None: ...

class SweepBlobsEvent(_message.Message):
    __slots__ = ("batch", "summary")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    batch: SweepBlobsBatch
    summary: SweepBlobsSummary
    def __init__(self, batch: _Optional[_Union[SweepBlobsBatch, _Mapping]] = ..., summary: _Optional[_Union[SweepBlobsSummary, _Mapping]] = ...) -> None: ...

class CheckRequest(_message.Message):
    __slots__ = ("read_data", "repair")
    READ_DATA_FIELD_NUMBER: _ClassVar[int]
    REPAIR_FIELD_NUMBER: _ClassVar[int]
    read_data: bool
    repair: bool
    def __init__(self, read_data: _Optional[bool] = ..., repair: _Optional[bool] = ...) -> None: ...

class CheckFinding(_message.Message):
    __slots__ = ("kind", "key", "stored", "manifests", "message")
    KIND_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    MANIFESTS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    kind: str
    key: str
    stored: int
    manifests: int
    message: str
    def __init__(self, kind: _Optional[str] = ..., key: _Optional[str] = ..., stored: _Optional[int] = ..., manifests: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class CheckProgress(_message.Message):
    __slots__ = ("blobs_checked", "blobs_total", "bytes_read")
    BLOBS_CHECKED_FIELD_NUMBER: _ClassVar[int]
    BLOBS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_READ_FIELD_NUMBER: _ClassVar[int]
    blobs_checked: int
    blobs_total: int
    bytes_read: int
    def __init__(self, blobs_checked: _Optional[int] = ..., blobs_total: _Optional[int] = ..., bytes_read: _Optional[int] = ...) -> None: ...

class CheckSummary(_message.Message):
    __slots__ = ("keys", "blobs_checked", "bytes_read", "count_mismatches", "missing", "corrupt", "found", "repaired", "read_data", "repair", "duration_ms", "ok")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    BLOBS_CHECKED_FIELD_NUMBER: _ClassVar[int]
    BYTES_READ_FIELD_NUMBER: _ClassVar[int]
    COUNT_MISMATCHES_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    CORRUPT_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    REPAIRED_FIELD_NUMBER: _ClassVar[int]
    READ_DATA_FIELD_NUMBER: _ClassVar[int]
    REPAIR_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    keys: int
    blobs_checked: int
    bytes_read: int
    count_mismatches: int
    missing: int
    corrupt: int
    found: int
    repaired: int
    read_data: bool
    repair: bool
    duration_ms: int
    ok: bool
    def __init__(self, keys: _Optional[int] = ..., blobs_checked: _Optional[int] = ..., bytes_read: _Optional[int] = ..., count_mismatches: _Optional[int] = ..., missing: _Optional[int] = ..., corrupt: _Optional[int] = ..., found: _Optional[int] = ..., repaired: _Optional[int] = ..., read_data: _Optional[bool] = ..., repair: _Optional[bool] = ..., duration_ms: _Optional[int] = ..., ok: _Optional[bool] = ...) -> None: ...

class CheckEvent(_message.Message):
    __slots__ = ("progress", "finding", "summary")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    FINDING_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    progress: CheckProgress
    finding: CheckFinding
    summary: CheckSummary
    def __init__(self, progress: _Optional[_Union[CheckProgress, _Mapping]] = ..., finding: _Optional[_Union[CheckFinding, _Mapping]] = ..., summary: _Optional[_Union[CheckSummary, _Mapping]] = ...) -> None: ...

class GetServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Capabilities(_message.Message):
    __slots__ = ("store_backend", "blob_backend", "fork", "diff", "safe_sweep", "capture_request_id", "max_chunk_bytes", "max_message_bytes", "lease_duration_ms", "max_page_size", "auth_mode", "tls", "mutual_tls", "auth_probes", "restore_history", "watch_mode", "watch_detail")
    STORE_BACKEND_FIELD_NUMBER: _ClassVar[int]
    BLOB_BACKEND_FIELD_NUMBER: _ClassVar[int]
    FORK_FIELD_NUMBER: _ClassVar[int]
    DIFF_FIELD_NUMBER: _ClassVar[int]
    SAFE_SWEEP_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    LEASE_DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    AUTH_MODE_FIELD_NUMBER: _ClassVar[int]
    TLS_FIELD_NUMBER: _ClassVar[int]
    MUTUAL_TLS_FIELD_NUMBER: _ClassVar[int]
    AUTH_PROBES_FIELD_NUMBER: _ClassVar[int]
    RESTORE_HISTORY_FIELD_NUMBER: _ClassVar[int]
    WATCH_MODE_FIELD_NUMBER: _ClassVar[int]
    WATCH_DETAIL_FIELD_NUMBER: _ClassVar[int]
    store_backend: str
    blob_backend: str
    fork: bool
    diff: bool
    safe_sweep: bool
    capture_request_id: bool
    max_chunk_bytes: int
    max_message_bytes: int
    lease_duration_ms: int
    max_page_size: int
    auth_mode: str
    tls: bool
    mutual_tls: bool
    auth_probes: bool
    restore_history: bool
    watch_mode: str
    watch_detail: str
    def __init__(self, store_backend: _Optional[str] = ..., blob_backend: _Optional[str] = ..., fork: _Optional[bool] = ..., diff: _Optional[bool] = ..., safe_sweep: _Optional[bool] = ..., capture_request_id: _Optional[bool] = ..., max_chunk_bytes: _Optional[int] = ..., max_message_bytes: _Optional[int] = ..., lease_duration_ms: _Optional[int] = ..., max_page_size: _Optional[int] = ..., auth_mode: _Optional[str] = ..., tls: _Optional[bool] = ..., mutual_tls: _Optional[bool] = ..., auth_probes: _Optional[bool] = ..., restore_history: _Optional[bool] = ..., watch_mode: _Optional[str] = ..., watch_detail: _Optional[str] = ...) -> None: ...

class GetServerInfoResponse(_message.Message):
    __slots__ = ("version", "protocol_version", "capabilities")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    version: str
    protocol_version: int
    capabilities: Capabilities
    def __init__(self, version: _Optional[str] = ..., protocol_version: _Optional[int] = ..., capabilities: _Optional[_Union[Capabilities, _Mapping]] = ...) -> None: ...
