"""Sidecars behind a gateway write packs (gateway/packs.py): captures and
restores through an in-process gateway on loopback gRPC over SQLite and the
real PostgreSQL, to a local dir and SeaweedFS S3; a token of one tenant cannot
locate, read or name in an Append another tenant's frames, nor store a pack
whose frames are not what its trailer says; the bucket requests of a cold
capture through the gateway, before (one object per blob) and after."""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import blake3
import grpc
import pytest

from checkpointd import _native
from checkpointd.blobs import open_blobs
from checkpointd.blobs.packs import PACK_KEY_PREFIX
from checkpointd.capture import CaptureOptions, capture_checkpoint
from checkpointd.codec import encode_checkpoint
from checkpointd.errors import SandboxCheckpointError
from checkpointd.gateway import wire
from checkpointd.gateway.remote import (
    GatewayConnection,
    PackedRemoteCheckpointStore,
    RemoteBlobStore,
    RemoteCheckpointStore,
)
from checkpointd.model import FILE_KEY_PREFIX, Checkpoint, DirEntry, FileEntry
from checkpointd.restore import RestoreOptions, restore_checkpoint
from checkpointd.service.status import FORBIDDEN, error_info_from_metadata
from checkpointd.store._packindex import PackColumns, PackedRows
from checkpointd.store.base import PackedBlob, PackIndex
from checkpointd.store.postgres import open_postgres_store
from checkpointd.store.sqlite import SqliteCheckpointStore
from checkpointd.v1 import gateway_pb2 as gpb
from checkpointd.v1 import gateway_pb2_grpc as gpb_grpc

from ..engine.conftest import snapshot_tree, write_tree
from ..fixtures.bucket_counter import CountingProxy, counted
from .conftest import Keys

OPS = ["capture", "restore", "list"]


def _key(data: bytes) -> str:
    return FILE_KEY_PREFIX + blake3.blake3(data).hexdigest()


def _tree(tag: str, count: int = 300) -> dict[str, bytes | str]:
    text = b"".join(b"%s line %d of a source file\n" % (tag.encode(), n) for n in range(200))
    tree: dict[str, bytes | str] = {f"src/f{n}.py": text + b"# %d\n" % n for n in range(count)}
    tree["empty"] = b""
    tree["random.bin"] = os.urandom(20_000)
    tree["large.bin"] = os.urandom(1 << 20)  # the threshold: a single object
    tree["link"] = "src/f1.py"
    return tree


async def _sidecar(address: str, token: str) -> tuple[Any, RemoteBlobStore]:
    connection = GatewayConnection([address], lambda: token, tls=False)
    return await RemoteCheckpointStore.open(connection), RemoteBlobStore(connection)


