from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GatewayEmpty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GatewayStoreInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GatewayStoreInfo(_message.Message):
    __slots__ = ("lease_duration_ms", "renew_after_ms", "store_backend", "blob_backend", "packs")
    LEASE_DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    RENEW_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    STORE_BACKEND_FIELD_NUMBER: _ClassVar[int]
    BLOB_BACKEND_FIELD_NUMBER: _ClassVar[int]
    PACKS_FIELD_NUMBER: _ClassVar[int]
    lease_duration_ms: int
    renew_after_ms: int
    store_backend: str
    blob_backend: str
    packs: bool
    def __init__(self, lease_duration_ms: _Optional[int] = ..., renew_after_ms: _Optional[int] = ..., store_backend: _Optional[str] = ..., blob_backend: _Optional[str] = ..., packs: _Optional[bool] = ...) -> None: ...

class GatewayGetRequest(_message.Message):
    __slots__ = ("checkpoint_id",)
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    def __init__(self, checkpoint_id: _Optional[str] = ...) -> None: ...

class GatewayThreadRequest(_message.Message):
    __slots__ = ("thread_id",)
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    def __init__(self, thread_id: _Optional[str] = ...) -> None: ...

class GatewayCheckpoint(_message.Message):
    __slots__ = ("found", "document")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    found: bool
    document: bytes
    def __init__(self, found: _Optional[bool] = ..., document: _Optional[bytes] = ...) -> None: ...

class GatewayHead(_message.Message):
    __slots__ = ("checkpoint_id",)
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    def __init__(self, checkpoint_id: _Optional[str] = ...) -> None: ...

class GatewayWriter(_message.Message):
    __slots__ = ("thread_id", "owner_token", "fence")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    owner_token: str
    fence: int
    def __init__(self, thread_id: _Optional[str] = ..., owner_token: _Optional[str] = ..., fence: _Optional[int] = ...) -> None: ...

class GatewayAppendRequest(_message.Message):
    __slots__ = ("document", "expected_head_id", "writer", "packed_blobs")
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_HEAD_ID_FIELD_NUMBER: _ClassVar[int]
    WRITER_FIELD_NUMBER: _ClassVar[int]
    PACKED_BLOBS_FIELD_NUMBER: _ClassVar[int]
    document: bytes
    expected_head_id: str
    writer: GatewayWriter
    packed_blobs: _containers.RepeatedCompositeFieldContainer[GatewayPackRows]
    def __init__(self, document: _Optional[bytes] = ..., expected_head_id: _Optional[str] = ..., writer: _Optional[_Union[GatewayWriter, _Mapping]] = ..., packed_blobs: _Optional[_Iterable[_Union[GatewayPackRows, _Mapping]]] = ...) -> None: ...

class GatewayPackRows(_message.Message):
    __slots__ = ("pack", "digests", "offsets", "lengths", "raw_sizes", "codecs")
    PACK_FIELD_NUMBER: _ClassVar[int]
    DIGESTS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_FIELD_NUMBER: _ClassVar[int]
    RAW_SIZES_FIELD_NUMBER: _ClassVar[int]
    CODECS_FIELD_NUMBER: _ClassVar[int]
    pack: str
    digests: bytes
    offsets: _containers.RepeatedScalarFieldContainer[int]
    lengths: _containers.RepeatedScalarFieldContainer[int]
    raw_sizes: _containers.RepeatedScalarFieldContainer[int]
    codecs: bytes
    def __init__(self, pack: _Optional[str] = ..., digests: _Optional[bytes] = ..., offsets: _Optional[_Iterable[int]] = ..., lengths: _Optional[_Iterable[int]] = ..., raw_sizes: _Optional[_Iterable[int]] = ..., codecs: _Optional[bytes] = ...) -> None: ...

class GatewayLocated(_message.Message):
    __slots__ = ("packs", "unpacked")
    PACKS_FIELD_NUMBER: _ClassVar[int]
    UNPACKED_FIELD_NUMBER: _ClassVar[int]
    packs: _containers.RepeatedCompositeFieldContainer[GatewayPackRows]
    unpacked: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, packs: _Optional[_Iterable[_Union[GatewayPackRows, _Mapping]]] = ..., unpacked: _Optional[_Iterable[str]] = ...) -> None: ...