async def _packs(bucket: Any) -> list[str]:
    return [info.key for info in await bucket.list(PACK_KEY_PREFIX)]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def backing_store(request: Any, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "sqlite":
        store = await SqliteCheckpointStore.open(str(tmp_path / "store.db"))
    else:
        url = request.getfixturevalue("postgres_url")
        store = await open_postgres_store(url)
    try:
        yield store
    finally:
        await store.aclose()


@pytest.fixture(params=["dir", pytest.param("s3", marks=pytest.mark.s3)])
def bucket(request: Any, tmp_path: Path) -> Any:
    if request.param == "dir":
        return open_blobs(f"file://{tmp_path / 'bucket'}")
    return request.getfixturevalue("s3_server").open(f"gwpacks-{os.urandom(6).hex()}")


async def test_sidecars_of_two_tenants_capture_into_packs_and_restore(
    backing_store: Any, bucket: Any, keys: Keys, gateway_factory: Any, tmp_path: Path
) -> None:
    gateway = await gateway_factory(backing_store, bucket)
    store_a, blobs_a = await _sidecar(gateway.address, keys.mint(threads=["tenant-a"], ops=OPS))
    store_b, blobs_b = await _sidecar(gateway.address, keys.mint(threads=["tenant-b"], ops=OPS))
    assert isinstance(store_a, PackedRemoteCheckpointStore) and isinstance(store_a, PackIndex)
    tree = _tree("shared")
    workspace = tmp_path / "a"
    write_tree(workspace, tree)
    first = await capture_checkpoint(
        workspace, store_a, blobs_a, "tenant-a", CaptureOptions(data_dir=tmp_path / "data-a")
    )
    contents = {data for data in tree.values() if isinstance(data, bytes)}
    assert first.stats.blobs_uploaded == len(contents)
    packs = await _packs(bucket)
    assert len(packs) == 1
    singles = {info.key for info in await bucket.list(FILE_KEY_PREFIX)}
    assert singles == {_key(tree["large.bin"])}  # type: ignore[arg-type]
    # Every small blob has its row, recorded in the append's transaction.
    rows = await backing_store.locate_blobs([_key(d) for d in contents])
    assert {k for k, row in rows.items() if row is not None} == {
        _key(d) for d in contents if len(d) < 1 << 20
    }

    restored = tmp_path / "a-restored"
    await restore_checkpoint(
        restored, store_a, blobs_a, "tenant-a", RestoreOptions(data_dir=tmp_path / "data-a")
    )
    assert snapshot_tree(restored) == snapshot_tree(workspace)

    # Tenant B captures the same contents: a capture asks before it pins, and
    # the gateway does not reveal A's rows to B, so B packs its own copies; the
    # newest row wins, and A now reads its blobs from B's pack, frame by frame.
    other = tmp_path / "b"
    write_tree(other, {**tree, "b-only.txt": b"only in B's workspace"})
    expected = snapshot_tree(other)
    second = await capture_checkpoint(
        other, store_b, blobs_b, "tenant-b", CaptureOptions(data_dir=tmp_path / "data-b")
    )
    # Each small blob again (the large single object is there: BlobMissing).
    assert second.stats.blobs_uploaded == len(contents)
    assert len(await _packs(bucket)) == 2
    shutil.rmtree(other)
    await restore_checkpoint(
        other, store_b, blobs_b, "tenant-b", RestoreOptions(data_dir=tmp_path / "data-b")
    )
    assert snapshot_tree(other) == expected
    shutil.rmtree(restored)
    await restore_checkpoint(
        restored, store_a, blobs_a, "tenant-a", RestoreOptions(data_dir=tmp_path / "data-a")
    )
    assert snapshot_tree(restored) == snapshot_tree(workspace)
    # Reads by key (ReadFile, ReadArtifact) go through the frames too.
    from checkpointd.blobs.packs import packed_blobs

    view = packed_blobs(blobs_b, store_b)
    assert await view.get(_key(tree["src/f7.py"])) == tree["src/f7.py"]  # type: ignore[arg-type]
    await store_a.aclose()
    await store_b.aclose()


async def test_a_frame_damaged_in_the_bucket_fails_the_restore_through_the_gateway(
    keys: Keys, gateway_factory: Any, tmp_path: Path
) -> None:
    """The gateway sends a row's stored bytes as the bucket holds them; the
    sidecar decodes and checks every frame (size and BLAKE3), so a frame
    damaged behind both of them is INVALID_BLOB naming the blob and its pack,
    and the workspace is as it was."""
    store = await SqliteCheckpointStore.open(str(tmp_path / "store.db"))
    bucket = open_blobs(f"file://{tmp_path / 'bucket'}")
    gateway = await gateway_factory(store, bucket)
    remote, blobs = await _sidecar(gateway.address, keys.mint(threads=["tenant-a"], ops=OPS))
    workspace = tmp_path / "workspace"
    files = {f"d{n % 4}/f{n:03}.txt": b"content of file %d\n" % n * 30 for n in range(200)}
    write_tree(workspace, files)  # type: ignore[arg-type]
    await capture_checkpoint(
        workspace, remote, blobs, "tenant-a", CaptureOptions(data_dir=tmp_path / "data")
    )
    [pack] = await _packs(bucket)
    rows = await store.locate_blobs([_key(data) for data in files.values()])
    victim = sorted((row for row in rows.values() if row is not None), key=lambda r: r.offset)[50]
    stored = await bucket.get(pack)
    at = victim.offset + victim.length // 2
    await bucket.put(
        pack, stored[:at] + bytes([stored[at] ^ 0x55]) + stored[at + 1 :], if_absent=False
    )
    target = tmp_path / "target"
    write_tree(target, {"d1/f001.txt": b"the live version", "keep.txt": b"untouched"})
    before = snapshot_tree(target)
    try:
        with pytest.raises(SandboxCheckpointError) as caught:
            await restore_checkpoint(
                target, remote, blobs, "tenant-a", RestoreOptions(data_dir=tmp_path / "data")
            )
        assert caught.value.code == "SANDBOX_SNAPSHOT_INVALID_BLOB", caught.value
        assert caught.value.details == {"key": victim.key, "pack": pack}
        assert snapshot_tree(target) == before
    finally:
        await remote.aclose()
        await store.aclose()


# ------------------------------------------------------------------ scope


def _forged_pack(frames: list[tuple[bytes, bytes]]) -> bytes:
    """A pack in rust/src/pack.rs's format whose trailer names ``digest`` for
    each raw frame, whatever its bytes (what a hostile sidecar could send)."""
    body = b"CKPK\x01\x00\x00\x00" + b"".join(data for _digest, data in frames)
    trailer = b"".join(
        digest + struct.pack("<II", len(data), len(data)) + b"\x00\x00" for digest, data in frames
    )
    check = blake3.blake3(trailer).digest()[:8]
    footer = struct.pack("<II", len(trailer), len(frames)) + check + b"\x01\x00\x00\x00CKPK"
    return body + trailer + footer


def _checkpoint(
    checkpoint_id: str, thread: str, *datas: bytes, parent: str | None = None
) -> Checkpoint:
    return Checkpoint(
        id=checkpoint_id,
        thread_id=thread,
        parent_checkpoint_id=parent,
        created_at=1,
        reason="automatic",
        files=(
            DirEntry("src"),
            *(FileEntry(f"src/{n}", _key(d), len(d)) for n, d in enumerate(datas)),
        ),
    )


async def _refused(call: Any) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        result = call()
        if hasattr(result, "__aiter__"):
            async for _ in result:
                pass
        else:
            await result
    info = error_info_from_metadata(caught.value.trailing_metadata())
    assert info is not None
    return caught.value.code(), info.reason, dict(info.metadata)


@pytest.fixture
async def two_tenants(tmp_path: Path, keys: Keys, gateway_factory: Any) -> AsyncIterator[Any]:
    """Tenant B's secret files captured through the gateway into a pack."""
    store = await SqliteCheckpointStore.open(str(tmp_path / "store.db"))
    bucket = open_blobs(f"file://{tmp_path / 'bucket'}")
    gateway = await gateway_factory(store, bucket)
    store_b, blobs_b = await _sidecar(gateway.address, keys.mint(threads=["tenant-b"], ops=OPS))
    secrets = {f"secret-{n}.txt": b"tenant B's secret number %d\n" % n * 20 for n in range(5)}
    workspace = tmp_path / "b"
    write_tree(workspace, secrets)  # type: ignore[arg-type]
    await capture_checkpoint(
        workspace, store_b, blobs_b, "tenant-b", CaptureOptions(data_dir=tmp_path / "data")
    )
    await store_b.aclose()
    [pack] = await _packs(bucket)
    rows = await store.locate_blobs([_key(d) for d in secrets.values()])
    assert all(row is not None and row.pack == pack for row in rows.values())
    yield gateway, store, bucket, pack, secrets, rows
    await store.aclose()


async def test_a_token_cannot_locate_read_or_name_another_tenants_frames(
    two_tenants: Any, keys: Keys
) -> None:
    gateway, store, bucket, pack, secrets, rows = two_tenants
    token = keys.mint(threads=["tenant-a"], ops=OPS)
    metadata = (("authorization", f"Bearer {token}"),)
    remote, blobs = await _sidecar(gateway.address, token)
    channel = grpc.aio.insecure_channel(gateway.address)
    stub = gpb_grpc.GatewayStub(channel)
    secret = next(iter(secrets.values()))
    secret_row: PackedBlob = rows[_key(secret)]
    try:
        # Locate: B's keys are left out (A neither reads nor pinned them).
        assert await remote.locate_blobs([_key(d) for d in secrets.values()]) == {}

        # Read: a frame of B's blob is refused, whatever row A claims for it.
        [message] = wire.rows_to_proto([secret_row])
        code, reason, details = await _refused(
            lambda: stub.ReadPackFrames(message, metadata=metadata)
        )
        assert (code, reason, details["key"]) == (
            grpc.StatusCode.PERMISSION_DENIED,
            FORBIDDEN,
            secret_row.key,
        )
        # A's own file, captured: its row is readable, but a row of A's key at
        # B's frame is not where the index puts A's key: no bytes of B's frame.
        mine = b"tenant A's own file\n" * 30
        lease = await remote.acquire_writer("tenant-a")
        assert await remote.pin_blobs([_key(mine)], lease) == []
        assert await blobs.put(_key(mine), mine)
        await remote.append(_checkpoint("a1", "tenant-a", mine), None, lease)
        assert [c.id for c in await remote.list("tenant-a")] == ["a1"]
        lying = PackedBlob(
            _key(mine), pack, secret_row.offset, secret_row.length, len(mine), secret_row.codec
        )
        [message] = wire.rows_to_proto([lying])
        code, reason, _ = await _refused(lambda: stub.ReadPackFrames(message, metadata=metadata))
        assert (code, reason) == (grpc.StatusCode.DATA_LOSS, "SANDBOX_SNAPSHOT_MISSING_BLOB")

        # Append: a row naming B's frame in B's pack, which A never pinned, is
        # refused (a token that pins B's pack, knowing its name, may name its
        # real frames, as it may reference a key it knows); a row of A's key at
        # a frame B's pack does not hold for it, or B's key at another offset,
        # is refused, pinned or not. Nothing is appended, no row changes.
        stolen = _checkpoint("a2", "tenant-a", mine, secret, parent="a1")
        request = gpb.GatewayAppendRequest(
            document=encode_checkpoint(stolen),
            expected_head_id="a1",
            writer=wire.writer_to_proto(lease),
            packed_blobs=wire.rows_to_proto([secret_row]),
        )
        code, reason, details = await _refused(lambda: stub.Append(request, metadata=metadata))
        assert reason == "SANDBOX_SNAPSHOT_INVALID_ENTRY", details
        assert details["unpinned"] == pack and details["pack"] == pack
        with pytest.raises(SandboxCheckpointError) as caught:
            await remote.append(
                _checkpoint("a2", "tenant-a", mine, parent="a1"), "a1", lease, packed_blobs=[lying]
            )
        assert caught.value.code == "SANDBOX_SNAPSHOT_INVALID_ENTRY", caught.value
        assert caught.value.details["pack"] == pack
        assert "the pack holds no blob" in caught.value.message
        shifted = PackedBlob(
            secret_row.key,
            pack,
            secret_row.offset + 1,
            secret_row.length,
            secret_row.raw_size,
            secret_row.codec,
        )
        with pytest.raises(SandboxCheckpointError) as caught:
            await remote.append(stolen, "a1", lease, packed_blobs=[shifted])
        assert "not where the pack's trailer puts it" in caught.value.message
        assert await store.get_head("tenant-a") == "a1"
        assert await store.locate_blobs([_key(mine), secret_row.key]) == {
            _key(mine): None,
            secret_row.key: secret_row,
        }

        # Uploads: a pack whose trailer names B's key for other bytes, one with a
        # damaged frame, one not named by its hash, are all refused unstored.
        poison = _forged_pack([(bytes.fromhex(secret_row.key[-64:]), b"poison")])
        writer = _native.PackWriter()
        writer.extend([(_key(mine)[-64:], mine)])
        hex_digest, good = writer.finish()
        damaged = bytearray(good)
        damaged[12] ^= 0xFF
        for data, name in (
            (poison, blake3.blake3(poison).hexdigest()),
            (bytes(damaged), blake3.blake3(bytes(damaged)).hexdigest()),
            (good, blake3.blake3(b"another name").hexdigest()),
        ):
            with pytest.raises(SandboxCheckpointError) as caught:
                await blobs.put_many([(PACK_KEY_PREFIX + name, data)])
            assert caught.value.code == "SANDBOX_SNAPSHOT_INVALID_BLOB", caught.value
            assert await bucket.head(PACK_KEY_PREFIX + name) is None
        # The good one is stored (checked whole).
        assert await blobs.put_many([(PACK_KEY_PREFIX + hex_digest, good)]) == [True]

        # No whole-pack read: a pack key is no key a checkpoint references.
        for call in (
            lambda: stub.BlobGet(gpb.GatewayBlobGetRequest(key=pack), metadata=metadata),
            lambda: stub.BlobGetMany(gpb.GatewayKeys(keys=[pack]), metadata=metadata),
        ):
            code, reason, _ = await _refused(call)
            assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, FORBIDDEN)

        # A key's BLAKE3 is its capability: once A pins B's key (as a capture of
        # the same bytes does), the gateway locates it for A.
        assert await remote.pin_blobs([secret_row.key], lease) == []
        assert await remote.locate_blobs([secret_row.key]) == {secret_row.key: secret_row}

        # The index listing is the operator's.
        code, reason, _ = await _refused(
            lambda: stub.ListPackedBlobs(gpb.GatewayListPackedRequest(), metadata=metadata)
        )
        assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, FORBIDDEN)
        await lease.release()
    finally:
        await channel.close()
        await remote.aclose()


@pytest.mark.s3
async def test_a_pack_is_never_presigned(
    s3_server: Any, tmp_path: Path, keys: Keys, gateway_factory: Any
) -> None:
    """A presigned URL opens the whole object, whatever range it is used with:
    the tenant's own pack is refused too; its reads go frame by frame."""
    store = await SqliteCheckpointStore.open(str(tmp_path / "store.db"))
    bucket = s3_server.open(f"gwpacks-{os.urandom(6).hex()}")
    gateway = await gateway_factory(store, bucket)
    token = keys.mint(threads=["tenant-a"], ops=OPS)
    remote, blobs = await _sidecar(gateway.address, token)
    workspace = tmp_path / "a"
    write_tree(workspace, {f"f{n}.txt": b"small file %d\n" % n * 9 for n in range(50)})
    await capture_checkpoint(
        workspace, remote, blobs, "tenant-a", CaptureOptions(data_dir=tmp_path / "d")
    )
    [pack] = await _packs(bucket)
    channel = grpc.aio.insecure_channel(gateway.address)
    metadata = (("authorization", f"Bearer {token}"),)
    try:
        stub = gpb_grpc.GatewayStub(channel)
        code, reason, details = await _refused(
            lambda: stub.BlobSignGet(gpb.GatewayBlobSignRequest(keys=[pack]), metadata=metadata)
        )
        assert (code, reason, details["key"]) == (
            grpc.StatusCode.PERMISSION_DENIED,
            FORBIDDEN,
            pack,
        )
    finally:
        await channel.close()
    restored = tmp_path / "r"
    await restore_checkpoint(
        restored, remote, blobs, "tenant-a", RestoreOptions(data_dir=tmp_path / "d")
    )
    assert snapshot_tree(restored) == snapshot_tree(workspace)
    assert gateway.servicer.bytes_out > 0  # the frames came through the gateway
    await remote.aclose()
    await store.aclose()