class GatewayListPackedRequest(_message.Message):
    __slots__ = ("after", "limit")
    AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    after: str
    limit: int
    def __init__(self, after: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class GatewayPackFrame(_message.Message):
    __slots__ = ("offset", "data")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class GatewayAppendResponse(_message.Message):
    __slots__ = ("checkpoint_id",)
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    def __init__(self, checkpoint_id: _Optional[str] = ...) -> None: ...

class GatewayDeleteHeadRequest(_message.Message):
    __slots__ = ("thread_id", "checkpoint_id", "writer")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    WRITER_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    checkpoint_id: str
    writer: GatewayWriter
    def __init__(self, thread_id: _Optional[str] = ..., checkpoint_id: _Optional[str] = ..., writer: _Optional[_Union[GatewayWriter, _Mapping]] = ...) -> None: ...

class GatewayAcquireWriterRequest(_message.Message):
    __slots__ = ("thread_id", "owner")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    owner: str
    def __init__(self, thread_id: _Optional[str] = ..., owner: _Optional[str] = ...) -> None: ...

class GatewayLease(_message.Message):
    __slots__ = ("writer", "expires_at", "renew_after_ms")
    WRITER_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    RENEW_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    writer: GatewayWriter
    expires_at: int
    renew_after_ms: int
    def __init__(self, writer: _Optional[_Union[GatewayWriter, _Mapping]] = ..., expires_at: _Optional[int] = ..., renew_after_ms: _Optional[int] = ...) -> None: ...

class GatewayRenewResponse(_message.Message):
    __slots__ = ("expires_at",)
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    expires_at: int
    def __init__(self, expires_at: _Optional[int] = ...) -> None: ...

class GatewayDeleteCheckpointsRequest(_message.Message):
    __slots__ = ("thread_id", "keep", "writer")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    KEEP_FIELD_NUMBER: _ClassVar[int]
    WRITER_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    keep: int
    writer: GatewayWriter
    def __init__(self, thread_id: _Optional[str] = ..., keep: _Optional[int] = ..., writer: _Optional[_Union[GatewayWriter, _Mapping]] = ...) -> None: ...

class GatewayCheckpointIds(_message.Message):
    __slots__ = ("checkpoint_ids",)
    CHECKPOINT_IDS_FIELD_NUMBER: _ClassVar[int]
    checkpoint_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, checkpoint_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class GatewayForkRequest(_message.Message):
    __slots__ = ("source_thread_id", "source_checkpoint_id", "destination_thread_id", "destination_checkpoint_id", "created_at", "writer")
    SOURCE_THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    WRITER_FIELD_NUMBER: _ClassVar[int]
    source_thread_id: str
    source_checkpoint_id: str
    destination_thread_id: str
    destination_checkpoint_id: str
    created_at: int
    writer: GatewayWriter
    def __init__(self, source_thread_id: _Optional[str] = ..., source_checkpoint_id: _Optional[str] = ..., destination_thread_id: _Optional[str] = ..., destination_checkpoint_id: _Optional[str] = ..., created_at: _Optional[int] = ..., writer: _Optional[_Union[GatewayWriter, _Mapping]] = ...) -> None: ...

class GatewayKeys(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, keys: _Optional[_Iterable[str]] = ...) -> None: ...

class GatewayPinRequest(_message.Message):
    __slots__ = ("keys", "writer")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    WRITER_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    writer: GatewayWriter
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., writer: _Optional[_Union[GatewayWriter, _Mapping]] = ...) -> None: ...

class GatewayCondemnRequest(_message.Message):
    __slots__ = ("keys", "hold_ms")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    HOLD_MS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    hold_ms: int
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., hold_ms: _Optional[int] = ...) -> None: ...

class GatewayBlobReference(_message.Message):
    __slots__ = ("key", "references")
    KEY_FIELD_NUMBER: _ClassVar[int]
    REFERENCES_FIELD_NUMBER: _ClassVar[int]
    key: str
    references: int
    def __init__(self, key: _Optional[str] = ..., references: _Optional[int] = ...) -> None: ...

class GatewayBlobReferences(_message.Message):
    __slots__ = ("references",)
    REFERENCES_FIELD_NUMBER: _ClassVar[int]
    references: _containers.RepeatedCompositeFieldContainer[GatewayBlobReference]
    def __init__(self, references: _Optional[_Iterable[_Union[GatewayBlobReference, _Mapping]]] = ...) -> None: ...

class GatewayAuditRequest(_message.Message):
    __slots__ = ("with_sizes",)
    WITH_SIZES_FIELD_NUMBER: _ClassVar[int]
    with_sizes: bool
    def __init__(self, with_sizes: _Optional[bool] = ...) -> None: ...