async def test_rows_of_a_pack_stored_through_another_gateway_are_checked_in_the_bucket(
    tmp_path: Path, keys: Keys, gateway_factory: Any
) -> None:
    """A sidecar that moved to a second gateway mid-capture: the second one did
    not see its pins (the remote store pins the rows' keys again through it) nor
    its pack (it reads the pack's trailer from the bucket)."""
    store = await SqliteCheckpointStore.open(str(tmp_path / "store.db"))
    bucket = open_blobs(f"file://{tmp_path / 'bucket'}")
    first = await gateway_factory(store, bucket)
    second = await gateway_factory(store, bucket)
    token = keys.mint(threads=["tenant-a"], ops=OPS)
    remote_1, blobs_1 = await _sidecar(first.address, token)
    remote_2, _ = await _sidecar(second.address, token)
    datas = [b"file %d of the capture\n" % n * 10 for n in range(20)]
    lease = await remote_1.acquire_writer("tenant-a")
    writer = _native.PackWriter()
    writer.extend([(_key(d)[-64:], d) for d in datas])
    hex_digest, pack, digests, offsets, lengths, raw_sizes, codecs = writer.finish_with_rows()
    # As a capture does: the pack pinned, then uploaded (through the first gateway).
    assert await remote_1.pin_blobs([PACK_KEY_PREFIX + hex_digest], lease) == []
    assert await blobs_1.put_many([(PACK_KEY_PREFIX + hex_digest, pack)]) == [True]
    from checkpointd.gateway.packs import u32s

    rows = PackedRows(
        [
            PackColumns(
                PACK_KEY_PREFIX + hex_digest,
                digests,
                u32s(offsets),
                u32s(lengths),
                u32s(raw_sizes),
                codecs,
            )
        ]
    )
    await remote_2.append(_checkpoint("a1", "tenant-a", *datas), None, lease, packed_blobs=rows)
    located = await store.locate_blobs([_key(d) for d in datas])
    assert {row.pack for row in located.values() if row is not None} == {
        PACK_KEY_PREFIX + hex_digest
    }
    assert len(located) == len(datas)
    # Rows naming a pack that is not in the bucket are refused (even pinned).
    missing = PackedBlob(_key(datas[0]), PACK_KEY_PREFIX + "0" * 64, 8, 10, 10, 0)
    with pytest.raises(SandboxCheckpointError) as caught:
        await remote_2.append(
            _checkpoint("a2", "tenant-a", datas[0]), "a1", lease, packed_blobs=[missing]
        )
    assert "not in the bucket" in caught.value.message
    await lease.release()
    await remote_1.aclose()
    await remote_2.aclose()
    await store.aclose()


# ------------------------------------------------------------------ requests


@pytest.fixture
def counting_s3(s3_server: Any) -> Iterator[tuple[CountingProxy, Any]]:
    with counted(s3_server) as (through_proxy, proxy):
        yield proxy, through_proxy.open(f"gw-counted-{os.urandom(6).hex()}")


@pytest.mark.s3
@pytest.mark.postgres
async def test_a_cold_capture_through_the_gateway_is_a_handful_of_bucket_requests(
    counting_s3: tuple[CountingProxy, Any],
    postgres_url: str,
    keys: Keys,
    gateway_factory: Any,
    tmp_path: Path,
) -> None:
    proxy, bucket = counting_s3
    store = await open_postgres_store(postgres_url)
    gateway = await gateway_factory(store, bucket)
    token = keys.mint(threads=["packed", "single"], ops=OPS)
    connection = GatewayConnection([gateway.address], lambda: token, tls=False)
    packed = await RemoteCheckpointStore.open(connection, owns_connection=False)
    single = RemoteCheckpointStore(connection, owns_connection=False)  # a gateway before packs
    blobs = RemoteBlobStore(connection)
    counts = {}
    for name, remote in (("single", single), ("packed", packed)):
        workspace = tmp_path / name
        files = {
            f"d{n % 50}/f{n}.txt": b"%s file %d\n" % (name.encode(), n) * 8 for n in range(3000)
        }
        write_tree(workspace, files)  # type: ignore[arg-type]
        proxy.reset()
        await capture_checkpoint(
            workspace, remote, blobs, name, CaptureOptions(data_dir=tmp_path / f"d-{name}")
        )
        captured = proxy.reset()
        restored = tmp_path / f"{name}-restored"
        await restore_checkpoint(
            restored, remote, blobs, name, RestoreOptions(data_dir=tmp_path / f"d-{name}")
        )
        restoring = proxy.reset()
        assert snapshot_tree(restored) == snapshot_tree(workspace)
        counts[name] = (captured, restoring)
    (single_capture, single_restore), (packed_capture, packed_restore) = (
        counts["single"],
        counts["packed"],
    )
    print(f"bucket requests through the gateway, 3,000 small files: {counts}")
    # One object per blob: a PUT (and a HEAD) per file; packed: a few packs.
    assert single_capture.get("PUT", 0) >= 3000, single_capture
    assert 0 < sum(packed_capture.values()) < 100, packed_capture
    assert 0 < sum(packed_restore.values()) < 100, packed_restore
    assert sum(single_restore.values()) >= 3000 // 16, single_restore
    await connection.aclose()
    await store.aclose()