class GatewayBlobCount(_message.Message):
    __slots__ = ("key", "stored", "manifests", "size")
    KEY_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    MANIFESTS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    key: str
    stored: int
    manifests: int
    size: int
    def __init__(self, key: _Optional[str] = ..., stored: _Optional[int] = ..., manifests: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class GatewayBlobCounts(_message.Message):
    __slots__ = ("counts",)
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    counts: _containers.RepeatedCompositeFieldContainer[GatewayBlobCount]
    def __init__(self, counts: _Optional[_Iterable[_Union[GatewayBlobCount, _Mapping]]] = ...) -> None: ...

class GatewayBlobKey(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class GatewayBlobInfo(_message.Message):
    __slots__ = ("found", "key", "size", "last_modified_ms")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    LAST_MODIFIED_MS_FIELD_NUMBER: _ClassVar[int]
    found: bool
    key: str
    size: int
    last_modified_ms: int
    def __init__(self, found: _Optional[bool] = ..., key: _Optional[str] = ..., size: _Optional[int] = ..., last_modified_ms: _Optional[int] = ...) -> None: ...

class GatewayBlobInfos(_message.Message):
    __slots__ = ("blobs",)
    BLOBS_FIELD_NUMBER: _ClassVar[int]
    blobs: _containers.RepeatedCompositeFieldContainer[GatewayBlobInfo]
    def __init__(self, blobs: _Optional[_Iterable[_Union[GatewayBlobInfo, _Mapping]]] = ...) -> None: ...

class GatewayBlobGetRequest(_message.Message):
    __slots__ = ("key", "chunk_size")
    KEY_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    key: str
    chunk_size: int
    def __init__(self, key: _Optional[str] = ..., chunk_size: _Optional[int] = ...) -> None: ...

class GatewayBlobChunk(_message.Message):
    __slots__ = ("key", "data", "index", "last", "if_absent")
    KEY_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    IF_ABSENT_FIELD_NUMBER: _ClassVar[int]
    key: str
    data: bytes
    index: int
    last: bool
    if_absent: bool
    def __init__(self, key: _Optional[str] = ..., data: _Optional[bytes] = ..., index: _Optional[int] = ..., last: _Optional[bool] = ..., if_absent: _Optional[bool] = ...) -> None: ...

class GatewayBlobPutResponse(_message.Message):
    __slots__ = ("written",)
    WRITTEN_FIELD_NUMBER: _ClassVar[int]
    written: bool
    def __init__(self, written: _Optional[bool] = ...) -> None: ...

class GatewayBlobPutManyResponse(_message.Message):
    __slots__ = ("written",)
    WRITTEN_FIELD_NUMBER: _ClassVar[int]
    written: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, written: _Optional[_Iterable[bool]] = ...) -> None: ...

class GatewayBlobListRequest(_message.Message):
    __slots__ = ("prefix",)
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    def __init__(self, prefix: _Optional[str] = ...) -> None: ...

class GatewayListThreadsRequest(_message.Message):
    __slots__ = ("after", "limit")
    AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    after: str
    limit: int
    def __init__(self, after: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class GatewayThreadSummary(_message.Message):
    __slots__ = ("thread_id", "head_checkpoint_id", "checkpoint_count", "newest_created_at")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    HEAD_CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_COUNT_FIELD_NUMBER: _ClassVar[int]
    NEWEST_CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    head_checkpoint_id: str
    checkpoint_count: int
    newest_created_at: float
    def __init__(self, thread_id: _Optional[str] = ..., head_checkpoint_id: _Optional[str] = ..., checkpoint_count: _Optional[int] = ..., newest_created_at: _Optional[float] = ...) -> None: ...

class GatewayThreads(_message.Message):
    __slots__ = ("threads",)
    THREADS_FIELD_NUMBER: _ClassVar[int]
    threads: _containers.RepeatedCompositeFieldContainer[GatewayThreadSummary]
    def __init__(self, threads: _Optional[_Iterable[_Union[GatewayThreadSummary, _Mapping]]] = ...) -> None: ...

class GatewayBlobSignRequest(_message.Message):
    __slots__ = ("keys", "expires_in_s")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_S_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    expires_in_s: int
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., expires_in_s: _Optional[int] = ...) -> None: ...

class GatewayBlobUrls(_message.Message):
    __slots__ = ("supported", "urls")
    SUPPORTED_FIELD_NUMBER: _ClassVar[int]
    URLS_FIELD_NUMBER: _ClassVar[int]
    supported: bool
    urls: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, supported: _Optional[bool] = ..., urls: _Optional[_Iterable[str]] = ...) -> None: ...
